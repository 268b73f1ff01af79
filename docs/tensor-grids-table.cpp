// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/tensor-grids.md's tables:
// 1. an MLP (h -> f -> h, two linear layers with biases) run once forward and backward on each
//    grid over threads, every member's counted elements per call beside the formula
//    (loom::summa_volume, loom::cube_volume);
// 2. the formulas at a large size (h = 5120, f = 4h, 8192 tokens per tensor-parallel group) for
//    Megatron's 1D split and the grids, per member: elements moved per MLP step, weights and
//    activations held.
//   build/tests/docs/doc_tensor-grids-table
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/threads.hpp"
#include "loom/exec/tensor_grid.hpp"

namespace {

using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
using mesh_t = loom::mesh<tpd>;

struct grid_spec {
  loom::tp_kind kind;
  int ranks, depth;
};

// Elements a member's counters hold, over every grid group and collective: message elements
// (the sum of the collectives' counted sizes) and bus elements (over the member's link).
struct elements {
  std::size_t message = 0;
  double bus = 0;
  friend bool operator==(const elements&, const elements&) = default;
};

template <class MC>
elements counted_elements(MC& mc) {
  elements e;
  for (auto g : {loom::grid_group::row, loom::grid_group::column, loom::grid_group::depth})
    if (mc.grid(g).size() > 1)
      for (auto op : loom::all_comm_ops) {
        e.message += mc.grid(g).counters()[op].bytes / sizeof(double);
        e.bus += mc.grid(g).counters()[op].bus_bytes / sizeof(double);
      }
  mc.reset_counters();
  return e;
}

struct call_counts {
  elements fwd, bwd_in, bwd_w;  // one layer's three calls
  double bus() const { return fwd.bus + bwd_in.bus + bwd_w.bus; }
  std::size_t message() const { return fwd.message + bwd_in.message + bwd_w.message; }
};

// Runs the MLP once on the grid; returns every member's counts for the two layers (first,
// second), and whether all members agree.
std::vector<call_counts> run(const grid_spec& gs, std::size_t tokens, std::size_t h, std::size_t f, bool& agree) {
  const mesh_t m{tpd{gs.ranks, gs.kind, gs.depth}};
  const loom::tp_grid g = m.grid();
  const auto q = static_cast<std::size_t>(g.q);
  const bool cube = g.kind == loom::tp_kind::d3;
  const std::size_t n = cube ? tokens / (q * q) : tokens / (q * static_cast<std::size_t>(g.depth));
  std::vector<std::vector<call_counts>> all(static_cast<std::size_t>(gs.ranks));
  loom::run_threads(gs.ranks, [&](loom::threads::comm& w) {
    loom::mesh_comm mc(m, w);
    auto gc = loom::grid_comms(mc, true);
    std::vector<call_counts> mine(2);
    auto blk = [&](std::size_t features) { return std::vector<double>(n * features / q, 0.5); };
    auto wblk = [&](std::size_t in, std::size_t out) { return std::vector<double>(cube ? (out / (q * q)) * (in / q) : (out / q) * (in / q), 0.25); };
    std::vector<double> x = blk(h), y1 = blk(f), y2 = blk(h), dy2 = blk(h), dy1 = blk(f), dx = blk(h);
    std::vector<double> w1 = wblk(h, f), w2 = wblk(f, h), g1 = w1, g2 = w2, b1(f / (q * q), 0.1), b2(h / (q * q), 0.1), gb1 = b1, gb2 = b2;
    auto c = [](const std::vector<double>& v) { return std::span<const double>(v); };
    auto s = [](std::vector<double>& v) { return std::span<double>(v); };
    // Both layers forward, then the second's backward, then the first's: each call's counts.
    auto chain = [&](const auto& first, const auto& second, auto s1, auto s2) {
      mc.reset_counters();
      first.forward(gc, c(x), c(w1), c(b1), s(y1), s1);
      mine[0].fwd = counted_elements(mc);
      second.forward(gc, c(y1), c(w2), c(b2), s(y2), s2);
      mine[1].fwd = counted_elements(mc);
      second.backward_input(gc, c(dy2), c(w2), s(dy1), s2);
      mine[1].bwd_in = counted_elements(mc);
      second.backward_weight(gc, c(y1), c(dy2), s(g2), s(gb2), s2);
      mine[1].bwd_w = counted_elements(mc);
      first.backward_input(gc, c(dy1), c(w1), s(dx), s1);
      mine[0].bwd_in = counted_elements(mc);
      first.backward_weight(gc, c(x), c(dy1), s(g1), s(gb1), s1);
      mine[0].bwd_w = counted_elements(mc);
    };
    if (cube) {
      loom::cube_host_scratch<double> s1(n, h, f, q), s2(n, f, h, q);
      chain(loom::cube_linear<>{h, f, false}, loom::cube_linear<>{f, h, true}, s1.spans(), s2.spans());
    } else {
      loom::summa_host_scratch<double> s1(n, h, f, q), s2(n, f, h, q);
      chain(loom::summa_linear<>{h, f}, loom::summa_linear<>{f, h}, s1.spans(), s2.spans());
    }
    all[static_cast<std::size_t>(w.rank())] = mine;
  });
  agree = true;
  for (auto& a : all)
    for (std::size_t l = 0; l < 2; ++l)
      agree = agree && a[l].fwd == all[0][l].fwd && a[l].bwd_in == all[0][l].bwd_in && a[l].bwd_w == all[0][l].bwd_w;
  return all[0];
}

// The formula per call for one layer `in` x `out` on grid `g`, `n` tokens per member.
template <class V>
elements of(const V& v, const loom::tp_grid& g) {
  return {v.total(), v.bus(g)};
}
call_counts formula(const loom::tp_grid& g, std::size_t n, std::size_t in, std::size_t out) {
  if (g.kind == loom::tp_kind::d3)
    return {of(loom::cube_volume::forward(n, in, out, g), g), of(loom::cube_volume::backward_input(n, in, out, g), g),
            of(loom::cube_volume::backward_weight(n, in, out, g), g)};
  return {of(loom::summa_volume::forward(n, in, out, g), g), of(loom::summa_volume::backward_input(n, in, out, g), g),
          of(loom::summa_volume::backward_weight(n, in, out, g), g)};
}

std::size_t members_tokens(const loom::tp_grid& g, std::size_t tokens) {
  const auto q = static_cast<std::size_t>(g.q);
  return g.kind == loom::tp_kind::d3 ? tokens / (q * q) : tokens / (q * static_cast<std::size_t>(g.depth));
}

}  // namespace

