// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The umbrella headers are enough on their own: loom/loom.hpp brings every host-compiled layer
// (schedule, render, stage, comm, exec), and loom/stage.hpp and loom/exec.hpp their layers.
#include <loom/loom.hpp>

#include <loom/exec.hpp>
#include <loom/stage.hpp>

#include <doctest/doctest.h>

#include <span>
#include <vector>

namespace {

struct tiny {
  using value_type = double;
  double w = 0.5, g = 0;
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> weight_grad() { return {&g, 1}; }
  void forward(const loom::stage_context&, loom::forward_buffers<double> b) { b.output[0] = w * b.input[0]; }
  void backward(const loom::stage_context&, loom::backward_buffers<double> b) {
    b.input_grad[0] = w * b.output_grad[0];
    b.weight_grad[0] += b.output_grad[0] * b.input[0];
  }
};
static_assert(loom::stage<tiny>);
static_assert(!loom::split_stage<tiny>);
static_assert(loom::communicator<loom::threads::comm>);

}  // namespace

TEST_CASE("the loom.hpp umbrella alone runs a pipeline step over threads") {
  loom::schedule s = loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 3});
  std::vector<double> loss(2, 0.0), grad(2, 0.0);
  loom::run_threads(2, [&](loom::threads::comm& c) {
    loom::pipeline p(s, c, [](loom::stage_id) { return tiny{}; }, {.deterministic = true, .scaling = loom::loss_scaling::sum});
    const std::vector<double> x{1.0, 2.0, 3.0};
    loss[static_cast<std::size_t>(c.rank())] = p.step(x).loss;
    grad[static_cast<std::size_t>(c.rank())] = p.stages()[0].g;
  });
  // Loss = sum_j 0.25 x_j = 1.5; each stage's weight gradient is 0.5 * sum_j x_j = 3.
  CHECK(loss[0] == 1.5);
  CHECK(loss[1] == 1.5);
  CHECK(grad[0] == 3.0);
  CHECK(grad[1] == 3.0);
}
