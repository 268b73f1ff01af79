// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Calibration: from a few measured steps to a `loom::cost_model` that `simulate` turns into a
//! prediction of the step.
//!
//! 1. Run a few steps with `pipeline_options::measure`; after each, every rank hands its
//!    `pipeline::last_timings()` to `gather_timings`, which gives every rank all ranks' timings.
//! 2. `measure_link` times a short ping-pong between two ranks over the communicator and fits
//!    Hockney's model `t(n) = alpha + beta * n` to it (R. W. Hockney, "The communication challenge
//!    for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20(3), 1994). The link is measured
//!    on its own, never fitted to the step time, so the prediction stays a prediction.
//! 3. `gather_stage_sizes` reads the bytes each stage sends (its output) and holds (its weight
//!    gradient, as large as its parameters) from the pipeline's stages.
//! 4. `calibrate(schedule, timings, sizes, options)` gives the model: per virtual stage the
//!    *median* duration of its `F`, `B` and `W` calls (see `calibrate` for why the median, and for
//!    schedules that only run a fused `BW`).
//! 5. `simulate(schedule, model).makespan` predicts the step; `cost_file_json` /
//!    `write_cost_file` write the model as the JSON cost file the CLI reads (`--costs FILE`).
//!
//! Everything here is host code over a `loom::communicator`; calibration of device spaces is not
//! done yet (`pipeline::last_timings()` is empty there). Nothing here is on a step's hot path: it
//! allocates freely.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/exec/action_timing.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/cost_model.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The sizes of one virtual stage that a cost model records (bytes).
struct stage_size {
  double message_bytes = 0;  //!< bytes of the activation the stage sends to the next (the gradient back is as large)
  double param_bytes = 0;    //!< bytes of the stage's parameters
  friend constexpr bool operator==(const stage_size&, const stage_size&) = default;
};

//! Knobs of `calibrate` (designated initialisers).
struct calibration_options {
  //! For a stage whose backward was measured only as a fused `BW`: the part of it written as
  //! `w` (`w = w_fraction * BW`, `b = BW - w`). The default 0 keeps the whole backward in `b`
  //! (`w = 0`), which predicts exactly the schedule that was measured (its `BW` costs `b + w`)
  //! but makes a split (`B`/`W`) schedule simulated from the same file look as if its `W` were
  //! free; measure a split schedule (zb-h1, ...) to calibrate those.
  double w_fraction = 0;
  link_cost intra{};        //!< link between ranks of one node (`measure_link`)
  link_cost inter{};        //!< link between nodes (ignored when `ranks_per_node` is 0)
  int ranks_per_node = 0;   //!< as `cost_model::ranks_per_node` (0: one node)
  double mem_w_ratio = 1;   //!< as `cost_model::mem_w_ratio`
};

namespace detail {

//! The median of `v` (the mean of the two middle values for an even count); `v` is reordered.
inline double median(std::vector<double>& v) {
  if (v.empty()) return 0;
  const std::size_t n = v.size(), h = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const double hi = v[h];
  if (n % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h));
  return (lo + hi) / 2;
}

//! `v` as a JSON number (finite: `check_model` ran), with 9 significant digits.
inline std::string json_number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace detail

