// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! DualPipeV (deepseek-ai/DualPipe, `dualpipev.py`, 2025; the "cut-in-half" procedure of Sea AI
//! Lab applied to DualPipe of the DeepSeek-V3 Technical Report, arXiv 2412.19437, §3.2.1;
//! PyTorch's `ScheduleDualPipeV` runs the same order).
//!
//! DualPipe's two directions folded onto half the ranks: one direction, V placement with
//! 2 chunks per rank (`S = 2P`, stage `s < P` on rank `s`, stage `s >= P` on rank `2P-1-s`,
//! `q = 1/2`), one parameter copy (a rank holds `1/P` of the model, as in a plain pipeline;
//! DeepSeek's "2x" counts against a device holding one of the `PP = 2P` stages). Each rank
//! overlaps the forward of one of its chunks with the full backward (`BW`) of the other as one
//! `FB` action. Op order: `dualpipe_order.hpp` with `H = P` and `h = r`.
//!
//! Shapes: any `P >= 1`, 2 chunks per rank, any `m >= 1`. The reference requires
//! `m >= 2P`; loom builds the same order for those shapes and, for fewer microbatches, drops
//! the missing ones from the order planned for `2P-1` (valid by construction).
//!
//! Closed forms. In DualPipe's notation (per stage chunk) `F = q*f`, `B = q*(b+w)` (the full
//! backward), `W = q*w`, `F&B = q*fb` (`q*(f+b+w)` when `fb < 0`), `PP = 2P` stages. For
//! `m >= 2P`, `c = 0`, `f = b` and `b + w <= fb <= f + b + w` (the pair no
//! shorter than its longer half, no longer than both halves in turn), the largest per-rank bubble
//! (makespan - busy) is exactly the paper's `(PP/2-1)(F&B + B - 3W) = (P-1)(fb + b - 2w)/2`
//! (every rank has it when `fb = f+b+w`; otherwise the last ranks). Peak activation with
//! `M_W/M_B = 1` is the paper's `PP+1` chunks on every rank: `(2P+1)/2 = P + 1/2` units.
//!
//! P = 2, m = 4, f = b = w = 2, fb = 6 (each chunk costs half: one column per time unit;
//! upper case the first leg (stages 0, 1), lower case the return leg (stages 2, 3); `BW`/`bw` a
//! fused backward, `[Fi+bj]` a forward overlapped with a fused backward; bubble
//! (2-1)(6+2-4)/2 = 2 on every rank; identical to PyTorch's DualPipeV order):
//! ```
//! r0 F0  F1  F2  f0  b0  w0  f1  [F3+b1====] .   [f2+B0====] bw2     .   [f3+B1====] bw3     B2  W2  B3  W3
//! r1 .   F0  f0  F1  f1  F2  bw0     [f2+B0====] [F3+b1====] [f3+B1====] bw2     BW2     .   b3  B3  w3  W3
//! ```

#include <string>
#include <string_view>

#include "loom/schedule/dualpipe_order.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The DualPipeV schedule family (`dualpipe-v`): DualPipe cut in half onto a V placement
//! (`S = 2P`, rank `r` holds stages `r` and `2P-1-r`), one parameter copy, the two chunks of a
//! rank overlapped as `FB` pairs.
struct dualpipe_v {
  static constexpr std::string_view name = "dualpipe-v";
  static constexpr std::string_view summary =
      "DualPipeV: DualPipe cut in half onto a V placement, overlapped forward+backward pairs (DeepSeek-AI / Sea AI Lab 2025)";
  static constexpr int default_chunks = 2;
  constexpr text check(shape s) const { return detail::check_basic(name, s, 2); }
  constexpr schedule generate(shape s) const {
    const int P = s.ranks, m = s.microbatches;
    schedule out = make_schedule(name, s, 2 * P, placement_kind::v);
    out.chunks = 2;
    const int planned = m > detail::dual_phase_min_planned(P) ? m : detail::dual_phase_min_planned(P);
    for (int r = 0; r < P; ++r) {
      detail::dual_phase_rank x;
      x.halves = P;
      x.half_rank = r;
      x.planned = planned;
      x.count[0] = x.count[1] = m;
      x.stage[0] = r;
      x.stage[1] = 2 * P - 1 - r;
      out.programs[static_cast<std::size_t>(r)] = detail::dual_phase_program(x);
    }
    return out;
  }
};
static_assert(schedule_family<dualpipe_v>);

}  // namespace loom
