// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the tables of docs/offload.md: group-interleaved-1f1b's per-rank peak activation for
// p in {4, 8}, v in {2, 4}, m = 4p and every allowed group g, beside the peaks the PipeOffload
// authors' generator gives (tests/schedule/data/group_interleaved_reference.csv), with the
// bubble at unit costs; then the peaks with the first chunk offloaded (loom::plan_offload)
// beside the authors' scheduler's (tests/schedule/data/offload_reference.csv).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "loom/schedule.hpp"
#include "loom/schedule/offload.hpp"
#include "reference_csv.hpp"

namespace {

// The authors' per-rank peaks for (p, m, v, g), or "" when the reference holds no such row.
std::string reference_peaks(int p, int m, int v, int g) {
  for (const std::string& line : loom_ref::data_lines(LOOM_SOURCE_DIR "/tests/schedule/data/group_interleaved_reference.csv")) {
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

// The authors' per-rank peaks with k chunks offloaded at offload time `ot` (unit costs), "refused",
// or "" when the reference holds no such row.
std::string offload_reference(int p, int m, int v, int g, int k, double ot) {
  for (const std::string& line : loom_ref::data_lines(LOOM_SOURCE_DIR "/tests/schedule/data/offload_reference.csv")) {
    std::istringstream f(line);
    int rp = 0, rm = 0, rv = 0, rg = 0, rk = 0;
    double rot = 0, scale = 0;
    char c = 0;
    std::string peaks;
    f >> rp >> c >> rm >> c >> rv >> c >> rg >> c >> rk >> c >> rot >> c >> scale >> c;
    std::getline(f, peaks);
    if (rp == p && rm == m && rv == v && rg == g && rk == k && rot == ot && scale == 1) return peaks;
  }
  return {};
}

std::string chunk_peaks(const std::vector<double>& peaks, int v) {
  std::string out;
  for (double x : peaks) {
    if (!out.empty()) out.push_back(' ');
    out += std::to_string(static_cast<int>(x * v + 0.5));
  }
  return out;
}

int max_of(const std::vector<double>& peaks, int v) {
  double m = 0;
  for (double x : peaks) m = x > m ? x : m;
  return static_cast<int>(m * v + 0.5);
}

void offload_table() {
  std::printf("| p | v | m | g | no offload, max | first chunk offloaded, offload time 0.2: loom | authors' | offload time 0.5: loom | authors' | max: none / 0.2 / 0.5 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int p : {4, 8})
    for (int v : {2, 4})
      for (int g = (p + 1) / 2; g <= p; ++g) {
        const int m = 4 * p;
        const loom::schedule s = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v, .group = g});
        // The authors' unit: every pass of a stage (one chunk) takes 1.
        const loom::costs k{.f = 1.0 * v, .b = 1.0 * v, .w = 1.0 * v, .c = 0};
        const auto a = loom::plan_offload(s, k, {.chunks = 1, .time = 0.2});
        const auto b = loom::plan_offload(s, k, {.chunks = 1, .time = 0.5});
        auto cell = [&](const loom::offload_plan& x) { return x.ok ? chunk_peaks(x.peak_activation, v) : std::string("refused"); };
        auto top = [&](const loom::offload_plan& x) { return x.ok ? std::to_string(max_of(x.peak_activation, v)) : std::string("-"); };
        std::printf("| %d | %d | %d | %d | %d | %s | %s | %s | %s | %d / %s / %s |\n", p, v, m, g, max_of(a.peak_without, v), cell(a).c_str(),
                    offload_reference(p, m, v, g, 1, 0.2).c_str(), cell(b).c_str(), offload_reference(p, m, v, g, 1, 0.5).c_str(),
                    max_of(a.peak_without, v), top(a).c_str(), top(b).c_str());
      }
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
  std::printf("\n");
  offload_table();
}
