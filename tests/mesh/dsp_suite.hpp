// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! DSP's switch (loom/exec/sequence_parallel.hpp, `dsp_switch`) on a spatial-temporal block pair
//! over any world communicator, written once and run on threads
//! (tests/mesh/sequence_parallel_test.cpp) and on MPI processes (tests/mpi/mpi_test.cpp): the
//! pair's forward and backward against one rank's (bitwise: the switches only copy), and the
//! volume of DSP's switches against Ulysses' exchanges for the same pair, by the counters.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/exec/sequence_parallel.hpp"
#include "suite_values.hpp"

namespace dsp_suite {

using suite_values::value;

//! A check that did not hold on this rank.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! Self-attention (q = k = v = the tokens) along one sequence dimension of `x`, `[A][B][F]`
//! (`F = heads x head_dim`): along A for every b (`first`), or along B for every a. `o`, `lse`
//! receive the output and log-sum-exp (`[A][B][F]`, `[A][B][heads]`).
inline void line_attention(const loom::attention_dims& a, int A, int B, bool first, bool causal, const std::vector<double>& x,
                    std::vector<double>& o, std::vector<double>& lse) {
  const int F = a.heads * a.head_dim, L = first ? A : B, lines = first ? B : A;
  o.assign(x.size(), 0.0);
  lse.assign(static_cast<std::size_t>(A * B * a.heads), -INFINITY);
  for (int line = 0; line < lines; ++line) {
    auto row = [&](int i) { return static_cast<std::size_t>(first ? i * B + line : line * B + i); };
    std::vector<double> g(static_cast<std::size_t>(L * F)), go(g.size()), gl(static_cast<std::size_t>(L * a.heads), -INFINITY);
    for (int i = 0; i < L; ++i)
      std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(row(i) * static_cast<std::size_t>(F)), F, g.begin() + i * F);
    loom::attention_block_forward<double>(a, g, g, g, go, gl, 0, L, 0, L, causal ? loom::block_mask::causal : loom::block_mask::full);
    for (int i = 0; i < L; ++i) {
      std::copy_n(go.begin() + i * F, F, o.begin() + static_cast<std::ptrdiff_t>(row(i) * static_cast<std::size_t>(F)));
      std::copy_n(gl.begin() + i * a.heads, a.heads, lse.begin() + static_cast<std::ptrdiff_t>(row(i) * static_cast<std::size_t>(a.heads)));
    }
  }
}

//! The backward of `line_attention`: `dx = (dq + dk) + dv` of each line.
inline void line_attention_backward(const loom::attention_dims& a, int A, int B, bool first, bool causal, const std::vector<double>& x,
                             const std::vector<double>& o, const std::vector<double>& lse, const std::vector<double>& dy,
                             std::vector<double>& dx) {
  const int F = a.heads * a.head_dim, L = first ? A : B, lines = first ? B : A;
  dx.assign(x.size(), 0.0);
  for (int line = 0; line < lines; ++line) {
    auto row = [&](int i) { return static_cast<std::size_t>(first ? i * B + line : line * B + i); };
    std::vector<double> g(static_cast<std::size_t>(L * F)), go(g.size()), gd(g.size()), gl(static_cast<std::size_t>(L * a.heads)),
        delta(gl.size()), dq(g.size(), 0.0), dk(g.size(), 0.0), dv(g.size(), 0.0);
    for (int i = 0; i < L; ++i) {
      const auto at = static_cast<std::ptrdiff_t>(row(i) * static_cast<std::size_t>(F));
      std::copy_n(x.begin() + at, F, g.begin() + i * F);
      std::copy_n(o.begin() + at, F, go.begin() + i * F);
      std::copy_n(dy.begin() + at, F, gd.begin() + i * F);
      std::copy_n(lse.begin() + static_cast<std::ptrdiff_t>(row(i) * static_cast<std::size_t>(a.heads)), a.heads, gl.begin() + i * a.heads);
    }
    loom::attention_delta<double>(a, go, gd, delta);
    loom::attention_block_backward<double>(a, g, g, g, gl, gd, delta, dq, dk, dv, 0, L, 0, L,
                                           causal ? loom::block_mask::causal : loom::block_mask::full);
    for (int i = 0; i < L; ++i)
      for (int f = 0; f < F; ++f) {
        const auto e = static_cast<std::size_t>(i * F + f);
        dx[row(i) * static_cast<std::size_t>(F) + static_cast<std::size_t>(f)] = (dq[e] + dk[e]) + dv[e];
      }
  }
}

//! Bytes counted on this rank for one block pair: DSP's two switches (there and back), Ulysses'
//! four exchanges, and one shard (`N h / P` elements).
struct volumes {
  std::uint64_t dsp = 0, ulysses = 0, shard_bytes = 0;
};

