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

//! docs/plan/gpt-70b.model.json with `seq` tokens per sequence, `micro_batch` sequences per
//! microbatch and `global_batch` per step.
inline loom::model_desc gpt_70b(long long seq, long long micro_batch, long long global_batch) {
  return {.layers = 80, .hidden = 8192, .heads = 64, .seq = seq, .vocab = 128256, .micro_batch = micro_batch, .global_batch = global_batch};
}

//! docs/plan/selene-64.cluster.json: 64 A100-80GB, 8 to a node.
inline loom::cluster_desc selene_64() {
  return {.gpus = 64, .gpus_per_node = 8, .memory_bytes = 80.0 * (1LL << 30), .peak_flops = 312e12, .achievable_fraction = 0.6,
          .intra = {.alpha = 5e-6, .beta = 4e-12}, .inter = {.alpha = 1e-5, .beta = 4e-11}};
}

//! `a` and `b` within 1e-9 relative.
inline bool close(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fmax(std::fabs(a), std::fabs(b)); }

}  // namespace plan_test
