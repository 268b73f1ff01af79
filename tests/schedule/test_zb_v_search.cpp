// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Cost-aware zb-v (greedy + local search under real costs, zb_v.hpp): over a grid of shapes,
// costs and limits the result is valid after lowering, within the limit on every rank and never
// worse than the cost-free greedy; zb-auto on the V placement is never worse than it at the
// same limit; a limit below p and bad costs are rejected with the rule; it runs at compile time.
#include <doctest/doctest.h>

#include <string>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_auto.hpp>
#include <loom/schedule/zb_v.hpp>

namespace {

const loom::costs cost_grid[] = {
    {},
    {.f = 1, .b = 1.2, .w = 0.6, .c = 0.1, .mem_w_ratio = 0.4},
    {.f = 1, .b = 2, .w = 0.3, .c = 0.3},
    {.f = 0.37, .b = 0.37, .w = 0.25, .c = 0.02, .mem_w_ratio = 0.43},
};

}  // namespace

TEST_CASE("cost-aware zb-v is valid, within its limit and never worse than the greedy over a grid of shapes and costs") {
  for (int p : {1, 2, 3, 4, 6, 8})
    for (int m : {1, 2, 3, 5, 8, 13, 24})
      for (auto const& k : cost_grid)
        for (double f : {1.0, 1.5}) {
          const double limit = f * p;
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(k.b);
          CAPTURE(limit);
          const loom::shape s{.ranks = p, .microbatches = m};
          auto sched = loom::generate(loom::zb_v{}, s, {.cost = k, .mem_limit = limit});
          CHECK(sched.name == "zb-v");
          auto v = loom::validate(loom::lower(sched));
          CHECK_MESSAGE(v.ok, v.message);
          auto sim = loom::simulate(sched, k);
          REQUIRE(sim.ok);
          for (double peak : sim.peak_activation) CHECK(peak <= limit + 1e-9);
          const double greedy = loom::simulate(loom::generate(loom::zb_v{}, s), k).bubble_rate;
          CHECK(sim.bubble_rate <= greedy + 1e-12);
        }
}

TEST_CASE("cost-aware zb-v keeps the greedy's zero bubble at unit costs and p units once m >= 2p") {
  for (int p : {2, 3, 5, 8})
    for (int m : {2 * p, 3 * p + 1}) {
      CAPTURE(p);
      CAPTURE(m);
      auto sim = loom::simulate(loom::generate(loom::zb_v{}, {.ranks = p, .microbatches = m}, loom::generate_options{}));
      REQUIRE(sim.ok);
      CHECK(sim.bubble_rate == doctest::Approx(0).epsilon(1e-12));
      CHECK(sim.max_peak_activation() <= p + 1e-9);
    }
}

TEST_CASE("cost-aware zb-v improves on the greedy when latency and unequal passes break its unit slots") {
  // At c > 0 the unit-slot greedy's passes wait on transfers; some reordering must pay off.
  const loom::costs k{.f = 1, .b = 1, .w = 0.6, .c = 0.1, .mem_w_ratio = 0.5};
  int better = 0;
  for (int p : {4, 6, 8})
    for (int m : {2 * p, 4 * p}) {
      const loom::shape s{.ranks = p, .microbatches = m};
      const double greedy = loom::simulate(loom::generate(loom::zb_v{}, s), k).bubble_rate;
      const double found = loom::simulate(loom::generate(loom::zb_v{}, s, {.cost = k}), k).bubble_rate;
      better += found < greedy - 1e-9 ? 1 : 0;
    }
  CHECK(better >= 4);
}

TEST_CASE("zb-auto on the V placement is never worse than cost-aware zb-v at the same limit") {
  for (int p : {2, 4, 6})
    for (int m : {3, 8, 16})
      for (auto const& k : cost_grid) {
        CAPTURE(p);
        CAPTURE(m);
        loom::generate_options o{.cost = k, .mem_limit = double(p), .placement = loom::placement_kind::v};
        auto a = loom::simulate(loom::generate(loom::zb_auto{}, {.ranks = p, .microbatches = m, .chunks = 2}, o), k);
        auto v = loom::simulate(loom::generate(loom::zb_v{}, {.ranks = p, .microbatches = m}, o), k);
        REQUIRE(a.ok);
        CHECK(a.bubble_rate <= v.bubble_rate + 1e-12);
        CHECK(a.max_peak_activation() <= p + 1e-9);
      }
}

TEST_CASE("cost-aware zb-v rejects a limit below p units and bad costs, naming the rule") {
  const loom::shape s{.ranks = 4, .microbatches = 8};
  try {
    (void)loom::generate(loom::zb_v{}, s, {.mem_limit = 3.5});
    FAIL("a limit below p must be rejected");
  } catch (const loom::schedule_error& e) {
    CHECK(std::string(e.what()).find("mem-limit >= ranks = 4") != std::string::npos);
    CHECK(std::string(e.what()).find("3.50") != std::string::npos);
  }
  CHECK_THROWS_AS((void)loom::generate(loom::zb_v{}, s, {.cost = {.f = 0}}), loom::config_error);
  CHECK_THROWS_AS((void)loom::generate(loom::zb_v{}, s, {.cost = {.c = -1}}), loom::config_error);
  CHECK_THROWS_AS((void)loom::generate(loom::zb_v{}, s, {.cost = {.mem_w_ratio = 1.5}}), loom::config_error);
  CHECK_THROWS_AS((void)loom::generate(loom::zb_v{}, {.ranks = 4, .microbatches = 8, .chunks = 3}, {}), loom::schedule_error);
}

// The search is constexpr like the rest of the schedule algebra.
static_assert([] {
  const loom::costs k{.f = 1, .b = 1, .w = 0.5, .c = 0.2, .mem_w_ratio = 0.5};
  auto s = loom::zb_v{}.generate({.ranks = 2, .microbatches = 4, .chunks = 2}, {.cost = k});
  auto sim = loom::simulate(s, k);
  return sim.ok && sim.max_peak_activation() <= 2 &&
         sim.bubble_rate <= loom::simulate(loom::zb_v{}.generate({.ranks = 2, .microbatches = 4, .chunks = 2}), k).bubble_rate;
}());
