// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The asynchronous families (pipedream, pipedream-vs, pipedream-2bw, pipelined-backprop) run by
// loom::pipeline on the threads backend: T steps in one run without a flush, equal to the
// single-process reference of each rule (quickstart::reference_asynchronous: bitwise in
// deterministic mode, within 1e-12 relative otherwise); the versions each stage reads, asserted by
// an instrumented stage; the versions each rank holds, counted by the executor against the
// simulator; a deliberately broken PipeDream (stashing off) failing its reference; a failed run
// restoring the weights; the refusals.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <loom/exec/calibrate.hpp>
#include <loom/exec/timeline.hpp>

#include "training_support.hpp"

using namespace loom_test;

namespace {

//! mlp_stage that records, per microbatch, the version and a fingerprint of the weights its
//! forward and its backward read (the sum of the parameters' bits is enough to tell versions apart).
class recording_stage : public quickstart::mlp_stage {
 public:
  using mlp_stage::mlp_stage;
  struct seen {
    int forward_version = -1, backward_version = -1;
    double forward_print = 0, backward_print = 0;
  };
  std::map<int, seen>* log = nullptr;
  void forward(const loom::stage_context& c, loom::forward_buffers<double> b) {
    (*log)[c.microbatch].forward_version = c.version;
    (*log)[c.microbatch].forward_print = print();
    mlp_stage::forward(c, b);
  }
  void backward(const loom::stage_context& c, loom::backward_buffers<double> b) {
    (*log)[c.microbatch].backward_version = c.version;
    (*log)[c.microbatch].backward_print = print();
    mlp_stage::backward(c, b);
  }

 private:
  double print() {
    double s = 0;
    for (double v : weights()) s += v;
    return s;
  }
};

struct async_outcome {
  std::vector<double> step_losses;
  std::vector<std::vector<double>> params;
  std::vector<int> held;                              // per rank: versions_held of its stage
  std::vector<std::map<int, recording_stage::seen>> seen;  // per rank
  std::size_t version_bytes = 0;
};

async_outcome run_async(const loom::schedule& s, const quickstart::mlp_spec& m, bool deterministic, int fail_on = -1,
                        std::string* error = nullptr) {
  const int T = s.steps, mb = s.step_microbatches();
  async_outcome o;
  o.params.assign(static_cast<std::size_t>(m.layers()), {});
  o.held.assign(static_cast<std::size_t>(s.ranks), 0);
  o.seen.resize(static_cast<std::size_t>(s.ranks));
  o.step_losses.assign(static_cast<std::size_t>(T), 0.0);
  const auto data = quickstart::make_run_batch(m, mb, T);
  std::mutex mu;
  loom::run_threads(s.ranks, [&](loom::threads::comm& c) {
    auto make = [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      recording_stage st(m, a, b, id.stage == s.stages - 1, &data.targets);
      st.log = &o.seen[static_cast<std::size_t>(c.rank())];
      if (id.stage == s.stages - 1) st.fail_on = fail_on;
      return st;
    };
    loom::pipeline p(s, c, make, {.deterministic = deterministic});
    try {
      p.step(data.inputs);
    } catch (const loom::pipeline_error& e) {
      std::lock_guard lk(mu);
      if (error != nullptr) *error = e.what();
    }
    std::lock_guard lk(mu);
    if (c.rank() == 0) {
      auto losses = p.microbatch_losses();
      for (int t = 0; t < T; ++t) {
        double sum = 0;
        for (int i = 0; i < mb; ++i) sum += losses[static_cast<std::size_t>(t * mb + i)];
        o.step_losses[static_cast<std::size_t>(t)] = sum * (1.0 / mb);
      }
      o.version_bytes = p.version_bytes();
    }
    o.held[static_cast<std::size_t>(c.rank())] = p.versions_held(0);
    for (auto& st : p.stages())
      for (int l = st.first_layer(); l < st.last_layer(); ++l) {
        auto w = st.layer_params(l);
        o.params[static_cast<std::size_t>(l)].assign(w.begin(), w.end());
      }
  });
  return o;
}

quickstart::async_rule rule_of(const loom::schedule& s, int update_every = 1) {
  return {.family = std::string(s.name), .p = s.ranks, .m = s.step_microbatches(), .N = s.microbatches, .update_every = update_every};
}

void compare(const async_outcome& got, const std::vector<double>& want_losses, const std::vector<std::vector<double>>& want_params,
             bool bitwise) {
  for (std::size_t t = 0; t < want_losses.size(); ++t) {
    CAPTURE(t);
    if (bitwise) CHECK(std::memcmp(&got.step_losses[t], &want_losses[t], sizeof(double)) == 0);
    else CHECK(std::abs(got.step_losses[t] - want_losses[t]) <= 1e-12 * std::abs(want_losses[t]));
  }
  for (std::size_t l = 0; l < want_params.size(); ++l) {
    CAPTURE(l);
    if (bitwise) CHECK(same_bits(got.params[l], want_params[l]));
    else CHECK(rel_diff(got.params[l], want_params[l]) <= 1e-12);
  }
}

}  // namespace

