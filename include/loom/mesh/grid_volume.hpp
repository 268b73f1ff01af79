// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! What the tensor-parallel grids move (issue 25), apart from the layers that move it
//! (`loom/exec/tensor_grid.hpp`), so `loom::plan` prices the grids with the very formulas the
//! executor's counters are checked against: the shape rules of the SUMMA (2D, 2.5D) and 3D linear
//! layers, the elements one member moves per call of each layer (`summa_volume`,
//! `cube_volume`) and of the grid layer norm (`norm_volume`), and per call of a whole transformer
//! block on a grid (`grid_block`, `grid_block_volume`: the parts of the mesh example's grid model,
//! `examples/03_mesh/grid_model.hpp`, whose every step compares each rank's counters with it).
//! Elements, not bytes: a broadcast and a reduce counted as their buffer, an all-gather by its
//! output, a reduce-scatter by its input, an all-reduce by its buffer, as `loom::counted` counts
//! them. A group of one rank moves nothing.

#include <array>
#include <cstddef>
#include <map>
#include <utility>

#include "loom/comm/comm_op.hpp"
#include "loom/mesh/mesh.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! The rule a SUMMA linear layer of `in` x `out` features over `tokens` tokens (the whole
//! batch of one tensor-parallel group) breaks on the grid `g`, or "": the features split into
//! `q` blocks (the biases into `q^2` pieces) and the tokens into `depth x q` blocks.
constexpr text summa_rule(std::size_t in, std::size_t out, std::size_t tokens, const tp_grid& g) {
  const auto q = static_cast<std::size_t>(g.q), d = static_cast<std::size_t>(g.depth);
  const text name = "tensor parallel " + text(g.describe());
  if (g.kind != tp_kind::d2 && g.kind != tp_kind::d2_5) return name + ": SUMMA's layer runs on the 2d and 2.5d grids";
  if (in % q != 0) return name + ": " + detail::to_text(in) + " input features are not divisible by q = " + detail::to_text(q);
  if (out % (q * q) != 0)
    return name + ": " + detail::to_text(out) + " output features are not divisible by q x q = " + detail::to_text(q * q) +
           " (the biases are split over the grid)";
  if (tokens % (q * d) != 0)
    return name + ": " + detail::to_text(tokens) + " tokens are not divisible by q x depth = " + detail::to_text(q * d);
  return {};
}

//! Elements one member moves per call of the SUMMA linear layer (`loom/exec/tensor_grid.hpp`'s file comment), by kind
//! of collective and group.
struct summa_volume {
  std::size_t row_broadcast = 0;     //!< broadcast over the row
  std::size_t column_broadcast = 0;  //!< broadcast over the column
  std::size_t row_reduce = 0;        //!< reduced over the row
  std::size_t column_reduce = 0;     //!< reduced over the column
  std::size_t column_gather = 0;     //!< all-gathered over the column (output elements)
  std::size_t column_scatter = 0;    //!< reduce-scattered over the column (input elements)
  std::size_t depth_reduce = 0;      //!< all-reduced over depth

  //! Every element.
  constexpr std::size_t total() const {
    return row_broadcast + column_broadcast + row_reduce + column_reduce + column_gather + column_scatter + depth_reduce;
  }
  friend constexpr bool operator==(const summa_volume&, const summa_volume&) = default;
  //! Elements over the member's link in the bandwidth-optimal algorithms (`loom::bus_factor`:
  //! broadcasts and reduces once, gathers and scatters `(q - 1) / q`, the depth all-reduce
  //! `2 (d - 1) / d`), as `loom::counted`'s bus bytes count them.
  constexpr double bus(const tp_grid& g) const {
    return static_cast<double>(row_broadcast) * bus_factor(comm_op::broadcast, g.q) +
           static_cast<double>(column_broadcast) * bus_factor(comm_op::broadcast, g.q) +
           static_cast<double>(row_reduce) * bus_factor(comm_op::reduce, g.q) +
           static_cast<double>(column_reduce) * bus_factor(comm_op::reduce, g.q) +
           static_cast<double>(column_gather) * bus_factor(comm_op::all_gather, g.q) +
           static_cast<double>(column_scatter) * bus_factor(comm_op::reduce_scatter, g.q) +
           static_cast<double>(depth_reduce) * bus_factor(comm_op::all_reduce, g.depth);
  }

