// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Chimera, BitPipe, Hanayo, breadth-first looped and the 2BP classics: validity over grids of
// shapes, the papers' closed forms (each also as a static_assert) and the rejected shapes.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "loom/schedule/bitpipe.hpp"
#include "loom/schedule/chimera.hpp"
#include "loom/schedule/gpipe.hpp"
#include "loom/schedule/gpipe_2bp.hpp"
#include "loom/schedule/hanayo.hpp"
#include "loom/schedule/looped_bfs.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/one_f_one_b_2bp.hpp"
#include "loom/schedule/registry.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/static_schedule.hpp"
#include "loom/schedule/validate.hpp"

namespace {

using loom::costs;
using loom::shape;

constexpr bool near(double a, double b) { return (a > b ? a - b : b - a) < 1e-9; }

// The setting of the step-model closed forms: a forward as long as a full backward (f = b + w).
constexpr costs step_costs{.f = 2, .b = 1, .w = 1};
// Unequal costs, so that a closed form cannot hold by a coincidence of f = b = w.
constexpr costs odd_costs{.f = 1, .b = 2, .w = 1.5};

constexpr double chimera_paper_ratio(int d, int n) { return double(d - 2) / double(2 * n + d - 2); }
// Forward doubling's setting (Li & Hoefler sec. 3.5): a backward twice a forward (b + w = 2f), so
// that a slot of two forwards is as long as a backward.
constexpr costs doubling_costs{.f = 1, .b = 1, .w = 1};

// Largest per-rank global bubble time.
double max_bubble_time(const loom::simulation& sim, int ranks) {
  double b = 0;
  for (int r = 0; r < ranks; ++r) b = sim.bubble_time(r) > b ? sim.bubble_time(r) : b;
  return b;
}

template <class F>
void check_grid(std::vector<int> chunk_values) {
  const std::vector<int> ranks{1, 2, 3, 4, 5, 6, 8, 12, 16};
  const std::vector<int> mbs{1, 2, 3, 5, 8, 13, 16, 31, 64};
  for (int v : chunk_values)
    for (int p : ranks)
      for (int m : mbs) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(v);
        const shape s{p, m, v};
        REQUIRE(loom::check(F{}, s).empty());
        loom::schedule sc = loom::generate(F{}, s);
        auto plain = loom::validate(sc);
        REQUIRE_MESSAGE(plain.ok, plain.message);
        auto lowered = loom::validate(loom::lower(sc));
        REQUIRE_MESSAGE(lowered.ok, lowered.message);
      }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Compile time: one static_assert per published closed form.

// Chimera §3: D = 4 stages, N = 4 micro-batches per worker: bubble ratio (D-2)/(2N+D-2) = 1/5;
// activations from D/2+1 (end ranks) to D (middle ranks).
static_assert(near(loom::summarize(loom::chimera{}, shape{4, 4}, step_costs).bubble_ratio, chimera_paper_ratio(4, 4)));
static_assert(near(loom::summarize(loom::chimera{}, shape{8, 16}, step_costs).bubble_ratio, chimera_paper_ratio(8, 16)));
static_assert(loom::summarize(loom::chimera{}, shape{8, 8}, step_costs).peak_activation == 8);
static_assert(loom::summarize(loom::chimera{}, shape{8, 8}, step_costs).peak_activation_rank0 == 5);
// BitPipe: (D-2)/(4N+D-2) for its V (v = 2); the published D = 4, N = 4 timeline (forward chunk
// 1 unit, backward chunk 2 units) spans 28 units with 24 busy per rank.
static_assert(near(loom::summarize(loom::bitpipe{}, shape{4, 4}, step_costs).bubble_ratio, 2.0 / 18.0));
static_assert(loom::summarize(loom::bitpipe{}, shape{4, 4}, costs{.f = 2, .b = 2, .w = 2}).makespan == 28);
// Hanayo: (P-1)/(2WN+P-1), W waves.
static_assert(near(loom::summarize(loom::hanayo{}, shape{4, 8, 2}, step_costs).bubble_ratio, 3.0 / (2 * 2 * 8 + 3)));
// Breadth-first looped: GPipe's bubble divided by v.
static_assert(near(loom::summarize(loom::looped_bfs{}, shape{4, 8, 4}, odd_costs).bubble_time,
                   loom::summarize(loom::gpipe{}, shape{4, 8}, odd_costs).bubble_time / 4));
// 2BP: (P-1)w less bubble than the fused base schedule.
static_assert(near(loom::summarize(loom::gpipe_2bp{}, shape{4, 8}, odd_costs).bubble_time,
                   loom::summarize(loom::gpipe{}, shape{4, 8}, odd_costs).bubble_time - 3 * odd_costs.w));
static_assert(near(loom::summarize(loom::one_f_one_b_2bp{}, shape{4, 8}, odd_costs).bubble_time,
                   loom::summarize(loom::one_f_one_b{}, shape{4, 8}, odd_costs).bubble_time - 3 * odd_costs.w));
static_assert(loom::static_schedule<loom::chimera, shape{4, 8}>::ok);
// Forward doubling: the basic unit's ratio at b + w = 2f, twice the activation memory.
static_assert(near(loom::summarize(loom::chimera_fd{}, shape{4, 16}, doubling_costs).bubble_ratio, chimera_paper_ratio(4, 16)));
static_assert(near(loom::summarize(loom::chimera_fd{}, shape{8, 32}, doubling_costs).bubble_ratio, chimera_paper_ratio(8, 32)));
static_assert(loom::summarize(loom::chimera_fd{}, shape{8, 16}, doubling_costs).peak_activation == 16);
static_assert(loom::summarize(loom::chimera_fd{}, shape{8, 16}, doubling_costs).peak_activation_rank0 == 13);
static_assert(loom::static_schedule<loom::chimera_fd, shape{4, 8}>::ok);
static_assert(!loom::check(loom::chimera_fd{}, shape{4, 12}).empty());
static_assert(!loom::check(loom::chimera{}, shape{4, 8, 2}).empty());

// ---------------------------------------------------------------------------------------------
// Grids: valid, and deadlock-free after lowering.

TEST_CASE("chimera is valid and deadlock-free after lowering on every shape of the grid") {
  check_grid<loom::chimera>({1});
}

TEST_CASE("chimera-fd is valid and deadlock-free after lowering for even D and N a multiple of 2D, and refuses other shapes") {
  for (int d = 2; d <= 16; d += 2)
    for (int k = 1; k <= 4; ++k) {
      const shape s{d, 2 * d * k, 1};
      CAPTURE(d);
      CAPTURE(k);
      REQUIRE(loom::check(loom::chimera_fd{}, s).empty());
      loom::schedule sc = loom::generate(loom::chimera_fd{}, s);
      CHECK(sc.directions == 2);
      CHECK(sc.param_copies == 2);
      auto plain = loom::validate(sc);
      REQUIRE_MESSAGE(plain.ok, plain.message);
      auto lowered = loom::validate(loom::lower(sc));
      REQUIRE_MESSAGE(lowered.ok, lowered.message);
      // The direct order's placement and microbatch split per basic unit: D per direction per
      // doubling step.
      int up = 0;
      for (int dir : sc.mb_direction) up += dir;
      CHECK(up == d * k);
    }
  CHECK(loom::check(loom::chimera_fd{}, shape{3, 12}) == "chimera-fd needs an even number of ranks >= 2 (got 3)");
  CHECK(loom::check(loom::chimera_fd{}, shape{1, 2}) == "chimera-fd needs an even number of ranks >= 2 (got 1)");
  CHECK(loom::check(loom::chimera_fd{}, shape{4, 12}) ==
        "chimera-fd needs microbatches a multiple of 2 x ranks = 8 (a doubling step is two basic units; got 12); chimera takes any count");
  CHECK(loom::check(loom::chimera_fd{}, shape{4, 8, 2}) == "chimera-fd runs exactly 1 chunk(s) per rank (got chunks=2)");
  CHECK_THROWS_AS(loom::generate(loom::chimera_fd{}, shape{4, 4}), loom::schedule_error);
}

TEST_CASE("bitpipe is valid and deadlock-free after lowering for 1 to 4 chunks per direction") {
  check_grid<loom::bitpipe>({1, 2, 3, 4});
}

TEST_CASE("hanayo is valid and deadlock-free after lowering for 1 to 4 waves") {
  check_grid<loom::hanayo>({1, 2, 3, 4});
}

TEST_CASE("looped-bfs is valid and deadlock-free after lowering for 1 to 4 chunks") {
  check_grid<loom::looped_bfs>({1, 2, 3, 4});
}

TEST_CASE("gpipe-2bp and 1f1b-2bp are valid and deadlock-free after lowering") {
  check_grid<loom::gpipe_2bp>({1});
  check_grid<loom::one_f_one_b_2bp>({1});
}

// ---------------------------------------------------------------------------------------------
// Published closed forms over grids.

TEST_CASE("chimera's bubble ratio is (D-2)/(2N+D-2) for even D and N a multiple of D") {
  for (int d = 2; d <= 16; d += 2)
    for (int k = 1; k <= 4; ++k) {
      const int n = k * d;
      CAPTURE(d);
      CAPTURE(n);
      auto sim = loom::simulate(loom::generate(loom::chimera{}, shape{d, n}), step_costs);
      REQUIRE(sim.ok);
      CHECK(sim.bubble_ratio == doctest::Approx(chimera_paper_ratio(d, n)));
      // D-2 idle steps of one forward each on every rank.
      for (int r = 0; r < d; ++r) CHECK(sim.bubble_time(r) == doctest::Approx((d - 2) * step_costs.f));
    }
}

TEST_CASE("chimera-fd removes direct concatenation's intermediate bubbles: the basic unit's ratio (D-2)/(2N+D-2) at b+w = 2f") {
  constexpr double slot = doubling_costs.f + doubling_costs.b + doubling_costs.w;  // one F and one BW
  for (int d = 2; d <= 16; d += 2) {
    double previous = 0;
    for (int k = 1; k <= 4; ++k) {
      const int n = 2 * d * k;
      CAPTURE(d);
      CAPTURE(n);
      auto fd = loom::simulate(loom::generate(loom::chimera_fd{}, shape{d, n}), doubling_costs);
      auto direct = loom::simulate(loom::generate(loom::chimera{}, shape{d, n}), doubling_costs);
      REQUIRE(fd.ok);
      REQUIRE(direct.ok);
      CHECK(fd.bubble_ratio == doctest::Approx(chimera_paper_ratio(d, n)));
      // Every further doubling step adds only its work, 2D microbatches of F + BW on each rank.
      if (k > 1) CHECK(fd.makespan - previous == doctest::Approx(2 * d * slot));
      previous = fd.makespan;
      // Direct concatenation at the same costs leaves intermediate bubbles.
      if (d >= 4) CHECK(direct.bubble_ratio > fd.bubble_ratio + 0.05);
    }
  }
}

TEST_CASE("chimera-fd holds D more activations than direct concatenation on every rank: twice its peak, 2D") {
  for (int d = 2; d <= 16; d += 2)
    for (int k = 1; k <= 3; ++k) {
      CAPTURE(d);
      CAPTURE(k);
      auto fd = loom::simulate(loom::generate(loom::chimera_fd{}, shape{d, 2 * d * k}), odd_costs);
      auto direct = loom::simulate(loom::generate(loom::chimera{}, shape{d, 2 * d * k}), odd_costs);
      for (int r = 0; r < d; ++r) {
        CAPTURE(r);
        CHECK(fd.peak_activation[static_cast<std::size_t>(r)] == doctest::Approx(direct.peak_activation[static_cast<std::size_t>(r)] + d));
      }
      CHECK(fd.max_peak_activation() == doctest::Approx(2 * direct.max_peak_activation()));
      CHECK(fd.max_peak_activation() == doctest::Approx(2 * d));
    }
}

TEST_CASE("a user adds chimera-fd to a registry and selects it by name") {
  loom::registry r = loom::default_registry();
  CHECK(r.find("chimera-fd") == nullptr);  // not built in (see docs/schedules-more.md)
  r.add<loom::chimera_fd>();
  const auto& e = r.at("chimera-fd");
  CHECK(e.check(e.resolve({4, 12})) ==
        "chimera-fd needs microbatches a multiple of 2 x ranks = 8 (a doubling step is two basic units; got 12); chimera takes any count");
  loom::schedule s = e.make({4, 16});
  CHECK(s.name == "chimera-fd");
  CHECK(loom::validate(loom::lower(s)).ok);
}

TEST_CASE("chimera holds D/2+1 activations on its end ranks and D in the middle, both replicas counted") {
  for (int d = 2; d <= 16; d += 2)
    for (int k = 1; k <= 3; ++k) {
      CAPTURE(d);
      CAPTURE(k);
      auto sim = loom::simulate(loom::generate(loom::chimera{}, shape{d, k * d}), step_costs);
      CHECK(sim.peak_activation.front() == doctest::Approx(d / 2 + 1));
      CHECK(sim.peak_activation.back() == doctest::Approx(d / 2 + 1));
      CHECK(sim.max_peak_activation() == doctest::Approx(d));
    }
}

TEST_CASE("bidirectional families place both directions, split the microbatches and report two parameter copies") {
  for (int p : {1, 2, 5, 8}) {
    CAPTURE(p);
    for (auto sc : {loom::generate(loom::chimera{}, shape{p, 2 * p}), loom::generate(loom::bitpipe{}, shape{p, 2 * p})}) {
      CHECK(sc.directions == 2);
      CHECK(sc.param_copies == 2);
      CHECK(sc.placement == loom::placement_kind::bidirectional);
      REQUIRE(sc.stage_to_rank.size() == static_cast<std::size_t>(2 * sc.stages));
      // The up path is the mirror image of the down path.
      for (int s = 0; s < sc.stages; ++s)
        CHECK(sc.stage_to_rank[static_cast<std::size_t>(sc.stages + s)] == p - 1 - sc.stage_to_rank[static_cast<std::size_t>(s)]);
      int up = 0;
      for (int dir : sc.mb_direction) up += dir;
      CHECK(up == (p / 2) * 2);  // floor(P/2) of every unit of P goes up
    }
  }
  auto h = loom::generate(loom::hanayo{}, shape{4, 8, 2});
  CHECK(h.param_copies == 1);
  CHECK(h.directions == 1);
  CHECK(h.stages == 16);
  CHECK(h.chunks == 4);
}

TEST_CASE("bitpipe's bubble ratio is (D-2)/(2vN+D-2), the paper's (D-2)/(4N+D-2) for its V") {
  for (int d = 2; d <= 16; d += 2)
    for (int v = 1; v <= 4; ++v)
      for (int k = 1; k <= 3; ++k) {
        const int n = k * d;
        CAPTURE(d);
        CAPTURE(v);
        CAPTURE(n);
        auto sim = loom::simulate(loom::generate(loom::bitpipe{}, shape{d, n, v}), step_costs);
        REQUIRE(sim.ok);
        CHECK(sim.bubble_ratio == doctest::Approx(double(d - 2) / double(2 * v * n + d - 2)));
      }
}

TEST_CASE("bitpipe reproduces the published D = 4, N = 4 timeline: 28 units, 24 busy on every rank") {
  auto sc = loom::generate(loom::bitpipe{}, shape{4, 4});
  auto sim = loom::simulate(sc, costs{.f = 2, .b = 2, .w = 2});  // chunk: forward 1, backward 2
  CHECK(sim.makespan == doctest::Approx(28));
  for (int r = 0; r < 4; ++r) CHECK(sim.busy[static_cast<std::size_t>(r)] == doctest::Approx(24));
  // The figure's rank 0 starts F(mb 0, s0), F(mb 1, s0), then the up pipeline's stages 3 and 4.
  auto const& p0 = sc.programs[0];
  CHECK(p0[0] == loom::forward(0, 0));
  CHECK(p0[1] == loom::forward(1, 0));
  CHECK(p0[2] == loom::forward(2, 3));
  CHECK(p0[3] == loom::forward(2, 4));
}

TEST_CASE("hanayo's bubble ratio is (P-1)/(2WN+P-1) with one model copy") {
  for (int p = 1; p <= 16; ++p)
    for (int w = 1; w <= 4; ++w)
      for (int k = 1; k <= 3; ++k) {
        const int n = k * p;
        CAPTURE(p);
        CAPTURE(w);
        CAPTURE(n);
        auto sim = loom::simulate(loom::generate(loom::hanayo{}, shape{p, n, w}), step_costs);
        REQUIRE(sim.ok);
        CHECK(sim.bubble_ratio == doctest::Approx(double(p - 1) / double(2 * w * n + p - 1)));
        CHECK(sim.max_peak_activation() <= doctest::Approx(p));
      }
}

TEST_CASE("looped-bfs has GPipe's bubble divided by v and GPipe's peak activation m, for any m >= p") {
  for (int p = 1; p <= 16; p += 3)
    for (int m = p; m <= 64; m += 7)
      for (int v = 1; v <= 4; ++v) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(v);
        auto sim = loom::simulate(loom::generate(loom::looped_bfs{}, shape{p, m, v}), odd_costs);
        auto base = loom::simulate(loom::generate(loom::gpipe{}, shape{p, m}), odd_costs);
        const double expected = (p - 1) * (odd_costs.f + odd_costs.b + odd_costs.w) / v;
        for (int r = 0; r < p; ++r) CHECK(sim.bubble_time(r) == doctest::Approx(expected));
        CHECK(max_bubble_time(sim, p) == doctest::Approx(max_bubble_time(base, p) / v));
        for (double peak : sim.peak_activation) CHECK(peak == doctest::Approx(m));
      }
}

