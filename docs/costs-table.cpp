// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the table of docs/costs.md: every family on 8 ranks x 16 microbatches under the
// example model (docs/costs/vocab_heavy_8.hpp) and under the uniform costs of its per-share
// means (loom::share_costs), i.e. what the simulator predicted before it knew the stages apart.
// ctest checks that every row is in the document.
#include <cstdio>

#include <loom/schedule.hpp>

#include "costs/vocab_heavy_8.hpp"

int main() {
  const loom::cost_model m = loom::docs::vocab_heavy_8();
  const loom::shape sh{.ranks = 8, .microbatches = 16};
  const loom::costs mean = loom::share_costs(m, sh.ranks);
  std::printf("| family | stages | makespan, uniform means (ms) | makespan, per stage (ms) | per stage / uniform | peak activation, per stage (GiB) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: one schedule spans several steps (docs/asynchronous.md); vocabulary-parallel: their passes' costs are not in the model
    if (!e.check(e.resolve(sh)).empty()) continue;
    loom::generate_options staged{.model = m};
    loom::schedule s = e.make(sh, staged);
    const auto u = loom::simulate(s, mean);
    const auto r = loom::simulate(s, m);
    if (!u.ok || !r.ok) return 1;
    std::printf("| %s | %d | %.2f | %.2f | %.3f | %.2f |\n", e.name.c_str(), s.stages, u.makespan, r.makespan,
                r.makespan / u.makespan, r.max_peak_activation());
  }
  return 0;
}
