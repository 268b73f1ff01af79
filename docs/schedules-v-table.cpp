// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the numbers and timelines of docs/schedules-v.md:
//   g++ -std=c++20 -O1 -Iinclude docs/schedules-v-table.cpp -o /tmp/vt && /tmp/vt
#include <cstdio>
#include <string>
#include <vector>

#include <loom/schedule/one_f_one_b.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/schedule/v_half.hpp>
#include <loom/schedule/v_min.hpp>
#include <loom/schedule/zb_v.hpp>

namespace {

// One column per chunk pass (1/2 time unit at f = b = w = 1): F/B/W chunk 0, f/b/w chunk 1.
void timeline(const loom::schedule& s) {
  auto sim = loom::simulate(s, {.f = 1, .b = 1, .w = 1});
  int cols = static_cast<int>(sim.makespan * 2 + 0.5);
  for (int r = 0; r < s.ranks; ++r) {
    std::string row(static_cast<std::size_t>(cols) * 2, '.');
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      auto const& a = prog[i];
      int col = static_cast<int>(sim.times[static_cast<std::size_t>(r)][i].start * 2 + 0.5);
      bool chunk1 = a.stage >= s.ranks;
      char k = a.kind == loom::op::F ? 'F' : a.kind == loom::op::B ? 'B' : 'W';
      if (chunk1) k = static_cast<char>(k - 'A' + 'a');
      row[static_cast<std::size_t>(col) * 2] = k;
      row[static_cast<std::size_t>(col) * 2 + 1] = static_cast<char>('0' + a.mb % 10);
    }
    std::printf("//! r%d %s\n", r, row.c_str());
  }
}

template <class F>
void line(const char* paper_rate, const char* paper_peak, int p, int m) {
  const loom::costs k{.f = 1, .b = 1, .w = 1};
  auto sim = loom::simulate(loom::generate(F{}, {.ranks = p, .microbatches = m}), k);
  double sb = 0;
  for (int r = 0; r < p; ++r) sb = sim.span_bubble(r) > sb ? sim.span_bubble(r) : sb;
  std::printf("| %-6s | %2d | %3d | %.4f | %5.1f | %4.1f | %s | %s |\n", std::string(F::name).c_str(), p, m,
              sim.bubble_rate, sb, sim.max_peak_activation(), paper_rate, paper_peak);
}

}  // namespace

int main() {
  std::printf("zb-v p=3 m=6\n");
  timeline(loom::generate(loom::zb_v{}, {.ranks = 3, .microbatches = 6}));
  std::printf("v-half p=4 m=8\n");
  timeline(loom::generate(loom::v_half{}, {.ranks = 4, .microbatches = 8}));
  std::printf("v-min p=4 m=8\n");
  timeline(loom::generate(loom::v_min{}, {.ranks = 4, .microbatches = 8}));

  std::printf("\n| family | p | m | loom bubble_rate | loom span bubble | loom peak | paper bubble rate | paper peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto [p, m] : std::vector<std::pair<int, int>>{{4, 8}, {4, 16}, {8, 16}, {8, 32}, {16, 32}, {16, 64}}) {
    char r1[64], r2[64], r3[64], r4[64], k1[32], k2[32], k3[32], k4[32];
    std::snprintf(r1, sizeof r1, "(p-1)/(m+p-1) = %.4f", (p - 1.0) / (m + p - 1));
    std::snprintf(r2, sizeof r2, "0");
    std::snprintf(r3, sizeof r3, "~p/(2m) = %.4f", p / (2.0 * m));
    std::snprintf(r4, sizeof r4, "~2p/(3m) = %.4f", 2.0 * p / (3.0 * m));
    std::snprintf(k1, sizeof k1, "p = %d", p);
    std::snprintf(k2, sizeof k2, "p = %d", p);
    std::snprintf(k3, sizeof k3, "(p+2)//2 = %d", (p + 2) / 2);
    std::snprintf(k4, sizeof k4, "(p+4)//3 = %d", (p + 4) / 3);
    line<loom::one_f_one_b>(r1, k1, p, m);
    line<loom::zb_v>(r2, k2, p, m);
    line<loom::v_half>(r3, k3, p, m);
    line<loom::v_min>(r4, k4, p, m);
  }
}
