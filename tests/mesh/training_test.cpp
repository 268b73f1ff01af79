// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mesh example's transformer trained on threads over dp x tp x pp x sp meshes equals the
// single-rank reference: bitwise in deterministic mode (the reference then adds in the mesh's
// documented order), within 1e-12 relative otherwise. Each dimension alone, in pairs, the
// 8-rank dp2 x pp2 x tp2 mesh over every registered schedule family, sp in its five kinds
// (causal, and with full attention), ZeRO on and off, ZeRO stages 1-3 with SGD and Adam, local
// SGD (periodic and one-shot averaging).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "mesh_support.hpp"

namespace {

using namespace mesh_test;

struct config {
  sharding s;
  const char* family;
};

std::string name(const config& c, bool det, bool zero) {
  return c.s.describe() + " " + c.family + (det ? " deterministic" : "") + (zero ? " zero" : "");
}

//! Runs `configs` in both numerics modes (ZeRO on and off where there is a data-parallel or
//! sequence-parallel group to shard over) and checks every one against the reference.
void check_all(const std::vector<config>& configs, int steps = 2, const model_spec& m = {}) {
  int runs = 0;
  for (const config& c : configs)
    for (bool det : {true, false})
      for (bool zero : {false, true}) {
        if (zero && c.s.dp * c.s.sp_ranks() == 1 && !c.s.megatron()) continue;
        run_options o{.layout = c.s, .microbatches = 2 * c.s.pp + 1, .steps = steps, .deterministic = det, .zero = zero,
                      .bucket_bytes = zero ? 512 : std::size_t{25} << 20};
        INFO(name(c, det, zero) << (m.causal ? "" : " full attention"));
        auto r = run(c.family, o, m);
        CHECK(r.values() > 0);
        CHECK(r.differing() == 0);
        ++runs;
      }
  CHECK(runs >= static_cast<int>(configs.size()) * 2);
}

}  // namespace

TEST_CASE("mesh training: each dimension alone equals the single-rank reference") {
  check_all({
      {layout(2, 1, 1, 1), "1f1b"},
      {layout(3, 1, 1, 1), "gpipe"},
      {layout(1, 2, 1, 1), "1f1b"},
      {layout(1, 4, 1, 1), "zb-h1"},
      {layout(1, 1, 2, 1), "zb-h1"},
      {layout(1, 1, 3, 1), "1f1b"},
      {layout(1, 1, 4, 1), "interleaved-1f1b"},
      {layout(1, 2, 1, 2, seq_kind::megatron), "1f1b"},
      {layout(1, 4, 1, 4, seq_kind::megatron), "1f1b"},
      {layout(1, 1, 1, 2, seq_kind::ulysses), "1f1b"},
      {layout(1, 1, 1, 4, seq_kind::ulysses), "zb-h1"},
      {layout(1, 1, 1, 2, seq_kind::ring), "1f1b"},
      {layout(1, 1, 1, 4, seq_kind::ring), "gpipe"},
      {layout(1, 1, 1, 4, seq_kind::usp), "1f1b"},
      {layout(1, 1, 1, 8, seq_kind::usp), "1f1b"},
      {layout(1, 1, 1, 4, seq_kind::usp, 4), "1f1b"},
      {layout(1, 1, 1, 4, seq_kind::usp, 1), "1f1b"},
      {layout(1, 1, 1, 2, seq_kind::tokenring), "1f1b"},
      {layout(1, 1, 1, 4, seq_kind::tokenring), "zb-h1"},
  });
}

