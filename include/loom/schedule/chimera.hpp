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
//! forward doubling (removes them, at twice the activation memory) and backward halving.
//! `chimera` is direct concatenation, as the authors' released generator builds it
//! (Shigangli/Chimera, `chimera_pipeline_rank.py`; `pipeline.py` asserts an even stage count
//! and whole units of micro-batches); `chimera_fd` below is forward doubling. Backward halving
//! is not implemented: neither its op order nor its code was available to us (see
//! docs/schedules-more.md).
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

//! Chimera with forward doubling (`chimera-fd`; Li & Hoefler 2021, §3.5): every forward slot runs
//! two microbatches of one direction back to back, so that a forward slot is as long as a
//! backward (b + w = 2f) and basic units concatenate without the intermediate bubbles of direct
//! concatenation, at twice the activation memory.
//!
//! The order is the authors' own, from their released runtime (Shigangli/Chimera, branch
//! ChimeraBk, `chimera/chimera_bert/bert/main_with_runtime_forward_doubling.py`, the same in the
//! GPT-2 runtime): D = P ranks, H = D/2; rank r holds stage r of the down pipeline and stage
//! D-1-r of the up pipeline; its *own* direction is down for r < H, up otherwise, and with
//! a = H - r (r < H) or r - H + 1 (r >= H), b = H - a, each doubling step of 2D microbatches (D
//! per direction) runs
//!   a x [B own (not in the first step), F own, F own]
//!   b x [F other, F other, F own, F own]
//!   a x [F other, F other, B other]
//!   (b + H) x [B own, B other]
//! and the iteration ends with a x [B own]. Each direction takes its microbatches in order (the
//! runtime's queues); loom gives the first D of every 2D microbatches to the down direction.
//! The runtime asserts an even number of basic units, so m must be a multiple of 2P, and P even.
//!
//! What the paper states and loom checks (tests/schedule/test_more_families.cpp): at b + w = 2f
//! the bubble ratio is the basic unit's (D-2)/(2N+D-2) for every even D and N a multiple of 2D
//! (direct concatenation at the same costs leaves more: 0.1724 against 0.0588 at D = 4, N = 16);
//! each further doubling step adds exactly 2D (f + b + w) to the makespan (no intermediate bubble);
//! every rank holds D more activations than under direct concatenation at its peak: 2D in the
//! middle, twice direct concatenation's D, and 3D/2+1 on the end ranks.
//!
//! D = 4, N = 8, f = b = w = 1 (a BW takes two units): makespan 27, bubble ratio 1/9 =
//! (4-2)/(16+4-2); microbatches 0-3 go down, 4-7 up (digit j: F of microbatch j; letter a+j: its
//! fused backward BW; `.` idle; one character per time unit):
//! ```
//! r0 012345ee67ff.aaggbbhhcc..dd
//! r1 .01452367eeaaffbbggcchhdd..
//! r2 .45016723aaeebbffccggddhh..
//! r3 456701aa23bb.eeccffddgg..hh
//! ```
struct chimera_fd {
  static constexpr std::string_view name = "chimera-fd";
  static constexpr std::string_view summary =
      "Chimera with forward doubling: two forwards per slot, no intermediate bubbles at b+w = 2f (Li & Hoefler 2021, sec. 3.5)";
  constexpr text check(shape s) const {
    if (text rule = detail::check_basic(name, s, 1); !rule.empty()) return rule;
    if (s.ranks < 2 || s.ranks % 2 != 0)
      return text(name) + " needs an even number of ranks >= 2 (got " + detail::to_text(s.ranks) + ")";
    if (s.microbatches % (2 * s.ranks) != 0)
      return text(name) + " needs microbatches a multiple of 2 x ranks = " + detail::to_text(2 * s.ranks) +
             " (a doubling step is two basic units; got " + detail::to_text(s.microbatches) + "); chimera takes any count";
    return {};
  }
  constexpr schedule generate(shape sh) const {
    const int D = sh.ranks, m = sh.microbatches, H = D / 2, steps = m / (2 * D);
    schedule out = detail::mirrored_frame(name, sh, 1);
    std::vector<int> order[2];  // each direction's microbatches, in the order it runs them
    for (int j = 0; j < m; ++j) {
      const int d = j % (2 * D) < D ? 0 : 1;
      out.mb_direction[static_cast<std::size_t>(j)] = d;
      order[d].push_back(j);
    }
    for (int r = 0; r < D; ++r) {
      const int own = r < H ? 0 : 1, other = 1 - own;
      const int a = r < H ? H - r : r - H + 1, b = H - a;
      const int stage[2] = {r, D - 1 - r};
      std::size_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
      auto& prog = out.programs[static_cast<std::size_t>(r)];
      prog.reserve(static_cast<std::size_t>(2 * m));
      auto fwd = [&](int d) { prog.push_back(forward(order[d][next_f[d]++], stage[d])); };
      auto bwd = [&](int d) { prog.push_back(backward(order[d][next_b[d]++], stage[d])); };
      for (int k = 0; k < steps; ++k) {
        for (int i = 0; i < a; ++i) {
          if (k > 0) bwd(own);
          fwd(own);
          fwd(own);
        }
        for (int i = 0; i < b; ++i) {
          fwd(other);
          fwd(other);
          fwd(own);
          fwd(own);
        }
        for (int i = 0; i < a; ++i) {
          fwd(other);
          fwd(other);
          bwd(other);
        }
        for (int i = 0; i < b + H; ++i) {
          bwd(own);
          bwd(other);
        }
      }
      for (int i = 0; i < a; ++i) bwd(own);
    }
    return out;
  }
};
static_assert(schedule_family<chimera_fd>);

}  // namespace loom
