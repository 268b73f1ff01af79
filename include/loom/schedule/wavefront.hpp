// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The slot ("wavefront") construction shared by `chimera`, `bitpipe` and `hanayo`.
//!
//! Time is cut into slots; a forward and a fused backward of one virtual stage each take one
//! slot. Microbatch `j` enters its path at slot `t_j`; it runs `F(j,s)` in slot `t_j + s` and
//! `BW(j,s)` in slot `t_j + 2S - 1 - s`, i.e. it moves one stage per slot forward and back with
//! no waiting. Microbatches enter in *units*: a unit injects one microbatch every 2 slots per
//! direction, and unit `u` starts at slot `u * 2vP` (v = stages per rank per direction), the
//! work one rank does for one unit, so consecutive units overlap exactly as far as the slots
//! allow. This is how the authors' own generator builds Chimera (Shigangli/Chimera,
//! `chimera_pipeline_rank.py`: every micro-batch advances one stage per step, a new one enters
//! every second step, a new unit enters when the previous unit's first micro-batch is done)
//! and it reproduces BitPipe's published timeline (wuhouming/BitPipe,
//! `docs/BitPipe_images/BitPipe-v.svg`).
//!
//! Each rank's program is its actions sorted by slot. Every dependency of an action sits in a
//! strictly earlier slot, so the slot order is a topological order of the whole schedule: the
//! programs never deadlock, whatever the placement, and ties (two actions of one rank in one
//! slot, which happens only where a family's conflict-freedom condition, such as an even rank
//! count, does not hold) may be broken either way; we put the backward first.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/shape.hpp"

namespace loom::detail {

//! Rank of stage `s` on a zigzag path over `ranks` ranks: down `0..P-1`, then up `P-1..0`,
//! then down again (a V for two stages per rank, Hanayo's wave for more).
constexpr int zigzag_rank(int s, int ranks) {
  const int seg = s / ranks, off = s % ranks;
  return seg % 2 == 0 ? off : ranks - 1 - off;
}

//! Injection slots for `m` microbatches entering in units of `per_unit[d]` microbatches per
//! direction `d` (directions filled in order within a unit), one every 2 slots per direction,
//! units `unit_len` slots apart. Writes each microbatch's direction to `dir`.
constexpr std::vector<long> unit_injections(int m, const std::vector<int>& per_unit, long unit_len,
                                            std::vector<int>& dir) {
  std::vector<long> inject;
  inject.reserve(static_cast<std::size_t>(m));
  dir.assign(static_cast<std::size_t>(m), 0);
  for (long u = 0; static_cast<int>(inject.size()) < m; ++u)
    for (std::size_t d = 0; d < per_unit.size(); ++d)
      for (int i = 0; i < per_unit[d] && static_cast<int>(inject.size()) < m; ++i) {
        dir[inject.size()] = static_cast<int>(d);
        inject.push_back(u * unit_len + 2L * i);
      }
  return inject;
}

//! Fills `out.programs` with the slot order for the injection slots `inject` (one per
//! microbatch). `out.stages`, `out.stage_to_rank` and `out.mb_direction` must be set.
constexpr void wavefront_programs(schedule& out, const std::vector<long>& inject) {
  struct item {
    long slot;
    int backward;  // 0: backward first on a tie
    int mb;
    action a;
  };
  const int S = out.stages;
  std::vector<std::vector<item>> per_rank(static_cast<std::size_t>(out.ranks));
  for (int j = 0; j < out.microbatches; ++j) {
    const long t = inject[static_cast<std::size_t>(j)];
    for (int s = 0; s < S; ++s) {
      auto r = static_cast<std::size_t>(out.rank_of(j, s));
      per_rank[r].push_back({t + s, 1, j, forward(j, s)});
      per_rank[r].push_back({t + 2L * S - 1 - s, 0, j, backward(j, s)});
    }
  }
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    auto& items = per_rank[r];
    std::sort(items.begin(), items.end(), [](const item& x, const item& y) {
      if (x.slot != y.slot) return x.slot < y.slot;
      if (x.backward != y.backward) return x.backward < y.backward;
      return x.mb < y.mb;
    });
    auto& prog = out.programs[r];
    prog.clear();
    prog.reserve(items.size());
    for (auto const& it : items) prog.push_back(it.a);
  }
}

//! A complete wavefront schedule: `S` stages per path, `directions` paths whose stage `s` runs on
//! `place(d, s)`, `per_unit[d]` microbatches of direction `d` per unit, units `unit_len` slots
//! apart. `chunks` and `param_copies` are recorded as given.
template <class Place>
constexpr schedule wavefront_schedule(std::string_view name, shape sh, int stages, int chunks, int directions,
                                      int param_copies, placement_kind kind, const std::vector<int>& per_unit,
                                      long unit_len, Place place) {
  schedule out;
  out.name = text(name);
  out.ranks = sh.ranks;
  out.microbatches = sh.microbatches;
  out.chunks = chunks;
  out.stages = stages;
  out.directions = directions;
  out.param_copies = param_copies;
  out.placement = kind;
  out.stage_to_rank.resize(static_cast<std::size_t>(directions * stages), 0);
  for (int d = 0; d < directions; ++d)
    for (int st = 0; st < stages; ++st) out.stage_to_rank[static_cast<std::size_t>(d * stages + st)] = place(d, st);
  out.programs.resize(static_cast<std::size_t>(sh.ranks));
  std::vector<int> dir;
  std::vector<long> inject = unit_injections(sh.microbatches, per_unit, unit_len, dir);
  if (directions > 1) out.mb_direction = dir;
  wavefront_programs(out, inject);
  return out;
}

}  // namespace loom::detail
