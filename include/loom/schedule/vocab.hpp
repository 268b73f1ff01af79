// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! 1F1B with vocabulary parallelism (Yeung, Qi, Lin, Wan, "Balancing Pipeline Parallelism with
//! Vocabulary Parallelism", MLSys 2025, arXiv 2411.05288): the input embedding and the output
//! layer are split by vocabulary rows over all p ranks instead of sitting on the first and the
//! last. Every rank runs, per microbatch, the output layer's `S` and `T` passes and the input
//! layer's `IF` and `IB` passes on its shard (action.hpp), joined by all-reduce barriers
//! (simulate.hpp). Two variants: `1f1b-vocab-1` (Algorithm 1, two barriers: the last stage's
//! backward waits for the `T` passes) and `1f1b-vocab-2` (Algorithm 2, backward fusion, one
//! barrier: it waits for the `S` passes). Their activation memory is p + 2 and p + 1 microbatches
//! (1F1B: p) on the first rank, p - r + 2 and p - r + 1 on rank r; their bubble is 1F1B's.
//! The same passes in V-Half, `v-half-vocab-1` and `v-half-vocab-2` (`v_half_vocab`, the authors'
//! `v-half-vocab` branch), are at the end of this file.
//!
//! The rule is the authors' generator, `forward_backward_pipelining_with_vocab_parallel`
//! (sail-sg/VocabularyParallelism, `megatron/core/pipeline_parallel/vocab_parallel_schedule.py`,
//! commit 6191c3bf), which loom rewrites from the rule, keeping the order of the compute passes
//! (the collectives and point-to-point transfers are loom's lowering's and simulator's business):
//! - **Placement of the output layer.** From the forward time f and the full backward time b
//!   (loom: `b + w`; the authors' default f = 1, b = 2 is loom's unit costs), a walk from the last
//!   rank up gives each rank a kind, BSF (its lm-head step between a backward and the next
//!   forward) or BFS (after the forward), and an offset of its `S` from the last rank's: going up
//!   one rank subtracts f while the offset stays >= -b, else the rank is BFS and the next one BSF
//!   at offset + b - f. `nws[r]`, the lm-head steps between rank r's warm-up forwards and its first
//!   backward, grows by one per rank going up except from a BFS rank to the BSF rank above it.
//! - **lm-head step k** (k = 0..m, on every rank): `T(k-1)` (k > 0), then `S(k)` (k < m).
//! - **Rank r** runs, with o = 1 for Vocab-1 and 0 for Vocab-2, W = p - r warm-up forwards,
//!   R = m - W - 1 - o steady iterations and m - R cool-down iterations:
//!   1. r + 1 `IF`s; then W times `IF`, `F`;
//!   2. step 0, (Vocab-1: `IF`), `F(W)`, (Vocab-1: step 1, `F(W+1)`);
//!   3. `nws[r]` steps, each followed by an `IF` from step `nws[0] + o` on;
//!   4. steady: the backward of the oldest microbatch, then the next forward; a BSF rank runs a
//!      step after the backward, a BFS rank after the forward, each followed by an `IF` (from step
//!      `nws[0] + o` on) and by the `IB` begun in that iteration (from step `nws[0] + 2 + o` on);
//!   5. cool-down: the remaining backwards, each with a step while steps remain (Vocab-1 runs step
//!      m here) and its `IB`;
//!   6. the remaining `IB`s, then (Vocab-2) step m: `T(m-1)`.
//! ctest checks the per-rank orders against the authors' generator's on p in {2, 4, 8}, m in
//! {p + 1 + o, 2p, 4p} and (f, b) in {(1, 1), (1, 2), (1, 3)} (tests/schedule/data/vocab_reference.txt).
//!
//! Shapes: p >= 2 ranks, one chunk, m >= p + 1 + o microbatches (below that the authors'
//! generator issues the input layer's forward of a microbatch that does not exist). In the default
//! registry with `family_entry::vocab` set: `loom::pipeline` runs them with a rank's
//! `loom::vocab_layers` (loom/exec/vocab_parallel.hpp; host backends), and `loom best` ranks them
//! with `--vocab-parallel` (docs/vocab.md).

