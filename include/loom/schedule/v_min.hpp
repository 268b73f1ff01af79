// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024,
//! arXiv 2405.15362, §3-§4 and Fig. 4).
//!
//! V placement, exactly two chunks per rank (rank r: stages r and 2P-1-r), split backward (B, W).
//! Built from the paper's tightest V-shape building block (`detail::v_block_timetable`): one
//! microbatch's forwards one slot apart all the way down and up the V, its backwards one slot
//! apart back, repeated every 6 slots, W's in the free slots, then warm-up and cool-down squeezed
//! without raising the block's peak. Lifespans sum to about 4P slots per rank: about a third of
//! 1F1B's activation memory. Any m >= 1.
//!
//! Closed forms (c = 0, f = b = w, M_W/M_B = 1): peak activation floor((P+4)/3) units on every
//! rank (the paper's (p+4)//3; min(m, ...) for fewer microbatches); per-rank span bubble at most
//! 2(P-1)(f+b+w)/3, two thirds of 1F1B's (the paper's bubble rate ~ 2p/(3m)). With F, B, W
//! unequal the block's fixed offsets leave gaps and the bubble grows (the paper's caveat).
//!
//! P = 4, m = 8, f = b = w = 1 (F/B/W = chunk 0, f/b/w = chunk 1; one two-character cell = one chunk pass
//! = 1/2 time unit):
//! ```
//! r0 F0F1F2........f0b0w0f1b1w1F3..B0W0....f2b2B1w2W1F4f3b3B2w3W2F5f4b4B3w4W3F6f5b5B4w5W4F7f6b6B5w6W5..f7b7B6w7W6......B7W7
//! r1 ..F0F1......f0..f1b0w0F2b1w1B0W0F3..f2..B1b2W1w2f3F4B2b3W2w3f4F5B3b4W3w4f5F6B4b5W4w5f6F7B5b6W5w6f7..B6b7W6w7....B7W7..
//! r2 ....F0F1..f0..f1....b0w0F2B0b1W0w1f2F3B1W1..b2f3w2B2F4W2b3f4w3B3F5W3b4f5w4B4F6W4b5f6w5B5F7W5b6f7w6B6W6..b7w7..B7W7....
//! r3 ......F0f0F1f1........b0B0w0W0F2f2b1B1w1W1F3f3b2B2w2W2F4f4b3B3w3W3F5f5b4B4w4W4F6f6b5B5w5W5F7f7b6B6w6W6....b7B7w7W7....
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/v_block.hpp"

namespace loom {

//! The V-Min schedule family (`v-min`): a third of 1F1B's activation memory.
struct v_min {
  static constexpr std::string_view name = "v-min";
  static constexpr std::string_view summary = "V-Min: V-shape building block, ~1/3 of 1F1B's activation memory (Qi et al. 2024)";
  static constexpr int default_chunks = 2;
  //! Size limit (see `loom::max_ranks`), as `v-half`'s (the same block placement, whose time grows
  //! faster than linearly with microbatches): 3 ranks x 65402 microbatches ran 78 s at -O2 (found
  //! by the engine fuzzer, `found-v-min-block-quadratic`).
  static constexpr long long max_cells = 1LL << 15;
  constexpr text check(shape s) const { return detail::check_v_shape(name, s); }
  constexpr schedule generate(shape s) const {
    return detail::v_schedule_from_timetable(name, s, detail::v_block_timetable(detail::v_block_kind::min, s.ranks, s.microbatches));
  }
};
static_assert(schedule_family<v_min>);

}  // namespace loom
