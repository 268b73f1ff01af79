// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The routing contract of a mixture-of-experts layer (issue 26's first piece): a router over E
//! experts, top-k choice, capacity and token dropping, the auxiliary load-balancing loss, the
//! dispatch of kept tokens into per-expert slots and the gate-weighted combine, with the backward
//! of all of it. The experts between dispatch and combine are the user's kernels; the all-to-alls
//! that move the slots between expert-parallel ranks come with the `ep` mesh dimension.
//!
//! The rules are Tutel's (Hwang et al., MLSys 2023; microsoft/tutel at 82af7aad,
//! `tutel/impls/fast_dispatch.py` `extract_critical`, `tutel/impls/losses.py` `gshard_loss`,
//! `tutel/impls/moe_layer.py` `routing`), restated here as equations; loom's code is its own.
//! For a rank's n tokens with router logits `l[t][e]`:
//! - **scores** `s[t][e] = softmax_e(l[t])` (Tutel's gate noise is not modelled: 0);
//! - **choices** `x[t][j]`, j = 0..k-1: the experts of the k largest scores, largest first, ties to
//!   the lower expert index (torch.topk leaves ties unspecified);
//! - **gates** `g[t][j] = s[t][x[t][j]]`, and for k > 1 with normalisation
//!   `g[t][j] / max(sum_i g[t][i], eps)` (eps: the type's epsilon), before any dropping;
//! - **slots**: choice j of token t takes slot `c[t][j]` = (assignments of all choices i < j to
//!   that expert, over every token) + (tokens t' < t whose choice j is that expert): every first
//!   choice is placed before any second choice, each in token order;
//! - **capacity** C: with capacity factor f > 0, `C = k floor(f ceil(n / E))`; with f = 0, the
//!   largest load of any expert over the expert-parallel group (nothing is dropped); then rounded
//!   up to a multiple of the alignment. A pair (t, j) is **dropped** iff `c[t][j] >= C`;
//! - **auxiliary loss** (GShard's): `l_aux = (E / n^2) sum_e (sum_t s[t][e]) N_e`, N_e the tokens
//!   whose first choice is e (a count: no gradient flows through it);
//! - **dispatch**: slot `c[t][j]` of expert `x[t][j]` receives the token's input (unscaled: Tutel's
//!   post-score mode); empty slots hold 0. **combine**: `y[t] = sum_j g[t][j] out[x[t][j]][c[t][j]]`
//!   over the kept pairs, j in order.
//! Negative capacity factors (Tutel's "at most" mode) are refused; top-k above E is refused
//! (Tutel clamps it silently).
//!
//! **Expert parallelism** (`ep_group`, `ep_to_experts`, `ep_from_experts`): the E experts are
//! split over the ep ranks of a group, E/ep consecutive experts per rank, and every rank routes
//! its own tokens. A rank's dispatch buffer `[E][C][h]` is ordered by expert, so one all-to-all
//! sends each rank the slots of its experts; the rank then holds, per local expert, the slots of
//! every source rank, `[E/ep][ep][C][h]` (source-major rows: an expert's kernel runs on ep C rows at
//! once). The combine and both backward exchanges are the same all-to-all, flat or hierarchical
//! (`ep_group::node`, `ep_group::cross`: Tutel's 2D all-to-all, the same result). Per MoE layer and
//! microbatch a rank sends four all-to-alls of E C h elements (dispatch and combine, forward and
//! backward), `(ep - 1)/ep` of them to other ranks. With a capacity factor of 0 the capacity is the
//! largest load over the group: one all-reduce (max) of one integer.
//!
//! The per-item work is `moe_items` and `block_transpose` (`loom/exec/moe_math.hpp`): the host
//! functions here loop over them, and `loom/cuda/moe.hpp` runs the same items as kernels on a
//! stream, for the same exchange functions over device groups (`loom::on_stream`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/group_kind.hpp"
#include "loom/exec/moe_math.hpp"
#include "loom/exec/pattern_math.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

namespace detail {
//! Every item of step `s` in order, on the host.
template <class T>
void moe_run(const moe_items<T>& m, moe_step s) {
  const std::size_t n = m.count(s);
  for (std::size_t e = 0; e < n; ++e) m(s, e);
}
//! A block transpose on the host.
template <class T>
void transpose_blocks(const block_transpose<T>& b) {
  const std::size_t n = b.size();
  for (std::size_t w = 0; w < n; ++w) b(w);
}
//! A routing (`loom::moe_routing` on the host, `loom::cuda::moe_routing` on a device: the same
//! members) as `moe_items` over its buffers, every expert held. The items write through these
//! pointers; a const routing is handed only to the steps that read them.
template <class T, class R>
moe_items<T> routing_items(const R& r) {
  moe_items<T> m;
  m.n = r.tokens;
  m.experts = static_cast<std::size_t>(r.experts);
  m.top_k = static_cast<std::size_t>(r.top_k);
  m.capacity = r.capacity;
  m.held_count = r.experts;
  m.scores = const_cast<T*>(r.scores.data());
  m.expert = const_cast<int*>(r.expert.data());
  m.gate = const_cast<T*>(r.gate.data());
  m.raw_gate = const_cast<T*>(r.raw_gate.data());
  m.slot = const_cast<long long*>(r.slot.data());
  m.load = const_cast<long long*>(r.load.data());
  m.first = const_cast<long long*>(r.first.data());
  return m;
}
}  // namespace detail