#include <algorithm>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/v_block.hpp"

namespace loom {

namespace detail {

//! The output layer's placement on each rank (see the file comment): BSF (true) or BFS, the
//! offset of its `S` from the last rank's, and the lm-head steps before its first backward.
struct vocab_placement {
  std::vector<char> bsf;
  std::vector<double> offset;
  std::vector<int> warmup_steps;
};

constexpr vocab_placement place_vocab(int p, double f, double b) {
  vocab_placement v;
  double offset = 0;
  v.bsf.push_back(1);  // the last rank
  v.offset.push_back(0);
  while (static_cast<int>(v.bsf.size()) < p) {
    if (offset - f >= -b) {
      offset -= f;
      v.bsf.push_back(1);
      v.offset.push_back(offset);
    } else {
      v.bsf.push_back(0);
      v.offset.push_back(offset);
      offset += b - f;
      v.bsf.push_back(1);
      v.offset.push_back(offset);
    }
  }
  v.bsf.resize(static_cast<std::size_t>(p));
  v.offset.resize(static_cast<std::size_t>(p));
  std::reverse(v.bsf.begin(), v.bsf.end());
  std::reverse(v.offset.begin(), v.offset.end());
  v.warmup_steps.assign(static_cast<std::size_t>(p), 0);
  for (int r = p - 2; r >= 0; --r) {
    const auto u = static_cast<std::size_t>(r);
    v.warmup_steps[u] = !v.bsf[u + 1] && v.bsf[u] ? v.warmup_steps[u + 1] : v.warmup_steps[u + 1] + 1;
  }
  return v;
}

//! The lowered program's bound: per microbatch at most 7 actions per virtual stage (3 compute, 4
//! transfers), the 4 passes on every rank and the layers' messages (each sent and received),
//! 4 (p - 1) + p (p - 1) of them, which grow with p^2; over `m` microbatches it must stay within
//! `loom::max_actions` (the bound every lowered schedule keeps; found by tests/fuzz).
constexpr text check_vocab_actions(std::string_view name, shape s) {
  const long long p = s.ranks, per_mb = 7 * p * s.chunks + 4 * p + 2 * (p - 1) * (p + 4);
  if (per_mb * s.microbatches > max_actions)
    return text(name) + " needs microbatches x (7 ranks chunks + 4 ranks + 2 (ranks - 1)(ranks + 4)) <= " + to_text(max_actions) +
           " (its lowered program, whose layer messages grow with ranks^2 per microbatch, must stay within loom::max_actions; got " +
           to_text(per_mb * s.microbatches) + ")";
  return {};
}

//! The shape rule of `1f1b-vocab-<variant>`.
constexpr text check_vocab_1f1b(std::string_view name, int variant, shape s) {
  if (text r = check_basic(name, s, 1); !r.empty()) return r;
  if (s.ranks < 2) return text(name) + " needs ranks >= 2 (vocabulary parallelism splits the vocabulary over them; got ranks=" + to_text(s.ranks) + ")";
  const int least = s.ranks + 1 + (variant == 1 ? 1 : 0);
  if (s.microbatches < least)
    return text(name) + " needs microbatches >= ranks + " + to_text(least - s.ranks) + " = " + to_text(least) +
           " (its warm-up runs that many input-layer passes; got microbatches=" + to_text(s.microbatches) + ")";
  return check_vocab_actions(name, s);  // loom's size limits: `check` adds them
}

//! 1F1B with vocabulary parallelism, Algorithm `variant` (1 or 2), under costs `k` (see the file
//! comment).
constexpr schedule vocab_1f1b(std::string_view name, int variant, shape s, const costs& k) {
  const int p = s.ranks, m = s.microbatches, o = variant == 1 ? 1 : 0;
  schedule out = make_schedule(name, s, p, placement_kind::loop);
  out.vocab = variant;
  const double f = k.f, b = k.b + k.w;
  const vocab_placement v = place_vocab(p, f, b);
  const int nws0 = v.warmup_steps[0];
  for (int r = 0; r < p; ++r) {
    const auto u = static_cast<std::size_t>(r);
    auto& prog = out.programs[u];
    prog.reserve(static_cast<std::size_t>(6 * m + 2));
    const bool bsf = v.bsf[u] != 0;
    const bool early = bsf || v.offset[u] - f > -b;  // an iteration's input backward begins before its backward
    const int W = p - r, R = m - W - 1 - o, C = m - R;
    int next_if = 0, next_ib = 0, step = 0;
    auto input_forward = [&] {
      if (next_if < m) prog.push_back(vocab_pass(op::IF, next_if++, r));
    };
    auto lm_head = [&] {  // step `step`: T of the previous microbatch, S of this one
      if (step > 0) prog.push_back(vocab_pass(op::T, step - 1, r));
      if (step < m) prog.push_back(vocab_pass(op::S, step, r));
      ++step;
    };
    auto step_with_input = [&] {  // a step, then an input forward once they have begun
      const bool with_if = step >= nws0 + o;
      lm_head();
      if (with_if) input_forward();
    };
    auto begin_ib = [&] { return step >= nws0 + 2 + o && next_ib < m ? next_ib++ : -1; };
    auto run_ib = [&](int& ib) {
      if (ib >= 0) prog.push_back(vocab_pass(op::IB, ib, r));
      ib = -1;
    };
    // 1. The input layer's prologue and the warm-up forwards.
    for (int i = 0; i <= r; ++i) input_forward();
    for (int i = 0; i < W; ++i) {
      input_forward();
      prog.push_back(forward(i, r));
    }
    // 2. The first lm-head step(s).
    lm_head();
    if (o) input_forward();
    prog.push_back(forward(W, r));
    if (o) {
      lm_head();
      prog.push_back(forward(W + 1, r));
    }
    // 3. The warm-up lm-head steps.
    for (int i = 0; i < v.warmup_steps[u]; ++i) step_with_input();
    // 4. Steady state: one backward, one forward.
    for (int i = 0; i < R; ++i) {
      int ib = early ? begin_ib() : -1;
      prog.push_back(backward(i, r));
      if (bsf) {
        step_with_input();
        run_ib(ib);
      } else if (!early) {
        ib = begin_ib();
      }
      prog.push_back(forward(i + W + 1 + o, r));
      if (!bsf) {
        step_with_input();
        run_ib(ib);
      }
    }
    // 5. Cool-down: the remaining backwards with the remaining steps.
    for (int i = 0; i < C; ++i) {
      const bool steps_left = step <= m - 1 + o;
      int ib = early ? begin_ib() : -1;
      prog.push_back(backward(R + i, r));
      if (!early) ib = begin_ib();
      if (steps_left) lm_head();
      run_ib(ib);
    }
    // 6. The remaining input backwards, then (Vocab-2) the T of the last microbatch.
    while (next_ib < m) prog.push_back(vocab_pass(op::IB, next_ib++, r));
    if (!o) lm_head();
  }
  return out;
}


//! The shape rule of `v-half-vocab-<variant>`.
constexpr text check_vocab_v_half(std::string_view name, int variant, shape s) {
  if (text r = check_v_shape(name, s); !r.empty()) return r;
  if (s.ranks < 2 || s.ranks % 2 != 0)
    return text(name) + " needs an even number of ranks >= 2 (the authors' generator issues rank 0's chunk-0 forward of microbatch p/2 + 1 "
                        "before that microbatch's input-layer pass when p is odd; got ranks=" + to_text(s.ranks) + ")";
  const int least = variant == 1 ? std::max(3, s.ranks / 2 + 1) : 2;
  if (s.microbatches < least)
    return text(name) + " needs microbatches >= " + to_text(least) +
           (variant == 1 ? text(" = max(3, ranks/2 + 1)") : text("")) +
           " (with fewer, the authors' rule times the last microbatch's " + text(variant == 1 ? "T" : "S") +
           " passes after rank 0's last-stage backward, which waits for them; got microbatches=" + to_text(s.microbatches) + ")";
  return check_vocab_actions(name, s);
}

//! V-Half with vocabulary parallelism, Algorithm `variant` (see `v_half_vocab`): the rule of the
//! authors' generator (sail-sg/zero-bubble-pipeline-parallelism, branch `v-half-vocab`, commit
//! 92895b9a, `megatron/core/pipeline_parallel/zerobubble/scheduler/`), rewritten from the rule:
//!  1. the V-Half building block (`zbv_greedy.py` `stable_pattern_v_half`) with its backward offset
//!     I = 3 (even p) grown by 6 for vocabulary parallelism and by 6 more for Algorithm 1: rank r
//!     runs f, F, B, b of microbatch j in slots 2r, 3p - r - 2, 3p + I + 2r - 1, 6p + I - r - 2,
//!     plus 6j;
//!  2. the weight passes in the rank's free slots, a pending chunk-1 W before a pending chunk-0 W,
//!     each chunk's in microbatch order, the rest after the last slot (`put_w`, split);
//!  3. each rank runs its passes in slot order; their start times are those of that order run as
//!     early as dependencies allow with every pass 1000 units and a hop between ranks 1
//!     (`passes.py` `add_time`);
//!  4. the vocabulary passes take times from rank 0's chunk-1 forwards (`add_embedding_passes`):
//!     with t_S(j) = the end of rank 0's F(j) + 1000 and w = p/2 + 1, S(j) at t_S(j), T(j) at
//!     t_S(j + 1) (the last at t_S(m - 1) + 4000), IF(j) first for j < w and at t_S(j - w) after,
//!     IB(j) at t_S(j + w + 2) for j < m - w - 2 and after every transformer pass for the rest;
//!  5. each rank's order is all its passes sorted by start time, ties kept in the order
//!     transformer passes, IF, T, S, IB (`communication.py` `reorder_communication`).
constexpr schedule vocab_v_half(std::string_view name, int variant, shape s) {
  const int p = s.ranks, m = s.microbatches;
  using time = long long;
  constexpr time pass = 1000, hop = 1;
  const int I = (p % 2 == 0 ? 3 : 0) + 6 + (variant == 1 ? 6 : 0);
  // 1. The building block, microbatch j shifted by 6j.
  v_timetable tt(p, m);
  for (int r = 0; r < p; ++r) {
    const int o[4] = {2 * r, 3 * p - r - 2, 3 * p + I + 2 * r - 1, 6 * p + I - r - 2};
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < m; ++j) tt.at(r, k, j) = o[k] + 6 * j;
  }
  // 2. The weight passes: chunk 1's first in every free slot, the rest after the last slot.
  const v_occupancy occ = v_occupy(tt, 0);
  for (int r = 0; r < p; ++r) {
    auto const& row = occ.occ[static_cast<std::size_t>(r)];
    int pending[2] = {0, 0}, next[2] = {0, 0};  // [0]: chunk 1 (W), [1]: chunk 0 (w)
    auto place = [&](int which, int slot) {
      tt.at(r, which == 0 ? v_w1 : v_w0, next[which]++) = slot;
      --pending[which];
    };
    int slot = 0;
    for (; slot < occ.horizon; ++slot) {
      const int code = row[static_cast<std::size_t>(slot)];
      if (code >= 0) {
        if (code / m == v_b1) ++pending[0];
        if (code / m == v_b0) ++pending[1];
      } else if (pending[0] > 0) {
        place(0, slot);
      } else if (pending[1] > 0) {
        place(1, slot);
      }
    }
    for (int which = 0; which < 2; ++which)
      while (pending[which] > 0) place(which, slot++);
  }
  // 3. Per-rank slot order, then start times with every pass `pass` long and `hop` between ranks.
  struct item {
    time start;
    int seq, kind, mb;  // kind: a v_pass, or 6 + vocabulary index (IF, T, S, IB)
  };
  std::vector<std::vector<item>> order(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& o = order[static_cast<std::size_t>(r)];
    for (int k = 0; k < 6; ++k)
      for (int j = 0; j < m; ++j) o.push_back({tt.at(r, k, j), 0, k, j});
    std::sort(o.begin(), o.end(), [](const item& a, const item& b) { return a.start < b.start; });
    for (std::size_t i = 0; i < o.size(); ++i) o[i].seq = static_cast<int>(i);
  }
  std::vector<time> end(static_cast<std::size_t>(p) * 6 * static_cast<std::size_t>(m), -1);
  auto end_of = [&](int r, int k, int j) -> time& {
    return end[(static_cast<std::size_t>(r) * 6 + static_cast<std::size_t>(k)) * static_cast<std::size_t>(m) + static_cast<std::size_t>(j)];
  };
  // The pass each one waits for (rank, pass), as in v_timetable::dependency_slot.
  auto dependency = [&](int r, int k, int& dr, int& dk) {
    switch (k) {
      case v_f0: dr = r - 1; dk = v_f0; break;
      case v_f1: dr = r < p - 1 ? r + 1 : r; dk = r < p - 1 ? v_f1 : v_f0; break;
      case v_b1: dr = r > 0 ? r - 1 : r; dk = r > 0 ? v_b1 : v_f1; break;
      case v_b0: dr = r < p - 1 ? r + 1 : r; dk = r < p - 1 ? v_b0 : v_b1; break;
      case v_w1: dr = r; dk = v_b1; break;
      default: dr = r; dk = v_b0; break;
    }
  };
  {
    std::vector<std::size_t> at(static_cast<std::size_t>(p), 0);
    std::vector<time> clock(static_cast<std::size_t>(p), 0);
    for (std::size_t left = static_cast<std::size_t>(6 * p * m); left > 0;) {
      bool moved = false;
      for (int r = 0; r < p; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        while (at[ur] < order[ur].size()) {
          item& it = order[ur][at[ur]];
          int dr = -1, dk = 0;
          dependency(r, it.kind, dr, dk);
          time t = clock[ur];
          if (dr >= 0) {
            const time e = end_of(dr, dk, it.mb);
            if (e < 0) break;
            t = std::max(t, dr != r ? e + hop : e);
          }
          it.start = t;
          clock[ur] = end_of(r, it.kind, it.mb) = t + pass;
          ++at[ur];
          --left;
          moved = true;
        }
      }
      if (!moved) throw schedule_error(text(name) + ": internal error, the building block's order deadlocks");
    }
  }
  // 4. The vocabulary passes' times, the same on every rank.
  std::vector<time> ts(static_cast<std::size_t>(m), 0);
  for (int j = 0; j < m; ++j) ts[static_cast<std::size_t>(j)] = end_of(0, v_f1, j) + pass;
  time last_end = 0;
  for (int r = 0; r < p; ++r)
    for (const item& it : order[static_cast<std::size_t>(r)]) last_end = std::max(last_end, it.start + pass);
  const int w = p / 2 + 1;
  auto vocab_time = [&](int v, int j) -> time {  // v: 0 IF, 1 T, 2 S, 3 IB
    const auto u = static_cast<std::size_t>(j);
    switch (v) {
      case 0: return j < w ? j - m : ts[u - static_cast<std::size_t>(w)];
      case 1: return j + 1 < m ? ts[u + 1] : ts[u] + 2 * pass + 2 * pass;
      case 2: return ts[u];
      default: return j < m - w - 2 ? ts[u + static_cast<std::size_t>(w) + 2] : last_end + j;
    }
  };
  // 5. Every rank's passes by start time, ties in insertion order.
  schedule out = make_schedule(name, s, 2 * p, placement_kind::v);
  out.chunks = 2;
  out.vocab = variant;
  constexpr op vocab_kinds[4] = {op::IF, op::T, op::S, op::IB};
  for (int r = 0; r < p; ++r) {
    auto& o = order[static_cast<std::size_t>(r)];
    for (int v = 0; v < 4; ++v)
      for (int j = 0; j < m; ++j) o.push_back({vocab_time(v, j), static_cast<int>(o.size()), 6 + v, j});
    std::sort(o.begin(), o.end(), [](const item& a, const item& b) { return a.start != b.start ? a.start < b.start : a.seq < b.seq; });
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(o.size());
    for (const item& it : o) {
      const int st = it.kind >= 6 ? r : v_chunk(it.kind) == 0 ? r : 2 * p - 1 - r;
      switch (it.kind) {
        case v_f0:
        case v_f1: prog.push_back(forward(it.mb, st)); break;
        case v_b0:
        case v_b1: prog.push_back(backward_input(it.mb, st)); break;
        case v_w0:
        case v_w1: prog.push_back(backward_weight(it.mb, st)); break;
        default: prog.push_back(vocab_pass(vocab_kinds[it.kind - 6], it.mb, r)); break;
      }
    }
  }
  return out;
}

}  // namespace detail

