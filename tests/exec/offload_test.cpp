// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Offload and reload actions (PipeOffload's plan as a program, loom::with_offload) on the threads
// backend: training with the copies equals training without them bit for bit (and the
// single-rank reference), the device-side slots shrink as the buffer plan says, and a measured
// step's timeline holds the copies where the program has them.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <loom/exec/timeline.hpp>
#include <loom/schedule/offload.hpp>

#include "training_support.hpp"

using namespace loom_test;

namespace {

struct offloaded {
  loom::schedule plain, with;
  int chunks = 0;
};

// Every plan the authors' rules accept for group-interleaved 1F1B on p ranks, v chunks, m
// microbatches: each allowed group, 1..v offloaded chunks, unit cost per stage.
std::vector<offloaded> offloaded_programs(int p, int v, int m) {
  std::vector<offloaded> out;
  for (int g = (p + 1) / 2; g <= p; ++g) {
    const loom::schedule s = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v, .group = g});
    const loom::costs unit{.f = 1.0 * v, .b = 1.0 * v, .w = 1.0 * v};
    for (int k = 1; k <= v; ++k) {
      const auto plan = loom::plan_offload(s, unit, {.chunks = k, .time = 0.2});
      if (plan.ok) out.push_back({s, loom::with_offload(s, plan), k});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("offload: training with the copies equals training without them, bitwise, and the single-rank reference") {
  int runs = 0;
  for (int p : {2, 4})
    for (int m : {2 * p, 3 * p + 1})
      for (const auto& o : offloaded_programs(p, 2, m)) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(o.with.microbatches);
        CAPTURE(o.chunks);
        const auto spec = spec_for(o.plain.stages);
        const int steps = 2;
        for (bool deterministic : {true, false}) {
          CAPTURE(deterministic);
          const loom::pipeline_options opt{.deterministic = deterministic};
          const auto copied = run_pipeline(o.with, o.with, spec, steps, opt);
          const auto kept = run_pipeline(o.plain, o.plain, spec, steps, opt);
          for (int st = 0; st < steps; ++st)
            CHECK(std::memcmp(&copied.losses[static_cast<std::size_t>(st)], &kept.losses[static_cast<std::size_t>(st)], sizeof(double)) == 0);
          for (int l = 0; l < spec.layers(); ++l) {
            CHECK(same_bits(copied.grads[static_cast<std::size_t>(l)], kept.grads[static_cast<std::size_t>(l)]));
            CHECK(same_bits(copied.params[static_cast<std::size_t>(l)], kept.params[static_cast<std::size_t>(l)]));
          }
          if (deterministic) {
            const auto want = run_reference(spec, m, steps, opt.scaling);
            for (int l = 0; l < spec.layers(); ++l) CHECK(same_bits(copied.params[static_cast<std::size_t>(l)], want.params[static_cast<std::size_t>(l)]));
          }
          ++runs;
        }
      }
  CHECK(runs >= 8);
}

TEST_CASE("offload: the buffer plan moves offloaded activations to host slots, and the device slots shrink") {
  int fewer = 0;
  for (const auto& o : offloaded_programs(4, 2, 16)) {
    for (int r = 0; r < 4; ++r) {
      const auto before = loom::plan_buffers(o.plain, r), after = loom::plan_buffers(o.with, r);
      REQUIRE(before.local.size() == after.local.size());
      int host = 0;
      for (std::size_t i = 0; i < after.local.size(); ++i) {
        const auto& b = before.local[i];
        const auto& a = after.local[i];
        CAPTURE(r);
        CAPTURE(a.id.stage);
        CHECK(a.stash <= b.stash);
        CHECK(a.input <= b.input);
        CHECK(b.host_stash == 0);
        host += a.host_stash;
        // Only the offloaded chunks (the first o.chunks of the rank) get host slots.
        if (a.id.stage / 4 >= o.chunks) CHECK(a.host_stash == 0);
      }
      CHECK(host > 0);
      fewer += after.total_stash() < before.total_stash() ? 1 : 0;
    }
  }
  CHECK(fewer > 0);
}

TEST_CASE("offload: a measured step's timeline holds every copy where the program has it") {
  const auto programs = offloaded_programs(4, 2, 8);
  REQUIRE(!programs.empty());
  const loom::schedule& s = programs.front().with;
  const auto spec = spec_for(s.stages);
  bool checked = false;
  loom::run_threads(s.ranks, [&](loom::threads::comm& c) {
    std::vector<double> targets;
    auto make = [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(spec, id.stage, s.stages);
      return quickstart::mlp_stage(spec, a, b, id.stage == s.stages - 1, &targets);
    };
    loom::pipeline p(s, c, make, {.measure = true});
    auto data = quickstart::make_batch(spec, s.microbatches, 0);
    targets = data.targets;
    p.step(data.inputs);
    const auto want = loom::expected_timeline(p.lowered(), c.rank());
    std::size_t copies = 0;
    for (auto const& a : want) copies += loom::is_host_copy(a.kind) ? 1 : 0;
    CHECK(copies > 0);
    CHECK(loom::same_actions(p.last_timeline(), want));
    CHECK(p.host_buffer_bytes() > 0);
    if (c.rank() == 0) checked = true;
  });
  CHECK(checked);
}
