// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The buffer plan: how many per-microbatch buffers (slots) each of a rank's virtual stages
//! needs to run a lowered schedule, computed by walking the rank's program once, in the order
//! the executor runs it. The executor allocates exactly these slots when it is built and never
//! allocates during a step; for a `static_schedule` the counts are compile-time constants
//! (`static_buffer_plan`).
//!
//! Slot lifetimes (the executor's; ARCHITECTURE.md "Memory" counts the same stash lifetime with
//! `mem_w_ratio = 1`):
//! - *input* (stage `s > 0`): the activation entering `(mb, s)`. Taken when its receive is posted
//!   (receives are posted up to `recv_ahead` ahead of their place in the program) or, when stage
//!   `s-1` runs on the same rank, by `F(mb, s-1)`; released by `W(mb, s)` or `BW(mb, s)`.
//! - *stash*: taken by `F(mb, s)`, released with the input slot.
//! - *grad* (stage `s < S-1`): the gradient of the output of `(mb, s)`. Taken when its receive is
//!   posted or by the backward of `(mb, s+1)` on the same rank; released by `B/BW(mb, s)`.
//! - *send*: one per send of the step (activation or gradient), released when the step's sends
//!   have completed. A send buffer must stay valid until the receiver has taken it, which depends
//!   on the other ranks' progress; one slot per send keeps every send independent of that, so
//!   sends never wait on each other and the lowered program runs as `validate` replays it.
//! - *wgrad* (deterministic mode): per-microbatch weight-gradient scratch held until every earlier
//!   microbatch of the stage has been folded into the accumulator (a reorder buffer).
//! - *copy_recv* (deterministic mode, two-direction schedules): weight-gradient buffers received
//!   after the step from the rank holding the other copy of the stage (see "Two copies" below).
//! - *host input*, *host stash* (programs with host copies, `op::offload`/`op::reload`): host
//!   memory for an offloaded activation. `OFFLOAD(mb, s)` takes a host slot of each kind (no input
//!   on the first stage) and releases the device input and stash slots of `(mb, s)`;
//!   `RELOAD(mb, s)` takes device slots again and releases the host ones.
//! A vocabulary-parallel schedule's passes (`S`, `T`, `IF`, `IB`) and messages take no slots here:
//! the executor holds their buffers per microbatch (`loom::pipeline`'s vocabulary layers).
//!
//! Two copies. On a two-direction schedule (DualPipe, Chimera, BitPipe) virtual stage `s` of path
//! 0 and virtual stage `s` of path 1 are copies of the same model chunk, and each microbatch's
//! weight gradient is computed by the copy of its own direction. Deterministic mode folds all `m`
//! contributions into one sum in microbatch order, `((0 + g(0)) + g(1)) + ... + g(m-1)`, the order
//! of the single-rank reference. The fold sequence of a stage is then every microbatch, not only
//! those of its direction:
//! - both copies on this rank: one reorder buffer folds both copies' contributions into the copy
//!   of path 0; after the step it is copied to the copy of path 1;
//! - the other copy on another rank: the fold runs while the next microbatch in order is this
//!   copy's, and stops at the first one of the other direction. Let `k` be the first microbatch
//!   whose direction differs from microbatch 0's (`k = m` if none). The copy that owns microbatch
//!   0 (the *leader*) folds `g(0) .. g(k-1)`; every contribution `g(j)`, `j >= k`, stays in its
//!   wgrad slot until the step ends. Then the leader sends its prefix sum and its held slots, the
//!   other copy sends its held slots, and both fold the same values in the same order, so both
//!   copies end bitwise equal to each other and to the reference. Memory: the held slots (this
//!   copy's microbatches `j >= k`) plus `copy_recv` buffers (the other copy's microbatches
//!   `j >= k`, plus one for the prefix on the non-leader): at the end of the step a stage pair
//!   holds `2(m - k) + 1` weight-gradient buffers over its two ranks (each held slot is also
//!   received by the other side), at most `2m - 1` (when microbatch 1 already changes direction,
//!   as in Chimera), `2 floor(m/2) + 1` for DualPipe, whose first `ceil(m/2)` microbatches share a
//!   direction. The default mode needs one extra buffer per copy instead.

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/stage/stage.hpp"

