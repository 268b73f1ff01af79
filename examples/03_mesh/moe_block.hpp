// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The MoE branch of the transformer's MoE blocks (`mesh --experts E --moe-every K`): in every
//! K-th block the MLP (W1, tanh, W2) becomes E experts that are each such an MLP, behind a router,
//! with Tutel's routing contract (`loom/exec/moe.hpp`): GShard's top-k gate, capacity and
//! dropping, dispatch and the gate-weighted combine, the auxiliary load-balancing loss, and the
//! all-to-alls over the `ep` group that carry each expert's rows to the rank holding it
//! (Megatron-core's and DeepSpeed-MoE's expert-data layout: ranks that differ in ep hold different
//! experts and different sequences). The routing unit is one rank's tokens of one microbatch.
//!
//! Written once over the example's executor `X` with the MoE model's `moe_ops` and `call_space`
//! (`moe_layer.hpp`). The state a microbatch's backward needs (its routing, the experts' rows and
//! hidden activations, the router's logit gradient) is kept per microbatch, as `moe_stage` keeps it.

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "moe_layer.hpp"

namespace mesh_example {

//! The MoE blocks of a model: which blocks, how many experts, the routing options and the weight
//! of the auxiliary loss.
struct moe_spec {
  int every = 0;               //!< block b is an MoE block iff every > 0 and b % every == every - 1
  loom::moe_options o{};       //!< experts, top-k, capacity factor (o.experts = 0: no MoE blocks)
  double lambda = 0.01;        //!< the auxiliary loss's weight in the objective
  //! Whether block `b` is an MoE block.
  bool is_moe(int b) const { return every > 0 && o.experts > 0 && b % every == every - 1; }
  //! MoE blocks among blocks [b0, b1).
  int count(int b0, int b1) const {
    int n = 0;
    for (int b = b0; b < b1; ++b) n += is_moe(b) ? 1 : 0;
    return n;
  }
};

//! One MoE block's branch (router, this rank's E/ep experts, the exchange) on one pipeline stage;
//! see the file comment. `ep` is the expert-parallel group (null: every expert on this rank), `n`
//! the tokens of a microbatch on this rank, `h` the width and `f` the experts' hidden features.
//! `aux_scale` points at the objective's weight of one routing unit's auxiliary loss (in `X`'s
//! memory), which `lambda` multiplies: d(objective)/d(l_aux) = lambda * *aux_scale.
template <class C, class X>
class moe_branch {
 public:
  using T = typename X::value_type;  //!< the precision
  template <class U>
  using buffer = typename X::template buffer<U>;  //!< the executor's storage
  using routing = typename moe::moe_ops<X>::routing;  //!< one microbatch's routing (host or device memory)

  //! This rank's weights of the branch: the router `[E][h]` and, for each held expert e in order,
  //! W1 `[f][h]`, B1 `[f]`, W2 `[h][f]`, B2 `[h]` (each tensor's experts consecutive).
  struct weights {
    std::span<const T> router, w1, b1, w2, b2;  //!< the router, then the held experts' tensors
  };
  //! The gradients of the same tensors.
  struct grads {
    std::span<T> router, w1, b1, w2, b2;  //!< as `weights`
  };
  //! What the forward of microbatch `mb` gave: the auxiliary loss of its routing unit, its
  //! dropped (token, choice) pairs, the drops per expert and the capacity (slots per expert).
  struct record {
    T aux = 0;                                 //!< GShard's auxiliary loss of the routing unit
    std::vector<std::pair<int, int>> dropped;  //!< (token, choice), in the contract's order
    std::vector<long long> dropped_per_expert;  //!< [E]
    long long capacity = 0;                    //!< C
  };

  //! The branch of a stage: the options `s` (kept by address), `n` tokens, width `h`, the
  //! experts' hidden features `f`, the ep group `ep` and the auxiliary loss's weight `aux_scale`
  //! (see the class comment). Throws `config_error` when E does not split over ep.
  moe_branch(const moe_spec& s, std::size_t n, std::size_t h, std::size_t f, C* ep, const T* aux_scale)
      : s_(&s), n_(n), h_(h), f_(f), ep_(ep), aux_scale_(aux_scale) {
    const int ranks = ep == nullptr ? 1 : ep->size();
    if (std::string rule = loom::ep_rule(s.o.experts, ranks); !rule.empty()) throw loom::config_error(rule);
    el_ = s.o.experts / ranks;
    ranks_ = ranks;
  }

  //! Experts this rank holds.
  int held() const { return el_; }

