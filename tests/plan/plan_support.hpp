// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// What the loom::plan tests share: a small cluster and a relative comparison.
#pragma once

#include <loom/plan.hpp>

#include <cmath>

namespace plan_test {

//! `gpus` GPUs of `gib` GiB, `per_node` to a node, 100 TFLOP/s at half the peak; 200 GB/s inside
//! a node, 20 GB/s between nodes.
inline loom::cluster_desc small_cluster(long long gpus, long long per_node, double gib) {
  return {.gpus = gpus, .gpus_per_node = per_node, .memory_bytes = gib * (1LL << 30), .peak_flops = 100e12,
          .achievable_fraction = 0.5, .intra = {.alpha = 5e-6, .beta = 1 / 200e9}, .inter = {.alpha = 1e-5, .beta = 1 / 20e9}};
}

//! `a` and `b` within 1e-9 relative.
inline bool close(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fmax(std::fabs(a), std::fabs(b)); }

}  // namespace plan_test
