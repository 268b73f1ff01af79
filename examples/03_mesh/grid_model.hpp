// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The example's `--tp-kind 2d|2.5d|3d` mode (issue 25): a model whose activations *and* weights
//! are split over a tensor-parallel grid (`loom/exec/tensor_grid.hpp`), pipelined over `pp` by
//! any synchronous loom schedule and replicated over `dp`, checked against a single-rank
//! reference. The model is a stack of pre-LN MLP blocks, the half of a transformer block that
//! carries most of its weights:
//!
//!     z = LN(x),  a = z W1^T + b1,  u = tanh(a),  v = u W2^T + b2,  y = x + v
//!
//! with `W1` `[ffn][hidden]` and `W2` `[hidden][ffn]`, and a squared error `0.5 (y - target)^2`
//! per element after the last block. On a 2D or 2.5D grid the layer norm is `grid_layer_norm`
//! over the row (`norm_groups::of_summa`) and both linear layers are `summa_linear`; on a 3D grid
//! the first linear layer is an even `cube_linear` and the second an odd one, so the block's
//! output slices are its input slices and blocks chain (`cube_roles`). The attention half of a
//! transformer block is not built on the grids yet (see docs/tensor-grids.md).
//!
//! Every member holds its blocks of every tensor (the layouts of `summa_layout` and
//! `cube_layout`), and its gradients are whole after the grid's own reductions (the layers
//! reduce over rows, columns and depth), so `loom::data_parallel` reduces them over `dp` only.
//! The reference runs the whole matrices on one rank with the grid's blocked sums
//! (`summa_reference`, `grid_norm_reference`), folds each replica's microbatches from zero in
//! microbatch order and the replicas in rank order, and steps SGD: a deterministic run equals it
//! bit for bit, any run within 1e-12 of each tensor's largest value.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/exec/data_parallel.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/exec/tensor_grid.hpp"
#include "loom/mesh.hpp"
#include "moe_model.hpp"
#include "train.hpp"

namespace mesh_example::grid {

inline constexpr double grid_lr = 0.001;  //!< SGD's learning rate (the loss is a sum over every element)

//! One run of the grid model: the grid, the mesh around it, the model's shape.
struct grid_setup {
  loom::tp_kind kind = loom::tp_kind::d2;  //!< the grid's kind (2d, 2.5d or 3d)
  int tp = 4;                              //!< ranks of the grid
  int depth = 0;                           //!< 2.5D's layers (0 for the other kinds)
  int dp = 1, pp = 1;                      //!< data-parallel replicas, pipeline ranks
  int hidden = 36;                         //!< the model's width
  int ffn = 72;                            //!< the MLP's hidden features
  int tokens = 36;                         //!< tokens per microbatch (one grid's batch)
  int blocks = 2;                          //!< MLP blocks (raised to the number of virtual stages)
  int steps = 2;                           //!< training steps
  bool det = false;                        //!< deterministic mode (rank-ordered sums)
};

//! The mesh of the grid mode: data outermost, then pipeline, then the grid.
using grid_mesh = loom::mesh<loom::dp<>, loom::pp<>, loom::tp<loom::dynamic, loom::tp_kind::dynamic>>;

//! The mesh of `s` (throws `config_error` with the rule a bad grid breaks).
inline grid_mesh make_grid_mesh(const grid_setup& s) {
  return grid_mesh{loom::dp<>{s.dp}, loom::pp<>{s.pp}, loom::tp<loom::dynamic, loom::tp_kind::dynamic>{s.tp, s.kind, s.depth}};
}

//! The rule `s` breaks, in one line, or "": the grid's shape, then the layers' splits.
inline std::string grid_rule(const grid_setup& s) {
  for (auto [name, v] : {std::pair<const char*, int>{"--dp", s.dp}, {"--pp", s.pp}, {"--tp", s.tp}, {"--hidden", s.hidden}, {"--ffn", s.ffn},
                         {"--seq", s.tokens}, {"--blocks", s.blocks}, {"--steps", s.steps}})
    if (v < 1) return std::string(name) + " " + std::to_string(v) + " must be at least 1";
  if (s.kind == loom::tp_kind::d1 || s.kind == loom::tp_kind::dynamic) return "the grid model needs --tp-kind 2d, 2.5d or 3d";
  loom::tp_grid g;
  try {
    g = loom::make_tp_grid(s.kind, s.tp, s.depth);
  } catch (const loom::config_error& e) {
    return e.what();
  }
  const auto h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn), n = static_cast<std::size_t>(s.tokens);
  for (auto [in, out] : {std::pair{h, f}, std::pair{f, h}}) {
    const loom::text rule = g.kind == loom::tp_kind::d3 ? loom::cube_rule(in, out, n, g) : loom::summa_rule(in, out, n, g);
    if (!rule.empty())
      return "the grid model's MLP (--hidden " + std::to_string(h) + ", --ffn " + std::to_string(f) + ", --seq " + std::to_string(n) +
             " tokens per microbatch): " + std::string(rule.view());
  }
  return {};
}