  //! Bytes of `X`'s memory a branch on `ep` ranks holds after `microbatches` microbatches (device
  //! memory on a device; capacity factor above 0, so every call has the same sizes): its scratch
  //! (logits, the slots and their exchange buffers both ways, the experts' hidden rows, the gate
  //! and input gradients), and per microbatch its state (the experts' rows in and out, hidden
  //! activations and their gradient, the logits' gradient, the auxiliary loss) and its routing
  //! (`loom::cuda::moe_routing`: scores, choices, gates, slots, loads and first choices).
  static std::size_t bytes(const moe_spec& s, std::size_t n, std::size_t h, std::size_t f, int ep, int microbatches) {
    const auto E = static_cast<std::size_t>(s.o.experts), k = static_cast<std::size_t>(s.o.top_k), uep = static_cast<std::size_t>(ep);
    const auto cap = static_cast<std::size_t>(loom::moe_capacity(s.o, n, 0));
    const std::size_t all = E * cap * h, rows = uep * cap, el = E / uep;
    const std::size_t scratch = n * E + 6 * all + rows * f + n * k + 2 * n * h;
    const std::size_t state = 3 * all + 2 * el * rows * f + n * E + 1;
    const std::size_t routing = n * E * sizeof(T) + n * k * (sizeof(int) + 2 * sizeof(T) + sizeof(long long)) + 2 * E * sizeof(long long);
    const auto M = static_cast<std::size_t>(microbatches);
    return (scratch + M * state) * sizeof(T) + M * routing;
  }

  //! `out` (`[n][h]`) = the branch applied to `c` (`[n][h]`, the block's second layer norm).
  void forward(const loom::stage_context& ctx, std::span<const T> c, weights w, std::span<T> out) {
    sp_.begin(ctx);
    const auto E = static_cast<std::size_t>(s_->o.experts);
    state& st = state_of(ctx.microbatch);
    const std::span<T> logits = sp_.tmp(t_logits, n_ * E, false);
    sp_.x.linear().forward(c, w.router, std::span<const T>{}, logits, n_, h_, E);
    ops_.route(sp_.x, s_->o, moe::cs(logits), st.R);
    loom::ep_group<G> g = group();
    ops_.capacity(sp_.x, g, st.R, s_->o);
    const auto cap = static_cast<std::size_t>(st.R.capacity), all = E * cap * h_, rows = static_cast<std::size_t>(ranks_) * cap;
    st.rows = rows;
    const std::span<T> slots = sp_.tmp(t_slots, all), scratch = sp_.tmp(t_scratch, all), eo = sp_.tmp(t_eo, all),
                       u = sp_.tmp(t_u, rows * f_, false);
    const std::span<T> xin = sp_.keep(st.xin, all), back = sp_.keep(st.back, all), act = sp_.keep(st.act, static_cast<std::size_t>(el_) * rows * f_);
    ops_.dispatch(sp_.x, st.R, c, slots, h_, {});
    loom::ep_to_experts(g, s_->o.experts, moe::cs(slots), scratch, xin);
    for (int e = 0; e < el_; ++e) {
      const std::size_t at = static_cast<std::size_t>(e) * rows * h_;
      const std::span<T> a = act.subspan(static_cast<std::size_t>(e) * rows * f_, rows * f_);
      sp_.x.linear().forward(moe::cs(xin).subspan(at, rows * h_), w1(w, e), b1(w, e), u, rows, h_, f_);
      sp_.x.each(rows * f_, kernels::tanh_elem<T>{u.data(), a.data()}, "moe expert tanh");
      sp_.x.linear().forward(moe::cs(a), w2(w, e), b2(w, e), eo.subspan(at, rows * h_), rows, f_, h_);
    }
    loom::ep_from_experts(g, s_->o.experts, moe::cs(eo), scratch, back);
    ops_.combine(sp_.x, st.R, moe::cs(back), out, h_);
    ops_.aux(sp_.x, st.R, sp_.keep(st.aux, 1));
    st.ran = true;
  }

  //! `dc` (`[n][h]`) = the gradient of the branch's input for the gradient `g` of its output:
  //! the experts' part, then the router's added to it (in that order).
  void backward_input(const loom::stage_context& ctx, std::span<const T> g, weights w, std::span<T> dc) {
    sp_.begin(ctx);
    const auto E = static_cast<std::size_t>(s_->o.experts), k = static_cast<std::size_t>(s_->o.top_k);
    state& st = state_of(ctx.microbatch);
    loom::ep_group<G> grp = group();
    const std::size_t rows = st.rows, all = E * static_cast<std::size_t>(st.R.capacity) * h_;
    const std::span<T> dout = sp_.tmp(t_dout, all), dgate = sp_.tmp(t_dgate, n_ * k), scratch = sp_.tmp(t_scratch, all),
                       din = sp_.tmp(t_din, all), dslots = sp_.tmp(t_dslots, all), dx = sp_.tmp(t_dx, n_ * h_), dxr = sp_.tmp(t_dxr, n_ * h_);
    ops_.combine_backward(sp_.x, st.R, std::span<const T>(st.back.data(), all), g, dout, dgate, h_, {});
    const std::span<T> drows = sp_.keep(st.drows, all), du = sp_.keep(st.du, static_cast<std::size_t>(el_) * rows * f_);
    loom::ep_to_experts(grp, s_->o.experts, moe::cs(dout), scratch, drows);
    for (int e = 0; e < el_; ++e) {
      const std::size_t at = static_cast<std::size_t>(e) * rows * h_, af = static_cast<std::size_t>(e) * rows * f_;
      const std::span<T> d = du.subspan(af, rows * f_);
      sp_.x.linear().backward_input(moe::cs(drows).subspan(at, rows * h_), w2(w, e), d, rows, f_, h_);
      sp_.x.each(rows * f_, kernels::tanh_grad_elem<T>{st.act.data() + af, d.data()}, "moe expert tanh backward");
      sp_.x.linear().backward_input(moe::cs(d), w1(w, e), din.subspan(at, rows * h_), rows, h_, f_);
    }
    loom::ep_from_experts(grp, s_->o.experts, moe::cs(din), scratch, dslots);
    ops_.dispatch_backward(sp_.x, st.R, moe::cs(dslots), dx, h_, {});
    const std::span<T> dl = sp_.keep(st.dlogits, n_ * E);
    ops_.route_backward(sp_.x, st.R, s_->o, moe::cs(dgate), static_cast<T>(s_->lambda), dl, aux_scale_);
    sp_.x.linear().backward_input(moe::cs(dl), w.router, dxr, n_, h_, E);
    sp_.x.each(n_ * h_, kernels::add_elem<T>{dx.data(), dxr.data(), dc.data()}, "moe input gradient");
  }