TEST_CASE("mesh training: full attention (no causal mask) under every sequence-parallel kind, alone and with pp, dp and tp, equals the reference") {
  model_spec full;
  full.causal = false;
  check_all(
      {
          {layout(1, 1, 1, 2, seq_kind::tokenring), "1f1b"},
          {layout(1, 1, 1, 4, seq_kind::tokenring), "zb-h1"},
          {layout(2, 1, 1, 2, seq_kind::tokenring), "gpipe"},
          {layout(1, 2, 1, 2, seq_kind::tokenring), "1f1b"},
          {layout(1, 1, 2, 4, seq_kind::tokenring), "interleaved-1f1b"},
          {layout(2, 2, 2, 2, seq_kind::tokenring), "zb-v"},
          {layout(1, 1, 1, 4, seq_kind::ring), "1f1b"},
          {layout(1, 1, 2, 2, seq_kind::ulysses), "zb-h1"},
          {layout(1, 1, 1, 8, seq_kind::usp), "1f1b"},
          {layout(1, 2, 1, 4, seq_kind::usp, 2), "1f1b"},
          {layout(2, 2, 1, 2, seq_kind::megatron), "1f1b"},
          {layout(1, 1, 1, 1), "1f1b"},
      },
      2, full);
}

TEST_CASE("mesh training: each pair of dimensions equals the single-rank reference") {
  check_all({
      {layout(2, 2, 1, 1), "1f1b"},
      {layout(2, 1, 2, 1), "zb-h1"},
      {layout(2, 1, 2, 1), "dualpipe"},
      {layout(2, 2, 1, 2, seq_kind::megatron), "1f1b"},
      {layout(2, 1, 1, 2, seq_kind::ulysses), "gpipe"},
      {layout(2, 1, 1, 2, seq_kind::ring), "1f1b"},
      {layout(2, 1, 1, 4, seq_kind::usp), "1f1b"},
      {layout(1, 2, 2, 1), "interleaved-1f1b"},
      {layout(1, 2, 2, 1), "zb-v"},
      {layout(1, 2, 1, 2, seq_kind::ulysses), "1f1b"},
      {layout(1, 2, 1, 2, seq_kind::ring), "1f1b"},
      {layout(1, 2, 1, 4, seq_kind::usp), "1f1b"},
      {layout(1, 1, 2, 2, seq_kind::ulysses), "zb-h2"},
      {layout(1, 1, 2, 2, seq_kind::ring), "chimera"},
      {layout(1, 1, 2, 4, seq_kind::usp), "zb-h1"},
      {layout(1, 2, 2, 2, seq_kind::megatron), "bitpipe"},
      {layout(2, 1, 1, 2, seq_kind::tokenring), "gpipe"},
      {layout(1, 2, 1, 2, seq_kind::tokenring), "1f1b"},
      {layout(1, 1, 2, 2, seq_kind::tokenring), "zb-v"},
      {layout(1, 1, 2, 4, seq_kind::tokenring), "dualpipe"},
  });
}

TEST_CASE("mesh training: dp2 x pp2 x tp2 on 8 threads equals the reference for every registered schedule family") {
  std::vector<config> configs;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    loom::shape sh = e.resolve({2, 5, 0});
    if (!e.check(sh).empty()) continue;
    configs.push_back({layout(2, 2, 2, 1), e.name.c_str()});
  }
  CHECK(configs.size() >= 15);
  check_all(configs);
}

TEST_CASE("mesh training: the sequence-parallel kinds compose with tp, pp and dp over the schedule registry") {
  std::vector<config> configs;
  const std::vector<sharding> layouts{layout(1, 1, 2, 4, seq_kind::usp), layout(2, 1, 2, 2, seq_kind::ring),
                                      layout(1, 2, 2, 2, seq_kind::ulysses), layout(2, 2, 2, 2, seq_kind::megatron)};
  std::size_t i = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    loom::shape sh = e.resolve({2, 5, 0});
    if (!e.check(sh).empty()) continue;
    configs.push_back({layouts[i++ % layouts.size()], e.name.c_str()});
  }
  check_all(configs);
}

