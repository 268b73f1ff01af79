// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6).
//!
//! V placement, exactly two chunks per rank: rank r holds virtual stage r (chunk 0) and stage
//! 2P-1-r (chunk 1), so a microbatch's forward runs down the ranks and back up, and its backward
//! the same way in reverse; the first and last stage sit on rank 0. Backwards are split into B
//! and W. Every chunk pass costs half of a plain pipeline's pass (q = 1/2).
//!
//! Construction (`detail::v_zero_bubble_timetable`, unit slots = one chunk pass at
//! f = b = w): each rank runs forwards (chunk 1 first) while its memory stays within P units
//! (2P chunk activations, 1F1B's peak) until its first backward is ready; then it alternates one
//! forward and one B (the oldest microbatch's B first), and whenever the wanted pass is not ready
//! or memory is full it runs the oldest pending W instead; the remaining W's drain at the end.
//! Ranks run their passes in slot order. Any m >= 1.
//!
//! Cost-aware (`generate(shape, generate_options)`): the unit slots ignore the real pass times
//! and the p2p latency c, so under real costs the greedy's order leaves bubbles. The greedy is
//! then improved by first-improvement local search scored with `loom::simulate` under
//! `o.cost` and the per-rank limit `o.mem_limit` (default p units; a larger limit also seeds the
//! greedy with larger memory caps): along the simulated critical path an action swaps with the
//! previous action of its rank, and a W on the path moves later into its rank's next idle gap
//! or to the end. Candidates that deadlock or exceed the limit are rejected; the evaluation
//! budget (`search_budget`) bounds the run time. Never worse than the greedy. On the Zero Bubble
//! paper's Table 8 shapes (docs/zero-bubble-paper.md) it is below the paper's ZB-V on all 9 rows
//! at the paper's profiled costs (Table 9); at costs derived from Table 8's own baselines it is
//! no higher on 8 of 9 at printed precision and equals the authors' own heuristic on the ninth.
//!
//! Closed forms (c = 0, f = b = w, M_W/M_B = 1): for m >= 2P every rank's span is exactly its
//! work, i.e. per-rank span bubble 0 and bubble_rate 0 (the paper's "zero bubble"; the staggered
//! start of rank r, r*f/2, is excluded as in the paper's bubble rate); peak activation <= P on
//! every rank (1F1B's); pipeline communication twice 1F1B's (each microbatch crosses 2(P-1)
//! rank boundaries each way). For m < 2P the warm-up cannot be filled and a bubble remains.
//!
//! P = 3, m = 6, f = b = w = 1 (F/B/W = chunk 0, f/b/w = chunk 1; one two-character cell = one chunk pass
//! = 1/2 time unit; rows are the simulator's timeline):
//! ```
//! r0 F0F1F2F3F4f0b0w0f1b1w1f2b2w2F5B0W0f3b3w3B1W1f4b4w4B2W2f5b5B3w5B4W3B5W4W5....
//! r1 ..F0F1F2f0F3f1b0w0f2b1w1F4B0W0f3b2w2F5B1W1f4b3w3B2W2f5b4B3b5B4w4B5W3w5W4W5..
//! r2 ....F0f0F1f1F2f2b0w0F3B0W0f3b1w1F4B1W1f4b2w2F5B2W2f5b3B3b4B4b5B5w3W3w4W4w5W5
//! ```

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "loom/schedule/error.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/v_block.hpp"

