// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// ZB-V on the Zero Bubble paper's Table 8 settings (arXiv:2401.10241, §6; rows in
// zb_paper_data.hpp), under two cost sets: the paper's profiled costs of the same model (Table 9,
// measured for its Table 5 runs, the only profiled costs it publishes), and costs derived from
// Table 8 itself (zb_v_paper_costs.hpp: w and c fitted to Table 8's own 1F1B, ZB-H1 and ZB-H2
// columns). docs/zero-bubble-paper.md has both tables.
#include <doctest/doctest.h>

#include <cmath>
#include <string_view>

#include <loom/schedule.hpp>
#include <loom/schedule/registry.hpp>
#include <loom/schedule/zb_v.hpp>

#include "zb_paper_data.hpp"
#include "zb_v_paper_costs.hpp"

namespace {

loom::costs costs_of(const loom_paper::zbv_row& x) {
  loom::costs k = loom_paper::zbv_costs(x);
  REQUIRE_MESSAGE(k.f > 0, "no derived costs for model ", x.model);
  return k;
}

}  // namespace

TEST_CASE("cost-aware zb-v at the paper's profiled costs (Table 9) is no higher than its ZB-V on every Table 8 row") {
  // Every Table 8 row under each of its model's three Table 9 profiles (27 cases), at the
  // paper's ZB-V memory (p units) and printed precision.
  int cases = 0;
  for (auto const& x : loom_paper::table8)
    for (auto const& c : loom_paper::table5) {
      if (std::string_view(c.model) != x.model) continue;
      ++cases;
      const loom::costs k = c.cost();
      INFO(x.model, " p=", x.p, " m=", x.m, " with the Table 9 profile of m=", c.m);
      auto sched = loom::generate(loom::zb_v{}, {.ranks = x.p, .microbatches = x.m}, {.cost = k, .mem_limit = double(x.p)});
      auto sim = loom::simulate(sched, k);
      REQUIRE(sim.ok);
      CHECK(loom::validate(loom::lower(sched)).ok);
      CHECK(sim.max_peak_activation() <= x.p + 1e-9);
      CHECK(loom_paper::round4(sim.bubble_rate) <= x.r_zbv);
    }
  CHECK(cases == 27);
}

TEST_CASE("costs derived from Table 8's 1F1B, ZB-H1 and ZB-H2 columns reproduce those columns") {
  // Two fitted numbers per model explain nine published ones: 8 of 9 rows to the printed
  // precision (4e-4); 28.3B m=256 within 4e-3 (its three columns cannot all hold under one cost
  // set: its ZB-H1 - ZB-H2 gap implies a larger w than its 1F1B - ZB-H1 gap).
  for (auto const& x : loom_paper::table8) {
    loom::shape s{x.p, x.m};
    auto k = costs_of(x);
    const double tol = x.p == 32 && x.m == 256 ? 4e-3 : 4e-4;
    INFO(x.model, " p=", x.p, " m=", x.m);
    CHECK(std::abs(loom::simulate(loom::generate(loom::one_f_one_b{}, s), k).bubble_rate - x.r_1f1b) <= tol);
    CHECK(std::abs(loom::simulate(loom::generate(loom::zb_h1{}, s), k).bubble_rate - x.r_zbh1) <= tol);
    CHECK(std::abs(loom::simulate(loom::generate(loom::zb_h2{}, s), k).bubble_rate - x.r_zbh2) <= tol);
  }
}

TEST_CASE("zb-v at the derived Table 8 costs stays within 1F1B's memory and beats the paper's ZB-H2") {
  // ZB-V's claim (§6): ZB-H2-like bubbles at 1F1B's activation memory (p units). loom's
  // cost-free zb-v (unit-slot greedy) already meets it on every row.
  for (auto const& x : loom_paper::table8) {
    auto k = costs_of(x);
    INFO(x.model, " p=", x.p, " m=", x.m);
    auto sched = loom::generate(loom::zb_v{}, {.ranks = x.p, .microbatches = x.m});
    auto sim = loom::simulate(sched, k);
    REQUIRE(sim.ok);
    CHECK(loom::validate(loom::lower(sched)).ok);
    CHECK(sim.max_peak_activation() <= x.p + 1e-9);
    CHECK(loom_paper::round4(sim.bubble_rate) <= x.r_zbh2);
  }
}

TEST_CASE("cost-aware zb-v at the derived Table 8 costs and p units improves on the greedy and meets the paper's ZB-V on 8 of 9 rows") {
  // generate(shape, options): the greedy, then local search under the real costs (zb_v.hpp).
  // Compared at the paper's printed precision (round4), as docs/zero-bubble-paper.md does.
  // 6.2B m=48 stays at 0.06978 (paper 0.0697): the Zero Bubble authors' own ZB-V heuristic
  // (their zbv.py, run at these costs) gives the same 0.06978, so the derived costs, not the
  // search, set that row; it is held to the paper within 1e-4 and recorded in the doc.
  int met = 0;
  for (auto const& x : loom_paper::table8) {
    auto k = costs_of(x);
    INFO(x.model, " p=", x.p, " m=", x.m);
    const loom::shape s{.ranks = x.p, .microbatches = x.m};
    auto sched = loom::generate(loom::zb_v{}, s, {.cost = k, .mem_limit = double(x.p)});
    auto sim = loom::simulate(sched, k);
    REQUIRE(sim.ok);
    CHECK(loom::validate(loom::lower(sched)).ok);
    CHECK(sim.max_peak_activation() <= x.p + 1e-9);
    const double greedy = loom::simulate(loom::generate(loom::zb_v{}, s), k).bubble_rate;
    CHECK(sim.bubble_rate < greedy);
    CHECK(sim.bubble_rate <= x.r_zbv + 1e-4);
    met += loom_paper::round4(sim.bubble_rate) <= x.r_zbv ? 1 : 0;
  }
  CHECK(met >= 8);
}

TEST_CASE("the registry's zb-v entry is cost-aware and gives the same schedule as the library call") {
  auto const& e = loom::default_registry().at("zb-v");
  CHECK(e.cost_aware);
  auto const& x = loom_paper::table8[3];
  const loom::generate_options o{.cost = costs_of(x), .mem_limit = double(x.p)};
  auto a = e.make({.ranks = x.p, .microbatches = x.m}, o);
  auto b = loom::generate(loom::zb_v{}, {.ranks = x.p, .microbatches = x.m}, o);
  CHECK(a.programs == b.programs);
}