  //! The forward's volume for `n` tokens per member (with a bias).
  static constexpr summa_volume forward(std::size_t n, std::size_t in, std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (q == 1) return {};
    return {.row_broadcast = q * (n * in / q), .column_broadcast = q * (out / q) * (in / q), .column_gather = out / q};
  }
  //! The input gradient's.
  static constexpr summa_volume backward_input(std::size_t n, std::size_t in, std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (q == 1) return {};
    return {.column_broadcast = q * (out / q) * (in / q), .row_reduce = q * (n * in / q)};
  }
  //! The weight and bias gradients'.
  static constexpr summa_volume backward_weight(std::size_t n, std::size_t in, std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (q == 1) return {.depth_reduce = g.depth > 1 ? out * in + out : 0};
    return {.row_broadcast = q * (n * in / q),
            .column_reduce = q * (out / q) * (in / q),
            .column_scatter = out / q,
            .depth_reduce = g.depth > 1 ? (out / q) * (in / q) + out / (q * q) : 0};
  }
};


//! The rule a 3D linear layer of `in` x `out` features over `tokens` tokens (one grid's batch)
//! breaks on the cube `g`, or "": the input features split into `q` blocks, the output features
//! into `q^2` pieces (weights and biases over the weight group) and the tokens into `q^2` slices.
constexpr text cube_rule(std::size_t in, std::size_t out, std::size_t tokens, const tp_grid& g) {
  const auto q = static_cast<std::size_t>(g.q);
  const text name = "tensor parallel " + text(g.describe());
  if (g.kind != tp_kind::d3) return name + ": the 3D layer runs on the 3d grid";
  if (in % q != 0) return name + ": " + detail::to_text(in) + " input features are not divisible by q = " + detail::to_text(q);
  if (out % (q * q) != 0)
    return name + ": " + detail::to_text(out) + " output features are not divisible by q x q = " + detail::to_text(q * q);
  if (tokens % (q * q) != 0)
    return name + ": " + detail::to_text(tokens) + " tokens are not divisible by q x q = " + detail::to_text(q * q);
  return {};
}

//! Which grid axis plays which part in one 3D layer (Bian et al. 2021, §3; the groups of
//! ColossalAI's `linear_3d`, `hpcaitech/ColossalAI`,
//! `colossalai/legacy/nn/layer/parallel_3d/_operation.py`, commit
//! f085c54430bc94d648ee8b0c35a698156d246dd7): the member `(layer k, row i, column j)` of the cube
//! is `(a, b, c)` = `(k, i, j)` in an even layer and `(k, j, i)` in an odd one, where `a` is the
//! token block, `b` the input feature block and `c` the output feature block. Its input group
//! varies `c`, its weight group `a` (the depth group), its output group `b`; an odd layer swaps
//! the row and column groups, so each layer's output is laid out as the next one's input.
struct cube_roles {
  int a = 0, b = 0, c = 0;  //!< the member's token block, input block and output block
  bool odd = false;         //!< the layer's parity

  //! The roles of member `t` of `g` in a layer of parity `odd`.
  static constexpr cube_roles of(const tp_grid& g, int t, bool odd) {
    return odd ? cube_roles{g.layer(t), g.column(t), g.row(t), true} : cube_roles{g.layer(t), g.row(t), g.column(t), false};
  }
  //! The grid group serving as the input group (varies `c`).
  constexpr grid_group input() const { return odd ? grid_group::column : grid_group::row; }
  //! The weight group (varies `a`).
  static constexpr grid_group weight() { return grid_group::depth; }
  //! The output group (varies `b`).
  constexpr grid_group output() const { return odd ? grid_group::row : grid_group::column; }
};

//! Elements one member moves per call of `cube_linear` (all-gathers counted by their output,
//! reduce-scatters by their input, as `loom::counted` counts them), for `n` tokens per member.
struct cube_volume {
  std::size_t input_gather = 0;    //!< all-gathered over the input group
  std::size_t weight_gather = 0;   //!< all-gathered over the weight group (weights and biases)
  std::size_t output_gather = 0;   //!< all-gathered over the output group
  std::size_t input_scatter = 0;   //!< reduce-scattered over the input group
  std::size_t weight_scatter = 0;  //!< reduce-scattered over the weight group
  std::size_t output_scatter = 0;  //!< reduce-scattered over the output group

  //! Every element.
  constexpr std::size_t total() const {
    return input_gather + weight_gather + output_gather + input_scatter + weight_scatter + output_scatter;
  }
  friend constexpr bool operator==(const cube_volume&, const cube_volume&) = default;
  //! Elements over the member's link in the bandwidth-optimal algorithms (every collective a
  //! gather or a scatter over `q` ranks: `(q - 1) / q` of its counted size).
  constexpr double bus(const tp_grid& g) const { return static_cast<double>(total()) * bus_factor(comm_op::all_gather, g.q); }

