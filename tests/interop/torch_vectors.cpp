// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The files PyTorch 2.15 wrote for its own schedules (tests/interop/data/torch-2.15, made by
// tools/torch_interop/torch_check.py --vectors; see the README there): loom reads every one, and
// where loom's family is the same schedule, loom's export equals PyTorch's file.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <loom/render/torch_csv.hpp>
#include <loom/schedule.hpp>

namespace {

namespace fs = std::filesystem;

const fs::path vector_dir = fs::path(__FILE__).parent_path() / "data" / "torch-2.15";

std::string slurp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

using rows_t = std::vector<std::vector<std::string>>;

// The cells of each line (the vectors have no quoting), empty ones kept.
rows_t rows_of(const std::string& text) {
  rows_t rows;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    rows.emplace_back();
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) rows.back().push_back(cell);
    if (!line.empty() && line.back() == ',') rows.back().emplace_back();
  }
  return rows;
}

// `text` with each CR LF turned into LF.
std::string unix_lines(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i)
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) out.push_back(text[i]);
  return out;
}

bool has(std::string_view cell, std::string_view what) { return cell.find(what) != std::string_view::npos; }
bool is_recv(std::string_view c) { return has(c, "RECV_"); }
bool is_fsdp(std::string_view c) { return has(c, "UNSHARD") || has(c, "RESHARD"); }
bool is_reduce(std::string_view c) { return has(c, "REDUCE_GRAD"); }

// Each line's cells that `keep` accepts.
template <class Keep>
rows_t only(const rows_t& rows, Keep keep) {
  rows_t out;
  for (auto const& row : rows) {
    out.emplace_back();
    for (auto const& c : row)
      if (keep(c)) out.back().push_back(c);
  }
  return out;
}

// Each line's receives, grouped by the rank that sends them (each group in line order): what
// tagless FIFO matching pairs with that rank's sends.
std::vector<std::map<int, std::vector<std::string>>> receives_by_sender(const rows_t& rows, const std::vector<int>& stage_to_rank) {
  std::vector<std::map<int, std::vector<std::string>>> out(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (auto const& c : rows[r]) {
      if (!is_recv(c)) continue;
      const int stage = std::stoi(c);
      const int from = has(c, "RECV_F") ? stage - 1 : stage + 1;
      out[r][stage_to_rank[static_cast<std::size_t>(from)]].push_back(c);
    }
  return out;
}

// A PyTorch schedule and the loom family that builds the same schedule.
struct same_schedule {
  const char* torch;
  const char* loom;
  int chunks;
};
// The three where the compute orders coincide (checked below on every vector shape). PyTorch's
// ScheduleLoopedBFS runs the backwards in reverse microbatch order and loom's looped-bfs in
// order; ScheduleZBVZeroBubble and loom's cost-aware zb-v differ in the cool-down;
// ScheduleInterleavedZeroBubble has no loom family; Schedule1F1B is covered by its own test.
constexpr same_schedule pairs[] = {
    {"ScheduleGPipe", "gpipe", 0},
    {"ScheduleInterleaved1F1B", "interleaved-1f1b", 2},
    {"ScheduleDualPipeV", "dualpipe-v", 0},
};
struct vector_shape {
  int ranks, microbatches;
};
constexpr vector_shape shapes[] = {{2, 4}, {3, 6}, {4, 8}};

fs::path vector_path(std::string_view cls, vector_shape s, std::string_view form) {
  return vector_dir / (std::string(cls) + "_" + std::to_string(s.ranks) + "rank_" + std::to_string(s.microbatches) + "mb_" +
                       std::string(form) + ".csv");
}

loom::schedule loom_schedule(const same_schedule& p, vector_shape s) {
  return loom::default_registry().at(p.loom).make({.ranks = s.ranks, .microbatches = s.microbatches, .chunks = p.chunks});
}

}  // namespace

TEST_CASE("Every file PyTorch 2.15 wrote for its own schedules reads, and all but Schedule1F1B's validate") {
  int files = 0, comms = 0;
  REQUIRE(fs::is_directory(vector_dir));
  for (auto const& entry : fs::directory_iterator(vector_dir)) {
    if (entry.path().extension() != ".csv") continue;
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    ++files;
    const std::string text = slurp(entry.path());
    loom::torch_csv_import imp;
    REQUIRE_NOTHROW(imp = loom::import_torch_csv(text));
    const bool is_comms = has(name, "_comms");
    CHECK(imp.form == (is_comms ? loom::torch_csv_form::compute_comms : loom::torch_csv_form::compute_only));
    // Every send and reduction in a PyTorch 2.15 file has its wait, after it.
    CHECK(imp.unwaited_sends == 0);
    CHECK(imp.unwaited_reduce_grads == 0);
    CHECK(imp.wait_send_cells == imp.sends);
    CHECK(imp.wait_reduce_grad_cells == imp.reduce_grad_cells);
    if (is_comms) {
      ++comms;
      CHECK(imp.sends > 0);
      CHECK(imp.reduce_grad_cells == imp.sched.stages);  // one per stage, after its last backward
      CHECK(imp.unshard_cells == imp.sched.stages);
    }
    auto v = loom::validate(imp.sched);
    if (has(name, "Schedule1F1B_")) {
      // PyTorch 2.15's Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..m
      // instead of 0..m-1; PyTorch's own _validate_schedule rejects it as well.
      CHECK_FALSE(v.ok);
      CHECK_MESSAGE(has(v.message, "has no F"), v.message);
      continue;
    }
    CHECK_MESSAGE(v.ok, v.message);
    auto sim = loom::simulate(imp.sched);
    CHECK(sim.ok);
  }
  CHECK(files == 39);
  CHECK(comms == 18);
}