TEST_CASE("asynchronous families on threads equal the single-process reference of their rule, T steps in one run") {
  int runs = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (!e.multi_step) continue;
    for (int p : {2, 3, 4})
      for (int mb : {p, p + 1, 2 * p + 1})
        for (int T : {4, 5})
          for (bool det : {true, false}) {
            const loom::shape sh{.ranks = p, .microbatches = mb, .chunks = 0, .steps = T};
            if (!e.check(e.resolve(sh)).empty()) continue;
            const loom::schedule s = e.make(sh);
            CAPTURE(e.name);
            CAPTURE(p);
            CAPTURE(mb);
            CAPTURE(T);
            CAPTURE(det);
            const auto m = spec_for(s.stages);
            const auto got = run_async(s, m, det);
            std::vector<std::vector<double>> want_params;
            const auto want = quickstart::reference_asynchronous(m, rule_of(s), mb, T, 1.0 / mb, want_params);
            compare(got, want, want_params, det);
            // The versions each call read, against the rule; the weights a backward read are the
            // forward's (stashing), or the latest (pipelined backprop).
            const auto rule = rule_of(s);
            const auto sim = loom::simulate(s);
            for (int r = 0; r < p; ++r) {
              CAPTURE(r);
              auto const& seen = got.seen[static_cast<std::size_t>(r)];
              CHECK(seen.size() == static_cast<std::size_t>(mb * T));
              for (auto const& [j, v] : seen) {
                CHECK(v.forward_version == rule.forward_version(j, r));
                CHECK(v.backward_version == rule.backward_version(j, r));
                if (s.stash) CHECK(std::memcmp(&v.forward_print, &v.backward_print, sizeof(double)) == 0);
              }
              // Versions held: counted by the executor, predicted by the simulator.
              CHECK(got.held[static_cast<std::size_t>(r)] == doctest::Approx(sim.weight_copies[static_cast<std::size_t>(r)]));
            }
            ++runs;
          }
  }
  CHECK(runs >= 60);
}

TEST_CASE("pipedream: update_every k on threads equals its reference, and the versions held are p - s, p (vertical sync), 2 (2BW), 1 (pipelined backprop, flush)") {
  for (int k : {2, 3}) {
    const loom::schedule s = loom::generate(loom::pipedream{.update_every = k}, {.ranks = 3, .microbatches = 4, .chunks = 1, .steps = 4});
    const auto m = spec_for(s.stages);
    std::vector<std::vector<double>> want_params;
    const auto want = quickstart::reference_asynchronous(m, rule_of(s, k), 4, 4, 1.0 / 4, want_params);
    compare(run_async(s, m, true), want, want_params, true);
  }
  const auto m = spec_for(4);
  auto held = [&](const char* family) {
    auto const& e = loom::default_registry().at(family);
    return run_async(e.make({.ranks = 4, .microbatches = 4, .chunks = 0, .steps = e.multi_step ? 4 : 1}), m, true).held;
  };
  CHECK(held("pipedream") == std::vector<int>{4, 3, 2, 1});
  CHECK(held("pipedream-vs") == std::vector<int>{4, 4, 4, 4});
  CHECK(held("pipedream-2bw") == std::vector<int>{2, 2, 2, 2});
  CHECK(held("pipelined-backprop") == std::vector<int>{1, 1, 1, 1});
  CHECK(held("pipedream-flush") == std::vector<int>{1, 1, 1, 1});  // 1F1B: one version, updated after the flush
}