TEST_CASE("mesh training: a stage failure while a tensor-parallel peer waits in a collective stops every rank at once, naming it") {
  std::mutex mu;
  std::vector<std::string> errors;
  double worst = 0;
  try {
    loom::run_threads(4, [&](loom::threads::comm& c) {
      auto [what, sec] = tp_stage_failure(c);
      std::lock_guard lk(mu);
      errors.push_back(what);
      worst = std::max(worst, sec);
    }, std::chrono::seconds(30));
  } catch (const std::exception& e) {
    FAIL(std::string(e.what()));
  }
  REQUIRE(errors.size() == 4);
  for (auto& e : errors) {
    CHECK(e.find("loom pipeline: rank 1: ") == 0);
    CHECK(e.find("a stage function threw: injected failure") != std::string::npos);
  }
  CHECK(worst < 10);  // not the 30 s timeout
}

TEST_CASE("mesh training: ZeRO stages 1, 2 and 3 with SGD and Adam equal the reference, and ZeRO-3 holds 1/dp of the parameters between steps") {
  // Every registered family that fits 2 pipeline ranks, on dp2 x pp2 (and the sp and Megatron-SP
  // groups, whose partial gradients are sharded over dp x sp and dp x tp), both numerics modes.
  std::vector<config> configs;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    if (e.check(e.resolve({2, 5, 0})).empty()) configs.push_back({layout(2, 1, 2, 1), e.name.c_str()});
  }
  configs.push_back({layout(2, 1, 1, 2, seq_kind::ring), "1f1b"});
  configs.push_back({layout(2, 2, 1, 2, seq_kind::megatron), "1f1b"});
  REQUIRE(configs.size() >= 10);
  int runs = 0, i = 0;
  for (const config& c : configs) {
    const int stage = 1 + i % 3;  // each family under one stage; the stages rotate
    const bool adam = (i / 3) % 2 == 0;
    ++i;
    for (bool det : {true, false}) {
      run_options o{.layout = c.s, .microbatches = 2 * c.s.pp + 1, .steps = 2, .deterministic = det, .zero_stage = stage,
                    .adam = adam, .bucket_bytes = 512};
      INFO(name(c, det, true) << " stage " << stage << (adam ? " adam" : " sgd"));
      auto r = run(c.family, o);
      CHECK(r.values() > 0);
      CHECK(r.differing() == 0);
      for (const auto& rank : r.ranks) {
        // Stage 3: only the shards (padded to a multiple of the group per bucket): about half at
        // dp 2. Stages 1 and 2: the stages' parameters and the buckets' full copies.
        // (1/4 for gradients partial over dp x sp or dp x tp; at most one padding element per 64-element bucket at dp 2).
        if (stage == 3) {
          CHECK(rank.held * 4 >= rank.stage_params);
          CHECK(rank.held <= rank.stage_params / 2 + rank.stage_params / 32 + 4);
        } else {
          CHECK(rank.held >= 2 * rank.stage_params);
        }
      }
      ++runs;
    }
  }
  CHECK(runs == 2 * static_cast<int>(configs.size()));
}

