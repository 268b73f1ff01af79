// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// zb-auto: over a grid of shapes, limits, placements (loop with 1-3 chunks, V) and costs the
// result is valid after lowering, never exceeds the memory limit on any rank, and is never worse
// than the handcrafted ZB-H1 / ZB-H2 orders, or loom's fixed families on its placement, whose
// memory fits; bad limits, costs and placements are rejected with the rule named; the search also
// runs in a constant expression.
#include <doctest/doctest.h>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_auto.hpp>

#include <string>
#include <vector>

namespace {

using loom::costs;
using loom::generate_options;
using loom::placement_kind;
using loom::shape;

const std::vector<costs> cost_grid = {
    {.f = 1, .b = 1, .w = 1},
    {.f = 1, .b = 1.2, .w = 0.6, .c = 0.1, .mem_w_ratio = 0.4},
    {.f = 2, .b = 3, .w = 1, .c = 0.5, .mem_w_ratio = 0.5},
    {.f = 1, .b = 2, .w = 0.2, .c = 0, .mem_w_ratio = 0},
};

double peak_over(const loom::simulation& sim) { return sim.max_peak_activation(); }

}  // namespace

TEST_CASE("zb-auto schedules are valid, lowerable and within the memory limit on every rank") {
  int runs = 0;
  // Placements: loop with 1, 2 and 3 chunks per rank (chunks = -1 stands for V, 2 chunks).
  for (int p : {1, 2, 3, 4, 6})
    for (int m : {1, 2, 3, 5, 8, 13})
      for (int chunks : {1, 2, 3, -1})
        for (double lim_factor : {0.0, 0.5, 1.0, 2.0})
          for (auto const& k : cost_grid) {
            const auto pk = chunks < 0 ? placement_kind::v : placement_kind::loop;
            double limit = lim_factor == 0.0 ? 1.0 : lim_factor * p;
            if (limit < 1) limit = 1;
            generate_options o{.cost = k, .mem_limit = limit, .placement = pk};
            shape s{p, m, chunks < 0 ? 2 : chunks};
            INFO("p=", p, " m=", m, " placement=", loom::to_string(pk), " chunks=", s.chunks, " limit=", limit, " f=", k.f,
                 " b=", k.b);
            loom::schedule sched = loom::generate(loom::zb_auto{}, s, o);
            auto v = loom::validate(loom::lower(sched));
            REQUIRE_MESSAGE(v.ok, v.message);
            CHECK(sched.placement == pk);
            CHECK(sched.stages == p * s.chunks);
            auto sim = loom::simulate(sched, k);
            REQUIRE(sim.ok);
            for (double pk_r : sim.peak_activation) CHECK(pk_r <= limit + 1e-9);
            ++runs;
          }
  CHECK(runs == 5 * 6 * 4 * 4 * 4);
}

TEST_CASE("zb-auto on the loop placement is never worse than ZB-H1 and ZB-H2 when their memory fits") {
  for (int p : {2, 3, 4, 5, 8})
    for (int m : {1, 4, 7, 12, 24})
      for (auto const& k : cost_grid) {
        shape s{p, m, 1};
        auto h1 = loom::simulate(loom::generate(loom::zb_h1{}, s), k);
        auto h2 = loom::simulate(loom::generate(loom::zb_h2{}, s), k);
        for (double limit : {1.0 * p, 2.0 * p}) {
          INFO("p=", p, " m=", m, " limit=", limit, " f=", k.f, " b=", k.b, " w=", k.w, " c=", k.c);
          auto a = loom::simulate(loom::generate(loom::zb_auto{}, s, {.cost = k, .mem_limit = limit}), k);
          if (peak_over(h1) <= limit + 1e-9) CHECK(a.bubble_rate <= h1.bubble_rate + 1e-12);
          if (peak_over(h2) <= limit + 1e-9) CHECK(a.bubble_rate <= h2.bubble_rate + 1e-12);
          CHECK(a.bubble_rate >= -1e-12);
        }
      }
}

TEST_CASE("zb-auto with any chunk count is never worse than loom's fixed families on its placement that fit") {
  // Loop placement with v chunks: interleaved 1F1B and looped BFS (PyTorch's
  // ScheduleInterleavedZeroBubble is interleaved 1F1B with the backward split); V: v-half, v-min,
  // Hanayo with one wave and DualPipeV. Limits p and 2p; a family whose peak exceeds the limit
  // is not a competitor.
  int compared = 0;
  for (int p : {2, 3, 4})
    for (int m : {2, 5, 8, 12})
      for (auto const& k : cost_grid)
        for (double mult : {1.0, 2.0}) {
          const double limit = mult * p;
          auto check_against = [&](const loom::schedule& fixed, const loom::schedule& mine) {
            auto fs = loom::simulate(fixed, k);
            REQUIRE(fs.ok);
            if (fs.max_peak_activation() > limit + 1e-9) return;
            auto ms = loom::simulate(mine, k);
            INFO(fixed.name, " p=", p, " m=", m, " chunks=", fixed.chunks, " limit=", limit, " f=", k.f, " b=", k.b);
            CHECK(ms.bubble_rate <= fs.bubble_rate + 1e-12);
            ++compared;
          };
          for (int v : {2, 3}) {
            auto mine = loom::generate(loom::zb_auto{}, shape{p, m, v}, {.cost = k, .mem_limit = limit});
            CHECK(mine.chunks == v);
            check_against(loom::generate(loom::interleaved_1f1b{}, shape{p, m, v}), mine);
            check_against(loom::generate(loom::looped_bfs{}, shape{p, m, v}), mine);
          }
          auto vee = loom::generate(loom::zb_auto{}, shape{p, m, 2}, {.cost = k, .mem_limit = limit, .placement = placement_kind::v});
          for (auto const& name : {"v-half", "v-min", "dualpipe-v"}) {
            auto const& e = loom::default_registry().at(name);
            if (e.check({p, m, 2}).empty()) check_against(e.make({p, m, 2}), vee);
          }
          check_against(loom::generate(loom::hanayo{}, shape{p, m, 1}), vee);
        }
  CHECK(compared > 200);
}

