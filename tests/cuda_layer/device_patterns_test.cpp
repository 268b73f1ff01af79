// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The tensor- and sequence-parallel patterns (Megatron's column- and row-parallel layers with
// loom's device linear kernel; the tensor grids' SUMMA and 3D layers; ring attention, Ulysses, USP,
// TokenRing, causal and not; DSP's switch), written once over a group, on a
// device group bound to a stream (cuda_local and nccl): the same results as on the threads
// backend (bitwise under the simulator, whose kernels run the same per-item code on the host;
// within 1e-5 on a GPU, whose exp and log differ in the last bits) and the same per-group
// counters, under 20 seeds of the simulator's order and delays with the race detector failing
// the run; and the ring's double buffering broken on purpose (a receive that does not wait for
// the kernels reading its buffer) is a race naming the attention block and the transfer.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/comm/counting.hpp>
#include <loom/comm/threads.hpp>
#include <loom/cuda/patterns.hpp>
#include <loom/exec/tensor_grid.hpp>
#include <loom/exec/tensor_parallel.hpp>

#include "device_support.hpp"

namespace {

using loom_device_test::backend;
using loom_device_test::download;
using loom_device_test::upload;

//! Element i of rank r's tensor number `which`: values whose sums round.
float value(int which, int r, std::size_t i) {
  return static_cast<float>(std::sin(0.3 + 1.7 * which + 0.91 * r + 0.113 * static_cast<double>(i)));
}

//! A sequence-parallel split: `u` Ulysses ranks times `ring` ring positions.
struct split {
  int u, ring;
  int ranks() const { return u * ring; }
};

constexpr int tokens = 4, heads = 4, head_dim = 4;
constexpr std::size_t elems = static_cast<std::size_t>(tokens) * heads * head_dim;

//! What one rank ends with: the attention output, the Q/K/V gradients and both groups' counters.
struct result {
  std::vector<float> o, dqkv;
  loom::comm_counters ulysses, ring;
};

[[maybe_unused]] double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(got[i]) - want[i]));
    m = std::max(m, std::abs(static_cast<double>(want[i])));
  }
  return d / m;
}

std::vector<result> on_threads(split s, bool token_ring = false, bool causal = true) {
  std::vector<result> out(static_cast<std::size_t>(s.ranks()));
  loom::run_threads(s.ranks(), [&](loom::threads::comm& w) {
    using counted = loom::counted<loom::threads::comm>;
    counted uc(w.split(w.rank() / s.u, w.rank() % s.u)), rc(w.split(w.rank() % s.u, w.rank() / s.u));
    const loom::attention_dims a{heads, head_dim, 1.0 / std::sqrt(static_cast<double>(head_dim))};
    loom::usp_attention<counted, float> att(&uc, &rc, tokens, a, causal, token_ring);
    std::vector<float> qkv(3 * elems), dout(elems), o(elems), g(3 * elems), stash(att.stash_size());
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = value(0, w.rank(), i);
    for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = value(1, w.rank(), i);
    att.forward(qkv, o, stash);
    att.backward(dout, g, stash);
    out[static_cast<std::size_t>(w.rank())] = {o, g, uc.counters(), rc.counters()};
  });
  return out;
}

//! The same on a device world: both groups split from it, counted, bound to one stream.
template <class W>
result on_device_rank(W& w, split s, const loom::sp_faults& faults = {}, bool token_ring = false, bool causal = true) {
  using counted = loom::counted<W>;
  counted uc(w.split(w.rank() / s.u, w.rank() % s.u)), rc(w.split(w.rank() % s.u, w.rank() / s.u));
  loom::cuda::stream st;
  loom::cuda::name_stream(st.get(), "r" + std::to_string(w.rank()) + " attention");
  loom::on_stream<counted> ug(uc, st.get()), rg(rc, st.get());
  const loom::attention_dims a{heads, head_dim, 1.0 / std::sqrt(static_cast<double>(head_dim))};
  loom::usp_attention<loom::on_stream<counted>, float> att(&ug, &rg, tokens, a, causal, token_ring);
  att.inject(faults);
  std::vector<float> qkv(3 * elems), dout(elems);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = value(0, w.rank(), i);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = value(1, w.rank(), i);
  auto dq = upload(qkv, st.get());
  auto dd = upload(dout, st.get());
  loom::cuda::device_buffer<float> o(elems), g(3 * elems), stash(att.stash_size());
  att.forward(std::span<const float>(dq.span()), o.span(), stash.span());
  att.backward(std::span<const float>(dd.span()), g.span(), std::span<const float>(stash.span()));
  result r{download(o, st.get()), download(g, st.get()), uc.counters(), rc.counters()};
  w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank done before the buffers go
  return r;
}

