// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Grid tests of the five classic families: every shape p in 1..16, m in 1..64 (v in 1..4 for
// interleaved) is valid and deadlock-free after lowering, and the closed forms of
// ARCHITECTURE.md hold at c = 0 (and ZB-H2's with comm).
#include <doctest/doctest.h>

#include <loom/schedule.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using loom::costs;
using loom::shape;

// Cost triples used for closed forms: unit, b = 2f, uneven, small w.
const std::vector<costs> cost_grid = {{.f = 1, .b = 1, .w = 1}, {.f = 1, .b = 2, .w = 1}, {.f = 2, .b = 3, .w = 1},
                                      {.f = 1, .b = 1, .w = 0.5}, {.f = 1.5, .b = 2.5, .w = 0.75}};

constexpr double eps = 1e-9;

template <class F>
void check_grid(int max_chunks, auto&& closed_forms) {
  int shapes = 0;
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m)
      for (int v = 1; v <= max_chunks; ++v) {
        shape s{.ranks = p, .microbatches = m, .chunks = v};
        loom::schedule sched = loom::generate(F{}, s);
        auto plain = loom::validate(sched);
        INFO(F::name, " p=", p, " m=", m, " v=", v);
        REQUIRE_MESSAGE(plain.ok, plain.message);
        auto lowered = loom::validate(loom::lower(sched));
        REQUIRE_MESSAGE(lowered.ok, lowered.message);
        CHECK(sched.programs.size() == static_cast<std::size_t>(p));
        CHECK(sched.stages == p * v);
        closed_forms(sched, p, m, v);
        ++shapes;
      }
  CHECK(shapes == 16 * 64 * max_chunks);
}

}  // namespace

TEST_CASE("gpipe is valid on every shape and its bubble is (p-1)(f+b+w) with peak m") {
  check_grid<loom::gpipe>(1, [](const loom::schedule& s, int p, int m, int) {
    for (auto const& k : cost_grid) {
      auto sim = loom::simulate(s, k);
      REQUIRE(sim.ok);
      for (int r = 0; r < p; ++r) {
        CHECK(sim.bubble_time(r) == doctest::Approx((p - 1) * (k.f + k.b + k.w)).epsilon(eps));
        CHECK(sim.peak_activation[static_cast<std::size_t>(r)] == doctest::Approx(m));
      }
    }
  });
}

TEST_CASE("1f1b is valid on every shape, its bubble is (p-1)(f+b+w) and rank 0 peaks at min(p, m)") {
  check_grid<loom::one_f_one_b>(1, [](const loom::schedule& s, int p, int m, int) {
    for (auto const& k : cost_grid) {
      auto sim = loom::simulate(s, k);
      REQUIRE(sim.ok);
      CHECK(sim.peak_activation[0] == doctest::Approx(std::min(p, m)));
      for (int r = 0; r < p; ++r) {
        if (m >= p) CHECK(sim.bubble_time(r) == doctest::Approx((p - 1) * (k.f + k.b + k.w)).epsilon(eps));
        CHECK(sim.peak_activation[static_cast<std::size_t>(r)] == doctest::Approx(std::min(p - r, m)));
      }
    }
  });
}

TEST_CASE("interleaved 1f1b is valid for every m and v, and its bubble is (p-1)(f+b+w)/v when p divides m") {
  check_grid<loom::interleaved_1f1b>(4, [](const loom::schedule& s, int p, int m, int v) {
    CHECK(s.chunks == v);
    for (int st = 0; st < s.stages; ++st) CHECK(s.stage_to_rank[static_cast<std::size_t>(st)] == st % p);
    if (m % p != 0) return;
    for (auto const& k : cost_grid) {
      auto sim = loom::simulate(s, k);
      REQUIRE(sim.ok);
      for (int r = 0; r < p; ++r)
        CHECK(sim.bubble_time(r) == doctest::Approx((p - 1) * (k.f + k.b + k.w) / v).epsilon(eps));
    }
  });
}

