// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Reading and writing PyTorch pipelining's schedule CSV (`torch.distributed.pipelining`,
//! `schedules.py`: `_Action.from_str`/`__repr__`, `PipelineScheduleMulti._load_csv`/`_dump_csv`,
//! `_PipelineScheduleRuntime._load_csv(format="compute_comms")`).
//!
//! The format: one line per rank (line `r + 1` is rank `r`), one cell per action in execution
//! order, cells separated by commas; an empty cell is an idle time step. A cell is
//! `<stage><type><microbatch>` where `<stage>` is the *global* stage index (PyTorch numbers the
//! stages of a V placement `0..2P-1` along the model, so rank `r` holds stages `r` and
//! `2P-1-r`, exactly loom's `placement_kind::v`) and `<type>` is one of
//!
//! | PyTorch cell            | meaning                                  | loom action                       |
//! |-------------------------|------------------------------------------|-----------------------------------|
//! | `sFm`                   | forward                                  | `forward(m, s)`                   |
//! | `sIm`                   | input-gradient backward                  | `backward_input(m, s)` (`op::B`)  |
//! | `sWm`                   | weight-gradient backward                 | `backward_weight(m, s)`           |
//! | `sBm`                   | full backward (current spelling)         | `backward(m, s)` (`op::BW`)       |
//! | `(sFm;tBn)OVERLAP_F_B`  | forward overlapped with a backward       | `overlapped(m, s, BW, n, t)` (`I`: `op::B`) |
//! | `sSEND_Fm`              | send activation of `F(s, m)` to `s+1`    | `send_to(rank(s+1), activation, m, s)` |
//! | `sRECV_Fm`              | receive stage `s`'s input from `s-1`     | `recv_from(rank(s-1), activation, m, s-1)` |
//! | `sSEND_Bm`              | send input gradient of stage `s` to `s-1`| `send_to(rank(s-1), gradient, m, s)` |
//! | `sRECV_Bm`              | receive stage `s`'s output gradient      | `recv_from(rank(s+1), gradient, m, s+1)` |
//! | `sUNSHARD`, `sRESHARD`  | FSDP all-gather / release of stage `s`'s parameters | accepted and dropped     |
//! | `sREDUCE_GRAD`          | data-parallel gradient reduction of stage `s` after its last backward | accepted and dropped |
//!
//! UNSHARD/RESHARD/REDUCE_GRAD are dropped because they are not part of the pipeline schedule
//! model (ARCHITECTURE.md): loom's execution layer inserts the data-parallel gradient sync
//! itself, and parameter sharding is outside the schedule. Their stage still takes part in the
//! stage -> rank inference, and `torch_csv_import` counts them.
//!
//! **Two spellings of the backward.** Before PyTorch renamed its actions, `B` was the
//! backward that a `W` of the same stage and microbatch completes (today's `I`), and a `B` with
//! no such `W` was the full backward. Today `I` is the input-gradient backward and `B` always
//! the full backward. `torch_spelling::detect` picks the spelling from the file: a `B` whose
//! stage and microbatch also have a `W` can only be an input-gradient backward, so such a pair
//! means legacy; a file that has such a pair and also an `I` cell is ambiguous and rejected
//! (name a spelling to read it). `torch_spelling::legacy` forces the old meaning, `current`
//! the new one.
//!
//! **Stages, placement, shape.** Ranks = number of lines; stages `S` = largest stage index + 1
//! (every stage `0..S-1` must appear); microbatches = largest microbatch index + 1. The stage ->
//! rank map is inferred from where each stage's cells are; a stage on two ranks is an error
//! naming both. The placement is reported as `loop` when stage `s` is on rank `s mod P` for every
//! `s` (and `P` divides `S`), as `v` when `S = 2P` and stage `s` is on rank `s` or `2P-1-s`,
//! otherwise `custom`; on one rank `loop` wins the tie. `chunks` = `S/P` for loop, 2 for v, the
//! largest number of stages a rank holds for custom.
//!
//! **Errors.** A malformed file throws `schedule_error` with one line of text:
//! `torch csv line L, cell C "TEXT": reason` (1-based line and column, the cell's text).
//! Whether a well-formed file is a *valid* schedule (every F and backward present, dependencies
//! respected, sends matching receives) is `validate`'s job: `read_torch_csv` only builds it.
//!
//! **Writing.** `write_torch_csv` writes any one-direction schedule: compute-only programs as
//! PyTorch's compute-only form, lowered programs (with send/recv) as its compute+comms form.
//! PyTorch's format has one path through the stages and one copy of the parameters, so a
//! bidirectional schedule (DualPipe, Chimera) cannot be written; that is a `schedule_error`
//! naming the rule. Everything here is constexpr: a CSV literal can be imported and checked in a
//! `static_assert`.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! Which spelling of the backward a PyTorch CSV uses (see the file comment).
//! `detect`: decide from the file; `current`: `I` input gradient, `B` full backward;
//! `legacy`: `B` is the input gradient when a `W` of its stage and microbatch exists, else full.
enum class torch_spelling : unsigned char { detect, current, legacy };

//! Name of a spelling (`detect`, `current`, `legacy`).
constexpr std::string_view to_string(torch_spelling s) {
  switch (s) {
    case torch_spelling::detect: return "detect";
    case torch_spelling::current: return "current";
    case torch_spelling::legacy: return "legacy";
  }
  return "?";
}

//! The two forms of PyTorch's CSV: compute actions only, or compute plus SEND/RECV actions.
enum class torch_csv_form : unsigned char { compute_only, compute_comms };