  //! Adds the weight gradients of microbatch `ctx.microbatch` (`c`: the branch's input) into `gw`.
  void backward_weight(const loom::stage_context& ctx, std::span<const T> c, grads gw) {
    sp_.begin(ctx);
    const auto E = static_cast<std::size_t>(s_->o.experts);
    state& st = state_of(ctx.microbatch);
    const std::size_t rows = st.rows;
    for (int e = 0; e < el_; ++e) {
      const std::size_t at = static_cast<std::size_t>(e) * rows * h_, af = static_cast<std::size_t>(e) * rows * f_;
      const auto ue = static_cast<std::size_t>(e);
      sp_.x.linear().backward_weight(std::span<const T>(st.act.data() + af, rows * f_), std::span<const T>(st.drows.data() + at, rows * h_),
                                     gw.w2.subspan(ue * h_ * f_, h_ * f_), gw.b2.subspan(ue * h_, h_), rows, f_, h_);
      sp_.x.linear().backward_weight(std::span<const T>(st.xin.data() + at, rows * h_), std::span<const T>(st.du.data() + af, rows * f_),
                                     gw.w1.subspan(ue * f_ * h_, f_ * h_), gw.b1.subspan(ue * f_, f_), rows, h_, f_);
    }
    sp_.x.linear().backward_weight(c, std::span<const T>(st.dlogits.data(), n_ * E), gw.router, std::span<T>{}, n_, h_, E);
  }

  //! The record of microbatch `mb`'s last forward (on a device: read back after the stream's work).
  record last(int mb) const {
    const state& st = states_.at(static_cast<std::size_t>(mb));
    const loom::moe_routing<T> R = ops_.host(sp_.x, st.R);
    return {X::download(std::span<const T>(st.aux.data(), 1))[0], moe::dropped_of(R), R.dropped_per_expert(), R.capacity};
  }
  //! The microbatches this branch ran a forward of.
  std::vector<int> microbatches() const {
    std::vector<int> out;
    for (std::size_t i = 0; i < states_.size(); ++i)
      if (states_[i].ran) out.push_back(static_cast<int>(i));
    return out;
  }

 private:
  using G = typename X::template group<C>;
  enum : std::size_t { t_logits, t_slots, t_scratch, t_eo, t_u, t_dout, t_dgate, t_din, t_dslots, t_dx, t_dxr };
  struct state {
    routing R;
    std::size_t rows = 0;             // rows per held expert: ep x capacity
    buffer<T> xin, back, act;         // the experts' input rows, their outputs back at the tokens, the hidden activations
    buffer<T> drows, du, dlogits;     // what backward_input leaves for the weight gradients
    buffer<T> aux;                    // the routing unit's auxiliary loss
    bool ran = false;
  };
  state& state_of(int mb) {
    if (states_.size() <= static_cast<std::size_t>(mb)) states_.resize(static_cast<std::size_t>(mb) + 1);
    return states_[static_cast<std::size_t>(mb)];
  }
  loom::ep_group<G> group() { return loom::ep_group<G>{sp_.on(ep_)}; }
  std::span<const T> w1(const weights& w, int e) const { return w.w1.subspan(static_cast<std::size_t>(e) * f_ * h_, f_ * h_); }
  std::span<const T> b1(const weights& w, int e) const { return w.b1.subspan(static_cast<std::size_t>(e) * f_, f_); }
  std::span<const T> w2(const weights& w, int e) const { return w.w2.subspan(static_cast<std::size_t>(e) * h_ * f_, h_ * f_); }
  std::span<const T> b2(const weights& w, int e) const { return w.b2.subspan(static_cast<std::size_t>(e) * h_, h_); }

  const moe_spec* s_;
  std::size_t n_, h_, f_;
  C* ep_;
  const T* aux_scale_;
  int el_ = 0, ranks_ = 1;
  moe::moe_ops<X> ops_{};
  moe::call_space<C, X> sp_{};
  std::vector<state> states_;
};

}  // namespace mesh_example
