// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The stage concepts accept and reject the right types; the buffer plan's slot counts follow the
// normative memory model and are compile-time constants for static schedules.
#include <doctest/doctest.h>

#include <cmath>
#include <span>

#include <loom/comm/threads.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>
#include <loom/stage/buffer_plan.hpp>
#include <loom/stage/stage.hpp>

namespace {

struct fused_only {
  using value_type = double;
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> weight_grad() { return {}; }
  void forward(const loom::stage_context&, loom::forward_buffers<double>) {}
  void backward(const loom::stage_context&, loom::backward_buffers<double>) {}
};
struct split : fused_only {
  void backward_input(const loom::stage_context&, loom::backward_buffers<double>) {}
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double>) {}
  void update() {}
};
struct no_backward {
  using value_type = float;
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<float> weight_grad() { return {}; }
  void forward(const loom::stage_context&, loom::forward_buffers<float>) {}
};
struct wrong_buffers : fused_only {
  void backward_input(const loom::stage_context&, loom::forward_buffers<double>) {}
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double>) {}
};

static_assert(loom::stage<fused_only> && !loom::split_stage<fused_only> && !loom::updatable_stage<fused_only>);
static_assert(loom::stage<split> && loom::split_stage<split> && loom::updatable_stage<split>);
static_assert(!loom::stage<no_backward> && !loom::split_stage<no_backward>);
static_assert(loom::stage<wrong_buffers> && !loom::split_stage<wrong_buffers>);
static_assert(!loom::stage<int>);

// The slot counts of a static schedule are constants: 1F1B rank 0 on 4 ranks keeps min(p, m) = 4
// microbatches' stashes, the last rank 1 (Narayanan et al. 2021, §3.1).
using one_f_one_b_4x8 = loom::static_schedule<loom::one_f_one_b, loom::shape{.ranks = 4, .microbatches = 8}>;
static_assert(loom::static_buffer_plan<one_f_one_b_4x8, 0>::local.size() == 1);
static_assert(loom::static_buffer_plan<one_f_one_b_4x8, 0>::local[0].stash == 4);
static_assert(loom::static_buffer_plan<one_f_one_b_4x8, 3>::local[0].stash == 1);
// GPipe keeps every microbatch.
static_assert(loom::static_buffer_plan<loom::static_schedule<loom::gpipe, loom::shape{3, 5}>, 1>::local[0].stash == 5);

}  // namespace

TEST_CASE("the stash slots of every rank equal the simulator's peak activation under the default memory model") {
  // Independent accounts of the same lifetime: the simulator counts q per live microbatch-stage
  // from F to W/BW; the plan counts slots per local stage.
  int checked = 0;
  for (auto const& e : loom::default_registry().entries())
    for (int p : {1, 2, 3, 4})
      for (int m : {p, 2 * p + 1})
        for (int v : {0, 2}) {
          loom::shape sh = e.resolve({p, m, v});
          if (!e.check(sh).empty()) continue;
          loom::schedule s = e.make(sh);
          auto sim = loom::simulate(s);
          REQUIRE(sim.ok);
          auto lowered = loom::lower(s);
          for (int r = 0; r < p; ++r) {
            CAPTURE(e.name);
            CAPTURE(sh.ranks);
            CAPTURE(sh.microbatches);
            CAPTURE(r);
            auto plan = loom::plan_buffers(lowered, r);
            // Stash slots are per stage, the simulator's peak is over the rank: the sum of the
            // per-stage peaks bounds it from above, and equals it when the rank holds one stage.
            double slots = plan.total_stash() * s.stage_fraction();
            CHECK(slots >= sim.peak_activation[static_cast<std::size_t>(r)] - 1e-9);
            if (plan.local.size() == 1) CHECK(std::abs(slots - sim.peak_activation[static_cast<std::size_t>(r)]) < 1e-9);
            for (auto const& l : plan.local) {
              bool used = false;  // a direction may carry no microbatch (e.g. one rank, bidirectional)
              for (int j = 0; j < m; ++j) used = used || s.direction_of(j) == l.id.direction;
              if (!used) continue;
              CHECK(l.stash <= m);
              CHECK(l.input <= m);
              CHECK((l.id.stage == 0 ? l.input == 0 : l.input >= 1));
              CHECK((l.id.stage == s.stages - 1 ? l.grad == 0 : l.grad >= 1));
            }
            ++checked;
          }
        }
  CHECK(checked > 40);
}