//! The cost model of schedule `s` measured by `timings` (every rank's stage calls over a few
//! steps, e.g. from `gather_timings`): one `stage_cost` per virtual stage of `s` with
//! - `f`, `b`, `w`: the median duration of that stage's `F`, `B` and `W` calls (the halves of `FB`
//!   actions count as the plain kinds: the host runs them one after the other, so `fb = -1`,
//!   their sum). The median, not the mean: the disturbances of a shared host (preemption, page
//!   faults on first touch, another process's burst) only ever lengthen a call, and a few long
//!   outliers move the mean but not the median; over `m` microbatches times a few steps every
//!   stage has enough calls for it to be stable.
//! - a stage with no `B`/`W` calls but fused `BW` ones: `b + w` is the median `BW`, split by
//!   `o.w_fraction` (default: all in `b`, `w = 0`; see `calibration_options`).
//! - `activation`: `s.stage_fraction()` (`P / S`, the normative unit of ARCHITECTURE.md, so memory
//!   limits mean what they mean with unit costs); `message_bytes`, `param_bytes`: from `sizes`
//!   (one per virtual stage, or empty for 0).
//! - `update`: the median of the stage's update timings (`action_timing::update`: a versioned
//!   schedule's optimizer step with its version copies), 0 when it has none.
//! - links, `ranks_per_node` and `mem_w_ratio` from `o`.
//! Throws `config_error` naming the stage when a stage has no `F` or no backward timing, when a
//! timing names a stage outside `s`, or when `sizes` has neither 0 nor `s.stages` entries.
inline cost_model calibrate(const schedule& s, std::span<const action_timing> timings, std::span<const stage_size> sizes,
                            const calibration_options& o = {}) {
  const int S = s.stages;
  if (S < 1) throw config_error("calibrate: schedule " + s.name + " has no stages");
  if (!sizes.empty() && sizes.size() != static_cast<std::size_t>(S))
    throw config_error("calibrate: " + std::to_string(sizes.size()) + " stage sizes given for schedule " + s.name + " of " +
                       std::to_string(S) + " virtual stages (give one per stage, or none)");
  if (!(o.w_fraction >= 0 && o.w_fraction <= 1))
    throw config_error("calibrate: w_fraction must be in [0, 1] (got " + std::to_string(o.w_fraction) + ")");
  const auto uS = static_cast<std::size_t>(S);
  std::vector<std::vector<double>> f(uS), b(uS), w(uS), bw(uS), u(uS);
  for (const action_timing& t : timings) {
    if (t.stage < 0 || t.stage >= S)
      throw config_error("calibrate: a timing names stage " + std::to_string(t.stage) + " but schedule " + s.name + " has " +
                         std::to_string(S) + " virtual stages");
    const auto st = static_cast<std::size_t>(t.stage);
    if (t.update) {
      if (t.kind != op::W && t.kind != op::BW)
        throw config_error("calibrate: an update timing has kind " + std::string(to_string(t.kind)) + " (updates follow W or BW)");
      u[st].push_back(t.seconds);
      continue;
    }
    switch (t.kind) {
      case op::F: f[st].push_back(t.seconds); break;
      case op::B: b[st].push_back(t.seconds); break;
      case op::W: w[st].push_back(t.seconds); break;
      case op::BW: bw[st].push_back(t.seconds); break;
      default: throw config_error("calibrate: a timing has kind " + std::string(to_string(t.kind)) + " (only F, B, W and BW are timed)");
    }
  }
  cost_model m;
  m.stages.resize(uS);
  for (std::size_t st = 0; st < uS; ++st) {
    stage_cost& c = m.stages[st];
    if (f[st].empty()) throw config_error("calibrate: no forward timing of stage " + std::to_string(st));
    c.f = detail::median(f[st]);
    if (!b[st].empty() || !w[st].empty()) {
      if (b[st].empty() || w[st].empty())
        throw config_error("calibrate: stage " + std::to_string(st) + " has " + (b[st].empty() ? "W" : "B") +
                           " timings but no " + (b[st].empty() ? "B" : "W") + " timings");
      c.b = detail::median(b[st]);
      c.w = detail::median(w[st]);
    } else if (!bw[st].empty()) {
      const double full = detail::median(bw[st]);
      c.w = o.w_fraction * full;
      c.b = full - c.w;
    } else {
      throw config_error("calibrate: no backward timing of stage " + std::to_string(st));
    }
    c.fb = -1;
    c.update = u[st].empty() ? 0 : detail::median(u[st]);
    c.activation = s.stage_fraction();
    if (!sizes.empty()) {
      c.message_bytes = sizes[st].message_bytes;
      c.param_bytes = sizes[st].param_bytes;
    }
  }
  m.intra = o.intra;
  m.inter = o.ranks_per_node > 0 ? o.inter : o.intra;
  m.ranks_per_node = o.ranks_per_node;
  m.mem_w_ratio = o.mem_w_ratio;
  if (text r = detail::check_model(m); !r.empty()) throw config_error("calibrate: " + std::string(r));
  return m;
}

