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
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
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
};

namespace detail {

//! Action types of PyTorch's `_ComputationType`, by their CSV token.
enum class torch_kind : unsigned char { F, I, B, W, unshard, reshard, reduce_grad, send_f, recv_f, send_b, recv_b, overlap };

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
  std::string text;
  torch_kind kind = torch_kind::F;
  torch_atom a;  //!< the action, or the overlap's forward half
  torch_atom b;  //!< the overlap's backward half
};

//! The message of a malformed cell: `torch csv line L, cell C "TEXT": why`.
constexpr std::string torch_msg(int line, int column, std::string_view text, std::string_view why) {
  std::string m = "torch csv line ";
  m += to_text(line);
  m += ", cell ";
  m += to_text(column);
  m += " \"";
  m += text;
  m += "\": ";
  m += why;
  return m;
}
//! As above, for a parsed cell.
constexpr std::string torch_msg(const torch_cell& c, std::string_view why) { return torch_msg(c.line, c.column, c.text, why); }

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
  }
  return "?";
}

constexpr bool torch_compute(torch_kind k) {
  return k == torch_kind::F || k == torch_kind::I || k == torch_kind::B || k == torch_kind::W;
}
constexpr bool torch_comm(torch_kind k) {
  return k == torch_kind::send_f || k == torch_kind::recv_f || k == torch_kind::send_b || k == torch_kind::recv_b;
}

//! Parses a decimal index at the front of `s` (advancing it); -1 if `s` starts with no digit.
constexpr long long torch_number(std::string_view& s, int line, int column, std::string_view cell, std::string_view what) {
  if (s.empty() || !torch_digit(s.front())) return -1;
  long long v = 0;
  while (!s.empty() && torch_digit(s.front())) {
    v = v * 10 + (s.front() - '0');
    if (v > torch_max_index)
      throw schedule_error(detail::torch_msg(line, column, cell, std::string(what) + " index exceeds loom's limit of " + to_text(torch_max_index)));
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
               "\"" + std::string(all) + "\" does not start with a stage index (expected <stage><type><microbatch>, e.g. 2F0)"));
  std::size_t n = 0;
  while (n < s.size() && ((s[n] >= 'A' && s[n] <= 'Z') || s[n] == '_')) ++n;
  const std::string_view token = s.substr(0, n);
  s.remove_prefix(n);
  constexpr torch_kind kinds[] = {torch_kind::F,       torch_kind::I,       torch_kind::B,           torch_kind::W,
                                  torch_kind::unshard, torch_kind::reshard, torch_kind::reduce_grad, torch_kind::send_f,
                                  torch_kind::recv_f,  torch_kind::send_b,  torch_kind::recv_b};
  bool found = false;
  for (torch_kind k : kinds)
    if (torch_token(k) == token) {
      out.kind = k;
      found = true;
    }
  if (!found) {
    std::string why = token.empty() ? "no action type after stage " + to_text(stage)
                                    : "unknown action type \"" + std::string(token) + "\"";
    throw schedule_error(detail::torch_msg(line, column, cell,
               why + " (expected F, I, B, W, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD or REDUCE_GRAD)"));
  }
  long long mb = torch_number(s, line, column, cell, "microbatch");
  if (!s.empty())
    throw schedule_error(detail::torch_msg(line, column, cell, "unexpected text \"" + std::string(s) + "\" after the action"));
  bool needs_mb = torch_compute(out.kind) || torch_comm(out.kind);
  if (needs_mb && mb < 0)
    throw schedule_error(detail::torch_msg(line, column, cell, "action " + std::string(torch_token(out.kind)) + " of stage " + to_text(stage) + " has no microbatch index"));
  out.stage = static_cast<int>(stage);
  out.mb = needs_mb ? static_cast<int>(mb) : -1;
  return out;
}

