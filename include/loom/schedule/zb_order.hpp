// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The handcrafted Zero Bubble op order shared by ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble
//! Pipeline Parallelism", ICLR 2024, §3 and Fig. 3): rank r warms up with k(p-1-r) forwards
//! (k = 1 for ZB-H1, 2 for ZB-H2; at most m); then for the i-th input-gradient backward
//! (i from 0): one F while forwards remain, B(i), and, when i >= k*r, the oldest pending W;
//! the W's still pending run at the tail.

#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom::detail {

//! Builds the ZB-H1 (`k = 1`) or ZB-H2 (`k = 2`) order for shape `s` under `name`.
constexpr schedule zero_bubble_handcrafted(std::string_view name, shape s, int k) {
  schedule out = make_schedule(name, s, s.ranks, placement_kind::loop);
  const int p = s.ranks, m = s.microbatches;
  for (int r = 0; r < p; ++r) {
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(static_cast<std::size_t>(3 * m));
    int warmup = k * (p - 1 - r) < m ? k * (p - 1 - r) : m;
    int nf = 0, nw = 0;
    for (; nf < warmup; ++nf) prog.push_back(forward(nf, r));
    for (int i = 0; i < m; ++i) {
      if (nf < m) prog.push_back(forward(nf++, r));
      prog.push_back(backward_input(i, r));
      if (i >= k * r) prog.push_back(backward_weight(nw++, r));
    }
    while (nw < m) prog.push_back(backward_weight(nw++, r));
  }
  return out;
}

}  // namespace loom::detail