//! Name of a form (`compute_only`, `compute_comms`), as PyTorch's `format=` argument spells it.
constexpr std::string_view to_string(torch_csv_form f) {
  return f == torch_csv_form::compute_only ? "compute_only" : "compute_comms";
}

//! Options of `import_torch_csv` / `read_torch_csv`.
struct torch_csv_options {
  torch_spelling spelling = torch_spelling::detect;  //!< force a spelling, or detect it
  std::string_view name = "torch-csv";               //!< `schedule::name` of the result
};

//! What `import_torch_csv` found: the schedule and how the file was read.
struct torch_csv_import {
  schedule sched;                                     //!< the imported schedule (not yet validated)
  torch_spelling spelling = torch_spelling::current;  //!< the spelling used (never `detect`)
  torch_csv_form form = torch_csv_form::compute_only; //!< compute+comms if any SEND/RECV cell
  int idle_cells = 0;         //!< empty cells (idle time steps), dropped
  int unshard_cells = 0;      //!< UNSHARD cells, dropped
  int reshard_cells = 0;      //!< RESHARD cells, dropped
  int reduce_grad_cells = 0;  //!< REDUCE_GRAD cells, dropped
  int wait_send_cells = 0;    //!< WAIT_SEND_F/WAIT_SEND_B cells, checked against their sends and dropped
  int wait_reduce_grad_cells = 0;  //!< WAIT_REDUCE_GRAD cells, checked against their REDUCE_GRAD and dropped
  int sends = 0;              //!< SEND_F/SEND_B cells
  int unwaited_sends = 0;     //!< sends with no WAIT_SEND on their line (PyTorch 2.15 refuses such a file)
  int unwaited_reduce_grads = 0;  //!< REDUCE_GRADs with no WAIT_REDUCE_GRAD on their line (likewise)
};

namespace detail {

//! Action types of PyTorch's `_ComputationType`, by their CSV token.
enum class torch_kind : unsigned char {
  F, I, B, W, unshard, reshard, reduce_grad, send_f, recv_f, send_b, recv_b, overlap,
  wait_send_f, wait_send_b, wait_reduce_grad  // completion points (PyTorch 2.15)
};

//! Largest stage or microbatch index accepted (far beyond any real pipeline; keeps the
//! validator's `stages x microbatches` tables bounded).
inline constexpr long long torch_max_index = 1 << 20;
//! Largest `stages * microbatches` accepted.
inline constexpr long long torch_max_cells = 1 << 24;

//! One parsed action (a plain cell, or one half of an OVERLAP_F_B cell).
struct torch_atom {
  torch_kind kind = torch_kind::F;
  int stage = 0;
  int mb = -1;  //!< -1: absent (UNSHARD/RESHARD/REDUCE_GRAD)
};

//! One non-empty cell with its position, for error messages and the later passes.
struct torch_cell {
  int line = 0;    //!< 1-based
  int column = 0;  //!< 1-based
  loom::text text;
  torch_kind kind = torch_kind::F;
  torch_atom a;  //!< the action, or the overlap's forward half
  torch_atom b;  //!< the overlap's backward half
};

//! `s` with each control character written as `\n`, `\r`, `\t` or `\xHH`, so that a message
//! quoting a cell (a quoted cell may span lines) stays one line.
constexpr loom::text torch_escape(std::string_view s) {
  loom::text out;
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (u >= 0x20 && u != 0x7f) {
      out.push_back(ch);
      continue;
    }
    out.push_back('\\');
    if (ch == '\n') out.push_back('n');
    else if (ch == '\r') out.push_back('r');
    else if (ch == '\t') out.push_back('t');
    else {
      out.push_back('x');
      out.push_back("0123456789abcdef"[u >> 4]);
      out.push_back("0123456789abcdef"[u & 15]);
    }
  }
  return out;
}

//! The message of a malformed cell: `torch csv line L, cell C "TEXT": why`, on one line.
constexpr loom::text torch_msg(int line, int column, std::string_view text, std::string_view why) {
  loom::text m = "torch csv line ";
  m += to_text(line);
  m += ", cell ";
  m += to_text(column);
  m += " \"";
  m += text;
  m += "\": ";
  m += why;
  return torch_escape(m);
}
//! As above, for a parsed cell.
constexpr loom::text torch_msg(const torch_cell& c, std::string_view why) { return torch_msg(c.line, c.column, c.text, why); }

constexpr bool torch_digit(char ch) { return ch >= '0' && ch <= '9'; }
constexpr bool torch_space(char ch) { return ch == ' ' || ch == '\t'; }

constexpr std::string_view torch_trim(std::string_view s) {
  while (!s.empty() && torch_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && torch_space(s.back())) s.remove_suffix(1);
  return s;
}

//! The token of a kind as PyTorch writes it.
constexpr std::string_view torch_token(torch_kind k) {
  switch (k) {
    case torch_kind::F: return "F";
    case torch_kind::I: return "I";
    case torch_kind::B: return "B";
    case torch_kind::W: return "W";
    case torch_kind::unshard: return "UNSHARD";
    case torch_kind::reshard: return "RESHARD";
    case torch_kind::reduce_grad: return "REDUCE_GRAD";
    case torch_kind::send_f: return "SEND_F";
    case torch_kind::recv_f: return "RECV_F";
    case torch_kind::send_b: return "SEND_B";
    case torch_kind::recv_b: return "RECV_B";
    case torch_kind::overlap: return "OVERLAP_F_B";
    case torch_kind::wait_send_f: return "WAIT_SEND_F";
    case torch_kind::wait_send_b: return "WAIT_SEND_B";
    case torch_kind::wait_reduce_grad: return "WAIT_REDUCE_GRAD";
  }
  return "?";
}

