// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
//! Parallelism", NeurIPS 2019, §2.2).
//!
//! Every rank runs all forwards, then all fused backwards, in microbatch order. Loop placement,
//! one stage per rank (S = P). Any m >= 1.
//! Closed forms (c = 0): bubble time (p-1)(f+b+w) on every rank; peak activation m on every rank.
//!
//! p = 3, m = 4, f = b = w = 1 (`loom render --schedule gpipe --ranks 3 --microbatches 4`;
//! a backward is BW, two time units):
//! ```
//! gpipe: 3 ranks x 4 microbatches, makespan 18, bubble ratio 0.333 (1 column = 1 time unit)
//!      0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17
//! r0 | F0  F1  F2  F3  .   .   .   .   .   .   BW0 ~~~ BW1 ~~~ BW2 ~~~ BW3 ~~~
//! r1 | .   F0  F1  F2  F3  .   .   .   BW0 ~~~ BW1 ~~~ BW2 ~~~ BW3 ~~~ .   .
//! r2 | .   .   F0  F1  F2  F3  BW0 ~~~ BW1 ~~~ BW2 ~~~ BW3 ~~~ .   .   .   .
//! F forward, BW fused backward; ~ continues, . idle
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The GPipe schedule family (`gpipe`).
struct gpipe {
  static constexpr std::string_view name = "gpipe";
  static constexpr std::string_view summary = "GPipe: all forwards, then all fused backwards (Huang et al. 2019)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const {
    schedule out = make_schedule(name, s, s.ranks, placement_kind::loop);
    for (int r = 0; r < s.ranks; ++r) {
      auto& p = out.programs[static_cast<std::size_t>(r)];
      p.reserve(static_cast<std::size_t>(2 * s.microbatches));
      for (int j = 0; j < s.microbatches; ++j) p.push_back(forward(j, r));
      for (int j = 0; j < s.microbatches; ++j) p.push_back(backward(j, r));
    }
    return out;
  }
};
static_assert(schedule_family<gpipe>);

}  // namespace loom