TEST_CASE("the 2BP split removes (p-1)w of GPipe's and 1F1B's bubble and keeps every activation until the W tail") {
  for (int p = 1; p <= 16; ++p)
    for (int m : {1, 2, 3, p, p + 1, 2 * p, 64}) {
      CAPTURE(p);
      CAPTURE(m);
      const double expected = (p - 1) * (odd_costs.f + odd_costs.b);
      auto g = loom::simulate(loom::generate(loom::gpipe_2bp{}, shape{p, m}), odd_costs);
      auto g0 = loom::simulate(loom::generate(loom::gpipe{}, shape{p, m}), odd_costs);
      auto o = loom::simulate(loom::generate(loom::one_f_one_b_2bp{}, shape{p, m}), odd_costs);
      auto o0 = loom::simulate(loom::generate(loom::one_f_one_b{}, shape{p, m}), odd_costs);
      CHECK(g.bubble_time(0) == doctest::Approx(expected));
      CHECK(o.bubble_time(0) == doctest::Approx(expected));
      CHECK(g0.bubble_time(0) - g.bubble_time(0) == doctest::Approx((p - 1) * odd_costs.w));
      CHECK(o0.bubble_time(0) - o.bubble_time(0) == doctest::Approx((p - 1) * odd_costs.w));
      for (double peak : g.peak_activation) CHECK(peak == doctest::Approx(m));
      for (double peak : o.peak_activation) CHECK(peak == doctest::Approx(m));
    }
}