//! The routing options (see the file comment).
struct moe_options {
  int experts = 0;               //!< E
  int top_k = 1;                 //!< k, 1..E
  double capacity_factor = 0;    //!< f >= 0; 0: no dropping
  bool normalize_gate = true;    //!< for k > 1: gates divided by their sum
  int alignment = 1;             //!< the capacity is rounded up to a multiple of this
};

//! The rule `o` breaks, in one line, or "".
inline std::string moe_rule(const moe_options& o) {
  if (o.experts < 1) return "moe: the number of experts must be >= 1 (got " + std::to_string(o.experts) + ")";
  if (o.top_k < 1 || o.top_k > o.experts)
    return "moe: top-k must be between 1 and the number of experts " + std::to_string(o.experts) + " (got " + std::to_string(o.top_k) + ")";
  if (!std::isfinite(o.capacity_factor) || o.capacity_factor < 0)
    return "moe: the capacity factor must be a finite number >= 0 (0: no dropping; got " + std::string(detail::real_text(o.capacity_factor)) + ")";
  if (o.alignment < 1) return "moe: the capacity alignment must be >= 1 (got " + std::to_string(o.alignment) + ")";
  return {};
}

//! One rank's routing decisions for n tokens (see the file comment): per token and choice the
//! expert, the gate and the slot; per expert the load.
template <class T>
struct moe_routing {
  std::size_t tokens = 0;        //!< n
  int experts = 0;               //!< E
  int top_k = 1;                 //!< k
  std::vector<T> scores;         //!< `[n][E]`, the softmax of the logits
  std::vector<int> expert;       //!< `[n][k]`
  std::vector<T> gate;           //!< `[n][k]`, normalised when asked
  std::vector<T> raw_gate;       //!< `[n][k]`, the scores of the choices (before normalisation)
  std::vector<long long> slot;   //!< `[n][k]`
  std::vector<long long> load;   //!< `[E]`: assignments of all choices (Tutel's `locations2`)
  std::vector<long long> first;  //!< `[E]`: tokens whose first choice is the expert (N_e)
  long long capacity = 0;        //!< C, once `set_capacity` ran
  //! The routing as `moe_items` over these vectors (every expert held; sizes and buffers of the
  //! data steps are the caller's to set).
  moe_items<T> items() const { return detail::routing_items<T>(*this); }
  //! True when choice `j` of token `t` is kept (its slot is below the capacity).
  bool kept(std::size_t t, int j) const { return slot[t * static_cast<std::size_t>(top_k) + static_cast<std::size_t>(j)] < capacity; }
  //! The largest load over the experts (the f = 0 capacity before the group's maximum).
  long long max_load() const { return load.empty() ? 0 : *std::max_element(load.begin(), load.end()); }
  //! Dropped (token, choice) pairs.
  std::size_t dropped() const {
    std::size_t d = 0;
    for (std::size_t t = 0; t < tokens; ++t)
      for (int j = 0; j < top_k; ++j) d += kept(t, j) ? 0 : 1;
    return d;
  }
  //! Dropped (token, choice) pairs per expert (`[E]`, summing to `dropped()`).
  std::vector<long long> dropped_per_expert() const {
    std::vector<long long> d(static_cast<std::size_t>(experts), 0);
    for (std::size_t t = 0; t < tokens; ++t)
      for (int j = 0; j < top_k; ++j)
        if (!kept(t, j)) ++d[static_cast<std::size_t>(expert[t * static_cast<std::size_t>(top_k) + static_cast<std::size_t>(j)])];
    return d;
  }
};

//! The capacity for `n` tokens under `o`; `group_max_load` is the largest expert load over the
//! expert-parallel group (used when the capacity factor is 0).
inline long long moe_capacity(const moe_options& o, std::size_t n, long long group_max_load) {
  long long c = 0;
  if (o.capacity_factor > 0) {
    const long long per_expert = (static_cast<long long>(n) + o.experts - 1) / o.experts;
    c = static_cast<long long>(o.top_k) * static_cast<long long>(std::floor(o.capacity_factor * static_cast<double>(per_expert)));
  } else {
    c = group_max_load;
  }
  if (const long long r = c % o.alignment; r > 0) c += o.alignment - r;
  return c;
}

//! Routes `n` tokens from their router logits `logits` (`[n][E]`): scores, choices, gates, slots
//! and loads; the capacity is left for `set_capacity` (it may need the group's largest load).
//! Throws `config_error` for options that break `moe_rule`.
template <class T>
moe_routing<T> moe_route(const moe_options& o, std::span<const T> logits) {
  if (std::string r = moe_rule(o); !r.empty()) throw config_error(r);
  const auto E = static_cast<std::size_t>(o.experts), k = static_cast<std::size_t>(o.top_k);
  if (logits.size() % E != 0)
    throw config_error("moe: " + std::to_string(logits.size()) + " router logits are not a whole number of tokens of " + std::to_string(E) + " experts");
  moe_routing<T> r;
  const std::size_t n = logits.size() / E;
  r.tokens = n;
  r.experts = o.experts;
  r.top_k = o.top_k;
  r.scores.assign(n * E, T{});
  r.expert.assign(n * k, 0);
  r.gate.assign(n * k, T{});
  r.raw_gate.assign(n * k, T{});
  r.slot.assign(n * k, 0);
  r.load.assign(E, 0);
  r.first.assign(E, 0);
  moe_items<T> m = r.items();
  m.normalize = o.normalize_gate;
  m.eps = std::numeric_limits<T>::epsilon();
  m.logits = logits.data();
  detail::moe_run(m, moe_step::route);  // per token: scores, choices, gates
  detail::moe_run(m, moe_step::slots);  // per expert: slots, loads, first choices
  return r;
}

