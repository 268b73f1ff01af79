// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the table of docs/schedules-more.md.
#include <cstdio>
#include "loom/schedule.hpp"
using namespace loom;
template <class F> void row(F f, shape s, costs k, double paper, const char* form) {
  auto sc = generate(f, s); auto sim = simulate(sc, k);
  double bt = 0; for (int r = 0; r < s.ranks; ++r) bt = std::max(bt, sim.bubble_time(r));
  std::printf("| `%s` | %d | %d | %d | f=%g b=%g w=%g | %.4f | %g | %g | %s = %.4f |\n", std::string(F::name).c_str(), s.ranks, s.microbatches, sc.chunks, k.f, k.b, k.w,
              sim.bubble_ratio, bt, sim.max_peak_activation(), form, paper);
}
int main() {
  costs eq{.f = 2, .b = 1, .w = 1}, dflt{};
  for (auto [d, n] : {std::pair{4, 4}, {8, 8}, {8, 32}, {16, 64}}) row(chimera{}, {d, n}, eq, double(d - 2) / (2 * n + d - 2), "(D-2)/(2N+D-2)");
  for (auto [d, n] : {std::pair{4, 4}, {8, 8}, {8, 32}}) row(chimera{}, {d, n}, dflt, double(d - 2) / (2 * n + d - 2), "(D-2)/(2N+D-2)");
  for (auto [d, n] : {std::pair{4, 8}, {4, 16}, {8, 32}, {16, 64}}) row(chimera_fd{}, {d, n}, dflt, double(d - 2) / (2 * n + d - 2), "(D-2)/(2N+D-2)");
  for (auto [d, n] : {std::pair{4, 4}, {8, 8}, {8, 32}, {16, 64}}) row(bitpipe{}, {d, n}, eq, double(d - 2) / (4 * n + d - 2), "(D-2)/(4N+D-2)");
  row(bitpipe{}, {4, 4}, costs{.f = 2, .b = 2, .w = 2}, 4.0 / 28, "figure: 4 idle of 28");
  for (auto [d, n] : {std::pair{8, 8}, {8, 32}}) row(bitpipe{}, {d, n}, dflt, double(d - 2) / (4 * n + d - 2), "(D-2)/(4N+D-2)");
  for (auto [p, n, w] : {std::tuple{4, 8, 1}, {8, 16, 1}, {8, 16, 2}, {16, 64, 2}}) row(hanayo{}, {p, n, w}, eq, double(p - 1) / (2 * w * n + p - 1), "(P-1)/(2WN+P-1)");
  for (auto [p, n, w] : {std::tuple{8, 16, 1}, {8, 16, 2}}) row(hanayo{}, {p, n, w}, dflt, double(p - 1) / (2 * w * n + p - 1), "(P-1)/(2WN+P-1)");
  for (auto [p, n, v] : {std::tuple{4, 8, 2}, {8, 12, 2}, {8, 32, 4}}) row(looped_bfs{}, {p, n, v}, dflt, (p - 1) * 3.0 / v, "bubble time (P-1)(f+b+w)/v");
  for (auto [p, n] : {std::pair{4, 8}, {8, 32}}) { row(gpipe{}, {p, n}, dflt, (p - 1) * 3.0, "(P-1)(f+b+w)"); row(gpipe_2bp{}, {p, n}, dflt, (p - 1) * 2.0, "(P-1)(f+b)"); row(one_f_one_b{}, {p, n}, dflt, (p - 1) * 3.0, "(P-1)(f+b+w)"); row(one_f_one_b_2bp{}, {p, n}, dflt, (p - 1) * 2.0, "(P-1)(f+b)"); }
}