//! Sizes of one block's parameters, in the order they are stored: the norm's weight and bias,
//! `W1`, `b1`, `W2`, `b2`.
struct block_sizes {
  std::size_t norm = 0, w1 = 0, b1 = 0, w2 = 0, b2 = 0;  //!< elements of each tensor (the norm's twice)
  //! Every parameter of the block.
  std::size_t total() const { return 2 * norm + w1 + b1 + w2 + b2; }
  //! The offsets of the tensors: norm weight, norm bias, `W1`, `b1`, `W2`, `b2`.
  std::array<std::size_t, 6> offsets() const {
    return {0, norm, 2 * norm, 2 * norm + w1, 2 * norm + w1 + b1, 2 * norm + w1 + b1 + w2};
  }
  //! The whole model's block (one rank holding everything).
  static block_sizes whole(std::size_t h, std::size_t f) { return {h, f * h, f, h * f, h}; }
  //! A member's pieces on grid `g`.
  static block_sizes member(std::size_t h, std::size_t f, const loom::tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    if (g.kind == loom::tp_kind::d3) return {h / (q * q), (f / (q * q)) * (h / q), f / (q * q), (h / (q * q)) * (f / q), h / (q * q)};
    return {h / (q * q), (f / q) * (h / q), f / (q * q), (h / q) * (f / q), h / (q * q)};
  }
};

//! Initial value of element `i` of tensor `k` (0..5 in `block_sizes` order) of block `b`.
inline double initial_value(int b, int k, std::size_t i, std::size_t h, std::size_t f) {
  const double r = hashed(7000 + static_cast<std::uint64_t>(b) * 8 + static_cast<std::uint64_t>(k), i, 0);
  switch (k) {
    case 0: return 1.0 + 0.1 * r;                                 // the norm's weight
    case 2: return r / std::sqrt(static_cast<double>(h));         // W1
    case 4: return r / std::sqrt(static_cast<double>(f));         // W2
    default: return 0.1 * r;                                      // the biases
  }
}

//! Block `b`'s whole parameters (`block_sizes::whole` order).
inline std::vector<double> initial_block(int b, std::size_t h, std::size_t f) {
  const block_sizes w = block_sizes::whole(h, f);
  const auto at = w.offsets();
  const std::array<std::size_t, 6> sizes{w.norm, w.norm, w.w1, w.b1, w.w2, w.b2};
  std::vector<double> p(w.total());
  for (int k = 0; k < 6; ++k)
    for (std::size_t i = 0; i < sizes[static_cast<std::size_t>(k)]; ++i) p[at[static_cast<std::size_t>(k)] + i] = initial_value(b, k, i, h, f);
  return p;
}

//! Microbatch `j` of step `st` of replica `d`: the input (`target = false`) or the target, `[tokens][h]`.
inline std::vector<double> batch(const grid_setup& s, int d, int st, int M, int j, bool target) {
  const std::size_t size = static_cast<std::size_t>(s.tokens) * static_cast<std::size_t>(s.hidden);
  std::vector<double> v(size);
  const auto seed = static_cast<std::uint64_t>((d * s.steps + st) * M + j);
  for (std::size_t i = 0; i < size; ++i) v[i] = (target ? 0.5 : 1.0) * hashed(target ? 9500 : 9000, seed, i);
  return v;
}

//! Where member `t` of grid `g` holds its blocks of the model's whole tensors: the activations
//! between blocks (SUMMA's layout, or a 3D even layer's input), the MLP's hidden activations
//! (SUMMA's, or an odd layer's input), the linear layers' weight and bias pieces, the norm's
//! pieces (its feature block's piece of index `piece`, `grid_layer_norm`).
struct grid_place {
  loom::tp_grid g{};  //!< the grid
  int t = 0;          //!< the member

  bool cube() const { return g.kind == loom::tp_kind::d3; }
  //! `[tokens][features]` activation between blocks (`mid`: the MLP's hidden one).
  template <class T>
  void activation(std::span<T> whole, std::span<T> block, std::size_t tokens, std::size_t features, bool mid, bool to_whole) const {
    if (cube()) loom::cube_layout{g, t, mid}.input(whole, block, tokens, features, to_whole);
    else loom::summa_layout{g, t}.activation(whole, block, tokens, features, to_whole);
  }
  //! Block `whole` (`block_sizes::whole` order) cut into the member's pieces, or put back.
  template <class T>
  void parameters(std::span<T> whole, std::span<T> mine, std::size_t h, std::size_t f, bool to_whole) const {
    const block_sizes W = block_sizes::whole(h, f), m = block_sizes::member(h, f, g);
    const auto wa = W.offsets(), ma = m.offsets();
    const auto q = static_cast<std::size_t>(g.q);
    // The norm: piece `piece` of feature block `fb`.
    const loom::cube_roles r = loom::cube_roles::of(g, t, false);
    const std::size_t fb = static_cast<std::size_t>(cube() ? r.b : g.column(t)), piece = static_cast<std::size_t>(cube() ? r.c : g.row(t));
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t i = 0; i < m.norm; ++i) {
        T& w = whole[wa[k] + fb * (h / q) + piece * m.norm + i];
        T& b = mine[ma[k] + i];
        if (to_whole) w = b;
        else b = w;
      }
    auto cut = [&](std::size_t k, std::size_t in, std::size_t out, bool second) {
      const std::span<T> ww = whole.subspan(wa[k], in * out), mw = mine.subspan(ma[k], k == 2 ? m.w1 : m.w2);
      const std::span<T> wb = whole.subspan(wa[k + 1], out), mb = mine.subspan(ma[k + 1], k == 2 ? m.b1 : m.b2);
      if (cube()) {
        const loom::cube_layout at{g, t, second};
        at.weight(ww, mw, in, out, to_whole);
        at.bias(wb, mb, out, to_whole);
      } else {
        const loom::summa_layout at{g, t};
        at.weight(ww, mw, in, out, to_whole);
        at.bias(wb, mb, out, to_whole);
      }
    };
    cut(2, h, f, false);
    cut(4, f, h, true);
  }
};