// ---------------------------------------------------------------------------------------------
// Rejections and the registry.

TEST_CASE("shapes the families cannot run are rejected with the rule named") {
  CHECK(loom::check(loom::chimera{}, shape{4, 8, 2}) == "chimera runs exactly 1 chunk(s) per rank (got chunks=2)");
  CHECK(loom::check(loom::gpipe_2bp{}, shape{4, 8, 3}).find("gpipe-2bp runs exactly 1 chunk") == 0);
  CHECK(loom::check(loom::one_f_one_b_2bp{}, shape{0, 8}).find("1f1b-2bp needs ranks >= 1") == 0);
  CHECK(loom::check(loom::bitpipe{}, shape{4, 0}).find("bitpipe needs microbatches >= 1") == 0);
  CHECK(loom::check(loom::hanayo{}, shape{4, 8, -1}).find("hanayo needs chunks >= 1") == 0);
  CHECK(loom::check(loom::looped_bfs{}, shape{4, 8, -2}).find("looped-bfs needs chunks >= 1") == 0);
  CHECK_THROWS_AS(loom::generate(loom::chimera{}, shape{4, 8, 3}), loom::schedule_error);
  // No "m multiple of p" rule anywhere: odd ranks and ragged microbatch counts run.
  CHECK(loom::check(loom::chimera{}, shape{5, 7}).empty());
  CHECK(loom::check(loom::bitpipe{}, shape{3, 7, 3}).empty());
  CHECK(loom::check(loom::hanayo{}, shape{7, 5, 2}).empty());
}

TEST_CASE("the registry knows the six families by their CLI names") {
  auto const& reg = loom::default_registry();
  for (std::string name : {"chimera", "bitpipe", "hanayo", "looped-bfs", "gpipe-2bp", "1f1b-2bp"}) {
    CAPTURE(name);
    auto const* e = reg.find(name);
    REQUIRE(e != nullptr);
    auto sc = e->make(shape{4, 8});
    CHECK(sc.name == name);
    CHECK(loom::validate(sc).ok);
  }
  CHECK(reg.at("bitpipe").default_chunks == 2);
  CHECK(reg.at("hanayo").default_chunks == 1);
  CHECK(reg.at("looped-bfs").default_chunks == 2);
}