//! How a vocabulary of `vocab` rows splits over `p` pipeline ranks of `tp` tensor-parallel ranks
//! each, by the authors' rule (sail-sg/VocabularyParallelism at 6191c3bf:
//! `megatron/training/tokenizer/tokenizer.py` `_vocab_size_with_padding`, the assertion in
//! `megatron/training/arguments.py`, `VocabUtility` in `megatron/core/tensor_parallel/utils.py`):
//! the vocabulary is padded to the smallest multiple of `divisor` x `tp` (Megatron's
//! `make_vocab_size_divisible_by`, 128 by default), `divisor` must be a multiple of `tp` x `p` so
//! that the padded size splits exactly, and shard `i` = `pp_rank * tp + tp_rank` holds the
//! contiguous rows [i `rows`, (i + 1) `rows`). The padding rows take part in the softmax like any
//! other (the authors mask none). `ok` false: `error` is the rule broken, in one line.
struct vocab_split {
  bool ok = false;
  text error;
  long long padded = 0;  //!< the padded vocabulary
  long long rows = 0;    //!< rows per shard
};

//! The split of `vocab` rows over `p` x `tp` shards (see `vocab_split`).
constexpr vocab_split split_vocabulary(long long vocab, int p, int tp = 1, int divisor = 128) {
  vocab_split out;
  using detail::to_text;
  if (vocab < 1) {
    out.error = "vocabulary parallelism needs a vocabulary of at least 1 row (got " + to_text(vocab) + ")";
    return out;
  }
  if (p < 1 || tp < 1 || divisor < 1) {
    out.error = "vocabulary parallelism needs p, tp and the padding divisor >= 1 (got p=" + to_text(p) + ", tp=" + to_text(tp) +
                ", divisor=" + to_text(divisor) + ")";
    return out;
  }
  const long long shards = static_cast<long long>(p) * tp;
  if (divisor % shards != 0) {
    out.error = "vocabulary parallelism over " + to_text(p) + " x " + to_text(tp) + " ranks pads the vocabulary to a multiple of " +
                to_text(divisor) + " x tp, which must split into " + to_text(shards) + " equal shards: the padding divisor " +
                to_text(divisor) + " is not a multiple of " + to_text(shards) + " (use " + to_text(divisor * (shards / std::gcd(static_cast<long long>(divisor), shards))) + ")";
    return out;
  }
  const long long step = static_cast<long long>(divisor) * tp;
  out.padded = (vocab + step - 1) / step * step;
  out.rows = out.padded / shards;
  out.ok = true;
  return out;
}

