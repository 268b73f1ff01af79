// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The example's `--tp-kind 2d|2.5d|3d` mode (issue 25): transformer blocks whose activations
//! *and* weights are split over a tensor-parallel grid (`loom/exec/tensor_grid.hpp`), pipelined
//! over `pp` by any synchronous loom schedule and replicated over `dp`, checked against a
//! single-rank reference. A block is the transformer's pre-LN block without the embedding and the
//! vocabulary head (the stack ends in a squared error `0.5 (y - target)^2` per element):
//!
//!     z1 = LN1(x),  Q, K, V = z1 Wq^T + bq, ...,  o = attention(Q, K, V),  x1 = x + o Wo^T + bo
//!     z2 = LN2(x1), u = tanh(z2 W1^T + b1),  y = x1 + u W2^T + b2
//!
//! **Layout** (Optimus, Xu et al. 2021, §3.2: the batch over the grid's rows, the hidden features
//! and so the heads over its columns). A microbatch holds several sequences; a member's token
//! block is whole sequences and its feature block whole heads, so the attention (causal by default) runs on
//! the member's own data with no communication (`attention_forward`, `loom::attention_block`).
//! On a 2D or 2.5D grid the norms are `grid_layer_norm` over the row (`norm_groups::of_summa`) and
//! the six linear layers `summa_linear`; on a 3D grid Q, K, V and W1 are even `cube_linear`
//! layers and Wo and W2 odd ones, so each half returns its input's slices (`cube_roles`) and the
//! residuals and blocks chain.
//!
//! Every member holds its blocks of every tensor (the layouts of `summa_layout` and
//! `cube_layout`), and its gradients are whole after the grid's own reductions (the layers
//! reduce over rows, columns and depth), so `loom::data_parallel` reduces them over `dp` only.
//! The reference runs the whole matrices on one rank with the grid's blocked sums
//! (`summa_reference`, `grid_norm_reference`) and the same attention items, folds each replica's
//! microbatches from zero in microbatch order and the replicas in rank order, and steps SGD: a
//! deterministic run equals it bit for bit, any run within 1e-12 of each tensor's largest value.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/exec/data_parallel.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/exec/tensor_grid.hpp"
#include "loom/mesh.hpp"
#include "model_check.hpp"
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
  int heads = 6;                           //!< attention heads (whole heads per member: a multiple of q)
  int ffn = 72;                            //!< the MLP's hidden features
  int seq = 6;                             //!< tokens per sequence
  int sequences = 12;                      //!< sequences per microbatch (one grid's batch)
  int blocks = 2;                          //!< MLP blocks (raised to the number of virtual stages)
  int steps = 2;                           //!< training steps
  bool det = false;                        //!< deterministic mode (rank-ordered sums)
  bool causal = true;                      //!< causal attention (false: every token sees its whole sequence)
  //! Tokens per microbatch.
  int tokens() const { return seq * sequences; }
};

//! The mesh of the grid mode: data outermost, then pipeline, then the grid.
using grid_mesh = loom::mesh<loom::dp<>, loom::pp<>, loom::tp<loom::dynamic, loom::tp_kind::dynamic>>;

//! The mesh of `s` (throws `config_error` with the rule a bad grid breaks).
inline grid_mesh make_grid_mesh(const grid_setup& s) {
  return grid_mesh{loom::dp<>{s.dp}, loom::pp<>{s.pp}, loom::tp<loom::dynamic, loom::tp_kind::dynamic>{s.tp, s.kind, s.depth}};
}

//! The rule `s` breaks, in one line, or "": the grid's shape, then the layers' splits.
inline std::string grid_rule(const grid_setup& s) {
  for (auto [name, v] : {std::pair<const char*, int>{"--dp", s.dp}, {"--pp", s.pp}, {"--tp", s.tp}, {"--hidden", s.hidden}, {"--heads", s.heads},
                         {"--ffn", s.ffn}, {"--seq", s.seq}, {"--sequences", s.sequences}, {"--blocks", s.blocks}, {"--steps", s.steps}})
    if (v < 1) return std::string(name) + " " + std::to_string(v) + " must be at least 1";
  if (s.kind == loom::tp_kind::d1 || s.kind == loom::tp_kind::dynamic) return "the grid model needs --tp-kind 2d, 2.5d or 3d";
  loom::tp_grid g;
  try {
    g = loom::make_tp_grid(s.kind, s.tp, s.depth);
  } catch (const loom::config_error& e) {
    return e.what();
  }
  const auto h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn), n = static_cast<std::size_t>(s.tokens());
  for (auto [in, out] : {std::pair{h, f}, std::pair{f, h}}) {
    const loom::text rule = g.kind == loom::tp_kind::d3 ? loom::cube_rule(in, out, n, g) : loom::summa_rule(in, out, n, g);
    if (!rule.empty())
      return "the grid model (--hidden " + std::to_string(h) + ", --ffn " + std::to_string(f) + ", " + std::to_string(n) +
             " tokens per microbatch): " + std::string(rule.view());
  }
  if (s.hidden % s.heads != 0) return "--hidden " + std::to_string(s.hidden) + " is not divisible by --heads " + std::to_string(s.heads);
  if (s.heads % g.q != 0)
    return "--heads " + std::to_string(s.heads) + " is not divisible by the grid's side q = " + std::to_string(g.q) +
           ": each member's feature block holds whole heads";
  const int member = s.tokens() / (g.q * g.depth);
  if (member % s.seq != 0)
    return "each grid member's " + std::to_string(member) + " tokens (" + std::to_string(s.tokens()) + " per microbatch over q x " +
           (g.kind == loom::tp_kind::d3 ? "q" : "depth") + " = " + std::to_string(g.q * g.depth) + ") must be whole sequences of --seq " +
           std::to_string(s.seq) + ": the attention runs on the member's own sequences";
  return {};
}