TEST_CASE("deterministic folding of two parameter copies on two ranks receives one buffer per held contribution of the other copy") {
  // After the step each copy needs the other copy's contributions that could not be folded in
  // microbatch order during it: every microbatch of the other direction from the first change of
  // direction on, and the prefix sum when the other copy owns microbatch 0.
  int checked = 0;
  for (auto const& e : loom::default_registry().entries())
    for (int p : {2, 3, 4})
      for (int m : {p, 2 * p + 1, 3 * p})
        for (int v : {0, 2}) {
          loom::shape sh = e.resolve({p, m, v});
          if (!e.check(sh).empty()) continue;
          loom::schedule s = e.make(sh);
          if (s.directions != 2) continue;
          auto lowered = loom::lower(s);
          int k = 0;
          while (k < m && s.mb_direction[static_cast<std::size_t>(k)] == s.mb_direction[0]) ++k;
          for (int r = 0; r < p; ++r) {
            auto plan = loom::plan_buffers(lowered, r);
            for (auto const& l : plan.local) {
              CAPTURE(e.name);
              CAPTURE(m);
              CAPTURE(r);
              CAPTURE(l.id.stage);
              CAPTURE(l.id.direction);
              const int other = 1 - l.id.direction;
              if (s.stage_to_rank[static_cast<std::size_t>(other * s.stages + l.id.stage)] == r) {
                CHECK(l.copy_recv == 0);
                continue;
              }
              int want = s.mb_direction[0] == other ? 1 : 0, mine = 0;
              for (int j = k; j < m; ++j) {
                want += s.mb_direction[static_cast<std::size_t>(j)] == other ? 1 : 0;
                mine += s.mb_direction[static_cast<std::size_t>(j)] == l.id.direction ? 1 : 0;
              }
              CHECK(l.copy_recv == want);
              CHECK(l.wgrad >= mine);  // this copy's held contributions stay in their slots
              ++checked;
            }
          }
        }
  CHECK(checked > 20);
}

TEST_CASE("posting receives further ahead never needs fewer slots") {
  loom::schedule s = loom::lower(loom::generate(loom::zb_h2{}, {4, 9}));
  for (int r = 0; r < 4; ++r) {
    auto a = loom::plan_buffers(s, r, 1), b = loom::plan_buffers(s, r, 4);
    CHECK(b.local[0].input >= a.local[0].input);
    CHECK(b.local[0].grad >= a.local[0].grad);
    CHECK(b.local[0].stash == a.local[0].stash);
  }
  CHECK_THROWS_AS(loom::plan_buffers(s, 0, 0), loom::config_error);
  CHECK_THROWS_AS(loom::plan_buffers(s, 4), loom::config_error);
}

TEST_CASE("the static plan equals the run-time plan") {
  auto rt = loom::plan_buffers(one_f_one_b_4x8::runtime(), 0);
  using sp = loom::static_buffer_plan<one_f_one_b_4x8, 0>;
  REQUIRE(rt.local.size() == sp::local.size());
  CHECK(rt.local[0] == sp::local[0]);
  CHECK(rt.recv_positions.size() == sp::recvs);
}

TEST_CASE("a fused-only stage with a run-time schedule that has separate W actions is rejected naming the schedule and the member") {
  auto comms = loom::threads::world(1);
  loom::schedule s = loom::generate(loom::zb_h1{}, {1, 2});
  try {
    loom::pipeline p(s, comms[0], [](loom::stage_id) { return fused_only{}; });
    FAIL("no error");
  } catch (const loom::config_error& e) {
    CHECK(std::string(e.what()).find("schedule zb-h1") != std::string::npos);
    CHECK(std::string(e.what()).find("backward_weight") != std::string::npos);
  }
  // ... and accepted with a schedule of fused backwards.
  loom::schedule g = loom::generate(loom::gpipe{}, {1, 2});
  loom::pipeline ok(g, comms[0], [](loom::stage_id) { return fused_only{}; });
  CHECK(ok.stages().size() == 1);
}