TEST_CASE("zb-auto reaches zero bubble rate at unit costs with 2p-1 units of memory and m >= 2p-1") {
  for (int p : {2, 4, 6})
    for (int m : {2 * p - 1, 3 * p}) {
      auto sched = loom::generate(loom::zb_auto{}, shape{p, m, 1}, {.mem_limit = 2.0 * p - 1});
      auto sim = loom::simulate(sched);
      INFO("p=", p, " m=", m);
      CHECK(sim.bubble_rate == doctest::Approx(0).epsilon(1e-12));
    }
}

TEST_CASE("zb-auto with more memory than 1F1B beats ZB-H1 under realistic costs") {
  // The Zero Bubble paper's point (§5.3): with 2p units the auto-scheduler beats the handcrafted
  // 1F1B-memory order. Costs with w < f < b and comm, as its profiled ones.
  costs k{.f = 1.0, .b = 1.05, .w = 0.55, .c = 0.05, .mem_w_ratio = 0.4};
  for (int p : {4, 8})
    for (int m : {3 * p, 4 * p}) {
      shape s{p, m, 1};
      auto h1 = loom::simulate(loom::generate(loom::zb_h1{}, s), k);
      auto a = loom::simulate(loom::generate(loom::zb_auto{}, s, {.cost = k, .mem_limit = 2.0 * p}), k);
      INFO("p=", p, " m=", m);
      CHECK(a.bubble_rate < h1.bubble_rate / 2);
    }
}

TEST_CASE("zb-auto rejects a limit below one microbatch, bad costs and mismatched placements with the rule") {
  shape s{4, 8, 1};
  auto rule_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  std::string r = rule_of([&] { (void)loom::generate(loom::zb_auto{}, s, {.mem_limit = 0.5}); });
  CHECK(r.find("zb-auto needs mem-limit >= 1") != std::string::npos);
  CHECK_THROWS_AS((void)loom::generate(loom::zb_auto{}, s, {.mem_limit = 0.5}), loom::config_error);
  r = rule_of([&] { (void)loom::generate(loom::zb_auto{}, s, {.cost = {.f = 0}}); });
  CHECK(r.find("zb-auto needs f > 0") != std::string::npos);
  r = rule_of([&] { (void)loom::generate(loom::zb_auto{}, s, {.cost = {.mem_w_ratio = 1.5}}); });
  CHECK(r.find("mem-w-ratio") != std::string::npos);
  r = rule_of([&] { (void)loom::generate(loom::zb_auto{}, s, {.placement = placement_kind::v}); });
  CHECK(r.find("placement v runs 2 chunk(s)") != std::string::npos);
  r = rule_of([&] { (void)loom::generate(loom::zb_auto{}, shape{4, 8, 3}, {.placement = placement_kind::v}); });
  CHECK(r.find("placement v runs 2 chunk(s) per rank (got chunks=3)") != std::string::npos);
  r = rule_of([&] { (void)loom::generate(loom::zb_auto{}, shape{4, 8, -1}); });
  CHECK(r.find("zb-auto needs chunks >= 1") != std::string::npos);
  // The minimum limit itself is accepted, on both placements.
  CHECK(loom::validate(loom::generate(loom::zb_auto{}, s, {.mem_limit = 1})).ok);
  CHECK(loom::validate(loom::generate(loom::zb_auto{}, shape{4, 8, 2}, {.mem_limit = 1, .placement = placement_kind::v})).ok);
}

TEST_CASE("zb-auto without options uses unit costs, limit p and the placement its chunk count names") {
  auto loop = loom::generate(loom::zb_auto{}, shape{4, 8});
  CHECK(loop.placement == placement_kind::loop);
  CHECK(loom::simulate(loop).max_peak_activation() <= 4 + 1e-9);
  auto vee = loom::generate(loom::zb_auto{}, shape{4, 8, 2});
  CHECK(vee.placement == placement_kind::v);
  CHECK(loom::simulate(vee).max_peak_activation() <= 4 + 1e-9);
}

TEST_CASE("zb-auto is registered and runs through the registry with generate_options") {
  auto const& e = loom::default_registry().at("zb-auto");
  CHECK(e.cost_aware);
  auto sched = e.make(shape{4, 12}, {.cost = {.f = 1, .b = 1, .w = 0.5}, .mem_limit = 8});
  CHECK(loom::validate(sched).ok);
  CHECK(loom::simulate(sched, {.f = 1, .b = 1, .w = 0.5}).max_peak_activation() <= 8 + 1e-9);
}

// The same search runs during constant evaluation.
static_assert(loom::summarize(loom::zb_auto{}, shape{3, 6}).valid);
static_assert(loom::summarize(loom::zb_auto{}, shape{3, 6}).peak_activation <= 3);
