// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Measured timelines beside predicted ones: `render_trace` and `render_svg` over a
//! `measured_step` (every rank's `pipeline::last_timeline()`, gathered with `gather_timeline`,
//! and optionally the simulation of the same schedule with the costs the prediction used). Both
//! share one time axis in seconds from the step's start, so where reality departs from the model
//! shows as boxes that no longer line up.
//!
//! - Trace (Trace Event Format, Perfetto / chrome://tracing): process 0 "measured", one thread per
//!   rank, one complete event (`"ph": "X"`) per executed action: compute halves (`cat` F, B, W,
//!   BW; `args.in_fb` for the halves of an FB), sends posted (`cat` "send") and waits for receives
//!   (`cat` "recv"), `args` naming `op`, `mb`, `stage`, `peer`. Process 1 "predicted": one event
//!   per compute action of the simulation, its times in seconds (`seconds_per_unit`).
//! - SVG: the measured rows (compute boxes in the colours of `render_svg`, waits for receives as
//!   grey boxes, posted sends as ticks), then the predicted rows, under one axis, with a subtitle
//!   giving both step times and bubbles. Every measured box is a `<rect class="measured">` and
//!   every predicted one a `<rect class="predicted">` with `data-rank`, `data-op`, `data-mb`,
//!   `data-stage`, `data-start`, `data-end` (seconds).
//!
//! The measured bubble here is 1 - (time in stage calls) / (ranks x measured step), where the
//! step is the latest end of any rank's actions; the predicted one is the simulation's.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "loom/exec/action_timing.hpp"
#include "loom/render/common.hpp"
#include "loom/render/svg.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! A measured step to draw: every rank's actions and, optionally, the prediction of the same step.
struct measured_step {
  std::span<const measured_action> actions;  //!< every rank's executed actions (`gather_timeline`)
  const simulation* predicted = nullptr;     //!< `simulate` of the same schedule; null: none drawn
  double seconds_per_unit = 1;               //!< seconds per predicted time unit (calibrated costs: 1)
};

namespace detail {

//! Throws `config_error` unless every action of `m` is drawable for `s`, and the prediction (if
//! any) is a complete simulation of `s` with a finite positive time scale.
inline void require_measured(const schedule& s, const measured_step& m) {
  for (auto const& a : m.actions) {
    if (a.rank < 0 || a.rank >= s.ranks)
      throw config_error("measured timeline: an action names rank " + to_text(a.rank) + " but schedule '" + s.name +
                         "' has " + to_text(s.ranks) + " ranks");
    if (!std::isfinite(a.start) || !std::isfinite(a.seconds) || a.seconds < 0)
      throw config_error("measured timeline: rank " + to_text(a.rank) + " has an action with start " + number(a.start) +
                         " s and duration " + number(a.seconds) + " s (both must be finite, the duration >= 0)");
  }
  if (m.predicted != nullptr) {
    require_drawable(s, *m.predicted);
    if (!(m.seconds_per_unit > 0) || !std::isfinite(m.seconds_per_unit))
      throw config_error("measured timeline: seconds per predicted unit " + number(m.seconds_per_unit) +
                         " must be finite and > 0");
  }
}

//! The measured step's length (latest end of any action) and its time in stage calls.
struct measured_totals {
  double span = 0, busy = 0;
};
inline measured_totals totals(const measured_step& m) {
  measured_totals t;
  for (auto const& a : m.actions) {
    t.span = std::max(t.span, a.start + a.seconds);
    if (is_compute(a.kind)) t.busy += a.seconds;
  }
  return t;
}

//! "F3", "B3 (in FB)", "recv F3 from 2", "send B3 to 0": the label of a measured action.
inline std::string measured_label(const measured_action& a) {
  if (a.kind == op::send || a.kind == op::recv)
    return std::string(to_string(a.kind)) + " mb" + to_text(a.microbatch) + " s" + to_text(a.stage) +
           (a.kind == op::send ? " to " : " from ") + to_text(a.peer);
  if (a.update) return "update s" + to_text(a.stage) + " after " + std::string(to_string(a.kind)) + to_text(a.microbatch);
  return std::string(to_string(a.kind)) + to_text(a.microbatch) + (a.in_fb ? " (in FB)" : "");
}

}  // namespace detail

