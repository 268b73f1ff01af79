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

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/v_block.hpp"

namespace loom {

//! The ZB-V schedule family (`zb-v`): V placement, two chunks per rank, zero bubble at
//! f = b = w with 1F1B's peak activation.
struct zb_v {
  static constexpr std::string_view name = "zb-v";
  static constexpr std::string_view summary = "Zero Bubble ZB-V: V placement, 2 chunks/rank, zero bubble at 1F1B memory (Qi et al. 2024)";
  static constexpr int default_chunks = 2;
  constexpr std::string check(shape s) const { return detail::check_v_shape(name, s); }
  constexpr schedule generate(shape s) const {
    return detail::v_schedule_from_timetable(name, s, detail::v_zero_bubble_timetable(s.ranks, s.microbatches, 2 * s.ranks));
  }
};
static_assert(schedule_family<zb_v>);

}  // namespace loom
