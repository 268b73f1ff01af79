// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Every registered schedule family, over a grid of shapes, trains the MLP on the threads backend
// to the single-rank reference: bitwise in deterministic mode, within 1e-12 relative otherwise.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "training_support.hpp"

using namespace loom_test;

namespace {

struct case_shape {
  int ranks, microbatches, chunks;
};

std::vector<case_shape> grid() {
  std::vector<case_shape> g;
  for (int p : {1, 2, 3, 4})
    for (int m : {p, 2 * p + 1, 3 * p})
      for (int v : {0, 2}) g.push_back({p, m, v});
  return g;
}

void check_family(const loom::family_entry& e, bool deterministic, const std::vector<case_shape>& shapes = grid()) {
  int runs = 0;
  for (auto cs : shapes) {
    loom::shape sh{cs.ranks, cs.microbatches, cs.chunks};
    sh = e.resolve(sh);
    if (!e.check(sh).empty()) continue;
    loom::schedule s = e.make(sh);
    auto m = spec_for(s.stages);
    const int steps = 3;
    loom::pipeline_options opt{.deterministic = deterministic};
    auto got = run_pipeline(s, s, m, steps, opt);
    auto want = run_reference(m, sh.microbatches, steps, opt.scaling);
    CAPTURE(e.name);
    CAPTURE(sh.ranks);
    CAPTURE(sh.microbatches);
    CAPTURE(sh.chunks);
    ++runs;
    CHECK(got.copies_identical);
    const bool bitwise = deterministic;
    for (int st = 0; st < steps; ++st) {
      CAPTURE(st);
      if (bitwise) CHECK(std::memcmp(&got.losses[static_cast<std::size_t>(st)], &want.losses[static_cast<std::size_t>(st)], sizeof(double)) == 0);
      else CHECK(std::abs(got.losses[static_cast<std::size_t>(st)] - want.losses[static_cast<std::size_t>(st)]) <= 1e-12 * std::abs(want.losses[static_cast<std::size_t>(st)]));
    }
    for (int l = 0; l < m.layers(); ++l) {
      CAPTURE(l);
      auto ul = static_cast<std::size_t>(l);
      if (bitwise) {
        CHECK(same_bits(got.grads[ul], want.grads[ul]));
        CHECK(same_bits(got.params[ul], want.params[ul]));
      } else {
        CHECK(rel_diff(got.grads[ul], want.grads[ul]) <= 1e-12);
        CHECK(rel_diff(got.params[ul], want.params[ul]) <= 1e-12);
      }
    }
  }
  CHECK_MESSAGE(runs >= 2, "family " << e.name << " accepted fewer than two shapes of the grid");
}

}  // namespace

TEST_CASE("every registered family trains bitwise like the single-rank reference in deterministic mode") {
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    CAPTURE(e.name);
    check_family(e, true);
  }
}

TEST_CASE("every registered family trains within 1e-12 of the single-rank reference in the default mode") {
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    CAPTURE(e.name);
    check_family(e, false);
  }
}

TEST_CASE("chimera-fd (not built in, added by the user) trains like the single-rank reference in both modes") {
  // Its shapes need an even P and m a multiple of 2P, which the grid above has none of.
  const auto e = loom::make_entry<loom::chimera_fd>();
  const std::vector<case_shape> shapes{{2, 4, 0}, {2, 8, 0}, {4, 8, 0}, {4, 16, 0}};
  check_family(e, true, shapes);
  check_family(e, false, shapes);
}

TEST_CASE("a static schedule runs its compile-time program and matches the reference bitwise") {
  auto check_static = [](auto sched) {
    using S = decltype(sched);
    loom::schedule rt = S::runtime();
    auto m = spec_for(rt.stages);
    loom::pipeline_options opt{.deterministic = true, .scaling = loom::loss_scaling::sum};
    auto got = run_pipeline(sched, rt, m, 2, opt);
    auto want = run_reference(m, rt.microbatches, 2, opt.scaling);
    CAPTURE(rt.name);
    CHECK(same_bits(got.losses, want.losses));
    for (std::size_t l = 0; l < want.grads.size(); ++l) {
      CHECK(same_bits(got.grads[l], want.grads[l]));
      CHECK(same_bits(got.params[l], want.params[l]));
    }
  };
  check_static(loom::static_schedule<loom::zb_h1, loom::shape{.ranks = 3, .microbatches = 6}>{});
  check_static(loom::static_schedule<loom::interleaved_1f1b, loom::shape{.ranks = 2, .microbatches = 4, .chunks = 2}>{});
  check_static(loom::static_schedule<loom::one_f_one_b, loom::shape{.ranks = 4, .microbatches = 5}>{});
}

TEST_CASE("the default mode adds into the stage's accumulator directly and deterministic mode folds per-microbatch slots") {
  // The default mode rounds differently from the reference (no per-microbatch partial sums) but
  // stays within 1e-12; deterministic mode reproduces it exactly.
  loom::schedule s = loom::generate(loom::zb_h2{}, {.ranks = 3, .microbatches = 7});
  auto m = spec_for(s.stages);
  auto fast = run_pipeline(s, s, m, 1, {});
  auto det = run_pipeline(s, s, m, 1, {.deterministic = true});
  auto want = run_reference(m, 7, 1, loom::loss_scaling::mean);
  for (std::size_t l = 0; l < want.grads.size(); ++l) {
    CHECK(same_bits(det.grads[l], want.grads[l]));
    CHECK(rel_diff(fast.grads[l], want.grads[l]) <= 1e-12);
  }
}
