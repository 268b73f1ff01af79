// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! SVG timeline of a simulated schedule, the figure a paper shows (Zero Bubble Fig. 3,
//! Megatron-LM Fig. 4): ranks as rows, one box per compute action at its simulated start and
//! width, a colour per op kind (F, B, W, BW, FB; later model chunks of a rank in a lighter
//! shade), the microbatch number in the box when it fits, a time axis with ticks, a legend and
//! a title naming the schedule, its shape and its bubble. Send/recv take no time and are not
//! drawn.
//!
//! Every box is a `<rect class="action">` carrying `data-rank`, `data-op`, `data-mb`,
//! `data-stage` (and `data-bop`, `data-bmb`, `data-bstage` for FB), `data-start`, `data-end`;
//! the root carries `data-x0` and `data-scale` (pixels per time unit): a box's `x` is
//! `x0 + scale * (start - origin)` and its width `scale * (end - start)`, so tools and tests
//! can read the timeline back.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/render/common.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! Knobs of `render_svg`.
struct svg_options {
  double width = 1200;       //!< width of the timeline area in pixels
  double row_height = 28;    //!< pixels per rank row
  std::string title;         //!< first title line; empty: "<name>: P ranks x m microbatches"
  bool legend = true;        //!< draw the colour legend
};

namespace detail {

//! Fill colour of an op kind (colour-blind-safe Tableau-like palette).
inline const char* svg_fill(op k) {
  switch (k) {
    case op::F: return "#4c78a8";
    case op::B: return "#54a24b";
    case op::W: return "#eeca3b";
    case op::BW: return "#2f8f83";
    case op::FB: return "#b279a2";
    case op::S: return "#e45756";
    case op::T: return "#f58518";
    case op::IF: return "#72b7b2";
    case op::IB: return "#9d755d";
    default: return "#999999";
  }
}

//! `hex` (`#rrggbb`) mixed with white by `t` in [0, 1].
inline std::string svg_lighten(const char* hex, double t) {
  auto comp = [&](int i) {
    int v = std::stoi(std::string(hex + 1 + 2 * i, 2), nullptr, 16);
    return static_cast<int>(std::lround(v + (255 - v) * t));
  };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", comp(0), comp(1), comp(2));
  return buf;
}

//! A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
inline double svg_tick(double span, int target) {
  if (!(span > 0)) return 1;
  double raw = span / target;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

inline std::string px(double v) { return rounded(v, 3); }

}  // namespace detail

//! SVG document of `s` as simulated by `sim` (see the file comment). Throws `schedule_error`
//! if `sim` is not a complete simulation of `s`, `config_error` for a non-positive size.
inline std::string render_svg(const schedule& s, const simulation& sim, const svg_options& o = {}) {
  using detail::px;
  detail::require_drawable(s, sim);
  if (!(o.width > 0) || !(o.row_height > 0) || !std::isfinite(o.width) || !std::isfinite(o.row_height))
    throw config_error("svg width " + detail::number(o.width) + " and row height " + detail::number(o.row_height) +
                       " must be finite and > 0");
  const auto chunks = local_chunks(s);
  int max_chunk = 0;
  for (int c : chunks) max_chunk = std::max(max_chunk, c);
  double t0 = -1, t1 = 0;
  constexpr int kind_count = static_cast<int>(op::IB) + 1;
  bool kinds[kind_count] = {};
  for (std::size_t r = 0; r < s.programs.size(); ++r)
    for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
      auto const& a = s.programs[r][i];
      if (!is_compute(a.kind)) continue;
      kinds[static_cast<int>(a.kind)] = true;
      auto t = sim.times[r][i];
      if (t0 < 0 || t.start < t0) t0 = t.start;
      t1 = std::max(t1, t.end);
    }
  if (t0 < 0) t0 = 0;
  const double span = t1 > t0 ? t1 - t0 : 1;
  const double x0 = 70, top = 58, rh = o.row_height, box_h = rh * 0.78;
  const double scale = o.width / span;
  const auto P = s.programs.size();
  const double plot_h = rh * static_cast<double>(P);
  const double axis_y = top + plot_h;
  const double legend_y = axis_y + 54;  // below the axis title (axis_y + 32) with a line between
  const double total_w = x0 + o.width + 20;
  const double total_h = legend_y + (o.legend ? 30 : 0);
  const double font = std::min(12.0, box_h * 0.6);

