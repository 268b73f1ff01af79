// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The V-shape families: ZB-V (Zero Bubble, ICLR 2024, §6), V-Half and V-Min (Controllable
// Memory, NeurIPS 2024). Grids of ranks x microbatches: valid and deadlock-free after lowering,
// and the papers' memory and bubble claims at f = b = w, c = 0.
#include <doctest/doctest.h>

#include <loom/schedule/lower.hpp>
#include <loom/schedule/one_f_one_b.hpp>
#include <loom/schedule/registry.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/schedule/v_half.hpp>
#include <loom/schedule/v_min.hpp>
#include <loom/schedule/validate.hpp>
#include <loom/schedule/zb_v.hpp>

#include <string>

namespace {

constexpr loom::costs unit{.f = 1, .b = 1, .w = 1};

double max_span_bubble(const loom::simulation& sim, int p) {
  double b = 0;
  for (int r = 0; r < p; ++r) b = sim.span_bubble(r) > b ? sim.span_bubble(r) : b;
  return b;
}

// Structure every V family shares: V placement over 2P stages, two chunks, each rank runs the
// F, B and W of both its stages for every microbatch (6m actions), on the rank the placement says.
template <class F>
void check_structure(const loom::schedule& s, int p, int m) {
  REQUIRE(s.ranks == p);
  CHECK(s.stages == 2 * p);
  CHECK(s.chunks == 2);
  CHECK(s.placement == loom::placement_kind::v);
  for (int st = 0; st < 2 * p; ++st) CHECK(s.rank_of(0, st) == (st < p ? st : 2 * p - 1 - st));
  for (auto const& prog : s.programs) CHECK(prog.size() == static_cast<std::size_t>(6 * m));
}

template <class F>
void grid_valid_after_lowering() {
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      auto s = loom::generate(F{}, {.ranks = p, .microbatches = m});
      check_structure<F>(s, p, m);
      auto v = loom::validate(s);
      REQUIRE_MESSAGE(v.ok, v.message);
      auto lv = loom::validate(loom::lower(s));
      REQUIRE_MESSAGE(lv.ok, lv.message);
    }
}

}  // namespace

TEST_CASE("zb-v, v-half and v-min are valid and deadlock-free after lowering for p 1..16 and m 1..64") {
  grid_valid_after_lowering<loom::zb_v>();
  grid_valid_after_lowering<loom::v_half>();
  grid_valid_after_lowering<loom::v_min>();
}

TEST_CASE("zb-v has zero bubble at f = b = w once m >= 2p, and never more than p units of activation") {
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      auto sim = loom::simulate(loom::generate(loom::zb_v{}, {.ranks = p, .microbatches = m}), unit);
      REQUIRE(sim.ok);
      // 1F1B's peak on rank 0 is min(p, m) units; ZB-V keeps every rank within p.
      CHECK(sim.max_peak_activation() <= p);
      // Work per rank: 2 chunks x (f + b + w)/2 per microbatch.
      for (int r = 0; r < p; ++r) CHECK(sim.busy[static_cast<std::size_t>(r)] == doctest::Approx(3.0 * m));
      if (m >= 2 * p) {
        CHECK(max_span_bubble(sim, p) == doctest::Approx(0.0));
        CHECK(sim.bubble_rate == doctest::Approx(0.0));
      }
    }
}

TEST_CASE("zb-v's zero bubble comes with 1F1B's memory: its peak equals p units once m >= 2p") {
  for (int p = 1; p <= 16; ++p) {
    const int m = 2 * p + 3;
    auto one = loom::simulate(loom::generate(loom::one_f_one_b{}, {.ranks = p, .microbatches = m}), unit);
    auto zbv = loom::simulate(loom::generate(loom::zb_v{}, {.ranks = p, .microbatches = m}), unit);
    CAPTURE(p);
    CHECK(zbv.max_peak_activation() == doctest::Approx(one.max_peak_activation()));
    CHECK(zbv.bubble_rate < one.bubble_rate + 1e-12);
  }
}

TEST_CASE("v-half keeps (p+2)//2 units of activation and at most half of 1F1B's bubble") {
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      auto sim = loom::simulate(loom::generate(loom::v_half{}, {.ranks = p, .microbatches = m}), unit);
      REQUIRE(sim.ok);
      const int paper_peak = (p + 2) / 2;  // the paper's (p+2)//2 microbatches
      CHECK(sim.max_peak_activation() <= (m < paper_peak ? m : paper_peak));
      if (m >= p) {
        CHECK(sim.max_peak_activation() == paper_peak);
        // 1F1B's bubble is (p-1)(f+b+w); V-Half's at most half of it.
        CHECK(max_span_bubble(sim, p) <= (p - 1) * 3.0 / 2 + 1e-9);
      }
    }
}

