// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Breadth-first looped pipeline (Lamy-Poirier, "Breadth-First Pipeline Parallelism",
//! MLSys 2023, §3-4).
//!
//! Looped placement as Megatron's interleaving (v chunks per rank, stage k*P + r on rank r,
//! S = vP, q = 1/v), but breadth-first: every microbatch goes through chunk k before any goes
//! through chunk k+1, and the backward runs chunk by chunk in reverse. Rank r runs
//! F(0..m-1, r), F(0..m-1, P+r), ..., then BW(0..m-1, (v-1)P+r), ..., BW(0..m-1, r).
//! Any m >= 1 and v >= 1 (no "m multiple of p": a chunk's microbatches just queue); v = 1 is
//! GPipe. The looping is what cuts the bubble; breadth-first keeps long runs of one chunk (for
//! overlapping the data-parallel gradient reduction of a finished chunk, §4).
//!
//! Closed forms (c = 0, m >= P): bubble time (P-1)(f+b+w)/v on every rank, GPipe's divided by
//! v; peak activation m on every rank (v chunks x m microbatches x q), as GPipe.
//!
//! P = 3, m = 3, v = 2, f = b = w = 1:
//! (digit j: F of microbatch j; letter a+j: its fused backward BW; capital A+j: its W; `.` idle)
//! ```
//! r0 012012......aabbccaabbcc
//! r1 .012012...aabbccaabbcc..
//! r2 ..012012aabbccaabbcc....
//! ```

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The breadth-first looped schedule family (`looped-bfs`); natural chunks = 2.
struct looped_bfs {
  static constexpr std::string_view name = "looped-bfs";
  static constexpr std::string_view summary =
      "Breadth-first looped pipeline: chunk by chunk over all microbatches (Lamy-Poirier 2023)";
  static constexpr int default_chunks = 2;
  constexpr text check(shape s) const { return detail::check_basic(name, s); }
  constexpr schedule generate(shape s) const {
    const int p = s.ranks, m = s.microbatches, v = s.chunks;
    schedule out = make_schedule(name, s, p * v, placement_kind::loop);
    for (int r = 0; r < p; ++r) {
      auto& prog = out.programs[static_cast<std::size_t>(r)];
      prog.reserve(static_cast<std::size_t>(2 * m * v));
      for (int k = 0; k < v; ++k)
        for (int j = 0; j < m; ++j) prog.push_back(forward(j, k * p + r));
      for (int k = v - 1; k >= 0; --k)
        for (int j = 0; j < m; ++j) prog.push_back(backward(j, k * p + r));
    }
    out.chunks = v;
    return out;
  }
};
static_assert(schedule_family<looped_bfs>);

}  // namespace loom
