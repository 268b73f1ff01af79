// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! What the renderers share: action labels, the model chunk an action runs on, number text and
//! escaping. Std-only, like the schedule layer it draws.

#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! For every (direction, stage) `[d * S + s]`, the index of that stage among the stages of
//! the same direction placed on the same rank, in stage order: the *model chunk* of the rank
//! it runs on (0 for a plain pipeline; 0..V-1 for loop and V placements). Renderers tell
//! chunks apart with it.
inline std::vector<int> local_chunks(const schedule& s) {
  std::vector<int> out(s.stage_to_rank.size(), 0);
  for (int d = 0; d < s.directions; ++d) {
    std::vector<int> seen(static_cast<std::size_t>(s.ranks > 0 ? s.ranks : 0), 0);
    for (int st = 0; st < s.stages; ++st) {
      auto i = static_cast<std::size_t>(d * s.stages + st);
      if (i >= s.stage_to_rank.size()) break;
      int r = s.stage_to_rank[i];
      if (r < 0 || r >= s.ranks) continue;
      out[i] = seen[static_cast<std::size_t>(r)]++;
    }
  }
  return out;
}

namespace detail {

//! Throws `schedule_error` unless `sim` is a complete simulation of `s` (renderers draw times).
inline void require_drawable(const schedule& s, const simulation& sim) {
  if (!sim.ok) throw schedule_error("cannot render schedule '" + s.name + "': its simulation failed: " + sim.error);
  if (sim.times.size() != s.programs.size())
    throw schedule_error("cannot render schedule '" + s.name + "': the simulation is of another schedule (" +
                         to_text(static_cast<long long>(sim.times.size())) + " ranks simulated, " +
                         to_text(static_cast<long long>(s.programs.size())) + " in the schedule)");
  for (std::size_t r = 0; r < s.programs.size(); ++r)
    if (sim.times[r].size() != s.programs[r].size())
      throw schedule_error("cannot render schedule '" + s.name + "': the simulation of rank " +
                           to_text(static_cast<long long>(r)) + " has " +
                           to_text(static_cast<long long>(sim.times[r].size())) + " actions, the program " +
                           to_text(static_cast<long long>(s.programs[r].size())));
}

//! Shortest text that reads back as `v` ("3", "0.5", "1e-07"); "0" for -0.
inline std::string number(double v) {
  if (v == 0) return "0";
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc{}) return "0";
  return std::string(buf, p);
}

//! `v` rounded to `digits` decimals, trailing zeros dropped ("0.111", "27").
inline std::string rounded(double v, int digits) {
  double k = std::pow(10.0, digits);
  return number(std::round(v * k) / k);
}

//! Model chunk of (`mb`, `stage`) on its rank.
inline int chunk_of(const schedule& s, const std::vector<int>& chunks, int mb, int stage) {
  auto i = static_cast<std::size_t>(s.direction_of(mb) * s.stages + stage);
  return i < chunks.size() ? chunks[i] : 0;
}

//! Label of one half: op + microbatch, plus `.k` for the model chunk when `with_chunk`.
inline std::string half_label(op k, int mb, int chunk, bool with_chunk) {
  std::string t = std::string(to_string(k)) + to_text(mb);
  if (with_chunk) {
    t += '.';
    t += to_text(chunk);
  }
  return t;
}

//! Label of a compute action: `F3`, `BW0`, `F3.1` (chunk 1), `F3+B1` for an overlapped pair.
inline std::string action_label(const schedule& s, const std::vector<int>& chunks, const action& a, bool with_chunk) {
  std::string t = half_label(a.kind == op::FB ? op::F : a.kind, a.mb, chunk_of(s, chunks, a.mb, a.stage), with_chunk);
  if (a.kind == op::FB) {
    t += '+';
    t += half_label(a.bkind, a.bmb, chunk_of(s, chunks, a.bmb, a.bstage), with_chunk);
  }
  return t;
}

//! True when some rank holds more than one stage of a direction (labels then carry `.k`).
inline bool has_chunks(const std::vector<int>& chunks) {
  for (int c : chunks)
    if (c > 0) return true;
  return false;
}

//! `text` with `&`, `<`, `>`, `"` and `'` escaped for XML.
inline std::string xml_escape(std::string_view text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n') out += '?';
        else out += ch;
    }
  }
  return out;
}

//! `text` as a JSON string literal (quotes included), escaping per RFC 8259.
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[u >> 4];
          out += hex[u & 15];
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

}  // namespace detail
}  // namespace loom
