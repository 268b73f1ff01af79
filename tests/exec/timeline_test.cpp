// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Measured timelines: in measure mode every rank reports each executed action of its step, in its
// program's order (an FB as its two halves), placed on its clock; gathered on every rank, they
// render as a Trace Event Format trace (one event per executed action per rank, the prediction
// beside it) and as an SVG with one box per action.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <loom/exec/timeline.hpp>
#include <loom/render/measured.hpp>

#include "training_support.hpp"

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("a measured step's timeline has every executed action of each rank in its program's order, and renders one event per action") {
  for (const char* family : {"1f1b", "zb-h1", "interleaved-1f1b", "dualpipe-v", "chimera"}) {
    CAPTURE(std::string(family));
    const loom::schedule s = loom::default_registry().at(family).make({4, 8, 0});
    const loom::schedule lowered = loom::lower(s);
    const auto m = loom_test::spec_for(s.stages);
    std::vector<loom::measured_action> all;
    std::mutex mu;
    loom::run_threads(s.ranks, [&](loom::threads::comm& c) {
      std::vector<double> targets;
      loom::pipeline p(s, c, [&](loom::stage_id id) {
        auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
        return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
      }, {.measure = true});
      for (int step = 0; step < 2; ++step) {
        auto data = quickstart::make_batch(m, s.microbatches, step);
        targets = data.targets;
        p.step(data.inputs);
      }
      auto gathered = loom::gather_timeline(c, p.last_timeline());
      std::lock_guard lk(mu);
      if (c.rank() == 0) all = std::move(gathered);
    });
    // Per rank: the program's order, non-overlapping, within the step.
    std::map<int, std::vector<loom::measured_action>> by_rank;
    for (auto const& a : all) by_rank[a.rank].push_back(a);
    REQUIRE(by_rank.size() == static_cast<std::size_t>(s.ranks));
    std::size_t compute = 0;
    for (int r = 0; r < s.ranks; ++r) {
      CAPTURE(r);
      auto const& got = by_rank[r];
      auto want = loom::expected_timeline(lowered, r);
      CHECK(loom::same_actions(got, want));
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i].kind == want[i].kind);
        CHECK(got[i].microbatch == want[i].microbatch);
        CHECK(got[i].stage == want[i].stage);
        CHECK(got[i].peer == want[i].peer);
        CHECK(got[i].in_fb == want[i].in_fb);
        CHECK(got[i].start >= 0);
        CHECK(got[i].seconds >= 0);
        if (i > 0) CHECK(got[i].start >= got[i - 1].start + got[i - 1].seconds - 1e-6);
        compute += loom::is_compute(got[i].kind);
      }
    }
    // The trace: one complete event per executed action in "measured", one per compute action of
    // the schedule in "predicted".
    const auto sim = loom::simulate(s);
    const loom::measured_step step{.actions = all, .predicted = &sim, .seconds_per_unit = 1e-3};
    auto j = nlohmann::json::parse(loom::render_trace(s, step));
    std::map<int, std::size_t> events;
    for (auto const& e : j["traceEvents"])
      if (e["ph"] == "X") ++events[e["pid"].get<int>()];
    CHECK(events[0] == all.size());
    std::size_t predicted = 0;
    for (auto const& prog : s.programs)
      for (auto const& a : prog) predicted += loom::is_compute(a.kind);
    CHECK(events[1] == predicted);
    CHECK(j["otherData"]["measured_step_s"].get<double>() > 0);
    // Scaled to the measured calls, the prediction's time in compute actions equals the measured.
    const double spu = loom::seconds_per_unit_matching(s, sim, all);
    double measured_calls = 0, predicted_calls = 0;
    for (auto const& a : all)
      if (loom::is_compute(a.kind)) measured_calls += a.seconds;
    for (double b : sim.busy) predicted_calls += b * spu;
    CHECK(predicted_calls == doctest::Approx(measured_calls).epsilon(1e-9));
    const std::string svg = loom::render_svg(s, step);
    CHECK(count(svg, "class=\"measured\"") == all.size());
    CHECK(count(svg, "class=\"predicted\"") == predicted);
    CHECK(compute > 0);
  }
}

TEST_CASE("measured timelines are empty without measure mode, and bad input to the renderers is named") {
  const loom::schedule s = loom::default_registry().at("1f1b").make({2, 4, 0});
  const auto m = loom_test::spec_for(s.stages);
  loom::run_threads(2, [&](loom::threads::comm& c) {
    std::vector<double> targets;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
    });
    auto data = quickstart::make_batch(m, s.microbatches, 0);
    targets = data.targets;
    p.step(data.inputs);
    CHECK(p.last_timeline().empty());
  });
  const std::vector<loom::measured_action> bad_rank{{.kind = loom::op::F, .rank = 5, .seconds = 1}};
  CHECK_THROWS_WITH_AS(loom::render_trace(s, {.actions = bad_rank}), doctest::Contains("names rank 5"), loom::config_error);
  const std::vector<loom::measured_action> bad_time{{.kind = loom::op::F, .rank = 0, .seconds = -1}};
  CHECK_THROWS_WITH_AS(loom::render_svg(s, {.actions = bad_time}), doctest::Contains("duration"), loom::config_error);
  const auto other = loom::simulate(loom::default_registry().at("1f1b").make({4, 8, 0}));
  CHECK_THROWS_AS(loom::render_trace(s, {.actions = {}, .predicted = &other}), loom::schedule_error);
  const auto sim = loom::simulate(s);
  CHECK_THROWS_WITH_AS(loom::render_svg(s, {.actions = {}, .predicted = &sim, .seconds_per_unit = 0}), doctest::Contains("seconds per predicted unit"),
                       loom::config_error);
}

TEST_CASE("occupied timings count the host work since the rank's previous action in the action it prepares") {
  using loom::op;
  const std::vector<loom::measured_action> t{
      {.kind = op::F, .microbatch = 0, .stage = 0, .start = 0.5, .seconds = 1.0},                // first: from its own start
      {.kind = op::send, .microbatch = 0, .stage = 0, .peer = 1, .start = 1.75, .seconds = 0.25},  // ends at 2.0
      {.kind = op::F, .microbatch = 1, .stage = 0, .start = 2.5, .seconds = 1.0},                // 0.5 of host work before it
      {.kind = op::recv, .microbatch = 0, .stage = 1, .peer = 1, .start = 3.5, .seconds = 2.0},  // a wait: in no action
      {.kind = op::B, .microbatch = 0, .stage = 0, .start = 5.5, .seconds = 1.0, }};
  const auto o = loom::occupied_timings(t);
  REQUIRE(o.size() == 3);
  CHECK(o[0].kind == op::F);
  CHECK(o[0].seconds == doctest::Approx(1.0));
  CHECK(o[1].microbatch == 1);
  CHECK(o[1].seconds == doctest::Approx(1.5));
  CHECK(o[2].kind == op::B);
  CHECK(o[2].seconds == doctest::Approx(1.0));
}
