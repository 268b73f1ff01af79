// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/moe.md's table: Tutel's routing (loom/exec/moe.hpp) of six tokens over three
// experts, top-2, first choices 0 0 0 1 0 2 and second choices 1 2 1 0 1 0 (router logits 2 for
// the first, 1 for the second, 0 otherwise): each pair's expert and slot, and whether it is kept
// under capacity factors 0, 0.5 and 1.
//   build/tests/docs/doc_moe-table
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "loom/exec/moe.hpp"

int main() {
  const int first[6] = {0, 0, 0, 1, 0, 2}, second[6] = {1, 2, 1, 0, 1, 0};
  std::vector<double> logits(18, 0.0);
  for (int t = 0; t < 6; ++t) {
    logits[static_cast<std::size_t>(t * 3 + first[t])] = 2.0;
    logits[static_cast<std::size_t>(t * 3 + second[t])] = 1.0;
  }
  const double factors[3] = {0.0, 0.5, 1.0};
  std::vector<loom::moe_routing<double>> routed;
  std::string head = "| token | choice | expert | slot |", rule = "|---:|---:|---:|---:|";
  for (double f : factors) {
    loom::moe_options o{.experts = 3, .top_k = 2, .capacity_factor = f};
    auto r = loom::moe_route(o, std::span<const double>(logits));
    loom::set_capacity(r, o, r.max_load());
    char cell[64];
    std::snprintf(cell, sizeof cell, " f = %g (C = %lld) |", f, r.capacity);
    head += cell;
    rule += ":-:|";
    routed.push_back(r);
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
  for (int j = 0; j < 2; ++j)
    for (std::size_t t = 0; t < 6; ++t) {
      const auto& r = routed[0];
      std::printf("| %zu | %d | %d | %lld |", t, j + 1, r.expert[t * 2 + static_cast<std::size_t>(j)], r.slot[t * 2 + static_cast<std::size_t>(j)]);
      for (const auto& x : routed) std::printf(" %s |", x.kept(t, j) ? "kept" : "dropped");
      std::printf("\n");
    }
}