// ---- Megatron's column/row-parallel pair ------------------------------------------------------

constexpr std::size_t tp_tokens = 3, tp_hidden = 4, tp_ffn_local = 2;

//! What one rank of the pair ends with.
struct tp_result {
  std::vector<float> y, dx, gw1, gb1, gw2;
  loom::comm_counters counts;
};

std::span<float> whole(std::vector<float>& v) { return {v.data(), v.size()}; }
std::span<float> whole(loom::cuda::device_buffer<float>& b) { return b.span(); }

//! The forward and backward of a column-parallel layer (hidden -> ffn/tp) then a row-parallel
//! one (ffn/tp -> hidden) on group `g` with kernel `k`; `make(host vector)` gives a buffer of
//! the group's memory, `fetch(buffer)` a host copy. The input and output gradient are the same
//! on every rank in the replicated mode, this rank's tokens in the sequence-sharded one.
template <class G, class K, class Make, class Fetch>
tp_result tp_pair(loom::tp_group<G>& g, K k, Make&& make, Fetch&& fetch) {
  const int r = g.rank(), n = g.size();
  const bool sharded = g.mode == loom::tp_mode::sequence_sharded;
  const std::size_t local = tp_tokens, full = sharded ? tp_tokens * static_cast<std::size_t>(n) : tp_tokens;
  auto init = [&](int which, std::size_t count, int rank) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = value(which, rank, i);
    return v;
  };
  auto x = make(init(2, local * tp_hidden, sharded ? r : 0)), dy = make(init(3, local * tp_hidden, sharded ? r : 0));
  auto w1 = make(init(4, tp_ffn_local * tp_hidden, r)), b1 = make(init(5, tp_ffn_local, r));
  auto w2 = make(init(6, tp_hidden * tp_ffn_local, r)), b2 = make(init(7, tp_hidden, 0));
  auto x_full = make(std::vector<float>(full * tp_hidden)), u = make(std::vector<float>(full * tp_ffn_local));
  auto partial = make(std::vector<float>(full * tp_hidden)), y = make(std::vector<float>(local * tp_hidden));
  auto dy_full = make(std::vector<float>(full * tp_hidden)), du = make(std::vector<float>(full * tp_ffn_local));
  auto dx_full = make(std::vector<float>(full * tp_hidden)), dx = make(std::vector<float>(local * tp_hidden));
  auto gw1 = make(std::vector<float>(tp_ffn_local * tp_hidden)), gb1 = make(std::vector<float>(tp_ffn_local));
  auto gw2 = make(std::vector<float>(tp_hidden * tp_ffn_local));
  auto c = [](auto& b) { return std::span<const float>(whole(b)); };
  loom::column_parallel_linear<K> col{tp_hidden, tp_ffn_local, k};
  loom::row_parallel_linear<K> row{tp_ffn_local, tp_hidden, k};
  col.forward(g, c(x), whole(x_full), c(w1), c(b1), whole(u));
  row.forward(g, c(u), c(w2), c(b2), whole(partial), whole(y));
  row.backward_input(g, c(dy), whole(dy_full), c(w2), whole(du));
  row.backward_weight(c(u), c(dy_full), whole(gw2));
  col.backward_input(g, c(du), c(w1), whole(dx_full), whole(dx));
  col.backward_weight(c(x_full), c(du), whole(gw1), whole(gb1));
  return {fetch(y), fetch(dx), fetch(gw1), fetch(gb1), fetch(gw2), {}};
}

//! What one grid member ends with after two chained layers (h -> f -> h) forward and backward.
struct grid_result {
  std::vector<float> y2, dy1, dx, gw1, gb1, gw2, gb2;
  std::array<loom::comm_counters, 3> counts{};  // row, column, depth
  //! The tensors, in a fixed order.
  std::vector<std::vector<float>> values() const { return {y2, dy1, dx, gw1, gb1, gw2, gb2}; }
};

