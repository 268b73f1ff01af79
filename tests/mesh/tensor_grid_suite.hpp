// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The tensor-parallel grids' linear layer (loom/exec/tensor_grid.hpp) checked on any world
//! communicator, written once and run on threads (tests/mesh/tensor_grid_test.cpp) and on MPI
//! processes (tests/mpi/mpi_test.cpp): every data-parallel replica's grid members cut their
//! blocks out of the same whole matrices, run the forward and both halves of the backward, and
//! compare their blocks with the single-rank products (`linear_kernel::forward`, bitwise; the
//! backward's sums in the grid's order, `summa_reference`: bitwise in deterministic mode, within
//! 1e-12 relative otherwise) and the counters with `summa_volume`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/exec/tensor_grid.hpp"
#include "loom/mesh.hpp"

namespace grid_suite {

//! A check that did not hold on this rank.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! One grid to check: `dp` replicas of a tensor-parallel group of `tp` ranks of kind `kind`.
struct grid_case {
  int dp = 1;                            //!< data-parallel replicas
  loom::tp_kind kind = loom::tp_kind::d2;  //!< the grid's kind
  int tp = 4;                            //!< ranks per grid
  int depth = 0;                         //!< 2.5D's depth (0 otherwise)
};

//! A value in [-1, 1) from a seed and an index (splitmix64), the same on every rank.
inline double value(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

inline std::vector<double> values(std::uint64_t seed, std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(seed, i);
  return v;
}

inline void compare(std::span<const double> got, std::span<const double> want, bool exact, int rank, const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    const bool ok = exact ? std::memcmp(&a, &b, sizeof a) == 0 : std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b));
    if (!ok) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " is %.17g, the reference %.17g", a, b);
      throw failure("rank " + std::to_string(rank) + ": " + what + " element " + std::to_string(i) + buf);
    }
  }
}

inline void expect_bytes(std::uint64_t got, std::size_t elements, int rank, const std::string& what) {
  if (got != elements * sizeof(double))
    throw failure("rank " + std::to_string(rank) + ": " + what + " counted " + std::to_string(got) + " bytes, the formula " +
                  std::to_string(elements * sizeof(double)));
}

//! Checks the counters of the grid groups of `mc` against `v`, then zeroes them.
template <class MC>
void check_volume(MC& mc, const loom::summa_volume& v, int rank, const std::string& step) {
  using loom::comm_op;
  using loom::grid_group;
  auto& row = mc.grid(grid_group::row).counters();
  auto& col = mc.grid(grid_group::column).counters();
  auto& depth = mc.grid(grid_group::depth).counters();
  expect_bytes(row[comm_op::broadcast].bytes, v.row_broadcast, rank, step + ": row broadcast");
  expect_bytes(row[comm_op::reduce].bytes, v.row_reduce, rank, step + ": row reduce");
  expect_bytes(col[comm_op::broadcast].bytes, v.column_broadcast, rank, step + ": column broadcast");
  expect_bytes(col[comm_op::reduce].bytes, v.column_reduce, rank, step + ": column reduce");
  expect_bytes(col[comm_op::all_gather].bytes, v.column_gather, rank, step + ": column all-gather");
  expect_bytes(col[comm_op::reduce_scatter].bytes, v.column_scatter, rank, step + ": column reduce-scatter");
  expect_bytes(mc.grid(grid_group::depth).size() > 1 ? depth[comm_op::all_reduce].bytes : 0, v.depth_reduce, rank,
               step + ": depth all-reduce");
  mc.reset_counters();
}

