// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The comparison program: zb-auto (loop and V placements) and cost-aware zb-v against the Zero
// Bubble authors' own heuristics on the seeded random configurations of
// tests/schedule/data/zb_authors_reference.csv (how those numbers were produced is in its header),
// and against loom's best fixed family on the same placement within the limit. Prints one CSV
// line per configuration, then the summary tables of docs/zb-auto-vs-authors.md; exits 1 if
// loom is worse than the authors on any configuration.
//   zb_compare [reference.csv]     (default: the repository's copy)
#include <cstdio>
#include <string>

#include "compare.hpp"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : LOOM_SOURCE_DIR "/tests/schedule/data/zb_authors_reference.csv";
  const auto ref = loom_zbref::read_reference(path);
  std::vector<loom_zbref::comparison> rows;
  int worse = 0;
  std::printf("id,p,m,limit,authors_loop,zb_auto_loop,authors_v,zb_auto_v,zb_v,best_fixed_loop,best_fixed_v,best_two_copy\n");
  for (auto const& x : ref) {
    auto c = loom_zbref::compare(x);
    std::printf("%d,%d,%d,%g,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f (%s),%.6f (%s),%.6f (%s)\n", x.id, x.p, x.m, x.limit, x.loop_rate,
                c.auto_loop, x.v_rate, c.auto_v, c.zb_v, c.fixed_loop, c.fixed_loop_name.c_str(), c.fixed_v,
                c.fixed_v_name.c_str(), c.two_copy, c.two_copy_name.c_str());
    if ((x.loop_rate >= 0 && c.auto_loop > x.loop_rate + 1e-9) || (x.v_rate >= 0 && c.auto_v > x.v_rate + 1e-9) ||
        (x.v_rate >= 0 && c.zb_v > x.v_rate + 1e-9))
      ++worse;
    rows.push_back(c);
  }
  std::printf("\n%s\n%s", loom_zbref::summary_table(rows).c_str(), loom_zbref::two_copy_table(rows).c_str());
  std::printf("\n%zu configurations, loom worse than the authors on %d\n", rows.size(), worse);
  return worse == 0 ? 0 : 1;
}
