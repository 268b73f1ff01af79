// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
//! Clusters Using Megatron-LM", SC 2021, §2.2).
//!
//! Each rank holds `v` model chunks (loop placement: virtual stage `k*p + r` on rank `r`,
//! S = p*v). Microbatches are issued in groups: for each group, chunk 0 for every microbatch of
//! the group, then chunk 1, ..., then chunk v-1; backwards follow the same order with chunks
//! reversed. Rank r warms up with `2(p-1-r) + (v-1)*g` forwards (g = the first group's size;
//! Megatron-LM's count), then alternates one forward and one backward, then drains.
//!
//! Groups: with m a multiple of p, m/p groups of p microbatches (Megatron-LM's order). Otherwise
//! m is split into max(1, floor(m/p)) groups whose sizes differ by at most one, larger first, so
//! every group holds at least p microbatches (or all m when m < p). A group smaller than p would
//! make a rank wait for a forward that is itself waiting on that rank's backward (a deadlock the
//! validator finds for e.g. p = 4, m = 5, v = 3 with a trailing group of one).
//!
//! Closed forms (c = 0, m mod p = 0): bubble time (p-1)(f+b+w)/v on every rank.
//!
//! p = 2, v = 2, m = 4, f = b = w = 1 (each chunk costs 1/v):
//! ```
//! interleaved-1f1b: 2 ranks x 4 microbatches, 2 chunks per rank, makespan 13.5, bubble ratio 0.111 (1 column = 0.5 time units)
//!      0     0.5   1     1.5   2     2.5   3     3.5   4     4.5   5     5.5   6     6.5   7     7.5   8     8.5   9
//! r0 | F0.0  F1.0  F0.1  F1.1  F2.0  .     BW0.1 ~~~~~ F3.0  BW1.1 ~~~~~ F2.1  BW0.0 ~~~~~ F3.1  BW1.0 ~~~~~ .     BW2.1
//! r1 | .     F0.0  F1.0  F0.1  BW0.1 ~~~~~ F1.1  BW1.1 ~~~~~ F2.0  BW0.0 ~~~~~ F3.0  BW1.0 ~~~~~ F2.1  BW2.1 ~~~~~ F3.1
//!
//!      9.5   10    10.5  11    11.5  12    12.5  13
//! r0 | ~~~~~ .     BW3.1 ~~~~~ BW2.0 ~~~~~ BW3.0 ~~~~~
//! r1 | BW3.1 ~~~~~ BW2.0 ~~~~~ BW3.0 ~~~~~ .     .
//! F forward, BW fused backward; .k = model chunk k of the rank; ~ continues, . idle
//! ```

#include <string>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The interleaved 1F1B schedule family (`interleaved-1f1b`); natural chunks = 2.
struct interleaved_1f1b {
  static constexpr std::string_view name = "interleaved-1f1b";
  static constexpr std::string_view summary = "Megatron-LM interleaved 1F1B: v chunks per rank in loop placement (Narayanan et al. 2021)";
  static constexpr int default_chunks = 2;
  constexpr text check(shape s) const { return detail::check_basic(name, s); }
  constexpr schedule generate(shape s) const {
    const int p = s.ranks, m = s.microbatches, v = s.chunks;
    schedule out = make_schedule(name, s, p * v, placement_kind::loop);
    // The (chunk, microbatch) order shared by every rank.
    struct item { int chunk, mb; };
    std::vector<item> order;
    order.reserve(static_cast<std::size_t>(m * v));
    const int groups = m / p > 1 ? m / p : 1;
    const int group = m / groups + (m % groups != 0 ? 1 : 0);  // size of the first (largest) group
    for (int g = 0, g0 = 0; g < groups; ++g) {
      int gs = m / groups + (g < m % groups ? 1 : 0);
      for (int k = 0; k < v; ++k)
        for (int i = 0; i < gs; ++i) order.push_back({k, g0 + i});
      g0 += gs;
    }
    const int total = m * v;
    for (int r = 0; r < p; ++r) {
      auto& prog = out.programs[static_cast<std::size_t>(r)];
      prog.reserve(static_cast<std::size_t>(2 * total));
      int warmup = 2 * (p - 1 - r) + (v - 1) * group;
      if (warmup > total) warmup = total;
      int nf = 0;
      auto fwd = [&](int n) { auto it = order[static_cast<std::size_t>(n)]; return forward(it.mb, it.chunk * p + r); };
      auto bwd = [&](int n) { auto it = order[static_cast<std::size_t>(n)]; return backward(it.mb, (v - 1 - it.chunk) * p + r); };
      for (; nf < warmup; ++nf) prog.push_back(fwd(nf));
      for (int nb = 0; nb < total; ++nb) {
        if (nf < total) prog.push_back(fwd(nf++));
        prog.push_back(bwd(nb));
      }
    }
    out.chunks = v;
    return out;
  }
};
static_assert(schedule_family<interleaved_1f1b>);

}  // namespace loom