//! Sets the capacity of `r` (see `moe_capacity`).
template <class T>
void set_capacity(moe_routing<T>& r, const moe_options& o, long long group_max_load) {
  r.capacity = moe_capacity(o, r.tokens, group_max_load);
}

//! GShard's auxiliary load-balancing loss of `r` (see the file comment).
template <class T>
T moe_aux_loss(const moe_routing<T>& r) {
  T out{};
  moe_items<T> m = r.items();
  m.scalar = &out;
  detail::moe_run(m, moe_step::aux);
  return out;
}

//! The experts a rank holds: `count` consecutive ones from `first` (all of them by default).
struct moe_experts {
  int first = 0;       //!< the first expert held
  int count = -1;      //!< experts held; -1: every expert from `first`
};

namespace detail {

//! The items of routing `r` (host or device) over the experts `held` for `h` features per token.
template <class R>
auto moe_held(const R& r, moe_experts held, std::size_t h) {
  auto m = r.items();
  m.h = h;
  m.held_first = held.first;
  m.held_count = held.count < 0 ? r.experts - held.first : held.count;
  return m;
}

}  // namespace detail

//! Dispatch: `slots` (`[E][C][h]`, or `[count][C][h]` for the experts `held`) receives each kept
//! token's input `x` (`[n][h]`) at its slot; the other slots are set to 0.
template <class T>
void moe_dispatch(const moe_routing<T>& r, std::span<const T> x, std::span<T> slots, std::size_t h, moe_experts held = {}) {
  std::fill(slots.begin(), slots.end(), T{});
  moe_items<T> m = detail::moe_held(r, held, h);
  m.x = x.data();
  m.slots_out = slots.data();
  detail::moe_run(m, moe_step::dispatch);
}

//! Combine: `y[t] = sum_j g[t][j] out[x[t][j]][c[t][j]]` over the kept pairs (`out` `[E][C][h]`,
//! `y` `[n][h]`; a token with every choice dropped gets 0). With the experts `held`, `out` is
//! `[count][C][h]` and only their pairs are summed (Pipeline MoE's partial combine).
template <class T>
void moe_combine(const moe_routing<T>& r, std::span<const T> out, std::span<T> y, std::size_t h, moe_experts held = {}) {
  moe_items<T> m = detail::moe_held(r, held, h);
  m.slots_in = out.data();
  m.y = y.data();
  detail::moe_run(m, moe_step::combine);
}

//! Combine's backward: `dout` (`[E][C][h]`, or the experts `held`; zeroed first) receives
//! `g dy` at each kept slot and `dgate` (`[n][k]`) the dot products `dy[t] . out[slot]` (0 for
//! dropped pairs and for experts not held).
template <class T>
void moe_combine_backward(const moe_routing<T>& r, std::span<const T> out, std::span<const T> dy, std::span<T> dout, std::span<T> dgate,
                          std::size_t h, moe_experts held = {}) {
  std::fill(dout.begin(), dout.end(), T{});
  moe_items<T> m = detail::moe_held(r, held, h);
  m.x = out.data();
  m.dy = dy.data();
  m.slots_out = dout.data();
  m.dgate = dgate.data();
  detail::moe_run(m, moe_step::combine_backward);
}

//! Dispatch's backward: `dx[t] += sum_j dslots[x[t][j]][c[t][j]]` over the kept pairs (of the
//! experts `held`), j in order.
template <class T>
void moe_dispatch_backward(const moe_routing<T>& r, std::span<const T> dslots, std::span<T> dx, std::size_t h, moe_experts held = {}) {
  moe_items<T> m = detail::moe_held(r, held, h);
  m.slots_in = dslots.data();
  m.y = dx.data();
  detail::moe_run(m, moe_step::dispatch_backward);
}

//! The router's backward: from the gates' gradient `dgate` (`[n][k]`) and the auxiliary loss's
//! weight `daux` (d loss / d l_aux), the logits' gradient `dlogits` (`[n][E]`): through the gate
//! normalisation, the aux loss (`d l_aux / d s[t][e] = E N_e / n^2`) and the softmax. With
//! `daux_scale` (one element) the weight is `*daux_scale * daux`: a stage whose output holds
//! `daux l_aux` passes its output gradient there, which a device stage cannot read on the host.
template <class T>
void moe_route_backward(const moe_routing<T>& r, const moe_options& o, std::span<const T> dgate, T daux, std::span<T> dlogits,
                        const T* daux_scale = nullptr) {
  moe_items<T> m = r.items();
  m.normalize = o.normalize_gate;
  m.eps = std::numeric_limits<T>::epsilon();
  m.daux = daux;
  m.daux_scale = daux_scale;
  m.dgate = const_cast<T*>(dgate.data());  // read only by this step
  m.dlogits = dlogits.data();
  detail::moe_run(m, moe_step::route_backward);
}