TEST_CASE("mesh training: local SGD equals the replicas run one after another, averaging once per H steps") {
  // Every family that fits 2 pipeline ranks on dp2 x pp2 (and dp2 x tp2, dp3, and sequence splits
  // inside the replica: ring, Ulysses, Megatron-SP), H = 1, 2, 3 over 4
  // steps, SGD and Adam, one-shot averaging, both numerics modes: every rank equals its replica's
  // reference (bitwise in deterministic mode), and the dp group carries exactly one all-reduce
  // (of all the rank's parameters) in the steps that end a period, none in the others.
  std::vector<config> configs;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    if (e.check(e.resolve({2, 5, 0})).empty()) configs.push_back({layout(2, 1, 2, 1), e.name.c_str()});
  }
  configs.push_back({layout(2, 2, 1, 1), "1f1b"});
  configs.push_back({layout(3, 1, 1, 1), "1f1b"});
  // A sequence split inside the replica: partial gradients reduced over sp (or tp) every step.
  configs.push_back({layout(2, 1, 1, 2, seq_kind::ring), "1f1b"});
  configs.push_back({layout(2, 1, 2, 2, seq_kind::ulysses), "zb-h1"});
  configs.push_back({layout(2, 2, 1, 2, seq_kind::megatron), "1f1b"});
  int runs = 0, i = 0;
  for (const config& c : configs) {
    const int H = 1 + i % 3;
    const bool adam = i % 4 == 1, one_shot = i % 5 == 4;
    ++i;
    for (bool det : {true, false}) {
      run_options o{.layout = c.s, .microbatches = 2 * c.s.pp + 1, .steps = 4, .deterministic = det, .adam = adam,
                    .local_steps = H, .one_shot = one_shot};
      INFO(name(c, det, false) << " H " << H << (adam ? " adam" : " sgd") << (one_shot ? " one-shot" : ""));
      auto r = run(c.family, o);
      CHECK(r.values() > 0);
      CHECK(r.differing() == 0);
      for (int step = 0; step < 4; ++step) {
        const auto dp = r.ranks[0].counts(step, "dp")[loom::comm_op::all_reduce];
        CHECK(dp.calls == (!one_shot && (step + 1) % H == 0 ? 1u : 0u));
      }
      ++runs;
    }
  }
  CHECK(runs == 2 * static_cast<int>(configs.size()));
}

TEST_CASE("mesh training: local SGD with H = 1 is synchronous data parallelism within 1e-12") {
  // The synchronous reference (the replicas' mean gradient, one update) against the local-SGD
  // reference with H = 1 (each replica's own update, then the average): the same model up to
  // rounding. With the test above (the distributed runs equal these references) this is the
  // distributed claim.
  using mesh_example::batch;
  using mesh_example::reduction_order;
  using mesh_example::reference_model;
  model_spec m;
  const int dp = 3, M = 2;
  reference_model sync(m);
  std::vector<reference_model> local(static_cast<std::size_t>(dp), sync);
  for (int step = 0; step < 3; ++step) {
    const batch data = mesh_example::make_batch(m, dp * M, step);
    sync.step(data, dp * M, reduction_order::plain());
    for (int d = 0; d < dp; ++d) local[static_cast<std::size_t>(d)].step(mesh_example::slice(m, data, d * M, M), M, reduction_order::plain());
    reference_model::average(local);
  }
  double worst = 0;
  long long differing = 0;
  for (auto const& [k, w] : sync.params()) {
    double norm = 0;
    for (double v : w) norm = std::max(norm, std::abs(v));
    const auto& l = local[0].params().at(k);
    for (std::size_t j = 0; j < w.size(); ++j) {
      worst = std::max(worst, std::abs(l[j] - w[j]) / norm);
      differing += l[j] != w[j];
    }
  }
  INFO("max relative difference " << worst);
  CHECK(worst <= 1e-12);
  CHECK(differing > 0);  // rounding differs: they are two computations, not one
}

TEST_CASE("data_parallel refuses local SGD with ZeRO, one-shot averaging without local SGD, and a negative period") {
  const sharding s = layout(2, 1, 1, 1);
  loom::run_threads(2, [&](loom::threads::comm& c) {
    loom::mesh_comm g(mesh_example::make_mesh(s), c);
    using stage_t = mesh_example::transformer_stage<loom::counted<loom::threads::comm>>;
    using dp_t = loom::data_parallel<decltype(g), stage_t>;
    CHECK_THROWS_WITH_AS(dp_t(g, {.zero_stage = 2, .local_steps = 2}), doctest::Contains("cannot share parameter or state shards"),
                         loom::config_error);
    CHECK_THROWS_WITH_AS(dp_t(g, {.one_shot = true}), doctest::Contains("needs local_steps >= 1"), loom::config_error);
    CHECK_THROWS_WITH_AS(dp_t(g, {.local_steps = -1}), doctest::Contains("is negative"), loom::config_error);
    CHECK_THROWS_WITH_AS(dp_t(g, {.zero_stage = 4}), doctest::Contains("is not 0, 1, 2 or 3"), loom::config_error);
  });
}
