// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Measured timelines on the device path: in measure mode each rank's eager step reports every
// executed action (stage calls, receives waited for, sends posted) in its program's order, timed
// by events on its compute stream, and the whole step renders as a Trace Event Format trace with
// one event per executed action per rank beside the prediction. A replayed step has none.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <loom/exec/timeline.hpp>
#include <loom/render/measured.hpp>

#include "device_support.hpp"

using namespace loom_device_test;

TEST_CASE("a measured device step's timeline runs each rank's program in order on its stream, and renders one trace event per action") {
  if (skip_unless_devices(backend::cuda_local, 1)) return;
  for (const char* family : {"1f1b", "zb-h1", "dualpipe-v"})
    for (bool graph : {false, true}) {
      CAPTURE(std::string(family));
      CAPTURE(graph);
      const loom::schedule s = loom::default_registry().at(family).make({4, 8, 0});
      const loom::schedule lowered = loom::lower(s);
      simulate_with(5);
      std::mutex mu;
      std::map<int, std::vector<loom::measured_action>> by_rank;
      hooks h;
      h.on_timeline = [&](int rank, std::span<const loom::measured_action> t) {
        std::lock_guard lk(mu);
        by_rank[rank].assign(t.begin(), t.end());
      };
      auto out = run(backend::cuda_local, s, spec_for(s.stages), 2, {.measure = true, .graph = graph}, h);
      REQUIRE_MESSAGE(out.ok(), out.errors());
      if (graph) {  // the second step was a replay: one launch, no per-action timeline
        for (auto const& [r, t] : by_rank) CHECK(t.empty());
        continue;
      }
      std::vector<loom::measured_action> all;
      for (int r = 0; r < s.ranks; ++r) {
        CAPTURE(r);
        auto const& t = by_rank[r];
        CHECK(loom::same_actions(t, loom::expected_timeline(lowered, r)));
        for (std::size_t i = 0; i < t.size(); ++i) {
          CHECK(t[i].start >= 0);
          CHECK(t[i].seconds >= 0);
          if (i > 0) CHECK(t[i].start >= t[i - 1].start + t[i - 1].seconds - 1e-9);  // one stream: in order
        }
        all.insert(all.end(), t.begin(), t.end());
      }
      const auto sim = loom::simulate(s);
      auto j = nlohmann::json::parse(loom::render_trace(s, {.actions = all, .predicted = &sim, .seconds_per_unit = 1e-6}));
      std::map<int, std::size_t> events;
      for (auto const& e : j["traceEvents"])
        if (e["ph"] == "X") ++events[e["pid"].get<int>() * 100 + e["tid"].get<int>()];
      for (int r = 0; r < s.ranks; ++r) CHECK(events[r] == by_rank[r].size());
    }
}
