// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The certified lower bound (bound.hpp) and the exact mode (exact.hpp): the bound never exceeds
// what any generated schedule achieves (every registered family, random shapes, costs and limits),
// nor the optimum the exact mode proves; the exact mode agrees with brute-force enumeration where
// that is feasible, is never worse than zb-auto, and returns valid schedules within the limit.
#include <doctest/doctest.h>

#include <loom/schedule.hpp>
#include <loom/schedule/bound.hpp>
#include <loom/schedule/exact.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using loom::costs;
using loom::placement_kind;
using loom::shape;

double longest(const loom::simulation& s) { return *std::max_element(s.span.begin(), s.span.end()); }

const std::vector<costs> cost_grid = {
    {.f = 1, .b = 1, .w = 1},
    {.f = 1, .b = 1.2, .w = 0.7, .c = 0.1, .mem_w_ratio = 0.43},
    {.f = 2, .b = 1.5, .w = 0.5, .c = 0.6, .mem_w_ratio = 0.2},
    {.f = 1, .b = 2, .w = 1.5, .c = 0, .mem_w_ratio = 1},
};

//! Every order of one rank's passes in which each stream runs in microbatch order and a rank's own
//! dependencies hold (B after its F, W after its B); `emit` receives each program.
void rank_orders(int m, const std::vector<int>& stages, std::vector<loom::action>& cur, std::vector<int>& cnt,
                 const std::function<void(const std::vector<loom::action>&)>& emit) {
  const int c = static_cast<int>(stages.size());
  if (static_cast<int>(cur.size()) == 3 * m * c) {
    emit(cur);
    return;
  }
  for (int ch = 0; ch < c; ++ch)
    for (int kind = 0; kind < 3; ++kind) {
      int& n = cnt[static_cast<std::size_t>(ch * 3 + kind)];
      if (n >= m) continue;
      if (kind > 0 && n >= cnt[static_cast<std::size_t>(ch * 3 + kind - 1)]) continue;
      const int st = stages[static_cast<std::size_t>(ch)];
      cur.push_back(kind == 0 ? loom::forward(n, st) : kind == 1 ? loom::backward_input(n, st) : loom::backward_weight(n, st));
      ++n;
      rank_orders(m, stages, cur, cnt, emit);
      --n;
      cur.pop_back();
    }
}

//! The best longest span over every schedule in the exact mode's search space, by enumeration.
double brute_force(shape s, placement_kind pk, const costs& k, double limit) {
  loom::schedule frame = loom::make_schedule("brute", s, s.ranks * s.chunks, pk);
  std::vector<std::vector<std::vector<loom::action>>> per_rank(static_cast<std::size_t>(s.ranks));
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<int> stages;
    for (int st = 0; st < frame.stages; ++st)
      if (frame.stage_to_rank[static_cast<std::size_t>(st)] == r) stages.push_back(st);
    std::vector<loom::action> cur;
    std::vector<int> cnt(stages.size() * 3, 0);
    rank_orders(s.microbatches, stages, cur, cnt, [&](const std::vector<loom::action>& p) { per_rank[static_cast<std::size_t>(r)].push_back(p); });
  }
  double best = 1e300;
  std::vector<std::size_t> pick(static_cast<std::size_t>(s.ranks), 0);
  while (true) {
    for (int r = 0; r < s.ranks; ++r)
      frame.programs[static_cast<std::size_t>(r)] = per_rank[static_cast<std::size_t>(r)][pick[static_cast<std::size_t>(r)]];
    auto sim = loom::simulate(frame, k);
    if (sim.ok && sim.max_peak_activation() <= limit + 1e-9) best = std::min(best, longest(sim));
    int r = 0;
    while (r < s.ranks && ++pick[static_cast<std::size_t>(r)] == per_rank[static_cast<std::size_t>(r)].size()) pick[static_cast<std::size_t>(r++)] = 0;
    if (r == s.ranks) break;
  }
  return best;
}

}  // namespace

TEST_CASE("the lower bound never exceeds the makespan, span or bubble rate of any generated schedule") {
  // Every registered family (fixed and cost-aware), random shapes, costs (with and without an
  // overlapped pair time) and limits; the bound at the schedule's own peak (so the schedule is one
  // of those it covers) and with no limit.
  std::mt19937 rng(20260111);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  int checked = 0;
  for (int it = 0; it < 300; ++it) {
    const int p = std::uniform_int_distribution<int>(1, 8)(rng), m = std::uniform_int_distribution<int>(1, 20)(rng);
    costs k{.f = uni(0.2, 3), .b = uni(0.2, 3), .w = uni(0, 2), .c = uni(0, 1), .mem_w_ratio = uni(0, 1)};
    if (it % 4 == 0) k.fb = uni(0.5, 6);
    for (auto const& e : loom::default_registry().entries()) {
      shape sh = e.resolve({p, m, std::uniform_int_distribution<int>(0, 3)(rng)});
      loom::generate_options o{.cost = k, .mem_limit = p * uni(1, 2)};
      if (e.name == "zb-v" || (e.cost_aware && sh.chunks == 2 && it % 2 == 0)) {
        o.placement = placement_kind::v;
        sh.chunks = 2;
      }
      if (!e.check(sh).empty()) continue;
      loom::schedule s;
      try {
        s = e.make(sh, o);
      } catch (const loom::schedule_error&) {
        continue;  // a limit the family cannot meet
      }
      auto sim = loom::simulate(s, k);
      REQUIRE(sim.ok);
      for (double limit : {sim.max_peak_activation(), 0.0}) {
        auto lb = loom::lower_bound(s, k, limit);
        INFO(s.name, " p=", p, " m=", m, " chunks=", s.chunks, " limit=", limit, " fb=", k.fb);
        CHECK(lb.max_span <= longest(sim) * (1 + 1e-12) + 1e-12);
        CHECK(lb.makespan <= sim.makespan * (1 + 1e-12) + 1e-12);
        CHECK(lb.bubble_rate <= sim.bubble_rate + 1e-12);
        for (int r = 0; r < p; ++r) CHECK(lb.span[static_cast<std::size_t>(r)] <= sim.span[static_cast<std::size_t>(r)] * (1 + 1e-12) + 1e-12);
        ++checked;
      }
    }
  }
  CHECK(checked > 5000);
}

