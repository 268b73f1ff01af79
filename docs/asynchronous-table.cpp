// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the tables of docs/asynchronous.md: the versions / memory / bubble trade-off of the
// asynchronous families against 1F1B, and their bubble over T steps against the closed form.
#include <algorithm>
#include <cstdio>
#include <string>

#include "loom/schedule.hpp"

namespace {

std::string list(const std::vector<double>& v) {
  std::string s;
  for (double x : v) {
    if (!s.empty()) s.push_back(' ');
    s.append(std::to_string(static_cast<int>(x)));
  }
  return s;
}

void tradeoff(const char* family, int p, int m, int T, const char* staleness) {
  const auto& e = loom::default_registry().at(family);
  const loom::schedule s = e.make({.ranks = p, .microbatches = m, .chunks = 0, .steps = e.multi_step ? T : 1});
  const auto sim = loom::simulate(s);
  const double copies = *std::max_element(sim.weight_copies.begin(), sim.weight_copies.end());
  std::printf("| `%s` | %s | %g | %g | %.4f | %s |\n", family, list(sim.weight_copies).c_str(), copies, sim.max_peak_activation(),
              sim.bubble_ratio, staleness);
}

}  // namespace

int main() {
  const int p = 4, m = 8, T = 8;
  std::printf("p = %d, m = %d, T = %d steps, unit costs (f = b = w = 1, c = 0):\n\n", p, m, T);
  std::printf("| family | weight versions per rank | most on a rank | peak activation | bubble ratio over T steps | staleness |\n");
  std::printf("|---|---|---|---|---|---|\n");
  tradeoff("1f1b", p, m, T, "none: every step flushes, one version");
  tradeoff("pipedream", p, m, T, "stage s updates with gradients of weights p-1-s updates old (one update per microbatch)");
  tradeoff("pipedream-vs", p, m, T, "every stage: weights p-1 updates old, the same version on every stage for a microbatch");
  tradeoff("pipedream-2bw", p, m, T, "one step: W(t+1) = W(t) - lr grad f_t(W(t-1))");
  tradeoff("pipelined-backprop", p, m, T, "forward: p-1-s updates old, backward: the latest (no stash)");
  std::printf("\n| p | m | T | 1f1b | pipedream | pipedream-2bw | (p-1)/(Tm+p-1) |\n|---|---|---|---|---|---|---|\n");
  for (int pp : {2, 4, 8})
    for (int tt : {1, 4, 16}) {
      const int mm = pp;
      auto bubble = [&](const char* f) {
        const auto& e = loom::default_registry().at(f);
        return loom::simulate(e.make({.ranks = pp, .microbatches = mm, .chunks = 0, .steps = e.multi_step ? tt : 1})).bubble_ratio;
      };
      std::printf("| %d | %d | %d | %.4f | %.4f | %.4f | %.4f |\n", pp, mm, tt, bubble("1f1b"), bubble("pipedream"),
                  bubble("pipedream-2bw"), double(pp - 1) / (tt * mm + pp - 1));
    }
}
