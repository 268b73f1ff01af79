// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::gather_timeline`: every rank's measured timeline of a step (`pipeline::last_timeline()`)
//! on every rank, for drawing it (`loom/render/measured.hpp`) or checking it. Host code over a
//! `loom::communicator`: threads, MPI, or the host side of a device communicator.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/exec/action_timing.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! Every rank's `mine` (its `pipeline::last_timeline()`), on every rank, rank 0's first, each
//! rank's in its own order. Collective: every rank of `comm` calls it, in the same order relative
//! to its other collectives. Two all-gathers (the counts, then the actions packed as doubles).
//! Starts stay on each rank's clock (seconds from its own `step` entry): ranks that are threads
//! or processes of one machine enter a step within a barrier's latency of each other.
template <communicator C>
std::vector<measured_action> gather_timeline(C& comm, std::span<const measured_action> mine) {
  constexpr std::size_t fields = 8;
  const auto P = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> counts(P, 0);
  const std::vector<std::int64_t> my_count{static_cast<std::int64_t>(mine.size())};
  comm.all_gather(std::span<const std::int64_t>(my_count), std::span<std::int64_t>(counts));
  std::size_t most = 0;
  for (auto c : counts) most = std::max(most, static_cast<std::size_t>(c));
  std::vector<double> packed(most * fields, 0.0), all(P * most * fields, 0.0);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const measured_action& t = mine[i];
    double* p = packed.data() + i * fields;
    p[0] = static_cast<double>(static_cast<int>(t.kind));
    p[1] = t.microbatch;
    p[2] = t.stage;
    p[3] = t.rank;
    p[4] = t.peer;
    p[5] = t.in_fb ? 1 : 0;
    p[6] = t.start;
    p[7] = t.seconds;
  }
  if (most > 0) comm.all_gather(std::span<const double>(packed), std::span<double>(all));
  std::vector<measured_action> out;
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t i = 0; i < static_cast<std::size_t>(counts[r]); ++i) {
      const double* p = all.data() + (r * most + i) * fields;
      out.push_back({.kind = static_cast<op>(static_cast<int>(p[0])), .microbatch = static_cast<int>(p[1]),
                     .stage = static_cast<int>(p[2]), .rank = static_cast<int>(p[3]), .peer = static_cast<int>(p[4]),
                     .in_fb = p[5] != 0, .start = p[6], .seconds = p[7]});
    }
  return out;
}

//! What rank `r`'s measured timeline holds, times aside: one entry per action of its program in
//! `lowered` (a lowered schedule, as `pipeline::lowered()` gives it), an `FB` as its forward half
//! then its backward half (`in_fb`), transfers with their `peer`. Compare a measured timeline's
//! kinds, microbatches, stages and peers with it to check that a step ran its program.
inline std::vector<measured_action> expected_timeline(const schedule& lowered, int r) {
  std::vector<measured_action> out;
  for (auto const& a : lowered.programs.at(static_cast<std::size_t>(r))) {
    if (a.kind == op::FB) {
      out.push_back({.kind = op::F, .microbatch = a.mb, .stage = a.stage, .rank = r, .in_fb = true});
      out.push_back({.kind = a.bkind, .microbatch = a.bmb, .stage = a.bstage, .rank = r, .in_fb = true});
    } else {
      const bool transfer = a.kind == op::send || a.kind == op::recv;
      out.push_back({.kind = a.kind, .microbatch = a.mb, .stage = a.stage, .rank = r, .peer = transfer ? a.peer : -1});
    }
  }
  return out;
}

//! Whether `got` (one rank's timeline) ran exactly `want` (its `expected_timeline`) in order:
//! same kinds, microbatches, stages, peers and FB halves; times are not compared.
inline bool same_actions(std::span<const measured_action> got, std::span<const measured_action> want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].kind != want[i].kind || got[i].microbatch != want[i].microbatch || got[i].stage != want[i].stage ||
        got[i].peer != want[i].peer || got[i].in_fb != want[i].in_fb || got[i].rank != want[i].rank)
      return false;
  return true;
}

}  // namespace loom
