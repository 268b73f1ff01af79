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
//! budget (`search_budget`) bounds the run time. Never worse than the greedy. The Zero Bubble
//! authors' own cost-aware V heuristic (`zb_heuristics.hpp`) is a seed too, so it is never worse
//! than that either. On the Zero Bubble
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
#include "loom/schedule/order_search.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/v_block.hpp"
#include "loom/schedule/zb_heuristics.hpp"

namespace loom {

namespace detail {

//! `v` with two decimals (for messages).
constexpr text zb_v_text(double v) {
  const long long h = static_cast<long long>(v * 100 + (v < 0 ? -0.5 : 0.5));
  const long long a = h < 0 ? -h : h;
  text frac = to_text(a % 100);
  return (h < 0 ? "-" : "") + to_text(a / 100) + "." + (frac.size() < 2 ? "0" + frac : frac);
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
  //! more); and the Zero Bubble authors' cost-aware V heuristic under the limit, all four of its
  //! settings (`detail::zbv_heuristic`), so the result is never worse than theirs. The best seed
  //! under `loom::simulate` is improved by `detail::order_local_search`.
  //! Never worse than `generate(s)` at the same costs (that is the first seed, and it always fits
  //! a limit >= p: its chunk count bounds its memory for any M_W/M_B). Throws `config_error` for a
  //! bad cost model and `schedule_error` for a limit below `p` units (the greedy's warm-up holds
  //! `2p` chunk activations before any is released; a smaller limit is not silently raised).
  constexpr schedule generate(shape s, const generate_options& o) const {
    if (s.chunks == 0) s.chunks = 2;
    if (auto r = check(s); !r.empty()) throw schedule_error(r);
    // With a stage- and link-resolved model: built from its per-share means, scored under it
    // (detail::uniform_view, as zb-auto).
    const detail::options_view view = detail::uniform_view(o, make_schedule(name, s, 2 * s.ranks, placement_kind::v));
    const costs& k = view.uniform.cost;
    if (!(k.f > 0) || !(k.b > 0) || !(k.w >= 0) || !(k.c >= 0))
      throw config_error("zb-v needs f > 0, b > 0, w >= 0 and c >= 0");
    if (!(k.mem_w_ratio >= 0 && k.mem_w_ratio <= 1)) throw config_error("zb-v needs 0 <= mem-w-ratio <= 1");
    const double limit = view.uniform.mem_limit > 0 ? view.uniform.mem_limit : s.ranks;
    if (limit < s.ranks - 1e-9 && view.staged)
      throw schedule_error("zb-v needs mem-limit >= ranks x the heaviest rank's activation per microbatch = " +
                           detail::zb_v_text(view.model_limit / limit * s.ranks) + " (got mem-limit " +
                           detail::zb_v_text(view.model_limit) + ")");
    if (limit < s.ranks - 1e-9)
      throw schedule_error("zb-v needs mem-limit >= ranks = " + detail::to_text(s.ranks) +
                           " (its warm-up holds that many units before any is released; got mem-limit " +
                           detail::zb_v_text(limit) + ")");
    schedule best;
    detail::order_score best_score;
    bool have = false;
    const int p = s.ranks;
    auto consider = [&](schedule&& cand) {
      detail::order_score sc;
      if (!(view.staged ? detail::order_score_of(cand, view.fitted, view.model_limit, sc, nullptr)
                        : detail::order_score_of(cand, k, limit, sc, nullptr)))
        return;
      if (!have || sc.better_than(best_score)) {
        best = static_cast<schedule&&>(cand);
        best_score = sc;
        have = true;
      }
    };
    for (int cap = 2 * p; cap <= 2 * p + 16 && cap <= 2 * limit + 1e-9; cap += 2)
      consider(detail::v_schedule_from_timetable(name, s, detail::v_zero_bubble_timetable(p, s.microbatches, cap)));
    for (int fb = 0; fb < 4; ++fb) {
      schedule cand;
      if (detail::zbv_heuristic(name, s, k, limit, {.fill_b = fb < 2, .fill_f = fb % 2 == 0}, cand))
        consider(static_cast<schedule&&>(cand));
    }
    if (!have && view.staged)
      throw config_error("zb-v found no schedule within mem-limit " + detail::zb_v_text(view.model_limit) +
                         " under the cost model's stage activations");
    if (!have) throw schedule_error("zb-v: internal error, no seed within mem-limit " + detail::zb_v_text(limit));
    if (view.staged) detail::order_local_search(best, view.fitted, view.model_limit, search_budget);
    else detail::order_local_search(best, k, limit, search_budget);
    return best;
  }
};
static_assert(cost_aware_family<zb_v>);
static_assert(schedule_family<zb_v>);

}  // namespace loom