  //! The forward's (with a bias).
  static constexpr cube_volume forward(std::size_t n, std::size_t in, std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (q == 1) return {};
    return {.input_gather = q * n * (in / q), .weight_gather = (out / q) * (in / q) + out / q, .output_scatter = q * n * (out / q)};
  }
  //! The input gradient's.
  static constexpr cube_volume backward_input(std::size_t n, std::size_t in, std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (q == 1) return {};
    return {.weight_gather = (out / q) * (in / q), .output_gather = q * n * (out / q), .input_scatter = q * n * (in / q)};
  }
  //! The weight and bias gradients'.
  static constexpr cube_volume backward_weight(std::size_t n, std::size_t in, std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (q == 1) return {};
    return {.input_gather = q * n * (in / q), .output_gather = q * n * (out / q), .weight_scatter = (out / q) * (in / q) + out / q};
  }
};


//! Elements one member moves per call of `grid_layer_norm` for `n` tokens of `h` features, `q`
//! feature blocks, `p` pieces and `r` replicas (all-gathers counted by their output,
//! reduce-scatters by their input, all-reduces by their buffer; nothing on a group of one).
struct norm_volume {
  std::size_t features_reduce = 0;  //!< all-reduced over the features group (row statistics)
  std::size_t pieces_gather = 0;    //!< all-gathered over the pieces group (weights)
  std::size_t pieces_scatter = 0;   //!< reduce-scattered over the pieces group (gradients)
  std::size_t replicas_reduce = 0;  //!< all-reduced over the replicas (gradients)
  friend constexpr bool operator==(const norm_volume&, const norm_volume&) = default;

  //! The forward's: the two statistics, the weight and bias blocks.
  static constexpr norm_volume forward(std::size_t n, std::size_t h, std::size_t q, std::size_t p) {
    return {.features_reduce = q > 1 ? 2 * n : 0, .pieces_gather = p > 1 ? 2 * (h / q) : 0};
  }
  //! The input gradient's: the two row sums, the weight block.
  static constexpr norm_volume backward_input(std::size_t n, std::size_t h, std::size_t q, std::size_t p) {
    return {.features_reduce = q > 1 ? 2 * n : 0, .pieces_gather = p > 1 ? h / q : 0};
  }
  //! The weights' gradients.
  static constexpr norm_volume backward_weight(std::size_t h, std::size_t q, std::size_t p, std::size_t r) {
    return {.pieces_scatter = p > 1 ? 2 * (h / q) : 0, .replicas_reduce = r > 1 ? 2 * (h / (q * p)) : 0};
  }
};

//! One part of a transformer block on a grid: a layer norm over `in` features, or a linear layer
//! `in -> out` (`odd`: the second of a 3D pair, `cube_roles`, so the layouts chain). Each part has
//! two tensors: the norm's weight and bias, or the layer's weight `[out][in]` and bias `[out]`.
struct grid_block_part {
  bool norm = false;    //!< a layer norm (else a linear layer)
  std::size_t in = 0;   //!< input features
  std::size_t out = 0;  //!< output features
  bool odd = false;     //!< a linear layer's parity on a 3D grid
};

//! A pre-LN transformer block on a grid, as the mesh example's grid model runs it (Optimus's
//! layout, Xu et al. 2021, §3.2: whole sequences and whole heads per member, so the attention is
//! local): the attention half's norm, Q, K and V (separate layers), the output projection; the
//! MLP half's norm, the up and the down projection. On a 3D grid Q, K, V and the up projection
//! are even layers and the output and down projections odd, so each half returns its input's
//! layout.
struct grid_block {
  //! The parts' indices, in order.
  enum index : std::size_t { ln1, wq, wk, wv, wo, ln2, w1, w2, count };
  //! The parts of a block of width `h` and MLP features `f`.
  static constexpr std::array<grid_block_part, count> parts(std::size_t h, std::size_t f) {
    return {grid_block_part{true, h, h, false}, grid_block_part{false, h, h, false}, grid_block_part{false, h, h, false},
            grid_block_part{false, h, h, false}, grid_block_part{false, h, h, true},  grid_block_part{true, h, h, false},
            grid_block_part{false, h, f, false}, grid_block_part{false, f, h, true}};
  }
};

