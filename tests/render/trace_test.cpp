// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

#include <loom/render.hpp>
#include <loom/schedule.hpp>

#include "render_test_support.hpp"

TEST_CASE("the trace parses as JSON and has one complete event per action with the simulated times") {
  for (double us : {1000.0, 1.0, 2.5}) {
    for (auto const& c : render_test::grid()) {
      CAPTURE(c.what);
      CAPTURE(us);
      loom::trace_options o;
      o.us_per_unit = us;
      auto j = nlohmann::json::parse(loom::render_trace(c.sched, c.sim, o));
      std::size_t k = 0;
      std::vector<std::size_t> per_rank_pos(c.sched.programs.size(), 0);
      int thread_names = 0;
      for (auto const& e : j.at("traceEvents")) {
        if (e.at("ph") == "M") {
          thread_names += e.at("name") == "thread_name";
          continue;
        }
        REQUIRE(e.at("ph") == "X");
        auto r = e.at("tid").get<std::size_t>();
        REQUIRE(r < c.sched.programs.size());
        auto& i = per_rank_pos[r];
        while (!loom::is_compute(c.sched.programs[r][i].kind)) ++i;
        auto const& a = c.sched.programs[r][i];
        auto t = c.sim.times[r][i];
        ++i;
        ++k;
        CHECK(e.at("cat") == loom::to_string(a.kind));
        CHECK(e.at("args").at("mb") == a.mb);
        CHECK(e.at("args").at("stage") == a.stage);
        CHECK(e.at("ts").get<double>() == doctest::Approx(t.start * us));
        CHECK(e.at("dur").get<double>() == doctest::Approx((t.end - t.start) * us));
        CHECK(e.at("args").at("start").get<double>() == t.start);
        CHECK(e.at("args").at("end").get<double>() == t.end);
      }
      CHECK(k == render_test::compute_actions(c.sched));
      CHECK(thread_names == c.sched.ranks);
      CHECK(j.at("otherData").at("makespan").get<double>() == c.sim.makespan);
    }
  }
}

TEST_CASE("the trace escapes names and describes both halves of an overlapped action") {
  std::string name = "quote\" backslash\\ newline\n tab\t bell\x07 caf\xC3\xA9";
  auto s = render_test::overlapped_sample(name);
  auto sim = loom::simulate(s);
  auto j = nlohmann::json::parse(loom::render_trace(s, sim));
  CHECK(j.at("otherData").at("schedule") == name);
  auto const& fb = j.at("traceEvents").at(j.at("traceEvents").size() - 4);
  CHECK(fb.at("cat") == "FB");
  CHECK(fb.at("name") == "F1+BW0");
  CHECK(fb.at("args").at("bop") == "BW");
  CHECK(fb.at("args").at("bmb") == 0);
  CHECK(fb.at("dur").get<double>() == doctest::Approx(1000 * 3));  // f + (b + w), sum of the halves
}

TEST_CASE("the trace renderer rejects a non-positive time scale") {
  auto s = loom::generate(loom::gpipe{}, {2, 2});
  auto sim = loom::simulate(s);
  loom::trace_options o;
  o.us_per_unit = 0;
  CHECK_THROWS_AS(loom::render_trace(s, sim, o), loom::config_error);
}
