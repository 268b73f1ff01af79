// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The per-rank op order shared by DualPipe and DualPipeV (DeepSeek-AI, "DeepSeek-V3 Technical
//! Report", arXiv 2412.19437, 2024, §3.2.1 and Fig. 5; the reference implementation
//! deepseek-ai/DualPipe, `dualpipe.py` and `dualpipev.py`, whose eight steps are reproduced here).
//!
//! Both schedules give every rank two *phases*: phase 0 is the virtual stage the rank runs early
//! on a microbatch's path, phase 1 the one it runs late. With `H` ranks per half (DualPipe:
//! `H = P/2`, the rank's position `h = min(r, P-1-r)`; DualPipeV: `H = P`, `h = r`) and `n`
//! microbatches per phase, rank `h` runs
//!
//! | step | repeats          | body                                            |
//! |------|------------------|-------------------------------------------------|
//! | 1    | 2(H-h-1)         | F0                                              |
//! | 2    | h+1              | F0 F1                                           |
//! | 3    | H-h-1            | B1 W F1            (B1 split: its W runs now)   |
//! | 4    | n-2H+h+1         | FB(F0,BW1) FB(F1,BW0)  (the middle rank runs its first pair unoverlapped) |
//! | 5    | H-h-1            | BW1 FB(F1,BW0)                                  |
//! | 6    | h+1              | B1 B0              (the later half split: B now, W queued) |
//! | 7    | H-h-1            | W B0               (B0 split, W queued)         |
//! | 8    | h+1              | W                                               |
//!
//! where every F/B of a phase takes that phase's next microbatch in order and every W the
//! oldest queued one (the reference's FIFO `WeightGradStore`). Step 4 needs `n >= 2H-1` on rank
//! 0 (the reference asserts `n >= 2H`, i.e. `m >= 2P` for both). For fewer microbatches loom
//! plans the order for `2H-1` per phase and drops the actions of microbatches that do not exist:
//! dependencies only link actions of one microbatch, so removing whole microbatches from a
//! deadlock-free order leaves a deadlock-free order (an FB that loses one half becomes the
//! other half alone). With an odd `m` the two DualPipe directions carry different counts: the
//! order is planned for the shorter one and the longer direction's extra microbatch runs as an
//! unpaired steady-state step (`dual_phase_rank::extra`), so it costs its own work, not a
//! phantom's.

#include <cstddef>
#include <vector>

#include "loom/schedule/action.hpp"

namespace loom::detail {

//! One rank of a DualPipe-style order: its position and the phases it runs.
struct dual_phase_rank {
  int halves = 1;        //!< H: ranks per half (DualPipe P/2, DualPipeV P)
  int half_rank = 0;     //!< h: position within the half, 0 = outermost
  int planned = 1;       //!< microbatches per phase the order is built for (>= 2H-1)
  int count[2] = {0, 0};    //!< microbatches that exist per phase (<= planned)
  int stage[2] = {0, 0};    //!< virtual stage of phase 0 and phase 1 on this rank
  int mb_base[2] = {0, 0};  //!< id of the first microbatch of each phase
  //! Microbatches phase `p` runs beyond `planned` (DualPipe with an odd count: one direction
  //! carries one more). Each is one more steady-state step with nothing to pair it with, at the
  //! end of step 4: phase 0 runs its next forward, then its next full backward; phase 1 the
  //! backward, then the forward (each half where a step-4 iteration has it).
  int extra[2] = {0, 0};
};

//! The smallest per-phase microbatch count for which the eight steps are well formed.
constexpr int dual_phase_min_planned(int halves) { return 2 * halves - 1; }

//! The program of one rank (see the file comment).
constexpr std::vector<action> dual_phase_program(const dual_phase_rank& x) {
  const int H = x.halves, h = x.half_rank, n = x.planned;
  const bool middle = h == H - 1;
  std::vector<action> prog;
  prog.reserve(static_cast<std::size_t>(6 * n));
  int nf[2] = {0, 0}, nb[2] = {0, 0};
  // Queued weight-gradient halves, in FIFO order; `exists` false for a dropped microbatch.
  struct pending {
    bool exists;
    action w;
  };
  std::vector<pending> wq;
  wq.reserve(static_cast<std::size_t>(2 * n));
  std::size_t wq_head = 0;

  // Next forward/backward of phase p: its action, or nothing for a dropped microbatch.
  auto next_f = [&](int p, action& out) {
    int i = nf[p]++;
    out = forward(x.mb_base[p] + i, x.stage[p]);
    return i < x.count[p];
  };
  auto next_b = [&](int p, action& out) {
    int i = nb[p]++;
    out = backward(x.mb_base[p] + i, x.stage[p]);
    return i < x.count[p];
  };
  auto f = [&](int p) {
    action a;
    if (next_f(p, a)) prog.push_back(a);
  };
  auto b = [&](int p, bool split) {
    action a;
    bool exists = next_b(p, a);
    if (split) {
      if (exists) prog.push_back(backward_input(a.mb, a.stage));
      wq.push_back({exists, backward_weight(a.mb, a.stage)});
    } else if (exists) {
      prog.push_back(a);
    }
  };
  auto w = [&] {
    if (wq_head < wq.size()) {
      pending const& e = wq[wq_head++];
      if (e.exists) prog.push_back(e.w);
    }
  };
  auto fb = [&](int pf, int pb) {
    action fa, ba;
    bool fe = next_f(pf, fa), be = next_b(pb, ba);
    if (fe && be) prog.push_back(overlapped(fa.mb, fa.stage, op::BW, ba.mb, ba.stage));
    else if (fe) prog.push_back(fa);
    else if (be) prog.push_back(ba);
  };

  for (int i = 0; i < 2 * (H - h - 1); ++i) f(0);                // step 1
  for (int i = 0; i < h + 1; ++i) { f(0); f(1); }                // step 2
  for (int i = 0; i < H - h - 1; ++i) { b(1, true); w(); f(1); }  // step 3
  for (int i = 0; i < n - 2 * H + h + 1; ++i) {                  // step 4
    if (i == 0 && middle) {
      // The reference does not overlap the middle rank's first pair: the backward of phase 1
      // then starts as soon as its own forward ends, which shortens the bubble.
      f(0);
      b(1, false);
    } else {
      fb(0, 1);
    }
    fb(1, 0);
  }
  for (int e = 0; e < x.extra[0]; ++e) {                         // unpaired steps
    f(0);
    b(0, false);
  }
  for (int e = 0; e < x.extra[1]; ++e) {
    b(1, false);
    f(1);
  }
  for (int i = 0; i < H - h - 1; ++i) { b(1, false); fb(1, 0); }  // step 5
  bool split = false;                                              // step 6
  for (int i = 0; i < h + 1; ++i) {
    if (i == (h + 1) / 2 && h % 2 == 1) split = true;
    b(1, split);
    if (i == (h + 1) / 2 && h % 2 == 0) split = true;
    b(0, split);
  }
  for (int i = 0; i < H - h - 1; ++i) { w(); b(0, true); }        // step 7
  while (wq_head < wq.size()) w();                                 // step 8
  return prog;
}

}  // namespace loom::detail