//! One part of a block (`loom::grid_block_part`) and the parts in order (`loom::grid_block`:
//! the attention half's norm, Q, K, V and the output projection; the MLP half's norm, the up and
//! the down projection).
using part = loom::grid_block_part;
using enum loom::grid_block::index;
inline constexpr std::size_t part_count = loom::grid_block::count;

//! The parts of a block of width `h` and MLP features `f`.
inline std::array<part, part_count> block_parts(std::size_t h, std::size_t f) { return loom::grid_block::parts(h, f); }

//! Where a block's tensors sit in its parameter vector, whole (one rank) or a member's pieces:
//! tensor `2 p` and `2 p + 1` of part `p`, in order.
struct block_layout : tensor_table<2 * part_count> {

  //! The whole block (`g` null) or a member's pieces on grid `g`.
  static block_layout of(std::size_t h, std::size_t f, const loom::tp_grid* g = nullptr) {
    block_layout b;
    const auto parts = block_parts(h, f);
    const std::size_t q = g == nullptr ? 1 : static_cast<std::size_t>(g->q);
    const bool cube = g != nullptr && g->kind == loom::tp_kind::d3;
    for (std::size_t p = 0; p < part_count; ++p) {
      const part& x = parts[p];
      if (x.norm) b.size[2 * p] = b.size[2 * p + 1] = x.in / (q * q);
      else {
        b.size[2 * p] = cube ? (x.out / (q * q)) * (x.in / q) : (x.out / q) * (x.in / q);
        b.size[2 * p + 1] = x.out / (q * q);
      }
    }
    b.place();
    return b;
  }
};

//! Block `b`'s whole parameters (`block_layout::of(h, f)`): norms' weights `1 + 0.1 r`, their
//! biases and the layers' `0.1 r`, weights `r / sqrt(in)` for reproducible `r` in [-1, 1).
inline std::vector<double> initial_block(int b, std::size_t h, std::size_t f) {
  const block_layout w = block_layout::of(h, f);
  const auto parts = block_parts(h, f);
  std::vector<double> p(w.total);
  for (std::size_t i = 0; i < w.size.size(); ++i) {
    const part& x = parts[i / 2];
    for (std::size_t e = 0; e < w.size[i]; ++e) {
      const double r = hashed(7000 + static_cast<std::uint64_t>(b) * 32 + i, e, 0);
      p[w.offset[i] + e] = i % 2 == 1 ? 0.1 * r : x.norm ? 1.0 + 0.1 * r : r / std::sqrt(static_cast<double>(x.in));
    }
  }
  return p;
}

//! Microbatch `j` of step `st` of replica `d`: the input (`target = false`) or the target, `[tokens][h]`.
inline std::vector<double> batch(const grid_setup& s, int d, int st, int M, int j, bool target) {
  const std::size_t size = static_cast<std::size_t>(s.tokens()) * static_cast<std::size_t>(s.hidden);
  std::vector<double> v(size);
  const auto seed = static_cast<std::uint64_t>((d * s.steps + st) * M + j);
  for (std::size_t i = 0; i < size; ++i) v[i] = (target ? 0.5 : 1.0) * hashed(target ? 9500 : 9000, seed, i);
  return v;
}

//! Attention (causal, or full when `causal` is false) over every sequence of `seq` consecutive rows of `q`, `k`, `v`
//! (`[rows][heads][head_dim]`) into `o` and `lse` (`[rows][heads]`), by `loom::attention_block`:
//! the same additions for a row and head whichever other rows and heads the arrays hold, so a
//! member's heads and sequences give the bits of the single-rank model's.
inline void attention_forward(const double* q, const double* k, const double* v, double* o, double* lse, int rows, int seq, int heads,
                              int head_dim, bool causal) {
  std::fill(o, o + static_cast<std::ptrdiff_t>(rows) * heads * head_dim, 0.0);
  std::fill(lse, lse + static_cast<std::ptrdiff_t>(rows) * heads, -std::numeric_limits<double>::infinity());
  std::vector<double> ob(static_cast<std::size_t>(head_dim));
  for (int s = 0; s < rows / seq; ++s) {
    const loom::attention_block<double> a{.q = q, .k = k, .v = v, .o = o, .lse = lse, .heads = heads, .head_dim = head_dim,
                                          .scale = 1.0 / std::sqrt(static_cast<double>(head_dim)), .q0 = s * seq, .nq = seq,
                                          .k0 = s * seq, .nk = seq, .mask = causal ? loom::block_mask::causal : loom::block_mask::full};
    for (std::size_t e = 0; e < a.query_items(); ++e) a.forward(e, ob.data());
  }
}

