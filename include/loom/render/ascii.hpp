// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! ASCII timeline of a simulated schedule: ranks as rows, time as columns.
//!
//! One column is `step` time units (default: the shortest compute action that takes time, so every action gets
//! at least one column). An action covers the columns from its quantised start to its
//! quantised end; its first cell holds its label (`F3`, `B3`, `W3`, `BW3`, `F3+B1` for an
//! overlapped pair, with `.k` for model chunk k when a rank holds several stages), the cells it
//! continues over hold `~`, idle cells `.`. Wide timelines wrap into blocks of at most `width`
//! characters, each with its own time ruler, so p = 16, m = 64 stays readable; a larger `step`
//! scales them down instead. Every action keeps at least its own cell: when rounding to a coarse
//! step would overlap two actions of a rank, the later one moves right (a coarse row can end
//! late); with the default step nothing moves, unless an action takes no time (a vocabulary pass
//! whose cost is 0 still gets its cell).
//!
//! `loom render --schedule 1f1b --ranks 2 --microbatches 2`:
//! ```
//! 1f1b: 2 ranks x 2 microbatches, makespan 9, bubble ratio 0.333 (1 column = 1 time unit)
//!      0   1   2   3   4   5   6   7   8
//! r0 | F0  F1  .   .   BW0 ~~~ .   BW1 ~~~
//! r1 | .   F0  BW0 ~~~ F1  BW1 ~~~ .   .
//! F forward, BW fused backward; ~ continues, . idle
//! ```

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/render/common.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! Knobs of `render_ascii`.
struct ascii_options {
  double step = 0;      //!< time units per column; 0: the shortest compute action
  int width = 120;      //!< wrap into blocks of at most this many characters per line; 0: never
  bool header = true;   //!< first line: schedule, shape, makespan, bubble, scale
  bool legend = true;   //!< last line: what the labels mean
};

//! One quantised cell row of `render_ascii`: the label of each column ("" = idle, "~" =
//! continuation). Exposed so tests and other renderers can check the quantisation.
struct ascii_grid {
  double step = 1;                            //!< time units per column
  double origin = 0;                          //!< time of column 0
  std::size_t columns = 0;                    //!< number of columns
  std::vector<std::vector<std::string>> cells;  //!< `[rank][column]`
};

//! The quantised grid `render_ascii` prints (see the file comment). Throws `schedule_error`
//! if `sim` is not a complete simulation of `s`, and `config_error` for a negative or non-finite
//! step.
inline ascii_grid ascii_cells(const schedule& s, const simulation& sim, double step = 0) {
  detail::require_drawable(s, sim);
  if (!(step >= 0) || !std::isfinite(step))
    throw config_error("ascii step " + detail::number(step) + " must be a finite number >= 0 (0: automatic)");
  const auto chunks = local_chunks(s);
  const bool with_chunk = detail::has_chunks(chunks);
  double t0 = -1, shortest = 0;
  for (std::size_t r = 0; r < s.programs.size(); ++r)
    for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
      if (!is_compute(s.programs[r][i].kind)) continue;
      auto t = sim.times[r][i];
      if (t0 < 0 || t.start < t0) t0 = t.start;
      double d = t.end - t.start;
      if (d > 0 && (shortest == 0 || d < shortest)) shortest = d;
    }
  ascii_grid g;
  g.step = step > 0 ? step : (shortest > 0 ? shortest : 1);
  g.origin = t0 < 0 ? 0 : t0;
  g.cells.resize(s.programs.size());
  auto col = [&](double t) {
    double c = std::round((t - g.origin) / g.step);
    return static_cast<std::size_t>(c < 0 ? 0 : c);
  };
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    auto& row = g.cells[r];
    std::size_t next_free = 0;
    for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
      auto const& a = s.programs[r][i];
      if (!is_compute(a.kind)) continue;
      auto t = sim.times[r][i];
      // Actions of a rank never overlap in time; keep it so after rounding.
      std::size_t c0 = std::max(col(t.start), next_free);
      std::size_t c1 = std::max(col(t.end), c0 + 1);
      if (row.size() < c1) row.resize(c1);
      row[c0] = detail::action_label(s, chunks, a, with_chunk);
      for (std::size_t c = c0 + 1; c < c1; ++c) row[c].assign(1, '~');
      next_free = c1;
    }
    g.columns = std::max(g.columns, row.size());
  }
  for (auto& row : g.cells) row.resize(g.columns);
  return g;
}