//! Seconds per unit of `sim` (a simulation of `s`, e.g. at unit costs) that make its time in
//! compute actions equal to the measured step's (`actions`, every rank's): a prediction scaled to
//! the measured mean call, for drawing a step that has no calibrated model beside it. 1 when
//! either side has no compute time.
inline double seconds_per_unit_matching(const schedule& s, const simulation& sim, std::span<const measured_action> actions) {
  detail::require_drawable(s, sim);
  double measured = 0, units = 0;
  for (auto const& a : actions)
    if (is_compute(a.kind)) measured += a.seconds;
  for (std::size_t r = 0; r < s.programs.size(); ++r)
    for (std::size_t i = 0; i < s.programs[r].size(); ++i)
      if (is_compute(s.programs[r][i].kind)) units += sim.times[r][i].end - sim.times[r][i].start;
  return units > 0 && measured > 0 ? measured / units : 1;
}

//! Trace Event Format JSON of the measured step `m` of `s` beside its prediction (see the file
//! comment); times in microseconds from the step's start. Throws `config_error` for actions of
//! ranks `s` lacks or non-finite times, `schedule_error` for a prediction of another schedule.
inline std::string render_trace(const schedule& s, const measured_step& m) {
  detail::require_measured(s, m);
  using detail::json_string;
  using detail::number;
  using detail::to_text;
  const auto tot = detail::totals(m);
  const double P = static_cast<double>(s.ranks);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":" + json_string(s.name) +
                    ",\"ranks\":" + to_text(s.ranks) + ",\"microbatches\":" + to_text(s.microbatches) +
                    ",\"measured_step_s\":" + number(tot.span) +
                    ",\"measured_bubble_ratio\":" + number(tot.span > 0 ? 1 - tot.busy / (P * tot.span) : 0);
  if (m.predicted != nullptr)
    out += ",\"predicted_step_s\":" + number(m.predicted->makespan * m.seconds_per_unit) +
           ",\"predicted_bubble_ratio\":" + number(m.predicted->bubble_ratio);
  out += "},\"traceEvents\":[\n";
  bool first = true;
  auto event = [&](const std::string& e) {
    out += (first ? "" : ",\n") + e;
    first = false;
  };
  const int processes = m.predicted != nullptr ? 2 : 1;
  for (int pid = 0; pid < processes; ++pid) {
    const std::string p = to_text(pid);
    event("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":0,\"args\":{\"name\":" +
          json_string(std::string(pid == 0 ? "measured: " : "predicted: ") + s.name) + "}}");
    event("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":0,\"args\":{\"sort_index\":" + p + "}}");
    for (int r = 0; r < s.ranks; ++r) {
      const std::string tid = to_text(r);
      event("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + tid + ",\"args\":{\"name\":\"rank " + tid + "\"}}");
      event("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + tid + ",\"args\":{\"sort_index\":" + tid + "}}");
    }
  }
  for (auto const& a : m.actions)
    event("{\"name\":" + json_string(detail::measured_label(a)) + ",\"cat\":" + json_string(to_string(a.kind)) +
          ",\"ph\":\"X\",\"pid\":0,\"tid\":" + to_text(a.rank) + ",\"ts\":" + number(a.start * 1e6) +
          ",\"dur\":" + number(a.seconds * 1e6) + ",\"args\":{\"op\":" + json_string(to_string(a.kind)) +
          ",\"mb\":" + to_text(a.microbatch) + ",\"stage\":" + to_text(a.stage) + ",\"peer\":" + to_text(a.peer) +
          ",\"in_fb\":" + (a.in_fb ? "true" : "false") + "}}");
  if (m.predicted != nullptr) {
    const double us = m.seconds_per_unit * 1e6;
    for (std::size_t r = 0; r < s.programs.size(); ++r)
      for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
        auto const& a = s.programs[r][i];
        if (!is_compute(a.kind)) continue;
        auto t = m.predicted->times[r][i];
        event("{\"name\":" + json_string(std::string(to_string(a.kind)) + to_text(a.mb)) + ",\"cat\":" +
              json_string(to_string(a.kind)) + ",\"ph\":\"X\",\"pid\":1,\"tid\":" + to_text(static_cast<long long>(r)) +
              ",\"ts\":" + number(t.start * us) + ",\"dur\":" + number((t.end - t.start) * us) +
              ",\"args\":{\"op\":" + json_string(to_string(a.kind)) + ",\"mb\":" + to_text(a.mb) +
              ",\"stage\":" + to_text(a.stage) + "}}");
      }
  }
  out += "\n]}\n";
  return out;
}