//! Elements one member moves per microbatch and block, by grid group and operation (the
//! layers' volumes, `summa_volume`, `cube_volume`, `norm_volume`, summed), in one of the three
//! calls: the forward, the input gradient (with the norm's, `norm_input`, or without it: the
//! first block of the first stage, whose input gradient nobody needs), the weight gradient.
struct block_volume {
  std::map<std::pair<loom::grid_group, loom::comm_op>, std::size_t> elements;  //!< what each group moves, by operation

  //! The three calls of a block.
  enum class call { forward, input, weight };
  //! One block's call `c` on the member's `n` tokens.
  static block_volume of(const loom::tp_grid& g, std::size_t n, std::size_t h, std::size_t f, call c, bool norm_input = true) {
    using loom::comm_op;
    using loom::grid_group;
    block_volume v;
    auto add = [&](grid_group x, comm_op op, std::size_t e) {
      if (e != 0) v.elements[{x, op}] += e;
    };
    const auto q = static_cast<std::size_t>(g.q);
    // The norm's groups: features, pieces, replicas.
    grid_group nf = grid_group::row, np = grid_group::column;
    if (g.kind == loom::tp_kind::d3) {
      const loom::cube_roles r{0, 0, 0, false};
      nf = r.output();
      np = r.input();
    }
    const auto reps = static_cast<std::size_t>(g.depth);
    auto norm = [&](const loom::norm_volume& x) {
      add(nf, comm_op::all_reduce, x.features_reduce);
      add(np, comm_op::all_gather, x.pieces_gather);
      add(np, comm_op::reduce_scatter, x.pieces_scatter);
      add(grid_group::depth, comm_op::all_reduce, reps > 1 ? x.replicas_reduce : 0);
    };
    auto summa = [&](const loom::summa_volume& x) {
      add(grid_group::row, comm_op::broadcast, x.row_broadcast);
      add(grid_group::row, comm_op::reduce, x.row_reduce);
      add(grid_group::column, comm_op::broadcast, x.column_broadcast);
      add(grid_group::column, comm_op::reduce, x.column_reduce);
      add(grid_group::column, comm_op::all_gather, x.column_gather);
      add(grid_group::column, comm_op::reduce_scatter, x.column_scatter);
      add(grid_group::depth, comm_op::all_reduce, g.depth > 1 ? x.depth_reduce : 0);
    };
    auto cube = [&](const loom::cube_volume& x, bool odd) {
      const loom::cube_roles r{0, 0, 0, odd};
      add(r.input(), comm_op::all_gather, x.input_gather);
      add(loom::cube_roles::weight(), comm_op::all_gather, x.weight_gather);
      add(r.output(), comm_op::all_gather, x.output_gather);
      add(r.input(), comm_op::reduce_scatter, x.input_scatter);
      add(loom::cube_roles::weight(), comm_op::reduce_scatter, x.weight_scatter);
      add(r.output(), comm_op::reduce_scatter, x.output_scatter);
    };
    const bool is_cube = g.kind == loom::tp_kind::d3;
    if (c == call::forward) {
      norm(loom::norm_volume::forward(n, h, q, q));
      if (is_cube) {
        cube(loom::cube_volume::forward(n, h, f, g), false);
        cube(loom::cube_volume::forward(n, f, h, g), true);
      } else {
        summa(loom::summa_volume::forward(n, h, f, g));
        summa(loom::summa_volume::forward(n, f, h, g));
      }
      return v;
    }
    if (c == call::input) {
      if (is_cube) {
        cube(loom::cube_volume::backward_input(n, f, h, g), true);
        cube(loom::cube_volume::backward_input(n, h, f, g), false);
      } else {
        summa(loom::summa_volume::backward_input(n, f, h, g));
        summa(loom::summa_volume::backward_input(n, h, f, g));
      }
      if (norm_input) norm(loom::norm_volume::backward_input(n, h, q, q));
      return v;
    }
    if (is_cube) {
      cube(loom::cube_volume::backward_weight(n, f, h, g), true);
      cube(loom::cube_volume::backward_weight(n, h, f, g), false);
    } else {
      summa(loom::summa_volume::backward_weight(n, f, h, g));
      summa(loom::summa_volume::backward_weight(n, h, f, g));
    }
    norm(loom::norm_volume::backward_weight(h, q, q, reps));
    return v;
  }
  //! `this += k x other`.
  void add(const block_volume& other, std::size_t k) {
    for (const auto& [key, e] : other.elements) elements[key] += k * e;
  }
};

