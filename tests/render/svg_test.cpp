// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <loom/render.hpp>
#include <loom/schedule.hpp>

#include "render_test_support.hpp"

namespace {

using attrs = std::map<std::string, std::string>;

attrs attributes_of(const std::string& tag) {
  attrs out;
  static const std::regex attr(R"re(([a-zA-Z_:-][a-zA-Z0-9_:.-]*)="([^"]*)")re");
  for (auto it = std::sregex_iterator(tag.begin(), tag.end(), attr); it != std::sregex_iterator(); ++it)
    out[(*it)[1].str()] = (*it)[2].str();
  return out;
}

// The opening tags of every element named `name` (with `class="action"` when `cls`).
std::vector<attrs> elements(const std::string& svg, const std::string& name, const std::string& cls = "") {
  std::vector<attrs> out;
  const std::regex tag("<" + name + R"(\s[^>]*>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    auto a = attributes_of(it->str());
    if (cls.empty() || a["class"] == cls) out.push_back(a);
  }
  return out;
}

// Tags balance and nest; no raw '&' outside an entity; one root <svg>. Returns "" or the problem.
std::string well_formed(const std::string& doc) {
  std::vector<std::string> stack;
  int roots = 0;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    if (doc[i] == '&') {
      auto semi = doc.find(';', i);
      auto ent = doc.substr(i, semi == std::string::npos ? 0 : semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;")
        return "raw & at " + std::to_string(i);
    }
    if (doc[i] != '<') continue;
    auto close = doc.find('>', i);
    if (close == std::string::npos) return "unterminated tag";
    std::string tag = doc.substr(i + 1, close - i - 1);
    i = close;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      stack.pop_back();
      continue;
    }
    std::string name = tag.substr(0, tag.find_first_of(" \n\t/"));
    if (stack.empty()) ++roots;
    if (tag.back() != '/') stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "expected one root element, got " + std::to_string(roots);
  return "";
}

}  // namespace

TEST_CASE("every box of the SVG is an action of the schedule, at its simulated start and width") {
  for (auto const& c : render_test::grid()) {
    CAPTURE(c.what);
    auto svg = loom::render_svg(c.sched, c.sim);
    REQUIRE(well_formed(svg) == "");
    auto root = elements(svg, "svg").at(0);
    const double x0 = std::stod(root["data-x0"]), origin = std::stod(root["data-origin"]),
                 scale = std::stod(root["data-scale"]);
    auto boxes = elements(svg, "rect", "action");
    REQUIRE(boxes.size() == render_test::compute_actions(c.sched));
    std::size_t k = 0;
    double t_first = -1;
    for (std::size_t r = 0; r < c.sched.programs.size(); ++r)
      for (std::size_t i = 0; i < c.sched.programs[r].size(); ++i) {
        auto const& a = c.sched.programs[r][i];
        if (!loom::is_compute(a.kind)) continue;
        auto t = c.sim.times[r][i];
        if (t_first < 0 || t.start < t_first) t_first = t.start;
        auto& b = boxes[k++];
        CHECK(b["data-rank"] == std::to_string(r));
        CHECK(b["data-op"] == loom::to_string(a.kind));
        CHECK(std::stoi(b["data-mb"]) == a.mb);
        CHECK(std::stoi(b["data-stage"]) == a.stage);
        CHECK(std::stod(b["data-start"]) == t.start);
        CHECK(std::stod(b["data-end"]) == t.end);
        // Pixel coordinates are written with 3 decimals.
        CHECK(std::abs(std::stod(b["x"]) - (x0 + scale * (t.start - origin))) <= 6e-4);
        CHECK(std::abs(std::stod(b["width"]) - scale * (t.end - t.start)) <= 6e-4);
        if (a.kind == loom::op::FB) CHECK(std::stoi(b["data-bmb"]) == a.bmb);
      }
    CHECK(origin == t_first);
    // The timeline spans the width asked for: the last end sits at x0 + 1200.
    CHECK(scale * c.sim.makespan == doctest::Approx(1200).epsilon(1e-9));
  }
}

TEST_CASE("the SVG colours each op kind differently and numbers the microbatches in the boxes") {
  auto s = loom::generate(loom::zb_h1{}, {4, 8});
  auto sim = loom::simulate(s);
  auto svg = loom::render_svg(s, sim);
  std::map<std::string, std::string> fill_of;
  for (auto& b : elements(svg, "rect", "action")) {
    auto [it, fresh] = fill_of.emplace(b["data-op"], b["fill"]);
    CHECK(it->second == b["fill"]);  // one colour per op kind (one chunk per rank here)
  }
  REQUIRE(fill_of.size() == 3);
  CHECK(fill_of["F"] != fill_of["B"]);
  CHECK(fill_of["B"] != fill_of["W"]);
  CHECK(fill_of["F"] != fill_of["W"]);
  // Every box is wide enough here for its number: 96 numbers 0..7 drawn, 12 of each.
  std::map<std::string, int> numbers;
  static const std::regex text(R"(<text [^>]*text-anchor="middle" fill="[^"]*">([0-9]+)</text>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text); it != std::sregex_iterator(); ++it)
    ++numbers[(*it)[1].str()];
  CHECK(numbers.size() == 8);
  for (auto const& [n, count] : numbers) CHECK(count == 12);
  CHECK(svg.find("zb-h1: 4 ranks") != std::string::npos);
  CHECK(svg.find("bubble ratio 11.1%") != std::string::npos);
  CHECK(svg.find(">rank 3<") != std::string::npos);
}

TEST_CASE("the SVG time axis has ticks covering the makespan and a legend of the kinds present") {
  auto s = loom::generate(loom::one_f_one_b{}, {4, 8});
  auto sim = loom::simulate(s);
  auto svg = loom::render_svg(s, sim);
  std::vector<double> ticks;
  static const std::regex tick(R"(<text [^>]*font-size="11" text-anchor="middle">([0-9.e+-]+)</text>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
    ticks.push_back(std::stod((*it)[1].str()));
  REQUIRE(ticks.size() >= 3);
  CHECK(ticks.front() == 0);
  CHECK(ticks.back() <= sim.makespan);
  CHECK(ticks.back() + (ticks[1] - ticks[0]) > sim.makespan);
  CHECK(svg.find("F forward") != std::string::npos);
  CHECK(svg.find("BW fused backward") != std::string::npos);
  CHECK(svg.find("W weight-gradient") == std::string::npos);  // 1F1B has no separate W
}

TEST_CASE("the SVG escapes names and draws overlapped actions with both halves") {
  auto s = render_test::overlapped_sample("a<b & \"c\"");
  auto sim = loom::simulate(s);
  auto svg = loom::render_svg(s, sim);
  CHECK(well_formed(svg) == "");
  CHECK(svg.find("a&lt;b &amp; &quot;c&quot;") != std::string::npos);
  auto boxes = elements(svg, "rect", "action");
  REQUIRE(boxes.size() == 5);
  CHECK(boxes[1]["data-op"] == "FB");
  CHECK(boxes[1]["data-bop"] == "BW");
  CHECK(boxes[2]["data-bop"] == "B");
  CHECK(boxes[2]["data-bmb"] == "1");
  CHECK(boxes[1]["fill"] != boxes[0]["fill"]);
  CHECK(svg.find("FB overlapped forward+backward") != std::string::npos);
}

TEST_CASE("the SVG renderer rejects bad sizes and failed simulations") {
  auto s = loom::generate(loom::gpipe{}, {2, 2});
  auto sim = loom::simulate(s);
  loom::svg_options o;
  o.width = 0;
  CHECK_THROWS_AS(loom::render_svg(s, sim, o), loom::config_error);
  loom::simulation empty;
  CHECK_THROWS_AS(loom::render_svg(s, empty), loom::schedule_error);
}