//! Faults the device exchange can be asked to commit, for the tests of the race detector.
struct moe_faults {
  bool skip_pack_wait = false;  //!< the overlap's all-to-all of a piece does not wait for the kernel that packed it
};

//! The group the experts spread over (see the file comment): the expert-parallel ranks, or for
//! Pipeline MoE the tensor-parallel ones (`tp_experts`). Null or size 1: every expert on this rank.
template <class C>
struct ep_group {
  C* comm = nullptr;  //!< the ranks holding different experts (and different tokens)
  //! Hierarchical all-to-all (Tutel's 2D, intra-node then inter-node), when both are set: the
  //! group's ranks on this rank's node (`node`, L ranks) and those with its index on every node
  //! (`cross`); group rank = node index x L + index on the node, i.e. `node = comm.split(rank / L,
  //! rank % L)` and `cross = comm.split(rank % L, rank / L)`.
  C* node = nullptr;
  C* cross = nullptr;  //!< see `node`
  //! Device groups only: the same group bound to a second stream, the communication stream on
  //! which `ep_overlapped` runs its all-to-alls (ordered against the group's compute stream by
  //! events). Host groups overlap with non-blocking collectives and leave it null.
  C* exchange = nullptr;
  moe_faults faults{};  //!< deliberate bugs, for the tests that show the race detector names them (device groups)
  //! Ranks in the group.
  int size() const { return comm == nullptr ? 1 : comm->size(); }
  //! This rank's index.
  int rank() const { return comm == nullptr ? 0 : comm->rank(); }
};

//! The rule `E` experts over a group of `ep` ranks break, in one line, or "".
inline std::string ep_rule(int experts, int ep) {
  if (ep < 1) return "moe: the expert-parallel group must have >= 1 rank (got " + std::to_string(ep) + ")";
  if (experts % ep != 0)
    return "moe: " + std::to_string(experts) + " experts do not split evenly over " + std::to_string(ep) + " expert-parallel ranks";
  return {};
}

//! Sets the capacity of `r` over the group: with a capacity factor of 0 the largest load of any
//! expert on any rank of the group (an all-reduce of one integer), else from the local tokens.
template <class C, class T>
void set_capacity(ep_group<C>& g, moe_routing<T>& r, const moe_options& o) {
  static_assert(!detail::device_group<C>, "loom: on a device group the routing is a loom::cuda::moe_routing (#include <loom/cuda/moe.hpp>)");
  long long most = r.max_load();
  if (o.capacity_factor == 0 && g.size() > 1) g.comm->all_reduce(std::span<long long>(&most, 1), reduce_op::max);
  set_capacity(r, o, most);
}

namespace detail {

// How the exchange copies and changes layouts on a group of type `C`: host groups here (loops);
// device groups (`loom::on_stream`) in `loom/cuda/moe.hpp`, as kernels on the group's stream.
template <class C>
struct moe_space {
  static_assert(!device_group<C>,
                "loom: the expert-parallel exchange over a device group (loom::on_stream) needs #include <loom/cuda/moe.hpp>, "
                "which defines its device form");
  template <class T>
  static void copy(C*, std::span<const T> from, std::span<T> to) {
    std::copy(from.begin(), from.end(), to.begin());
  }
  template <class T>
  static void transpose(C*, const block_transpose<T>& b) {
    transpose_blocks(b);
  }
  // The overlap's collectives: non-blocking all-to-alls, completed by `wait`.
  using request = typename C::request;
  struct overlap_state {};
  template <class G, class T>
  static request post(G& g, overlap_state&, std::span<const T> in, std::span<T> out) {
    return g.comm->iall_to_all(in, out);
  }
  template <class G>
  static void wait(G& g, overlap_state&, request& r) {
    g.comm->wait(r);
  }
};

// Moves blocks of `C h` elements between the source-major layout [ep][E/ep][C][h] and the
// expert-major one [E/ep][ep][C][h] (to_expert_major) or back.
template <class C, class T>
void ep_transpose(C* c, std::span<const T> from, std::span<T> to, int ep, int local_experts, std::size_t block, bool to_expert_major) {
  const auto P = static_cast<std::size_t>(ep), L = static_cast<std::size_t>(local_experts);
  moe_space<C>::transpose(c, block_transpose<T>{from.data(), to.data(), to_expert_major ? P : L, to_expert_major ? L : P, block});
}

// Tutel's 2D hierarchical all-to-all over `g.node` (L ranks) and `g.cross` (N nodes): `a` holds
// the input ([dst][chunk], dst = node x L + index) and is clobbered, `b` receives the flat
// all-to-all's result ([src][chunk]). Phase 1 sends, inside the node, every chunk bound for index
// d on any node to the node's rank d; phase 2 sends, across nodes, each node's chunks.
template <class C, class T>
void hierarchical_all_to_all(ep_group<C>& g, std::span<T> a, std::span<T> b) {
  const auto L = static_cast<std::size_t>(g.node->size()), N = static_cast<std::size_t>(g.cross->size());
  const std::size_t chunk = a.size() / (L * N);
  using space = moe_space<C>;
  space::transpose(g.comm, block_transpose<T>{a.data(), b.data(), N, L, chunk});  // [dst node][index] -> [index][dst node]
  g.node->all_to_all(std::span<const T>(b), a);                                 // a: [source index][dst node]
  space::transpose(g.comm, block_transpose<T>{a.data(), b.data(), L, N, chunk});  // -> [dst node][source index]
  g.cross->all_to_all(std::span<const T>(b), a);                                // a: [source node][source index] = [source][chunk]
  space::copy(g.comm, std::span<const T>(a), b);
}

// The group's all-to-all from `a` (clobbered when hierarchical) into `b`.
template <class C, class T>
void ep_all_to_all(ep_group<C>& g, std::span<T> a, std::span<T> b) {
  if (g.node != nullptr && g.cross != nullptr) hierarchical_all_to_all(g, a, b);
  else g.comm->all_to_all(std::span<const T>(a), b);
}

}  // namespace detail

