// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/zero-bubble-paper.md's tables: the Zero Bubble paper's bubble rates (Table 5 of
// arXiv:2401.10241v1) next to loom's, from the paper's profiled costs (Table 9), and zb-auto's
// gap to the certified lower bound (loom/schedule/bound.hpp) in the same settings.
//   g++ -std=c++20 -O2 -Iinclude -Itests/schedule docs/zero-bubble-paper-table.cpp -o /tmp/zbt && /tmp/zbt
#include <cstdio>

#include <algorithm>
#include <array>
#include <vector>

#include <loom/schedule.hpp>
#include <loom/schedule/bound.hpp>
#include <loom/schedule/zb_auto.hpp>

#include "zb_paper_data.hpp"

int main() {
  std::printf("| model | p | m | M_W/M_B | 1F1B paper / loom | ZB-H1 paper / loom | ZB-H2 paper / loom |"
              " ZB-1p paper | zb-auto p (loop) | zb-auto p (V) | ZB-2p paper | zb-auto 2p (loop) | zb-auto 2p (V) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  // zb-auto's schedules, generated once for both tables: [setting][limit p, 2p][loop, V].
  std::vector<std::array<std::array<loom::schedule, 2>, 2>> autos;
  for (auto const& x : loom_paper::table5) {
    autos.emplace_back();
    for (int mult : {1, 2})
      for (int vee : {0, 1}) {
        loom::generate_options o{.cost = x.cost(), .mem_limit = double(mult * x.p),
                                 .placement = vee ? loom::placement_kind::v : loom::placement_kind::loop};
        autos.back()[mult - 1][vee] = loom::generate(loom::zb_auto{}, loom::shape{x.p, x.m, vee ? 2 : 1}, o);
      }
  }
  std::size_t row = 0;
  for (auto const& x : loom_paper::table5) {
    const loom::costs k = x.cost();
    loom::shape s{x.p, x.m};
    auto rate = [&](const loom::schedule& sc) { return loom::simulate(sc, k).bubble_rate; };
    auto autor = [&](int mult, bool vee) { return rate(autos[row][mult - 1][vee ? 1 : 0]); };
    std::printf("| %s | %d | %d | %.4f | %.4f / %.4f | %.4f / %.4f | %.4f / %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n",
                x.model, x.p, x.m, x.mem_w_ratio(), x.r_1f1b, rate(loom::generate(loom::one_f_one_b{}, s)), x.r_zbh1,
                rate(loom::generate(loom::zb_h1{}, s)), x.r_zbh2, rate(loom::generate(loom::zb_h2{}, s)), x.r_zb1p,
                autor(1, false), autor(1, true), x.r_zb2p, autor(2, false), autor(2, true));
    ++row;
  }

  // zb-auto's gap to the certified lower bound, per setting, limit and placement: bubble rate and
  // bound, and the gaps of the longest span and of the makespan as fractions of each.
  std::printf("\n| model | p | m | limit | placement | zb-auto bubble rate | bound | span gap | makespan gap |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  double span_sum[2][2] = {}, make_sum[2][2] = {};
  int n = 0;
  for (auto const& x : loom_paper::table5) {
    const loom::costs k = x.cost();
    for (int mult : {1, 2})
      for (int vee : {0, 1}) {
        const double limit = mult * x.p;
        const auto& s = autos[static_cast<std::size_t>(n)][mult - 1][vee];
        const auto sim = loom::simulate(s, k);
        const auto lb = loom::lower_bound(s, k, limit);
        const double span = *std::max_element(sim.span.begin(), sim.span.end());
        // (Rounding can put the bound a few ulps above an optimal schedule: print that as 0.)
        auto clean = [](double g) { return g > -1e-12 && g < 1e-12 ? 0.0 : g; };
        const double gs = clean((span - lb.max_span) / span), gm = clean((sim.makespan - lb.makespan) / sim.makespan);
        span_sum[mult - 1][vee] += gs;
        make_sum[mult - 1][vee] += gm;
        std::printf("| %s | %d | %d | %dp | %s | %.4f | %.4f | %.2f%% | %.2f%% |\n", x.model, x.p, x.m, mult, vee ? "V" : "loop",
                    sim.bubble_rate, lb.bubble_rate, 100 * gs, 100 * gm);
      }
    ++n;
  }
  for (int mult : {1, 2})
    for (int vee : {0, 1})
      std::printf("| mean of %d | | | %dp | %s | | | %.2f%% | %.2f%% |\n", n, mult, vee ? "V" : "loop",
                  100 * span_sum[mult - 1][vee] / n, 100 * make_sum[mult - 1][vee] / n);
}
