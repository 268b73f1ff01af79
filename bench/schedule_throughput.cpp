// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Throughput of the schedule engine: generate + lower + validate (of the lowered programs:
// placement, counts, dependencies, FIFO deadlock-freedom — all four rules) + simulate, in
// compute actions (F/B/W/BW/FB, not counting the send/recv that lowering adds) per second of
// CPU time, for the classic families up to p = 128, m = 1024, v = 4.
// Run: ./build/bench/schedule_throughput --benchmark_counters_tabular=true
//
// The engine returns freshly allocated programs and tables (tens of MB at p = 128, m = 1024,
// v = 4). glibc gives such blocks back to the kernel on free, so each iteration would pay the
// page faults of fresh memory again. Set LOOM_BENCH_KEEP_MEMORY=1 to measure the steady state
// of a process that runs the engine repeatedly (glibc keeps freed memory for reuse); docs/
// schedule-engine.md records both.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdlib>
#include <string_view>

#include <loom/schedule.hpp>

namespace {

// One full pass of the engine; returns the number of compute actions.
std::size_t engine_pass(const loom::family_entry& fam, loom::shape s) {
  loom::schedule sched = fam.make(s);
  loom::schedule low = loom::lower(sched);
  loom::require_valid(low);
  loom::simulation sim = loom::simulate(sched, {.f = 1, .b = 2, .w = 1, .c = 0.1});
  benchmark::DoNotOptimize(sim.makespan);
  return sched.size();
}

void engine(benchmark::State& state, std::string name) {
  static const loom::registry families = loom::builtin_registry();
  auto const& fam = families.at(name);
  loom::shape s{.ranks = static_cast<int>(state.range(0)), .microbatches = static_cast<int>(state.range(1)),
                .chunks = static_cast<int>(state.range(2))};
  std::size_t actions = 0;
  for (auto _ : state) actions += engine_pass(fam, s);
  state.counters["actions"] = static_cast<double>(actions) / static_cast<double>(state.iterations());
  state.counters["actions_per_s"] = benchmark::Counter(static_cast<double>(actions), benchmark::Counter::kIsRate);
  state.counters["lowered_actions"] = static_cast<double>(loom::lower(fam.make(s)).size());
}

void shapes(benchmark::internal::Benchmark* b, int chunks) {
  for (auto [p, m] : {std::pair{8, 64}, {32, 256}, {128, 1024}}) b->Args({p, m, chunks});
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(engine, gpipe, std::string("gpipe"))->Apply([](auto* b) { shapes(b, 1); });
BENCHMARK_CAPTURE(engine, 1f1b, std::string("1f1b"))->Apply([](auto* b) { shapes(b, 1); });
BENCHMARK_CAPTURE(engine, interleaved_1f1b, std::string("interleaved-1f1b"))->Apply([](auto* b) { shapes(b, 4); });
BENCHMARK_CAPTURE(engine, zb_h1, std::string("zb-h1"))->Apply([](auto* b) { shapes(b, 1); });
BENCHMARK_CAPTURE(engine, zb_h2, std::string("zb-h2"))->Apply([](auto* b) { shapes(b, 1); });

int main(int argc, char** argv) {
  if (const char* keep = std::getenv("LOOM_BENCH_KEEP_MEMORY"); keep && std::string_view(keep) == "1") {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // large blocks from the heap, not fresh mmaps
    mallopt(M_TRIM_THRESHOLD, 1 << 30);  // and kept there after free
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
