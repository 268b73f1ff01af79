// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Every registered schedule family trains the CUDA MLP on cuda_local and on nccl, eagerly and
// replayed from CUDA graphs, with P in {2, 4} and two microbatch counts, and matches the fp32 CPU
// reference: bitwise in deterministic mode, within 1e-5 relative otherwise. Against the
// simulator each configuration runs under seeds of operation order and delays (odd seeds
// deterministic, even seeds not) with the race detector failing the step on any race: 4
// consecutive seeds of 1..20, rotating daily, in the default run; all 20 under the label `full`
// (tests/sweep.hpp).
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "../sweep.hpp"
#include "device_support.hpp"

using namespace loom_device_test;

namespace {

#if defined(LOOM_CUDA_SIM)
constexpr int seeds = 20, sampled = 4;
#else
constexpr int seeds = 2, sampled = 2;  // a GPU has no seed: one deterministic and one default run
#endif

void sweep(backend b, bool graph) {
  std::map<std::string, int> ran;
  int skipped = 0;
  const auto chosen = loom_test::sweep_seeds(std::string(name(b)) + (graph ? " graph" : " eager"), 1, seeds, sampled);
  for (int P : {2, 4}) {
    if (skip_unless_devices(b, P)) {
      ++skipped;
      continue;
    }
    for (auto const& e : loom::default_registry().entries()) {
      if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
      for (int m : {2 * P, 2 * P + 1}) {
        loom::shape sh = e.resolve({.ranks = P, .microbatches = m});
        if (!e.check(sh).empty()) continue;
        loom::schedule s = e.make(sh);
        auto spec = spec_for(s.stages);
        const int steps = 2;
        auto ref = reference(spec, m, steps);
        for (int seed : chosen) {
          const bool det = seed % 2 == 1;
          CAPTURE(e.name);
          CAPTURE(P);
          CAPTURE(m);
          CAPTURE(seed);
          CAPTURE(det);
          simulate_with(static_cast<std::uint64_t>(seed));
          auto o = run(b, s, spec, steps, {.deterministic = det, .graph = graph});
          INFO(o.errors() << findings());
          REQUIRE(o.ok());
          auto [rel, differ] = compare(o, ref);
          if (det) CHECK(differ == 0);
          else CHECK(rel <= 1e-5);
          CHECK(findings().empty());
        }
        ++ran[std::string(e.name)];
      }
    }
  }
  if (skipped == 2) return;
  // Every registered family ran on at least one shape.
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    CAPTURE(e.name);
    CHECK(ran[std::string(e.name)] > 0);
  }
}

}  // namespace

TEST_CASE("every family on cuda_local, eager, matches the CPU reference with the race detector silent") { sweep(backend::cuda_local, false); }
TEST_CASE("every family on cuda_local, replayed from a CUDA graph, matches the CPU reference") { sweep(backend::cuda_local, true); }
TEST_CASE("every family on nccl, eager, matches the CPU reference with the race detector silent") { sweep(backend::nccl, false); }
TEST_CASE("every family on nccl, replayed from CUDA graphs, matches the CPU reference") { sweep(backend::nccl, true); }