//! ASCII timeline of `s` as simulated by `sim` (see the file comment). Throws as `ascii_cells`
//! and `config_error` for a negative width.
inline std::string render_ascii(const schedule& s, const simulation& sim, const ascii_options& o = {}) {
  if (o.width < 0) throw config_error("ascii width " + detail::to_text(o.width) + " must be >= 0 (0: no wrapping)");
  const ascii_grid g = ascii_cells(s, sim, o.step);
  std::size_t cw = 2;  // cell width: the longest label plus one space
  for (auto const& row : g.cells)
    for (auto const& c : row) cw = std::max(cw, c.size() + 1);
  std::string rank_w = detail::to_text(static_cast<long long>(s.programs.empty() ? 0 : s.programs.size() - 1));
  const std::size_t prefix = rank_w.size() + 4;  // "r12 | "
  // Ruler: a time every `every` columns, where the longest time text fits.
  std::size_t tick_w = detail::number(g.origin + static_cast<double>(g.columns) * g.step).size() + 1;
  std::size_t every = (tick_w + cw - 1) / cw;
  std::size_t per_block = g.columns == 0 ? 1 : g.columns;
  if (o.width > 0) {
    std::size_t room = static_cast<std::size_t>(o.width) > prefix + cw ? static_cast<std::size_t>(o.width) - prefix : cw;
    per_block = std::max<std::size_t>(1, room / cw);
    if (per_block > every) per_block -= per_block % every;  // blocks start on a tick
  }
  std::string out;
  if (o.header) {
    out += s.name + ": " + detail::to_text(s.ranks) + " ranks x " + detail::to_text(s.microbatches) + " microbatches";
    if (s.chunks > 1) out += ", " + detail::to_text(s.chunks) + " chunks per rank";
    out += ", makespan " + detail::rounded(sim.makespan, 4) + ", bubble ratio " + detail::rounded(sim.bubble_ratio, 3) +
           " (1 column = " + detail::number(g.step) + (g.step == 1 ? " time unit)\n" : " time units)\n");
  }
  auto trim = [](std::string line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  for (std::size_t b0 = 0; b0 < g.columns || b0 == 0; b0 += per_block) {
    std::size_t b1 = std::min(g.columns, b0 + per_block);
    if (b0 > 0) out += "\n";
    std::string ruler(prefix, ' ');
    for (std::size_t c = b0; c < b1; ++c) {
      std::string cell;
      if ((c - b0) % every == 0) cell = detail::number(g.origin + static_cast<double>(c) * g.step);
      cell.resize(cw, ' ');
      ruler += cell;
    }
    out += trim(ruler);
    for (std::size_t r = 0; r < g.cells.size(); ++r) {
      std::string name = "r";
      name += detail::to_text(static_cast<long long>(r));
      name.resize(prefix - 2, ' ');
      std::string line = name + "| ";
      for (std::size_t c = b0; c < b1; ++c) {
        std::string const& lab = g.cells[r][c];
        std::string cell = lab.empty() ? "." : (lab == "~" ? std::string(cw - 1, '~') : lab);
        cell.resize(cw, ' ');
        line += cell;
      }
      out += trim(line);
    }
    if (g.columns == 0) break;
  }
  if (o.legend) {
    constexpr int kinds = static_cast<int>(op::IB) + 1;
    bool present[kinds] = {};
    for (auto const& p : s.programs)
      for (auto const& a : p)
        if (is_compute(a.kind)) present[static_cast<int>(a.kind)] = true;
    static const char* names[kinds] = {"F forward", "B input-gradient backward", "W weight-gradient backward",
                                       "BW fused backward", "F3+B1 forward 3 overlapped with backward 1", nullptr, nullptr, nullptr, nullptr,
                                       "S output layer's forward part (vocabulary shard)", "T output layer's backward part",
                                       "IF input layer's forward part", "IB input layer's backward part"};
    std::string legend;
    for (int k = 0; k < kinds; ++k) {
      if (!present[k] || names[k] == nullptr) continue;
      if (!legend.empty()) legend += ", ";
      legend += names[k];
    }
    if (detail::has_chunks(local_chunks(s))) legend += "; .k = model chunk k of the rank";
    out += legend + "; ~ continues, . idle\n";
  }
  return out;
}

}  // namespace loom