//! Sends every rank the slots of its experts: `slots` (`[E][C][h]`, this rank's dispatch buffer
//! or combine gradient) through one all-to-all into `scratch` (the same size), then into `rows`
//! (`[E/ep][ep][C][h]`: each local expert's slots from every source rank, source-major). On a
//! device group (`loom::on_stream`, with `loom/cuda/moe.hpp`) every copy and layout change is a
//! kernel on the group's stream and the all-to-alls are the group's, stream-ordered.
template <class C, class T>
void ep_to_experts(ep_group<C>& g, int experts, std::span<const T> slots, std::span<T> scratch, std::span<T> rows) {
  const int ep = g.size();
  if (std::string rule = ep_rule(experts, ep); !rule.empty()) throw config_error(rule);
  using space = detail::moe_space<C>;
  if (ep == 1) {
    space::copy(g.comm, slots, rows);
    return;
  }
  if (g.node != nullptr && g.cross != nullptr) {
    space::copy(g.comm, slots, rows);  // the hierarchical exchange clobbers its input
    detail::hierarchical_all_to_all(g, rows, scratch);
  } else {
    g.comm->all_to_all(slots, scratch);
  }
  detail::ep_transpose(g.comm, std::span<const T>(scratch), rows, ep, experts / ep, slots.size() / static_cast<std::size_t>(experts), true);
}

//! The way back: `rows` (`[E/ep][ep][C][h]`, the local experts' outputs or input gradients) into
//! `slots` (`[E][C][h]`, indexed by this rank's own tokens' slots), through `scratch` (device
//! groups as for `ep_to_experts`).
template <class C, class T>
void ep_from_experts(ep_group<C>& g, int experts, std::span<const T> rows, std::span<T> scratch, std::span<T> slots) {
  const int ep = g.size();
  if (std::string rule = ep_rule(experts, ep); !rule.empty()) throw config_error(rule);
  if (ep == 1) {
    detail::moe_space<C>::copy(g.comm, rows, slots);
    return;
  }
  detail::ep_transpose(g.comm, rows, scratch, ep, experts / ep, rows.size() / static_cast<std::size_t>(experts), false);
  detail::ep_all_to_all(g, scratch, slots);
}

//! Pipeline MoE (Chen et al., "Pipeline MoE: A Flexible MoE Implementation with Pipeline
//! Parallelism", 2023): the experts spread over a tensor-parallel group whose ranks hold the same
//! tokens, E/tp consecutive experts per rank (`tp_experts`). Dispatch is local index slicing
//! (`moe_dispatch` with the experts held), each rank combines its own experts' pairs
//! (`moe_combine` with them) and one all-reduce sums the partial outputs (`tp_moe_combine`); the
//! backward all-reduces the input gradient of the dispatch and the gates' gradient
//! (`tp_moe_backward_sum`). For top-k <= 2 every sum has at most two non-zero terms per element, so
//! the results equal one rank holding every expert bit for bit.
template <class C>
moe_experts tp_experts(int experts, const ep_group<C>& g) {
  if (std::string rule = ep_rule(experts, g.size()); !rule.empty()) throw config_error(rule);
  const int per = experts / g.size();
  return {.first = g.rank() * per, .count = per};
}

//! Pipeline MoE's combine: this rank's experts' pairs (`out` `[E/tp][C][h]`) into `y`, then the
//! sum over the group (one all-reduce of `n h`).
template <class C, class T>
void tp_moe_combine(ep_group<C>& g, const moe_routing<T>& r, std::span<const T> out, std::span<T> y, std::size_t h) {
  static_assert(!detail::device_group<C>, "loom: on a device group the routing is a loom::cuda::moe_routing (#include <loom/cuda/moe.hpp>)");
  moe_combine(r, out, y, h, tp_experts(r.experts, g));
  if (g.size() > 1) g.comm->all_reduce(y, reduce_op::sum);
}

//! Pipeline MoE's backward sums: the partial input gradient of the dispatch `dx` (`[n][h]`) and
//! the partial gates' gradient `dgate` (`[n][k]`) over the group (two all-reduces).
template <class C, class T>
void tp_moe_backward_sum(ep_group<C>& g, std::span<T> dx, std::span<T> dgate) {
  if (g.size() == 1) return;
  g.comm->all_reduce(dx, reduce_op::sum);
  g.comm->all_reduce(dgate, reduce_op::sum);
}