//! One virtual stage of the grid model on one grid member: blocks `[first, last)` of the stack
//! (and the loss on the last stage), over the member's grid groups `gc`. A split stage: `B`
//! leaves `dv`, `da` and `dz` of every block in the stash for `W`.
template <class C>
class grid_stage {
 public:
  using value_type = double;

  //! `targets`: the member's target blocks of the step's microbatches (`[M][n][h / q]`, a stable
  //! address the trainer refills every step).
  grid_stage(const grid_setup& s, loom::tp_grid_comms<C>* gc, int member, const double* targets, int index, int stages)
      : gc_(gc), place_{gc->shape, member}, h_(static_cast<std::size_t>(s.hidden)), f_(static_cast<std::size_t>(s.ffn)),
        q_(static_cast<std::size_t>(gc->shape.q)), n_(static_cast<std::size_t>(s.tokens) / (q_ * static_cast<std::size_t>(gc->shape.depth))),
        hq_(h_ / q_), fq_(f_ / q_), first_(index * s.blocks / stages), last_(( index + 1) * s.blocks / stages), index_(index),
        loss_(index == stages - 1), targets_(targets), sizes_(block_sizes::member(h_, f_, gc->shape)),
        norm_{h_}, ng_(place_.cube() ? loom::norm_groups<C>::of_cube(*gc, false) : loom::norm_groups<C>::of_summa(*gc)),
        summa1_{h_, f_}, summa2_{f_, h_}, cube1_{h_, f_, false}, cube2_{f_, h_, true},
        ss1_(n_, h_, f_, q_), ss2_(n_, f_, h_, q_), cs1_(n_, h_, f_, q_), cs2_(n_, f_, h_, q_), ns_(n_, h_, q_),
        params_(static_cast<std::size_t>(last_ - first_) * sizes_.total()), grad_(params_.size()), act_{std::vector<double>(n_ * hq_), std::vector<double>(n_ * hq_)},
        du_(n_ * fq_) {
    for (int b = first_; b < last_; ++b) {
      std::vector<double> whole = initial_block(b, h_, f_);
      place_.parameters(std::span<double>(whole), block_params(b - first_), h_, f_, false);
    }
  }

  int index() const { return index_; }
  //! The blocks this stage holds, `[first, last)`.
  std::pair<int, int> blocks() const { return {first_, last_}; }
  //! Tokens per member and microbatch.
  std::size_t tokens() const { return n_; }
  std::size_t input_size() const { return n_ * hq_; }
  std::size_t output_size() const { return n_ * hq_; }
  std::size_t stash_size() const { return static_cast<std::size_t>(last_ - first_) * per_block() + (loss_ ? n_ * hq_ : 0); }
  std::span<double> params() { return params_; }
  std::span<const double> params() const { return params_; }
  std::span<double> weight_grad() { return grad_; }