TEST_CASE("Loom's compute-only export equals PyTorch's file where the schedules are the same") {
  // Equal cell for cell, line for line, once PyTorch's empty cells (idle time steps: loom's
  // programs have none, time comes from its simulator) and the REDUCE_GRAD/WAIT_REDUCE_GRAD that
  // PyTorch's single-stage schedules put in their compute order are left out. Byte-equal where
  // PyTorch wrote neither (DualPipeV), apart from the line ends: Python's csv.writer ends lines
  // with CR LF, loom with LF (both read either).
  for (auto const& p : pairs)
    for (auto s : shapes) {
      CAPTURE(p.torch);
      CAPTURE(s.ranks);
      const std::string torch = slurp(vector_path(p.torch, s, "compute"));
      const std::string ours = loom::write_torch_csv(loom_schedule(p, s));
      CHECK(only(rows_of(torch), [](const std::string& c) { return !c.empty() && !is_reduce(c); }) == rows_of(ours));
      if (!has(torch, ",,") && !has(torch, "\n,") && !has(torch, "REDUCE_GRAD")) CHECK(unix_lines(torch) == ours);
    }
  CHECK(unix_lines(slurp(vector_path("ScheduleDualPipeV", {4, 8}, "compute"))) == loom::write_torch_csv(loom_schedule(pairs[2], {4, 8})));
}

TEST_CASE("Loom's lowered export equals PyTorch 2.15's lowering of the same schedule except where a receive is posted") {
  // PyTorch posts each receive when the sender's send is placed (its lowering walks the ranks in
  // lock step); loom places it just before its consumer. So: each line's receives from each
  // sending rank are the same cells in the same order (the order tagless FIFO matching pairs them
  // with that rank's sends; receives from two different ranks may interleave differently), and
  // every other cell is equal in order, once the UNSHARD/RESHARD
  // cells (FSDP parameter gathering, outside loom's model and not written by it) are left out.
  // That covers every send, WAIT_SEND_F/WAIT_SEND_B, REDUCE_GRAD and WAIT_REDUCE_GRAD.
  for (auto const& p : pairs)
    for (auto s : shapes) {
      CAPTURE(p.torch);
      CAPTURE(s.ranks);
      const rows_t torch = rows_of(slurp(vector_path(p.torch, s, "comms")));
      const loom::schedule ls = loom_schedule(p, s);
      const std::vector<int>& s_to_r = ls.stage_to_rank;
      const rows_t ours = rows_of(loom::write_torch_csv(ls, {.form = loom::torch_csv_form::compute_comms}));
      REQUIRE(torch.size() == ours.size());
      auto other = [](const std::string& c) { return !is_recv(c) && !is_fsdp(c); };
      auto recv = [](const std::string& c) { return is_recv(c); };
      CHECK(only(torch, other) == only(ours, other));
      CHECK(receives_by_sender(torch, s_to_r) == receives_by_sender(ours, s_to_r));
      CHECK(only(torch, recv) != rows_t(torch.size()));
      // No cell of loom's file is missing from PyTorch's, and loom's has no FSDP cell.
      for (auto const& row : ours)
        for (auto const& c : row) CHECK_FALSE(is_fsdp(c));
    }
}

TEST_CASE("PyTorch 2.15's Schedule1F1B order differs from loom's 1f1b only on the last rank, where PyTorch's is invalid") {
  for (auto s : shapes) {
    CAPTURE(s.ranks);
    const rows_t torch = only(rows_of(slurp(vector_path("Schedule1F1B", s, "compute"))),
                              [](const std::string& c) { return !c.empty() && !is_reduce(c); });
    const rows_t ours = rows_of(loom::write_torch_csv(loom::generate(loom::one_f_one_b{}, {.ranks = s.ranks, .microbatches = s.microbatches})));
    REQUIRE(torch.size() == ours.size());
    for (std::size_t r = 0; r + 1 < torch.size(); ++r) CHECK(torch[r] == ours[r]);
    // PyTorch's last line runs forwards 1..m: microbatch 0 is never forwarded, microbatch m is.
    const auto& last = torch.back();
    const std::string stage = std::to_string(s.ranks - 1);
    CHECK(std::find(last.begin(), last.end(), stage + "F0") == last.end());
    CHECK(std::find(last.begin(), last.end(), stage + "F" + std::to_string(s.microbatches)) != last.end());
    CHECK(torch.back() != ours.back());
  }
}