//! FSMoE-style overlap (Pan et al., "FSMoE: A Flexible and Scalable Training System for Sparse
//! Mixture-of-Experts Models", ASPLOS 2025) on non-blocking collectives: the slots are cut into
//! `chunks` pieces along the capacity; while the local experts compute piece i, the dispatch
//! all-to-all of piece i + 1 and the combine all-to-all of piece i - 1 are in flight.
//! `expert(e, in, out, rows)` runs local expert `e` (0..E/ep-1) on `rows` rows (`in`, `out`:
//! `rows x h` elements) and must treat rows independently (a linear layer, an MLP per token; a
//! weight gradient is taken afterwards, over `rows_in`). `slots` (`[E][C][h]`) goes out, `back`
//! (`[E][C][h]`) receives the experts' results for this rank's slots, and `rows_in` / `rows_out`
//! (`[E/ep][ep][C][h]`) hold what the local experts read and wrote, as `ep_to_experts` /
//! `ep_from_experts` lay them out, so the results equal the unchunked exchange bit for bit.
//! `scratch` holds `4 E C h` elements (the pieces' send and receive buffers, both ways). Every
//! rank of the group posts the same collectives in the same order; 2 x chunks all-to-alls, flat
//! (a group with `node` and `cross` is refused). On a device group (`loom/cuda/moe.hpp`) the
//! packing is kernels on the group's (compute) stream, `expert` enqueues on that stream, and the
//! all-to-alls run on `g.exchange`'s communication stream: each waits for an event recorded after
//! its piece was packed, and the compute stream waits for its event before unpacking.
template <class C, class T, class Expert>
void ep_overlapped(ep_group<C>& g, int experts, std::size_t capacity, std::size_t h, int chunks, std::span<const T> slots, std::span<T> back,
                   std::span<T> rows_in, std::span<T> rows_out, std::span<T> scratch, Expert&& expert) {
  const int ep = g.size();
  if (std::string rule = ep_rule(experts, ep); !rule.empty()) throw config_error(rule);
  if (chunks < 1) throw config_error("moe: the overlap needs >= 1 chunk (got " + std::to_string(chunks) + ")");
  if (g.node != nullptr || g.cross != nullptr)
    throw config_error("moe: the overlapped exchange is flat (one non-blocking all-to-all per piece): give it a group without node and cross");
  using space = detail::moe_space<C>;
  const std::size_t E = static_cast<std::size_t>(experts), all = E * capacity * h, P = static_cast<std::size_t>(ep);
  const auto L = static_cast<std::size_t>(experts / ep);
  if (scratch.size() < 4 * all) throw config_error("moe: the overlap's scratch holds " + std::to_string(scratch.size()) + " elements, it needs 4 E C h = " + std::to_string(4 * all));
  T* sd = scratch.data();        // dispatch send: the pieces one after another, each [E][c][h]
  T* rd = sd + all;              // dispatch receive: each piece [ep][E/ep][c][h]
  T* sc = rd + all;              // combine send: each piece [ep][E/ep][c][h]
  T* rc = sc + all;              // combine receive: each piece [E][c][h]
  const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(chunks), std::max<std::size_t>(capacity, 1)));
  auto lo = [&](int p) { return capacity * static_cast<std::size_t>(p) / static_cast<std::size_t>(n); };
  auto base = [&](int p) { return E * lo(p) * h; };  // a piece's offset in each buffer
  typename space::overlap_state st{};
  std::vector<typename space::request> dispatch(static_cast<std::size_t>(n)), combine(static_cast<std::size_t>(n));
  // Piece p's exchange from `from` into `to` (`E c h` elements each).
  auto exchange = [&](int p, const T* from, T* to, typename space::request& r) {
    const std::size_t c = lo(p + 1) - lo(p);
    if (ep == 1) space::copy(g.comm, std::span<const T>(from + base(p), E * c * h), std::span<T>(to + base(p), E * c * h));
    else r = space::post(g, st, std::span<const T>(from + base(p), E * c * h), std::span<T>(to + base(p), E * c * h));
  };
  auto post_dispatch = [&](int p) {  // rows [c0, c0 + c) of every expert's slots, packed [E][c][h]
    const std::size_t c0 = lo(p), c = lo(p + 1) - c0;
    space::transpose(g.comm, block_transpose<T>{slots.data() + c0 * h, sd + base(p), 1, E, c * h, capacity * h, c * h});
    exchange(p, sd, rd, dispatch[static_cast<std::size_t>(p)]);
  };
  auto finish_combine = [&](int p) {
    const std::size_t c0 = lo(p), c = lo(p + 1) - c0;
    if (ep > 1) space::wait(g, st, combine[static_cast<std::size_t>(p)]);
    space::transpose(g.comm, block_transpose<T>{rc + base(p), back.data() + c0 * h, 1, E, c * h, c * h, capacity * h});
  };
  if (n > 0) post_dispatch(0);
  for (int p = 0; p < n; ++p) {
    if (p + 1 < n) post_dispatch(p + 1);
    if (ep > 1) space::wait(g, st, dispatch[static_cast<std::size_t>(p)]);
    const std::size_t c0 = lo(p), c = lo(p + 1) - c0;
    // The received piece [src][E/ep][c][h] into rows_in ([E/ep][src][C][h], rows c0..), the local
    // experts on it, rows_out into the combine piece.
    space::transpose(g.comm, block_transpose<T>{rd + base(p), rows_in.data() + c0 * h, P, L, c * h, c * h, capacity * h});
    for (std::size_t src = 0; src < P; ++src)
      for (std::size_t e = 0; e < L; ++e) {
        const std::size_t at = ((e * P + src) * capacity + c0) * h;
        expert(static_cast<int>(e), std::span<const T>(rows_in.data() + at, c * h), std::span<T>(rows_out.data() + at, c * h), c);
      }
    space::transpose(g.comm, block_transpose<T>{rows_out.data() + c0 * h, sc + base(p), L, P, c * h, capacity * h, c * h});
    exchange(p, sc, rc, combine[static_cast<std::size_t>(p)]);
    if (p > 0) finish_combine(p - 1);
  }
  if (n > 0) finish_combine(n - 1);
}