namespace loom {

namespace detail {

//! `v` with two decimals (for messages).
constexpr text zb_v_text(double v) {
  const long long h = static_cast<long long>(v * 100 + (v < 0 ? -0.5 : 0.5));
  const long long a = h < 0 ? -h : h;
  text frac = to_text(a % 100);
  return (h < 0 ? "-" : "") + to_text(a / 100) + "." + (frac.size() < 2 ? "0" + frac : frac);
}

//! Score of a `zb-v` candidate under real costs: bubble rate first (the Zero Bubble paper's
//! metric), then the sum of per-rank spans (lets the search move along plateaus of the max span
//! towards shorter secondary spans).
struct zb_v_score {
  double bubble_rate = 2;
  double span_sum = 0;
  constexpr bool better_than(const zb_v_score& o) const {
    if (bubble_rate < o.bubble_rate - 1e-12) return true;
    if (bubble_rate > o.bubble_rate + 1e-12) return false;
    return span_sum < o.span_sum - 1e-9;
  }
};

//! Simulates `s` under `k`; false if it deadlocks (the simulator reports ok = false) or exceeds
//! `limit` units of activation on some rank. On success fills `out` and, if given, `sim`.
constexpr bool zb_v_score_of(const schedule& s, const costs& k, double limit, zb_v_score& out, simulation* sim) {
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

//! Whether `later` may run before `earlier` on one rank of a V schedule (F/B/W actions only):
//! false if `later` depends on `earlier` on that rank (same microbatch: F -> B -> W of one stage,
//! F(P-1) -> F(P) and B(P) -> B(P-1) at the V's tip, F(2P-1) -> B(2P-1) on rank 0), or if both
//! belong to one stream (same kind and stage), whose microbatch order the search keeps.
constexpr bool zb_v_may_swap(const action& earlier, const action& later) {
  if (earlier.kind == later.kind && earlier.stage == later.stage) return false;
  if (earlier.mb != later.mb) return true;
  if (earlier.stage == later.stage) return false;
  if (earlier.kind == op::F && later.kind == op::F && later.stage == earlier.stage + 1) return false;
  if (earlier.kind == op::B && later.kind == op::B && later.stage == earlier.stage - 1) return false;
  if (earlier.kind == op::F && later.kind == op::B) return false;
  return true;
}

//! The critical path of a simulated F/B/W schedule, latest action first: from the last action
//! of the rank with the longest span, each step goes to what bound the action's start (the
//! previous action of its rank when it started right at that one's end, else its dependency),
//! until an action bound by nothing. Positions are (rank, index in its program).
constexpr std::vector<std::pair<int, int>> zb_v_critical_path(const schedule& s, const simulation& sim) {
  const int P = s.ranks, S = s.stages, M = s.microbatches;
  auto key = [&](op kind, int mb, int st) {
    return (static_cast<std::size_t>(kind) * static_cast<std::size_t>(S) + static_cast<std::size_t>(st)) *
               static_cast<std::size_t>(M) + static_cast<std::size_t>(mb);
  };
  std::vector<std::pair<int, int>> where(static_cast<std::size_t>(3 * S) * static_cast<std::size_t>(M), {-1, -1});
  for (int r = 0; r < P; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) where[key(prog[i].kind, prog[i].mb, prog[i].stage)] = {r, static_cast<int>(i)};
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
    } else {
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

//! First-improvement hill climbing over the rank programs of `s` (F/B/W only), every candidate
//! scored by `loom::simulate` under `k` and rejected if it deadlocks or exceeds `limit`. Moves,
//! tried along the current critical path (latest action first): an action on it swaps with the
//! previous action of its rank (runs one step earlier); a W on it moves later, to just before
//! the next idle gap of its rank or to the end of its program (W's fill gaps instead of
//! delaying the path). The first move that improves the score is kept and the path recomputed;
//! stops when no move on the path improves or after `budget` simulations. Returns the score.
constexpr zb_v_score zb_v_local_search(schedule& s, const costs& k, double limit, int budget) {
  simulation sim;
  zb_v_score cur;
  if (!zb_v_score_of(s, k, limit, cur, &sim)) return cur;
  const double eps = 1e-9;
  while (budget > 0) {
    const auto path = zb_v_critical_path(s, sim);
    bool improved = false;
    for (auto [r, i] : path) {
      if (budget <= 0) break;
      auto& prog = s.programs[static_cast<std::size_t>(r)];
      const auto ui = static_cast<std::size_t>(i);
      // Scores the schedule as it stands after a move; keeps it (true) if it beats `cur`.
      auto keep_if_better = [&] {
        --budget;
        zb_v_score sc;
        simulation ns;
        if (!zb_v_score_of(s, k, limit, sc, &ns) || !sc.better_than(cur)) return false;
        cur = sc;
        sim = static_cast<simulation&&>(ns);
        improved = true;
        return true;
      };
      // Move 1: one step earlier.
      if (i > 0 && zb_v_may_swap(prog[ui - 1], prog[ui])) {
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

}  // namespace detail

//! The ZB-V schedule family (`zb-v`): V placement, two chunks per rank, zero bubble at
//! f = b = w with 1F1B's peak activation.
struct zb_v {
  static constexpr std::string_view name = "zb-v";
  static constexpr std::string_view summary = "Zero Bubble ZB-V: V placement, 2 chunks/rank, zero bubble at 1F1B memory (Qi et al. 2024)";
  static constexpr int default_chunks = 2;
  constexpr text check(shape s) const { return detail::check_v_shape(name, s); }
  //! Simulations the cost-aware local search may spend (bounds its run time).
  int search_budget = 150;
  //! Size limit of the search (see `loom::max_ranks`): about 3 s at the limit on one core.
  static constexpr long long max_cells = 1LL << 16;

  constexpr schedule generate(shape s) const {
    return detail::v_schedule_from_timetable(name, s, detail::v_zero_bubble_timetable(s.ranks, s.microbatches, 2 * s.ranks));
  }

  //! Cost-aware ZB-V: the greedy above, then local search under the real costs `o.cost` and the
  //! per-rank activation limit `o.mem_limit` (units of ARCHITECTURE.md; `<= 0`: `p`, 1F1B's
  //! peak and the paper's ZB-V budget). Seeds: the greedy with its memory cap at `2p` chunk
  //! activations and, when the limit is larger, at every even cap up to `2*limit` (at most 8
  //! more); the best seed under `loom::simulate` is improved by `detail::zb_v_local_search`.
  //! Never worse than `generate(s)` at the same costs (that is the first seed, and it always fits
  //! a limit >= p: its chunk count bounds its memory for any M_W/M_B). Throws `config_error` for a
  //! bad cost model and `schedule_error` for a limit below `p` units (the greedy's warm-up holds
  //! `2p` chunk activations before any is released; a smaller limit is not silently raised).
  constexpr schedule generate(shape s, const generate_options& o) const {
    if (s.chunks == 0) s.chunks = 2;
    if (auto r = check(s); !r.empty()) throw schedule_error(r);
    const costs& k = o.cost;
    if (!(k.f > 0) || !(k.b > 0) || !(k.w >= 0) || !(k.c >= 0))
      throw config_error("zb-v needs f > 0, b > 0, w >= 0 and c >= 0");
    if (!(k.mem_w_ratio >= 0 && k.mem_w_ratio <= 1)) throw config_error("zb-v needs 0 <= mem-w-ratio <= 1");
    const double limit = o.mem_limit > 0 ? o.mem_limit : s.ranks;
    if (limit < s.ranks - 1e-9)
      throw schedule_error("zb-v needs mem-limit >= ranks = " + detail::to_text(s.ranks) +
                           " (its warm-up holds that many units before any is released; got mem-limit " +
                           detail::zb_v_text(limit) + ")");
    schedule best;
    detail::zb_v_score best_score;
    bool have = false;
    const int p = s.ranks;
    for (int cap = 2 * p; cap <= 2 * p + 16 && cap <= 2 * limit + 1e-9; cap += 2) {
      schedule cand = detail::v_schedule_from_timetable(name, s, detail::v_zero_bubble_timetable(p, s.microbatches, cap));
      detail::zb_v_score sc;
      if (!detail::zb_v_score_of(cand, k, limit, sc, nullptr)) continue;
      if (!have || sc.better_than(best_score)) {
        best = static_cast<schedule&&>(cand);
        best_score = sc;
        have = true;
      }
    }
    if (!have) throw schedule_error("zb-v: internal error, no seed within mem-limit " + detail::zb_v_text(limit));
    detail::zb_v_local_search(best, k, limit, search_budget);
    return best;
  }
};
static_assert(cost_aware_family<zb_v>);
static_assert(schedule_family<zb_v>);

}  // namespace loom
