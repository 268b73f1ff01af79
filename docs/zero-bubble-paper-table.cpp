// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/zero-bubble-paper.md's tables: the Zero Bubble paper's bubble rates (Table 5 of
// arXiv:2401.10241v1) next to loom's, from the paper's profiled costs (Table 9).
//   g++ -std=c++20 -O2 -Iinclude -Itests/schedule docs/zero-bubble-paper-table.cpp -o /tmp/zbt && /tmp/zbt
#include <cstdio>

#include <loom/schedule.hpp>
#include <loom/schedule/zb_auto.hpp>

#include "zb_paper_data.hpp"

int main() {
  std::printf("| model | p | m | M_W/M_B | 1F1B paper / loom | ZB-H1 paper / loom | ZB-H2 paper / loom |"
              " ZB-1p paper | zb-auto p (loop) | zb-auto p (V) | ZB-2p paper | zb-auto 2p (loop) | zb-auto 2p (V) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto const& x : loom_paper::table5) {
    const loom::costs k = x.cost();
    loom::shape s{x.p, x.m};
    auto rate = [&](const loom::schedule& sc) { return loom::simulate(sc, k).bubble_rate; };
    auto autor = [&](int mult, bool vee) {
      loom::generate_options o{.cost = k, .mem_limit = double(mult * x.p), .placement = vee ? loom::placement_kind::v : loom::placement_kind::loop};
      return rate(loom::generate(loom::zb_auto{}, loom::shape{x.p, x.m, vee ? 2 : 1}, o));
    };
    std::printf("| %s | %d | %d | %.4f | %.4f / %.4f | %.4f / %.4f | %.4f / %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n",
                x.model, x.p, x.m, x.mem_w_ratio(), x.r_1f1b, rate(loom::generate(loom::one_f_one_b{}, s)), x.r_zbh1,
                rate(loom::generate(loom::zb_h1{}, s)), x.r_zbh2, rate(loom::generate(loom::zb_h2{}, s)), x.r_zb1p,
                autor(1, false), autor(1, true), x.r_zb2p, autor(2, false), autor(2, true));
  }
}
