// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Google Benchmark: zb-auto's search time (generate = grid + local search, every candidate
// simulated) on the Zero Bubble paper's largest setting, 28.3B with p = 32, m = 256 (Table 9
// costs), at memory limits p and 2p, loop (1 and 2 chunks per rank) and V placements. Target:
// under one second.
#include <benchmark/benchmark.h>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_auto.hpp>

namespace {

const loom::costs paper_28b{.f = 10.402, .b = 10.248, .w = 7.698, .c = 0.460,
                            .mem_w_ratio = 32.0 * 6144 / (34.0 * 6144 + 5.0 * 48 * 1024)};

void bm_zb_auto(benchmark::State& st) {
  const int p = static_cast<int>(st.range(0)), m = static_cast<int>(st.range(1));
  const double limit = static_cast<double>(st.range(2)) * p;
  // 0: loop, 1 chunk per rank; 1: V; 2: loop, 2 chunks per rank.
  const bool vee = st.range(3) == 1;
  const int chunks = st.range(3) == 0 ? 1 : 2;
  loom::generate_options o{.cost = paper_28b, .mem_limit = limit, .placement = vee ? loom::placement_kind::v : loom::placement_kind::loop};
  double rate = 0;
  for (auto _ : st) {
    auto s = loom::generate(loom::zb_auto{}, loom::shape{p, m, chunks}, o);
    benchmark::DoNotOptimize(s.programs.data());
    rate = loom::simulate(s, paper_28b).bubble_rate;
  }
  st.counters["bubble_rate"] = rate;
  st.counters["actions"] = 3.0 * p * m * chunks;
}

}  // namespace

BENCHMARK(bm_zb_auto)
    ->ArgNames({"p", "m", "limit_x_p", "layout"})
    ->Args({8, 32, 1, 0})
    ->Args({16, 128, 2, 0})
    ->Args({32, 256, 1, 0})
    ->Args({32, 256, 2, 0})
    ->Args({32, 256, 1, 1})
    ->Args({32, 256, 2, 1})
    ->Args({32, 256, 1, 2})
    ->Args({32, 256, 2, 2})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