TEST_CASE("at the loop placement with limit p the bound equals ZB-H1's bubble, proving it optimal") {
  // (p-1)(f+b-w+4c) on rank 0 when holding a B is worth more than deferring W's, (b+w) >= w/r.
  for (int p : {2, 4, 8, 16})
    for (int m : {2 * p, 2 * p + 1, 4 * p})
      for (auto const& k : {costs{.f = 1, .b = 1, .w = 1, .c = 0, .mem_w_ratio = 1},
                            costs{.f = 18.5, .b = 18.1, .w = 9.3, .c = 0.6, .mem_w_ratio = 0.3664},
                            costs{.f = 10.4, .b = 10.2, .w = 7.7, .c = 0.46, .mem_w_ratio = 0.4324}}) {
        auto h1 = loom::generate(loom::zb_h1{}, shape{p, m});
        auto sim = loom::simulate(h1, k);
        auto lb = loom::lower_bound(h1, k, p);
        INFO("p=", p, " m=", m, " f=", k.f);
        CHECK(lb.span[0] == doctest::Approx(m * (k.f + k.b + k.w) + (p - 1) * (k.f + k.b - k.w + 4 * k.c)));
        CHECK(lb.max_span == doctest::Approx(longest(sim)));
        CHECK(lb.bubble_rate == doctest::Approx(sim.bubble_rate));
      }
}

TEST_CASE("the exact mode agrees with brute-force enumeration on the smallest shapes") {
  int compared = 0;
  for (auto const& k : cost_grid)
    for (auto [s, pk] : {std::pair{shape{2, 2, 1}, placement_kind::loop}, std::pair{shape{2, 3, 1}, placement_kind::loop},
                         std::pair{shape{3, 2, 1}, placement_kind::loop}, std::pair{shape{2, 1, 2}, placement_kind::v},
                         std::pair{shape{2, 1, 2}, placement_kind::loop}})
      for (double limit : {1.0 * s.ranks, 2.0 * s.ranks}) {
        INFO("p=", s.ranks, " m=", s.microbatches, " chunks=", s.chunks, " ", loom::to_string(pk), " limit=", limit, " f=", k.f);
        auto ex = loom::solve_exact(s, pk, k, limit, {.seconds = 0});
        REQUIRE(ex.optimal);
        CHECK(ex.span == doctest::Approx(brute_force(s, pk, k, limit)));
        ++compared;
      }
  CHECK(compared == 4 * 5 * 2);
}

TEST_CASE("the bound never exceeds the optimum the exact mode proves, and zb-auto never beats it") {
  // Shapes p <= 4, m <= 8 on the loop placement (1 and 2 chunks) and V, limits p, 1.5p, 2p. A
  // node budget keeps the test short; the loop shapes with one chunk must all be proven.
  int solved = 0, loop_solved = 0, loop_total = 0;
  for (int p : {2, 3, 4})
    for (int m : {p, 2 * p})
      for (auto const& k : cost_grid)
        for (double mult : {1.0, 1.5, 2.0})
          for (int layout : {1, 2, -1}) {
            if (m > 8 || (layout != 1 && m > 4)) continue;
            const auto pk = layout < 0 ? placement_kind::v : placement_kind::loop;
            const shape s{p, m, layout < 0 ? 2 : layout};
            const double limit = mult * p;
            INFO("p=", p, " m=", m, " chunks=", s.chunks, " ", loom::to_string(pk), " limit=", limit, " f=", k.f);
            auto ex = loom::solve_exact(s, pk, k, limit, {.seconds = 0, .node_limit = layout == 1 ? 2000000 : 200000});
            auto sim = loom::simulate(ex.best, k);
            REQUIRE(sim.ok);
            CHECK(loom::validate(loom::lower(ex.best)).ok);
            CHECK(sim.max_peak_activation() <= limit + 1e-9);
            CHECK(longest(sim) == doctest::Approx(ex.span));
            CHECK(ex.bound_span <= ex.span + 1e-9);
            auto lb = loom::lower_bound(ex.best, k, limit);
            CHECK(lb.max_span <= ex.bound_span + 1e-9);
            auto za = loom::simulate(loom::generate(loom::zb_auto{}, s, {.cost = k, .mem_limit = limit, .placement = pk}), k);
            CHECK(ex.span <= longest(za) + 1e-9);
            if (ex.optimal) {
              ++solved;
              CHECK(lb.max_span <= ex.span + 1e-9);
              CHECK(lb.bubble_rate <= ex.bubble_rate + 1e-12);
            }
            if (layout == 1) {
              if (!ex.optimal) MESSAGE("not proven: p=", p, " m=", m, " limit=", limit, " f=", k.f, " nodes ", ex.nodes);
              ++loop_total;
              loop_solved += ex.optimal ? 1 : 0;
            }
          }
  CHECK(loop_solved == loop_total);
  CHECK(solved > 60);
}