//! Tutel's adaptive parallelism (Hwang et al., "Tutel: Adaptive Mixture-of-Experts at Scale",
//! MLSys 2023, §3.1; read from microsoft/tutel at 82af7aad, `tutel/impls/moe_layer.py`
//! `MOELayer.forward` and `tutel/experts/ffn.py`; loom's notes:
//! `tools/moe-reference/tutel-adaptive-r-notes.md`). When the E experts are fewer than the W ranks
//! of the expert-parallel group (W a multiple of E), each expert spans `S = W / E` ranks: rank `w`
//! serves expert `w / S` and holds slice `w % S` of its hidden dimension (the rows `[j H/S,
//! (j+1) H/S)` of both FFN matrices, stored hidden-major). That layout never changes; the degree
//! `r` (0, or a divisor of S) only chooses what a step gathers and where the tokens go, so it can
//! switch per step without moving parameters:
//! - `r >= 1`: the expert's S ranks form r gather groups of `g = S / r` consecutive ranks
//!   (`ep_adaptive_split`); each all-gathers its g slices, so it holds H/r hidden rows. The dispatch
//!   buffer `[E][C][h]` is repeated r times along the capacity and sent as W equal chunks: rank
//!   `j` of expert `e` receives copy `j / g`, slot rows `[(j % g) C/g, (j % g + 1) C/g)` of every
//!   source (`ep_adaptive_to_experts`, rows `[W][C/g][h]`, source-major). The g ranks of a group
//!   split the tokens, the r groups the hidden dimension. Each rank returns its partial output
//!   over its H/r rows, and every source sums the r copies in copy order
//!   (`ep_adaptive_from_experts`). r = S is pure model parallelism (no gather), r = 1 pure data
//!   parallelism inside the expert (the whole expert gathered on each of its ranks).
//! - `r = 0`: every rank all-gathers every slice over the whole group (every expert whole) and runs
//!   them on its own dispatch buffer: no all-to-all.
//! The backward is the same two calls: the combine gradient goes out through
//! `ep_adaptive_to_experts` (the sum's gradient is a copy per copy) and the input gradients come
//! back through `ep_adaptive_from_experts` (the repeat's gradient is the sum of the copies); the
//! gathers' backward is a reduce-scatter of the weight gradients over the same gather group.
//! The capacity must divide by g for every r: route with `moe_options::alignment = S` (Tutel's
//! `alignment = sharded_count`). The r partial sums reassociate the hidden dimension's sum, so
//! different degrees agree within rounding (1e-12 relative in double), not bit for bit.
struct ep_adaptive {
  int ranks = 1;    //!< W, the expert-parallel group's ranks
  int experts = 1;  //!< E, a divisor of W
  int degree = 0;   //!< r: 0 or a divisor of S
  //! S = W / E, the ranks (and hidden slices) per expert.
  int shards() const { return ranks / experts; }
  //! The gather group's ranks: W for r = 0, else g = S / r.
  int group() const { return degree == 0 ? ranks : shards() / degree; }
};

//! The rule `a` breaks, in one line, or "".
inline std::string ep_adaptive_rule(const ep_adaptive& a) {
  if (a.experts < 1 || a.ranks < 1 || a.ranks % a.experts != 0)
    return "moe: adaptive parallelism needs the " + std::to_string(a.ranks) + " expert-parallel ranks to be a multiple of the " +
           std::to_string(a.experts) + " experts";
  if (a.degree < 0 || (a.degree > 0 && a.shards() % a.degree != 0))
    return "moe: the adaptive degree r must be 0 or a divisor of the " + std::to_string(a.shards()) + " ranks per expert (got " +
           std::to_string(a.degree) + ")";
  return {};
}

//! The valid degrees for E experts over W ranks: 0, then the divisors of S in increasing order.
inline std::vector<int> ep_adaptive_degrees(int experts, int ranks) {
  std::vector<int> out{0};
  const int S = ranks / experts;
  for (int r = 1; r <= S; ++r)
    if (S % r == 0) out.push_back(r);
  return out;
}

//! The colour and key that split the expert-parallel group into `a`'s gather groups (`r = 0`: the
//! whole group; else g consecutive ranks).
inline std::pair<int, int> ep_adaptive_split(const ep_adaptive& a, int rank) {
  const int g = a.group();
  return {rank / g, rank % g};
}