TEST_CASE("a PipeDream with stashing off (the backward reads the latest weights) fails the PipeDream reference") {
  loom::schedule s = loom::generate(loom::pipedream{}, {.ranks = 3, .microbatches = 3, .chunks = 1, .steps = 4});
  const auto m = spec_for(s.stages);
  std::vector<std::vector<double>> want_params;
  const auto want = quickstart::reference_asynchronous(m, rule_of(s), 3, 4, 1.0 / 3, want_params);
  // The broken variant: every backward reads the stage's latest version (no stash).
  s.stash = false;
  for (auto& prog : s.programs) {
    int updates = 0;
    for (auto& a : prog) {
      if (a.kind == loom::op::BW) a.version = updates;
      updates += a.update;
    }
  }
  REQUIRE(loom::validate(s).ok);
  const auto got = run_async(s, m, true);
  double worst = 0;
  for (std::size_t l = 0; l < want_params.size(); ++l) worst = std::max(worst, rel_diff(got.params[l], want_params[l]));
  MESSAGE("stashing off: largest relative difference from the PipeDream reference " << worst);
  CHECK(worst > 1e-6);
  // and the intact schedule passes the same check
  const auto intact = run_async(loom::generate(loom::pipedream{}, {.ranks = 3, .microbatches = 3, .chunks = 1, .steps = 4}), m, true);
  compare(intact, want, want_params, true);
}

TEST_CASE("a failed asynchronous run throws on every rank and restores every stage's weights to the run's start") {
  const loom::schedule s = loom::generate(loom::pipedream_2bw{}, {.ranks = 3, .microbatches = 3, .chunks = 1, .steps = 4});
  const auto m = spec_for(s.stages);
  std::string error;
  const auto got = run_async(s, m, false, 7, &error);  // the last stage's forward of microbatch 7 throws
  CHECK(error.find("injected failure") != std::string::npos);
  CHECK(error.find("restored to the run's start") != std::string::npos);
  for (int l = 0; l < m.layers(); ++l) CHECK(same_bits(got.params[static_cast<std::size_t>(l)], quickstart::initial_params(m, l)));
}

namespace {
//! A stage without weights(): it cannot run a versioned schedule.
struct plain_stage {
  using value_type = double;
  std::vector<double> g = std::vector<double>(1, 0.0);
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> weight_grad() { return g; }
  void forward(const loom::stage_context&, loom::forward_buffers<double>) {}
  void backward(const loom::stage_context&, loom::backward_buffers<double>) {}
};
struct null_observer final : loom::step_observer {
  void before_first_use(std::size_t) override {}
  void gradients_ready(std::size_t) override {}
  void progress() override {}
  void step_end(int, const std::string&) override {}
};
}  // namespace

TEST_CASE("asynchronous schedules refuse a stage without versions and a step observer") {
  const loom::schedule s = loom::generate(loom::pipedream{}, {.ranks = 2, .microbatches = 2, .chunks = 1, .steps = 2});
  const auto m = spec_for(2);
  const std::vector<double> targets;
  null_observer obs;
  std::mutex mu;
  std::vector<std::string> errors;
  auto attempt = [&](auto&& build) {
    try {
      build();
    } catch (const loom::config_error& e) {
      std::lock_guard lk(mu);
      errors.push_back(e.what());
    }
  };
  loom::run_threads(2, [&](loom::threads::comm& c) {
    attempt([&] { loom::pipeline p(s, c, [](loom::stage_id) { return plain_stage{}; }); });
    auto make = [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, 2);
      return quickstart::mlp_stage(m, a, b, id.stage == 1, &targets);
    };
    attempt([&] { loom::pipeline p(s, c, make, {.observer = &obs}); });
  });
  REQUIRE(errors.size() == 4);
  int stage_errors = 0, observer_errors = 0;
  for (auto const& e : errors) {
    stage_errors += e.find("loom::versioned_stage") != std::string::npos;
    observer_errors += e.find("a step observer (data parallelism) is not supported") != std::string::npos;
  }
  CHECK(stage_errors == 2);
  CHECK(observer_errors == 2);
}