//! 1F1B with vocabulary parallelism, Algorithm `Variant`: 1 (`1f1b-vocab-1`, two barriers;
//! activation memory p + 2 microbatches) or 2 (`1f1b-vocab-2`, backward fusion, one barrier; p + 1).
//! Cost-aware: the output layer's placement follows f and b + w.
template <int Variant>
  requires(Variant == 1 || Variant == 2)
struct one_f_one_b_vocab {
  static constexpr std::string_view name = Variant == 1 ? "1f1b-vocab-1" : "1f1b-vocab-2";
  static constexpr int vocab_algorithm = Variant;  //!< `schedule::vocab` of what it generates
  static constexpr std::string_view summary =
      Variant == 1 ? "1F1B with vocabulary parallelism, Algorithm 1: input and output layers split over every rank, two barriers (Yeung et al. 2025)"
                   : "1F1B with vocabulary parallelism, Algorithm 2: input and output layers split over every rank, one barrier (Yeung et al. 2025)";
  constexpr text check(shape s) const { return detail::check_vocab_1f1b(name, Variant, s); }
  constexpr schedule generate(shape s) const { return detail::vocab_1f1b(name, Variant, s, {}); }
  //! With `o.mem_limit` > 0, a schedule whose busiest rank holds more activation than the limit
  //! (p + 2 or p + 1 microbatches on rank 0; the order has no other choice) is refused with a line.
  constexpr schedule generate(shape s, const generate_options& o) const {
    schedule out = detail::vocab_1f1b(name, Variant, s, o.cost);
    if (o.mem_limit > 0) {
      const double peak = (o.model.stages.empty() ? simulate(out, o.cost) : simulate(out, o.model)).max_peak_activation();
      if (peak > o.mem_limit + 1e-9)
        throw schedule_error(text(name) + " holds " + detail::real_text(peak) + " units of activation on its busiest rank, above the memory limit " +
                             detail::real_text(o.mem_limit) + " (vocabulary parallelism keeps " + (Variant == 1 ? "2" : "1") +
                             " more microbatch(es) than 1F1B)");
    }
    return out;
  }
};
//! `1f1b-vocab-1`: Algorithm 1.
using one_f_one_b_vocab_1 = one_f_one_b_vocab<1>;
//! `1f1b-vocab-2`: Algorithm 2.
using one_f_one_b_vocab_2 = one_f_one_b_vocab<2>;
static_assert(cost_aware_family<one_f_one_b_vocab_1> && cost_aware_family<one_f_one_b_vocab_2>);