//! The gradients `dq`, `dk`, `dv` of `attention_forward` from the output gradient `dout`
//! (`delta`: scratch of `[rows][heads]`).
inline void attention_backward(const double* q, const double* k, const double* v, const double* o, const double* lse, const double* dout,
                               double* dq, double* dk, double* dv, double* delta, int rows, int seq, int heads, int head_dim, bool causal) {
  const auto items = static_cast<std::size_t>(rows) * static_cast<std::size_t>(heads);
  const loom::attention_delta_rows<double> dr{o, dout, delta, head_dim};
  for (std::size_t r = 0; r < items; ++r) dr(r);
  const auto size = static_cast<std::ptrdiff_t>(items) * head_dim;
  std::fill(dq, dq + size, 0.0);
  std::fill(dk, dk + size, 0.0);
  std::fill(dv, dv + size, 0.0);
  for (int s = 0; s < rows / seq; ++s) {
    const loom::attention_block<double> a{.q = q, .k = k, .v = v, .o = const_cast<double*>(o), .lse = const_cast<double*>(lse), .dout = dout,
                                          .delta = delta, .dq = dq, .dk = dk, .dv = dv, .heads = heads, .head_dim = head_dim,
                                          .scale = 1.0 / std::sqrt(static_cast<double>(head_dim)), .q0 = s * seq, .nq = seq,
                                          .k0 = s * seq, .nk = seq, .mask = causal ? loom::block_mask::causal : loom::block_mask::full};
    for (std::size_t e = 0; e < a.query_items(); ++e) a.backward_query(e);
    for (std::size_t e = 0; e < a.key_items(); ++e) a.backward_key(e);
  }
}

//! Where member `t` of grid `g` holds its blocks of the model's whole tensors: the activations
//! between the halves of a block (SUMMA's layout, or a 3D even layer's input), those inside a
//! half (SUMMA's, or an odd layer's input: Q, K, V, the attention's output, the MLP's hidden
//! features), the linear layers' weight and bias pieces, the norms' pieces (piece `piece` of the
//! member's feature block, `grid_layer_norm`).
struct grid_place {
  loom::tp_grid g{};  //!< the grid
  int t = 0;          //!< the member

  //! Whether the grid is 3D.
  bool cube() const { return g.kind == loom::tp_kind::d3; }
  //! `[tokens][features]` activation between halves (`inner`: inside a half).
  template <class T>
  void activation(std::span<T> whole, std::span<T> block, std::size_t tokens, std::size_t features, bool inner, bool to_whole) const {
    if (cube()) loom::cube_layout{g, t, inner}.input(whole, block, tokens, features, to_whole);
    else loom::summa_layout{g, t}.activation(whole, block, tokens, features, to_whole);
  }
  //! Block `whole` (`block_layout::of(h, f)`) cut into the member's pieces, or put back.
  template <class T>
  void parameters(std::span<T> whole, std::span<T> mine, std::size_t h, std::size_t f, bool to_whole) const {
    const block_layout W = block_layout::of(h, f), m = block_layout::of(h, f, &g);
    const auto parts = block_parts(h, f);
    const auto q = static_cast<std::size_t>(g.q);
    const loom::cube_roles r = loom::cube_roles::of(g, t, false);
    const std::size_t fb = static_cast<std::size_t>(cube() ? r.b : g.column(t)), piece = static_cast<std::size_t>(cube() ? r.c : g.row(t));
    for (std::size_t p = 0; p < part_count; ++p) {
      const part& x = parts[p];
      const std::span<T> ww = W.tensor(whole, 2 * p), wb = W.tensor(whole, 2 * p + 1), mw = m.tensor(mine, 2 * p), mb = m.tensor(mine, 2 * p + 1);
      if (x.norm) {
        for (std::size_t i = 0; i < m.size[2 * p]; ++i)
          for (auto [w, b] : {std::pair<T*, T*>{&ww[fb * (x.in / q) + piece * mw.size() + i], &mw[i]},
                              std::pair<T*, T*>{&wb[fb * (x.in / q) + piece * mb.size() + i], &mb[i]}}) {
            if (to_whole) *w = *b;
            else *b = *w;
          }
      } else if (cube()) {
        const loom::cube_layout at{g, t, x.odd};
        at.weight(ww, mw, x.in, x.out, to_whole);
        at.bias(wb, mb, x.out, to_whole);
      } else {
        const loom::summa_layout at{g, t};
        at.weight(ww, mw, x.in, x.out, to_whole);
        at.bias(wb, mb, x.out, to_whole);
      }
    }
  }
};