//! Every rank's `mine` (its `pipeline::last_timings()`, or several steps' worth), on every rank,
//! rank 0's first. Collective: every rank of `comm` calls it, in the same order relative to its
//! other collectives. Two all-gathers (the counts, then the timings packed as doubles).
template <communicator C>
std::vector<action_timing> gather_timings(C& comm, std::span<const action_timing> mine) {
  constexpr std::size_t fields = 7;
  const auto P = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> counts(P, 0);
  const std::vector<std::int64_t> my_count{static_cast<std::int64_t>(mine.size())};
  comm.all_gather(std::span<const std::int64_t>(my_count), std::span<std::int64_t>(counts));
  std::size_t most = 0;
  for (auto c : counts) most = std::max(most, static_cast<std::size_t>(c));
  std::vector<double> packed(most * fields, 0.0), all(P * most * fields, 0.0);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const action_timing& t = mine[i];
    double* p = packed.data() + i * fields;
    p[0] = static_cast<double>(static_cast<int>(t.kind));
    p[1] = t.microbatch;
    p[2] = t.stage;
    p[3] = t.rank;
    p[4] = t.in_fb ? 1 : 0;
    p[5] = t.seconds;
    p[6] = t.update ? 1 : 0;
  }
  if (most > 0) comm.all_gather(std::span<const double>(packed), std::span<double>(all));
  std::vector<action_timing> out;
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t i = 0; i < static_cast<std::size_t>(counts[r]); ++i) {
      const double* p = all.data() + (r * most + i) * fields;
      out.push_back({.kind = static_cast<op>(static_cast<int>(p[0])), .microbatch = static_cast<int>(p[1]),
                     .stage = static_cast<int>(p[2]), .rank = static_cast<int>(p[3]), .in_fb = p[4] != 0, .update = p[6] != 0,
                     .seconds = p[5]});
    }
  return out;
}

//! The sizes of every virtual stage of the pipeline `p` (a `loom::pipeline` over `comm`), on every
//! rank: `message_bytes` = the stage's output (`output_size()` elements; the last stage's output
//! is the loss terms, sent nowhere, so it is reported as 0), `param_bytes` = its weight gradient
//! (as large as its parameters). Collective over `comm` (one all-reduce, max: the two copies of a
//! two-path schedule's stage hold the same sizes).
template <class Pipeline, communicator C>
std::vector<stage_size> gather_stage_sizes(Pipeline& p, C& comm) {
  using T = typename Pipeline::value_type;
  const int S = p.lowered().stages;
  std::vector<double> v(2 * static_cast<std::size_t>(S), 0.0);
  auto stages = p.stages();
  auto ids = p.ids();
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const auto st = static_cast<std::size_t>(ids[i].stage);
    const double out = ids[i].stage == S - 1 ? 0.0 : static_cast<double>(stages[i].output_size() * sizeof(T));
    v[2 * st] = std::max(v[2 * st], out);
    v[2 * st + 1] = std::max(v[2 * st + 1], static_cast<double>(std::span<T>(stages[i].weight_grad()).size_bytes()));
  }
  comm.all_reduce(std::span<double>(v), reduce_op::max);
  std::vector<stage_size> out(static_cast<std::size_t>(S));
  for (std::size_t st = 0; st < out.size(); ++st) out[st] = {.message_bytes = v[2 * st], .param_bytes = v[2 * st + 1]};
  return out;
}

//! Fits Hockney's `t(n) = alpha + beta * n` (see the file comment) to one-way message times
//! `seconds[i]` at sizes `bytes[i]` by least squares; a negative term is clamped to 0 (and the
//! other refitted), as a link cannot be faster than free. One size: `alpha` only.
inline link_cost fit_link(std::span<const double> bytes, std::span<const double> seconds) {
  const std::size_t n = std::min(bytes.size(), seconds.size());
  if (n == 0) return {};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sx += bytes[i];
    sy += seconds[i];
    sxx += bytes[i] * bytes[i];
    sxy += bytes[i] * seconds[i];
  }
  const double N = static_cast<double>(n), den = N * sxx - sx * sx;
  if (n == 1 || den <= 0) return {.alpha = std::max(0.0, sy / N), .beta = 0};
  double beta = (N * sxy - sx * sy) / den, alpha = (sy - beta * sx) / N;
  if (beta < 0) return {.alpha = std::max(0.0, sy / N), .beta = 0};
  if (alpha < 0) return {.alpha = 0, .beta = sxx > 0 ? std::max(0.0, sxy / sxx) : 0};
  return {.alpha = alpha, .beta = beta};
}

