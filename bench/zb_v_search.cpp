// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Google Benchmark: cost-aware zb-v's run time (greedy + local search, every candidate simulated)
// at the Zero Bubble paper's Table 8 6.2B costs (derived in tests/schedule/zb_v_paper_costs.hpp:
// f = b = 0.3741, w = 0.2517, c = 0.021, M_W/M_B = 0.4324), memory limit p, and the cost-free
// greedy alone for comparison. Target: p = 16, m = 256 well under one second.
#include <benchmark/benchmark.h>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_v.hpp>

namespace {

const loom::costs table8_62b{.f = 0.37415, .b = 0.37415, .w = 0.2517, .c = 0.0210,
                             .mem_w_ratio = 32.0 * 4096 / (34.0 * 4096 + 5.0 * 32 * 1024)};

void bm_zb_v_search(benchmark::State& st) {
  const int p = static_cast<int>(st.range(0)), m = static_cast<int>(st.range(1));
  const bool search = st.range(2) != 0;
  const loom::generate_options o{.cost = table8_62b, .mem_limit = static_cast<double>(p)};
  double rate = 0;
  for (auto _ : st) {
    auto s = search ? loom::generate(loom::zb_v{}, loom::shape{p, m}, o) : loom::generate(loom::zb_v{}, loom::shape{p, m});
    benchmark::DoNotOptimize(s.programs.data());
    rate = loom::simulate(s, table8_62b).bubble_rate;
  }
  st.counters["bubble_rate"] = rate;
  st.counters["actions"] = 6.0 * p * m;
}

}  // namespace

BENCHMARK(bm_zb_v_search)
    ->ArgNames({"p", "m", "search"})
    ->Args({16, 48, 0})
    ->Args({16, 48, 1})
    ->Args({16, 256, 0})
    ->Args({16, 256, 1})
    ->Args({32, 256, 1})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