  //! Calls so far: forwards, input gradients, weight gradients (each over all the stage's blocks).
  std::array<long long, 3> calls() const { return calls_; }
  //! Whether the stage computes its first block's input gradient (not on the first stage).
  bool first_input() const { return index_ != 0; }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<double> fb) {
    ++calls_[0];
    std::span<const double> x = fb.input;
    const int nb = last_ - first_;
    for (int k = 0; k < nb; ++k) {
      const std::span<double> y = k + 1 < nb ? std::span<double>(act_[static_cast<std::size_t>(k % 2)]) : loss_ ? final(fb.stash) : fb.output;
      block_forward(k, x, y, stash(fb.stash, k));
      x = y;
    }
    if (!loss_) return;
    const double* t = targets_ + static_cast<std::size_t>(ctx.microbatch) * n_ * hq_;
    for (std::size_t e = 0; e < n_ * hq_; ++e) fb.output[e] = 0.5 * (x[e] - t[e]) * (x[e] - t[e]);
  }

  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    ++calls_[1];
    std::span<const double> g = bb.output_grad;
    if (loss_) {  // d(loss)/dy, times the seed
      const double* t = targets_ + static_cast<std::size_t>(ctx.microbatch) * n_ * hq_;
      const std::span<const double> y = final(bb.stash);
      std::vector<double>& dy = act_[0];
      for (std::size_t e = 0; e < n_ * hq_; ++e) dy[e] = bb.output_grad[e] * (y[e] - t[e]);
      g = dy;
    }
    for (int k = last_ - first_; k-- > 0;) {
      const block_stash st = stash(bb.stash, k);
      std::copy(g.begin(), g.end(), st.dv.begin());
      const std::span<const double> w = block_params(k);
      const auto at = sizes_.offsets();
      linear_input(true, cs(st.dv), w.subspan(at[4], sizes_.w2), std::span<double>(du_));
      for (std::size_t e = 0; e < du_.size(); ++e) st.da[e] = du_[e] * (1.0 - st.u[e] * st.u[e]);
      linear_input(false, cs(st.da), w.subspan(at[2], sizes_.w1), st.dz);
      if (k == 0 && !first_input()) break;  // the first stage: nobody needs the input gradient
      const std::span<double> dx = k == 0 ? bb.input_grad : std::span<double>(act_[1]);
      norm_.backward_input(ng_, cs(st.dz), cs(st.xhat), cs(st.rstd), w.subspan(at[0], sizes_.norm), cs(st.dv), dx, ns_.spans());
      g = dx;
    }
  }

  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> wb) {
    ++calls_[2];
    const auto at = sizes_.offsets();
    for (int k = last_ - first_; k-- > 0;) {
      const block_stash st = stash(wb.stash, k);
      const std::span<double> gw = wb.weight_grad.subspan(static_cast<std::size_t>(k) * sizes_.total(), sizes_.total());
      linear_weight(true, cs(st.u), cs(st.dv), gw.subspan(at[4], sizes_.w2), gw.subspan(at[5], sizes_.b2));
      linear_weight(false, cs(st.z), cs(st.da), gw.subspan(at[2], sizes_.w1), gw.subspan(at[3], sizes_.b1));
      norm_.backward_weight(ng_, cs(st.dz), cs(st.xhat), gw.subspan(at[0], sizes_.norm), gw.subspan(at[1], sizes_.norm), ns_.spans());
    }
  }

  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    backward_input(ctx, {bb.input, bb.stash, bb.output_grad, bb.input_grad, {}});
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  //! A block's part of the stash: the norm's `xhat` and `1 / sigma`, its output `z`, `u =
  //! tanh(a)`, and what `B` leaves for `W`: `dv` (the block's output gradient), `da`, `dz`.
  struct block_stash {
    std::span<double> xhat, rstd, z, u, dv, da, dz;
  };
  std::size_t per_block() const { return 4 * n_ * hq_ + 2 * n_ * fq_ + n_; }
  block_stash stash(std::span<double> all, int k) const {
    std::span<double> s = all.subspan(static_cast<std::size_t>(k) * per_block(), per_block());
    auto take = [&](std::size_t size) {
      const std::span<double> r = s.first(size);
      s = s.subspan(size);
      return r;
    };
    block_stash b;
    b.xhat = take(n_ * hq_);
    b.rstd = take(n_);
    b.z = take(n_ * hq_);
    b.u = take(n_ * fq_);
    b.dv = take(n_ * hq_);
    b.da = take(n_ * fq_);
    b.dz = take(n_ * hq_);
    return b;
  }
  //! The last stage's output `y` before the loss, after the blocks' stash.
  std::span<double> final(std::span<double> all) const { return all.subspan(static_cast<std::size_t>(last_ - first_) * per_block(), n_ * hq_); }
  std::span<double> block_params(int k) { return std::span<double>(params_).subspan(static_cast<std::size_t>(k) * sizes_.total(), sizes_.total()); }
  static std::span<const double> cs(std::span<double> s) { return s; }

  void block_forward(int k, std::span<const double> x, std::span<double> y, const block_stash& st) {
    const std::span<const double> w = block_params(k);
    const auto at = sizes_.offsets();
    norm_.forward(ng_, x, w.subspan(at[0], sizes_.norm), w.subspan(at[1], sizes_.norm), st.z, st.xhat, st.rstd, ns_.spans());
    linear_forward(false, cs(st.z), w.subspan(at[2], sizes_.w1), w.subspan(at[3], sizes_.b1), st.u);
    for (double& v : st.u) v = std::tanh(v);
    linear_forward(true, cs(st.u), w.subspan(at[4], sizes_.w2), w.subspan(at[5], sizes_.b2), y);
    for (std::size_t e = 0; e < y.size(); ++e) y[e] = x[e] + y[e];
  }
  void linear_forward(bool second, std::span<const double> x, std::span<const double> w, std::span<const double> b, std::span<double> y) {
    if (place_.cube()) (second ? cube2_ : cube1_).forward(*gc_, x, w, b, y, (second ? cs2_ : cs1_).spans());
    else (second ? summa2_ : summa1_).forward(*gc_, x, w, b, y, (second ? ss2_ : ss1_).spans());
  }
  void linear_input(bool second, std::span<const double> dy, std::span<const double> w, std::span<double> dx) {
    if (place_.cube()) (second ? cube2_ : cube1_).backward_input(*gc_, dy, w, dx, (second ? cs2_ : cs1_).spans());
    else (second ? summa2_ : summa1_).backward_input(*gc_, dy, w, dx, (second ? ss2_ : ss1_).spans());
  }
  void linear_weight(bool second, std::span<const double> x, std::span<const double> dy, std::span<double> gw, std::span<double> gb) {
    if (place_.cube()) (second ? cube2_ : cube1_).backward_weight(*gc_, x, dy, gw, gb, (second ? cs2_ : cs1_).spans());
    else (second ? summa2_ : summa1_).backward_weight(*gc_, x, dy, gw, gb, (second ? ss2_ : ss1_).spans());
  }

  loom::tp_grid_comms<C>* gc_;
  grid_place place_;
  std::size_t h_, f_, q_, n_, hq_, fq_;
  int first_, last_, index_;
  bool loss_;
  const double* targets_;
  block_sizes sizes_;
  loom::grid_layer_norm norm_;
  loom::norm_groups<C> ng_;
  loom::summa_linear<> summa1_, summa2_;
  loom::cube_linear<> cube1_, cube2_;
  loom::summa_host_scratch<double> ss1_, ss2_;
  loom::cube_host_scratch<double> cs1_, cs2_;
  loom::norm_host_scratch<double> ns_;
  std::vector<double> params_, grad_;
  std::vector<double> act_[2];  // the activations between blocks; act_[1] also the input gradient between blocks
  std::vector<double> du_;
  std::array<long long, 3> calls_{};
};

