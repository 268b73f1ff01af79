// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the table of docs/offload.md: group-interleaved-1f1b's per-rank peak activation for
// p in {4, 8}, v in {2, 4}, m = 4p and every allowed group g, beside the peaks the PipeOffload
// authors' generator gives (tests/schedule/data/group_interleaved_reference.csv), with the
// bubble at unit costs.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/schedule.hpp"

namespace {

// The authors' per-rank peaks for (p, m, v, g), or "" when the reference holds no such row.
std::string reference_peaks(int p, int m, int v, int g) {
  std::ifstream in(LOOM_SOURCE_DIR "/tests/schedule/data/group_interleaved_reference.csv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    int rp = 0, rm = 0, rv = 0, rg = 0;
    char c = 0;
    std::string peaks;
    f >> rp >> c >> rm >> c >> rv >> c >> rg >> c;
    std::getline(f, peaks, ',');
    if (rp == p && rm == m && rv == v && rg == g) return peaks;
  }
  return {};
}

}  // namespace

int main() {
  std::printf("| p | v | m | g | loom peak per rank | authors' peak per rank | equal | makespan | bubble ratio |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int p : {4, 8})
    for (int v : {2, 4})
      for (int g = (p + 1) / 2; g <= p; ++g) {
        const int m = 4 * p;
        const auto sim = loom::simulate(loom::generate(loom::group_interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v, .group = g}));
        std::string ours;
        for (double x : sim.peak_activation) {
          if (!ours.empty()) ours.push_back(' ');
          ours += std::to_string(static_cast<int>(x * v + 0.5));
        }
        const std::string theirs = reference_peaks(p, m, v, g);
        std::printf("| %d | %d | %d | %d | %s | %s | %s | %g | %.4f |\n", p, v, m, g, ours.c_str(), theirs.empty() ? "-" : theirs.c_str(),
                    ours == theirs ? "yes" : "NO", sim.makespan, sim.bubble_ratio);
      }
}
