// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The knobs of a schedule: its shape (ranks, microbatches, chunks) and its cost model.

#include "loom/schedule/error.hpp"

namespace loom {

//! The shape of a pipeline schedule: `ranks` devices, `microbatches` per step and `chunks`
//! model chunks (virtual stages) per rank. `chunks = 0` means "the family's natural value".
//! `steps` is T, the training steps one schedule spans: 1 for the synchronous families (each
//! step is the same schedule, flushed); an asynchronous family (`multi_step_family`) runs T steps
//! without a flush.
//! `group` is g, the microbatch group size of a grouped family (`grouped_family`:
//! `group-interleaved-1f1b`); 0 means the family's natural value, and every other family refuses
//! any other value.
//! A structural aggregate, so it can be a template argument (`static_schedule<F, shape{4, 8}>`).
struct shape {
  int ranks = 1;
  int microbatches = 1;
  int chunks = 0;
  int steps = 1;
  int group = 0;
  friend constexpr bool operator==(const shape&, const shape&) = default;
};

//! loom's size limits, checked up front by `generate`, `check` and the registry for every family
//! (a rule with a message, never a clamp). `max_ranks` bounds P; `max_shape_cells` bounds
//! ranks x microbatches x chunks, the number of forward passes of a loop-placed schedule: a
//! generated schedule then holds at most 3 compute actions per cell (F, B, W) and its lowering
//! at most 4 more (a send and a receive of an activation and of a gradient), so at most
//! `max_actions` actions in all, and per rank. A family whose generator searches (`zb-auto`,
//! `zb-v`, ...) states a smaller `max_cells` (or `max_ranks`) of its own. P is capped well below
//! the cells: lowering and validation keep per-channel tables of P x P entries. Below these limits the engine's index
//! arithmetic cannot overflow (`int` holds 7 * 2^20 * 2 with room to spare). The `loom` CLI
//! enforces the same limits.
inline constexpr int max_ranks = 1024;
//! See `max_ranks`.
inline constexpr long long max_shape_cells = 1LL << 20;
//! See `max_ranks`: 7 actions per cell (3 compute, 4 send/receive) over `max_shape_cells` cells.
inline constexpr long long max_actions = 7 * max_shape_cells;

//! The normative cost and memory model (ARCHITECTURE.md): `f`, `b`, `w` are the times of one
//! microbatch through one rank's share (1/P) of the model; `c` the p2p latency added between
//! dependent actions on different ranks; `fb` the time of an overlapped forward+backward pair
//! for that share (negative: the sum of its parts); `mem_w_ratio` the Zero Bubble paper's
//! M_W/M_B, the fraction of an activation that lives until W; `h` the time of one copy of that
//! share's activation between device and host memory, one way (`offload`/`reload` actions);
//! `s`, `t`, `e` the vocabulary-parallel passes of one microbatch on one rank's shard (`S`, `T`,
//! and each of `IF` and `IB`).
struct costs {
  double f = 1;
  double b = 1;
  double w = 1;
  double c = 0;
  double fb = -1;
  double mem_w_ratio = 1;
  double h = 0;
  double s = 0;
  double t = 0;
  double e = 0;
  friend constexpr bool operator==(const costs&, const costs&) = default;
};

namespace detail {
//! The rule `k` breaks, or "": `f`, `b`, `w`, `c`, `h`, `s`, `t` and `e` finite and >= 0, `fb` finite (negative: the
//! sum of its parts), `mem_w_ratio` (`mem-w-ratio` in messages, as on the CLI) in [0, 1]. `simulate` and the cost-aware generators throw
//! `config_error` with it.
constexpr text check_costs(const costs& k) {
  auto rule = [](const char* name, double v) -> text {
    if (finite(v) && v >= 0) return {};
    return text("cost ") + name + " must be a finite number >= 0 (got " + name + "=" + real_text(v) + ")";
  };
  if (text r = rule("f", k.f); !r.empty()) return r;
  if (text r = rule("b", k.b); !r.empty()) return r;
  if (text r = rule("w", k.w); !r.empty()) return r;
  if (text r = rule("c", k.c); !r.empty()) return r;
  if (text r = rule("h", k.h); !r.empty()) return r;
  if (text r = rule("s", k.s); !r.empty()) return r;
  if (text r = rule("t", k.t); !r.empty()) return r;
  if (text r = rule("e", k.e); !r.empty()) return r;
  if (!finite(k.fb)) return "cost fb must be finite (negative: the sum of its parts) (got fb=" + real_text(k.fb) + ")";
  if (!(k.mem_w_ratio >= 0 && k.mem_w_ratio <= 1))
    return "mem-w-ratio must be in [0, 1] (got mem-w-ratio=" + real_text(k.mem_w_ratio) + ")";
  return {};
}
}  // namespace detail

}  // namespace loom
