// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Chimera (Li & Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with
//! Bidirectional Pipelines", SC 2021, §3.1 and §3.5).
//!
//! Two model replicas run as two pipelines in opposite directions over the same D = P ranks:
//! the *down* pipeline puts stage s on rank s, the *up* pipeline stage s on rank P-1-s
//! (placement `bidirectional`, directions = 2, S = P stages per path, q = 1, param_copies = 2).
//! A basic unit holds D microbatches, D/2 per direction (the first ceil(D/2) of the unit go
//! down, the rest up); more microbatches concatenate units directly (§3.5, "direct
//! concatenation"), a new unit entering when the previous unit's first microbatch has finished.
//! The order is the authors' step construction (see `wavefront.hpp`): each microbatch advances
//! one stage per step, a new one enters every second step; for even D no rank is ever given two
//! things in one step. Any P >= 1 and m >= 1 run (odd P or a partial last unit just leave more
//! idle steps); one stage per rank per direction, so chunks must be 1.
//!
//! What the paper states (§2, "Bubbles in the pipeline", and its comparison table): GPipe and
//! DAPPLE incur 2(D-1) bubbles (D-1 in the forward passes, D-1 in the backward passes); Chimera
//! incurs D-2 (D/2-1 in the forward and D/2-1 in the backward passes); bubble ratio
//! (D-2)/(2N+D-2) against (D-1)/(N+D-1); weights 2M_theta; activations [(D/2+1)M_a, D M_a]
//! (N = micro-batches each worker runs per iteration = m here, D = P even). The ratio counts
//! passes and bubbles in pass units, so it is a statement about time exactly when every pass
//! slot has one length, loom costs f = b + w; loom meets it there for every even D and every N
//! multiple of D (tests), with peaks D/2+1 on the end ranks and D in the middle.
//! At a full backward of two forwards (loom's default) the same order leaves more idle time
//! than D/2-1 forward-sized plus D/2-1 backward-sized bubbles (D = N = 4: makespan 16, not 15).
//!
//! More micro-batches (§3.5): units are concatenated; the paper notes that direct concatenation
//! leaves intermediate bubbles because a backward is longer than a forward, and proposes
//! forward doubling (removes them, at twice the activation memory) and backward halving. loom
//! implements direct concatenation only, as the authors' released generator does
//! (Shigangli/Chimera, `chimera_pipeline_rank.py`; `pipeline.py` asserts an even stage count
//! and whole units of micro-batches). Forward doubling and backward halving are not implemented: their
//! exact op order was not available to us (see docs/schedules-more.md).
//!
//! D = 4, N = 4, f = 2, b = w = 1, one character per step of 2 time units (mbs 0,1 down, 2,3 up;
//! 4 idle steps of 20 per rank, ratio 2/10):
//! (digit j: F of microbatch j; letter a+j: its fused backward BW; capital A+j: its W; `.` idle)
//! ```
//! r0 01.2c3da.b
//! r1 .0213cadb.
//! r2 .2031acbd.
//! r3 23.0a1bc.d
//! ```

#include <string>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/wavefront.hpp"

namespace loom {

//! The Chimera schedule family (`chimera`): two replicas, bidirectional pipelines.
struct chimera {
  static constexpr std::string_view name = "chimera";
  static constexpr std::string_view summary =
      "Chimera: two model replicas as down and up pipelines over the same ranks (Li & Hoefler 2021)";
  constexpr text check(shape s) const { return detail::check_basic(name, s, 1); }
  constexpr schedule generate(shape s) const {
    const int p = s.ranks;
    return detail::wavefront_schedule(name, s, p, 1, 2, 2, placement_kind::bidirectional,
                                      std::vector<int>{(p + 1) / 2, p / 2}, 2L * p,
                                      [p](int d, int st) { return d == 0 ? st : p - 1 - st; });
  }
};
static_assert(schedule_family<chimera>);

}  // namespace loom
