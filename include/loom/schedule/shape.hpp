// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The knobs of a schedule: its shape (ranks, microbatches, chunks) and its cost model.

namespace loom {

//! The shape of a pipeline schedule: `ranks` devices, `microbatches` per step and `chunks`
//! model chunks (virtual stages) per rank. `chunks = 0` means "the family's natural value".
//! A structural aggregate, so it can be a template argument (`static_schedule<F, shape{4, 8}>`).
struct shape {
  int ranks = 1;
  int microbatches = 1;
  int chunks = 0;
  friend constexpr bool operator==(const shape&, const shape&) = default;
};

//! The normative cost and memory model (ARCHITECTURE.md): `f`, `b`, `w` are the times of one
//! microbatch through one rank's share (1/P) of the model; `c` the p2p latency added between
//! dependent actions on different ranks; `fb` the time of an overlapped forward+backward pair
//! for that share (negative: the sum of its parts); `mem_w_ratio` the Zero Bubble paper's
//! M_W/M_B, the fraction of an activation that lives until W.
struct costs {
  double f = 1;
  double b = 1;
  double w = 1;
  double c = 0;
  double fb = -1;
  double mem_w_ratio = 1;
  friend constexpr bool operator==(const costs&, const costs&) = default;
};

}  // namespace loom
