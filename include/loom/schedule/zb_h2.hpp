// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1, Fig. 3 bottom).
//!
//! Twice ZB-H1's warm-up forwards (2(p-1-r) on rank r) so that the steady state has no bubble;
//! W's fill the tail. Loop placement, one stage per rank. Order: see `zb_order.hpp` with k = 2.
//! Any m >= 1 runs (below 2p-1 microbatches the warm-up is cut short and the closed form does
//! not apply).
//! Closed forms (m >= 2p-1): per-rank span bubble (p-1)(f+b+2c-2w), i.e. (p-1)(f+b-2w) at
//! c = 0 — zero bubble when f + b = 2w; peak activation 2p-1 (M_W/M_B = 1).
//!
//! p = 3, m = 5, f = b = w = 1:
//! ```
//! zb-h2: 3 ranks x 5 microbatches, makespan 17, bubble ratio 0.118 (1 column = 1 time unit)
//!      0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15 16
//! r0 | F0 F1 F2 F3 F4 B0 W0 B1 W1 B2 W2 B3 W3 B4 W4 .  .
//! r1 | .  F0 F1 F2 B0 F3 B1 F4 B2 W0 B3 W1 B4 W2 W3 W4 .
//! r2 | .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 W0 W1 W2 W3 W4
//! F forward, B input-gradient backward, W weight-gradient backward; ~ continues, . idle
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/zb_order.hpp"

namespace loom {

//! The ZB-H2 schedule family (`zb-h2`).
struct zb_h2 {
  static constexpr std::string_view name = "zb-h2";
  static constexpr std::string_view summary = "Zero Bubble ZB-H2: doubled warm-up, zero bubble at 2p-1 activations (Qi et al. 2024)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const { return detail::zero_bubble_handcrafted(name, s, 2); }
};
static_assert(schedule_family<zb_h2>);

}  // namespace loom