//! The single-rank reference: every block's whole parameters (`block_sizes::whole` order) after
//! `s.steps` steps of `M` microbatches per replica, and each step's loss (the sum over replicas
//! and microbatches of the squared errors).
struct grid_reference_result {
  std::vector<std::vector<double>> blocks;  //!< per block
  std::vector<double> losses;               //!< per step
};

//! Trains the whole model on one rank with the grid's sums (see the file comment).
inline grid_reference_result grid_reference(const grid_setup& s, int M, int blocks) {
  using vec = std::vector<double>;
  const loom::tp_grid g = loom::make_tp_grid(s.kind, s.tp, s.depth);
  const bool cube = g.kind == loom::tp_kind::d3;
  const auto q = static_cast<std::size_t>(g.q), h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn),
             N = static_cast<std::size_t>(s.tokens);
  const block_sizes W = block_sizes::whole(h, f);
  const auto at = W.offsets();
  const loom::grid_norm_reference norm{h, q};
  using ref = loom::summa_reference;
  grid_reference_result out;
  for (int b = 0; b < blocks; ++b) out.blocks.push_back(initial_block(b, h, f));
  auto sub = [](vec& v, std::size_t off, std::size_t size) { return std::span<double>(v).subspan(off, size); };
  auto csub = [](const vec& v, std::size_t off, std::size_t size) { return std::span<const double>(v).subspan(off, size); };
  for (int st = 0; st < s.steps; ++st) {
    std::vector<vec> total(static_cast<std::size_t>(blocks));  // the replicas' gradients, folded in rank order
    double loss = 0;
    for (int d = 0; d < s.dp; ++d) {
      std::vector<vec> acc(static_cast<std::size_t>(blocks), vec(W.total(), 0.0));
      for (int j = 0; j < M; ++j) {
        const vec target = batch(s, d, st, M, j, true);
        vec x = batch(s, d, st, M, j, false);
        struct saved {
          vec xhat, rstd, z, u;
        };
        std::vector<saved> keep(static_cast<std::size_t>(blocks));
        for (std::size_t b = 0; b < static_cast<std::size_t>(blocks); ++b) {
          const vec& p = out.blocks[b];
          saved& k = keep[b];
          k.xhat.assign(N * h, 0);
          k.rstd.assign(N, 0);
          k.z.assign(N * h, 0);
          k.u.assign(N * f, 0);
          norm.forward(std::span<const double>(x), csub(p, at[0], h), csub(p, at[1], h), std::span<double>(k.z), std::span<double>(k.xhat),
                       std::span<double>(k.rstd), N);
          vec v(N * h);
          if (cube) {
            ref::blocked_forward(std::span<const double>(k.z), csub(p, at[2], W.w1), csub(p, at[3], f), std::span<double>(k.u), N, h, f, q);
            for (double& e : k.u) e = std::tanh(e);
            ref::blocked_forward(std::span<const double>(k.u), csub(p, at[4], W.w2), csub(p, at[5], h), std::span<double>(v), N, f, h, q);
          } else {
            loom::linear_kernel::forward(std::span<const double>(k.z), csub(p, at[2], W.w1), csub(p, at[3], f), std::span<double>(k.u), N, h, f);
            for (double& e : k.u) e = std::tanh(e);
            loom::linear_kernel::forward(std::span<const double>(k.u), csub(p, at[4], W.w2), csub(p, at[5], h), std::span<double>(v), N, f, h);
          }
          for (std::size_t e = 0; e < v.size(); ++e) v[e] = x[e] + v[e];
          x = v;
        }
        vec dy(N * h);
        for (std::size_t e = 0; e < dy.size(); ++e) {
          loss += 0.5 * (x[e] - target[e]) * (x[e] - target[e]);
          dy[e] = 1.0 * (x[e] - target[e]);
        }
        for (std::size_t b = static_cast<std::size_t>(blocks); b-- > 0;) {
          const vec& p = out.blocks[b];
          const saved& k = keep[b];
          vec gr(W.total(), 0.0), du(N * f), da(N * f), dz(N * h), dx(N * h);
          ref::backward_input(std::span<const double>(dy), csub(p, at[4], W.w2), std::span<double>(du), N, f, h, g);
          for (std::size_t e = 0; e < da.size(); ++e) da[e] = du[e] * (1.0 - k.u[e] * k.u[e]);
          ref::backward_input(std::span<const double>(da), csub(p, at[2], W.w1), std::span<double>(dz), N, h, f, g);
          if (cube) {
            ref::blocked_weight(std::span<const double>(k.u), std::span<const double>(dy), sub(gr, at[4], W.w2), sub(gr, at[5], h), N, f, h, q, 1);
            ref::blocked_weight(std::span<const double>(k.z), std::span<const double>(da), sub(gr, at[2], W.w1), sub(gr, at[3], f), N, h, f, q, 1);
          } else {
            ref::backward_weight(std::span<const double>(k.u), std::span<const double>(dy), sub(gr, at[4], W.w2), sub(gr, at[5], h), N, f, h, g);
            ref::backward_weight(std::span<const double>(k.z), std::span<const double>(da), sub(gr, at[2], W.w1), sub(gr, at[3], f), N, h, f, g);
          }
          norm.backward_weight(std::span<const double>(dz), std::span<const double>(k.xhat), sub(gr, at[0], h), sub(gr, at[1], h), N, q,
                               static_cast<std::size_t>(g.depth));
          norm.backward_input(std::span<const double>(dz), std::span<const double>(k.xhat), std::span<const double>(k.rstd), csub(p, at[0], h),
                              std::span<const double>(dy), std::span<double>(dx), N);
          for (std::size_t i = 0; i < gr.size(); ++i) acc[b][i] += gr[i];
          dy = dx;
        }
      }
      for (std::size_t b = 0; b < acc.size(); ++b) moe::fold(total[b], acc[b], d == 0);
    }
    const double scale = 1.0 / s.dp;
    for (std::size_t b = 0; b < total.size(); ++b)
      for (std::size_t i = 0; i < total[b].size(); ++i) out.blocks[b][i] -= grid_lr * (total[b][i] * scale);
    out.losses.push_back(loss);
  }
  return out;
}