//! Measures the link between ranks `a` and `b` of `comm` with a ping-pong (Hockney 1994): for
//! each size in `bytes`, `warmup` round trips, then `reps` timed ones; the one-way time of a size
//! is the median round trip over 2 (the median for the same reason as in `calibrate`). Returns
//! `fit_link` of those, the same on every rank. Collective: every rank calls it (ranks other than
//! `a` and `b` only join the final all-reduce that hands out rank `a`'s result). Run it while the
//! ranks do nothing else: it measures the link, not a step. A communicator of one rank: {0, 0}.
template <communicator C>
link_cost measure_link(C& comm, std::span<const std::size_t> bytes, int a = 0, int b = 1, int reps = 20, int warmup = 3) {
  if (comm.size() < 2 || bytes.empty()) return {};
  if (a == b || a < 0 || b < 0 || a >= comm.size() || b >= comm.size())
    throw config_error("measure_link: ranks " + std::to_string(a) + " and " + std::to_string(b) +
                       " must be two different ranks of a communicator of " + std::to_string(comm.size()));
  const int me = comm.rank();
  std::vector<double> result(2, 0.0);
  if (me == a || me == b) {
    const int peer = me == a ? b : a;
    std::vector<std::byte> buf(*std::max_element(bytes.begin(), bytes.end()));
    std::vector<double> xs, ys, trips;
    for (std::size_t n : bytes) {
      std::span<std::byte> msg(buf.data(), n);
      trips.clear();
      for (int k = 0; k < warmup + reps; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        if (me == a) {
          loom::send(comm, peer, std::span<const std::byte>(msg));
          loom::recv(comm, peer, msg);
        } else {
          loom::recv(comm, peer, msg);
          loom::send(comm, peer, std::span<const std::byte>(msg));
        }
        if (k >= warmup) trips.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      xs.push_back(static_cast<double>(n));
      ys.push_back(detail::median(trips) / 2);
    }
    if (me == a) {
      const link_cost l = fit_link(xs, ys);
      result = {l.alpha, l.beta};
    }
  }
  comm.all_reduce(std::span<double>(result), reduce_op::sum);
  return {.alpha = result[0], .beta = result[1]};
}

//! `m` as the JSON cost file that the CLI reads (`loom simulate --costs FILE`; the schema of
//! docs/costs.md): `{"stages":[{"f":..,"b":..,"w":..,"fb":..,"activation":..,"message_bytes":..,
//! "param_bytes":..[,"update":..]},...],"links":{"intra":{"alpha":..,"beta":..},"inter":{...}},
//! "ranks_per_node":N,"mem_w_ratio":r}`, one stage per line, numbers with 9 significant digits
//! (`%.9g`), ending with a newline. Throws `config_error` when `m` breaks a rule of
//! `detail::check_model` (JSON has no infinities).
inline std::string cost_file_json(const cost_model& m) {
  if (text r = detail::check_model(m); !r.empty()) throw config_error(std::string(r));
  using detail::json_number;
  std::string out = "{\n  \"stages\": [\n";
  for (std::size_t i = 0; i < m.stages.size(); ++i) {
    const stage_cost& c = m.stages[i];
    out += "    {\"f\": " + json_number(c.f) + ", \"b\": " + json_number(c.b) + ", \"w\": " + json_number(c.w) +
           ", \"fb\": " + json_number(c.fb) + ", \"activation\": " + json_number(c.activation) +
           ", \"message_bytes\": " + json_number(c.message_bytes) + ", \"param_bytes\": " + json_number(c.param_bytes) +
           (c.update != 0 ? ", \"update\": " + json_number(c.update) : std::string()) + "}" +
           (i + 1 < m.stages.size() ? ",\n" : "\n");
  }
  auto link = [](const link_cost& l) { return "{\"alpha\": " + json_number(l.alpha) + ", \"beta\": " + json_number(l.beta) + "}"; };
  out += "  ],\n  \"links\": {\"intra\": " + link(m.intra) + ", \"inter\": " + link(m.inter) + "},\n";
  out += "  \"ranks_per_node\": " + std::to_string(m.ranks_per_node) + ",\n";
  out += "  \"mem_w_ratio\": " + json_number(m.mem_w_ratio) + "\n}\n";
  return out;
}

//! Writes `cost_file_json(m)` to `path`; throws `config_error` naming the path when it cannot.
inline void write_cost_file(const std::string& path, const cost_model& m) {
  const std::string json = cost_file_json(m);
  // <cstdio> rather than <fstream>: the stream classes cost every includer of loom/exec.hpp.
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) throw config_error("write_cost_file: cannot write " + path);
}

}  // namespace loom
