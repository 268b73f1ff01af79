// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The Zero Bubble paper's configurations (zb_paper_data.hpp: Tables 3, 5 and 9 of
// arXiv:2401.10241v1): loom's simulator reproduces the paper's baseline bubble rates from its
// profiled costs, and zb-auto at memory limit p is no worse than the paper's ZB-1p, at 2p no
// worse than its ZB-2p (compared at the paper's printed precision, 4 decimals).
#include <doctest/doctest.h>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_auto.hpp>

#include "zb_paper_data.hpp"

TEST_CASE("loom's model reproduces the Zero Bubble paper's 1F1B, ZB-H1 and ZB-H2 bubble rates (Table 5)") {
  // Same definition (cost = longest stage span, §5.3) and same timing rule: the published
  // baseline columns follow from the published costs (Table 9) to the printed precision.
  for (auto const& x : loom_paper::table5) {
    loom::shape s{x.p, x.m};
    auto k = x.cost();
    INFO(x.model, " p=", x.p, " m=", x.m);
    CHECK(loom::simulate(loom::generate(loom::one_f_one_b{}, s), k).bubble_rate == doctest::Approx(x.r_1f1b).epsilon(6e-5));
    CHECK(loom::simulate(loom::generate(loom::zb_h1{}, s), k).bubble_rate == doctest::Approx(x.r_zbh1).epsilon(6e-5));
    CHECK(loom::simulate(loom::generate(loom::zb_h2{}, s), k).bubble_rate == doctest::Approx(x.r_zbh2).epsilon(6e-5));
  }
}

TEST_CASE("zb-auto at memory limit p is no worse than the paper's ZB-1p and at 2p no worse than its ZB-2p") {
  for (auto const& x : loom_paper::table5) {
    loom::shape s{x.p, x.m};
    auto k = x.cost();
    for (int mult : {1, 2}) {
      const double limit = mult * x.p;
      INFO(x.model, " p=", x.p, " m=", x.m, " limit=", limit);
      auto sched = loom::generate(loom::zb_auto{}, s, {.cost = k, .mem_limit = limit});
      auto sim = loom::simulate(sched, k);
      REQUIRE(sim.ok);
      CHECK(loom::validate(loom::lower(sched)).ok);
      CHECK(sim.max_peak_activation() <= limit + 1e-9);
      const double paper = mult == 1 ? x.r_zb1p : x.r_zb2p;
      CHECK(loom_paper::round4(sim.bubble_rate) <= paper);
    }
  }
}
