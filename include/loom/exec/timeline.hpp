// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::gather_timeline`: every rank's measured timeline of a step (`pipeline::last_timeline()`)
//! on every rank, for drawing it (`loom/render/measured.hpp`) or checking it. Host code over any
//! loom communicator's host all-reduces: threads, MPI, `cuda_local`, `nccl`.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/exec/action_timing.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! What `gather_timeline` needs of a communicator: its rank, its size and host all-reduces (every
//! loom communicator has them: threads, MPI, and the host side of `cuda_local` and `nccl`).
template <class C>
concept host_reducing = requires(C& c, std::span<std::int64_t> i, std::span<double> d) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  c.all_reduce(i, reduce_op::max);
  c.all_reduce(d, reduce_op::sum);
};

//! Every rank's `mine` (its `pipeline::last_timeline()`), on every rank, rank 0's first, each
//! rank's in its own order. Collective: every rank of `comm` calls it, in the same order relative
//! to its other collectives. Two host all-reduces (the longest count, then every rank's actions
//! packed as doubles in its own slot). Starts stay on each rank's clock (seconds from its own
//! `step` entry on the host; from its step's first event on a device): ranks that are threads or
//! processes of one machine enter a step within a barrier's latency of each other.
template <host_reducing C>
std::vector<measured_action> gather_timeline(C& comm, std::span<const measured_action> mine) {
  constexpr std::size_t fields = 10;  // present, kind, microbatch, stage, rank, peer, in_fb, start, seconds, update
  const auto P = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<std::int64_t> most_v{static_cast<std::int64_t>(mine.size())};
  comm.all_reduce(std::span<std::int64_t>(most_v), reduce_op::max);
  const auto most = static_cast<std::size_t>(most_v[0]);
  std::vector<measured_action> out;
  if (most == 0) return out;
  std::vector<double> all(P * most * fields, 0.0);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const measured_action& t = mine[i];
    double* p = all.data() + (me * most + i) * fields;
    p[0] = 1;
    p[1] = static_cast<double>(static_cast<int>(t.kind));
    p[2] = t.microbatch;
    p[3] = t.stage;
    p[4] = t.rank;
    p[5] = t.peer;
    p[6] = t.in_fb ? 1 : 0;
    p[7] = t.start;
    p[8] = t.seconds;
    p[9] = t.update ? 1 : 0;
  }
  comm.all_reduce(std::span<double>(all), reduce_op::sum);  // each slot has one writer: the sum is exact
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t i = 0; i < most; ++i) {
      const double* p = all.data() + (r * most + i) * fields;
      if (p[0] == 0) break;
      out.push_back({.kind = static_cast<op>(static_cast<int>(p[1])), .microbatch = static_cast<int>(p[2]),
                     .stage = static_cast<int>(p[3]), .rank = static_cast<int>(p[4]), .peer = static_cast<int>(p[5]),
                     .in_fb = p[6] != 0, .update = p[9] != 0, .start = p[7], .seconds = p[8]});
    }
  return out;
}

//! Calibration input from one rank's measured timeline `t` (in its order): one `action_timing`
//! per stage call, timed from the end of the rank's previous action (a wait for a receive, a send
//! posted, the previous call) to its own end, so the host work the pipeline does between actions
//! (handing out and zeroing buffers; in deterministic mode a weight-gradient slot per microbatch)
//! counts in the action it prepares. `loom::calibrate` over these predicts the step as the host
//! runs it; over `pipeline::last_timings()` (the calls alone) it predicts the time in stage calls.
//! The time before the first action and after the last is not in any (the step's own work). An
//! update entry (`measured_action::update`) stays one: its time from its action's end to its own.
inline std::vector<action_timing> occupied_timings(std::span<const measured_action> t) {
  std::vector<action_timing> out;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (!is_compute(t[i].kind)) continue;
    const double end = t[i].start + t[i].seconds;
    const double from = i == 0 ? t[i].start : std::min(t[i].start, t[i - 1].start + t[i - 1].seconds);
    out.push_back({.kind = t[i].kind, .microbatch = t[i].microbatch, .stage = t[i].stage, .rank = t[i].rank,
                   .in_fb = t[i].in_fb, .update = t[i].update, .seconds = end - from});
  }
  return out;
}

//! What rank `r`'s measured timeline holds, times aside: one entry per action of its program in
//! `lowered` (a lowered schedule, as `pipeline::lowered()` gives it), an `FB` as its forward half
//! then its backward half (`in_fb`), transfers with their `peer`. Compare a measured timeline's
//! kinds, microbatches, stages and peers with it to check that a step ran its program. An action
//! carrying `action::update` is followed by its update entry (`update = true`).
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
    if (a.update && (a.kind == op::W || a.kind == op::BW))  // the validator allows no other
      out.push_back({.kind = a.kind, .microbatch = a.mb, .stage = a.stage, .rank = r, .update = true});
  }
  return out;
}

//! Whether `got` (one rank's timeline) ran exactly `want` (its `expected_timeline`) in order:
//! same kinds, microbatches, stages, peers, FB halves and updates; times are not compared.
inline bool same_actions(std::span<const measured_action> got, std::span<const measured_action> want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].kind != want[i].kind || got[i].microbatch != want[i].microbatch || got[i].stage != want[i].stage ||
        got[i].peer != want[i].peer || got[i].in_fb != want[i].in_fb || got[i].rank != want[i].rank ||
        got[i].update != want[i].update)
      return false;
  return true;
}

}  // namespace loom