//! Elements one member moves per microbatch and block, by grid group and operation, in one of
//! its three calls (`loom::grid_block_volume`, which `loom::plan` prices too).
using block_volume = loom::grid_block_volume;

//! One virtual stage of the grid model on one grid member: blocks `[first, last)` of the stack
//! (and the loss on the last stage), over the member's grid groups `gc`. A split stage: `B`
//! leaves the gradients of every linear layer's output and of every norm's output in the stash
//! for `W`.
template <class C>
class grid_stage {
 public:
  using value_type = double;

  //! `targets`: the member's target blocks of the step's microbatches (`[M][n][h / q]`, a stable
  //! address the trainer refills every step).
  grid_stage(const grid_setup& s, loom::tp_grid_comms<C>* gc, int member, const double* targets, int index, int stages)
      : gc_(gc), place_{gc->shape, member}, h_(static_cast<std::size_t>(s.hidden)), f_(static_cast<std::size_t>(s.ffn)),
        q_(static_cast<std::size_t>(gc->shape.q)),
        n_(static_cast<std::size_t>(s.tokens()) / (q_ * static_cast<std::size_t>(gc->shape.depth))), hq_(h_ / q_), fq_(f_ / q_),
        seq_(s.seq), causal_(s.causal), heads_(s.heads / gc->shape.q), head_dim_(s.hidden / s.heads), first_(index * s.blocks / stages),
        last_((index + 1) * s.blocks / stages), index_(index), loss_(index == stages - 1), targets_(targets),
        layout_(block_layout::of(h_, f_, &gc->shape)), parts_(block_parts(h_, f_)), norm_{h_},
        ng_(place_.cube() ? loom::norm_groups<C>::of_cube(*gc, false) : loom::norm_groups<C>::of_summa(*gc)),
        ns_(n_, h_, q_), params_(static_cast<std::size_t>(last_ - first_) * layout_.total), grad_(params_.size()),
        act_{std::vector<double>(n_ * hq_), std::vector<double>(n_ * hq_)}, tmp_(n_ * std::max(hq_, fq_)), delta_(n_ * static_cast<std::size_t>(heads_)) {
    for (std::size_t p = 0; p < part_count; ++p) {
      const part& x = parts_[p];
      if (x.norm) continue;
      summa_.push_back(loom::summa_linear<>{x.in, x.out});
      cube_.push_back(loom::cube_linear<>{x.in, x.out, x.odd});
      summa_scratch_.emplace_back(n_, x.in, x.out, q_);
      cube_scratch_.emplace_back(n_, x.in, x.out, q_);
    }
    for (int b = first_; b < last_; ++b) {
      std::vector<double> whole = initial_block(b, h_, f_);
      place_.parameters(std::span<double>(whole), block_params(b - first_), h_, f_, false);
    }
  }

  //! The virtual stage's index.
  int index() const { return index_; }
  //! The blocks this stage holds, `[first, last)`.
  std::pair<int, int> blocks() const { return {first_, last_}; }
  //! Calls so far: forwards, input gradients, weight gradients (each over all the stage's blocks).
  std::array<long long, 3> calls() const { return calls_; }
  //! Whether the stage computes its first block's input gradient (not on the first stage).
  bool first_input() const { return index_ != 0; }
  //! Elements of the stage's input per microbatch (the rank's shard).
  std::size_t input_size() const { return n_ * hq_; }
  //! Elements of its output (on the last stage: the loss terms of the rank's shard).
  std::size_t output_size() const { return n_ * hq_; }
  //! Elements of its stash per microbatch (every block's saved tensors; the output before the loss).
  std::size_t stash_size() const { return static_cast<std::size_t>(last_ - first_) * per_block() + (loss_ ? n_ * hq_ : 0); }
  //! The rank's parameters of the stage's blocks, in block order.
  std::span<double> params() { return params_; }
  //! The same, read-only.
  std::span<const double> params() const { return params_; }
  //! Their gradient accumulator, laid out as `params()`.
  std::span<double> weight_grad() { return grad_; }

  //! The forward of the stage's blocks (and the loss terms on the last stage).
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