//! What one rank's run gives: its parameters' differences from the reference's (and how many it
//! compared, and how many moved from their initial values), each step's communication and
//! whether the grid groups' counters equal the formulas (`block_volume` times the stage calls).
struct grid_rank_result {
  long long differing = 0, compared = 0, moved = 0;
  long long volume_mismatches = 0;  //!< (step, group, operation) counts that differ from the formulas
  bool volumes_checked = false;     //!< false: rank-ordered sums over more than two ranks move their data in another form
  std::vector<std::vector<std::pair<std::string, loom::comm_counters>>> steps;  //!< per step: the rank's groups' counts
  std::vector<double> losses;  //!< per step: the loss of the member's blocks of the replica's microbatches (pipeline rank 0; else 0)
};

//! This rank of `world` trains the grid model of `s` with `sched` and compares its parameters
//! with `want` (bitwise in deterministic mode, else within 1e-12 of each block's largest value).
template <class World>
grid_rank_result grid_train_rank(World& world, grid_setup s, const loom::schedule& sched, const grid_reference_result& want) {
  using loom::comm_op;
  using loom::grid_group;
  const int M = sched.microbatches, S = sched.stages;
  s.blocks = std::max(s.blocks, S);
  const grid_mesh m = make_grid_mesh(s);
  loom::mesh_comm mc(m, world);
  using C = typename decltype(mc)::comm_type;
  const loom::tp_grid g = m.grid();
  const int t = mc.coord(loom::dim::tp), d = mc.coord(loom::dim::dp);
  const grid_place place{g, t};
  const auto q = static_cast<std::size_t>(g.q), h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn),
             N = static_cast<std::size_t>(s.tokens), n = N / (q * static_cast<std::size_t>(g.depth)), hq = h / q;
  auto gc = loom::grid_comms(mc, s.det);
  std::vector<double> inputs(static_cast<std::size_t>(M) * n * hq), targets(inputs.size());
  const loom::data_parallel_options o{.deterministic = s.det, .grad_scale = 1.0 / s.dp};
  loom::data_parallel<decltype(mc), grid_stage<C>> sync(mc, o, loom::sgd{.lr = grid_lr});
  loom::pipeline pl(sched, mc.pp(), [&](loom::stage_id id) { return grid_stage<C>(s, &gc, t, targets.data(), id.stage, S); },
                    {.deterministic = s.det, .scaling = loom::loss_scaling::sum, .observer = &sync});
  sync.attach(pl);
  grid_rank_result out;
  // Rank-ordered sums over more than two ranks are sends and all-to-alls on a backend whose
  // reductions do not add in rank order: the formulas count the bandwidth-optimal collectives.
  out.volumes_checked = !s.det || loom::reduces_in_rank_order<World> || (g.q <= 2 && g.depth <= 2);
  const std::array<std::pair<const char*, grid_group>, 3> groups{
      {{"tp row", grid_group::row}, {"tp column", grid_group::column}, {"tp depth", grid_group::depth}}};
  std::vector<std::pair<std::string, const loom::comm_counters*>> comms;
  for (auto [name, x] : groups) comms.push_back({name, &mc.grid(x).counters()});
  comms.push_back({"pp", &mc.pp().counters()});
  comms.push_back({"dp", &mc.dp().counters()});
  const block_volume fwd = block_volume::of(g, n, h, f, block_volume::call::forward),
                     input = block_volume::of(g, n, h, f, block_volume::call::input),
                     input_first = block_volume::of(g, n, h, f, block_volume::call::input, false),
                     weight = block_volume::of(g, n, h, f, block_volume::call::weight);
  for (int st = 0; st < s.steps; ++st) {
    for (int j = 0; j < M; ++j) {
      const std::size_t at = static_cast<std::size_t>(j) * n * hq;
      for (bool target : {false, true}) {
        std::vector<double> whole = batch(s, d, st, M, j, target);
        place.activation(std::span<double>(whole), std::span<double>(target ? targets : inputs).subspan(at, n * hq), N, h, false, false);
      }
    }
    std::vector<loom::comm_counters> before;
    for (auto& c : comms) before.push_back(*c.second);
    std::vector<std::array<long long, 3>> calls;
    for (const auto& stg : pl.stages()) calls.push_back(stg.calls());
    const auto r = pl.step(std::span<const double>(inputs));
    out.losses.push_back(mc.coord(loom::dim::pp) == 0 ? r.loss : 0.0);  // the step's loss is on every pipeline rank
    auto& rep = out.steps.emplace_back();
    for (std::size_t i = 0; i < comms.size(); ++i) rep.push_back({comms[i].first, comms[i].second->since(before[i])});
    // The formulas: every block of every stage, times the calls the stage ran this step.
    block_volume v;
    std::size_t i = 0;
    for (const auto& stg : pl.stages()) {
      const std::array<long long, 3> now = stg.calls(), was = calls[i++];
      const auto [first, last] = stg.blocks();
      const auto nb = static_cast<std::size_t>(last - first);
      const auto k = [&](int c) { return static_cast<std::size_t>(now[static_cast<std::size_t>(c)] - was[static_cast<std::size_t>(c)]); };
      v.add(fwd, k(0) * nb);
      v.add(input, k(1) * (stg.first_input() ? nb : nb - 1));
      if (!stg.first_input()) v.add(input_first, k(1));
      v.add(weight, k(2) * nb);
    }
    if (!out.volumes_checked) continue;
    for (std::size_t x = 0; x < groups.size(); ++x)
      for (comm_op op : loom::all_comm_ops) {
        const auto it = v.elements.find({groups[x].second, op});
        const std::size_t elements = it == v.elements.end() ? 0 : it->second;
        if (rep[x].second[op].bytes != elements * sizeof(double)) ++out.volume_mismatches;
      }
  }
  sync.finish();
  const bool bitwise = s.det;
  const block_sizes mine = block_sizes::member(h, f, g);
  for (const auto& stg : pl.stages()) {
    const auto [first, last] = stg.blocks();
    for (int b = first; b < last; ++b) {
      std::vector<double> ref(mine.total()), initial(mine.total()), whole = want.blocks[static_cast<std::size_t>(b)], start = initial_block(b, h, f);
      place.parameters(std::span<double>(whole), std::span<double>(ref), h, f, false);
      place.parameters(std::span<double>(start), std::span<double>(initial), h, f, false);
      const auto got = stg.params().subspan(static_cast<std::size_t>(b - first) * mine.total(), mine.total());
      out.differing += moe::value_differences(got, std::span<const double>(ref), bitwise);
      out.compared += static_cast<long long>(ref.size());
      out.moved += moe::value_differences(got, std::span<const double>(initial), true);
    }
  }
  return out;
}

