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
#include "suite_values.hpp"

namespace grid_suite {

using suite_values::value;

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

//! Checks the counters of the grid groups of `mc` against the 3D layer's volume `v` for a layer
//! of parity `odd`, then zeroes them.
template <class MC>
void check_volume(MC& mc, const loom::cube_volume& v, bool odd, int rank, const std::string& step) {
  using loom::comm_op;
  const loom::cube_roles r{0, 0, 0, odd};
  auto& input = mc.grid(r.input()).counters();
  auto& weight = mc.grid(loom::cube_roles::weight()).counters();
  auto& output = mc.grid(r.output()).counters();
  expect_bytes(input[comm_op::all_gather].bytes, v.input_gather, rank, step + ": input all-gather");
  expect_bytes(weight[comm_op::all_gather].bytes, v.weight_gather, rank, step + ": weight all-gather");
  expect_bytes(output[comm_op::all_gather].bytes, v.output_gather, rank, step + ": output all-gather");
  expect_bytes(input[comm_op::reduce_scatter].bytes, v.input_scatter, rank, step + ": input reduce-scatter");
  expect_bytes(weight[comm_op::reduce_scatter].bytes, v.weight_scatter, rank, step + ": weight reduce-scatter");
  expect_bytes(output[comm_op::reduce_scatter].bytes, v.output_scatter, rank, step + ": output reduce-scatter");
  mc.reset_counters();
}

//! Two consecutive 3D layers (`in -> mid -> out`, even then odd, so the first one's output
//! slices are the second one's input slices) on `dp` replicas of a `q x q x q` cube over the
//! world `world` (collective), against `summa_reference`'s blocked sums: bitwise when `ordered`
//! (or the groups have at most two ranks), within 1e-12 relative otherwise; `count`: the
//! counters against `cube_volume`.
template <class World>
void cube_matches_reference(World& world, int dp, int tp, bool ordered, bool count) {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  const loom::mesh<loom::dp<>, tpd> m{loom::dp<>{dp}, tpd{tp, loom::tp_kind::d3}};
  loom::mesh_comm mc(m, world);
  const loom::tp_grid& g = m.grid();
  const auto q = static_cast<std::size_t>(g.q);
  const std::size_t in = 4 * q, mid = 2 * q * q, out = 3 * q * q, tokens = 3 * q * q, n = tokens / (q * q);
  const int rank = world.rank();
  for (std::size_t f : {mid, out})
    if (auto rule = loom::cube_rule(f == mid ? in : mid, f, tokens, g); !rule.empty()) throw failure(std::string(rule.view()));
  const bool exact = ordered || q <= 2;

  const auto seed = 100 + static_cast<std::uint64_t>(mc.coord(loom::dim::dp)) * 16;
  auto x = values(seed + 1, tokens * in), w1 = values(seed + 2, mid * in), b1 = values(seed + 3, mid),
       w2 = values(seed + 4, out * mid), b2 = values(seed + 5, out), dy2 = values(seed + 6, tokens * out),
       g1 = values(seed + 7, mid * in), gb1 = values(seed + 8, mid), g2 = values(seed + 9, out * mid), gb2 = values(seed + 10, out);
  using ref = loom::summa_reference;
  std::vector<double> y1(tokens * mid), y2(tokens * out), dy1(tokens * mid), dx(tokens * in);
  ref::blocked_forward(std::span<const double>(x), std::span<const double>(w1), std::span<const double>(b1), std::span<double>(y1),
                       tokens, in, mid, q);
  ref::blocked_forward(std::span<const double>(y1), std::span<const double>(w2), std::span<const double>(b2), std::span<double>(y2),
                       tokens, mid, out, q);
  ref::backward_input(std::span<const double>(dy2), std::span<const double>(w2), std::span<double>(dy1), tokens, mid, out, g);
  ref::backward_input(std::span<const double>(dy1), std::span<const double>(w1), std::span<double>(dx), tokens, in, mid, g);
  std::vector<double> g1r = g1, gb1r = gb1, g2r = g2, gb2r = gb2;
  ref::blocked_weight(std::span<const double>(y1), std::span<const double>(dy2), std::span<double>(g2r), std::span<double>(gb2r),
                      tokens, mid, out, q, 1);
  ref::blocked_weight(std::span<const double>(x), std::span<const double>(dy1), std::span<double>(g1r), std::span<double>(gb1r),
                      tokens, in, mid, q, 1);

  const int t = mc.coord(loom::dim::tp);
  const loom::cube_layout even{g, t, false}, odd{g, t, true};
  auto cut_in = [&](const loom::cube_layout& at, std::vector<double>& whole, std::size_t f) {
    std::vector<double> v(n * f / q);
    at.input(std::span<double>(whole), std::span<double>(v), tokens, f, false);
    return v;
  };
  auto cut_out = [&](const loom::cube_layout& at, std::vector<double>& whole, std::size_t f) {
    std::vector<double> v(n * f / q);
    at.output(std::span<double>(whole), std::span<double>(v), tokens, f, false);
    return v;
  };
  auto cut_w = [&](const loom::cube_layout& at, std::vector<double>& whole, std::size_t fin, std::size_t fout) {
    std::vector<double> v((fout / (q * q)) * (fin / q));
    at.weight(std::span<double>(whole), std::span<double>(v), fin, fout, false);
    return v;
  };
  auto cut_b = [&](const loom::cube_layout& at, std::vector<double>& whole, std::size_t fout) {
    std::vector<double> v(fout / (q * q));
    at.bias(std::span<double>(whole), std::span<double>(v), fout, false);
    return v;
  };
  auto xs = cut_in(even, x, in), w1s = cut_w(even, w1, in, mid), b1s = cut_b(even, b1, mid), w2s = cut_w(odd, w2, mid, out),
       b2s = cut_b(odd, b2, out), dy2s = cut_out(odd, dy2, out), g1s = cut_w(even, g1, in, mid), gb1s = cut_b(even, gb1, mid),
       g2s = cut_w(odd, g2, mid, out), gb2s = cut_b(odd, gb2, out);

  auto gc = loom::grid_comms(mc, ordered);
  const loom::cube_linear<> first{in, mid, false}, second{mid, out, true};
  loom::cube_host_scratch<double> s1(n, in, mid, q), s2(n, mid, out, q);
  mc.reset_counters();
  std::vector<double> y1s(n * mid / q), y2s(n * out / q), dy1s(n * mid / q), dxs(n * in / q);
  auto c = [](const std::vector<double>& v) { return std::span<const double>(v); };
  first.forward(gc, c(xs), c(w1s), c(b1s), std::span<double>(y1s), s1.spans());
  compare(y1s, cut_out(even, y1, mid), exact, rank, "first layer's output");
  if (count) check_volume(mc, loom::cube_volume::forward(n, in, mid, g), false, rank, "first forward");
  if (y1s != cut_in(odd, y1, mid)) throw failure("rank " + std::to_string(rank) + ": an even layer's output slice is not the odd layer's input slice");
  second.forward(gc, c(y1s), c(w2s), c(b2s), std::span<double>(y2s), s2.spans());
  compare(y2s, cut_out(odd, y2, out), exact, rank, "second layer's output");
  if (count) check_volume(mc, loom::cube_volume::forward(n, mid, out, g), true, rank, "second forward");
  second.backward_input(gc, c(dy2s), c(w2s), std::span<double>(dy1s), s2.spans());
  compare(dy1s, cut_in(odd, dy1, mid), exact, rank, "second layer's input gradient");
  if (count) check_volume(mc, loom::cube_volume::backward_input(n, mid, out, g), true, rank, "second backward input");
  second.backward_weight(gc, c(y1s), c(dy2s), std::span<double>(g2s), std::span<double>(gb2s), s2.spans());
  compare(g2s, cut_w(odd, g2r, mid, out), exact, rank, "second layer's weight gradient");
  compare(gb2s, cut_b(odd, gb2r, out), exact, rank, "second layer's bias gradient");
  if (count) check_volume(mc, loom::cube_volume::backward_weight(n, mid, out, g), true, rank, "second backward weight");
  first.backward_input(gc, c(dy1s), c(w1s), std::span<double>(dxs), s1.spans());
  compare(dxs, cut_in(even, dx, in), exact, rank, "first layer's input gradient");
  first.backward_weight(gc, c(xs), c(dy1s), std::span<double>(g1s), std::span<double>(gb1s), s1.spans());
  compare(g1s, cut_w(even, g1r, in, mid), exact, rank, "first layer's weight gradient");
  compare(gb1s, cut_b(even, gb1r, mid), exact, rank, "first layer's bias gradient");
}

//! A layer norm over the grid's activations (2D and 2.5D: `summa_linear`'s layout; 3D: the input
//! layout of a layer of parity `odd`) against `grid_norm_reference`: forward, input gradient (with
//! a residual) and the weights' gradients; bitwise when `ordered` or every group has at most two
//! ranks, within 1e-12 otherwise; `count`: the counters against `norm_volume`.
template <class World>
void norm_matches_reference(World& world, grid_case c, bool odd, bool ordered, bool count) {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  const loom::mesh<loom::dp<>, tpd> m{loom::dp<>{c.dp}, tpd{c.tp, c.kind, c.depth}};
  loom::mesh_comm mc(m, world);
  const loom::tp_grid& g = m.grid();
  const bool cube = g.kind == loom::tp_kind::d3;
  const auto q = static_cast<std::size_t>(g.q), layers = static_cast<std::size_t>(g.depth);
  const std::size_t h = 2 * q * q, tokens = 3 * q * layers, n = tokens / (q * layers);
  const int rank = world.rank(), t = mc.coord(loom::dim::tp);
  const bool exact = ordered || q <= 2;

  const auto seed = 200 + static_cast<std::uint64_t>(mc.coord(loom::dim::dp)) * 16;
  auto x = values(seed + 1, tokens * h), gw = values(seed + 2, h), bw = values(seed + 3, h), dy = values(seed + 4, tokens * h),
       res = values(seed + 5, tokens * h), gg = values(seed + 6, h), gb = values(seed + 7, h);
  for (auto& v : gw) v += 1.5;  // weights away from zero
  const loom::grid_norm_reference ref{h, q};
  std::vector<double> y(x.size()), xhat(x.size()), rstd(tokens), dx(x.size()), ggr = gg, gbr = gb;
  auto cs = [](const std::vector<double>& v) { return std::span<const double>(v); };
  ref.forward(cs(x), cs(gw), cs(bw), std::span<double>(y), std::span<double>(xhat), std::span<double>(rstd), tokens);
  ref.backward_input(cs(dy), cs(xhat), cs(rstd), cs(gw), cs(res), std::span<double>(dx), tokens);
  ref.backward_weight(cs(dy), cs(xhat), std::span<double>(ggr), std::span<double>(gbr), tokens, q, layers);

  // The member's token range, feature block and piece of its feature block.
  const loom::cube_roles r = loom::cube_roles::of(g, t, odd);
  const std::size_t t0 = cube ? static_cast<std::size_t>(r.a) * (tokens / q) + static_cast<std::size_t>(r.c) * n
                              : static_cast<std::size_t>(g.layer(t) * g.q + g.row(t)) * n;
  const std::size_t fb = static_cast<std::size_t>(cube ? r.b : g.column(t)), piece = static_cast<std::size_t>(cube ? r.c : g.row(t));
  const std::size_t hq = h / q, pq = hq / q;
  auto rows = [&](const std::vector<double>& whole) {
    std::vector<double> v(n * hq);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t f = 0; f < hq; ++f) v[i * hq + f] = whole[(t0 + i) * h + fb * hq + f];
    return v;
  };
  auto pieces = [&](const std::vector<double>& whole) {
    return std::vector<double>(whole.begin() + static_cast<std::ptrdiff_t>(fb * hq + piece * pq),
                               whole.begin() + static_cast<std::ptrdiff_t>(fb * hq + (piece + 1) * pq));
  };
  std::vector<double> want_rstd(rstd.begin() + static_cast<std::ptrdiff_t>(t0), rstd.begin() + static_cast<std::ptrdiff_t>(t0 + n));