//! What one grid member ends with after a layer norm's forward and backward.
struct norm_result {
  std::vector<float> y, rstd, dx, gg, gb;
  std::array<loom::comm_counters, 3> counts{};  // row, column, depth
  //! The tensors, in a fixed order.
  std::vector<std::vector<float>> values() const { return {y, rstd, dx, gg, gb}; }
};

//! The local kernels of the host (`loom::linear_kernel`, `loom::norm_kernel`) or of a stream.
struct host_kernels {
  loom::linear_kernel linear;
  loom::norm_kernel norm;
};
struct device_kernels {
  loom::cuda::linear_kernel linear;
  loom::cuda::norm_kernel norm;
};

//! Two chained layers of the tensor grid `g` (SUMMA on a 2D grid, `cube_linear` of both parities
//! on a 3D one) with kernel `k`; `make(host vector)` gives a buffer of the group's memory,
//! `fetch(buffer)` a host copy. Every member's inputs are its own values.
template <class G, class K, class Make, class Fetch>
grid_result grid_pair(loom::tp_grid_comms<G>& g, K k, Make&& make, Fetch&& fetch) {
  const bool cube = g.shape.kind == loom::tp_kind::d3;
  const std::size_t q = g.q(), n = 3, h = 2 * q * q, f = 4 * q * q;
  const int r = g.member;
  auto init = [&](int which, std::size_t count) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = value(which, r, i);
    return v;
  };
  auto zeros = [&](std::size_t count) { return make(std::vector<float>(count)); };
  auto wsize = [&](std::size_t in, std::size_t out) { return cube ? (out / (q * q)) * (in / q) : (out / q) * (in / q); };
  auto x = make(init(10, n * h / q)), dy2 = make(init(11, n * h / q));
  auto w1 = make(init(12, wsize(h, f))), b1 = make(init(13, f / (q * q))), w2 = make(init(14, wsize(f, h))), b2 = make(init(15, h / (q * q)));
  auto gw1 = make(init(16, wsize(h, f))), gb1 = make(init(17, f / (q * q))), gw2 = make(init(18, wsize(f, h))),
       gb2 = make(init(19, h / (q * q)));
  auto y1 = zeros(n * f / q), y2 = zeros(n * h / q), dy1 = zeros(n * f / q), dx = zeros(n * h / q);
  auto c = [](auto& b) { return std::span<const float>(whole(b)); };
  // Forward through both layers, then the second's backward, then the first's.
  auto chain = [&](const auto& first, const auto& second, auto s1, auto s2) {
    first.forward(g, c(x), c(w1), c(b1), whole(y1), s1);
    second.forward(g, c(y1), c(w2), c(b2), whole(y2), s2);
    second.backward_input(g, c(dy2), c(w2), whole(dy1), s2);
    second.backward_weight(g, c(y1), c(dy2), whole(gw2), whole(gb2), s2);
    first.backward_input(g, c(dy1), c(w1), whole(dx), s1);
    first.backward_weight(g, c(x), c(dy1), whole(gw1), whole(gb1), s1);
  };
  if (cube) {
    auto scratch = [&](std::size_t in, std::size_t out) {
      return std::array{zeros(q * n * (in / q)), zeros((out / q) * (in / q) + out / q), zeros(q * n * (out / q)),
                        zeros(std::max(q * n * (std::max(in, out) / q), (out / q) * (in / q) + out / q)),
                        zeros((out / (q * q)) * (in / q) + out / (q * q))};
    };
    auto s1 = scratch(h, f), s2 = scratch(f, h);
    auto sp = [&](auto& a) { return loom::cube_scratch<float>{whole(a[0]), whole(a[1]), whole(a[2]), whole(a[3]), whole(a[4])}; };
    chain(loom::cube_linear<K>{h, f, false, k}, loom::cube_linear<K>{f, h, true, k}, sp(s1), sp(s2));
  } else {
    auto scratch = [&](std::size_t in, std::size_t out) {
      return std::array{zeros(n * in / q), zeros((out / q) * (in / q)), zeros(out / q),
                        zeros(std::max(n * in / q, (out / q) * (in / q) + out / q)), zeros((out / q) * (in / q) + out / (q * q))};
    };
    auto s1 = scratch(h, f), s2 = scratch(f, h);
    auto sp = [&](auto& a) { return loom::summa_scratch<float>{whole(a[0]), whole(a[1]), whole(a[2]), whole(a[3]), whole(a[4])}; };
    chain(loom::summa_linear<K>{h, f, k}, loom::summa_linear<K>{f, h, k}, sp(s1), sp(s2));
  }
  return {fetch(y2), fetch(dy1), fetch(dx), fetch(gw1), fetch(gb1), fetch(gw2), fetch(gb2), {}};
}

