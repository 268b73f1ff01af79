// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! V-Half (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024,
//! arXiv 2405.15362, §3-§4 and Fig. 4).
//!
//! V placement, exactly two chunks per rank (rank r: stages r and 2P-1-r), split backward (B, W).
//! Built from the paper's V-shape building block (`detail::v_block_timetable`): the passes of one
//! microbatch at fixed offsets (chunk-0 forwards 2 slots apart down the V, chunk-1 forwards 1
//! apart back up, backwards mirrored), repeated every 6 slots (one microbatch's F+B+W on every
//! rank), W's in the free slots, then the warm-up and cool-down squeezed without raising the
//! block's peak. The block's lifespans sum to about 6P slots per rank, so by the paper's
//! lifespan argument the peak is about half of 1F1B's. Any m >= 1.
//!
//! Closed forms (c = 0, f = b = w, M_W/M_B = 1, m >= P): peak activation floor((P+2)/2) units on
//! every rank (the paper's (p+2)//2; min(m, ...) for fewer microbatches); per-rank span bubble
//! at most (P-1)(f+b+w)/2, half of 1F1B's (the paper's bubble rate ~ p/(2m)).
//!
//! P = 4, m = 8, f = b = w = 1 (F/B/W = chunk 0, f/b/w = chunk 1; one two-character cell = one chunk pass
//! = 1/2 time unit):
//! ```
//! r0 F0F1F2F3F4....f0b0w0f1b1w1f2b2w2B0W0F5f3b3w3B1W1F6f4b4w4B2W2F7f5b5w5B3W3..f6b6w6B4W4..f7b7B5w7B6W5W6..B7W7
//! r1 ..F0F1F2F3..f0..f1b0w0f2b1w1F4B0b2W0f3w2F5B1b3W1f4w3F6B2b4W2f5w4F7B3b5W3f6w5..B4b6W4f7w6B5b7B6W5w7W6B7W7..
//! r2 ....F0F1F2f0..f1..f2b0w0F3b1B0w1W0f3F4b2B1w2W1f4F5b3B2w3W2f5F6b4B3w4W3f6F7b5B4w5W4f7b6B5w6B6b7W5W6B7w7W7..
//! r3 ......F0f0F1f1F2f2....b0B0w0W0F3f3b1B1w1W1F4f4b2B2w2W2F5f5b3B3w3W3F6f6b4B4w4W4F7f7b5B5b6B6w5W5b7B7w6W6w7W7
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/v_block.hpp"

namespace loom {

//! The V-Half schedule family (`v-half`): half of 1F1B's activation memory, half its bubble.
struct v_half {
  static constexpr std::string_view name = "v-half";
  static constexpr std::string_view summary = "V-Half: V-shape building block, ~1/2 of 1F1B's activation memory (Qi et al. 2024)";
  static constexpr int default_chunks = 2;
  //! Size limit (see `loom::max_ranks`): the block placement's time grows faster than linearly
  //! with microbatches; about 2 s at the limit on one core.
  static constexpr long long max_cells = 1LL << 15;
  constexpr text check(shape s) const { return detail::check_v_shape(name, s); }
  constexpr schedule generate(shape s) const {
    return detail::v_schedule_from_timetable(name, s, detail::v_block_timetable(detail::v_block_kind::half, s.ranks, s.microbatches));
  }
};
static_assert(schedule_family<v_half>);

}  // namespace loom
