// expect: schedule zb-h1 has separate B and W actions, so its stage must be a loom::split_stage; the stage type has no member backward_input and backward_weight
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A stage with only a fused backward cannot run a static schedule with separate B and W actions:
// the diagnostic names the schedule and the missing members.
#include <loom/comm/threads.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>

struct fused_only {
  using value_type = double;
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> weight_grad() { return {}; }
  void forward(const loom::stage_context&, loom::forward_buffers<double>) {}
  void backward(const loom::stage_context&, loom::backward_buffers<double>) {}
};
static_assert(loom::stage<fused_only> && !loom::split_stage<fused_only>);

int main() {
  using sched = loom::static_schedule<loom::zb_h1, loom::shape{.ranks = 2, .microbatches = 4}>;
  auto comms = loom::threads::world(2);
  loom::pipeline p(sched{}, comms[0], [](loom::stage_id) { return fused_only{}; });
  (void)p;
}