//! Runs the SUMMA layer of `c` on the world `world` (collective) and throws `failure` on the
//! first difference from the reference. `ordered`: deterministic mode (bitwise); `count`: also
//! compare the counters with `summa_volume` (the ordered reduce of a group of more than two
//! ranks on a backend without rank-ordered sums moves its bytes as sends, not as a reduce).
template <class World>
void summa_matches_reference(World& world, grid_case c, bool ordered, bool count) {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  const loom::mesh<loom::dp<>, tpd> m{loom::dp<>{c.dp}, tpd{c.tp, c.kind, c.depth}};
  loom::mesh_comm mc(m, world);
  const loom::tp_grid& g = m.grid();
  const auto q = static_cast<std::size_t>(g.q), d = static_cast<std::size_t>(g.depth);
  const std::size_t in = 4 * q, out = 2 * q * q, tokens = 3 * q * d, n = tokens / (q * d);
  const int rank = world.rank();
  if (auto rule = loom::summa_rule(in, out, tokens, g); !rule.empty()) throw failure(std::string(rule.view()));

  // The whole matrices of this replica (the seed is its dp coordinate) and the single-rank results.
  const auto seed = static_cast<std::uint64_t>(mc.coord(loom::dim::dp)) * 16;
  auto x = values(seed + 1, tokens * in), w = values(seed + 2, out * in), b = values(seed + 3, out),
       dy = values(seed + 4, tokens * out), gw = values(seed + 5, out * in), gb = values(seed + 6, out);
  std::vector<double> y(tokens * out), dx(tokens * in);
  loom::linear_kernel::forward(std::span<const double>(x), std::span<const double>(w), std::span<const double>(b),
                               std::span<double>(y), tokens, in, out);
  loom::summa_reference::backward_input(std::span<const double>(dy), std::span<const double>(w), std::span<double>(dx), tokens,
                                        in, out, g);
  std::vector<double> gw_ref = gw, gb_ref = gb;
  loom::summa_reference::backward_weight(std::span<const double>(x), std::span<const double>(dy), std::span<double>(gw_ref),
                                         std::span<double>(gb_ref), tokens, in, out, g);

  // This member's blocks.
  const loom::summa_layout at{g, mc.coord(loom::dim::tp)};
  std::vector<double> xb(n * in / q), wb((out / q) * (in / q)), bb(out / (q * q)), dyb(n * out / q), gwb(wb.size()),
      gbb(bb.size());
  at.activation(std::span<double>(x), std::span<double>(xb), tokens, in, false);
  at.weight(std::span<double>(w), std::span<double>(wb), in, out, false);
  at.bias(std::span<double>(b), std::span<double>(bb), out, false);
  at.activation(std::span<double>(dy), std::span<double>(dyb), tokens, out, false);
  at.weight(std::span<double>(gw), std::span<double>(gwb), in, out, false);
  at.bias(std::span<double>(gb), std::span<double>(gbb), out, false);
  std::vector<double> want_y(n * out / q), want_dx(xb.size()), want_gw(gwb.size()), want_gb(gbb.size());
  at.activation(std::span<double>(y), std::span<double>(want_y), tokens, out, false);
  at.activation(std::span<double>(dx), std::span<double>(want_dx), tokens, in, false);
  at.weight(std::span<double>(gw_ref), std::span<double>(want_gw), in, out, false);
  at.bias(std::span<double>(gb_ref), std::span<double>(want_gb), out, false);

  auto gc = loom::grid_comms(mc, ordered);
  const loom::summa_linear<> layer{in, out};
  loom::summa_host_scratch<double> scratch(n, in, out, q);
  mc.reset_counters();
  std::vector<double> yb(want_y.size()), dxb(xb.size());
  layer.forward(gc, std::span<const double>(xb), std::span<const double>(wb), std::span<const double>(bb), std::span<double>(yb),
                scratch.spans());
  compare(yb, want_y, true, rank, "forward output (bitwise, any mode)");
  if (count) check_volume(mc, loom::summa_volume::forward(n, in, out, g), rank, "forward");
  layer.backward_input(gc, std::span<const double>(dyb), std::span<const double>(wb), std::span<double>(dxb), scratch.spans());
  compare(dxb, want_dx, ordered, rank, "input gradient");
  if (count) check_volume(mc, loom::summa_volume::backward_input(n, in, out, g), rank, "backward input");
  layer.backward_weight(gc, std::span<const double>(xb), std::span<const double>(dyb), std::span<double>(gwb),
                        std::span<double>(gbb), scratch.spans());
  compare(gwb, want_gw, ordered, rank, "weight gradient");
  compare(gbb, want_gb, ordered, rank, "bias gradient");
  if (count) check_volume(mc, loom::summa_volume::backward_weight(n, in, out, g), rank, "backward weight");
}

}  // namespace grid_suite
