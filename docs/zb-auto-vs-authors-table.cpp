// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/zb-auto-vs-authors.md's tables: zb-auto and zb-v against the Zero Bubble authors'
// heuristics on the 600 seeded random configurations of tests/schedule/data/zb_authors_reference.csv
// (tools/zb-reference/compare.hpp does the comparison).
//   g++ -std=c++20 -O2 -Iinclude -Itools/zb-reference -DLOOM_SOURCE_DIR='"."' docs/zb-auto-vs-authors-table.cpp -o /tmp/zbr && /tmp/zbr
#include <cstdio>

#include "compare.hpp"

int main() {
  const auto ref = loom_zbref::read_reference(LOOM_SOURCE_DIR "/tests/schedule/data/zb_authors_reference.csv");
  std::vector<loom_zbref::comparison> rows;
  for (auto const& x : ref) rows.push_back(loom_zbref::compare(x));
  std::printf("%s\n%s", loom_zbref::summary_table(rows).c_str(), loom_zbref::two_copy_table(rows).c_str());
}
