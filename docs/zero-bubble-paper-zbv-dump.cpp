// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Writes cost-aware zb-v's schedule for one Table 8 row (Zero Bubble, arXiv:2401.10241, §6) at
// the derived costs of zb_v_paper_costs.hpp, for docs/zero-bubble-paper-zbv-cpsat.py:
//   line 1: p m f b w c mem_w_ratio bubble_rate
//   then one line per action: rank kind(0 F, 1 B, 2 W) mb stage start
//   g++ -std=c++20 -O2 -Iinclude -Itests/schedule docs/zero-bubble-paper-zbv-dump.cpp -o /tmp/zbv-dump
//   /tmp/zbv-dump 0 > /tmp/zbv-row0.txt        (row index into Table 8, 0 = 6.2B m=48)
#include <cstdio>
#include <cstdlib>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_v.hpp>

#include "zb_paper_data.hpp"
#include "zb_v_paper_costs.hpp"

int main(int argc, char** argv) {
  const int row = argc > 1 ? std::atoi(argv[1]) : 0;
  if (row < 0 || row >= static_cast<int>(loom_paper::table8.size())) {
    std::fprintf(stderr, "row must be 0..%zu\n", loom_paper::table8.size() - 1);
    return 2;
  }
  auto const& x = loom_paper::table8[static_cast<std::size_t>(row)];
  const loom::costs k = loom_paper::zbv_costs(x);
  const loom::schedule sc =
      loom::generate(loom::zb_v{}, loom::shape{x.p, x.m}, {.cost = k, .mem_limit = double(x.p)});
  const loom::simulation sim = loom::simulate(sc, k);
  std::printf("%d %d %.6f %.6f %.6f %.6f %.8f %.8f\n", x.p, x.m, k.f, k.b, k.w, k.c, k.mem_w_ratio, sim.bubble_rate);
  for (int r = 0; r < x.p; ++r) {
    auto const& prog = sc.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i)
      std::printf("%d %d %d %d %.6f\n", r, static_cast<int>(prog[i].kind), prog[i].mb, prog[i].stage,
                  sim.times[static_cast<std::size_t>(r)][i].start);
  }
}