//! A layer norm over grid `g`'s activations (SUMMA's layout, or on a 3D grid the input of a layer
//! of parity `odd`) with kernel `k`: the forward, the input gradient with a residual gradient
//! added, the weights' gradients; `make` and `fetch` as in `grid_pair`.
template <class G, class K, class Make, class Fetch>
norm_result grid_norm(loom::tp_grid_comms<G>& g, bool odd, K k, Make&& make, Fetch&& fetch) {
  const std::size_t q = g.q(), n = 3, h = 2 * q * q, hq = h / q, pq = hq / q;
  auto ng = g.shape.kind == loom::tp_kind::d3 ? loom::norm_groups<G>::of_cube(g, odd) : loom::norm_groups<G>::of_summa(g);
  auto init = [&](int which, std::size_t count) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = value(which, g.member, i);
    return v;
  };
  auto zeros = [&](std::size_t count) { return make(std::vector<float>(count)); };
  auto x = make(init(20, n * hq)), gw = make(init(21, pq)), bw = make(init(22, pq)), dy = make(init(23, n * hq)), res = make(init(24, n * hq));
  auto gg = make(init(25, pq)), gb = make(init(26, pq));
  auto y = zeros(n * hq), xhat = zeros(n * hq), rstd = zeros(n), dx = zeros(n * hq);
  auto sw = zeros(2 * hq), stats = zeros(2 * n), part = zeros(2 * hq), grad = zeros(2 * pq);
  const loom::norm_scratch<float> s{whole(sw), whole(stats), whole(part), whole(grad)};
  auto c = [](auto& b) { return std::span<const float>(whole(b)); };
  const loom::grid_layer_norm<K> norm{h, 1e-5, k};
  norm.forward(ng, c(x), c(gw), c(bw), whole(y), whole(xhat), whole(rstd), s);
  norm.backward_input(ng, c(dy), c(xhat), c(rstd), c(gw), c(res), whole(dx), s);
  norm.backward_weight(ng, c(dy), c(xhat), whole(gg), whole(gb), s);
  return {fetch(y), fetch(rstd), fetch(dx), fetch(gg), fetch(gb), {}};
}

