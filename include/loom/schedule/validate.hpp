// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The validator. A schedule is valid when
//!  1. its placement is well formed and every action runs on the rank its stage is placed on
//!     (stage -> rank is a function);
//!  2. every (microbatch, stage) has exactly one `F` and exactly one backward: `B` + `W`, or
//!     `BW` (an `FB` counts as its two halves);
//!  3. every dependency is respected: replaying the programs in order with blocking waits on
//!     dependencies finishes (no deadlock);
//!  4. if the programs are lowered (contain send/recv): replaying them with asynchronous sends,
//!     blocking receives and tagless per-peer FIFO matching finishes, every receive gets the
//!     item it names, every remote input is received before it is consumed, every item is
//!     sent after it is produced, and nothing is left in flight.
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

//! Rule 4: FIFO replay of lowered programs.
constexpr validation check_fifo(const schedule& s) {
  const int P = s.ranks, S = s.stages;
  const auto uP = static_cast<std::size_t>(P);
  const auto cells = static_cast<std::size_t>(s.microbatches) * static_cast<std::size_t>(S);
  auto idx = [S](int mb, int st) { return static_cast<std::size_t>(mb) * static_cast<std::size_t>(S) + static_cast<std::size_t>(st); };
  // Per rank: which items it holds (produced locally or received).
  std::vector<char> have_act(cells * uP, 0), have_grad(cells * uP, 0);
  auto holds = [&](int rank, payload w, int mb, int st) -> char& {
    auto i = static_cast<std::size_t>(rank) * cells + idx(mb, st);
    return w == payload::activation ? have_act[i] : have_grad[i];
  };
  std::vector<std::vector<action>> chan(uP * uP);
  std::vector<std::size_t> head(uP * uP, 0), pos(uP, 0);
  auto needs = [&](int rank, int mb, int st, op kind, std::size_t at) -> validation {
    // Remote inputs of a compute half must already be held.
    if (kind == op::F && st > 0 && s.rank_of(mb, st - 1) != rank && !holds(rank, payload::activation, mb, st - 1))
      return fail_at(s, rank, at, "consumes the activation of mb " + to_text(mb) + " stage " + to_text(st - 1) + " from rank " + to_text(s.rank_of(mb, st - 1)) + " before receiving it");
    if (is_input_backward(kind) && st + 1 < S && s.rank_of(mb, st + 1) != rank && !holds(rank, payload::gradient, mb, st + 1))
      return fail_at(s, rank, at, "consumes the gradient of mb " + to_text(mb) + " stage " + to_text(st + 1) + " from rank " + to_text(s.rank_of(mb, st + 1)) + " before receiving it");
    return {};
  };
  auto produce = [&](int rank, int mb, int st, op kind) {
    if (kind == op::F) holds(rank, payload::activation, mb, st) = 1;
    if (is_input_backward(kind)) holds(rank, payload::gradient, mb, st) = 1;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int rank = 0; rank < P; ++rank) {
      auto ur = static_cast<std::size_t>(rank);
      auto const& prog = s.programs[ur];
      while (pos[ur] < prog.size()) {
        const action& a = prog[pos[ur]];
        if (a.kind == op::send || a.kind == op::recv) {
          if (a.peer < 0 || a.peer >= P || a.peer == rank)
            return fail_at(s, rank, pos[ur], "names peer " + to_text(a.peer) + ", which is not another rank");
          if (a.mb < 0 || a.mb >= s.microbatches || a.stage < 0 || a.stage >= S)
            return fail_at(s, rank, pos[ur], "names a microbatch or stage out of range");
        }
        if (a.kind == op::send) {
          if (!holds(rank, a.what, a.mb, a.stage))
            return fail_at(s, rank, pos[ur], "sends an item this rank has not produced");
          chan[ur * uP + static_cast<std::size_t>(a.peer)].push_back(a);
        } else if (a.kind == op::recv) {
          auto c = static_cast<std::size_t>(a.peer) * uP + ur;
          if (head[c] == chan[c].size()) break;  // blocks
          const action& got = chan[c][head[c]++];
          if (got.what != a.what || got.mb != a.mb || got.stage != a.stage)
            return fail_at(s, rank, pos[ur], "the FIFO from rank " + to_text(a.peer) + " delivers " + to_string(got) + " here (tagless matching pairs them in order)");
          holds(rank, a.what, a.mb, a.stage) = 1;
        } else {
          if (auto v = needs(rank, a.mb, a.stage, a.kind, pos[ur]); !v.ok) return v;
          if (a.kind == op::FB)
            if (auto v = needs(rank, a.bmb, a.bstage, a.bkind, pos[ur]); !v.ok) return v;
          produce(rank, a.mb, a.stage, a.kind);
          if (a.kind == op::FB) produce(rank, a.bmb, a.bstage, a.bkind);
        }
        ++pos[ur];
        progress = true;
      }
    }
  }
  for (int rank = 0; rank < P; ++rank)
    if (pos[static_cast<std::size_t>(rank)] < s.programs[static_cast<std::size_t>(rank)].size())
      return fail_at(s, rank, pos[static_cast<std::size_t>(rank)], "deadlock: this receive never matches a send (blocking recv, tagless per-peer FIFO)");
  for (std::size_t c = 0; c < chan.size(); ++c)
    if (head[c] != chan[c].size())
      return fail_at(s, static_cast<int>(c / uP), 0, "rank " + to_text(static_cast<long long>(c / uP)) + " sends " + to_string(chan[c][head[c]]) + " that rank " + to_text(static_cast<long long>(c % uP)) + " never receives");
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

  // Rules 1 and 2: placement and counts, remembering where each action was first seen.
  const auto cells = static_cast<std::size_t>(M) * static_cast<std::size_t>(S);
  enum { kF, kB, kW, kBW, kinds };
  std::vector<unsigned char> count(cells * kinds, 0);
  std::vector<int> where_rank(cells * kinds, -1);
  std::vector<std::size_t> where_pos(cells * kinds, 0);
  bool lowered = false;
  auto note = [&](int rank, std::size_t pos, op kind, int mb, int st) -> validation {
    if (mb < 0 || mb >= M || st < 0 || st >= S)
      return fail_at(s, rank, pos, "microbatch " + to_text(mb) + " / stage " + to_text(st) + " is out of range (microbatches=" + to_text(M) + ", stages=" + to_text(S) + ")");
    if (s.rank_of(mb, st) != rank)
      return fail_at(s, rank, pos, "stage " + to_text(st) + " of microbatch " + to_text(mb) + " is placed on rank " + to_text(s.rank_of(mb, st)) + ", not here");
    int k = kind == op::F ? kF : kind == op::B ? kB : kind == op::W ? kW : kBW;
    auto i = (static_cast<std::size_t>(mb) * static_cast<std::size_t>(S) + static_cast<std::size_t>(st)) * kinds + static_cast<std::size_t>(k);
    if (count[i] == 1)
      return fail_at(s, rank, pos, "duplicates " + std::string(to_string(kind)) + " of microbatch " + to_text(mb) + " stage " + to_text(st) + ", already at rank " + to_text(where_rank[i]) + " position " + to_text(static_cast<long long>(where_pos[i])));
    count[i] = 1;
    where_rank[i] = rank;
    where_pos[i] = pos;
    return {};
  };
  for (int r = 0; r < P; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!is_compute(a.kind)) {
        lowered = true;
        continue;
      }
      if (a.kind == op::FB) {
        if (!is_input_backward(a.bkind)) return fail_at(s, r, i, "the backward half of an FB must be B or BW");
        if (auto v = note(r, i, op::F, a.mb, a.stage); !v.ok) return v;
        if (auto v = note(r, i, a.bkind, a.bmb, a.bstage); !v.ok) return v;
      } else if (auto v = note(r, i, a.kind, a.mb, a.stage); !v.ok) {
        return v;
      }
    }
  }
  for (int mb = 0; mb < M; ++mb)
    for (int st = 0; st < S; ++st) {
      auto base = (static_cast<std::size_t>(mb) * static_cast<std::size_t>(S) + static_cast<std::size_t>(st)) * kinds;
      std::string what = "microbatch " + to_text(mb) + " stage " + to_text(st) + " (rank " + to_text(s.rank_of(mb, st)) + ")";
      if (!count[base + kF]) return {false, what + " has no F\n" + format_programs(s)};
      bool split = count[base + kB] || count[base + kW];
      if (split && count[base + kBW])
        return fail_at(s, where_rank[base + kBW], where_pos[base + kBW], what + " has both a fused BW and a split B/W backward");
      if (!split && !count[base + kBW]) return {false, what + " has no backward (B+W or BW)\n" + format_programs(s)};
      if (split && !count[base + kB]) return fail_at(s, where_rank[base + kW], where_pos[base + kW], what + " has a W but no B");
      if (split && !count[base + kW]) return fail_at(s, where_rank[base + kB], where_pos[base + kB], what + " has a B but no W");
    }

  // Rule 3: dependency replay.
  simulation sim = simulate(s);
  if (!sim.ok) return {false, sim.error + "\n" + format_programs(s, sim.stuck_rank, sim.stuck_pos)};
  // Rule 4.
  if (lowered) return detail::check_fifo(s);
  return {};
}

//! `validate(s)`, throwing `schedule_error` with the message when it fails.
constexpr void require_valid(const schedule& s) {
  if (validation v = validate(s); !v.ok) throw schedule_error(v.message);
}

}  // namespace loom
