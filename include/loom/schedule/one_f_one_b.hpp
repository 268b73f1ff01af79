// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! 1F1B, i.e. PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
//! Training", ICML 2021, §3.1; the flush variant of PipeDream, SOSP 2019).
//!
//! Rank r warms up with min(p-1-r, m) forwards, then alternates one forward and one fused
//! backward, then drains the remaining backwards. Loop placement, one stage per rank. Any m >= 1.
//! Closed forms (c = 0): bubble time (p-1)(f+b+w), as GPipe; peak activation on rank r is
//! min(p-r, m) (rank 0: min(p, m)).
//!
//! p = 3, m = 4, f = b = w = 1:
//! ```
//! 1f1b: 3 ranks x 4 microbatches, makespan 18, bubble ratio 0.333 (1 column = 1 time unit)
//!      0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17
//! r0 | F0  F1  F2  .   .   .   .   BW0 ~~~ F3  BW1 ~~~ .   BW2 ~~~ .   BW3 ~~~
//! r1 | .   F0  F1  .   .   BW0 ~~~ F2  BW1 ~~~ F3  BW2 ~~~ .   BW3 ~~~ .   .
//! r2 | .   .   F0  BW0 ~~~ F1  BW1 ~~~ F2  BW2 ~~~ F3  BW3 ~~~ .   .   .   .
//! F forward, BW fused backward; ~ continues, . idle
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The 1F1B (PipeDream-Flush) schedule family (`1f1b`).
struct one_f_one_b {
  static constexpr std::string_view name = "1f1b";
  static constexpr std::string_view summary = "1F1B / PipeDream-Flush: warm-up, one forward one backward, cool-down (Narayanan et al. 2021)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const {
    schedule out = make_schedule(name, s, s.ranks, placement_kind::loop);
    const int m = s.microbatches;
    for (int r = 0; r < s.ranks; ++r) {
      auto& p = out.programs[static_cast<std::size_t>(r)];
      p.reserve(static_cast<std::size_t>(2 * m));
      int warmup = s.ranks - 1 - r < m ? s.ranks - 1 - r : m;
      int nf = 0;
      for (; nf < warmup; ++nf) p.push_back(forward(nf, r));
      for (int i = 0; i < m; ++i) {
        if (nf < m) p.push_back(forward(nf++, r));
        p.push_back(backward(i, r));
      }
    }
    return out;
  }
};
static_assert(schedule_family<one_f_one_b>);

}  // namespace loom
