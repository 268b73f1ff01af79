// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the render tests: a grid of (family, shape, costs) cases over every registered
// family, and a small hand-written schedule with overlapped FB actions.

#include <string>
#include <vector>

#include <loom/schedule.hpp>

namespace render_test {

struct sample {
  loom::schedule sched;
  loom::simulation sim;
  std::string what;
};

// Every registered family on a grid of shapes it accepts, under a few cost settings
// (including a p2p latency that is not a multiple of the action times).
inline std::vector<sample> grid() {
  std::vector<sample> out;
  // (The vocabulary passes' times: a pass of zero time would take a column of its own and push
  // the rank's later actions right.)
  const loom::costs settings[] = {{.f = 1, .b = 1, .w = 1, .s = 1, .t = 1, .e = 0.5}, {.f = 1, .b = 2, .w = 1.5, .c = 0.3, .s = 0.5, .t = 1, .e = 0.5}};
  for (auto const& e : loom::default_registry().entries()) {
    for (int p : {1, 2, 3, 4}) {
      for (int m : {1, 3, 8}) {
        loom::shape sh{p, m, 0};
        if (!e.check(e.resolve(sh)).empty()) continue;
        for (auto const& k : settings) {
          loom::generate_options o;
          o.cost = k;
          o.mem_limit = 2.0 * p;
          auto s = e.make(sh, o);
          auto sim = loom::simulate(s, k);
          out.push_back({std::move(s), std::move(sim),
                         e.name + " p=" + std::to_string(p) + " m=" + std::to_string(m) + " c=" + std::to_string(k.c)});
        }
      }
    }
  }
  return out;
}

// One rank, one stage, three microbatches: F0, FB(F1 + BW0), FB(F2 + B1), W1, BW2.
inline loom::schedule overlapped_sample(std::string name = "fb-sample") {
  loom::schedule s;
  s.name = std::move(name);
  s.ranks = 1;
  s.microbatches = 3;
  s.chunks = 1;
  s.stages = 1;
  s.stage_to_rank = {0};
  s.programs = {{loom::forward(0, 0), loom::overlapped(1, 0, loom::op::BW, 0, 0),
                 loom::overlapped(2, 0, loom::op::B, 1, 0), loom::backward_weight(1, 0), loom::backward(2, 0)}};
  return s;
}

// Number of compute actions of `s`.
inline std::size_t compute_actions(const loom::schedule& s) {
  std::size_t n = 0;
  for (auto const& p : s.programs)
    for (auto const& a : p) n += loom::is_compute(a.kind) ? 1 : 0;
  return n;
}

}  // namespace render_test
