// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The stage- and link-resolved cost model (loom::cost_model): a hand-computed non-uniform case,
// uniform vectors against loom::costs over every family, alpha + beta * bytes against c, fitting
// a model to another stage count, and the rules a model must meet.

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>

#include <loom/schedule.hpp>

namespace {

// Two stages on two ranks: s0 f=1 b=2 w=1 activation 3, sends 100 bytes; s1 f=2 b=3 w=2
// activation 5. Links: 0.5 + 0.01 * bytes, so the one boundary costs 1.5 each way.
constexpr loom::cost_model two_stage_model(int ranks_per_node = 0) {
  loom::cost_model m;
  m.stages = {{.f = 1, .b = 2, .w = 1, .activation = 3, .message_bytes = 100},
              {.f = 2, .b = 3, .w = 2, .activation = 5, .message_bytes = 0}};
  m.intra = {.alpha = 0.5, .beta = 0.01};
  m.inter = m.intra;
  m.ranks_per_node = ranks_per_node;
  m.mem_w_ratio = 0.25;
  return m;
}

// 1F1B, p = 2, m = 2 (rank 0: F0 F1 BW0 BW1; rank 1: F0 BW0 F1 BW1), by hand:
//   rank 0: F0 [0,1]  F1 [1,2]
//   rank 1: F0 [1+1.5, 4.5]  BW0 [4.5, 9.5]  F1 [max(2+1.5, 9.5), 11.5]  BW1 [11.5, 16.5]
//   rank 0: BW0 [9.5+1.5, 14]  BW1 [16.5+1.5, 21]
// makespan 21; busy 8 and 14; peaks 3+3 = 6 and 5.
static_assert(loom::simulate(loom::generate(loom::one_f_one_b{}, {2, 2}), two_stage_model()).makespan == 21);

TEST_CASE("a non-uniform stage cost vector gives the hand-computed 1F1B timeline") {
  auto s = loom::generate(loom::one_f_one_b{}, {2, 2});
  auto r = loom::simulate(s, two_stage_model());
  REQUIRE(r.ok);
  CHECK(r.makespan == 21);
  CHECK(r.busy[0] == 8);
  CHECK(r.busy[1] == 14);
  CHECK(r.bubble_ratio == doctest::Approx(1 - 22.0 / 42.0));
  CHECK(r.peak_activation[0] == 6);
  CHECK(r.peak_activation[1] == 5);
  // Rank 1's backward of microbatch 0 and rank 0's that waits for it (index 2 on rank 0).
  CHECK(r.times[1][1].start == 4.5);
  CHECK(r.times[1][1].end == 9.5);
  CHECK(r.times[0][2].start == 11);
  CHECK(r.times[0][3].end == 21);
}

// ZB-H1, p = 2, m = 2 (rank 0: F0 F1 B0 W0 B1 W1; rank 1: F0 B0 F1 B1 W0 W1), by hand:
//   rank 1: F0 [2.5, 4.5]  B0 [4.5, 7.5]  F1 [7.5, 9.5]  B1 [9.5, 12.5]  W0 [12.5, 14.5]  W1 [14.5, 16.5]
//   rank 0: F0 [0,1] F1 [1,2] B0 [7.5+1.5, 11] W0 [11, 12] B1 [12.5+1.5, 16] W1 [16, 17]
// makespan 17. Memory with M_W/M_B = 0.25: rank 0 peaks at 3+3; rank 1: 5, B0 frees 3.75, F1
// adds 5: 6.25.
TEST_CASE("split backward: W timing and the released fractions follow the stage's activation") {
  auto s = loom::generate(loom::zb_h1{}, {2, 2});
  auto r = loom::simulate(s, two_stage_model());
  REQUIRE(r.ok);
  CHECK(r.makespan == 17);
  CHECK(r.peak_activation[0] == 6);
  CHECK(r.peak_activation[1] == 6.25);
  CHECK(r.times[0][2].start == 9);
  CHECK(r.times[0][5].end == 17);
}

TEST_CASE("link classes: ranks on different nodes use inter, on one node intra") {
  auto s = loom::generate(loom::one_f_one_b{}, {2, 2});
  loom::cost_model m = two_stage_model(1);  // one rank per node: the hop is inter-node
  m.intra = {.alpha = 100, .beta = 1};
  CHECK(loom::simulate(s, m).makespan == 21);
  // Both ranks on one node: the hop is intra-node now, 100 + 1 * 100 bytes = 200. By hand:
  // rank 1: F0 [201, 203] BW0 [203, 208] F1 [208, 210] BW1 [210, 215]; rank 0: BW0 [408, 411]
  // BW1 [415, 418].
  m.ranks_per_node = 2;
  CHECK(loom::simulate(s, m).makespan == 418);
  m.ranks_per_node = 0;  // 0: one node
  CHECK(loom::simulate(s, m).makespan == 418);
}

// Every family, random shapes and costs: the model written out from loom::costs gives the
// numbers loom::costs gives (bitwise for plain actions; overlapped pairs sum their parts in
// another order, so to rounding), and alpha + 0 * bytes is c for any message size.
TEST_CASE("uniform vectors reproduce loom::costs, and alpha + beta*bytes with beta = 0 reproduces c") {
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> u(0.1, 3);
  int checked = 0;
  for (auto const& e : loom::default_registry().entries()) {
    for (int trial = 0; trial < 6; ++trial) {
      loom::shape sh{.ranks = 2 + static_cast<int>(rng() % 4), .microbatches = 0, .chunks = 0};
      sh.microbatches = sh.ranks * (1 + static_cast<int>(rng() % 3));
      if (!e.check(e.resolve(sh)).empty()) continue;
      loom::costs k{.f = u(rng), .b = u(rng), .w = u(rng), .c = u(rng) / 4, .fb = trial % 2 ? u(rng) * 3 : -1,
                    .mem_w_ratio = u(rng) / 3};
      loom::schedule s = e.make(sh, {.cost = k});
      auto a = loom::simulate(s, k);
      loom::cost_model m = loom::cost_model::uniform(k, s.stages, s.ranks);
      for (auto& st : m.stages) st.message_bytes = 1e6 * u(rng);  // any size: beta is 0
      m.ranks_per_node = 1;
      auto b = loom::simulate(s, m);
      INFO(e.name << " p=" << sh.ranks << " m=" << sh.microbatches);
      REQUIRE(a.ok == b.ok);
      CHECK(b.makespan == doctest::Approx(a.makespan).epsilon(1e-12));
      CHECK(b.bubble_rate == doctest::Approx(a.bubble_rate).epsilon(1e-12));
      for (std::size_t r = 0; r < a.times.size(); ++r) {
        CHECK(b.peak_activation[r] == doctest::Approx(a.peak_activation[r]).epsilon(1e-12));
        for (std::size_t i = 0; i < a.times[r].size(); ++i) {
          CHECK(b.times[r][i].start == doctest::Approx(a.times[r][i].start).epsilon(1e-12));
          CHECK(b.times[r][i].end == doctest::Approx(a.times[r][i].end).epsilon(1e-12));
        }
      }
      ++checked;
    }
  }
  CHECK(checked > 60);
}

TEST_CASE("fit: a model of n pieces splits into a multiple of n stages and merges into a divisor") {
  loom::cost_model m;
  m.stages = {{.f = 4, .b = 8, .w = 2, .fb = 10, .activation = 2, .message_bytes = 64, .param_bytes = 100},
              {.f = 2, .b = 4, .w = 2, .fb = -1, .activation = 6, .message_bytes = 32, .param_bytes = 50}};
  auto split = m.fit(4);
  REQUIRE(split.stages.size() == 4);
  CHECK(split.stages[0] == loom::stage_cost{.f = 2, .b = 4, .w = 1, .fb = 5, .activation = 1, .message_bytes = 64, .param_bytes = 50});
  CHECK(split.stages[1] == split.stages[0]);
  CHECK(split.stages[3] == loom::stage_cost{.f = 1, .b = 2, .w = 1, .fb = -1, .activation = 3, .message_bytes = 32, .param_bytes = 25});
  auto merged = m.fit(1);
  REQUIRE(merged.stages.size() == 1);
  CHECK(merged.stages[0] == loom::stage_cost{.f = 6, .b = 12, .w = 4, .fb = -1, .activation = 8, .message_bytes = 32, .param_bytes = 150});
  CHECK(m.fit(2) == m);
  CHECK_THROWS_WITH_AS(m.fit(3), "cost model: 2 stages cannot be fitted to a schedule of 3 stages (one count must be a multiple of the other)",
                       loom::config_error);
  // A model of P pieces simulates interleaved 1F1B (2 chunks) by splitting each piece in two.
  loom::cost_model p4 = loom::cost_model::uniform({.f = 1, .b = 2, .w = 1}, 4, 4);
  auto il = loom::generate(loom::interleaved_1f1b{}, {4, 8, 2});
  CHECK(loom::simulate(il, p4).makespan == doctest::Approx(loom::simulate(il, loom::costs{.f = 1, .b = 2, .w = 1}).makespan));
}

TEST_CASE("a model that breaks a rule is refused with the field named") {
  auto s = loom::generate(loom::one_f_one_b{}, {2, 2});
  loom::cost_model m = two_stage_model();
  m.stages[1].b = -1;
  CHECK_THROWS_WITH_AS(loom::simulate(s, m), "cost model: stages[1].b must be a finite number >= 0 (got -1)", loom::config_error);
  m = two_stage_model();
  m.inter.beta = std::nan("");
  CHECK_THROWS_WITH_AS(loom::simulate(s, m), "cost model: links.inter.beta must be a finite number >= 0 (got nan)", loom::config_error);
  m = two_stage_model();
  m.mem_w_ratio = 2;
  CHECK_THROWS_WITH_AS(loom::simulate(s, m), "cost model: mem_w_ratio must be in [0, 1] (got 2)", loom::config_error);
  m.stages.clear();
  CHECK_THROWS_WITH_AS(loom::simulate(s, m), "cost model: stages must list at least one stage", loom::config_error);
}

TEST_CASE("zb-auto scores its candidates under a stage-resolved model") {
  // A heavy last stage (the vocabulary projection and the loss): zb-auto's schedule is never
  // slower under the model than the fixed families it seeds from, and stays within the limit in
  // the model's activation unit.
  loom::cost_model m;
  for (int i = 0; i < 4; ++i)
    m.stages.push_back({.f = i == 3 ? 3.0 : 1.0, .b = i == 3 ? 4.0 : 2.0, .w = 1, .activation = i == 0 ? 2.0 : 1.0, .message_bytes = 1000});
  m.intra = {.alpha = 0.1, .beta = 1e-4};
  const double limit = 6;
  auto z = loom::simulate(loom::generate(loom::zb_auto{}, {4, 8}, {.mem_limit = limit, .model = m}), m);
  REQUIRE(z.ok);
  CHECK(z.max_peak_activation() <= limit + 1e-9);
  for (auto fam : {"1f1b", "zb-h1", "gpipe-2bp", "1f1b-2bp"}) {
    auto f = loom::simulate(loom::default_registry().at(fam).make({4, 8}), m);
    INFO(fam);
    if (f.max_peak_activation() <= limit + 1e-9) CHECK(z.makespan <= f.makespan + 1e-9);
  }
  // share_costs: the per-rank means zb-auto builds from.
  auto k = loom::share_costs(m, 4);
  CHECK(k.f == 1.5);
  CHECK(k.b == 2.5);
  CHECK(k.w == 1);
  CHECK(k.c == doctest::Approx(0.2));
  CHECK(loom::share_activation(m, 4) == 1.25);
}

}  // namespace

namespace {
TEST_CASE("zb-v under a stage-resolved model: valid, within the limit in the model's unit, refused below p heaviest ranks") {
  loom::cost_model m;
  for (int i = 0; i < 8; ++i)
    m.stages.push_back({.f = i == 7 ? 2.0 : 1.0, .b = i == 7 ? 2.5 : 1.2, .w = 0.8, .activation = i == 0 ? 1.5 : 1.0});
  // V placement on 4 ranks: rank 0 holds stages 0 and 7 (1.5 + 1 per microbatch), the heaviest.
  auto s = loom::generate(loom::zb_v{}, {4, 8}, {.mem_limit = 12, .model = m});
  REQUIRE(loom::validate(s).ok);
  auto r = loom::simulate(s, m);
  REQUIRE(r.ok);
  CHECK(r.max_peak_activation() <= 12 + 1e-9);
  CHECK_THROWS_WITH_AS(loom::generate(loom::zb_v{}, {4, 8}, {.mem_limit = 9, .model = m}),
                       "zb-v needs mem-limit >= ranks x the heaviest rank's activation per microbatch = 10.00 (got mem-limit 9.00)",
                       loom::schedule_error);
}
}  // namespace