//! `work(grid comms, kernels, make, fetch)` on every member of the grid mesh `m` (rank-ordered
//! sums when `ordered`), on threads with the host kernels, then on both device backends under
//! `seeds` simulator seeds with the kernels on one stream per rank: every tensor equal (bitwise
//! under the simulator, within 1e-5 relative on a GPU), the grid groups' counters equal, the
//! simulator finding nothing.
template <class Mesh, class Work>
void grid_device_equals_threads(const Mesh& m, bool ordered, std::uint64_t seeds, Work&& work) {
  const int n = m.size();
  CAPTURE(std::string(m.describe().view()));
  CAPTURE(ordered);
  auto counts = [](auto& mc) {
    return std::array{mc.grid(loom::grid_group::row).counters(), mc.grid(loom::grid_group::column).counters(),
                      mc.grid(loom::grid_group::depth).counters()};
  };
  using result_t = decltype(work(std::declval<loom::tp_grid_comms<loom::counted<loom::threads::comm>>&>(), host_kernels{},
                                 [](std::vector<float> v) { return v; }, [](std::vector<float>& v) { return v; }));
  std::vector<result_t> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
  loom::run_threads(n, [&](loom::threads::comm& w) {
    loom::mesh_comm mc(m, w);
    auto g = loom::grid_comms(mc, ordered);
    auto r = work(g, host_kernels{}, [](std::vector<float> v) { return v; }, [](std::vector<float>& v) { return v; });
    r.counts = counts(mc);
    want[static_cast<std::size_t>(w.rank())] = r;
  });
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    if (loom_device_test::skip_unless_devices(b, n)) continue;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
      CAPTURE(seed);
      loom_device_test::simulate_with(seed);
      auto body = [&](auto& w) {
        loom::mesh_comm mc(m, w);
        using counted = typename decltype(mc)::comm_type;
        loom::cuda::stream st;
        loom::on_stream<counted> row(mc.grid(loom::grid_group::row), st.get()), col(mc.grid(loom::grid_group::column), st.get()),
            depth(mc.grid(loom::grid_group::depth), st.get());
        loom::tp_grid_comms<loom::on_stream<counted>> g{&row, &col, &depth, m.grid(), mc.coord(loom::dim::tp), ordered};
        std::vector<std::vector<float>> sources;  // alive until the copies ran (fetch synchronises)
        sources.reserve(64);
        auto r = work(
            g, device_kernels{{st.get()}, {st.get()}},
            [&](std::vector<float> v) {
              sources.push_back(std::move(v));
              return upload(sources.back(), st.get());
            },
            [&](loom::cuda::device_buffer<float>& d) { return download(d, st.get()); });
        r.counts = counts(mc);
        got[static_cast<std::size_t>(mc.rank())] = r;
        w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank done before the buffers go
      };
      loom_device_test::run_on(b, n, body);
      for (std::size_t r = 0; r < got.size(); ++r) {
        CAPTURE(r);
        const auto gv = got[r].values(), wv = want[r].values();
        for (std::size_t t = 0; t < wv.size(); ++t) {
          CAPTURE(t);
#if defined(LOOM_CUDA_SIM)
          CHECK(gv[t] == wv[t]);
#else
          CHECK(max_rel(gv[t], wv[t]) <= 1e-5);
#endif
        }
        CHECK(got[r].counts == want[r].counts);
      }
      CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
      break;  // a GPU has no seeds to vary
#endif
    }
  }
}

//! The attention of split `s` (TokenRing as its ring part when `token_ring`) on both device
//! backends under `seeds` simulator seeds: every rank's output, gradients and both groups'
//! counters equal the threads backend's, and the simulator finds nothing.
void device_equals_threads(split s, bool token_ring, bool causal, std::uint64_t seeds) {
  CAPTURE(s.u);
  CAPTURE(s.ring);
  CAPTURE(token_ring);
  CAPTURE(causal);
  const auto want = on_threads(s, token_ring, causal);
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    if (loom_device_test::skip_unless_devices(b, s.ranks())) continue;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
      CAPTURE(seed);
      loom_device_test::simulate_with(seed);
      std::vector<result> got(static_cast<std::size_t>(s.ranks()));
      auto body = [&](auto& w) { got[static_cast<std::size_t>(w.rank())] = on_device_rank(w, s, {}, token_ring, causal); };
      loom_device_test::run_on(b, s.ranks(), body);
      for (std::size_t r = 0; r < got.size(); ++r) {
        CAPTURE(r);
#if defined(LOOM_CUDA_SIM)
        CHECK(got[r].o == want[r].o);
        CHECK(got[r].dqkv == want[r].dqkv);
#else
        CHECK(max_rel(got[r].o, want[r].o) <= 1e-5);
        CHECK(max_rel(got[r].dqkv, want[r].dqkv) <= 1e-5);
#endif
        CHECK(got[r].ulysses == want[r].ulysses);
        CHECK(got[r].ring == want[r].ring);
      }
      CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
      break;  // a GPU has no seeds to vary
#endif
    }
  }
}

}  // namespace

TEST_CASE("ring attention, Ulysses and USP run on device groups with the threads backend's results and counters") {
  for (split s : {split{2, 1}, split{1, 2}, split{1, 4}, split{2, 2}}) device_equals_threads(s, false, true, 20);
}

// TokenRing's ring counters hold no K or V bytes: its formula (tests/mesh/token_ring_suite.hpp).
TEST_CASE("TokenRing (alone and inside USP) runs on device groups with the threads backend's results and counters, causal and not") {
  for (split s : {split{1, 2}, split{1, 3}, split{1, 4}, split{2, 2}})
    for (bool causal : {true, false}) device_equals_threads(s, true, causal, 10);
}

