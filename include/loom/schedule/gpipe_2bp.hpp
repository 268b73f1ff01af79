// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! GPipe with 2-stage backpropagation (Rae, Lee & Richings, "2BP: 2-Stage Backpropagation",
//! arXiv 2405.18047, 2024, §3 and Fig. 1; GPipe: Huang et al. 2019).
//!
//! 2BP splits each backward into backward-p1 (the input gradient, loom's B) and backward-p2
//! (the weight gradient, W) and defers every backward-p2 until the rank has sent all its
//! input gradients, so the next rank up the chain is never kept waiting on weight gradients.
//! Rank r runs F(0..m-1), B(0..m-1), W(0..m-1). Loop placement, one stage per rank, any m >= 1.
//!
//! Sources: the paper's Fig. 1 draws Naive, GPipe, 1F1B-1 and 1F1B-2 with and without 2BP and
//! assumes forward, backward-p1 and backward-p2 take equal time (loom f = b = w); the text says
//! backward-p2 is delayed. That *every* backward-p2 waits for the end of the step is loom's
//! reading of the figure, not a quoted rule (docs/schedules-more.md). The bubble time below is
//! loom's, derived for this order, not a formula printed in the paper.
//!
//! Closed forms (c = 0): bubble time (P-1)(f+b) on rank 0, i.e. GPipe's (P-1)(f+b+w) minus
//! (P-1)w; peak activation m (M_W/M_B = 1: activations live until their W).
//!
//! P = 3, m = 3, f = b = w = 1:
//! (digit j: F of microbatch j; letter a+j: its fused backward BW; capital A+j: its W; `.` idle)
//! ```
//! r0 012....abcABC
//! r1 .012..abcABC.
//! r2 ..012abcABC..
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/gpipe.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/two_stage_backprop.hpp"

namespace loom {

//! GPipe with the 2BP split (`gpipe-2bp`).
struct gpipe_2bp {
  static constexpr std::string_view name = "gpipe-2bp";
  static constexpr std::string_view summary =
      "GPipe with 2BP: backward split into B and W, all W's deferred to the end (Rae et al. 2024)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const { return detail::defer_weight_gradients(gpipe{}.generate(s), name); }
};
static_assert(schedule_family<gpipe_2bp>);

}  // namespace loom
