// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/zero-bubble-paper.md's ZB-V table: the Zero Bubble paper's Table 8 (arXiv:2401.10241,
// §6) next to loom, at costs derived from Table 8's own baseline columns (zb_v_paper_costs.hpp).
//   g++ -std=c++20 -O2 -Iinclude -Itests/schedule docs/zero-bubble-paper-zbv-table.cpp -o /tmp/zbvt && /tmp/zbvt
#include <cstdio>
#include <string_view>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_auto.hpp>
#include <loom/schedule/zb_v.hpp>

#include "zb_paper_data.hpp"
#include "zb_v_paper_costs.hpp"

int main() {
  // Table 9's profiled costs of the same model (three profiles per model: its Table 5 runs).
  std::printf("| model | p | m | Table 9 profile (m of its Table 5 run) | 1F1B paper / loom | ZB-H2 paper / loom |"
              " ZB-V paper | zb-v cost-aware | its peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (auto const& x : loom_paper::table8)
    for (auto const& c : loom_paper::table5) {
      if (std::string_view(c.model) != x.model) continue;
      const loom::costs k = c.cost();
      const loom::shape s{x.p, x.m};
      const loom::generate_options o{.cost = k, .mem_limit = double(x.p)};
      const auto v = loom::simulate(loom::generate(loom::zb_v{}, s, o), k);
      std::printf("| %s | %d | %d | f=%.3f b=%.3f w=%.3f c=%.3f (m=%d) | %.4f / %.4f | %.4f / %.4f | %.4f | %.4f | %.2f |\n",
                  x.model, x.p, x.m, c.f, c.b, c.w, c.comm, c.m, x.r_1f1b,
                  loom::simulate(loom::generate(loom::one_f_one_b{}, s), k).bubble_rate, x.r_zbh2,
                  loom::simulate(loom::generate(loom::zb_h2{}, s), k).bubble_rate, x.r_zbv, v.bubble_rate,
                  v.max_peak_activation());
    }
  std::printf("\n");
  std::printf("| model | p | m | f = b | w | c | 1F1B paper / loom | ZB-H1 paper / loom | ZB-H2 paper / loom |"
              " ZB-V paper | zb-v greedy | zb-v cost-aware | its peak | zb-auto (V, limit p) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto const& x : loom_paper::table8) {
    const loom::costs k = loom_paper::zbv_costs(x);
    const loom::shape s{x.p, x.m};
    auto rate = [&](const loom::schedule& sc) { return loom::simulate(sc, k).bubble_rate; };
    const double greedy = rate(loom::generate(loom::zb_v{}, s));
    const loom::generate_options o{.cost = k, .mem_limit = double(x.p), .placement = loom::placement_kind::v};
    const auto v = loom::simulate(loom::generate(loom::zb_v{}, s, o), k);
    const double a = rate(loom::generate(loom::zb_auto{}, loom::shape{x.p, x.m, 2}, o));
    std::printf("| %s | %d | %d | %.4f | %.4f | %.4f | %.4f / %.4f | %.4f / %.4f | %.4f / %.4f | %.4f | %.4f | %.5f | %.2f | %.4f |\n",
                x.model, x.p, x.m, k.f, k.w, k.c, x.r_1f1b, rate(loom::generate(loom::one_f_one_b{}, s)), x.r_zbh1,
                rate(loom::generate(loom::zb_h1{}, s)), x.r_zbh2, rate(loom::generate(loom::zb_h2{}, s)), x.r_zbv,
                greedy, v.bubble_rate, v.max_peak_activation(), a);
  }
}