constexpr bool torch_compute(torch_kind k) {
  return k == torch_kind::F || k == torch_kind::I || k == torch_kind::B || k == torch_kind::W;
}
constexpr bool torch_comm(torch_kind k) {
  return k == torch_kind::send_f || k == torch_kind::recv_f || k == torch_kind::send_b || k == torch_kind::recv_b;
}
constexpr bool torch_wait(torch_kind k) {
  return k == torch_kind::wait_send_f || k == torch_kind::wait_send_b || k == torch_kind::wait_reduce_grad;
}
//! The operation a wait completes: `WAIT_SEND_F` -> `SEND_F`, `WAIT_SEND_B` -> `SEND_B`,
//! `WAIT_REDUCE_GRAD` -> `REDUCE_GRAD`.
constexpr torch_kind torch_waited(torch_kind k) {
  return k == torch_kind::wait_send_f ? torch_kind::send_f : k == torch_kind::wait_send_b ? torch_kind::send_b : torch_kind::reduce_grad;
}
//! True for the actions PyTorch counts towards a stage's gradient reduction (`_requires_reduce_grad`:
//! a weight gradient, `W`, or a full backward, `B`).
constexpr bool torch_grad(torch_kind k) { return k == torch_kind::W || k == torch_kind::B; }
//! The text of an action PyTorch names by stage and microbatch, e.g. `2SEND_F0` (`mb` < 0: none).
constexpr loom::text torch_cell_text(torch_kind k, int stage, int mb) {
  loom::text out = to_text(stage);
  out += torch_token(k);
  if (mb >= 0) out += to_text(mb);
  return out;
}

//! Parses a decimal index at the front of `s` (advancing it); -1 if `s` starts with no digit.
constexpr long long torch_number(std::string_view& s, int line, int column, std::string_view cell, std::string_view what) {
  if (s.empty() || !torch_digit(s.front())) return -1;
  long long v = 0;
  while (!s.empty() && torch_digit(s.front())) {
    v = v * 10 + (s.front() - '0');
    if (v > torch_max_index)
      throw schedule_error(detail::torch_msg(line, column, cell, loom::text(what) + " index exceeds loom's limit of " + to_text(torch_max_index)));
    s.remove_prefix(1);
  }
  return v;
}

//! Parses `<stage><TYPE><mb>` (one whole cell, or one half of an overlap).
constexpr torch_atom torch_parse_atom(std::string_view s, int line, int column, std::string_view cell) {
  const std::string_view all = s;
  torch_atom out;
  long long stage = torch_number(s, line, column, cell, "stage");
  if (stage < 0)
    throw schedule_error(detail::torch_msg(line, column, cell,
               "\"" + loom::text(all) + "\" does not start with a stage index (expected <stage><type><microbatch>, e.g. 2F0)"));
  std::size_t n = 0;
  while (n < s.size() && ((s[n] >= 'A' && s[n] <= 'Z') || s[n] == '_')) ++n;
  const std::string_view token = s.substr(0, n);
  s.remove_prefix(n);
  constexpr torch_kind kinds[] = {torch_kind::F,           torch_kind::I,           torch_kind::B,
                                  torch_kind::W,           torch_kind::unshard,     torch_kind::reshard,
                                  torch_kind::reduce_grad, torch_kind::send_f,      torch_kind::recv_f,
                                  torch_kind::send_b,      torch_kind::recv_b,      torch_kind::wait_send_f,
                                  torch_kind::wait_send_b, torch_kind::wait_reduce_grad};
  bool found = false;
  for (torch_kind k : kinds)
    if (torch_token(k) == token) {
      out.kind = k;
      found = true;
    }
  if (!found) {
    loom::text why = token.empty() ? "no action type after stage " + to_text(stage)
                                    : "unknown action type \"" + loom::text(token) + "\"";
    throw schedule_error(detail::torch_msg(line, column, cell,
               why + " (expected F, I, B, W, SEND_F, RECV_F, SEND_B, RECV_B, WAIT_SEND_F, WAIT_SEND_B, UNSHARD, RESHARD, REDUCE_GRAD or WAIT_REDUCE_GRAD)"));
  }
  long long mb = torch_number(s, line, column, cell, "microbatch");
  if (!s.empty())
    throw schedule_error(detail::torch_msg(line, column, cell, "unexpected text \"" + loom::text(s) + "\" after the action"));
  bool needs_mb = torch_compute(out.kind) || torch_comm(out.kind) || out.kind == torch_kind::wait_send_f || out.kind == torch_kind::wait_send_b;
  if (needs_mb && mb < 0)
    throw schedule_error(detail::torch_msg(line, column, cell, "action " + loom::text(torch_token(out.kind)) + " of stage " + to_text(stage) + " has no microbatch index"));
  out.stage = static_cast<int>(stage);
  out.mb = needs_mb ? static_cast<int>(mb) : -1;
  return out;
}