  //! The input gradient (`B`), leaving in the stash what `W` needs.
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
      const std::span<const double> w = block_params(k);
      const std::span<double> fu = std::span<double>(tmp_).first(n_ * fq_), hu = std::span<double>(tmp_).first(n_ * hq_);
      // The MLP half: dv = g, du, da = du tanh', dz2, then the norm's with the residual.
      std::copy(g.begin(), g.end(), st.gy.begin());
      linear_input(w2, cs(st.gy), tensor(w, w2), fu);
      for (std::size_t e = 0; e < fu.size(); ++e) st.da[e] = fu[e] * (1.0 - st.u[e] * st.u[e]);
      linear_input(w1, cs(st.da), tensor(w, w1), st.dz2);
      norm_.backward_input(ng_, cs(st.dz2), cs(st.xhat2), cs(st.rstd2), tensor(w, ln2), cs(st.gy), st.gx1, ns_.spans());
      // The attention half: the output projection's, the attention's, Q's, K's and V's (summed in
      // that order), then the norm's with the residual.
      linear_input(wo, cs(st.gx1), tensor(w, wo), hu);
      attention_backward(st.q.data(), st.k.data(), st.v.data(), st.o.data(), st.lse.data(), hu.data(), st.dq.data(), st.dk.data(),
                         st.dv.data(), delta_.data(), static_cast<int>(n_), seq_, heads_, head_dim_, causal_);
      linear_input(wq, cs(st.dq), tensor(w, wq), st.dz1);
      for (std::size_t p : {wk, wv}) {
        linear_input(p, cs(p == wk ? st.dk : st.dv), tensor(w, p), hu);
        for (std::size_t e = 0; e < hu.size(); ++e) st.dz1[e] += hu[e];
      }
      if (k == 0 && !first_input()) break;  // the first stage: nobody needs the input gradient
      const std::span<double> dx = k == 0 ? bb.input_grad : std::span<double>(act_[1]);
      norm_.backward_input(ng_, cs(st.dz1), cs(st.xhat1), cs(st.rstd1), tensor(w, ln1), cs(st.gx1), dx, ns_.spans());
      g = dx;
    }
  }

  //! The weight gradients (`W`), added to `weight_grad`.
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> wb) {
    ++calls_[2];
    for (int k = last_ - first_; k-- > 0;) {
      const block_stash st = stash(wb.stash, k);
      const std::span<double> gw = wb.weight_grad.subspan(static_cast<std::size_t>(k) * layout_.total, layout_.total);
      linear_weight(w2, cs(st.u), cs(st.gy), gw);
      linear_weight(w1, cs(st.z2), cs(st.da), gw);
      norm_.backward_weight(ng_, cs(st.dz2), cs(st.xhat2), layout_.tensor(gw, 2 * ln2), layout_.tensor(gw, 2 * ln2 + 1), ns_.spans());
      linear_weight(wo, cs(st.o), cs(st.gx1), gw);
      linear_weight(wq, cs(st.z1), cs(st.dq), gw);
      linear_weight(wk, cs(st.z1), cs(st.dk), gw);
      linear_weight(wv, cs(st.z1), cs(st.dv), gw);
      norm_.backward_weight(ng_, cs(st.dz1), cs(st.xhat1), layout_.tensor(gw, 2 * ln1), layout_.tensor(gw, 2 * ln1 + 1), ns_.spans());
    }
  }

  //! `B` then `W` (the fused backward).
  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    backward_input(ctx, {bb.input, bb.stash, bb.output_grad, bb.input_grad, {}});
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  //! A block's part of the stash: the forward's (the norms' `xhat` and `1 / sigma`, their
  //! outputs `z1`, `z2`, Q, K, V, the attention's output `o` and log-sum-exp, `u = tanh(a)`),
  //! and what `B` leaves for `W` (the gradients of the block's output `gy`, of the MLP's hidden
  //! `da`, of the norms' outputs `dz1`, `dz2`, of the attention half's output `gx1`, of Q, K, V).
  struct block_stash {
    std::span<double> xhat1, rstd1, z1, q, k, v, o, lse, xhat2, rstd2, z2, u, gy, da, dz2, gx1, dq, dk, dv, dz1;
  };
  std::size_t per_block() const { return 15 * n_ * hq_ + 2 * n_ * fq_ + 2 * n_ + n_ * static_cast<std::size_t>(heads_); }
  block_stash stash(std::span<double> all, int k) const {
    std::span<double> s = all.subspan(static_cast<std::size_t>(k) * per_block(), per_block());
    auto take = [&](std::size_t size) {
      const std::span<double> r = s.first(size);
      s = s.subspan(size);
      return r;
    };
    const std::size_t a = n_ * hq_;
    block_stash b;
    for (std::span<double>* x : {&b.xhat1, &b.z1, &b.q, &b.k, &b.v, &b.o, &b.xhat2, &b.z2, &b.gy, &b.dz2, &b.gx1, &b.dq, &b.dk, &b.dv, &b.dz1})
      *x = take(a);
    b.rstd1 = take(n_);
    b.rstd2 = take(n_);
    b.lse = take(n_ * static_cast<std::size_t>(heads_));
    b.u = take(n_ * fq_);
    b.da = take(n_ * fq_);
    return b;
  }
  //! The last stage's output `y` before the loss, after the blocks' stash.
  std::span<double> final(std::span<double> all) const { return all.subspan(static_cast<std::size_t>(last_ - first_) * per_block(), n_ * hq_); }
  std::span<double> block_params(int k) { return std::span<double>(params_).subspan(static_cast<std::size_t>(k) * layout_.total, layout_.total); }
  //! Tensor 0 of part `p` (a norm's weight, a layer's weight) of block parameters `w`.
  std::span<const double> tensor(std::span<const double> w, std::size_t p) const { return layout_.tensor(w, 2 * p); }
  static std::span<const double> cs(std::span<double> s) { return s; }
  //! Index of linear part `p` among the linear parts.
  static std::size_t linear_index(std::size_t p) { return p < ln2 ? p - 1 : p - 2; }

  void block_forward(int k, std::span<const double> x, std::span<double> y, const block_stash& st) {
    const std::span<const double> w = block_params(k);
    auto bias = [&](std::size_t p) { return layout_.tensor(w, 2 * p + 1); };
    norm_.forward(ng_, x, tensor(w, ln1), bias(ln1), st.z1, st.xhat1, st.rstd1, ns_.spans());
    for (std::size_t p : {wq, wk, wv}) linear_forward(p, cs(st.z1), tensor(w, p), bias(p), p == wq ? st.q : p == wk ? st.k : st.v);
    attention_forward(st.q.data(), st.k.data(), st.v.data(), st.o.data(), st.lse.data(), static_cast<int>(n_), seq_, heads_, head_dim_, causal_);
    const std::span<double> x1 = std::span<double>(tmp_).first(n_ * hq_);
    linear_forward(wo, cs(st.o), tensor(w, wo), bias(wo), x1);
    for (std::size_t e = 0; e < x1.size(); ++e) x1[e] = x[e] + x1[e];
    norm_.forward(ng_, cs(x1), tensor(w, ln2), bias(ln2), st.z2, st.xhat2, st.rstd2, ns_.spans());
    linear_forward(w1, cs(st.z2), tensor(w, w1), bias(w1), st.u);
    for (double& v : st.u) v = std::tanh(v);
    linear_forward(w2, cs(st.u), tensor(w, w2), bias(w2), y);
    for (std::size_t e = 0; e < y.size(); ++e) y[e] = x1[e] + y[e];
  }
  void linear_forward(std::size_t p, std::span<const double> x, std::span<const double> w, std::span<const double> b, std::span<double> y) {
    const std::size_t i = linear_index(p);
    if (place_.cube()) cube_[i].forward(*gc_, x, w, b, y, cube_scratch_[i].spans());
    else summa_[i].forward(*gc_, x, w, b, y, summa_scratch_[i].spans());
  }
  void linear_input(std::size_t p, std::span<const double> dy, std::span<const double> w, std::span<double> dx) {
    const std::size_t i = linear_index(p);
    if (place_.cube()) cube_[i].backward_input(*gc_, dy, w, dx, cube_scratch_[i].spans());
    else summa_[i].backward_input(*gc_, dy, w, dx, summa_scratch_[i].spans());
  }
  //! Adds part `p`'s weight and bias gradients to the block's `gw`.
  void linear_weight(std::size_t p, std::span<const double> x, std::span<const double> dy, std::span<double> gw) {
    const std::size_t i = linear_index(p);
    const std::span<double> g = layout_.tensor(gw, 2 * p), b = layout_.tensor(gw, 2 * p + 1);
    if (place_.cube()) cube_[i].backward_weight(*gc_, x, dy, g, b, cube_scratch_[i].spans());
    else summa_[i].backward_weight(*gc_, x, dy, g, b, summa_scratch_[i].spans());
  }

  loom::tp_grid_comms<C>* gc_;
  grid_place place_;
  std::size_t h_, f_, q_, n_, hq_, fq_;
  int seq_;
  bool causal_;
  int heads_, head_dim_;
  int first_, last_, index_;
  bool loss_;
  const double* targets_;
  block_layout layout_;
  std::array<part, part_count> parts_;
  loom::grid_layer_norm<> norm_;
  loom::norm_groups<C> ng_;
  std::vector<loom::summa_linear<>> summa_;
  std::vector<loom::cube_linear<>> cube_;
  std::vector<loom::summa_host_scratch<double>> summa_scratch_;
  std::vector<loom::cube_host_scratch<double>> cube_scratch_;
  loom::norm_host_scratch<double> ns_;
  std::vector<double> params_, grad_;
  std::vector<double> act_[2];  // the activations between blocks; act_[1] also the input gradient between blocks
  std::vector<double> tmp_, delta_;
  std::array<long long, 3> calls_{};
};

