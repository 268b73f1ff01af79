// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Chrome / Perfetto trace (the Trace Event Format's JSON object form) of a simulated
//! schedule: one process, one thread per rank (named `rank r`, sorted by rank), one complete
//! event (`"ph": "X"`) per compute action with its simulated start and duration. `ts` and `dur`
//! are microseconds: simulated time x `us_per_unit` (default 1000: a cost unit reads as a
//! millisecond, the unit of the Zero Bubble paper's profiled F/B/W). Each event's `args` carry
//! `op`, `mb`, `stage`, `chunk` (and `bop`, `bmb`, `bstage` for FB) and the unscaled
//! `start`/`end`; `otherData` carries the schedule's metrics. Open it at ui.perfetto.dev or
//! chrome://tracing. Written by hand (std-only), with RFC 8259 string escaping.

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

//! Knobs of `render_trace`.
struct trace_options {
  double us_per_unit = 1000;  //!< microseconds per simulated time unit
};

//! Trace Event Format JSON of `s` as simulated by `sim` (see the file comment). Throws
//! `schedule_error` if `sim` is not a complete simulation of `s`, `config_error` for a
//! non-positive or non-finite `us_per_unit`.
inline std::string render_trace(const schedule& s, const simulation& sim, const trace_options& o = {}) {
  detail::require_drawable(s, sim);
  if (!(o.us_per_unit > 0) || !std::isfinite(o.us_per_unit))
    throw config_error("trace time scale " + detail::number(o.us_per_unit) + " us per unit must be finite and > 0");
  using detail::json_string;
  using detail::number;
  using detail::to_text;
  const auto chunks = local_chunks(s);
  const bool with_chunk = detail::has_chunks(chunks);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{";
  out += "\"schedule\":" + json_string(s.name) + ",\"ranks\":" + to_text(s.ranks) +
         ",\"microbatches\":" + to_text(s.microbatches) + ",\"chunks\":" + to_text(s.chunks) +
         ",\"stages\":" + to_text(s.stages) + ",\"placement\":" + json_string(to_string(s.placement)) +
         ",\"makespan\":" + number(sim.makespan) + ",\"bubble_ratio\":" + number(sim.bubble_ratio) +
         ",\"bubble_rate\":" + number(sim.bubble_rate) + ",\"us_per_unit\":" + number(o.us_per_unit) + "},";
  out += "\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":" +
         json_string(s.name + " " + to_text(s.ranks) + "x" + to_text(s.microbatches)) + "}}";
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    std::string tid = to_text(static_cast<long long>(r));
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + tid +
           ",\"args\":{\"name\":\"rank " + tid + "\"}}";
    out += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":" + tid +
           ",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    std::string tid = to_text(static_cast<long long>(r));
    for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
      auto const& a = s.programs[r][i];
      if (!is_compute(a.kind)) continue;
      auto t = sim.times[r][i];
      out += ",\n{\"name\":" + json_string(detail::action_label(s, chunks, a, with_chunk)) +
             ",\"cat\":" + json_string(to_string(a.kind)) + ",\"ph\":\"X\",\"pid\":0,\"tid\":" + tid +
             ",\"ts\":" + number(t.start * o.us_per_unit) + ",\"dur\":" + number((t.end - t.start) * o.us_per_unit) +
             ",\"args\":{\"op\":" + json_string(to_string(a.kind)) + ",\"mb\":" + to_text(a.mb) +
             ",\"stage\":" + to_text(a.stage) + ",\"chunk\":" + to_text(detail::chunk_of(s, chunks, a.mb, a.stage));
      if (a.kind == op::FB)
        out += ",\"bop\":" + json_string(to_string(a.bkind)) + ",\"bmb\":" + to_text(a.bmb) +
               ",\"bstage\":" + to_text(a.bstage);
      out += ",\"start\":" + number(t.start) + ",\"end\":" + number(t.end) + "}}";
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace loom