//! Parses one non-empty, trimmed cell.
constexpr torch_cell torch_parse_cell(std::string_view text, int line, int column) {
  torch_cell c;
  c.line = line;
  c.column = column;
  c.text = loom::text(text);
  if (text.front() != '(') {
    c.a = torch_parse_atom(text, line, column, text);
    c.kind = c.a.kind;
    return c;
  }
  // (a;b)OVERLAP_F_B
  std::size_t close = text.find(')');
  if (close == std::string_view::npos) throw schedule_error(detail::torch_msg(c, "\"(\" without a closing \")\" (expected (<forward>;<backward>)OVERLAP_F_B)"));
  std::string_view suffix = text.substr(close + 1);
  if (suffix != "OVERLAP_F_B")
    throw schedule_error(detail::torch_msg(c, "a parenthesised cell must end in OVERLAP_F_B, not \"" + loom::text(suffix) + "\""));
  std::string_view inner = text.substr(1, close - 1);
  std::vector<torch_atom> parts;
  while (true) {
    std::size_t semi = inner.find(';');
    std::string_view part = torch_trim(inner.substr(0, semi));
    if (!part.empty()) parts.push_back(torch_parse_atom(part, line, column, text));
    if (semi == std::string_view::npos) break;
    inner.remove_prefix(semi + 1);
  }
  c.kind = torch_kind::overlap;
  int forwards = 0, backwards = 0;
  for (const torch_atom& p : parts) {
    if (p.kind == torch_kind::F) {
      c.a = p;
      ++forwards;
    } else if (p.kind == torch_kind::I || p.kind == torch_kind::B) {
      c.b = p;
      ++backwards;
    } else {
      throw schedule_error(detail::torch_msg(c, "OVERLAP_F_B may only hold F, I or B actions, not " + loom::text(torch_token(p.kind))));
    }
  }
  if (forwards != 1 || backwards != 1)
    throw schedule_error(detail::torch_msg(c, "OVERLAP_F_B must hold exactly one forward and one backward (I or B); it holds " + to_text(forwards) +
                      " forward(s) and " + to_text(backwards) + " backward(s)"));
  return c;
}

//! Splits `text` into lines (LF, CRLF or CR; the last terminator ends the file) and cells
//! (comma-separated; a cell may be double-quoted with `""` for a quote, as Python's csv writes).
//! Calls `cell(line, column, trimmed_text)` for every cell, `row(line)` after each line.
template <class Cell, class Row>
constexpr int torch_split(std::string_view text, Cell&& cell, Row&& row) {
  int line = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    ++line;
    int column = 0;
    while (true) {
      ++column;
      loom::text value;
      bool quoted = false;
      while (i < text.size() && torch_space(text[i])) ++i;
      if (i < text.size() && text[i] == '"') {
        quoted = true;
        ++i;
        while (true) {
          if (i >= text.size())
            throw schedule_error(torch_msg(line, column, std::string_view(value).substr(0, value.find_first_of("\r\n")),
                                           "unterminated quoted cell"));
          if (text[i] == '"') {
            if (i + 1 < text.size() && text[i + 1] == '"') {
              value.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          value.push_back(text[i++]);
        }
      }
      std::size_t start = i;
      while (i < text.size() && text[i] != ',' && text[i] != '\n' && text[i] != '\r') ++i;
      std::string_view rest = torch_trim(text.substr(start, i - start));
      if (quoted && !rest.empty()) throw schedule_error(detail::torch_msg(line, column, value + loom::text(rest), "text after a quoted cell's closing quote"));
      if (quoted) cell(line, column, std::string_view(value));
      else cell(line, column, rest);
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      break;
    }
    if (i < text.size() && text[i] == '\r') ++i;
    if (i < text.size() && text[i] == '\n') ++i;
    row(line);
  }
  return line;
}

//! Checks the completion points of every line (see "Waits" in the file comment) and counts the
//! sends and reductions left without one. `rows` are the parsed lines; `S`, `M` the stage and
//! microbatch extents. Throws `schedule_error` naming the line and cell of the first fault.
template <class Import>
constexpr void torch_check_completions(const std::vector<std::vector<torch_cell>>& rows, int S, int M, Import& out) {
  const auto uS = static_cast<std::size_t>(S);
  const auto keys = uS * static_cast<std::size_t>(M) * 2;
  // Per (payload, stage, microbatch): the send's cell on this line, and whether it was waited for.
  std::vector<const torch_cell*> sent(keys, nullptr), waited(keys, nullptr);
  std::vector<std::size_t> touched;
  // Per stage: this line's REDUCE_GRAD cell and its wait, and the stage's last gradient action.
  std::vector<const torch_cell*> reduced(uS, nullptr), reduce_waited(uS, nullptr), last_grad(uS, nullptr);
  auto key = [M](torch_kind k, int stage, int mb) {
    return (static_cast<std::size_t>(stage) * static_cast<std::size_t>(M) + static_cast<std::size_t>(mb)) * 2 +
           (k == torch_kind::send_b || k == torch_kind::wait_send_b ? 1 : 0);
  };
  for (auto const& row : rows) {
    for (std::size_t i : touched) sent[i] = waited[i] = nullptr;
    touched.clear();
    for (std::size_t st = 0; st < uS; ++st) reduced[st] = reduce_waited[st] = last_grad[st] = nullptr;
    for (std::size_t ci = 0; ci < row.size(); ++ci) {
      const torch_cell& c = row[ci];
      const torch_atom& a = c.a;
      const auto ust = static_cast<std::size_t>(a.stage);
      auto where = [](const torch_cell& o) { return "cell " + to_text(o.column) + " \"" + o.text + "\""; };
      if (c.kind == torch_kind::overlap) {
        if (torch_grad(c.b.kind)) last_grad[static_cast<std::size_t>(c.b.stage)] = &c;
        continue;
      }
      if (torch_grad(c.kind)) last_grad[ust] = &c;
      if (c.kind == torch_kind::send_f || c.kind == torch_kind::send_b) {
        const std::size_t k = key(c.kind, a.stage, a.mb);
        if (sent[k])
          throw schedule_error(torch_msg(c, "sends " + torch_cell_text(c.kind, a.stage, a.mb) + " a second time (first at " + where(*sent[k]) +
                                                "); each item is sent once"));
        sent[k] = &c;
        touched.push_back(k);
        ++out.sends;
      } else if (c.kind == torch_kind::reduce_grad) {
        if (reduced[ust])
          throw schedule_error(torch_msg(c, "reduces stage " + to_text(a.stage) + "'s gradients a second time (first at " + where(*reduced[ust]) +
                                                "); a stage's gradients are reduced once, after its last backward"));
        reduced[ust] = &c;
      } else if (torch_wait(c.kind)) {
        const torch_kind target = torch_waited(c.kind);
        const bool is_send = target != torch_kind::reduce_grad;
        const loom::text op = torch_cell_text(target, a.stage, is_send ? a.mb : -1);
        const torch_cell* done = is_send ? sent[key(c.kind, a.stage, a.mb)] : reduced[ust];
        const torch_cell*& wait = is_send ? waited[key(c.kind, a.stage, a.mb)] : reduce_waited[ust];
        if (done && wait)
          throw schedule_error(torch_msg(c, "waits a second time for " + op + ", already completed at " + where(*wait) + "; each " +
                                                loom::text(torch_token(target)) + " has one wait"));
        if (!done) {
          loom::text later;
          for (std::size_t cj = ci + 1; cj < row.size() && later.empty(); ++cj) {
            const torch_cell& o = row[cj];
            if (o.kind == target && o.a.stage == a.stage && (!is_send || o.a.mb == a.mb)) later = where(o);
          }
          throw schedule_error(torch_msg(c, "waits for " + op + ", which " +
                                                (later.empty() ? "line " + to_text(c.line) + " does not issue"
                                                               : "line " + to_text(c.line) + " issues only later, at " + later) +
                                                "; a wait is the completion point of an earlier " + loom::text(torch_token(target)) +
                                                " of the same rank and must follow it"));
        }
        wait = &c;
      }
    }
    for (std::size_t k : touched)
      if (sent[k] && !waited[k]) ++out.unwaited_sends;
    for (std::size_t st = 0; st < uS; ++st) {
      if (!reduced[st]) continue;
      if (!reduce_waited[st]) ++out.unwaited_reduce_grads;
      const torch_cell* g = last_grad[st];
      if (g && g->column > reduced[st]->column)
        throw schedule_error(torch_msg(*reduced[st], "reduces stage " + to_text(static_cast<int>(st)) + "'s gradients before its backward at cell " +
                                                         to_text(g->column) + " \"" + g->text +
                                                         "\"; REDUCE_GRAD follows the stage's last B or W on its rank"));
    }
  }
}

}  // namespace detail

