// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The executor's host cost per action on the device path: a stage whose kernels cost nothing
// (it enqueues none), so what is measured is what the host spends issuing the step (events,
// waits, transfers, NVTX ranges, the stage calls) and, replayed from a graph, the launch.
// Built twice: against loom's CUDA simulator (device_overhead: the simulator's own API cost is
// included, an upper bound) and against a GPU (device_overhead_gpu). Counters: actions per step
// on rank 0 (its lowered program, transfers included) and host microseconds per action
// (step_result::host_seconds / actions, mean over the timed steps). cuda_local runs eagerly with
// the host hand-off (its default) and, against the simulator only, with device flags (opt-in:
// they hung on real GPUs, see docs/cuda.md). The mesh case: dp2 x pp2 (4 ranks) with
// loom::data_parallel as the pipeline's observer (its bucket packed and all-reduced on the
// reducer's stream, the agreement and the SGD step every step), beside the pipeline alone.
#include <benchmark/benchmark.h>

#include <atomic>
#include <string>

#include <loom/comm/cuda_local.hpp>
#include <loom/comm/nccl.hpp>
#include <loom/cuda/device.hpp>
#include <loom/exec/data_parallel.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/mesh/mesh_comm.hpp>
#include <loom/schedule.hpp>
#if defined(LOOM_CUDA_SIM)
#include <loom/cudasim/sim.hpp>
#endif

namespace {

//! A split stage that enqueues no work: one float in, one out.
struct noop_stage {
  using value_type = float;
  loom::cuda::device_buffer<float> grad{1};
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 1; }
  loom::cuda::device_buffer<float> w{1};
  std::span<float> weight_grad() { return grad.span(); }
  std::span<float> params() { return w.span(); }  // for the mesh case's data_parallel
  void forward(const loom::stage_context&, loom::forward_buffers<float>) {}
  void backward_input(const loom::stage_context&, loom::backward_buffers<float>) {}
  void backward_weight(const loom::stage_context&, loom::weight_buffers<float>) {}
  void backward(const loom::stage_context&, loom::backward_buffers<float>) {}
};

//! `warmup` steps, then the mean host seconds of `timed` steps into `host` and rank 0's program
//! length into `actions` (on world rank 0).
template <class Pipeline>
void time_steps(Pipeline& p, bool root, int microbatches, int warmup, int timed, double& host, std::size_t& actions) {
  loom::cuda::device_buffer<float> in(static_cast<std::size_t>(microbatches));
  for (int i = 0; i < warmup; ++i) p.step(std::span<const float>(in.span()));
  double sum = 0;
  for (int i = 0; i < timed; ++i) sum += p.step(std::span<const float>(in.span())).host_seconds;
  if (root) {
    host = sum / timed;
    actions = p.lowered().programs[0].size();
  }
}

//! One rank's steps: the pipeline alone on `c` (`dp == 1`), or one rank of a `dp x pp` mesh over
//! `c` with the pipeline on the pp group and `data_parallel` as its observer.
template <class Comm>
void steps(Comm& c, const loom::schedule& s, int dp, bool graph, bool flags, int warmup, int timed, double& host,
           std::size_t& actions) {
  if constexpr (requires { c.set_device_flags(flags); }) c.set_device_flags(flags);
  if (dp == 1) {
    loom::pipeline p(s, c, [](loom::stage_id) { return noop_stage{}; }, {.graph = graph});
    return time_steps(p, c.rank() == 0, s.microbatches, warmup, timed, host, actions);
  }
  using mesh_t = loom::mesh<loom::dp<>, loom::pp<>>;
  loom::mesh_comm g(mesh_t{loom::dp<>{dp}, loom::pp<>{s.ranks}}, c);
  loom::data_parallel<decltype(g), noop_stage> sync(g);
  loom::pipeline p(s, g.pp(), [](loom::stage_id) { return noop_stage{}; }, {.observer = &sync});
  sync.attach(p);
  time_steps(p, g.rank() == 0, s.microbatches, warmup, timed, host, actions);
}

//! Range 0: pipeline ranks; range 1: microbatches. `dp > 1`: the mesh case (`dp` times the ranks).
void run_case(benchmark::State& state, bool nccl, bool graph, bool flags = false, int dp = 1) {
  const int P = static_cast<int>(state.range(0)), m = static_cast<int>(state.range(1)), ranks = dp * P;
  auto avail = loom::cuda::available();
  if (!avail || (nccl && avail.devices < ranks)) {
    state.SkipWithError(("needs " + std::to_string(nccl ? ranks : 1) + " CUDA device(s): " + (avail ? "too few" : avail.why)).c_str());
    return;
  }
#if defined(LOOM_CUDA_SIM)
  loom::cudasim::config cfg;
  cfg.delays = false;  // zero-cost operations, in order
  loom::cudasim::configure(cfg);
#endif
  loom::schedule s = loom::generate(loom::zb_h1{}, {.ranks = P, .microbatches = m});
  double host = 0;
  std::size_t actions = 1;
  for (auto _ : state) {
    if (nccl) loom::nccl::run(ranks, [&](loom::nccl::comm& c) { steps(c, s, dp, graph, flags, 3, 20, host, actions); });
    else loom::cuda_local::run(ranks, [&](loom::cuda_local::comm& c) { steps(c, s, dp, graph, flags, 3, 20, host, actions); });
    state.SetIterationTime(host);
  }
  state.counters["actions"] = static_cast<double>(actions);
  state.counters["host_us_per_action"] = host * 1e6 / static_cast<double>(actions);
  state.SetLabel(std::string(nccl ? "nccl" : "cuda_local") + (graph ? " graph replay" : " eager") + (flags ? " (device flags)" : "") +
                 (dp > 1 ? ", dp" + std::to_string(dp) + " x pp" + std::to_string(P) + " with data_parallel" : "") + ", zb-h1");
}

void BM_cuda_local_eager(benchmark::State& s) { run_case(s, false, false); }
void BM_cuda_local_mesh_eager(benchmark::State& s) { run_case(s, false, false, false, 2); }
void BM_nccl_mesh_eager(benchmark::State& s) { run_case(s, true, false, false, 2); }
[[maybe_unused]] void BM_cuda_local_eager_flags(benchmark::State& s) { run_case(s, false, false, true); }
void BM_cuda_local_graph(benchmark::State& s) { run_case(s, false, true); }
void BM_nccl_eager(benchmark::State& s) { run_case(s, true, false); }
void BM_nccl_graph(benchmark::State& s) { run_case(s, true, true); }

}  // namespace

BENCHMARK(BM_cuda_local_eager)->Args({1, 64})->Args({2, 64})->Args({4, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
#if defined(LOOM_CUDA_SIM)
BENCHMARK(BM_cuda_local_eager_flags)->Args({2, 64})->Args({4, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
#endif
BENCHMARK(BM_cuda_local_graph)->Args({1, 64})->Args({2, 64})->Args({4, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_nccl_eager)->Args({1, 64})->Args({2, 64})->Args({4, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_nccl_graph)->Args({1, 64})->Args({2, 64})->Args({4, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_local_mesh_eager)->Args({1, 64})->Args({2, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_nccl_mesh_eager)->Args({1, 64})->Args({2, 64})->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
