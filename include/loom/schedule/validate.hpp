// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The validator. A schedule is valid when
//!  1. its placement is well formed and every action runs on the rank its stage is placed on
//!     (stage -> rank is a function);
//!  2. every (microbatch, stage) has exactly one `F` and exactly one backward: `B` + `W`, or
//!     `BW` (an `FB` counts as its two halves);
//!  3. every dependency is respected: replaying the compute programs in order, with blocking
//!     waits on dependencies, finishes (no deadlock);
//!  4. if the programs are lowered (contain send/recv): replaying them as they would run —
//!     asynchronous sends, blocking receives, tagless per-peer FIFO matching — finishes; every
//!     receive gets the item it names; every input is produced (locally) or received (remotely)
//!     before it is consumed; every item is sent after it is produced and received exactly once.
//!     Rule 4 implies rule 3, so a lowered schedule is checked by the lowered replay alone (the
//!     dependency replay runs only to explain a failure).
//! Errors name the rank, the position and the action, and render the offending grid.

#include <cstddef>
#include <string>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/format.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! Outcome of `validate`: `ok`, or the first broken rule as a message.
struct validation {
  bool ok = true;
  std::string message;
  constexpr explicit operator bool() const { return ok; }
};

namespace detail {

constexpr validation fail_at(const schedule& s, int rank, std::size_t pos, std::string why) {
  std::string m = "rank " + to_text(rank) + ", position " + to_text(static_cast<long long>(pos));
  if (rank >= 0 && static_cast<std::size_t>(rank) < s.programs.size() && pos < s.programs[static_cast<std::size_t>(rank)].size())
    m += ", action " + to_string(s.programs[static_cast<std::size_t>(rank)][pos]);
  m += ": " + why + "\n" + format_programs(s, rank, pos);
  return {false, m};
}

//! Rule 4: replays lowered programs with asynchronous sends and blocking FIFO receives.
constexpr validation replay_lowered(const schedule& s) {
  const int P = s.ranks, S = s.stages, M = s.microbatches;
  const auto uP = static_cast<std::size_t>(P);
  const auto cells = static_cast<std::size_t>(M) * static_cast<std::size_t>(S);
  auto idx = [M](int mb, int st) { return cell(mb, st, M); };
  // Who produced / received each item (-1: nobody yet). Items have one producer and one consumer.
  std::vector<int> act_made(cells, -1), grad_made(cells, -1), act_got(cells, -1), grad_got(cells, -1);
  auto held = [&](int rank, payload w, std::size_t i) {
    return w == payload::activation ? (act_made[i] == rank || act_got[i] == rank) : (grad_made[i] == rank || grad_got[i] == rank);
  };
  // FIFO matching without storing channel contents: a send records its item's channel and its
  // index there; a receive must name the item whose index is the channel's next to deliver.
  // Items are coded cell * 2 + payload.
  std::vector<std::size_t> sent(uP * uP, 0), head(uP * uP, 0), pos(uP, 0);
  std::vector<std::size_t> item_chan(cells * 2, ~std::size_t{0}), item_index(cells * 2, 0);
  // The item sent `index`-th on channel `c` (error path only).
  auto item_at = [&](std::size_t c, std::size_t index) {
    for (std::size_t code = 0; code < item_chan.size(); ++code)
      if (item_chan[code] == c && item_index[code] == index) return code;
    return ~std::size_t{0};
  };
  std::vector<int> waiter(uP * uP, -1);
  std::vector<char> queued(uP, 1);
  std::vector<int> work;
  for (int r = P - 1; r >= 0; --r) work.push_back(r);

  auto missing = [&](int rank, std::size_t at, payload w, int mb, int st, int from) -> validation {
    std::string item = std::string(w == payload::activation ? "the activation" : "the gradient") + " of mb " +
                       to_text(mb) + " stage " + to_text(st);
    if (from == rank) return fail_at(s, rank, at, "needs " + item + " before this rank has produced it");
    return fail_at(s, rank, at, "needs " + item + " from rank " + to_text(from) + " before receiving it");
  };
  // Runs one compute half: true if its inputs are held (then records what it produces).
  auto run_half = [&](int rank, op kind, int mb, int st) -> bool {
    const std::size_t i = idx(mb, st);
    if (kind == op::F) {
      if (st > 0 && !held(rank, payload::activation, i - static_cast<std::size_t>(M))) return false;
      act_made[i] = rank;
    } else if (kind == op::W) {
      if (grad_made[i] != rank) return false;
    } else {
      if (act_made[i] != rank) return false;
      if (st + 1 < S && !held(rank, payload::gradient, i + static_cast<std::size_t>(M))) return false;
      grad_made[i] = rank;
    }
    return true;
  };
  // Why `run_half` refused (error path only).
  auto explain_half = [&](int rank, std::size_t at, op kind, int mb, int st) -> validation {
    if (kind == op::F) return missing(rank, at, payload::activation, mb, st - 1, s.rank_of(mb, st - 1));
    if (kind == op::W) return fail_at(s, rank, at, "runs before the B of the same microbatch and stage");
    if (act_made[idx(mb, st)] != rank) return fail_at(s, rank, at, "runs before the F of the same microbatch and stage");
    return missing(rank, at, payload::gradient, mb, st + 1, s.rank_of(mb, st + 1));
  };
  const auto uM = static_cast<unsigned>(M), uS = static_cast<unsigned>(S), uPu = static_cast<unsigned>(P);

  while (!work.empty()) {
    const int rank = work.back();
    work.pop_back();
    const auto ur = static_cast<std::size_t>(rank);
    queued[ur] = 0;
    auto const& prog = s.programs[ur];
    while (pos[ur] < prog.size()) {
      const std::size_t at = pos[ur];
      const action& a = prog[at];
      if (a.kind == op::send || a.kind == op::recv) {
        if (static_cast<unsigned>(a.peer) >= uPu || a.peer == rank)
          return fail_at(s, rank, at, "names peer " + to_text(a.peer) + ", which is not another rank");
        if (static_cast<unsigned>(a.mb) >= uM || static_cast<unsigned>(a.stage) >= uS)
          return fail_at(s, rank, at, "names a microbatch or stage out of range");
        const std::size_t code = idx(a.mb, a.stage) * 2 + (a.what == payload::gradient ? 1 : 0);
        if (a.kind == op::send) {
          if ((a.what == payload::activation ? act_made : grad_made)[idx(a.mb, a.stage)] != rank)
            return fail_at(s, rank, at, "sends an item before this rank has produced it");
          const auto c = ur * uP + static_cast<std::size_t>(a.peer);
          if (item_chan[code] != ~std::size_t{0}) return fail_at(s, rank, at, "sends an item that was already sent");
          item_chan[code] = c;
          item_index[code] = sent[c]++;
          if (int w = waiter[c]; w >= 0 && !queued[static_cast<std::size_t>(w)]) {
            queued[static_cast<std::size_t>(w)] = 1;
            work.push_back(w);
          }
        } else {
          const auto c = static_cast<std::size_t>(a.peer) * uP + ur;
          if (head[c] == sent[c]) {
            waiter[c] = rank;  // blocks until the peer sends on this channel
            break;
          }
          waiter[c] = -1;
          if (item_chan[code] != c || item_index[code] != head[c]) {
            const std::size_t got = item_at(c, head[c]);
            auto gcell = got / 2;
            int gst = static_cast<int>(gcell / static_cast<std::size_t>(M)), gmb = static_cast<int>(gcell % static_cast<std::size_t>(M));
            return fail_at(s, rank, at, "the FIFO from rank " + to_text(a.peer) + " delivers " + (got % 2 ? "the gradient" : "the activation") +
                                            " of mb " + to_text(gmb) + " stage " + to_text(gst) + " here (tagless matching pairs them in order)");
          }
          ++head[c];
          auto& by = a.what == payload::activation ? act_got[idx(a.mb, a.stage)] : grad_got[idx(a.mb, a.stage)];
          if (by >= 0) return fail_at(s, rank, at, "receives an item that rank " + to_text(by) + " already received");
          by = rank;
        }
      } else {
        const op first = a.kind == op::FB ? op::F : a.kind;
        if (!run_half(rank, first, a.mb, a.stage)) return explain_half(rank, at, first, a.mb, a.stage);
        if (a.kind == op::FB && !run_half(rank, a.bkind, a.bmb, a.bstage))
          return explain_half(rank, at, a.bkind, a.bmb, a.bstage);
      }
      ++pos[ur];
    }
  }
  for (std::size_t r = 0; r < uP; ++r)
    if (pos[r] < s.programs[r].size())
      return fail_at(s, static_cast<int>(r), pos[r], "deadlock: this receive never matches a send (asynchronous sends, blocking receives, tagless per-peer FIFO)");
  for (std::size_t c = 0; c < sent.size(); ++c)
    if (head[c] != sent[c]) {
      std::size_t code = item_at(c, head[c]);
      auto gcell = code / 2;
      return {false, "rank " + to_text(static_cast<long long>(c / uP)) + " sends " + (code % 2 ? "the gradient" : "the activation") +
                         " of mb " + to_text(static_cast<long long>(gcell % static_cast<std::size_t>(M))) + " stage " +
                         to_text(static_cast<long long>(gcell / static_cast<std::size_t>(M))) + " that rank " +
                         to_text(static_cast<long long>(c % uP)) + " never receives\n" + format_programs(s)};
    }
  return {};
}

//! Where (mb, st)'s action of `kind` first appears (error path only).
struct place {
  int rank = -1;
  std::size_t pos = 0;
};
constexpr place find_first(const schedule& s, op kind, int mb, int st) {
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    auto const& prog = s.programs[r];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      bool fb = a.kind == op::FB;
      if ((a.kind == kind && a.mb == mb && a.stage == st) || (fb && kind == op::F && a.mb == mb && a.stage == st) ||
          (fb && a.bkind == kind && a.bmb == mb && a.bstage == st))
        return {static_cast<int>(r), i};
    }
  }
  return {};
}

}  // namespace detail