//! Elements one rank sends over its links per step and MoE layer under `a` (the ring algorithm's
//! bus volume, as `loom::counted` counts it), for capacity C, model width h and P parameters per
//! expert: the gather and its reduce-scatter, `2 (g - 1) P / S` (r = 0: g = W), and for r >= 1 the
//! four all-to-alls of `r E C h` elements each, `4 r E C h (W - 1) / W`.
inline double ep_adaptive_volume(const ep_adaptive& a, std::size_t capacity, std::size_t h, std::size_t params_per_expert) {
  const double W = a.ranks, g = a.group(), slice = static_cast<double>(params_per_expert) / a.shards();
  double v = 2 * (g - 1) * slice;
  if (a.degree > 0) v += 4.0 * a.degree * a.experts * static_cast<double>(capacity) * static_cast<double>(h) * (W - 1) / W;
  return v;
}

//! loom's rule for the degree: the valid r with the least `ep_adaptive_volume`, ties to the larger
//! r (fewer gathered parameters held; r = 0 holds every expert).
inline int ep_adaptive_choose(int experts, int ranks, std::size_t capacity, std::size_t h, std::size_t params_per_expert) {
  int best = 0;
  double least = 0;
  for (int r : ep_adaptive_degrees(experts, ranks)) {
    const double v = ep_adaptive_volume({ranks, experts, r}, capacity, h, params_per_expert);
    if (r == 0 || v <= least) {
      best = r;
      least = v;
    }
  }
  return best;
}

namespace detail {
inline void check_adaptive(const ep_adaptive& a, int group_size, std::size_t capacity) {
  if (std::string rule = ep_adaptive_rule(a); !rule.empty()) throw config_error(rule);
  if (a.ranks != group_size)
    throw config_error("moe: adaptive parallelism over " + std::to_string(a.ranks) + " ranks on an expert-parallel group of " + std::to_string(group_size));
  if (a.degree > 0 && capacity % static_cast<std::size_t>(a.group()) != 0)
    throw config_error("moe: the capacity " + std::to_string(capacity) + " does not split over the " + std::to_string(a.group()) +
                       " ranks of a gather group (route with alignment " + std::to_string(a.shards()) + ")");
}
}  // namespace detail

//! Sends the slots (`[E][C][h]`: a dispatch buffer, or the combine's gradient) to the experts'
//! ranks under `a` (see `ep_adaptive`): `rows` gets `[W][C/g][h]` (r >= 1: the chunk of every
//! source, source-major; r = 0: the slots themselves, `[E][C][h]`). `scratch` holds `r E C h`
//! elements. One all-to-all for r >= 1, none for r = 0; hierarchical (Tutel's 2D) when `g` has
//! `node` and `cross`. Device groups as for `ep_to_experts` (the copies are kernels).
template <class C, class T>
void ep_adaptive_to_experts(ep_group<C>& g, const ep_adaptive& a, std::size_t capacity, std::size_t h, std::span<const T> slots, std::span<T> scratch,
                            std::span<T> rows) {
  detail::check_adaptive(a, g.size(), capacity);
  using space = detail::moe_space<C>;
  if (a.degree == 0) {
    space::copy(g.comm, slots, rows);
    return;
  }
  // Destination w = e S + q g + j (expert e, copy q, part j) gets rows [j C/g, (j+1) C/g) of
  // expert e's slots: copy q of every expert's C h elements lands at (e r + q) C h.
  const auto E = static_cast<std::size_t>(a.experts), r = static_cast<std::size_t>(a.degree), block = capacity * h;
  for (std::size_t q = 0; q < r; ++q)
    space::transpose(g.comm, block_transpose<T>{slots.data(), scratch.data() + q * block, 1, E, block, block, r * block});
  detail::ep_all_to_all(g, scratch, rows);
}

//! The way back: `rows` (`[W][C/g][h]`, this rank's partial outputs or input gradients per source;
//! r = 0: `[E][C][h]`) to `slots` (`[E][C][h]`), each slot the sum of its r copies in copy order
//! (`((c_0 + c_1) + ...)`). `scratch` holds `r E C h` elements. One all-to-all for r >= 1,
//! hierarchical when `g` has `node` and `cross`: then it clobbers `rows` (as the exchange clobbers
//! its input; the flat one leaves `rows` as it was). Device groups as for `ep_to_experts`.
template <class C, class T>
void ep_adaptive_from_experts(ep_group<C>& g, const ep_adaptive& a, std::size_t capacity, std::size_t h, std::span<T> rows, std::span<T> scratch,
                              std::span<T> slots) {
  detail::check_adaptive(a, g.size(), capacity);
  using space = detail::moe_space<C>;
  if (a.degree == 0) {
    space::copy(g.comm, std::span<const T>(rows), slots);
    return;
  }
  detail::ep_all_to_all(g, rows, scratch);  // chunk w: what rank w computed for this rank's slots
  const auto E = static_cast<std::size_t>(a.experts), r = static_cast<std::size_t>(a.degree), block = capacity * h;
  for (std::size_t q = 0; q < r; ++q)  // copy 0 assigns, the others add, in copy order
    space::transpose(g.comm, block_transpose<T>{scratch.data() + q * block, slots.data(), 1, E, block, r * block, block, q > 0});
}

}  // namespace loom
