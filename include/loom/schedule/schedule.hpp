// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! A pipeline schedule: the placement of virtual stages on ranks and one program per rank.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/shape.hpp"

namespace loom {

//! How virtual stages map to ranks (ARCHITECTURE.md, "Ranks and stages").
//! `loop`: stage `s` on rank `s mod P`; `v`: stage `s < P` on rank `s`, stage `s >= P` on
//! rank `2P-1-s`; `bidirectional`: two paths in opposite directions; `custom`: anything else
//! (imported schedules, user families).
enum class placement_kind : unsigned char { loop, v, bidirectional, custom };

//! Name of a placement kind (`loop`, `v`, `bidirectional`, `custom`).
constexpr std::string_view to_string(placement_kind k) {
  switch (k) {
    case placement_kind::loop: return "loop";
    case placement_kind::v: return "v";
    case placement_kind::bidirectional: return "bidirectional";
    case placement_kind::custom: return "custom";
  }
  return "?";
}

//! Rank of stage `s` in the loop placement over `ranks` ranks.
constexpr int loop_rank(int s, int ranks) { return s % ranks; }
//! Rank of stage `s` in the V placement over `ranks` ranks (`2*ranks` stages).
constexpr int v_rank(int s, int ranks) { return s < ranks ? s : 2 * ranks - 1 - s; }

//! A schedule: shape, placement and the per-rank programs. Programs hold compute actions
//! only (as generated) or compute plus send/recv (after `lower`). Owning and constexpr: it may
//! be built, checked and simulated during constant evaluation.
struct schedule {
  text name;          //!< family name (`1f1b`, ...) or the source of an import
  int ranks = 0;             //!< P
  int microbatches = 0;      //!< m
  int chunks = 1;            //!< model chunks per rank
  int stages = 0;            //!< S: virtual stages along each microbatch's path
  int directions = 1;        //!< 1, or 2 for bidirectional schedules
  int param_copies = 1;      //!< parameter-memory multiplier (2 for model-replica schedules)
  placement_kind placement = placement_kind::loop;
  std::vector<int> stage_to_rank;  //!< rank of stage `s` on direction `d`: `[d * stages + s]`
  std::vector<int> mb_direction;   //!< direction of each microbatch (empty: all 0)
  std::vector<std::vector<action>> programs;  //!< one program per rank, in execution order
  //! T: training steps the programs run. Synchronous families run one (`microbatches` is m);
  //! an asynchronous family runs T steps without a flush, microbatch `t * m + i` being the
  //! i-th of step t, and `microbatches` is then T * m.
  int steps = 1;
  //! Versioned (asynchronous) schedules: the weight buffers of each stage, `[d * stages + s]`
  //! (version v of a stage lives in buffer v mod K, so writing version v + K drops version v).
  //! Empty for synchronous schedules, whose stages hold one version updated after the flush.
  std::vector<int> version_slots;
  //! Versioned schedules: true when a microbatch's forward and backward on a stage must read
  //! the same weight version (weight stashing); false where the rule reads the latest weights at
  //! every action (pipelined backpropagation, Kosson et al. 2021).
  bool stash = true;
  //! Vocabulary parallelism (Yeung et al., MLSys 2025): 0 none; 1 or 2, every rank holds one shard
  //! of the output layer and of the input embedding and runs the passes `S`, `T`, `IF`, `IB` of
  //! every microbatch (action.hpp); the last stage's backward of a microbatch waits for the
  //! all-reduce after its `T` passes (1: Algorithm 1, two barriers) or after its `S` passes (2:
  //! Algorithm 2, backward fusion, one barrier).
  int vocab = 0;

  //! Direction (path) of microbatch `mb`.
  constexpr int direction_of(int mb) const {
    return mb_direction.empty() ? 0 : mb_direction[static_cast<std::size_t>(mb)];
  }
  //! Rank that runs virtual stage `stage` of microbatch `mb`.
  constexpr int rank_of(int mb, int stage) const {
    return stage_to_rank[static_cast<std::size_t>(direction_of(mb) * stages + stage)];
  }
  //! True for an asynchronous schedule whose actions carry weight versions and updates.
  constexpr bool versioned() const { return !version_slots.empty(); }
  //! m: microbatches per step.
  constexpr int step_microbatches() const { return steps > 1 ? microbatches / steps : microbatches; }
  //! Fraction `q = P/S` of one rank's share of the model held by one virtual stage.
  constexpr double stage_fraction() const { return static_cast<double>(ranks) / stages; }
  //! Total number of actions over all ranks.
  constexpr std::size_t size() const {
    std::size_t n = 0;
    for (auto const& p : programs) n += p.size();
    return n;
  }
};

namespace detail {
//! Index of (microbatch `mb`, stage `st`) in per-cell tables of `m` microbatches. Stage-major:
//! consecutive actions of a rank touch neighbouring cells.
constexpr std::size_t cell(int mb, int st, int m) {
  return static_cast<std::size_t>(st) * static_cast<std::size_t>(m) + static_cast<std::size_t>(mb);
}
}  // namespace detail

//! An empty schedule of `s.ranks` programs over `stages` stages placed by `kind` (loop or v).
//! Generators start from this.
constexpr schedule make_schedule(std::string_view name, shape s, int stages, placement_kind kind) {
  schedule out;
  out.name = text(name);
  out.ranks = s.ranks;
  out.microbatches = s.microbatches;
  out.chunks = s.chunks < 1 ? 1 : s.chunks;
  out.stages = stages;
  out.placement = kind;
  out.stage_to_rank.resize(static_cast<std::size_t>(stages), 0);
  for (int st = 0; st < stages; ++st)
    out.stage_to_rank[static_cast<std::size_t>(st)] =
        kind == placement_kind::v ? v_rank(st, s.ranks) : loop_rank(st, s.ranks);
  out.programs.resize(static_cast<std::size_t>(s.ranks));
  return out;
}

}  // namespace loom