namespace loom {

//! How many receives the executor keeps posted ahead of the program by default.
inline constexpr int default_recv_ahead = 2;

//! Slot counts of one local virtual stage (see the file comment).
struct stage_slots {
  stage_id id{};     //!< the virtual stage
  int input = 0;     //!< input-activation slots (0 on the first stage: it reads the user's batch)
  int stash = 0;     //!< stash slots
  int grad = 0;      //!< output-gradient slots (0 on the last stage: it is seeded)
  int send_act = 0;  //!< activation sends per step
  int send_grad = 0; //!< gradient sends per step
  int wgrad = 0;     //!< deterministic-mode weight-gradient scratch slots
  int copy_recv = 0; //!< deterministic-mode buffers received from the other copy's rank (two directions)
  int host_input = 0;  //!< host slots for offloaded input activations
  int host_stash = 0;  //!< host slots for offloaded stashes
  friend constexpr bool operator==(const stage_slots&, const stage_slots&) = default;
};

//! The buffer plan of one rank (see the file comment).
struct buffer_plan {
  int rank = 0;                     //!< the rank planned for
  int recv_ahead = default_recv_ahead;  //!< receives posted ahead
  int stages = 0;                   //!< S
  int directions = 1;               //!< paths
  std::vector<stage_slots> local;   //!< this rank's virtual stages, by (direction, stage)
  std::vector<int> local_index;     //!< `[direction * S + stage]` -> index in `local`, or -1
  std::vector<std::size_t> recv_positions;  //!< program positions of the receives, in order

