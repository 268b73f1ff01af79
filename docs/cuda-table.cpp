// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the tables of docs/cuda.md, all measured against loom's CUDA simulator (ctest checks
// that the document shows this output):
//  1. every registered family trains the CUDA MLP on cuda_local and nccl, eagerly and from CUDA
//     graphs, deterministic mode: bitwise equal to the CPU reference (4 ranks, 8 microbatches);
//  2. device memory of every rank: the pipeline's buffers as the buffer plan predicts them, and
//     what the simulator's accounting measured when the pipeline was built (every family, and
//     group-interleaved 1F1B with its first chunk offloaded);
//  3. the first race report of a deliberately broken variant (a send that does not wait for its
//     producer's event), in the simulator's canonical order.
//   build/docs/doc_cuda-table
#include <cstdio>
#include <string>
#include <vector>

#include <loom/schedule/offload.hpp>

#include "../tests/cuda_layer/device_support.hpp"

using namespace loom_device_test;

int main() {
  const int P = 4, m = 8, steps = 2;
  std::printf("| schedule | cuda_local, eager | cuda_local, graph | nccl, eager | nccl, graph |\n|---|---|---|---|---|\n");
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous: tests/cuda_layer/device_asynchronous_test.cpp; vocabulary-parallel: host backends only
    loom::shape sh = e.resolve({.ranks = P, .microbatches = m});
    if (!e.check(sh).empty()) continue;
    auto s = e.make(sh);
    auto spec = spec_for(s.stages);
    auto ref = reference(spec, m, steps);
    std::printf("| %s |", std::string(e.name).c_str());
    for (backend b : {backend::cuda_local, backend::nccl})
      for (bool g : {false, true}) {
        simulate_with(1);
        auto o = run(b, s, spec, steps, {.deterministic = true, .graph = g});
        const char* verdict = !o.ok() ? "error" : compare(o, ref).second == 0 && findings().empty() ? "bitwise equal" : "differs";
        std::printf(" %s |", verdict);
      }
    std::printf("\n");
  }

  std::printf("\n| schedule | rank 0 | rank 1 | rank 2 | rank 3 |\n|---|---|---|---|---|\n");
  auto memory_row = [&](const std::string& name, const loom::schedule& s) {
    auto spec = spec_for(s.stages);
    simulate_with(1);
    std::vector<std::size_t> planned(4), measured(4);
    loom::nccl::run(P, [&](loom::nccl::comm& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      loom::cuda::device_buffer<float> targets(1024);
      c.all_reduce(std::span<double>(), loom::reduce_op::sum);
      const auto before = loom::cudasim::device_memory(c.rank()).current;
      std::size_t stage_bytes = 0;
      loom::pipeline p(s, c, [&](loom::stage_id id) {
        auto [a, z] = quickstart::stage_layers(spec, id.stage, s.stages);
        cuda_mlp::stage st(spec, a, z, id.stage == s.stages - 1, targets.data());
        stage_bytes += 2 * st.weight_grad().size() * sizeof(float);
        return st;
      });
      planned[r] = p.buffer_bytes();
      measured[r] = loom::cudasim::device_memory(c.rank()).current - before - stage_bytes;
    });
    std::printf("| %s |", name.c_str());
    for (int r = 0; r < P; ++r)
      std::printf(" %zu B%s |", planned[static_cast<std::size_t>(r)], planned[static_cast<std::size_t>(r)] == measured[static_cast<std::size_t>(r)] ? "" : " (MEASURED DIFFERS)");
    std::printf("\n");
  };
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous: tests/cuda_layer/device_asynchronous_test.cpp; vocabulary-parallel: host backends only
    loom::shape sh = e.resolve({.ranks = P, .microbatches = m});
    if (!e.check(sh).empty()) continue;
    memory_row(std::string(e.name), e.make(sh));
  }
  {  // PipeOffload: the default group's first chunk offloaded (docs/offload.md), unit cost per stage
    auto s = loom::default_registry().at("group-interleaved-1f1b").make(loom::default_registry().at("group-interleaved-1f1b").resolve({.ranks = P, .microbatches = m}));
    const auto plan = loom::plan_offload(s, {.f = 2, .b = 2, .w = 2}, {.chunks = 1, .time = 0.2});
    if (plan.ok) memory_row("group-interleaved-1f1b, first chunk offloaded", loom::with_offload(s, plan));
  }

  {
    auto s = loom::default_registry().at("1f1b").make({2, 4, 0});
    simulate_with(1);
    loom::pipeline_options o;
    o.faults.skip_send_wait = true;
    auto out = run(backend::nccl, s, spec_for(s.stages), 1, o);
    // The first race in the simulator's canonical order (which rank throws first is timing).
    std::string first;
    for (auto const& r : loom::cudasim::reports())
      if (r.kind == loom::cudasim::report_kind::race) {
        first = r.text;
        break;
      }
    std::printf("\n| the first race the simulator recorded (1f1b, 2 ranks, nccl, a send that does not wait for its producer) |\n|---|\n| %s |\n",
                out.ok() ? "(none: the run succeeded)" : first.c_str());
  }
}
