// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1, Fig. 3 top).
//!
//! Splits the backward into B (input gradient) and W (weight gradient) and delays W's to fill
//! the 1F1B cool-down bubbles, at 1F1B's memory. Loop placement, one stage per rank. Order: see
//! `zb_order.hpp` with k = 1. Any m >= 1.
//! Closed forms (c = 0, m >= p): bubble time (p-1)(f+b-w); peak activation p (M_W/M_B = 1).
//!
//! p = 3, m = 4, f = b = w = 1:
//! ```
//! zb-h1: 3 ranks x 4 microbatches, makespan 14, bubble ratio 0.143 (1 column = 1 time unit)
//!      0  1  2  3  4  5  6  7  8  9  10 11 12 13
//! r0 | F0 F1 F2 .  .  B0 W0 F3 B1 W1 B2 W2 B3 W3
//! r1 | .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
//! r2 | .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
//! F forward, B input-gradient backward, W weight-gradient backward; ~ continues, . idle
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/zb_order.hpp"

namespace loom {

//! The ZB-H1 schedule family (`zb-h1`).
struct zb_h1 {
  static constexpr std::string_view name = "zb-h1";
  static constexpr std::string_view summary = "Zero Bubble ZB-H1: 1F1B memory, W's fill the cool-down (Qi et al. 2024)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const { return detail::zero_bubble_handcrafted(name, s, 1); }
};
static_assert(schedule_family<zb_h1>);

}  // namespace loom
