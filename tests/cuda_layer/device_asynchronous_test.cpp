// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The asynchronous families (pipedream, pipedream-vs, pipedream-2bw, pipelined-backprop) on the
// device path: the CUDA MLP runs T steps in one run on cuda_local and on nccl, its weight versions
// in device buffers copied on the compute stream and its updates enqueued there, and matches the
// fp32 CPU reference of the rule (cuda_mlp::reference::asynchronous): bitwise in deterministic
// mode, within 1e-5 relative otherwise, with the race detector silent under two seeds each.
#include <doctest/doctest.h>

#include <string>

#include "device_support.hpp"

using namespace loom_device_test;

namespace {

void sweep(backend b) {
  int runs = 0;
  for (int P : {2, 3, 4}) {
    if (skip_unless_devices(b, P)) continue;
    for (auto const& e : loom::default_registry().entries()) {
      if (!e.multi_step) continue;
      for (int mb : {P, P + 1}) {
        const int T = 4;
        const loom::shape sh{.ranks = P, .microbatches = mb, .chunks = 0, .steps = T};
        if (!e.check(e.resolve(sh)).empty()) continue;
        const loom::schedule s = e.make(sh);
        const auto spec = spec_for(s.stages);
        cuda_mlp::reference ref(spec);
        ref.asynchronous(spec, {.family = s.name, .p = P, .m = mb, .N = s.microbatches},
                         cuda_mlp::float_batch(spec, s.microbatches, 0), 1.0 / mb);
        for (int seed : {1, 2}) {
          const bool det = seed % 2 == 1;
          CAPTURE(e.name);
          CAPTURE(P);
          CAPTURE(mb);
          CAPTURE(seed);
          simulate_with(static_cast<std::uint64_t>(seed));
          auto o = run(b, s, spec, 1, {.deterministic = det});
          INFO(o.errors() << findings());
          REQUIRE(o.ok());
          auto [rel, differ] = compare(o, ref);
          if (det) CHECK(differ == 0);
          else CHECK(rel <= 1e-5);
          CHECK(findings().empty());
          ++runs;
        }
      }
    }
  }
  if (runs > 0) CHECK(runs >= 24);
}

}  // namespace

TEST_CASE("asynchronous families on cuda_local match the fp32 reference of their rule with the race detector silent") {
  sweep(backend::cuda_local);
}
TEST_CASE("asynchronous families on nccl match the fp32 reference of their rule with the race detector silent") {
  sweep(backend::nccl);
}
