// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Local search over the op orders of a schedule, scored by `loom::simulate` under real costs and
//! a per-rank activation limit: the improvement step shared by `zb-v` (cost-aware) and `zb-auto`.
//!
//! The search follows the simulated critical path (the chain of actions that bounds the longest
//! rank span) and tries two moves on each action of it, latest first: swap it with the previous
//! action of its rank (it starts one step earlier), and, for a `W`, move it later into its rank's
//! next idle gap or to the end (a deferred weight gradient fills a gap instead of delaying the
//! path: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1, the W's freedom that
//! makes zero bubble possible). The first move that improves the score is kept and the path
//! recomputed; it stops when no move on the path improves or the evaluation budget is spent.
//! Candidates that deadlock or exceed the limit are rejected, so the result is never worse than
//! its start. Applies to schedules of `F`, `B`, `W` and `BW` actions on any placement.

#include <cstddef>
#include <utility>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom::detail {

//! Score of a candidate under real costs: bubble rate first (the Zero Bubble paper's metric), then
//! the sum of per-rank spans (lets the search move along plateaus of the longest span towards
//! shorter secondary spans).
struct order_score {
  double bubble_rate = 2;
  double span_sum = 0;
  constexpr bool better_than(const order_score& o) const {
    if (bubble_rate < o.bubble_rate - 1e-12) return true;
    if (bubble_rate > o.bubble_rate + 1e-12) return false;
    return span_sum < o.span_sum - 1e-9;
  }
};

//! Simulates `s` under `k` (`loom::costs` or `loom::cost_model`); false if it deadlocks (the
//! simulator reports ok = false) or exceeds `limit` units of activation on some rank. On success
//! fills `out` and, if given, `sim`.
template <class Cost>
constexpr bool order_score_of(const schedule& s, const Cost& k, double limit, order_score& out, simulation* sim) {
  simulation r = simulate(s, k);
  if (!r.ok) return false;
  for (double v : r.peak_activation)
    if (v > limit + 1e-9) return false;
  out.bubble_rate = r.bubble_rate;
  out.span_sum = 0;
  for (double v : r.span) out.span_sum += v;
  if (sim) *sim = static_cast<simulation&&>(r);
  return true;
}

//! Whether `later` may run before `earlier` on one rank (F/B/W/BW actions): false if they belong
//! to one stream (same kind and stage), whose microbatch order the search keeps, or if `later`
//! depends, directly or through other passes, on `earlier` (same microbatch: a forward precedes
//! every later forward stage and every backward; a backward precedes every earlier backward stage
//! and the weight gradients of its stage and the earlier ones).
constexpr bool may_run_before(const action& earlier, const action& later) {
  if (earlier.kind == later.kind && earlier.stage == later.stage) return false;
  if (earlier.mb != later.mb) return true;
  const bool eb = is_input_backward(earlier.kind);
  switch (later.kind) {
    case op::F: return !(earlier.kind == op::F && earlier.stage < later.stage);
    case op::B:
    case op::BW: return earlier.kind != op::F && !(eb && earlier.stage > later.stage);
    case op::W: return earlier.kind != op::F && !(eb && earlier.stage >= later.stage);
    default: return false;
  }
}

