// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! 1F1B with 2-stage backpropagation (Rae, Lee & Richings, "2BP: 2-Stage Backpropagation",
//! arXiv 2405.18047, 2024, §3 and Fig. 1; 1F1B: Narayanan et al. 2021).
//!
//! 1F1B's order with every fused backward replaced by its input-gradient half (B, 2BP's
//! backward-p1), and every weight-gradient half (W, backward-p2) deferred to the end of the
//! step: rank r warms up with min(P-1-r, m) forwards, alternates F and B, drains the B's, then
//! runs W(0..m-1). Loop placement, one stage per rank, any m >= 1.
//!
//! Sources: the paper's Fig. 1 draws Naive, GPipe, 1F1B-1 and 1F1B-2 with and without 2BP and
//! assumes forward, backward-p1 and backward-p2 take equal time (loom f = b = w); the text says
//! backward-p2 is delayed. That *every* backward-p2 waits for the end of the step is loom's
//! reading of the figure, not a quoted rule (docs/schedules-more.md). The bubble time below is
//! loom's, derived for this order, not a formula printed in the paper.
//!
//! Closed forms (c = 0): bubble time (P-1)(f+b) on rank 0, i.e. 1F1B's (P-1)(f+b+w) minus
//! (P-1)w; the price is memory: with M_W/M_B = 1 every activation lives until the W tail, so
//! the peak is m on every rank (1F1B: min(P-r, m)).
//!
//! P = 3, m = 4, f = b = w = 1:
//! (digit j: F of microbatch j; letter a+j: its fused backward BW; capital A+j: its W; `.` idle)
//! ```
//! r0 012..a3b.c.dABCD
//! r1 .01.a2b3c.dABCD.
//! r2 ..0a1b2c3dABCD..
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/two_stage_backprop.hpp"

namespace loom {

//! 1F1B with the 2BP split (`1f1b-2bp`).
struct one_f_one_b_2bp {
  static constexpr std::string_view name = "1f1b-2bp";
  static constexpr std::string_view summary =
      "1F1B with 2BP: backward split into B and W, all W's deferred to the end (Rae et al. 2024)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const { return detail::defer_weight_gradients(one_f_one_b{}.generate(s), name); }
};
static_assert(schedule_family<one_f_one_b_2bp>);

}  // namespace loom