//! A spatial-temporal block pair over `T = 8 x S = 12` tokens (self-attention along T, then along
//! S; 4 heads of 2 features) on the world `world` (collective; its size divides 4): the tokens
//! sharded along S for the first attention and along T for the second, against one rank's
//! computation; then the same pair with Ulysses for the attention along S.
template <class World>
volumes matches_one_rank(World& world, bool causal) {
  const int Tn = 8, Sn = 12, heads = 4, D = 2, F = heads * D, P = world.size(), r = world.rank(), Sp = Sn / P, Tp = Tn / P;
  const loom::attention_dims a{heads, D, 1.0 / std::sqrt(2.0)};
  auto bad = [&](const std::string& e) { throw failure("rank " + std::to_string(r) + ": " + e); };
  std::vector<double> x(static_cast<std::size_t>(Tn * Sn * F)), dy(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = value(21, i), dy[i] = value(22, i);
  // One rank: y1 = attention along T, y2 = attention along S; then the backward.
  std::vector<double> y1, l1, y2, l2, dy1, dx;
  line_attention(a, Tn, Sn, true, causal, x, y1, l1);
  line_attention(a, Tn, Sn, false, causal, y1, y2, l2);
  line_attention_backward(a, Tn, Sn, false, causal, y1, y2, l2, dy, dy1);
  line_attention_backward(a, Tn, Sn, true, causal, x, y1, l1, dy1, dx);
  using counted = loom::counted<World>;
  counted c(world.split(0, r)), uc(world.split(0, r));
  loom::dsp_switch<counted, double> sw(&c, Tn, Sn, F);
  // This rank's shards of a [T][S][F] tensor: along S ([T][S/P][F]) and along T ([T/P][S][F]).
  auto along_s = [&](const std::vector<double>& whole) {
    std::vector<double> v;
    for (int t = 0; t < Tn; ++t)
      v.insert(v.end(), whole.begin() + (t * Sn + r * Sp) * F, whole.begin() + (t * Sn + (r + 1) * Sp) * F);
    return v;
  };
  auto along_t = [&](const std::vector<double>& whole) {
    return std::vector<double>(whole.begin() + r * Tp * Sn * F, whole.begin() + (r + 1) * Tp * Sn * F);
  };
  std::vector<double> my1, ml1, m1t(sw.shard_elements()), my2, ml2;
  line_attention(a, Tn, Sp, true, causal, along_s(x), my1, ml1);  // along T: local when sharded along S
  sw.to_first(my1, m1t);                                          // one all-to-all: now sharded along T
  line_attention(a, Tp, Sn, false, causal, m1t, my2, ml2);        // along S: local
  if (my1 != along_s(y1) || my2 != along_t(y2)) bad("the forward differs from one rank's");
  const auto fwd = c.counters()[loom::comm_op::all_to_all];
  std::vector<double> mdy1t, mdy1(sw.shard_elements()), mdx;
  line_attention_backward(a, Tp, Sn, false, causal, m1t, my2, ml2, along_t(dy), mdy1t);
  sw.to_second(mdy1t, mdy1);  // the switch's backward is the inverse switch
  line_attention_backward(a, Tn, Sp, true, causal, along_s(x), my1, ml1, mdy1, mdx);
  if (mdy1 != along_s(dy1) || mdx != along_s(dx)) bad("the backward differs from one rank's");
  if (P > 1 && (fwd.calls != 1 || fwd.bytes != sw.shard_elements() * sizeof(double)))
    bad("the forward's switch counted " + std::to_string(fwd.calls) + " all-to-alls of " + std::to_string(fwd.bytes) + " bytes");
  // Ulysses on the same pair: the attention along S from the S-sharded layout needs Q, K, V
  // gathered by heads and the output sent back (the attention along T is local for both).
  loom::ulysses<counted, double> qkv(&uc, 3 * Tn, Sp, heads, D), out(&uc, Tn, Sp, heads, D);
  std::vector<double> three(3 * my1.size()), gathered(three.size()), o(my1.size()), back(my1.size());
  for (int i = 0; i < 3; ++i) std::copy(my1.begin(), my1.end(), three.begin() + i * static_cast<std::ptrdiff_t>(my1.size()));
  qkv.scatter_heads(three, gathered);
  const loom::attention_dims au{heads / P, D, a.scale};
  const auto line = static_cast<std::size_t>(Sn * (heads / P) * D);
  for (int t = 0; t < Tn; ++t) {
    std::vector<double> q(gathered.begin() + t * static_cast<std::ptrdiff_t>(line), gathered.begin() + (t + 1) * static_cast<std::ptrdiff_t>(line)),
        k(gathered.begin() + (Tn + t) * static_cast<std::ptrdiff_t>(line), gathered.begin() + (Tn + t + 1) * static_cast<std::ptrdiff_t>(line)),
        v(gathered.begin() + (2 * Tn + t) * static_cast<std::ptrdiff_t>(line),
          gathered.begin() + (2 * Tn + t + 1) * static_cast<std::ptrdiff_t>(line)),
        ot(line, 0.0), lt(static_cast<std::size_t>(Sn * (heads / P)), -INFINITY);
    loom::attention_block_forward<double>(au, q, k, v, ot, lt, 0, Sn, 0, Sn, causal ? loom::block_mask::causal : loom::block_mask::full);
    std::copy(ot.begin(), ot.end(), o.begin() + t * static_cast<std::ptrdiff_t>(line));
  }
  out.gather_heads(o, back);
  if (back != along_s(y2)) bad("Ulysses' pair differs from one rank's");
  return {2 * fwd.bytes, uc.counters()[loom::comm_op::all_to_all].bytes, sw.shard_elements() * sizeof(double)};
}

}  // namespace dsp_suite
