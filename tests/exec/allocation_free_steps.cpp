// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A training step allocates nothing after the first one: for every registered family, several
// rank counts and both numerics modes, steps 2.. of loom::pipeline on the threads backend make no
// call of the global operator new on any rank's thread (counted by replacing operator new for
// this test program; the first step, with its handshake and the pools' warm-up, may allocate).

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../comm/counting_new.hpp"
#include <loom/comm/threads.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>

namespace {

constexpr std::size_t width = 4;

//! A split stage with a little real arithmetic and no allocation of its own:
//! y = w0 * x + w1, loss terms y^2 / 2 on the last stage.
struct affine_stage {
  using value_type = double;
  double w0 = 0.5, w1 = 0.25;
  std::vector<double> grad = std::vector<double>(2, 0.0);

  std::size_t input_size() const { return width; }
  std::size_t output_size() const { return width; }
  std::size_t stash_size() const { return width; }
  std::span<double> weight_grad() { return grad; }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      const double y = w0 * b.input[i] + w1;
      b.stash[i] = y;
      b.output[i] = ctx.last() ? 0.5 * y * y : y;
    }
  }
  //! d(output)/dy: y on the last stage (loss y^2/2), 1 elsewhere.
  double dy(const loom::stage_context& ctx, std::span<const double> og, std::span<double> stash, std::size_t i) const {
    return ctx.last() ? og[i] * stash[i] : og[i];
  }
  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      const double g = dy(ctx, b.output_grad, b.stash, i);
      b.input_grad[i] = w0 * g;
      b.stash[i] = g;  // what W needs
    }
  }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      b.weight_grad[0] += b.stash[i] * b.input[i];
      b.weight_grad[1] += b.stash[i];
    }
  }
  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      const double g = dy(ctx, b.output_grad, b.stash, i);
      b.input_grad[i] = w0 * g;
      b.weight_grad[0] += g * b.input[i];
      b.weight_grad[1] += g;
    }
  }
};
static_assert(loom::split_stage<affine_stage>);

//! What one run measured (filled by the ranks, checked by the test thread).
struct run_result {
  long long warm_allocations = -1;    // the first step, all ranks (must be seen: the counter works)
  long long steady_allocations = -1;  // steps 2..steps, all ranks
  bool losses_equal = true;           // no update(): every step has the same loss
  std::string error;
};

template <class Sched>
run_result run(const Sched& sched, int ranks, int microbatches, int steps, loom::pipeline_options opt) {
  run_result res;
  std::vector<double> batch(static_cast<std::size_t>(microbatches) * width);
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = 0.1 * static_cast<double>(i % 17) - 0.7;
  try {
    loom::run_threads(ranks, [&](loom::threads::comm& c) {
      loom::pipeline p(sched, c, [](loom::stage_id) { return affine_stage{}; }, opt);
      c.barrier();
      const long long t0 = loom_test::allocation_count();
      c.barrier();
      const double first = p.step(batch).loss;
      c.barrier();
      const long long t1 = loom_test::allocation_count();
      c.barrier();
      bool same = true;
      for (int s = 1; s < steps; ++s) {
        const double l = p.step(batch).loss;
        same = same && std::memcmp(&l, &first, sizeof l) == 0;
      }
      c.barrier();
      const long long t2 = loom_test::allocation_count();
      if (c.rank() == 0) {
        res.warm_allocations = t1 - t0;
        res.steady_allocations = t2 - t1;
        res.losses_equal = same;
      }
    }, std::chrono::seconds(30));
  } catch (const std::exception& e) {
    res.error = e.what();
  }
  return res;
}

}  // namespace

TEST_CASE("every registered family runs its second and later steps without allocating, on 1 to 4 ranks, both modes") {
  int runs = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    int family_runs = 0;
    for (int p : {1, 2, 3, 4})
      for (int m : {2 * p, 3 * p + 1}) {
        loom::shape sh = e.resolve({.ranks = p, .microbatches = m});
        if (!e.check(sh).empty()) continue;
        const loom::schedule s = e.make(sh);
        for (bool det : {false, true}) {
          CAPTURE(e.name);
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(det);
          auto r = run(s, p, m, 4, {.deterministic = det});
          REQUIRE(r.error.empty());
          CHECK(r.warm_allocations > 0);
          CHECK(r.steady_allocations == 0);
          CHECK(r.losses_equal);
          ++family_runs;
        }
      }
    CHECK_MESSAGE(family_runs >= 4, "family " << e.name << " accepted fewer than two shapes of the grid");
    runs += family_runs;
  }
  MESSAGE(runs << " runs");
}

TEST_CASE("static schedules run their second and later steps without allocating") {
  auto check = [](auto sched, int ranks, int m) {
    auto r = run(sched, ranks, m, 4, {});
    REQUIRE(r.error.empty());
    CHECK(r.steady_allocations == 0);
    CHECK(r.losses_equal);
  };
  check(loom::static_schedule<loom::zb_h1, loom::shape{.ranks = 3, .microbatches = 6}>{}, 3, 6);
  check(loom::static_schedule<loom::one_f_one_b, loom::shape{.ranks = 4, .microbatches = 5}>{}, 4, 5);
  check(loom::static_schedule<loom::interleaved_1f1b, loom::shape{.ranks = 2, .microbatches = 4, .chunks = 2}>{}, 2, 4);
}

TEST_CASE("measuring the bubble and other recv_ahead depths keep later steps allocation-free") {
  const loom::schedule s = loom::default_registry().at("zb-h1").make({.ranks = 4, .microbatches = 8});
  for (int ahead : {1, 2, 4}) {
    CAPTURE(ahead);
    auto r = run(s, 4, 8, 5, {.recv_ahead = ahead, .measure = true});
    REQUIRE(r.error.empty());
    CHECK(r.steady_allocations == 0);
  }
}