//! One rank of `world` trains the grid model under `s` with `sched` and checks it against the
//! reference; rank 0 prints each step's loss beside the reference's, its communication and the
//! volume check when `print`. Returns the values that differ (parameters, step volumes, losses),
//! summed over the world.
template <class World>
long long train_grid(World& world, const grid_setup& s, const loom::schedule& sched, bool print) {
  const grid_reference_result want = grid_reference(s, sched.microbatches, std::max(s.blocks, sched.stages));
  const grid_rank_result got = grid_train_rank(world, s, sched, want);
  const bool root = world.rank() == 0;
  long long losses_differing = 0;
  for (std::size_t st = 0; st < got.steps.size(); ++st) {
    double loss = got.losses[st];
    world.all_reduce(std::span<double>(&loss, 1), loom::reduce_op::sum);
    const double ref = want.losses[st];
    const bool same = std::abs(loss - ref) <= 1e-12 * std::abs(ref);
    losses_differing += same ? 0 : 1;
    if (!root || !print) continue;
    std::printf("step %zu: loss %.15g, the reference's %.15g (%s)\n", st, loss, ref, same ? "equal within 1e-12" : "DIFFERENT");
    print_counters(static_cast<int>(st), got.steps[st]);
  }
  std::vector<std::int64_t> totals{got.differing, got.compared, got.moved, got.volume_mismatches, got.volumes_checked ? 0 : 1};
  world.all_reduce(std::span<std::int64_t>(totals), loom::reduce_op::sum);
  const long long bad = totals[0] + totals[3] + losses_differing + (totals[2] == 0 ? 1 : 0);
  if (root && print) {
    if (totals[4] == 0)
      std::printf("grid volume check: %lld (rank, step, group, operation) counts differ from the formulas (docs/tensor-grids.md)\n",
                  static_cast<long long>(totals[3]));
    else
      std::printf("grid volume check: skipped (deterministic sums over more than two ranks of a backend that does not add in rank order "
                  "move their data as sends and all-to-alls)\n");
    std::printf("reference check (%s): %lld of %lld parameter values differ (%lld moved from their initial values), %lld step losses "
                "differ -> %s\n",
                s.det ? "bitwise" : "1e-12 relative", static_cast<long long>(totals[0]), static_cast<long long>(totals[1]),
                static_cast<long long>(totals[2]), losses_differing, bad == 0 ? "MATCH" : "DIFFERENT");
  }
  return bad;
}

}  // namespace mesh_example::grid
