// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Hanayo (Liu, Cheng, Zhou & You, "Hanayo: Harnessing Wave-like Pipeline Parallelism for
//! Enhanced Large Model Training Efficiency", SC 2023, §3).
//!
//! Chimera's bubble savings without its model replica: one copy of the model (param_copies = 1,
//! one direction) cut into 2WP stages laid out as W waves over the P ranks, each wave going
//! down the ranks and back up (stage s on `zigzag(s)`: 0..P-1, P-1..0, 0..P-1, ...), so every
//! turn of the wave is a local copy (placement `v` for W = 1, `custom` beyond). `chunks` = W waves (default 1, a V); every rank holds 2W
//! stages, S = 2WP, q = 1/(2W); the schedule's `chunks` field records the 2W stages per rank.
//! Order: the wavefront construction of `wavefront.hpp` with one direction (units of P
//! microbatches, one every 2 steps, units 4WP steps apart). Any P >= 1, m >= 1, W >= 1.
//!
//! Closed forms (N = m a multiple of P, c = 0, a forward chunk as long as a backward chunk,
//! loom costs f = b + w): bubble ratio (P-1)/(2WN+P-1): the wave count divides the 1F1B /
//! GPipe bubble (P-1)/(N+P-1) like Megatron's interleaving, without "m multiple of p" rules
//! beyond full units. Peak activation P on the last rank, less towards rank 0 ((P+1)/2 for
//! W = 1), never above P.
//!
//! Sources: the bubble formula above is what this construction achieves in loom's simulator,
//! not a quotation of the paper's own formula or op order (not available to us).
//!
//! P = 4, N = 4, W = 1, f = 2, b = w = 1 (one character per time unit; each rank runs two
//! stages, so every microbatch appears twice per row):
//! (digit j: F of microbatch j; letter a+j: its fused backward BW; capital A+j: its W; `.` idle)
//! ```
//! r0 0123...0a1b2c3da.b.c.d
//! r1 .012..031a2b3cadb.c.d.
//! r2 ..01.02132a3bacbdc.d..
//! r3 ...00112233aabbccdd...
//! ```

#include <string>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/wavefront.hpp"

namespace loom {

//! The Hanayo schedule family (`hanayo`): wave-like placement, one model copy; shape chunks =
//! waves (natural 1).
struct hanayo {
  static constexpr std::string_view name = "hanayo";
  static constexpr std::string_view summary =
      "Hanayo: wave-like pipeline, W waves of 2P stages, no model replica (Liu et al. 2023)";
  static constexpr int default_chunks = 1;
  //! Size limit (see `loom::max_ranks`): each of the W waves puts 2 stages on a rank, so a shape
  //! of p x m x W holds p x m x 2W cells.
  static constexpr long long max_cells = max_shape_cells / 2;
  constexpr text check(shape s) const { return detail::check_basic(name, s); }
  constexpr schedule generate(shape s) const {
    const int p = s.ranks, v = 2 * s.chunks;
    return detail::wavefront_schedule(name, s, v * p, v, 1, 1, s.chunks == 1 ? placement_kind::v : placement_kind::custom,
                                      std::vector<int>{p},
                                      2L * v * p, [p](int, int st) { return detail::zigzag_rank(st, p); });
  }
};
static_assert(schedule_family<hanayo>);

}  // namespace loom