//! Imports a PyTorch pipelining schedule CSV (either form, either spelling; see the file
//! comment). Infers ranks, stages, microbatches, the stage -> rank map and the placement.
//! Throws `schedule_error` (`torch csv line L, cell C "TEXT": reason`) for a malformed file. The
//! result is not validated: call `validate` on `result.sched`.
constexpr torch_csv_import import_torch_csv(std::string_view text, const torch_csv_options& opt = {}) {
  using detail::torch_cell;
  using detail::torch_kind;
  using detail::to_text;
  torch_csv_import out;
  std::vector<std::vector<torch_cell>> rows(1);
  const int lines = detail::torch_split(
      text,
      [&](int line, int column, std::string_view cell) {
        if (cell.empty()) {
          ++out.idle_cells;
          return;
        }
        rows.back().push_back(detail::torch_parse_cell(cell, line, column));
      },
      [&](int) { rows.emplace_back(); });
  rows.pop_back();
  if (lines == 0) throw schedule_error(detail::torch_msg(1, 1, "", "the file is empty; PyTorch's format has one line per rank"));
  const int P = lines;

  // Stage -> rank, and the extent of stages and microbatches.
  std::vector<int> stage_rank;
  std::vector<const torch_cell*> stage_cell;
  const torch_cell* max_stage_cell = nullptr;
  const torch_cell* max_mb_cell = nullptr;
  int S = 0, M = 0;
  bool any_compute = false;
  for (int r = 0; r < P; ++r)
    for (const torch_cell& c : rows[static_cast<std::size_t>(r)]) {
      auto place = [&](const detail::torch_atom& a) {
        auto us = static_cast<std::size_t>(a.stage);
        if (us >= stage_rank.size()) {
          stage_rank.resize(us + 1, -1);
          stage_cell.resize(us + 1, nullptr);
        }
        if (stage_rank[us] >= 0 && stage_rank[us] != r) {
          const torch_cell& o = *stage_cell[us];
          throw schedule_error(detail::torch_msg(c, "stage " + to_text(a.stage) + " appears on rank " + to_text(r) + " (line " + to_text(c.line) +
                            ") and on rank " + to_text(stage_rank[us]) + " (line " + to_text(o.line) + ", cell " +
                            to_text(o.column) + " \"" + o.text + "\"); a stage runs on one rank"));
        }
        if (stage_rank[us] < 0) {
          stage_rank[us] = r;
          stage_cell[us] = &c;
        }
        if (a.stage + 1 > S) {
          S = a.stage + 1;
          max_stage_cell = &c;
        }
        if (a.mb + 1 > M) {
          M = a.mb + 1;
          max_mb_cell = &c;
        }
        if (detail::torch_compute(a.kind)) any_compute = true;
      };
      place(c.a);
      if (c.kind == torch_kind::overlap) place(c.b);
    }
  if (!any_compute) {
    if (max_stage_cell) throw schedule_error(detail::torch_msg(*max_stage_cell, "the file has no compute action (F, I, B, W or OVERLAP_F_B)"));
    throw schedule_error(detail::torch_msg(1, 1, "", "the file has no compute action (F, I, B, W or OVERLAP_F_B); every cell is empty"));
  }
  for (int s = 0; s < S; ++s)
    if (stage_rank[static_cast<std::size_t>(s)] < 0)
      throw schedule_error(detail::torch_msg(*max_stage_cell, "stage " + to_text(S - 1) + " appears but stage " + to_text(s) +
                                      " appears on no line; every stage 0.." + to_text(S - 1) + " must be placed on a rank"));
  if (static_cast<long long>(S) * M > detail::torch_max_cells)
    throw schedule_error(detail::torch_msg(*max_mb_cell, to_text(S) + " stages x " + to_text(M) + " microbatches exceeds loom's limit of " +
                                 to_text(detail::torch_max_cells) + " (stage, microbatch) pairs"));

  // Spelling of the backward.
  const auto cells = static_cast<std::size_t>(S) * static_cast<std::size_t>(M);
  auto pair = [M](int stage, int mb) { return static_cast<std::size_t>(stage) * static_cast<std::size_t>(M) + static_cast<std::size_t>(mb); };
  std::vector<char> has_w(cells, 0);
  const torch_cell* first_i = nullptr;
  for (auto const& row : rows)
    for (const torch_cell& c : row)
      for (const detail::torch_atom* a : {&c.a, &c.b}) {
        if (a == &c.b && c.kind != torch_kind::overlap) continue;
        if (a->kind == torch_kind::W) has_w[pair(a->stage, a->mb)] = 1;
        if (a->kind == torch_kind::I && !first_i) first_i = &c;
      }
  const torch_cell* first_legacy = nullptr;
  for (auto const& row : rows)
    for (const torch_cell& c : row) {
      const detail::torch_atom& a = c.kind == torch_kind::overlap ? c.b : c.a;
      if (a.kind == torch_kind::B && has_w[pair(a.stage, a.mb)] && !first_legacy) first_legacy = &c;
    }
  out.spelling = opt.spelling;
  if (out.spelling == torch_spelling::detect) {
    if (first_legacy && first_i)
      throw schedule_error(detail::torch_msg(*first_legacy, "this B has a W of the same stage and microbatch (legacy spelling: B = input gradient) but line " +
                                    to_text(first_i->line) + ", cell " + to_text(first_i->column) + " \"" + first_i->text +
                                    "\" uses I (current spelling: B = full backward); force a spelling to read it"));
    out.spelling = first_legacy ? torch_spelling::legacy : torch_spelling::current;
  }
  const bool legacy = out.spelling == torch_spelling::legacy;
  auto backward_kind = [&](const detail::torch_atom& a) {
    if (a.kind == torch_kind::I) return op::B;
    return legacy && has_w[pair(a.stage, a.mb)] ? op::B : op::BW;
  };

  detail::torch_check_completions(rows, S, M, out);

  // The schedule.
  schedule& s = out.sched;
  s.name = loom::text(opt.name);
  s.ranks = P;
  s.microbatches = M;
  s.stages = S;
  s.directions = 1;
  s.param_copies = 1;
  s.stage_to_rank = stage_rank;
  s.programs.resize(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    auto& prog = s.programs[static_cast<std::size_t>(r)];
    for (const torch_cell& c : rows[static_cast<std::size_t>(r)]) {
      const detail::torch_atom& a = c.a;
      auto peer_of = [&](int stage, std::string_view role) {
        if (stage < 0 || stage >= S)
          throw schedule_error(detail::torch_msg(c, loom::text(torch_token(a.kind)) + " of stage " + to_text(a.stage) + " names " + loom::text(role) +
                            " stage " + to_text(stage) + ", outside the stages 0.." + to_text(S - 1)));
        int peer = stage_rank[static_cast<std::size_t>(stage)];
        if (peer == r)
          throw schedule_error(detail::torch_msg(c, loom::text(torch_token(a.kind)) + " of stage " + to_text(a.stage) + " pairs with stage " + to_text(stage) +
                            ", which is on the same rank " + to_text(r) + "; PyTorch transfers nothing between stages of one rank"));
        return peer;
      };
      switch (c.kind) {
        case torch_kind::F: prog.push_back(forward(a.mb, a.stage)); break;
        case torch_kind::I:
        case torch_kind::B: prog.push_back(action{.kind = backward_kind(a), .mb = a.mb, .stage = a.stage}); break;
        case torch_kind::W: prog.push_back(backward_weight(a.mb, a.stage)); break;
        case torch_kind::overlap: prog.push_back(overlapped(a.mb, a.stage, backward_kind(c.b), c.b.mb, c.b.stage)); break;
        case torch_kind::send_f:
          prog.push_back(send_to(peer_of(a.stage + 1, "its receiving"), payload::activation, a.mb, a.stage));
          out.form = torch_csv_form::compute_comms;
          break;
        case torch_kind::recv_f:
          prog.push_back(recv_from(peer_of(a.stage - 1, "its sending"), payload::activation, a.mb, a.stage - 1));
          out.form = torch_csv_form::compute_comms;
          break;
        case torch_kind::send_b:
          prog.push_back(send_to(peer_of(a.stage - 1, "its receiving"), payload::gradient, a.mb, a.stage));
          out.form = torch_csv_form::compute_comms;
          break;
        case torch_kind::recv_b:
          prog.push_back(recv_from(peer_of(a.stage + 1, "its sending"), payload::gradient, a.mb, a.stage + 1));
          out.form = torch_csv_form::compute_comms;
          break;
        case torch_kind::unshard: ++out.unshard_cells; break;
        case torch_kind::reshard: ++out.reshard_cells; break;
        case torch_kind::reduce_grad: ++out.reduce_grad_cells; break;
        case torch_kind::wait_send_f:
        case torch_kind::wait_send_b: ++out.wait_send_cells; break;
        case torch_kind::wait_reduce_grad: ++out.wait_reduce_grad_cells; break;
      }
    }
  }

  // Placement.
  bool loop = S % P == 0, v = S == 2 * P;
  std::vector<int> per_rank(static_cast<std::size_t>(P), 0);
  for (int st = 0; st < S; ++st) {
    int r = stage_rank[static_cast<std::size_t>(st)];
    ++per_rank[static_cast<std::size_t>(r)];
    loop = loop && r == loop_rank(st, P);
    v = v && r == v_rank(st, P);
  }
  int most = 0;
  for (int n : per_rank) most = n > most ? n : most;
  s.placement = loop ? placement_kind::loop : v ? placement_kind::v : placement_kind::custom;
  s.chunks = loop ? S / P : v ? 2 : most;
  return out;
}

