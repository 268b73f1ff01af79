// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! TokenRing (loom/exec/sequence_parallel.hpp) checked on any world communicator, written once and
//! run on threads (tests/mesh/sequence_parallel_test.cpp) and MPI processes
//! (tests/mpi/mpi_test.cpp): every position's forward bitwise against TokenRing's single-rank
//! order (`token_ring_reference_forward`) and within 1e-13 of ring attention's, its backward
//! bitwise ring attention's from the same output, and the bytes it sends equal to the formula,
//! which has no K or V term.

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

namespace token_ring_suite {

using suite_values::value;

//! A check that did not hold on this rank.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! TokenRing over the whole world (one position per rank), 24 tokens, 4 heads of 3 features.
template <class World>
void matches_reference(World& world, bool causal) {
  const int R = world.size(), r = world.rank(), heads = 4, D = 3, N = 24, T = N / R;
  const loom::attention_dims a{heads, D, 1.0 / std::sqrt(3.0)};
  const loom::seq_split split{N, 1, R};
  const auto n = static_cast<std::size_t>(T * heads * D), m = static_cast<std::size_t>(T * heads);
  auto fail = [&](const std::string& what) { throw failure("rank " + std::to_string(r) + ": " + what); };
  // Every position's local tensors (its zig-zag chunks of the whole sequence): the reference
  // needs them all.
  std::vector<std::vector<double>> q(static_cast<std::size_t>(R)), k = q, v = q, dout = q;
  for (int p = 0; p < R; ++p)
    for (int i = 0; i < T; ++i)
      for (int x = 0; x < heads * D; ++x) {
        const auto g = static_cast<std::uint64_t>(split.token(p, i) * heads * D + x);
        q[static_cast<std::size_t>(p)].push_back(value(11, g));
        k[static_cast<std::size_t>(p)].push_back(value(12, g));
        v[static_cast<std::size_t>(p)].push_back(value(13, g));
        dout[static_cast<std::size_t>(p)].push_back(value(14, g));
      }
  std::vector<std::vector<double>> ref_o, ref_lse;
  loom::token_ring_reference_forward<double>(a, T, causal, q, k, v, ref_o, ref_lse);

  using counted = loom::counted<World>;
  counted c(world.split(0, r)), rc(world.split(0, r));
  loom::token_ring_attention<counted, double> tr(&c, T, a, causal);
  loom::ring_attention<counted, double> ring(&rc, T, a, causal);
  const auto& Q = q[static_cast<std::size_t>(r)];
  const auto& K = k[static_cast<std::size_t>(r)];
  const auto& V = v[static_cast<std::size_t>(r)];
  const auto& dO = dout[static_cast<std::size_t>(r)];
  std::vector<double> o(n), lse(m), ro(n), rlse(m);
  tr.forward(Q, K, V, o, lse);
  if (o != ref_o[static_cast<std::size_t>(r)] || lse != ref_lse[static_cast<std::size_t>(r)])
    fail("the forward differs from TokenRing's single-rank order");
  ring.forward(Q, K, V, ro, rlse);
  double worst = 0, top = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(o[i] - ro[i]));
    top = std::max(top, std::abs(ro[i]));
  }
  if (worst > 1e-13 * top) fail("the forward is not within 1e-13 of ring attention's");
  const auto fwd = c.counters()[loom::comm_op::send].bytes;
  if (fwd != tr.forward_elements() * sizeof(double))
    fail("the forward sent " + std::to_string(fwd) + " bytes, the formula " + std::to_string(tr.forward_elements() * sizeof(double)));
  c.reset_counters();
  // The backward from TokenRing's own o and lse, against ring attention's from the same.
  std::vector<double> dq(n), dk(n), dv(n), rq(n), rk(n), rv(n);
  tr.backward(Q, K, V, o, lse, dO, dq, dk, dv);
  ring.backward(Q, K, V, o, lse, dO, rq, rk, rv);
  if (dq != rq || dk != rk || dv != rv) fail("the backward differs from ring attention's");
  const auto bwd = c.counters()[loom::comm_op::send].bytes;
  if (bwd != tr.backward_elements() * sizeof(double))
    fail("the backward sent " + std::to_string(bwd) + " bytes, the formula " + std::to_string(tr.backward_elements() * sizeof(double)));
}

}  // namespace token_ring_suite
