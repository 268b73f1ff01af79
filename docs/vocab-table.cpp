// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the table of docs/vocab.md: for p in {2, 4, 8} and m = 4p, 1F1B and 1F1B with vocabulary
// parallelism (loom/schedule/vocab.hpp, Algorithms 1 and 2): the simulator's peak activation per
// rank beside the papers' count for rank 0 (p, p + 2, p + 1 microbatches), the makespan at unit
// costs with the vocabulary work free (the papers' assumption), and with it (S 0.5, T 0.7, IF and
// IB 0.1 per microbatch on each rank's shard; 1F1B: the same work whole on its first and last
// ranks) the makespan and the largest idle time of a rank.
// Then the same for V-Half (two chunks per rank; the first and last stages, so the whole input and
// output layers of plain V-Half, on rank 0) and V-Half with vocabulary parallelism (the authors'
// v-half-vocab branch), p in {2, 4, 8}, m = 4p, peaks in microbatches (a chunk is half of one).
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

std::string halves(const std::vector<double>& v) {
  std::string out;
  char cell[32];
  for (double x : v) {
    std::snprintf(cell, sizeof cell, "%g", x);
    if (!out.empty()) out += ' ';
    out += cell;
  }
  return out;
}

double largest_idle(const loom::simulation& s, int p) {
  double most = 0;
  for (int r = 0; r < p; ++r) most = std::max(most, s.bubble_time(r));
  return most;
}

const loom::costs unit{}, work{.s = 0.5, .t = 0.7, .e = 0.1};

// The vocabulary work of `s`: on every rank's shard (a vocabulary-parallel schedule), or whole with
// the first stage (the input layer) and the last (the output layer, its S and T in the forward and
// backward): on 1F1B's first and last ranks, on V-Half's rank 0.
loom::simulation with_work(const loom::schedule& s) {
  if (s.vocab != 0) return loom::simulate(s, work);
  const int p = s.ranks;
  loom::cost_model model = loom::cost_model::uniform(unit, s.stages, p);
  model.stages.front().f += p * work.e;
  model.stages.front().b += p * work.e;
  model.stages.back().f += p * work.s;
  model.stages.back().b += p * work.t;
  return loom::simulate(s, model);
}

// One row of a table.
void row(int m, const loom::schedule& s, const std::string& peaks, const char* memory) {
  const auto sim = loom::simulate(s, unit);
  const auto with = with_work(s);
  std::printf("| %d | %d | %s | %s | %s | %g | %g | %g |\n", s.ranks, m, std::string(s.name).c_str(), peaks.c_str(), memory, sim.makespan,
              with.makespan, largest_idle(with, s.ranks));
}

}  // namespace

int main() {
  std::printf("| p | m | schedule | peak activation per rank | papers' memory (rank 0) | makespan, vocabulary work free | "
              "makespan with it | largest idle time with it |\n|---|---|---|---|---|---|---|---|\n");
  for (int p : {2, 4, 8}) {
    const int m = 4 * p;
    for (int variant : {0, 1, 2}) {
      const loom::schedule s = variant == 0 ? loom::generate(loom::one_f_one_b{}, {p, m})
                               : variant == 1 ? loom::generate(loom::one_f_one_b_vocab_1{}, {p, m})
                                              : loom::generate(loom::one_f_one_b_vocab_2{}, {p, m});
      row(m, s, list(loom::simulate(s, unit).peak_activation), variant == 0 ? "p" : variant == 1 ? "p + 2" : "p + 1");
    }
  }
  std::printf("\n| p | m | schedule | peak activation per rank | authors' memory (chunks) | makespan, vocabulary work free | "
              "makespan with it | largest idle time with it |\n|---|---|---|---|---|---|---|---|\n");
  for (int p : {2, 4, 8}) {
    const int m = 4 * p;
    const loom::shape sh{.ranks = p, .microbatches = m, .chunks = 2};
    for (int variant : {0, 1, 2}) {
      const loom::schedule s = variant == 0 ? loom::generate(loom::v_half{}, sh)
                               : variant == 1 ? loom::generate(loom::v_half_vocab_1{}, sh)
                                              : loom::generate(loom::v_half_vocab_2{}, sh);
      row(m, s, halves(loom::simulate(s, unit).peak_activation), variant == 0 ? "p + 2" : variant == 1 ? "p + 6" : "p + 4");
    }
  }
}
