// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mesh example's transformer trained on threads over dp x tp x pp x sp meshes equals the
// single-rank reference: bitwise in deterministic mode (the reference then adds in the mesh's
// documented order), within 1e-12 relative otherwise. Each dimension alone, in pairs, the
// 8-rank dp2 x pp2 x tp2 mesh over every registered schedule family, sp in its four kinds, ZeRO
// on and off.

#include <doctest/doctest.h>

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
void check_all(const std::vector<config>& configs, int steps = 2) {
  int runs = 0;
  for (const config& c : configs)
    for (bool det : {true, false})
      for (bool zero : {false, true}) {
        if (zero && c.s.dp * c.s.sp_ranks() == 1 && !c.s.megatron()) continue;
        run_options o{.layout = c.s, .microbatches = 2 * c.s.pp + 1, .steps = steps, .deterministic = det, .zero = zero,
                      .bucket_bytes = zero ? 512 : std::size_t{25} << 20};
        INFO(name(c, det, zero));
        auto r = run(c.family, o);
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
  });
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
  });
}

TEST_CASE("mesh training: dp2 x pp2 x tp2 on 8 threads equals the reference for every registered schedule family") {
  std::vector<config> configs;
  for (auto const& e : loom::default_registry().entries()) {
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
  for (auto const& e : loom::default_registry().entries())
    if (e.check(e.resolve({2, 5, 0})).empty()) configs.push_back({layout(2, 1, 2, 1), e.name.c_str()});
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