  std::string title = o.title.empty() ? std::string(s.name + ": " + detail::to_text(s.ranks) + " ranks \xC3\x97 " +
                                            detail::to_text(s.microbatches) + " microbatches" +
                                            (s.chunks > 1 ? ", " + detail::to_text(s.chunks) + " chunks per rank" : ""))
                                      : o.title;
  std::string sub = "makespan " + detail::rounded(sim.makespan, 4) + " \xC2\xB7 bubble ratio " +
                    detail::rounded(100 * sim.bubble_ratio, 1) + "% \xC2\xB7 bubble rate " +
                    detail::rounded(100 * sim.bubble_rate, 1) + "% \xC2\xB7 peak activation " +
                    detail::rounded(sim.max_peak_activation(), 4) + " \xC2\xB7 " + std::string(to_string(s.placement)) +
                    " placement" + (s.param_copies > 1 ? " \xC2\xB7 " + detail::to_text(s.param_copies) + " parameter copies" : "");

  std::string out;
  out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(total_w) + "\" height=\"" + px(total_h) +
         "\" viewBox=\"0 0 " + px(total_w) + " " + px(total_h) + "\" font-family=\"Helvetica, Arial, sans-serif\"" +
         " data-x0=\"" + px(x0) + "\" data-origin=\"" + detail::number(t0) + "\" data-scale=\"" +
         detail::number(scale) + "\">\n";
  out += "<rect x=\"0\" y=\"0\" width=\"" + px(total_w) + "\" height=\"" + px(total_h) + "\" fill=\"#ffffff\"/>\n";
  out += "<text x=\"" + px(x0) + "\" y=\"22\" font-size=\"16\" font-weight=\"bold\">" + detail::xml_escape(title) + "</text>\n";
  out += "<text x=\"" + px(x0) + "\" y=\"42\" font-size=\"12\" fill=\"#444444\">" + detail::xml_escape(sub) + "</text>\n";