//! The critical path of a simulated schedule of F/B/W/BW actions, latest action first: from the
//! last action of the rank with the longest span, each step goes to what bound the action's start
//! (the previous action of its rank when it started right at that one's end, else its
//! dependency), until an action bound by nothing. Positions are (rank, index in its program).
constexpr std::vector<std::pair<int, int>> critical_path(const schedule& s, const simulation& sim) {
  const int P = s.ranks, S = s.stages, M = s.microbatches;
  auto key = [&](op kind, int mb, int st) {
    const int kk = kind == op::BW ? 1 : static_cast<int>(kind);  // a BW stands where its B would
    return (static_cast<std::size_t>(kk) * static_cast<std::size_t>(S) + static_cast<std::size_t>(st)) *
               static_cast<std::size_t>(M) + static_cast<std::size_t>(mb);
  };
  std::vector<std::pair<int, int>> where(static_cast<std::size_t>(3 * S) * static_cast<std::size_t>(M), {-1, -1});
  for (int r = 0; r < P; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i)
      if (prog[i].kind == op::F || prog[i].kind == op::B || prog[i].kind == op::W || prog[i].kind == op::BW)
        where[key(prog[i].kind, prog[i].mb, prog[i].stage)] = {r, static_cast<int>(i)};
  }
  int r = 0;
  for (int i = 1; i < P; ++i)
    if (sim.span[static_cast<std::size_t>(i)] > sim.span[static_cast<std::size_t>(r)]) r = i;
  std::vector<std::pair<int, int>> path;
  int i = static_cast<int>(s.programs[static_cast<std::size_t>(r)].size()) - 1;
  const double eps = 1e-9;
  while (i >= 0 && path.size() < s.size()) {
    path.push_back({r, i});
    auto const& times = sim.times[static_cast<std::size_t>(r)];
    const action& a = s.programs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
    const double start = times[static_cast<std::size_t>(i)].start;
    if (i > 0 && times[static_cast<std::size_t>(i - 1)].end >= start - eps) {
      --i;
      continue;
    }
    std::pair<int, int> d{-1, -1};
    if (a.kind == op::F) {
      if (a.stage > 0) d = where[key(op::F, a.mb, a.stage - 1)];
    } else if (a.kind == op::W) {
      d = where[key(op::B, a.mb, a.stage)];
    } else if (is_input_backward(a.kind)) {
      d = a.stage == S - 1 ? where[key(op::F, a.mb, a.stage)] : where[key(op::B, a.mb, a.stage + 1)];
      const auto own = where[key(op::F, a.mb, a.stage)];
      if (a.stage < S - 1 && own.first >= 0 &&
          sim.times[static_cast<std::size_t>(own.first)][static_cast<std::size_t>(own.second)].end >= start - eps)
        d = own;
    }
    if (d.first < 0) break;
    r = d.first;
    i = d.second;
  }
  return path;
}

//! First-improvement hill climbing over the rank programs of `s` (see the file comment), every
//! candidate scored by `loom::simulate` under `k` and rejected if it deadlocks or exceeds
//! `limit`; stops when no move on the critical path improves or after `budget` simulations.
//! Returns the score of the result (that of `s` unchanged if nothing improved; a default score if
//! `s` itself is rejected). Schedules with overlapped `FB` actions are left as they are.
template <class Cost>
constexpr order_score order_local_search(schedule& s, const Cost& k, double limit, int budget) {
  simulation sim;
  order_score cur;
  if (!order_score_of(s, k, limit, cur, &sim)) return cur;
  for (auto const& prog : s.programs)
    for (auto const& a : prog)
      if (a.kind == op::FB) return cur;
  const double eps = 1e-9;
  while (budget > 0) {
    const auto path = critical_path(s, sim);
    bool improved = false;
    for (auto [r, i] : path) {
      if (budget <= 0) break;
      auto& prog = s.programs[static_cast<std::size_t>(r)];
      const auto ui = static_cast<std::size_t>(i);
      // Scores the schedule as it stands after a move; keeps it (true) if it beats `cur`.
      auto keep_if_better = [&] {
        --budget;
        order_score sc;
        simulation ns;
        if (!order_score_of(s, k, limit, sc, &ns) || !sc.better_than(cur)) return false;
        cur = sc;
        sim = static_cast<simulation&&>(ns);
        improved = true;
        return true;
      };
      // Move 1: one step earlier.
      if (i > 0 && may_run_before(prog[ui - 1], prog[ui])) {
        std::swap(prog[ui - 1], prog[ui]);
        if (keep_if_better()) break;
        std::swap(prog[ui - 1], prog[ui]);
      }
      // Move 2: a W on the path goes later, into the next gap of its rank or to the end.
      if (prog[ui].kind != op::W) continue;
      auto const& times = sim.times[static_cast<std::size_t>(r)];
      std::size_t targets[2] = {prog.size(), prog.size()};
      for (std::size_t j = ui + 2; j < prog.size(); ++j)
        if (times[j].start > times[j - 1].end + eps) {
          targets[0] = j;
          break;
        }
      for (int t = 0; t < 2 && budget > 0; ++t) {
        if (t == 1 && targets[0] == prog.size()) break;
        const std::size_t to = targets[t];  // the W lands just before position `to`
        const action w = prog[ui];
        for (std::size_t j = ui; j + 1 < to; ++j) prog[j] = prog[j + 1];
        prog[to - 1] = w;
        if (keep_if_better()) break;
        for (std::size_t j = to - 1; j > ui; --j) prog[j] = prog[j - 1];
        prog[ui] = w;
      }
      if (improved) break;
    }
    if (!improved) break;
  }
  return cur;
}

}  // namespace loom::detail
