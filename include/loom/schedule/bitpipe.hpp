// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! BitPipe (Wu, Chen & Yu, "BitPipe: Bidirectional Interleaved Pipeline Parallelism for
//! Accelerating Large Models Training", 2024, §3; reference code wuhouming/BitPipe).
//!
//! Two V-shaped interleaved pipelines in opposite directions, i.e. Chimera's two replicas with
//! each replica cut into 2P stages placed as a V (Hanayo/ZB-V style): the down path puts stage s
//! on rank `zigzag(s)` (0..P-1 then P-1..0), the up path on `P-1-zigzag(s)`, so the two middle
//! stages of a V share a rank (a local copy, no transfer). `chunks` = stages per rank per
//! direction, v (default 2, the paper's V; v = 1 is Chimera's placement; any v >= 1 zigzags).
//! S = vP per path, q = 1/v, directions = 2, param_copies = 2, every rank holds 2v chunks.
//! Order: the wavefront construction of `wavefront.hpp` (units of P microbatches, P/2 per
//! direction, units 2vP steps apart). Any P >= 1, m >= 1.
//!
//! Closed forms (D = P even, N = m a multiple of D, c = 0, one forward chunk as long as one
//! backward chunk, loom costs f = b + w): bubble ratio (D-2)/(2vN+D-2), (D-2)/(4N+D-2) for the
//! paper's V, half of Chimera's idle time per unit of work. With backward = 2 x forward (the
//! paper's figure), D = 4, N = 4 reproduces the published timeline exactly: 28 time units of
//! which 24 busy on every rank (bubble ratio 1/7). Peak activation (both replicas)
//! D on the middle ranks, a little less towards the ends (e.g. 3.5 4 4 3.5 for D = N = 4).
//!
//! Sources: the formulas above are what this construction achieves, not quotations (the paper's
//! text was not available to us). The authors' Megatron schedule (wuhouming/BitPipe,
//! `megatron/core/pipeline_parallel/bitpipe_schedule.py`) differs from this wavefront order: it
//! requires m a multiple of P, uses 2P micro-batches as its basic unit and warms rank r up with
//! P + P/2 + min(r, P-1-r) forwards (unless its micro-batch count equals P); loom's order
//! matches only its published D = N = 4 figure.
//!
//! D = 4, N = 4, v = 2, f = 2, b = w = 2 (each chunk forward 1 unit, backward 2; the paper's
//! Fig. "BitPipe"; mbs 0,1 down, 2,3 up; the figure delays some forwards to slot boundaries,
//! loom runs them as soon as they are ready, with the same order and the same 28 units):
//! (digit j: F of microbatch j; letter a+j: its fused backward BW; capital A+j: its W; `.` idle)
//! ```
//! r0 01.22330aa1bb.ccccddddaa..bb
//! r1 .02132031.aaccbbddccaaddbb..
//! r2 .20310213.ccaaddbbaaccbbdd..
//! r3 23.00112cc3dd.aaaabbbbcc..dd
//! ```

#include <string>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/wavefront.hpp"

namespace loom {

//! The BitPipe schedule family (`bitpipe`): two V-shaped interleaved replicas in opposite
//! directions; natural chunks = 2 per direction.
struct bitpipe {
  static constexpr std::string_view name = "bitpipe";
  static constexpr std::string_view summary =
      "BitPipe: two V-shaped interleaved pipelines in opposite directions (Wu et al. 2024)";
  static constexpr int default_chunks = 2;
  constexpr text check(shape s) const { return detail::check_basic(name, s); }
  constexpr schedule generate(shape s) const {
    const int p = s.ranks, v = s.chunks;
    return detail::wavefront_schedule(name, s, v * p, v, 2, 2, placement_kind::bidirectional,
                                      std::vector<int>{(p + 1) / 2, p / 2}, 2L * v * p, [p](int d, int st) {
                                        int r = detail::zigzag_rank(st, p);
                                        return d == 0 ? r : p - 1 - r;
                                      });
  }
};
static_assert(schedule_family<bitpipe>);

}  // namespace loom