  // Rows: label and a faint band per rank.
  for (std::size_t r = 0; r < P; ++r) {
    double y = top + rh * static_cast<double>(r);
    out += "<rect x=\"" + px(x0) + "\" y=\"" + px(y) + "\" width=\"" + px(o.width) + "\" height=\"" + px(rh) +
           "\" fill=\"" + (r % 2 ? "#f4f4f4" : "#fafafa") + "\"/>\n";
    out += "<text x=\"" + px(x0 - 8) + "\" y=\"" + px(y + rh / 2 + 4) + "\" font-size=\"12\" text-anchor=\"end\">rank " +
           detail::to_text(static_cast<long long>(r)) + "</text>\n";
  }
  // Boxes.
  for (std::size_t r = 0; r < P; ++r) {
    double y = top + rh * static_cast<double>(r) + (rh - box_h) / 2;
    for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
      auto const& a = s.programs[r][i];
      if (!is_compute(a.kind)) continue;
      auto t = sim.times[r][i];
      double x = x0 + scale * (t.start - t0), w = scale * (t.end - t.start);
      int ch = detail::chunk_of(s, chunks, a.mb, a.stage);
      const char* base = detail::svg_fill(a.kind);
      std::string fill = ch > 0 ? detail::svg_lighten(base, 0.45 * ch / (max_chunk > 0 ? max_chunk : 1)) : base;
      std::string label = detail::action_label(s, chunks, a, detail::has_chunks(chunks));
      out += "<rect class=\"action\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" +
             px(box_h) + "\" fill=\"" + fill + "\" stroke=\"#ffffff\" stroke-width=\"0.6\" data-rank=\"" +
             detail::to_text(static_cast<long long>(r)) + "\" data-op=\"" + std::string(to_string(a.kind)) +
             "\" data-mb=\"" + detail::to_text(a.mb) + "\" data-stage=\"" + detail::to_text(a.stage) + "\"";
      if (a.kind == op::FB)
        out += " data-bop=\"" + std::string(to_string(a.bkind)) + "\" data-bmb=\"" + detail::to_text(a.bmb) +
               "\" data-bstage=\"" + detail::to_text(a.bstage) + "\"";
      out += " data-start=\"" + detail::number(t.start) + "\" data-end=\"" + detail::number(t.end) + "\"><title>" +
             detail::xml_escape(label + " (stage " + detail::to_text(a.stage) + ") [" + detail::number(t.start) + ", " +
                                detail::number(t.end) + ")") +
             "</title></rect>\n";
      std::string num = detail::to_text(a.mb);
      if (a.kind == op::FB) num += "/" + detail::to_text(a.bmb);
      if (w >= font * 0.62 * static_cast<double>(num.size()) + 2)
        out += "<text x=\"" + px(x + w / 2) + "\" y=\"" + px(y + box_h / 2 + font * 0.35) + "\" font-size=\"" +
               px(font) + "\" text-anchor=\"middle\" fill=\"" + (a.kind == op::W ? "#000000" : "#ffffff") + "\">" + num +
               "</text>\n";
    }
  }
  // Time axis.
  double tick = detail::svg_tick(span, std::max(2, static_cast<int>(o.width / 80)));
  out += "<line x1=\"" + px(x0) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(x0 + o.width) + "\" y2=\"" + px(axis_y) +
         "\" stroke=\"#000000\"/>\n";
  for (long long k = 0;; ++k) {
    double t = static_cast<double>(k) * tick;
    if (t > span * (1 + 1e-9)) break;
    double x = x0 + scale * t;
    out += "<line x1=\"" + px(x) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(x) + "\" y2=\"" + px(axis_y + 5) +
           "\" stroke=\"#000000\"/>\n";
    out += "<text x=\"" + px(x) + "\" y=\"" + px(axis_y + 17) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           detail::number(t0 + t) + "</text>\n";
  }
  out += "<text x=\"" + px(x0 + o.width) + "\" y=\"" + px(axis_y + 32) +
         "\" font-size=\"11\" text-anchor=\"end\" fill=\"#444444\">time (cost units)</text>\n";
  // Legend: the kinds that occur, and the chunk shading.
  if (o.legend) {
    static const char* names[kind_count] = {"F forward", "B input-gradient backward", "W weight-gradient backward",
                                            "BW fused backward", "FB overlapped forward+backward", nullptr, nullptr, nullptr, nullptr,
                                            "S output layer, forward", "T output layer, backward", "IF input layer, forward",
                                            "IB input layer, backward"};
    double x = x0;
    for (int k = 0; k < kind_count; ++k) {
      if (!kinds[k] || names[k] == nullptr) continue;
      out += "<rect x=\"" + px(x) + "\" y=\"" + px(legend_y - 11) + "\" width=\"14\" height=\"14\" fill=\"" +
             detail::svg_fill(static_cast<op>(k)) + "\"/>\n";
      out += "<text x=\"" + px(x + 19) + "\" y=\"" + px(legend_y) + "\" font-size=\"12\">" + names[k] + "</text>\n";
      x += 19 + 7.0 * static_cast<double>(std::string(names[k]).size()) + 18;
    }
    if (max_chunk > 0)
      out += "<text x=\"" + px(x) + "\" y=\"" + px(legend_y) +
             "\" font-size=\"12\" fill=\"#444444\">lighter: later model chunk of the rank</text>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace loom