TEST_CASE("DSP's switch runs on device groups: both directions bit for bit the threads backend's, the same all-to-all counts") {
  constexpr int A = 8, B = 12, F = 3;
  for (int P : {1, 2, 4}) {
    CAPTURE(P);
    const std::size_t n = static_cast<std::size_t>(A * B * F / P);
    auto input = [&](int r) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = value(20, r, i);
      return v;
    };
    struct out {
      std::vector<float> first, back;
      loom::comm_counters counts;
    };
    std::vector<out> want(static_cast<std::size_t>(P));
    loom::run_threads(P, [&](loom::threads::comm& w) {
      loom::counted<loom::threads::comm> c(w.split(0, w.rank()));
      loom::dsp_switch<loom::counted<loom::threads::comm>, float> sw(&c, A, B, F);
      std::vector<float> x = input(w.rank()), y(n), z(n);
      sw.to_first(x, y);
      sw.to_second(y, z);
      CHECK(z == x);  // the inverse
      want[static_cast<std::size_t>(w.rank())] = {y, z, c.counters()};
    });
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(loom_device_test::name(b));
      if (loom_device_test::skip_unless_devices(b, P)) continue;
      for (std::uint64_t seed = 1; seed <= 5; ++seed) {
        loom_device_test::simulate_with(seed);
        std::vector<out> got(static_cast<std::size_t>(P));
        auto body = [&](auto& w) {
          using counted = loom::counted<std::remove_reference_t<decltype(w)>>;
          counted c(w.split(0, w.rank()));
          loom::cuda::stream st;
          loom::on_stream<counted> g(c, st.get());
          loom::dsp_switch<loom::on_stream<counted>, float> sw(&g, A, B, F);
          const std::vector<float> host = input(w.rank());  // alive until the asynchronous upload has read it
          auto x = upload(host, st.get());
          loom::cuda::device_buffer<float> y(n), z(n);
          sw.to_first(std::span<const float>(x.span()), y.span());
          sw.to_second(std::span<const float>(y.span()), z.span());
          got[static_cast<std::size_t>(w.rank())] = {download(y, st.get()), download(z, st.get()), c.counters()};
          w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);
        };
        loom_device_test::run_on(b, P, body);
        for (int r = 0; r < P; ++r) {
          CAPTURE(r);
          CHECK(got[static_cast<std::size_t>(r)].first == want[static_cast<std::size_t>(r)].first);
          CHECK(got[static_cast<std::size_t>(r)].back == want[static_cast<std::size_t>(r)].back);
          CHECK(got[static_cast<std::size_t>(r)].counts == want[static_cast<std::size_t>(r)].counts);
        }
        CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
        break;
#endif
      }
    }
  }
}

#if defined(LOOM_CUDA_SIM)
TEST_CASE("ring attention receiving the next K/V block without waiting for the kernels that read its buffer is a race naming both") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    for (std::uint64_t seed : {2, 7}) {
      CAPTURE(seed);
      loom::cudasim::config cfg;
      cfg.seed = seed;
      cfg.races = loom::cudasim::race_policy::record;
      loom::cudasim::configure(cfg);
      auto body = [&](auto& w) { (void)on_device_rank(w, split{1, 4}, {.skip_kv_free_wait = true}); };
      loom_device_test::run_on(b, 4, body);
      const auto all = loom_device_test::findings();
      CAPTURE(all);
      CHECK(all.find("race: ") != std::string::npos);
      CHECK(all.find("loom ring attention block") != std::string::npos);
      CHECK(all.find(b == backend::cuda_local ? "recv<-" : "ncclRecv") != std::string::npos);
    }
  }
  loom_device_test::simulate_with(1);
}
#endif

