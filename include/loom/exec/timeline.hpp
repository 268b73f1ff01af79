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

}  // namespace loom