//! Checks rules 1-4 above. Never throws; see `require_valid`.
constexpr validation validate(const schedule& s) {
  using detail::fail_at;
  using detail::to_text;
  const int P = s.ranks, S = s.stages, M = s.microbatches, D = s.directions;
  if (P < 1 || S < 1 || M < 1 || D < 1 || D > 2)
    return {false, "schedule needs ranks, stages and microbatches >= 1 and 1 or 2 directions (got ranks=" + to_text(P) + ", stages=" + to_text(S) + ", microbatches=" + to_text(M) + ", directions=" + to_text(D) + ")"};
  if (s.programs.size() != static_cast<std::size_t>(P))
    return {false, "schedule has " + to_text(static_cast<long long>(s.programs.size())) + " programs for " + to_text(P) + " ranks"};
  if (s.stage_to_rank.size() != static_cast<std::size_t>(D * S))
    return {false, "stage_to_rank has " + to_text(static_cast<long long>(s.stage_to_rank.size())) + " entries for " + to_text(D) + " direction(s) x " + to_text(S) + " stages"};
  for (std::size_t i = 0; i < s.stage_to_rank.size(); ++i)
    if (s.stage_to_rank[i] < 0 || s.stage_to_rank[i] >= P)
      return {false, "stage " + to_text(static_cast<long long>(i) % S) + " of direction " + to_text(static_cast<long long>(i) / S) + " is placed on rank " + to_text(s.stage_to_rank[i]) + ", outside 0.." + to_text(P - 1)};
  if (!s.mb_direction.empty()) {
    if (s.mb_direction.size() != static_cast<std::size_t>(M))
      return {false, "mb_direction has " + to_text(static_cast<long long>(s.mb_direction.size())) + " entries for " + to_text(M) + " microbatches"};
    for (std::size_t j = 0; j < s.mb_direction.size(); ++j)
      if (s.mb_direction[j] < 0 || s.mb_direction[j] >= D)
        return {false, "microbatch " + to_text(static_cast<long long>(j)) + " has direction " + to_text(s.mb_direction[j]) + ", outside 0.." + to_text(D - 1)};
  }

  // Rules 1 and 2: placement and counts (one bit per kind and cell).
  enum : unsigned char { kF = 1, kB = 2, kW = 4, kBW = 8 };
  std::vector<unsigned char> seen(static_cast<std::size_t>(M) * static_cast<std::size_t>(S), 0);
  bool lowered = false;
  auto note = [&](int rank, std::size_t pos, op kind, int mb, int st) -> bool {
    if (mb < 0 || mb >= M || st < 0 || st >= S || s.rank_of(mb, st) != rank) return false;
    unsigned char bit = kind == op::F ? kF : kind == op::B ? kB : kind == op::W ? kW : kBW;
    auto& cell = seen[detail::cell(mb, st, M)];
    if (cell & bit) return false;
    cell = static_cast<unsigned char>(cell | bit);
    (void)pos;
    return true;
  };
  // Explains why `note` refused (error path only).
  auto refusal = [&](int rank, std::size_t pos, op kind, int mb, int st) -> validation {
    if (mb < 0 || mb >= M || st < 0 || st >= S)
      return fail_at(s, rank, pos, "microbatch " + to_text(mb) + " / stage " + to_text(st) + " is out of range (microbatches=" + to_text(M) + ", stages=" + to_text(S) + ")");
    if (s.rank_of(mb, st) != rank)
      return fail_at(s, rank, pos, "stage " + to_text(st) + " of microbatch " + to_text(mb) + " is placed on rank " + to_text(s.rank_of(mb, st)) + ", not here");
    detail::place first = detail::find_first(s, kind, mb, st);
    return fail_at(s, rank, pos, "duplicates " + std::string(to_string(kind)) + " of microbatch " + to_text(mb) + " stage " + to_text(st) + ", already at rank " + to_text(first.rank) + " position " + to_text(static_cast<long long>(first.pos)));
  };
  for (int r = 0; r < P; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!is_compute(a.kind)) {
        lowered = true;
      } else if (a.kind == op::FB) {
        if (!is_input_backward(a.bkind)) return fail_at(s, r, i, "the backward half of an FB must be B or BW");
        if (!note(r, i, op::F, a.mb, a.stage)) return refusal(r, i, op::F, a.mb, a.stage);
        if (!note(r, i, a.bkind, a.bmb, a.bstage)) return refusal(r, i, a.bkind, a.bmb, a.bstage);
      } else if (!note(r, i, a.kind, a.mb, a.stage)) {
        return refusal(r, i, a.kind, a.mb, a.stage);
      }
    }
  }
  for (int st = 0; st < S; ++st)
    for (int mb = 0; mb < M; ++mb) {
      const unsigned char c = seen[detail::cell(mb, st, M)];
      if (c == (kF | kB | kW) || c == (kF | kBW)) continue;
      std::string what = "microbatch " + to_text(mb) + " stage " + to_text(st) + " (rank " + to_text(s.rank_of(mb, st)) + ")";
      auto at = [&](op kind) { return detail::find_first(s, kind, mb, st); };
      if (!(c & kF)) return {false, what + " has no F\n" + format_programs(s)};
      if ((c & kBW) && (c & (kB | kW))) {
        auto p = at(op::BW);
        return fail_at(s, p.rank, p.pos, what + " has both a fused BW and a split B/W backward");
      }
      if (!(c & (kB | kW | kBW))) return {false, what + " has no backward (B+W or BW)\n" + format_programs(s)};
      if (!(c & kB)) {
        auto p = at(op::W);
        return fail_at(s, p.rank, p.pos, what + " has a W but no B");
      }
      auto p = at(op::B);
      return fail_at(s, p.rank, p.pos, what + " has a B but no W");
    }

  if (lowered) {
    validation v = detail::replay_lowered(s);
    if (v.ok) return v;
    // Explain a failure by the compute schedule itself when it is the cause (rule 3).
    simulation sim = simulate(s);
    if (!sim.ok) return {false, sim.error + "\n" + format_programs(s, sim.stuck_rank, sim.stuck_pos)};
    return v;
  }
  simulation sim = simulate(s);  // rule 3
  if (!sim.ok) return {false, sim.error + "\n" + format_programs(s, sim.stuck_rank, sim.stuck_pos)};
  return {};
}

//! `validate(s)`, throwing `schedule_error` with the message when it fails.
constexpr void require_valid(const schedule& s) {
  if (validation v = validate(s); !v.ok) throw schedule_error(v.message);
}

}  // namespace loom