//! The single-rank reference: every block's whole parameters (`block_layout::of(h, f)`) after
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
             N = static_cast<std::size_t>(s.tokens());
  const int heads = s.heads, hd = s.hidden / s.heads, rows = s.tokens();
  const block_layout W = block_layout::of(h, f);
  const auto parts = block_parts(h, f);
  const loom::grid_norm_reference norm{h, q};
  using ref = loom::summa_reference;
  grid_reference_result out;
  for (int b = 0; b < blocks; ++b) out.blocks.push_back(initial_block(b, h, f));
  auto T = [&](const vec& p, std::size_t i) { return W.tensor(std::span<const double>(p), i); };
  auto G = [&](vec& p, std::size_t i) { return W.tensor(std::span<double>(p), i); };
  auto cv = [](const vec& v) { return std::span<const double>(v); };
  auto mv = [](vec& v) { return std::span<double>(v); };
  // The grid's sums of each linear part: the forward, the input gradient, the weight gradients.
  auto forward = [&](std::size_t p, const vec& w, const vec& x, vec& y) {
    const part& a = parts[p];
    y.assign(N * a.out, 0.0);
    if (cube) ref::blocked_forward(cv(x), T(w, 2 * p), T(w, 2 * p + 1), mv(y), N, a.in, a.out, q);
    else loom::linear_kernel::forward(cv(x), T(w, 2 * p), T(w, 2 * p + 1), mv(y), N, a.in, a.out);
  };
  auto input = [&](std::size_t p, const vec& w, const vec& dy, vec& dx) {
    dx.assign(N * parts[p].in, 0.0);
    ref::backward_input(cv(dy), T(w, 2 * p), mv(dx), N, parts[p].in, parts[p].out, g);
  };
  auto weight = [&](std::size_t p, const vec& x, const vec& dy, vec& gr) {
    const part& a = parts[p];
    if (cube) ref::blocked_weight(cv(x), cv(dy), G(gr, 2 * p), G(gr, 2 * p + 1), N, a.in, a.out, q, 1);
    else ref::backward_weight(cv(x), cv(dy), G(gr, 2 * p), G(gr, 2 * p + 1), N, a.in, a.out, g);
  };
  for (int st = 0; st < s.steps; ++st) {
    std::vector<vec> total(static_cast<std::size_t>(blocks));  // the replicas' gradients, folded in rank order
    double loss = 0;
    for (int d = 0; d < s.dp; ++d) {
      std::vector<vec> acc(static_cast<std::size_t>(blocks), vec(W.total, 0.0));
      for (int j = 0; j < M; ++j) {
        const vec target = batch(s, d, st, M, j, true);
        vec x = batch(s, d, st, M, j, false);
        struct saved {
          vec xhat1, rstd1, z1, q, k, v, o, lse, x1, xhat2, rstd2, z2, u;
        };
        std::vector<saved> keep(static_cast<std::size_t>(blocks));
        for (std::size_t b = 0; b < keep.size(); ++b) {
          const vec& w = out.blocks[b];
          saved& k = keep[b];
          k.xhat1.assign(N * h, 0);
          k.rstd1.assign(N, 0);
          k.z1.assign(N * h, 0);
          norm.forward(cv(x), T(w, 2 * ln1), T(w, 2 * ln1 + 1), mv(k.z1), mv(k.xhat1), mv(k.rstd1), N);
          forward(wq, w, k.z1, k.q);
          forward(wk, w, k.z1, k.k);
          forward(wv, w, k.z1, k.v);
          k.o.assign(N * h, 0);
          k.lse.assign(N * static_cast<std::size_t>(heads), 0);
          attention_forward(k.q.data(), k.k.data(), k.v.data(), k.o.data(), k.lse.data(), rows, s.seq, heads, hd, s.causal);
          forward(wo, w, k.o, k.x1);
          for (std::size_t e = 0; e < k.x1.size(); ++e) k.x1[e] = x[e] + k.x1[e];
          k.xhat2.assign(N * h, 0);
          k.rstd2.assign(N, 0);
          k.z2.assign(N * h, 0);
          norm.forward(cv(k.x1), T(w, 2 * ln2), T(w, 2 * ln2 + 1), mv(k.z2), mv(k.xhat2), mv(k.rstd2), N);
          forward(w1, w, k.z2, k.u);
          for (double& e : k.u) e = std::tanh(e);
          vec v;
          forward(w2, w, k.u, v);
          for (std::size_t e = 0; e < v.size(); ++e) v[e] = k.x1[e] + v[e];
          x = v;
        }
        vec dy(N * h);
        for (std::size_t e = 0; e < dy.size(); ++e) {
          loss += 0.5 * (x[e] - target[e]) * (x[e] - target[e]);
          dy[e] = 1.0 * (x[e] - target[e]);
        }
        for (std::size_t b = keep.size(); b-- > 0;) {
          const vec& w = out.blocks[b];
          const saved& k = keep[b];
          vec gr(W.total, 0.0), du, da(N * f), dz2, gx1(N * h), dout, dq(N * h), dk(N * h), dvv(N * h), delta(N * static_cast<std::size_t>(heads)), dz1,
              part_dx, dx(N * h);
          input(w2, w, dy, du);
          for (std::size_t e = 0; e < da.size(); ++e) da[e] = du[e] * (1.0 - k.u[e] * k.u[e]);
          input(w1, w, da, dz2);
          norm.backward_input(cv(dz2), cv(k.xhat2), cv(k.rstd2), T(w, 2 * ln2), cv(dy), mv(gx1), N);
          input(wo, w, gx1, dout);
          attention_backward(k.q.data(), k.k.data(), k.v.data(), k.o.data(), k.lse.data(), dout.data(), dq.data(), dk.data(), dvv.data(),
                             delta.data(), rows, s.seq, heads, hd, s.causal);
          input(wq, w, dq, dz1);
          for (std::size_t p : {wk, wv}) {
            input(p, w, p == wk ? dk : dvv, part_dx);
            for (std::size_t e = 0; e < dz1.size(); ++e) dz1[e] += part_dx[e];
          }
          norm.backward_input(cv(dz1), cv(k.xhat1), cv(k.rstd1), T(w, 2 * ln1), cv(gx1), mv(dx), N);
          weight(w2, k.u, dy, gr);
          weight(w1, k.z2, da, gr);
          norm.backward_weight(cv(dz2), cv(k.xhat2), G(gr, 2 * ln2), G(gr, 2 * ln2 + 1), N, q, static_cast<std::size_t>(g.depth));
          weight(wo, k.o, gx1, gr);
          weight(wq, k.z1, dq, gr);
          weight(wk, k.z1, dk, gr);
          weight(wv, k.z1, dvv, gr);
          norm.backward_weight(cv(dz1), cv(k.xhat1), G(gr, 2 * ln1), G(gr, 2 * ln1 + 1), N, q, static_cast<std::size_t>(g.depth));
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
  param_check params;  //!< the rank's parameters against the reference's
  long long volume_mismatches = 0;  //!< (step, group, operation) counts that differ from the formulas
  bool volumes_checked = false;     //!< false: rank-ordered sums over more than two ranks move their data in another form
  std::vector<std::vector<std::pair<std::string, loom::comm_counters>>> steps;  //!< per step: the rank's groups' counts
  std::vector<block_volume> formulas;  //!< per step: the rank's grid volume by the formulas (elements)
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
             N = static_cast<std::size_t>(s.tokens()), n = N / (q * static_cast<std::size_t>(g.depth)), hq = h / q;
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
    out.formulas.push_back(v);
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
  const block_layout mine = block_layout::of(h, f, &g);
  for (const auto& stg : pl.stages()) {
    const auto [first, last] = stg.blocks();
    for (int b = first; b < last; ++b) {
      std::vector<double> ref(mine.total), initial(mine.total), whole = want.blocks[static_cast<std::size_t>(b)], start = initial_block(b, h, f);
      place.parameters(std::span<double>(whole), std::span<double>(ref), h, f, false);
      place.parameters(std::span<double>(start), std::span<double>(initial), h, f, false);
      const auto got = stg.params().subspan(static_cast<std::size_t>(b - first) * mine.total, mine.total);
      out.params.add(got, std::span<const double>(ref), std::span<const double>(initial), bitwise);
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
    losses_differing += step_loss_matches(world, st, got.losses[st], want.losses[st], 1, print) ? 0 : 1;
    if (!root || !print) continue;
    print_counters(static_cast<int>(st), got.steps[st]);
    if (!got.volumes_checked) continue;
    std::printf("the grid groups of rank 0 in step %zu against the formulas (block_volume: the layers' volumes times the stage calls):\n", st);
    std::printf("| group | operation | bytes counted | bytes by the formulas | |\n|---|---|---|---|---|\n");
    for (std::size_t x = 0; x < 3; ++x)
      for (loom::comm_op op : loom::all_comm_ops) {
        const auto it = got.formulas[st].elements.find({static_cast<loom::grid_group>(x), op});
        const std::uint64_t counted = got.steps[st][x].second[op].bytes, formula = it == got.formulas[st].elements.end() ? 0 : it->second * sizeof(double);
        if (counted == 0 && formula == 0) continue;
        std::printf("| %s | %s | %llu | %llu | %s |\n", got.steps[st][x].first.c_str(), std::string(loom::to_string(op)).c_str(),
                    static_cast<unsigned long long>(counted), static_cast<unsigned long long>(formula), counted == formula ? "equal" : "DIFFERENT");
      }
  }
  if (root && print) {  // one block's volume per microbatch, by call
    const grid_mesh m = make_grid_mesh(s);
    const loom::tp_grid g = m.grid();
    const auto n = static_cast<std::size_t>(s.tokens() / (g.q * g.depth)), h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn);
    auto total = [&](block_volume::call c, bool norm_input = true) {
      std::size_t e = 0;
      for (const auto& [key, v] : block_volume::of(g, n, h, f, c, norm_input).elements) e += v;
      return e;
    };
    std::printf("| grid | tokens per member | forward | backward input | (first block of stage 0) | backward weight | elements per block and microbatch |\n"
                "|---|--:|--:|--:|--:|--:|--:|\n");
    const std::size_t fw = total(block_volume::call::forward), in = total(block_volume::call::input),
                      in0 = total(block_volume::call::input, false), wt = total(block_volume::call::weight);
    std::printf("| %s | %zu | %zu | %zu | %zu | %zu | %zu |\n", std::string(g.describe().view()).c_str(), n, fw, in, in0, wt, fw + in + wt);
  }
  std::vector<std::int64_t> totals{got.params.differing, got.params.compared, got.params.moved, got.volume_mismatches, got.volumes_checked ? 0 : 1};
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