  auto gc = loom::grid_comms(mc, ordered);
  auto ng = cube ? loom::norm_groups<typename decltype(mc)::comm_type>::of_cube(gc, odd)
                 : loom::norm_groups<typename decltype(mc)::comm_type>::of_summa(gc);
  const loom::grid_layer_norm<> norm{h};
  loom::norm_host_scratch<double> s(n, h, q);
  const std::size_t reps = static_cast<std::size_t>(ng.replicas->size());
  mc.reset_counters();
  std::vector<double> yb(n * hq), xhb(n * hq), rb(n), dxb(n * hq), ggb = pieces(gg), gbb = pieces(gb);
  norm.forward(ng, cs(rows(x)), cs(pieces(gw)), cs(pieces(bw)), std::span<double>(yb), std::span<double>(xhb), std::span<double>(rb),
               s.spans());
  compare(yb, rows(y), exact, rank, "layer norm output");
  compare(rb, want_rstd, exact, rank, "layer norm 1 / sigma");
  auto check_norm = [&](const loom::norm_volume& v, const std::string& step) {
    using loom::comm_op;
    expect_bytes(ng.features->counters()[comm_op::all_reduce].bytes, v.features_reduce, rank, step + ": features all-reduce");
    expect_bytes(ng.pieces->counters()[comm_op::all_gather].bytes, v.pieces_gather, rank, step + ": pieces all-gather");
    expect_bytes(ng.pieces->counters()[comm_op::reduce_scatter].bytes, v.pieces_scatter, rank, step + ": pieces reduce-scatter");
    expect_bytes(reps > 1 ? ng.replicas->counters()[comm_op::all_reduce].bytes : 0, v.replicas_reduce, rank,
                 step + ": replicas all-reduce");
    mc.reset_counters();
  };
  if (count) check_norm(loom::norm_volume::forward(n, h, q, q), "norm forward");
  norm.backward_input(ng, cs(rows(dy)), cs(xhb), cs(rb), cs(pieces(gw)), cs(rows(res)), std::span<double>(dxb), s.spans());
  compare(dxb, rows(dx), exact, rank, "layer norm input gradient");
  if (count) check_norm(loom::norm_volume::backward_input(n, h, q, q), "norm backward input");
  norm.backward_weight(ng, cs(rows(dy)), cs(xhb), std::span<double>(ggb), std::span<double>(gbb), s.spans());
  compare(ggb, pieces(ggr), exact, rank, "layer norm weight gradient");
  compare(gbb, pieces(gbr), exact, rank, "layer norm bias gradient");
  if (count) check_norm(loom::norm_volume::backward_weight(h, q, q, reps), "norm backward weight");
}

}  // namespace grid_suite