int main() {
  const std::size_t tokens = 72, h = 36, f = 72;
  std::printf("| grid | ranks | layer | forward | backward input | backward weight | bus elements | counted = formula, every member |\n");
  std::printf("|:--|--:|:--|--:|--:|--:|--:|:-:|\n");
  for (grid_spec gs : {grid_spec{loom::tp_kind::d2, 4, 0}, grid_spec{loom::tp_kind::d2, 9, 0}, grid_spec{loom::tp_kind::d2_5, 8, 2},
                       grid_spec{loom::tp_kind::d3, 8, 0}}) {
    bool agree = false;
    const auto got = run(gs, tokens, h, f, agree);
    const loom::tp_grid g = loom::make_tp_grid(gs.kind, gs.ranks, gs.depth);
    const std::size_t n = members_tokens(g, tokens);
    for (std::size_t l = 0; l < 2; ++l) {
      const call_counts want = formula(g, n, l == 0 ? h : f, l == 0 ? f : h);
      const bool equal = agree && want.fwd == got[l].fwd && want.bwd_in == got[l].bwd_in && want.bwd_w == got[l].bwd_w;
      std::printf("| %s | %d | %s | %zu | %zu | %zu | %.0f | %s |\n", std::string(g.describe().view()).c_str(), gs.ranks,
                  l == 0 ? "h -> f" : "f -> h", got[l].fwd.message, got[l].bwd_in.message, got[l].bwd_w.message, got[l].bus(),
                  equal ? "yes" : "NO");
    }
  }

  // 2. The formulas at a large size, per member per MLP step (both layers, forward and backward):
  // bus elements, the weights and the MLP input held.
  const std::size_t H = 5120, F = 4 * H;
  for (std::size_t N : {std::size_t{8192}, std::size_t{131072}}) {
    std::printf("\n| tokens | tensor parallelism | ranks | bus elements per MLP step | weights held | MLP input held |\n");
    std::printf("|--:|:--|--:|--:|--:|--:|\n");
    for (int p : {4, 8, 16, 64, 256, 512}) {
      const auto P = static_cast<std::size_t>(p);
      // Megatron 1D, replicated activations: the row-parallel output all-reduced forward and the
      // column-parallel input gradient backward, N x H each, 2 (p - 1) / p over the link.
      const double ar = 2.0 * static_cast<double>(N * H) * loom::bus_factor(loom::comm_op::all_reduce, p);
      std::printf("| %zu | 1d | %d | %.0f | %zu | %zu |\n", N, p, ar, 2 * H * F / P + F / P + H, N * H);
      for (auto kind : {loom::tp_kind::d2, loom::tp_kind::d2_5, loom::tp_kind::d3}) {
        const int depth = kind == loom::tp_kind::d2_5 ? (p == 8 ? 2 : p == 16 || p == 64 ? 4 : p == 512 ? 8 : 0) : 0;
        loom::tp_grid g;
        try {
          g = loom::make_tp_grid(kind, p, depth);
        } catch (const loom::config_error&) {
          continue;  // p is not a square (2d), q x q x depth (2.5d) or a cube (3d)
        }
        const auto q = static_cast<std::size_t>(g.q);
        const std::size_t n = members_tokens(g, N);
        const call_counts a = formula(g, n, H, F), b = formula(g, n, F, H);
        // 2D and 2.5D: a weight block and a bias piece per layer; 3D: a weight piece, and a bias
        // piece replicated over the output group.
        const std::size_t weights =
            kind == loom::tp_kind::d3 ? 2 * H * F / (q * q * q) + (F + H) / (q * q) : (2 * H * F + F + H) / (q * q);
        std::printf("| %zu | %s | %d | %.0f | %zu | %zu |\n", N, std::string(g.describe().view()).c_str(), p, a.bus() + b.bus(), weights,
                    n * (H / q));
      }
    }
  }
  return 0;
}