//! Elements one member of grid `g` moves per microbatch and `grid_block`, by grid group and
//! operation: the parts' `summa_volume`, `cube_volume` and `norm_volume` summed, in one of the
//! block's three calls (the forward, the input gradient, the weight gradient; the input gradient
//! without the first norm's for a block whose input gradient nobody needs, the first of a
//! model). The mesh example compares every rank's counters' elements with these times its stage
//! calls. `calls` is the number of collectives behind them (SUMMA's broadcasts and reduces one per
//! round, `q` per layer; every other collective one per layer), which `loom::plan` charges a
//! latency for; the counters' calls are not compared with it (deterministic MPI groups move the
//! same elements in more messages).
struct grid_block_volume {
  std::map<std::pair<grid_group, comm_op>, std::size_t> elements;  //!< what each group moves, by operation
  std::map<std::pair<grid_group, comm_op>, std::size_t> calls;     //!< how many collectives, by group and operation

  //! The three calls of a block.
  enum class call { forward, input, weight };
  //! One block's call `c` on the member's `n` tokens, width `h`, MLP features `f`.
  static grid_block_volume of(const tp_grid& g, std::size_t n, std::size_t h, std::size_t f, call c, bool norm_input = true) {
    grid_block_volume v;
    const auto q = static_cast<std::size_t>(g.q), reps = static_cast<std::size_t>(g.depth);
    auto add = [&](grid_group x, comm_op op, std::size_t e, std::size_t rounds = 1) {
      if (e == 0) return;
      v.elements[{x, op}] += e;
      v.calls[{x, op}] += rounds;
    };
    const bool is_cube = g.kind == tp_kind::d3;
    // The norm's groups: features, pieces (replicas: depth).
    const cube_roles even{0, 0, 0, false};
    const grid_group nf = is_cube ? even.output() : grid_group::row, np = is_cube ? even.input() : grid_group::column;
    auto norm = [&](const norm_volume& x) {
      add(nf, comm_op::all_reduce, x.features_reduce);
      add(np, comm_op::all_gather, x.pieces_gather);
      add(np, comm_op::reduce_scatter, x.pieces_scatter);
      add(grid_group::depth, comm_op::all_reduce, reps > 1 ? x.replicas_reduce : 0);
    };
    auto summa = [&](const summa_volume& x) {
      add(grid_group::row, comm_op::broadcast, x.row_broadcast, q);
      add(grid_group::row, comm_op::reduce, x.row_reduce, q);
      add(grid_group::column, comm_op::broadcast, x.column_broadcast, q);
      add(grid_group::column, comm_op::reduce, x.column_reduce, q);
      add(grid_group::column, comm_op::all_gather, x.column_gather);
      add(grid_group::column, comm_op::reduce_scatter, x.column_scatter);
      add(grid_group::depth, comm_op::all_reduce, reps > 1 ? x.depth_reduce : 0);
    };
    auto cube = [&](const cube_volume& x, bool odd) {
      const cube_roles r{0, 0, 0, odd};
      add(r.input(), comm_op::all_gather, x.input_gather);
      add(cube_roles::weight(), comm_op::all_gather, x.weight_gather);
      add(r.output(), comm_op::all_gather, x.output_gather);
      add(r.input(), comm_op::reduce_scatter, x.input_scatter);
      add(cube_roles::weight(), comm_op::reduce_scatter, x.weight_scatter);
      add(r.output(), comm_op::reduce_scatter, x.output_scatter);
    };
    const auto parts = grid_block::parts(h, f);
    for (std::size_t p = 0; p < grid_block::count; ++p) {
      const grid_block_part& x = parts[p];
      if (x.norm) {
        if (c == call::forward) norm(norm_volume::forward(n, h, q, q));
        else if (c == call::weight) norm(norm_volume::backward_weight(h, q, q, reps));
        else if (p != grid_block::ln1 || norm_input) norm(norm_volume::backward_input(n, h, q, q));
        continue;
      }
      if (is_cube)
        cube(c == call::forward ? cube_volume::forward(n, x.in, x.out, g)
             : c == call::input ? cube_volume::backward_input(n, x.in, x.out, g)
                                : cube_volume::backward_weight(n, x.in, x.out, g),
             x.odd);
      else
        summa(c == call::forward ? summa_volume::forward(n, x.in, x.out, g)
              : c == call::input ? summa_volume::backward_input(n, x.in, x.out, g)
                                 : summa_volume::backward_weight(n, x.in, x.out, g));
    }
    return v;
  }
  //! `this += k x other`.
  void add(const grid_block_volume& other, std::size_t k) {
    for (const auto& [key, e] : other.elements) elements[key] += k * e;
    for (const auto& [key, e] : other.calls) calls[key] += k * e;
  }
};

}  // namespace loom