TEST_CASE("a static (compile-time) pipedream-2bw schedule runs its versions and updates as the run-time one does") {
  using sched = loom::static_schedule<loom::pipedream_2bw, loom::shape{.ranks = 2, .microbatches = 2, .chunks = 1, .steps = 4}>;
  static_assert(sched::lowered_program<0>.size() > 0);
  const loom::schedule rt = sched::runtime();
  REQUIRE(rt.versioned());
  const auto m = spec_for(rt.stages);
  const auto data = quickstart::make_run_batch(m, 2, 4);
  std::vector<std::vector<double>> params(static_cast<std::size_t>(m.layers()));
  std::vector<double> losses;
  std::mutex mu;
  loom::run_threads(2, [&](loom::threads::comm& c) {
    loom::pipeline p(sched{}, c, [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, rt.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == rt.stages - 1, &data.targets);
    }, {.deterministic = true});
    p.step(data.inputs);
    std::lock_guard lk(mu);
    if (c.rank() == 0) {
      for (int t = 0; t < 4; ++t) losses.push_back((p.microbatch_losses()[static_cast<std::size_t>(2 * t)] +
                                                    p.microbatch_losses()[static_cast<std::size_t>(2 * t + 1)]) *
                                                   0.5);
    }
    for (auto& st : p.stages())
      for (int l = st.first_layer(); l < st.last_layer(); ++l) {
        auto w = st.layer_params(l);
        params[static_cast<std::size_t>(l)].assign(w.begin(), w.end());
      }
  });
  std::vector<std::vector<double>> want_params;
  const auto want = quickstart::reference_asynchronous(m, rule_of(rt), 2, 4, 0.5, want_params);
  for (int t = 0; t < 4; ++t) CHECK(std::memcmp(&losses[static_cast<std::size_t>(t)], &want[static_cast<std::size_t>(t)], sizeof(double)) == 0);
  for (std::size_t l = 0; l < want_params.size(); ++l) CHECK(same_bits(params[l], want_params[l]));
}

TEST_CASE("a measured asynchronous run times every update as its own entry, and calibrate turns them into the stages' update costs") {
  for (const char* name : {"pipedream", "pipedream-2bw", "pipelined-backprop"})
    for (int p : {2, 3}) {
      CAPTURE(name);
      CAPTURE(p);
      const loom::schedule s = loom::default_registry().at(name).make({.ranks = p, .microbatches = p + 1, .chunks = 0, .steps = 4});
      const auto m = spec_for(s.stages);
      const auto data = quickstart::make_run_batch(m, s.step_microbatches(), s.steps);
      std::mutex mu;
      std::vector<loom::action_timing> all;
      std::vector<int> bad_timeline(static_cast<std::size_t>(p), 1), updates_timed(static_cast<std::size_t>(p), 0),
          updates_planned(static_cast<std::size_t>(p), 0);
      std::vector<double> busy_gap(static_cast<std::size_t>(p), -1);
      loom::run_threads(p, [&](loom::threads::comm& c) {
        loom::pipeline pl(s, c, [&](loom::stage_id id) {
          auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
          return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &data.targets);
        }, {.measure = true});
        const auto r = pl.step(data.inputs);
        auto gathered = loom::gather_timings(c, pl.last_timings());
        const auto ur = static_cast<std::size_t>(c.rank());
        std::lock_guard lk(mu);
        if (c.rank() == 0) all = std::move(gathered);
        bad_timeline[ur] = loom::same_actions(pl.last_timeline(), loom::expected_timeline(pl.lowered(), c.rank())) ? 0 : 1;
        double timed = 0;
        for (auto const& t : pl.last_timings()) {
          timed += t.seconds;
          updates_timed[ur] += t.update ? 1 : 0;
          if (t.update) CHECK((t.kind == loom::op::W || t.kind == loom::op::BW));
        }
        for (auto const& a : s.programs[ur]) updates_planned[ur] += a.update ? 1 : 0;
        busy_gap[ur] = r.busy_seconds - timed;  // the busy time is the calls and the updates, nothing else
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const auto ur = static_cast<std::size_t>(r);
        CHECK(bad_timeline[ur] == 0);
        CHECK(updates_planned[ur] > 0);
        CHECK(updates_timed[ur] == updates_planned[ur]);
        CHECK(std::abs(busy_gap[ur]) <= 1e-9);
      }
      const loom::cost_model cm = loom::calibrate(s, all, {});
      for (auto const& st : cm.stages) CHECK(st.update > 0);
      CHECK(loom::simulate(s, cm).ok);
    }
}
