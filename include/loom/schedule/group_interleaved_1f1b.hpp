// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Group-interleaved 1F1B: PipeOffload's schedule (Wan et al., "PipeOffload: Improving
//! Scalability of Pipeline Parallelism with Memory Optimization", ICML 2025, arXiv 2503.01328).
//!
//! Interleaved 1F1B (loop placement, `v` chunks per rank, S = p*v) whose microbatches are issued
//! in groups of `g` (`shape::group`, ⌈p/2⌉ <= g <= p), with a split backward (`B`, then `W` right
//! after it). With g = p the forwards and backwards follow Megatron-LM's interleaved order; a
//! smaller group keeps fewer microbatches of each chunk alive at once, which is what makes
//! offloading the first chunks pay off in the paper (their lifespans spread evenly over time).
//!
//! The rule follows the authors' generator, `GroupBuildingBlockScheduler` in
//! sail-sg/zero-bubble-pipeline-parallelism, file
//! `megatron/core/pipeline_parallel/zerobubble/scheduler/group_interleaved_1f1b.py`, commit
//! 54b65fcc656a545a5192b2e08ca39ff9e9cdb934 (read at main 39f2c186). loom writes it from the
//! rule, not from their code. In the unit-time building block of L = 3 g v slots per rank, with
//! g' = ⌈p/2⌉ (the smallest group the authors allow under uniform costs), k = ⌈g'/g⌉ and
//! h = gcd(v, k):
//! - `F` of chunk c, group member j on rank d sits at slot 3kgc + 3j + d + 3g⌊c/(v/h)⌋;
//! - the first backward of rank d sits 3(p-1-d) + 1 slots after its forward of chunk v-1, member
//!   0; from there `B` of chunk v-1-c, member j sits 3kgc + 3j + 3g⌊c/(v/h)⌋ later, its `W` one slot after;
//! - every pass keeps its absolute slot (the block unrolled), copy n of the block is shifted by L
//!   slots and adds n g to the microbatches, and microbatches >= m are dropped.
//! A rank's program is its passes in slot order. The authors' later passes (shifting ranks to meet
//! dependencies, squeezing idle slots) move passes in time but keep every rank's order, so they
//! leave the program unchanged; loom's simulator times it.
//!
//! Peak activation (c = 0, M_W/M_B = 1): the program's live count, which ctest checks against the
//! authors' generator for p in {4, 8}, v in {2, 4} and every allowed g (docs/offload.md).
//!
//! p = 2, m = 4, v = 2, g = 1, f = b = w = 1 (each chunk pass costs 1/v):
//! ```
//! group-interleaved-1f1b: 2 ranks x 4 microbatches, 2 chunks per rank, makespan 13.5, bubble ratio 0.111 (1 column = 0.5 time units)
//!      0    0.5  1    1.5  2    2.5  3    3.5  4    4.5  5    5.5  6    6.5  7    7.5  8    8.5  9    9.5  10   10.5 11
//! r0 | F0.0 .    F0.1 F1.0 .    B0.1 W0.1 F1.1 B0.0 W0.0 F2.0 B1.1 W1.1 F2.1 B1.0 W1.0 F3.0 B2.1 W2.1 F3.1 B2.0 W2.0 .
//! r1 | .    F0.0 .    F0.1 B0.1 W0.1 F1.0 B0.0 W0.0 F1.1 B1.1 W1.1 F2.0 B1.0 W1.0 F2.1 B2.1 W2.1 F3.0 B2.0 W2.0 F3.1 B3.1
//!
//!      11.5 12   12.5 13
//! r0 | B3.1 W3.1 B3.0 W3.0
//! r1 | W3.1 B3.0 W3.0 .
//! F forward, B input-gradient backward, W weight-gradient backward; .k = model chunk k of the rank; ~ continues, . idle
//! ```

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The group-interleaved 1F1B schedule family (`group-interleaved-1f1b`) of PipeOffload;
//! natural chunks = 2, natural group = ⌈p/2⌉ (the lowest peak memory of the allowed groups).
struct group_interleaved_1f1b {
  static constexpr std::string_view name = "group-interleaved-1f1b";
  static constexpr std::string_view summary =
      "PipeOffload's interleaved 1F1B with microbatch groups of g (--group, ceil(p/2)..p), split backward (Wan et al. 2025)";
  static constexpr int default_chunks = 2;
  static constexpr bool grouped = true;  //!< reads `shape::group`
  //! The group `s` runs: `s.group`, or ⌈p/2⌉ when it is 0.
  static constexpr int group_of(shape s) { return s.group != 0 ? s.group : (s.ranks + 1) / 2; }
  constexpr text check(shape s) const {
    if (text r = detail::check_basic(name, s); !r.empty()) return r;
    const int lo = (s.ranks + 1) / 2, g = group_of(s);
    if (g < lo || g > s.ranks)
      return text(name) + " needs a group size between ceil(p/2) = " + detail::to_text(lo) + " and p = " + detail::to_text(s.ranks) +
             " (got group=" + detail::to_text(s.group) + ")";
    return {};
  }
  constexpr schedule generate(shape s) const {
    const int p = s.ranks, m = s.microbatches, v = s.chunks, g = group_of(s);
    schedule out = make_schedule(name, s, p * v, placement_kind::loop);
    const int g_min = (p + 1) / 2, k = (g_min + g - 1) / g, h = std::gcd(v, k);
    const long long L = 3LL * g * v;
    const int copies = (m + g - 1) / g;
    struct item {
      long long slot;
      action a;
    };
    std::vector<item> items;
    for (int d = 0; d < p; ++d) {
      items.clear();
      items.reserve(static_cast<std::size_t>(3 * m * v));
      const long long last_f = 3LL * k * g * (v - 1) + d + 3LL * g * ((v - 1) / (v / h));
      const long long first_b = last_f + 3LL * (p - 1 - d) + 1;
      for (int c = 0; c < v; ++c)
        for (int j = 0; j < g; ++j) {
          const long long shift = 3LL * k * g * c + 3LL * j + 3LL * g * (c / (v / h));
          const long long f = shift + d, b = first_b + shift;
          const int fchunk = c, bchunk = v - 1 - c;
          for (int n = 0; n < copies; ++n) {
            const int mb = j + n * g;
            if (mb >= m) break;
            items.push_back({f + n * L, forward(mb, fchunk * p + d)});
            items.push_back({b + n * L, backward_input(mb, bchunk * p + d)});
            items.push_back({b + 1 + n * L, backward_weight(mb, bchunk * p + d)});
          }
        }
      std::sort(items.begin(), items.end(), [](const item& x, const item& y) { return x.slot < y.slot; });
      auto& prog = out.programs[static_cast<std::size_t>(d)];
      prog.reserve(items.size());
      for (const item& it : items) prog.push_back(it.a);
    }
    return out;
  }
};
static_assert(schedule_family<group_interleaved_1f1b>);

}  // namespace loom