//! `import_torch_csv(text, opt).sched`: the schedule of a PyTorch pipelining CSV.
constexpr schedule read_torch_csv(std::string_view text, const torch_csv_options& opt = {}) {
  return import_torch_csv(text, opt).sched;
}

//! Options of `write_torch_csv`.
struct torch_csv_write_options {
  torch_spelling spelling = torch_spelling::current;  //!< backward spelling to write (`detect` means `current`)
  //! The form to write. `compute_only` needs a schedule without send/recv; `compute_comms` lowers a
  //! compute-only schedule first (`lower`). Default: `compute_comms` iff `s` has send/recv.
  std::optional<torch_csv_form> form = std::nullopt;
  //! compute_comms only: write PyTorch 2.15's completion points, a `WAIT_SEND_F`/`WAIT_SEND_B`
  //! for every send and a `WAIT_REDUCE_GRAD` after every `REDUCE_GRAD`. `false` writes the
  //! compute_comms form of PyTorch 2.10 to 2.14, which reads `WAIT_...` cells wrongly.
  bool waits = true;
};

//! Writes `s` in PyTorch pipelining's CSV format: one line per rank, one cell per action.
//!
//! The compute-only form (`PipelineScheduleMulti._load_csv`) holds the compute actions. Current
//! spelling: `F -> F`, `B -> I`, `W -> W`, `BW -> B`, `FB -> (F;I|B)OVERLAP_F_B`; legacy spelling
//! writes `B` for both backwards (a following `W` marks the input-gradient one).
//!
//! The compute_comms form (`_PipelineScheduleRuntime._load_csv(format="compute_comms")`) holds
//! the lowered programs: loom's send/recv as `SEND_F`/`RECV_F`/`SEND_B`/`RECV_B`, and what
//! PyTorch's runtime needs beyond them, placed where PyTorch's own lowering places it
//! (`_add_reduce_grad`, `_add_wait_send`):
//! - `sREDUCE_GRAD` after the action that completes stage `s`'s weight gradients (its last `W`
//!   or `BW`, with the sends that action issues): PyTorch scales the gradients there (divides
//!   them by the number of microbatches) and, under FSDP, reduces them;
//! - with `waits`, `sWAIT_REDUCE_GRAD` right after it;
//! - with `waits`, `sWAIT_SEND_Fm` right after the rank's backward of (`s`, `m`) (its receiver
//!   ran `F(s+1, m)` and sent the gradient back, so it has received the activation), and a wait
//!   for every other send (`SEND_B`s, forward sends with no backward on the rank) at the end of
//!   the line, in send order.
//!
//! Throws `schedule_error` for a schedule PyTorch's format cannot hold (two directions, several
//! parameter copies, weight versions across steps), and for a lowered schedule asked for in the
//! compute-only form.
constexpr loom::text write_torch_csv(const schedule& s, const torch_csv_write_options& opt = {}) {
  using detail::to_text;
  using detail::torch_kind;
  if (s.directions != 1)
    throw schedule_error("PyTorch's pipeline CSV has one path through the stages, but schedule '" + s.name + "' has " +
                         to_text(s.directions) + " directions (bidirectional schedules such as DualPipe and Chimera cannot be written)");
  if (s.param_copies != 1)
    throw schedule_error("PyTorch's pipeline CSV holds one copy of the parameters, but schedule '" + s.name + "' needs " +
                         to_text(s.param_copies) + " (param_copies)");
  if (s.versioned())
    throw schedule_error("PyTorch's pipeline CSV runs one synchronous step, but schedule '" + s.name + "' spans " + to_text(s.steps) +
                         " steps with weight versions (an asynchronous family): its versions and updates cannot be written");
  bool has_comm = false;
  for (auto const& prog : s.programs)
    for (const action& a : prog) {
      if (is_host_copy(a.kind))
        throw schedule_error("PyTorch's pipeline CSV has no action that copies an activation to host memory and back, but schedule '" +
                             s.name + "' offloads (" + to_string(a) + "): write it without its offload plan");
      if (is_vocab(a.kind))
        throw schedule_error("PyTorch's pipeline CSV has no vocabulary-parallel passes, but schedule '" + s.name + "' runs them (" +
                             to_string(a) + ")");
      has_comm = has_comm || is_transfer(a.kind);
    }
  const torch_csv_form form = opt.form ? *opt.form : has_comm ? torch_csv_form::compute_comms : torch_csv_form::compute_only;
  if (form == torch_csv_form::compute_only && has_comm)
    throw schedule_error("schedule '" + s.name + "' is lowered (it has send/recv actions), which PyTorch's compute_only form cannot hold; "
                         "write it before lowering, or in the compute_comms form");
  const bool comms = form == torch_csv_form::compute_comms;
  schedule lowered;
  if (comms && !has_comm) lowered = lower(s);
  const schedule& src = comms && !has_comm ? lowered : s;
  const bool legacy = opt.spelling == torch_spelling::legacy;
  const bool waits = comms && opt.waits;
  const int S = src.stages, M = src.microbatches;
  auto atom = [&](op k, int mb, int stage) {
    loom::text cell = to_text(stage);
    cell += k == op::F ? "F" : k == op::W ? "W" : k == op::BW ? "B" : (legacy ? "B" : "I");
    cell += to_text(mb);
    return cell;
  };
  auto idx = [M](int mb, int stage) { return detail::cell(mb, stage, M); };
  // Appends only: GCC 12's -Wrestrict misfires on `"literal" + std::string` at -O3.
  loom::text out;
  std::vector<int> last_grad(static_cast<std::size_t>(S), -1);
  std::vector<int> forward_send(static_cast<std::size_t>(S) * static_cast<std::size_t>(M), -1);
  for (auto const& prog : src.programs) {
    bool first = true;
    auto put = [&](std::string_view cell) {
      if (!first) out.push_back(',');
      first = false;
      out += cell;
    };
    // The last action that adds to each stage's weight gradients: REDUCE_GRAD follows it.
    for (int& g : last_grad) g = -1;
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (a.kind == op::W || a.kind == op::BW) last_grad[static_cast<std::size_t>(a.stage)] = static_cast<int>(i);
      if (a.kind == op::FB && a.bkind == op::BW) last_grad[static_cast<std::size_t>(a.bstage)] = static_cast<int>(i);
    }
    std::vector<action> sends;   // this line's sends, in order; a waited one gets mb = -1
    std::vector<int> reduce_due;  // stages whose REDUCE_GRAD follows the current action's sends
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      switch (a.kind) {
        case op::FB: {
          loom::text cell = "(";
          cell += atom(op::F, a.mb, a.stage);
          cell += ';';
          cell += atom(a.bkind, a.bmb, a.bstage);
          cell += ")OVERLAP_F_B";
          put(cell);
          break;
        }
        case op::send:
          put(detail::torch_cell_text(a.what == payload::activation ? torch_kind::send_f : torch_kind::send_b, a.stage, a.mb));
          if (a.what == payload::activation) forward_send[idx(a.mb, a.stage)] = static_cast<int>(sends.size());
          sends.push_back(a);
          break;
        case op::recv:
          // PyTorch names a receive by the receiving stage, loom by the producing one.
          put(detail::torch_cell_text(a.what == payload::activation ? torch_kind::recv_f : torch_kind::recv_b,
                                      a.what == payload::activation ? a.stage + 1 : a.stage - 1, a.mb));
          break;
        default: put(atom(a.kind, a.mb, a.stage)); break;
      }
      if (!comms) continue;
      // A backward of (s, m) proves that stage s+1 received F(s, m)'s activation.
      const bool backward = is_input_backward(a.kind) || a.kind == op::FB;
      const int bst = a.kind == op::FB ? a.bstage : a.stage, bmb = a.kind == op::FB ? a.bmb : a.mb;
      if (waits && backward && forward_send[idx(bmb, bst)] >= 0) {
        put(detail::torch_cell_text(torch_kind::wait_send_f, bst, bmb));
        sends[static_cast<std::size_t>(forward_send[idx(bmb, bst)])].mb = -1;
        forward_send[idx(bmb, bst)] = -1;
      }
      if (is_compute(a.kind) && last_grad[static_cast<std::size_t>(bst)] == static_cast<int>(i)) reduce_due.push_back(bst);
      const bool next_is_send = i + 1 < prog.size() && prog[i + 1].kind == op::send;
      if (next_is_send) continue;
      for (int st : reduce_due) {
        put(detail::torch_cell_text(torch_kind::reduce_grad, st, -1));
        if (waits) put(detail::torch_cell_text(torch_kind::wait_reduce_grad, st, -1));
      }
      reduce_due.clear();
    }
    for (const action& a : sends) {
      if (a.what == payload::activation && a.mb >= 0) forward_send[idx(a.mb, a.stage)] = -1;
      if (waits && a.mb >= 0)
        put(detail::torch_cell_text(a.what == payload::activation ? torch_kind::wait_send_f : torch_kind::wait_send_b, a.stage, a.mb));
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace loom