TEST_CASE("v-min keeps (p+4)//3 units of activation and at most two thirds of 1F1B's bubble") {
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      auto sim = loom::simulate(loom::generate(loom::v_min{}, {.ranks = p, .microbatches = m}), unit);
      REQUIRE(sim.ok);
      const int paper_peak = (p + 4) / 3;  // the paper's (p+4)//3 microbatches
      CHECK(sim.max_peak_activation() <= (m < paper_peak ? m : paper_peak));
      if (m >= p) {
        CHECK(sim.max_peak_activation() == paper_peak);
        CHECK(max_span_bubble(sim, p) <= (p - 1) * 3.0 * 2 / 3 + 1e-9);
      }
    }
}

TEST_CASE("the V families order memory and bubbles as the papers do: v-min < v-half < zb-v in memory, reverse in bubble") {
  for (int p = 4; p <= 16; ++p) {
    const int m = 4 * p;
    CAPTURE(p);
    auto zbv = loom::simulate(loom::generate(loom::zb_v{}, {.ranks = p, .microbatches = m}), unit);
    auto half = loom::simulate(loom::generate(loom::v_half{}, {.ranks = p, .microbatches = m}), unit);
    auto vmin = loom::simulate(loom::generate(loom::v_min{}, {.ranks = p, .microbatches = m}), unit);
    auto one = loom::simulate(loom::generate(loom::one_f_one_b{}, {.ranks = p, .microbatches = m}), unit);
    CHECK(vmin.max_peak_activation() <= half.max_peak_activation());  // equal where (p+4)//3 == (p+2)//2, e.g. p = 5
    CHECK(half.max_peak_activation() < zbv.max_peak_activation());
    CHECK(zbv.bubble_rate <= half.bubble_rate);
    CHECK(half.bubble_rate <= vmin.bubble_rate);
    CHECK(vmin.bubble_rate < one.bubble_rate);
  }
}

TEST_CASE("V families stay valid under unequal costs, latency and a partial weight-gradient memory ratio") {
  const loom::costs k{.f = 1, .b = 2, .w = 0.5, .c = 0.25, .mem_w_ratio = 0.3};
  for (int p : {2, 3, 5, 8})
    for (int m : {1, 3, 7, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      for (auto const& s : {loom::generate(loom::zb_v{}, {.ranks = p, .microbatches = m}),
                            loom::generate(loom::v_half{}, {.ranks = p, .microbatches = m}),
                            loom::generate(loom::v_min{}, {.ranks = p, .microbatches = m})}) {
        auto sim = loom::simulate(loom::lower(s), k);
        REQUIRE_MESSAGE(sim.ok, sim.error);
        // Memory released by B and W together equals what F allocated: nothing live at the end,
        // so the peak is at least one chunk and at most everything.
        CHECK(sim.max_peak_activation() >= 0.5 - 1e-12);
        CHECK(sim.max_peak_activation() <= m + 1e-12);
      }
    }
}

TEST_CASE("V families reject chunk counts other than two and empty shapes, naming the rule") {
  CHECK(loom::check(loom::zb_v{}, {.ranks = 4, .microbatches = 8}).empty());
  CHECK(loom::check(loom::zb_v{}, {.ranks = 4, .microbatches = 8, .chunks = 3}) ==
        "zb-v runs exactly 2 chunk(s) per rank (got chunks=3)");
  CHECK(loom::check(loom::v_half{}, {.ranks = 4, .microbatches = 8, .chunks = 1}) ==
        "v-half runs exactly 2 chunk(s) per rank (got chunks=1)");
  CHECK(loom::check(loom::v_min{}, {.ranks = 0, .microbatches = 8}) == "v-min needs ranks >= 1 (got ranks=0)");
  CHECK_THROWS_WITH_AS(loom::generate(loom::v_min{}, {.ranks = 2, .microbatches = 0}),
                       "v-min needs microbatches >= 1 (got microbatches=0)", loom::schedule_error);
  CHECK(loom::generate(loom::zb_v{}, {.ranks = 3, .microbatches = 2, .chunks = 2}).chunks == 2);
}

TEST_CASE("the registry lists zb-v, v-half and v-min with two default chunks") {
  auto reg = loom::builtin_registry();
  for (std::string name : {"zb-v", "v-half", "v-min"}) {
    CAPTURE(name);
    auto const* e = reg.find(name);
    REQUIRE(e != nullptr);
    CHECK(e->default_chunks == 2);
    auto s = e->make({.ranks = 4, .microbatches = 8});
    CHECK(s.name == name);
    CHECK(loom::validate(loom::lower(s)).ok);
  }
}
