// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the table of docs/vocab.md: for p in {2, 4, 8} and m = 4p, 1F1B and 1F1B with vocabulary
// parallelism (loom/schedule/vocab.hpp, Algorithms 1 and 2): the simulator's peak activation per
// rank beside the papers' count for rank 0 (p, p + 2, p + 1 microbatches), the makespan at unit
// costs with the vocabulary work free (the papers' assumption), and with it (S 0.5, T 0.7, IF and
// IB 0.1 per microbatch on each rank's shard; 1F1B: the same work whole on its first and last
// ranks) the makespan and the largest idle time of a rank.
//   build/tests/docs/doc_vocab-table
#include <algorithm>
#include <cstdio>
#include <string>

#include "loom/schedule.hpp"
#include "loom/schedule/vocab.hpp"

namespace {

std::string list(const std::vector<double>& v) {
  std::string out;
  for (double x : v) {
    if (!out.empty()) out += ' ';  // appends only: GCC 12's -Wrestrict misfires on "literal" + std::string at -O3
    out += std::to_string(static_cast<long long>(x));
  }
  return out;
}

double largest_idle(const loom::simulation& s, int p) {
  double most = 0;
  for (int r = 0; r < p; ++r) most = std::max(most, s.bubble_time(r));
  return most;
}

}  // namespace

int main() {
  std::printf("| p | m | schedule | peak activation per rank | papers' memory (rank 0) | makespan, vocabulary work free | "
              "makespan with it | largest idle time with it |\n|---|---|---|---|---|---|---|---|\n");
  const loom::costs free{}, work{.s = 0.5, .t = 0.7, .e = 0.1};
  for (int p : {2, 4, 8}) {
    const int m = 4 * p;
    for (int variant : {0, 1, 2}) {
      const loom::schedule s = variant == 0 ? loom::generate(loom::one_f_one_b{}, {p, m})
                               : variant == 1 ? loom::generate(loom::one_f_one_b_vocab_1{}, {p, m})
                                              : loom::generate(loom::one_f_one_b_vocab_2{}, {p, m});
      const auto sim = loom::simulate(s, free);
      // The same vocabulary work: on every rank's shard, or (1F1B) whole on the first rank (the
      // input layer) and the last (the output layer, its S and T in the forward and backward).
      loom::simulation with;
      if (variant == 0) {
        loom::cost_model model = loom::cost_model::uniform(free, p, p);
        model.stages.front().f += p * work.e;
        model.stages.front().b += p * work.e;
        model.stages.back().f += p * work.s;
        model.stages.back().b += p * work.t;
        with = loom::simulate(s, model);
      } else {
        with = loom::simulate(s, work);
      }
      std::printf("| %d | %d | %s | %s | %s | %g | %g | %g |\n", p, m, std::string(s.name).c_str(), list(sim.peak_activation).c_str(),
                  variant == 0 ? "p" : variant == 1 ? "p + 2" : "p + 1", sim.makespan, with.makespan, largest_idle(with, p));
    }
  }
}