//! SVG of the measured step `m` of `s` above its prediction, on one time axis in seconds (see the
//! file comment); `o` as for the simulated timeline. Throws as `render_trace`, and `config_error`
//! for a non-positive or non-finite width or row height.
inline std::string render_svg(const schedule& s, const measured_step& m, const svg_options& o = {}) {
  using detail::px;
  using detail::to_text;
  detail::require_measured(s, m);
  if (!(o.width > 0) || !(o.row_height > 0) || !std::isfinite(o.width) || !std::isfinite(o.row_height))
    throw config_error("svg width " + detail::number(o.width) + " and row height " + detail::number(o.row_height) +
                       " must be finite and > 0");
  const auto tot = detail::totals(m);
  const double predicted_s = m.predicted != nullptr ? m.predicted->makespan * m.seconds_per_unit : 0;
  const double span = std::max({tot.span, predicted_s, 1e-9});
  const int P = s.ranks;
  const int sections = m.predicted != nullptr ? 2 : 1;
  const double x0 = 110, top = 58, rh = o.row_height, box_h = rh * 0.78, gap = 26;
  const double scale = o.width / span;
  const double plot_h = sections * rh * P + (sections - 1) * gap;
  const double axis_y = top + plot_h, legend_y = axis_y + 54;
  const double total_w = x0 + o.width + 20, total_h = legend_y + (o.legend ? 30 : 0);
  const double bubble = tot.span > 0 ? 1 - tot.busy / (P * tot.span) : 0;
  std::string title = o.title;
  if (title.empty())
    title = s.name + ": measured step above its prediction, " + to_text(P) + " ranks \xC3\x97 " + to_text(s.microbatches) +
            " microbatches";
  std::string sub = "measured " + detail::rounded(tot.span * 1e3, 4) + " ms, bubble " + detail::rounded(100 * bubble, 1) + "%";
  if (m.predicted != nullptr)
    sub += " \xC2\xB7 predicted " + detail::rounded(predicted_s * 1e3, 4) + " ms, bubble " +
           detail::rounded(100 * m.predicted->bubble_ratio, 1) + "%";
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(total_w) + "\" height=\"" + px(total_h) +
         "\" viewBox=\"0 0 " + px(total_w) + " " + px(total_h) + "\" font-family=\"Helvetica, Arial, sans-serif\"" +
         " data-x0=\"" + px(x0) + "\" data-scale=\"" + detail::number(scale) + "\">\n";
  out += "<rect x=\"0\" y=\"0\" width=\"" + px(total_w) + "\" height=\"" + px(total_h) + "\" fill=\"#ffffff\"/>\n";
  out += "<text x=\"" + px(x0) + "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">" + detail::xml_escape(title) + "</text>\n";
  out += "<text x=\"" + px(x0) + "\" y=\"42\" font-size=\"12\" fill=\"#444444\">" + detail::xml_escape(sub) + "</text>\n";
  auto row_y = [&](int section, int r) { return top + section * (rh * P + gap) + rh * r; };
  for (int sec = 0; sec < sections; ++sec)
    for (int r = 0; r < P; ++r) {
      const double y = row_y(sec, r);
      out += "<rect x=\"" + px(x0) + "\" y=\"" + px(y) + "\" width=\"" + px(o.width) + "\" height=\"" + px(rh) +
             "\" fill=\"" + (r % 2 ? "#f4f4f4" : "#fafafa") + "\"/>\n";
      out += "<text x=\"" + px(x0 - 8) + "\" y=\"" + px(y + rh / 2 + 4) + "\" font-size=\"12\" text-anchor=\"end\">" +
             (sec == 0 ? "measured " : "predicted ") + to_text(r) + "</text>\n";
    }
  auto box = [&](const char* cls, int r, double y, op kind, int mb, int stage, double start, double end, const char* fill,
                 const std::string& label) {
    const double x = x0 + scale * start, w = std::max(scale * (end - start), 0.5);
    out += "<rect class=\"" + std::string(cls) + "\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) +
           "\" height=\"" + px(box_h) + "\" fill=\"" + fill + "\" stroke=\"#ffffff\" stroke-width=\"0.4\" data-rank=\"" +
           to_text(r) + "\" data-op=\"" + std::string(to_string(kind)) + "\" data-mb=\"" + to_text(mb) + "\" data-stage=\"" +
           to_text(stage) + "\" data-start=\"" + detail::number(start) + "\" data-end=\"" + detail::number(end) +
           "\"><title>" + detail::xml_escape(label + " [" + detail::rounded(start * 1e3, 4) + ", " +
                                             detail::rounded(end * 1e3, 4) + ") ms") +
           "</title></rect>\n";
  };
  for (auto const& a : m.actions) {
    const double y = row_y(0, a.rank) + (rh - box_h) / 2;
    const char* fill = a.kind == op::recv ? "#bbbbbb" : a.kind == op::send ? "#555555" : detail::svg_fill(a.kind);
    box("measured", a.rank, y, a.kind, a.microbatch, a.stage, a.start, a.start + a.seconds, fill, detail::measured_label(a));
  }
  if (m.predicted != nullptr)
    for (std::size_t r = 0; r < s.programs.size(); ++r)
      for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
        auto const& a = s.programs[r][i];
        if (!is_compute(a.kind)) continue;
        auto t = m.predicted->times[r][i];
        const double y = row_y(1, static_cast<int>(r)) + (rh - box_h) / 2;
        box("predicted", static_cast<int>(r), y, a.kind, a.mb, a.stage, t.start * m.seconds_per_unit,
            t.end * m.seconds_per_unit, detail::svg_fill(a.kind), std::string(to_string(a.kind)) + to_text(a.mb));
      }
  // Time axis in milliseconds.
  const double tick = detail::svg_tick(span, std::max(2, static_cast<int>(o.width / 80)));
  out += "<line x1=\"" + px(x0) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(x0 + o.width) + "\" y2=\"" + px(axis_y) +
         "\" stroke=\"#000000\"/>\n";
  for (long long k = 0;; ++k) {
    const double t = static_cast<double>(k) * tick;
    if (t > span * (1 + 1e-9)) break;
    const double x = x0 + scale * t;
    out += "<line x1=\"" + px(x) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(x) + "\" y2=\"" + px(axis_y + 5) +
           "\" stroke=\"#000000\"/>\n";
    out += "<text x=\"" + px(x) + "\" y=\"" + px(axis_y + 17) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           detail::rounded(t * 1e3, 4) + "</text>\n";
  }
  out += "<text x=\"" + px(x0 + o.width) + "\" y=\"" + px(axis_y + 32) +
         "\" font-size=\"11\" text-anchor=\"end\" fill=\"#444444\">time from the step's start (ms)</text>\n";
  if (o.legend) {
    struct item {
      const char* fill;
      const char* name;
    };
    const item items[] = {{detail::svg_fill(op::F), "F forward"},
                          {detail::svg_fill(op::B), "B backward (input)"},
                          {detail::svg_fill(op::W), "W backward (weights)"},
                          {detail::svg_fill(op::BW), "BW fused backward"},
                          {"#bbbbbb", "waiting to receive"},
                          {"#555555", "posting a send"}};
    double x = x0;
    for (auto const& it : items) {
      out += "<rect x=\"" + px(x) + "\" y=\"" + px(legend_y - 11) + "\" width=\"14\" height=\"14\" fill=\"" + it.fill + "\"/>\n";
      out += "<text x=\"" + px(x + 19) + "\" y=\"" + px(legend_y) + "\" font-size=\"12\">" + it.name + "</text>\n";
      x += 19 + 6.6 * static_cast<double>(std::string(it.name).size()) + 16;
    }
  }
  out += "</svg>\n";
  return out;
}

}  // namespace loom