  //! Index in `local` of virtual stage `s` of path `dir`, or -1 when it is not on this rank.
  constexpr int index_of(int dir, int s) const {
    return local_index[static_cast<std::size_t>(dir * stages + s)];
  }
  //! Stash slots over all local stages: the rank's live microbatch activations at the peak.
  constexpr int total_stash() const {
    int n = 0;
    for (auto const& l : local) n += l.stash;
    return n;
  }
};

namespace detail {

//! Deterministic folding on two-direction schedules (see "Two copies" in the file comment): the
//! first microbatch whose direction differs from microbatch 0's, or `m` when all share one.
constexpr int first_direction_change(const schedule& s) {
  int k = 1;
  while (k < s.microbatches && s.direction_of(k) == s.direction_of(0)) ++k;
  return s.microbatches < 1 ? 0 : k;
}

//! The rank holding the other copy of virtual stage `stage` of path `dir` on a two-direction
//! schedule, or -1 on a one-direction schedule.
constexpr int twin_rank(const schedule& s, int dir, int stage) {
  if (s.directions != 2) return -1;
  return s.stage_to_rank[static_cast<std::size_t>((1 - dir) * s.stages + stage)];
}

//! Walks `lowered` (a lowered schedule) for `rank` and counts slots. Throws `schedule_error` if
//! the program names a stage that is not on this rank or a receive the schedule cannot explain.
constexpr buffer_plan plan_buffers(const schedule& lowered, int rank, int recv_ahead) {
  if (recv_ahead < 1)
    throw config_error("recv_ahead must be >= 1 (got " + to_text(recv_ahead) + ")");
  if (rank < 0 || rank >= lowered.ranks)
    throw config_error("rank " + to_text(rank) + " is outside the schedule's ranks 0.." + to_text(lowered.ranks - 1));
  buffer_plan p;
  p.rank = rank;
  p.recv_ahead = recv_ahead;
  p.stages = lowered.stages;
  p.directions = lowered.directions;
  const int S = lowered.stages, D = lowered.directions, M = lowered.microbatches;
  p.local_index.assign(static_cast<std::size_t>(S * D), -1);
  for (int d = 0; d < D; ++d)
    for (int s = 0; s < S; ++s)
      if (lowered.stage_to_rank[static_cast<std::size_t>(d * S + s)] == rank) {
        p.local_index[static_cast<std::size_t>(d * S + s)] = static_cast<int>(p.local.size());
        p.local.push_back(stage_slots{.id = {s, d}});
      }
  const auto& prog = lowered.programs[static_cast<std::size_t>(rank)];
  for (std::size_t i = 0; i < prog.size(); ++i)
    if (prog[i].kind == op::recv) p.recv_positions.push_back(i);

  const auto L = p.local.size();
  enum pool { in_pool, stash_pool, grad_pool, wgrad_pool, host_in_pool, host_stash_pool, pools };
  std::vector<int> live(L * pools, 0);
  auto local_of = [&](int mb, int s) -> std::size_t {
    int li = s >= 0 && s < S ? p.index_of(lowered.direction_of(mb), s) : -1;
    if (li < 0)
      throw schedule_error("rank " + to_text(rank) + " runs microbatch " + to_text(mb) + " on stage " + to_text(s) +
                           ", which is not placed on it");
    return static_cast<std::size_t>(li);
  };
  auto field = [&](std::size_t li, int pl) -> int& {
    auto& l = p.local[li];
    switch (pl) {
      case in_pool: return l.input;
      case stash_pool: return l.stash;
      case grad_pool: return l.grad;
      case wgrad_pool: return l.wgrad;
      case host_in_pool: return l.host_input;
      default: return l.host_stash;
    }
  };
  auto take = [&](std::size_t li, int pl) {
    int& n = live[li * pools + static_cast<std::size_t>(pl)];
    ++n;
    if (n > field(li, pl)) field(li, pl) = n;
  };
  auto give = [&](std::size_t li, int pl) { --live[li * pools + static_cast<std::size_t>(pl)]; };

  // Deterministic folding. Every local stage folds into its *leader*: itself, or on a
  // two-direction schedule the local copy of path 0 when both copies are here. The leader's fold
  // sequence is the microbatches of its direction (one direction) or all of them (two); a
  // contribution computed on another rank never arrives during the step, so it stops the fold.
  const bool paired = D == 2;
  std::vector<std::size_t> leader(L, 0);
  for (std::size_t li = 0; li < L; ++li) {
    leader[li] = li;
    if (paired) {
      int l0 = p.index_of(0, p.local[li].id.stage);
      if (l0 >= 0) leader[li] = static_cast<std::size_t>(l0);
    }
  }
  std::vector<char> contributed(L * static_cast<std::size_t>(M), 0);
  std::vector<int> next_fold(L, 0);
  auto skip_out_of_sequence = [&](std::size_t li) {
    if (paired) return;
    while (next_fold[li] < M && lowered.direction_of(next_fold[li]) != p.local[li].id.direction) ++next_fold[li];
  };
  for (std::size_t li = 0; li < L; ++li) skip_out_of_sequence(li);
  auto contribute = [&](std::size_t li, int mb) {
    take(li, wgrad_pool);
    const std::size_t ld = leader[li];
    const int s = p.local[ld].id.stage;
    contributed[ld * static_cast<std::size_t>(M) + static_cast<std::size_t>(mb)] = 1;
    while (next_fold[ld] < M && contributed[ld * static_cast<std::size_t>(M) + static_cast<std::size_t>(next_fold[ld])]) {
      give(local_of(next_fold[ld], s), wgrad_pool);
      ++next_fold[ld];
      skip_out_of_sequence(ld);
    }
  };

  auto post = [&](std::size_t k) {
    if (k >= p.recv_positions.size()) return;
    const action& r = prog[p.recv_positions[k]];
    if (is_vocab(r.what)) return;  // the vocabulary layers' buffers are the executor's, per microbatch
    if (r.what == payload::activation) take(local_of(r.mb, r.stage + 1), in_pool);
    else take(local_of(r.mb, r.stage - 1), grad_pool);
  };
  auto forward_half = [&](int mb, int s) {
    auto li = local_of(mb, s);
    take(li, stash_pool);
    if (s + 1 < S) {
      if (lowered.rank_of(mb, s + 1) == rank) take(local_of(mb, s + 1), in_pool);
      else ++p.local[li].send_act;
    }
  };
  auto backward_half = [&](op kind, int mb, int s) {
    auto li = local_of(mb, s);
    if (s > 0) {
      if (lowered.rank_of(mb, s - 1) == rank) take(local_of(mb, s - 1), grad_pool);
      else ++p.local[li].send_grad;
    }
    if (s + 1 < S) give(li, grad_pool);
    if (kind == op::BW) {
      contribute(li, mb);
      if (s > 0) give(li, in_pool);
      give(li, stash_pool);
    }
  };

  for (std::size_t k = 0; k < static_cast<std::size_t>(recv_ahead); ++k) post(k);
  std::size_t recv_k = 0;
  for (const action& a : prog) {
    switch (a.kind) {
      case op::recv: post(recv_k++ + static_cast<std::size_t>(recv_ahead)); break;
      case op::send: break;
      case op::F: forward_half(a.mb, a.stage); break;
      case op::B:
      case op::BW: backward_half(a.kind, a.mb, a.stage); break;
      case op::W: {
        auto li = local_of(a.mb, a.stage);
        contribute(li, a.mb);
        if (a.stage > 0) give(li, in_pool);
        give(li, stash_pool);
        break;
      }
      case op::FB:
        forward_half(a.mb, a.stage);
        backward_half(a.bkind, a.bmb, a.bstage);
        break;
      case op::offload:
      case op::reload: {
        auto li = local_of(a.mb, a.stage);
        const bool out = a.kind == op::offload;
        if (a.stage > 0) {
          take(li, out ? host_in_pool : in_pool);
          give(li, out ? in_pool : host_in_pool);
        }
        take(li, out ? host_stash_pool : stash_pool);
        give(li, out ? stash_pool : host_stash_pool);
        break;
      }
      case op::S:
      case op::T:
      case op::IF:
      case op::IB: break;  // their buffers are per microbatch (`vocab_buffers`), not slots
    }
  }
  // Two copies on different ranks: the buffers received from the other copy after the step.
  if (paired) {
    const int k = first_direction_change(lowered);
    for (auto& l : p.local) {
      const int twin = twin_rank(lowered, l.id.direction, l.id.stage);
      if (twin == rank) continue;
      const int other = 1 - l.id.direction;
      for (int j = k; j < M; ++j) l.copy_recv += lowered.direction_of(j) == other ? 1 : 0;
      if (lowered.direction_of(0) == other) ++l.copy_recv;  // the leader's prefix sum
    }
  }
  return p;
}

}  // namespace detail

//! The buffer plan of `rank` for schedule `s` (generated or lowered; it is lowered here if it
//! holds no send/recv and spans several ranks), with `recv_ahead` receives posted ahead.
constexpr buffer_plan plan_buffers(const schedule& s, int rank, int recv_ahead = default_recv_ahead) {
  bool lowered = false;
  for (auto const& prog : s.programs)
    for (auto const& a : prog)
      if (is_transfer(a.kind)) lowered = true;
  if (lowered || s.ranks == 1) return detail::plan_buffers(s, rank, recv_ahead);
  return detail::plan_buffers(lower(s), rank, recv_ahead);
}

//! The buffer plan of rank `Rank` of a `static_schedule` as compile-time constants:
//! `local` (a `std::array<stage_slots, N>`), `recvs` and `recv_ahead`.
template <class Sched, int Rank, int RecvAhead = default_recv_ahead>
struct static_buffer_plan {
 private:
  static constexpr buffer_plan make() {
    return detail::plan_buffers(lower(typename Sched::family{}.generate(Sched::shape_v)), Rank, RecvAhead);
  }
  static constexpr auto materialise() {
    std::array<stage_slots, make().local.size()> out{};
    auto p = make();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p.local[i];
    return out;
  }

 public:
  static constexpr int recv_ahead = RecvAhead;                //!< receives posted ahead
  static constexpr auto local = materialise();                //!< per local stage slot counts
  static constexpr std::size_t recvs = make().recv_positions.size();  //!< receives per step
};

}  // namespace loom