//! V-Half with vocabulary parallelism, Algorithm `Variant` (the authors' `v-half-vocab` branch;
//! see `detail::vocab_v_half`): `v-half-vocab-1` (two barriers) or `v-half-vocab-2` (one). Two
//! chunks per rank in the V placement, so rank 0 holds the first and the last transformer layers
//! (the loss and the roots of the output broadcasts). Activation memory p + 6 (Vocab-1) and p + 4
//! (Vocab-2) chunk activations on every rank, against V-Half's p + 2 (in microbatches: +2 and +1,
//! as in 1F1B). Shapes: even p (the authors' generator misplaces rank 0's input layer for odd p),
//! m >= 2 (Vocab-2) or m >= max(3, p/2 + 1) (Vocab-1): below that the rule deadlocks (checked for
//! every even p <= 32 in ctest). Uniform costs, as the authors assert: not cost-aware.
template <int Variant>
  requires(Variant == 1 || Variant == 2)
struct v_half_vocab {
  static constexpr std::string_view name = Variant == 1 ? "v-half-vocab-1" : "v-half-vocab-2";
  static constexpr int vocab_algorithm = Variant;  //!< `schedule::vocab` of what it generates
  static constexpr int default_chunks = 2;  //!< the V placement
  static constexpr std::string_view summary =
      Variant == 1 ? "V-Half with vocabulary parallelism, Algorithm 1: two chunks per rank, input and output layers split over every rank, two barriers (Yeung et al. 2025)"
                   : "V-Half with vocabulary parallelism, Algorithm 2: two chunks per rank, input and output layers split over every rank, one barrier (Yeung et al. 2025)";
  constexpr text check(shape s) const { return detail::check_vocab_v_half(name, Variant, s); }
  constexpr schedule generate(shape s) const { return detail::vocab_v_half(name, Variant, s); }
};
//! `v-half-vocab-1`: Algorithm 1.
using v_half_vocab_1 = v_half_vocab<1>;
//! `v-half-vocab-2`: Algorithm 2.
using v_half_vocab_2 = v_half_vocab<2>;
static_assert(schedule_family<v_half_vocab_1> && schedule_family<v_half_vocab_2>);

}  // namespace loom
