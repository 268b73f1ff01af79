// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Plain-text listing of per-rank programs, used by error messages (the validator renders the
//! offending neighbourhood of the grid) and by `loom render --programs`.

#include <cstddef>
#include <string>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The programs of `s` as a grid, one line per rank (`r0 | F0@s0 F1@s0 ...`). With
//! `mark_rank >= 0` the action at (`mark_rank`, `mark_pos`) is bracketed and every row shows
//! only positions within `window` of `mark_pos`; without a mark, rows show their first
//! `2 * window + 1` actions (elided parts as `...`).
constexpr text format_programs(const schedule& s, int mark_rank = -1, std::size_t mark_pos = 0,
                                      std::size_t window = 8) {
  text out;
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    auto const& p = s.programs[r];
    std::size_t lo = 0, hi = p.size() < 2 * window + 1 ? p.size() : 2 * window + 1;
    if (mark_rank >= 0) {
      lo = mark_pos > window ? mark_pos - window : 0;
      hi = mark_pos + window + 1 < p.size() ? mark_pos + window + 1 : p.size();
    }
    out += "  r" + detail::to_text(static_cast<long long>(r)) + " |";
    if (lo > 0) out += " ...";
    for (std::size_t i = lo; i < hi; ++i) {
      bool mark = static_cast<int>(r) == mark_rank && i == mark_pos;
      out += mark ? " [" : " ";
      out += to_string(p[i]);
      if (mark) out += "]";
    }
    if (hi < p.size()) out += " ...";
    out += "\n";
  }
  return out;
}

}  // namespace loom
