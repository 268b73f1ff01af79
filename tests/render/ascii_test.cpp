// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <loom/render.hpp>
#include <loom/schedule.hpp>

#include "render_test_support.hpp"

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("the ASCII grid of 1F1B on 2 ranks x 2 microbatches has the cells the timing rules give") {
  // By hand, f = b = w = 1, c = 0: rank 0 runs F0 [0,1), F1 [1,2), then waits for rank 1's
  // backward of mb 0 (F0 [1,2), BW0 [2,4)), so BW0 [4,6); rank 1 runs F1 [4,5), BW1 [5,7);
  // rank 0 BW1 [7,9).
  auto s = loom::generate(loom::one_f_one_b{}, {2, 2});
  auto sim = loom::simulate(s);
  auto g = loom::ascii_cells(s, sim);
  CHECK(g.step == 1);
  CHECK(g.origin == 0);
  REQUIRE(g.columns == 9);
  using row = std::vector<std::string>;
  CHECK(g.cells[0] == row{"F0", "F1", "", "", "BW0", "~", "", "BW1", "~"});
  CHECK(g.cells[1] == row{"", "F0", "BW0", "~", "F1", "BW1", "~", "", ""});

  auto text = loom::render_ascii(s, sim);
  auto lines = lines_of(text);
  REQUIRE(lines.size() == 5);  // header, ruler, two ranks, legend
  CHECK(lines[0].find("1f1b") != std::string::npos);
  CHECK(lines[0].find("makespan 9") != std::string::npos);
  CHECK(lines[2] == "r0 | F0  F1  .   .   BW0 ~~~ .   BW1 ~~~");
  CHECK(lines[3] == "r1 | .   F0  BW0 ~~~ F1  BW1 ~~~ .   .");
}

TEST_CASE("the ASCII step defaults to the shortest action and labels carry the model chunk") {
  // Interleaved 1F1B with v = 2: each chunk costs 1/2, so one column is half a time unit and
  // every label names its chunk (.0 or .1).
  auto s = loom::generate(loom::interleaved_1f1b{}, {2, 4, 2});
  auto sim = loom::simulate(s);
  auto g = loom::ascii_cells(s, sim);
  CHECK(g.step == 0.5);
  CHECK(g.columns * g.step == doctest::Approx(sim.makespan));
  CHECK(g.cells[0][0] == "F0.0");
  int chunk1 = 0;
  for (auto const& row : g.cells)
    for (auto const& c : row) chunk1 += c.size() > 2 && c.substr(c.size() - 2) == ".1";
  CHECK(chunk1 == 2 * 2 * 4);  // F and BW of 4 microbatches on chunk 1 of both ranks
}

TEST_CASE("every compute action gets exactly one labelled cell, for every family, shape, cost and step") {
  for (auto const& c : render_test::grid()) {
    for (double step : {0.0, 0.7, 3.0}) {
      CAPTURE(c.what);
      CAPTURE(step);
      auto g = loom::ascii_cells(c.sched, c.sim, step);
      std::size_t labelled = 0;
      for (auto const& row : g.cells)
        for (auto const& cell : row) labelled += !cell.empty() && cell != "~";
      CHECK(labelled == render_test::compute_actions(c.sched));
      // With the default step (the shortest action) every action lasts at least one column, so
      // quantisation never shifts one: its label sits at its rounded start.
      if (step == 0) {
        for (std::size_t r = 0; r < c.sched.programs.size(); ++r) {
          std::size_t k = 0;
          for (std::size_t col = 0; col < g.cells[r].size(); ++col) {
            if (g.cells[r][col].empty() || g.cells[r][col] == "~") continue;
            while (!loom::is_compute(c.sched.programs[r][k].kind)) ++k;
            CHECK(static_cast<double>(col) == std::round((c.sim.times[r][k].start - g.origin) / g.step));
            ++k;
          }
        }
      }
    }
  }
}

TEST_CASE("a wide ASCII timeline wraps into blocks no wider than the width, losing no action") {
  auto s = loom::generate(loom::one_f_one_b{}, {16, 64});
  auto sim = loom::simulate(s);
  for (int width : {80, 120, 200}) {
    CAPTURE(width);
    loom::ascii_options o;
    o.width = width;
    o.legend = false;
    o.header = false;
    auto text = loom::render_ascii(s, sim, o);
    std::size_t labels = 0, rank_rows = 0;
    for (auto const& l : lines_of(text)) {
      CHECK(l.size() <= static_cast<std::size_t>(width));
      if (l.rfind("r", 0) == 0) {
        ++rank_rows;
        std::istringstream words(l.substr(l.find('|') + 1));
        for (std::string w; words >> w;) labels += w != "." && w.find('~') == std::string::npos;
      }
    }
    CHECK(rank_rows % 16 == 0);
    CHECK(rank_rows > 16);  // it did wrap
    CHECK(labels == s.size());
  }
  loom::ascii_options flat;
  flat.width = 0;
  flat.legend = flat.header = false;
  CHECK(lines_of(loom::render_ascii(s, sim, flat)).size() == 17);  // one block: ruler + 16 ranks
}

TEST_CASE("overlapped FB actions are labelled with both halves") {
  auto s = render_test::overlapped_sample();
  REQUIRE(loom::validate(s).ok);
  auto sim = loom::simulate(s);
  auto g = loom::ascii_cells(s, sim);
  CHECK(g.cells[0][0] == "F0");
  CHECK(g.cells[0][1] == "F1+BW0");
  CHECK(loom::render_ascii(s, sim).find("F3+B1 forward 3 overlapped") != std::string::npos);
}

TEST_CASE("the ASCII renderer rejects a failed simulation and bad knobs with a sentence") {
  auto s = loom::generate(loom::gpipe{}, {2, 2});
  auto sim = loom::simulate(s);
  CHECK_THROWS_AS(loom::ascii_cells(s, sim, -1), loom::config_error);
  loom::ascii_options o;
  o.width = -3;
  CHECK_THROWS_WITH_AS(loom::render_ascii(s, sim, o), doctest::Contains("-3"), loom::config_error);
  auto broken = s;
  std::swap(broken.programs[0], broken.programs[1]);  // actions on the wrong ranks: deadlock
  auto bad = loom::simulate(broken);
  REQUIRE(!bad.ok);
  CHECK_THROWS_AS(loom::render_ascii(broken, bad), loom::schedule_error);
  CHECK_THROWS_AS(loom::render_ascii(s, loom::simulate(loom::generate(loom::gpipe{}, {3, 2}))), loom::schedule_error);
}
