// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! DualPipe (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, 2024, §3.2.1,
//! Fig. 5 and Table 2; reference code deepseek-ai/DualPipe, `dualpipe.py`).
//!
//! Two pipelines run in opposite directions over the same `P` ranks (`P` even): direction 0
//! places stage `s` on rank `s`, direction 1 on rank `P-1-s`, so rank `r` holds stage `r` of
//! direction 0 and stage `P-1-r` of direction 1 (`S = P` stages per path, `q = P/S = 1`, two
//! parameter copies: `param_copies = 2`). Microbatches `0 .. ceil(m/2)-1` enter at rank 0
//! (direction 0), the rest at rank `P-1` (direction 1). Each rank interleaves the forward of
//! one direction with the full backward (`BW`) of the other as one overlapped `FB` action,
//! which DeepSeek run with the communication of each half hidden under the computation of the
//! other. Op order: `dualpipe_order.hpp` with `H = P/2` and `h = min(r, P-1-r)`.
//!
//! Shapes: any even `P >= 2`, 2 chunks per rank, any `m >= 1`. The reference requires `m`
//! even and `m >= 2P`; loom builds the same order for those shapes. An odd `m` is scheduled for
//! real: direction 0 carries one more microbatch, which runs as one unpaired steady-state step
//! (its forward and full backward with no partner from the other direction) on every rank, so
//! for `m >= 2P-1` it is strictly faster than `m+1` (tested for every even P up to 16; P = 4 at
//! unit costs: 26, 30, 32 for m = 8, 9, 10). For fewer microbatches (`m/2 < P-1`) the order is
//! planned for `P-1` per direction and the microbatches that do not exist are dropped (valid by
//! construction; there an odd `m` can take as long as `m+1`).
//!
//! Closed forms. In DualPipe's notation (per stage chunk) `F = q*f`, `B = q*(b+w)` (the full
//! backward), `W = q*w`, `F&B = q*fb` (`q*(f+b+w)` when `fb < 0`), `PP = P` stages. For
//! `m` even, `m >= 2P`, `c = 0`, `f = b` and `b + w <= fb <= f + b + w` (the pair no
//! shorter than its longer half, no longer than both halves in turn), the largest per-rank
//! bubble (makespan - busy) is exactly the paper's `(PP/2-1)(F&B + B - 3W) = (P/2-1)(fb + b - 2w)`
//! (every rank has it when `fb = f+b+w`; otherwise the two middle ranks). Peak activation with
//! `M_W/M_B = 1` is the paper's `PP+1` chunks on every rank: `P+1` units.
//!
//! P = 4, m = 8, f = b = w = 1, fb = 3 (one column per time unit; `BW` a fused backward,
//! `[Fi+Bj]` a forward overlapped with a fused backward; microbatches 4..7 run direction 1;
//! bubble (4/2-1)(3+1-2) = 2 on every rank):
//! ```
//! r0 F0  F1  F2  F4  B4  W4  F5  [F3+B5====] .   [F6+B0====] BW6     .   [F7+B1====] BW7     B2  W2  B3  W3
//! r1 .   F0  F4  F1  F5  F2  BW4     [F6+B0====] [F3+B5====] [F7+B1====] BW6     BW2     .   B7  B3  W7  W3
//! r2 .   F4  F0  F5  F1  F6  BW0     [F2+B4====] [F7+B1====] [F3+B5====] BW2     BW6     .   B3  B7  W3  W7
//! r3 F4  F5  F6  F0  B0  W0  F1  [F7+B1====] .   [F2+B4====] BW2     .   [F3+B5====] BW3     B6  W6  B7  W7
//! ```

#include <string>
#include <string_view>

#include "loom/schedule/dualpipe_order.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The DualPipe schedule family (`dualpipe`): two pipelines in opposite directions over the
//! same `P` ranks (even `P`), rank `r` holding stage `r` of direction 0 and stage `P-1-r` of
//! direction 1 (two parameter copies), the first `ceil(m/2)` microbatches on direction 0 and
//! the rest on direction 1, forwards and backwards of the two directions overlapped as `FB`.
struct dualpipe {
  static constexpr std::string_view name = "dualpipe";
  static constexpr std::string_view summary =
      "DeepSeek DualPipe: bidirectional, overlapped forward+backward pairs, 2 parameter copies (DeepSeek-V3 2024)";
  static constexpr int default_chunks = 2;
  constexpr text check(shape s) const {
    if (text rule = detail::check_basic(name, s, 2); !rule.empty()) return rule;
    if (s.ranks < 2 || s.ranks % 2 != 0)
      return text(name) + " needs an even number of ranks >= 2 (got " + detail::to_text(s.ranks) + ")";
    return {};
  }
  constexpr schedule generate(shape s) const {
    const int P = s.ranks, m = s.microbatches, H = P / 2;
    const int n0 = (m + 1) / 2, n1 = m / 2;  // microbatches of direction 0 and 1
    schedule out = detail::mirrored_frame(name, s, 2);
    for (int i = n0; i < m; ++i) out.mb_direction[static_cast<std::size_t>(i)] = 1;
    // Planned per phase: the shorter direction's count (at least the eight steps' minimum); the
    // longer direction's extra microbatch (odd m) runs as an unpaired steady-state step.
    const int planned = n1 > detail::dual_phase_min_planned(H) ? n1 : detail::dual_phase_min_planned(H);
    for (int r = 0; r < P; ++r) {
      detail::dual_phase_rank x;
      x.halves = H;
      x.half_rank = r < P - 1 - r ? r : P - 1 - r;
      x.planned = planned;
      for (int p = 0; p < 2; ++p) {
        // Phase 0 is the direction in which this rank is early (stage h), phase 1 the other.
        const int dir = p ^ (r >= H ? 1 : 0);
        x.stage[p] = p == 0 ? x.half_rank : P - 1 - x.half_rank;
        x.count[p] = dir == 0 ? n0 : n1;
        x.mb_base[p] = dir == 0 ? 0 : n0;
        if (dir == 0 && n0 > planned) x.extra[p] = n0 - planned;
      }
      out.programs[static_cast<std::size_t>(r)] = detail::dual_phase_program(x);
    }
    return out;
  }
};
static_assert(schedule_family<dualpipe>);

}  // namespace loom
