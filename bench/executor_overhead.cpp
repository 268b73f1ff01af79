// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Executor overhead per action: loom::pipeline steps with no-op stages on the threads backend.
// On one rank there is no communication, so the time per action is the executor's own cost
// (dispatch, slot bookkeeping, the stage call, the per-step reset and agreement amortised over
// the step). On 2 and 4 ranks the figure also holds thread hand-offs and waits.
//   ./build/bench/executor_overhead --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <span>
#include <thread>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>

namespace {

struct noop_stage {
  using value_type = double;
  double grad[1]{};
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> weight_grad() { return grad; }
  void forward(const loom::stage_context&, loom::forward_buffers<double> b) { benchmark::DoNotOptimize(b.output.data()); }
  void backward(const loom::stage_context&, loom::backward_buffers<double> b) { benchmark::DoNotOptimize(b.input_grad.data()); }
  void backward_input(const loom::stage_context&, loom::backward_buffers<double> b) { benchmark::DoNotOptimize(b.input_grad.data()); }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) { benchmark::DoNotOptimize(b.weight_grad.data()); }
};

template <class Sched>
void run_one_rank(benchmark::State& state, const Sched& sched, const loom::schedule& rt, loom::pipeline_options opt = {}) {
  auto comms = loom::threads::world(1);
  loom::pipeline p(sched, comms[0], [](loom::stage_id) { return noop_stage{}; }, opt);
  std::vector<double> in(static_cast<std::size_t>(rt.microbatches), 1.0);
  const auto actions = static_cast<double>(p.lowered().size());
  for (auto _ : state) benchmark::DoNotOptimize(p.step(in).loss);
  state.counters["actions/step"] = actions;
  state.counters["s/action"] = benchmark::Counter(actions * static_cast<double>(state.iterations()),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// One rank, run-time program: 1F1B (F + BW), ZB-H1 (F + B + W), interleaved (4 chunks).
void BM_runtime_one_rank(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const auto& e = loom::default_registry().at(state.range(1) == 0 ? "1f1b" : state.range(1) == 1 ? "zb-h1" : "interleaved-1f1b");
  loom::schedule s = e.make({1, m, state.range(1) == 2 ? 4 : 0});
  state.SetLabel(s.name);
  run_one_rank(state, s, s);
}
BENCHMARK(BM_runtime_one_rank)->ArgsProduct({{16, 256}, {0, 1, 2}});

// One rank, deterministic mode (per-microbatch weight-gradient slots folded in microbatch
// order): ZB-H1, and Chimera, whose two parameter copies share one reorder buffer on one rank.
void BM_deterministic_one_rank(benchmark::State& state) {
  const auto& e = loom::default_registry().at(state.range(0) == 0 ? "zb-h1" : "chimera");
  loom::schedule s = e.make({1, 256, 0});
  state.SetLabel(s.name + " deterministic");
  run_one_rank(state, s, s, {.deterministic = true});
}
BENCHMARK(BM_deterministic_one_rank)->Arg(0)->Arg(1);

// One rank, compile-time program (the loop specialised by a fold over the actions).
void BM_static_one_rank_zb_h1(benchmark::State& state) {
  using S = loom::static_schedule<loom::zb_h1, loom::shape{.ranks = 1, .microbatches = 64}>;
  state.SetLabel("zb-h1 static");
  run_one_rank(state, S{}, S::runtime());
}
BENCHMARK(BM_static_one_rank_zb_h1);
void BM_static_one_rank_1f1b(benchmark::State& state) {
  using S = loom::static_schedule<loom::one_f_one_b, loom::shape{.ranks = 1, .microbatches = 64}>;
  state.SetLabel("1f1b static");
  run_one_rank(state, S{}, S::runtime());
}
BENCHMARK(BM_static_one_rank_1f1b);

// Several ranks on threads: every action including send/recv and the waits between ranks.
void BM_threads_ranks(benchmark::State& state) {
  const int P = static_cast<int>(state.range(0)), m = 8 * P;
  loom::schedule s = loom::generate(loom::zb_h1{}, {P, m});
  auto comms = loom::threads::world(P);
  std::vector<std::thread> helpers;
  std::atomic<long long> steps{-1};
  std::atomic<bool> stop{false};
  // Ranks 1..P-1 follow rank 0 step by step: rank 0 publishes how many steps to run.
  std::vector<double> in(static_cast<std::size_t>(m), 1.0);
  for (int r = 1; r < P; ++r)
    helpers.emplace_back([&, r] {
      loom::pipeline p(s, comms[static_cast<std::size_t>(r)], [](loom::stage_id) { return noop_stage{}; });
      long long done = 0;
      while (true) {
        long long target = steps.load();
        if (stop.load() && done >= target) break;
        if (done < target) {
          p.step(in);
          ++done;
        } else {
          std::this_thread::yield();
        }
      }
    });
  loom::pipeline p(s, comms[0], [](loom::stage_id) { return noop_stage{}; });
  const auto actions = static_cast<double>(p.lowered().size());
  long long n = 0;
  steps = 0;
  for (auto _ : state) {
    steps = ++n;
    p.step(in);
  }
  stop = true;
  for (auto& t : helpers) t.join();
  state.SetLabel("zb-h1, all ranks' actions");
  state.counters["actions/step"] = actions;
  state.counters["s/action"] = benchmark::Counter(actions * static_cast<double>(state.iterations()),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_threads_ranks)->Arg(2)->Arg(4)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