TEST_CASE("zb-h1 is valid on every shape, its bubble is (p-1)(f+b-w) and its peak is p when m >= p") {
  check_grid<loom::zb_h1>(1, [](const loom::schedule& s, int p, int m, int) {
    if (m < p) return;
    for (auto const& k : cost_grid) {
      if (k.w > k.f) continue;  // the W's fit into the cool-down bubbles only when w <= f
      auto sim = loom::simulate(s, k);
      REQUIRE(sim.ok);
      CHECK(sim.max_peak_activation() == doctest::Approx(p));
      for (int r = 0; r < p; ++r) CHECK(sim.bubble_time(r) == doctest::Approx((p - 1) * (k.f + k.b - k.w)).epsilon(eps));
    }
  });
}

TEST_CASE("zb-h2 is valid on every shape and its span bubble is (p-1)(f+b+2c-2w) with peak 2p-1 when m >= 2p-1") {
  check_grid<loom::zb_h2>(1, [](const loom::schedule& s, int p, int m, int) {
    if (m < 2 * p - 1) return;
    for (auto k : cost_grid) {
      if (k.w > k.f || 2 * k.w > k.f + k.b) continue;  // the paper's regime: W's fill, bubble >= 0
      for (double c : {0.0, 0.25, 0.5}) {
        k.c = c;
        auto sim = loom::simulate(s, k);
        REQUIRE(sim.ok);
        CHECK(sim.max_peak_activation() == doctest::Approx(2 * p - 1));
        double worst = 0;
        for (int r = 0; r < p; ++r) worst = std::max(worst, sim.span_bubble(r));
        CHECK(worst == doctest::Approx((p - 1) * (k.f + k.b + 2 * c - 2 * k.w)).epsilon(eps));
      }
    }
  });
}

TEST_CASE("single-chunk families reject other chunk counts and every family rejects empty shapes") {
  for (auto const& e : loom::builtin_registry().entries()) {
    CHECK_THROWS_WITH_AS(e.make({.ranks = 0, .microbatches = 4}), doctest::Contains("needs ranks >= 1 (got ranks=0)"), loom::schedule_error);
    CHECK_THROWS_WITH_AS(e.make({.ranks = 4, .microbatches = -3}), doctest::Contains("needs microbatches >= 1 (got microbatches=-3)"), loom::schedule_error);
  }
  CHECK_THROWS_WITH_AS(loom::generate(loom::zb_h1{}, {.ranks = 4, .microbatches = 8, .chunks = 2}),
                       "zb-h1 runs exactly 1 chunk(s) per rank (got chunks=2)", loom::schedule_error);
  CHECK_THROWS_WITH_AS(loom::generate(loom::interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = -1}),
                       "interleaved-1f1b needs chunks >= 1 (got chunks=-1)", loom::schedule_error);
}

TEST_CASE("zb-h1 and zb-h2 follow the paper's op order") {
  // Rank r: k(p-1-r) warm-up forwards, then per backward i: F (while any remain), B(i), and
  // W(oldest) once i >= k*r; leftover W's at the tail. Checked on rank 1 of p = 3, m = 5.
  auto text = [](const loom::schedule& s, int r) {
    std::string out;
    for (auto const& a : s.programs[static_cast<std::size_t>(r)]) out += to_string(a) + " ";
    return out;
  };
  auto h1 = loom::generate(loom::zb_h1{}, {.ranks = 3, .microbatches = 5});
  CHECK(text(h1, 1) == "F0@s1 F1@s1 B0@s1 F2@s1 B1@s1 W0@s1 F3@s1 B2@s1 W1@s1 F4@s1 B3@s1 W2@s1 B4@s1 W3@s1 W4@s1 ");
  auto h2 = loom::generate(loom::zb_h2{}, {.ranks = 3, .microbatches = 5});
  CHECK(text(h2, 1) == "F0@s1 F1@s1 F2@s1 B0@s1 F3@s1 B1@s1 F4@s1 B2@s1 W0@s1 B3@s1 W1@s1 B4@s1 W2@s1 W3@s1 W4@s1 ");
  CHECK(text(h2, 0) == "F0@s0 F1@s0 F2@s0 F3@s0 F4@s0 B0@s0 W0@s0 B1@s0 W1@s0 B2@s0 W2@s0 B3@s0 W3@s0 B4@s0 W4@s0 ");
}