TEST_CASE("Megatron's column- and row-parallel layers run on a device group with loom's device kernels, as on threads") {
  for (bool ordered : {false, true})
    for (auto mode : {loom::tp_mode::replicated, loom::tp_mode::sequence_sharded})
      for (int n : {2, 4}) {
        CAPTURE(ordered);
        CAPTURE(static_cast<int>(mode));
        CAPTURE(n);
        std::vector<tp_result> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
        loom::run_threads(n, [&](loom::threads::comm& w) {
          loom::counted<loom::threads::comm> c(w.split(0, w.rank()));
          loom::tp_group<loom::counted<loom::threads::comm>> g{&c, mode, ordered};
          auto r = tp_pair(
              g, loom::linear_kernel{}, [](std::vector<float> v) { return v; }, [](std::vector<float>& v) { return v; });
          r.counts = c.counters();
          want[static_cast<std::size_t>(w.rank())] = r;
        });
        for (backend b : {backend::cuda_local, backend::nccl}) {
          CAPTURE(loom_device_test::name(b));
          if (loom_device_test::skip_unless_devices(b, n)) continue;
          for (std::uint64_t seed = 1; seed <= 20; ++seed) {
            CAPTURE(seed);
            loom_device_test::simulate_with(seed);
            auto body = [&](auto& w) {
              using counted = loom::counted<std::remove_cvref_t<decltype(w)>>;
              counted c(w.split(0, w.rank()));
              loom::cuda::stream st;
              loom::on_stream<counted> on(c, st.get());
              loom::tp_group<loom::on_stream<counted>> g{&on, mode, ordered};
              std::vector<std::vector<float>> sources;  // alive until the copies ran (fetch synchronises)
              sources.reserve(32);
              auto r = tp_pair(
                  g, loom::cuda::linear_kernel{st.get()},
                  [&](std::vector<float> v) {
                    sources.push_back(std::move(v));
                    return upload(sources.back(), st.get());
                  },
                  [&](loom::cuda::device_buffer<float>& d) { return download(d, st.get()); });
              r.counts = c.counters();
              got[static_cast<std::size_t>(c.rank())] = r;
              w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank done before the buffers go
            };
            loom_device_test::run_on(b, n, body);
            // Ordered sums on nccl over more than 2 ranks are an all-to-all and an all-gather where
            // the rank-ordered threads backend all-reduces: the same bytes, other calls.
            const bool same_calls = !(ordered && b == backend::nccl && n > 2);
            for (std::size_t r = 0; r < got.size(); ++r) {
              CAPTURE(r);
#if defined(LOOM_CUDA_SIM)
              CHECK(got[r].y == want[r].y);
              CHECK(got[r].dx == want[r].dx);
              CHECK(got[r].gw1 == want[r].gw1);
              CHECK(got[r].gb1 == want[r].gb1);
              CHECK(got[r].gw2 == want[r].gw2);
#else
              CHECK(max_rel(got[r].y, want[r].y) <= 1e-5);
              CHECK(max_rel(got[r].dx, want[r].dx) <= 1e-5);
              CHECK(max_rel(got[r].gw1, want[r].gw1) <= 1e-5);
              CHECK(max_rel(got[r].gw2, want[r].gw2) <= 1e-5);
#endif
              if (same_calls) CHECK(got[r].counts == want[r].counts);
            }
            CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
            break;  // a GPU has no seeds to vary
#endif
          }
        }
      }
}

TEST_CASE("the tensor grids' SUMMA and 3D layers run on device groups with loom's device kernels, as on threads") {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  for (auto [kind, n] : {std::pair{loom::tp_kind::d2, 4}, std::pair{loom::tp_kind::d3, 8}})
    for (bool ordered : {false, true})
      grid_device_equals_threads(loom::mesh<tpd>{tpd{n, kind}}, ordered, 5, [](auto& g, auto k, auto&& make, auto&& fetch) {
        return grid_pair(g, k.linear, make, fetch);
      });
}

TEST_CASE("the tensor grids' layer norm runs on device groups with loom's device kernels, as on threads") {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  struct grid_case {
    loom::tp_kind kind;
    int ranks, depth;
    bool odd;
  };
  for (const grid_case gc : {grid_case{loom::tp_kind::d2, 4, 0, false}, grid_case{loom::tp_kind::d2_5, 8, 2, false},
                             grid_case{loom::tp_kind::d3, 8, 0, false}, grid_case{loom::tp_kind::d3, 8, 0, true}})
    for (bool ordered : {false, true}) {
      CAPTURE(gc.odd);
      grid_device_equals_threads(loom::mesh<tpd>{tpd{gc.ranks, gc.kind, gc.depth}}, ordered, 3,
                                 [&](auto& g, auto k, auto&& make, auto&& fetch) { return grid_norm(g, gc.odd, k.norm, make, fetch); });
    }
}
