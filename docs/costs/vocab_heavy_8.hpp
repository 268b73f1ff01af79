// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The example cost model of docs/costs.md, in C++: the same numbers as
//! docs/costs/vocab-heavy-8.json (tests/cli checks that the CLI reading the file and the library
//! given this model agree).

#include <loom/schedule/cost_model.hpp>

namespace loom::docs {

//! Eight pieces of a transformer (times in ms, activation in GiB per microbatch, 16 MiB
//! messages): the embedding makes the first piece a little heavier, the vocabulary projection and
//! the loss make the last about twice as heavy (the imbalance of Yeung et al. 2024, "Balancing
//! Pipeline Parallelism with Vocabulary Parallelism"); NVLink-like links inside a node of 4
//! ranks, InfiniBand-like across.
inline cost_model vocab_heavy_8() {
  cost_model m;
  const stage_cost mid{.f = 1.0, .b = 1.1, .w = 0.9, .activation = 1.0, .message_bytes = 16777216};
  m.stages.push_back({.f = 1.2, .b = 1.3, .w = 1.0, .activation = 1.1, .message_bytes = 16777216});
  for (int i = 0; i < 6; ++i) m.stages.push_back(mid);
  m.stages.push_back({.f = 2.2, .b = 2.4, .w = 1.9, .activation = 1.6, .message_bytes = 0});
  m.intra = {.alpha = 0.005, .beta = 2.5e-9};
  m.inter = {.alpha = 0.02, .beta = 4e-8};
  m.ranks_per_node = 4;
  m.mem_w_ratio = 0.5;
  return m;
}

}  // namespace loom::docs