//! Parses one non-empty, trimmed cell.
constexpr torch_cell torch_parse_cell(std::string_view text, int line, int column) {
  torch_cell c;
  c.line = line;
  c.column = column;
  c.text = std::string(text);
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
    throw schedule_error(detail::torch_msg(c, "a parenthesised cell must end in OVERLAP_F_B, not \"" + std::string(suffix) + "\""));
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
      throw schedule_error(detail::torch_msg(c, "OVERLAP_F_B may only hold F, I or B actions, not " + std::string(torch_token(p.kind))));
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
      std::string value;
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
      if (quoted && !rest.empty()) throw schedule_error(detail::torch_msg(line, column, value + std::string(rest), "text after a quoted cell's closing quote"));
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

  // The schedule.
  schedule& s = out.sched;
  s.name = std::string(opt.name);
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
          throw schedule_error(detail::torch_msg(c, std::string(torch_token(a.kind)) + " of stage " + to_text(a.stage) + " names " + std::string(role) +
                            " stage " + to_text(stage) + ", outside the stages 0.." + to_text(S - 1)));
        int peer = stage_rank[static_cast<std::size_t>(stage)];
        if (peer == r)
          throw schedule_error(detail::torch_msg(c, std::string(torch_token(a.kind)) + " of stage " + to_text(a.stage) + " pairs with stage " + to_text(stage) +
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

//! Options of `write_torch_csv`: the backward spelling to write (`detect` means `current`).
struct torch_csv_write_options {
  torch_spelling spelling = torch_spelling::current;
};

//! Writes `s` in PyTorch pipelining's CSV format: one line per rank, one cell per action. A
//! compute-only schedule gives the compute-only form (`PipelineScheduleMulti._load_csv`), a
//! lowered one (with send/recv) the compute+comms form (`_load_csv(format="compute_comms")`).
//! Current spelling: `F -> F`, `B -> I`, `W -> W`, `BW -> B`, `FB -> (F;I|B)OVERLAP_F_B`; legacy
//! spelling writes `B` for both backwards (a following `W` marks the input-gradient one).
//! Throws `schedule_error` for a schedule PyTorch's format cannot hold (two directions, several
//! parameter copies).
constexpr std::string write_torch_csv(const schedule& s, const torch_csv_write_options& opt = {}) {
  using detail::to_text;
  if (s.directions != 1)
    throw schedule_error("PyTorch's pipeline CSV has one path through the stages, but schedule '" + s.name + "' has " +
                         to_text(s.directions) + " directions (bidirectional schedules such as DualPipe and Chimera cannot be written)");
  if (s.param_copies != 1)
    throw schedule_error("PyTorch's pipeline CSV holds one copy of the parameters, but schedule '" + s.name + "' needs " +
                         to_text(s.param_copies) + " (param_copies)");
  const bool legacy = opt.spelling == torch_spelling::legacy;
  auto atom = [&](op k, int mb, int stage) {
    std::string cell = to_text(stage);
    cell += k == op::F ? "F" : k == op::W ? "W" : k == op::BW ? "B" : (legacy ? "B" : "I");
    cell += to_text(mb);
    return cell;
  };
  // Appends only: GCC 12's -Wrestrict misfires on `"literal" + std::string` at -O3.
  std::string out;
  for (auto const& prog : s.programs) {
    bool first = true;
    for (const action& a : prog) {
      if (!first) out.push_back(',');
      first = false;
      switch (a.kind) {
        case op::FB:
          out += '(';
          out += atom(op::F, a.mb, a.stage);
          out += ';';
          out += atom(a.bkind, a.bmb, a.bstage);
          out += ")OVERLAP_F_B";
          break;
        case op::send:
          out += to_text(a.stage);
          out += a.what == payload::activation ? "SEND_F" : "SEND_B";
          out += to_text(a.mb);
          break;
        case op::recv:
          // PyTorch names a receive by the receiving stage, loom by the producing one.
          out += to_text(a.what == payload::activation ? a.stage + 1 : a.stage - 1);
          out += a.what == payload::activation ? "RECV_F" : "RECV_B";
          out += to_text(a.mb);
          break;
        default: out += atom(a.kind, a.mb, a.stage); break;
      }
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace loom
