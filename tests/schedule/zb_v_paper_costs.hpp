// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Costs for the Zero Bubble paper's ZB-V settings (Table 8 of arXiv:2401.10241, §6), derived from
// that table itself: the paper does not publish the profiled costs of those runs. With f = b
// (Table 9 shows f/b within 2% for every model) and f + b + w = 1 (bubble rates are scale-free),
// w and c were fitted by least squares, through loom::simulate, to the 1F1B, ZB-H1 and ZB-H2
// columns of each model's three rows (nine published numbers, two unknowns per model; the
// 28.3B m=256 row was left out of the fit, its columns are mutually inconsistent under any one
// cost set). M_W/M_B = 32h/(34h+5as) (Table 1) with the model shapes of Table 3, s = 1024.
// See docs/zero-bubble-paper.md ("ZB-V").
#include <string_view>

#include <loom/schedule/shape.hpp>

#include "zb_paper_data.hpp"

namespace loom_paper {

struct zbv_derived {
  std::string_view model;
  int heads, hidden;
  double w, c;  // fitted; f = b = (1 - w) / 2
};

inline constexpr zbv_derived zbv_fitted[] = {{"6.2B", 32, 4096, 0.2517, 0.0210},
                                             {"14.6B", 40, 5120, 0.2765, 0.0200},
                                             {"28.3B", 48, 6144, 0.2752, 0.0167}};

//! The derived costs of a Table 8 row (f = b = w = 0 if the model is unknown).
inline loom::costs zbv_costs(const zbv_row& x) {
  for (auto const& d : zbv_fitted)
    if (d.model == x.model) {
      const double fb = (1 - d.w) / 2;
      return {.f = fb, .b = fb, .w = d.w, .c = d.c,
              .mem_w_ratio = 32.0 * d.hidden / (34.0 * d.hidden + 5.0 * d.heads * 1024.0)};
    }
  return {.f = 0, .b = 0, .w = 0};
}

}  // namespace loom_paper
