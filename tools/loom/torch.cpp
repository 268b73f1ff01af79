// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// PyTorch pipelining CSV in the CLI (include/loom/render/torch_csv.hpp):
//   loom simulate --torch-csv FILE [--torch-spelling detect|current|legacy] [costs] [--json]
//     imports a PyTorch schedule (stage -> rank inferred, placement detected), then validates and
//     simulates it like any other schedule;
//   loom export --torch-csv FILE --schedule NAME --ranks P --microbatches M [--chunks V]
//               [--lowered [--no-waits]] [--torch-spelling current|legacy]
//     writes a loom schedule in PyTorch's format (FILE "-" = standard output).
// A malformed file is one line on stderr (`loom: FILE: torch csv line L, cell C "TEXT": reason`)
// and exit status 2.
#include <fmt/core.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <loom/render/torch_csv.hpp>

#include "cli.hpp"

namespace {

namespace cli = loom::cli;

loom::torch_spelling parse_spelling(const std::string& text, bool allow_detect) {
  if (text == "current") return loom::torch_spelling::current;
  if (text == "legacy") return loom::torch_spelling::legacy;
  if (text == "detect" && allow_detect) return loom::torch_spelling::detect;
  throw cli::usage_error("--torch-spelling '" + text + "' is not one of: " +
                         (allow_detect ? "detect, current, legacy" : "current, legacy"));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cli::usage_error("cannot read --torch-csv '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw cli::usage_error("cannot read --torch-csv '" + path + "': read failed");
  return ss.str();
}

std::string base_name(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// --- simulate --torch-csv FILE ---------------------------------------------------------------

struct import_options {
  std::string path;
  std::string spelling = "detect";
  CLI::App* sub = nullptr;
};
import_options& imports() {
  static import_options o;
  return o;
}

cli::register_options simulate_torch_options{"simulate", [](CLI::App& sub) {
  imports() = import_options{};  // a fresh command line (the CLI fuzz target parses many in one process)
  imports().sub = &sub;
  sub.add_option("--torch-csv", imports().path,
                 "read the schedule from a PyTorch pipelining CSV (stage -> rank inferred, placement detected)");
  sub.add_option("--torch-spelling", imports().spelling,
                 "detect|current|legacy: does B mean the full backward (current) or, before a W, the input gradient (legacy)")
      ->capture_default_str();
}};

// Prints what the import found, before the simulate summary (not with --json, whose object
// already carries stage_to_rank and placement).
void print_import(const loom::torch_csv_import& imp, const std::string& path) {
  auto const& s = imp.sched;
  std::string map;
  for (int st = 0; st < s.stages; ++st)
    map += fmt::format("{}{}->{}", st == 0 ? "" : " ", st, s.stage_to_rank[static_cast<std::size_t>(st)]);
  fmt::print("torch csv        {} ({} form, {} spelling of the backward)\n", path, loom::to_string(imp.form),
             loom::to_string(imp.spelling));
  fmt::print("stage -> rank    {}   (inferred; {} placement)\n", map, loom::to_string(s.placement));
  int dropped = imp.unshard_cells + imp.reshard_cells + imp.reduce_grad_cells + imp.wait_send_cells + imp.wait_reduce_grad_cells;
  if (imp.idle_cells > 0 || dropped > 0)
    fmt::print("dropped cells    {} idle, {} UNSHARD, {} RESHARD, {} REDUCE_GRAD, {} WAIT_SEND, {} WAIT_REDUCE_GRAD\n", imp.idle_cells,
               imp.unshard_cells, imp.reshard_cells, imp.reduce_grad_cells, imp.wait_send_cells, imp.wait_reduce_grad_cells);
  if (imp.form == loom::torch_csv_form::compute_comms)
    fmt::print("waits            {} of {} sends and {} of {} REDUCE_GRAD waited for, each after its operation{}\n",
               imp.sends - imp.unwaited_sends, imp.sends, imp.reduce_grad_cells - imp.unwaited_reduce_grads, imp.reduce_grad_cells,
               imp.unwaited_sends + imp.unwaited_reduce_grads > 0 ? " (PyTorch >= 2.15 needs every one waited for)" : "");
}

cli::register_source torch_source{{.name = "--torch-csv", .provide = [](const cli::request& r) -> std::optional<loom::schedule> {
  auto const& o = imports();
  if (o.path.empty()) return std::nullopt;
  const auto spelling = parse_spelling(o.spelling, true);
  const std::string text = read_file(o.path);
  loom::torch_csv_import imp;
  const std::string name = "torch-csv:" + base_name(o.path);
  try {
    imp = loom::import_torch_csv(text, {.spelling = spelling, .name = name});
  } catch (const loom::schedule_error& e) {
    throw cli::usage_error(o.path + ": " + e.what());
  }
  auto const& s = imp.sched;
  // Checked here as well as in make_schedule, so that nothing is printed before a usage error.
  if (!r.schedule.empty()) throw cli::usage_error("give either --schedule '" + r.schedule + "' or --torch-csv, not both");
  auto disagree = [&](const char* flag, int given, int found, const char* what) {
    if (given != 0 && given != found)
      throw cli::usage_error(fmt::format("{} {} disagrees with the {} {} of --torch-csv '{}'", flag, given, found, what, o.path));
  };
  disagree("--ranks", r.shape.ranks, s.ranks, "ranks");
  disagree("--microbatches", r.shape.microbatches, s.microbatches, "microbatches");
  disagree("--chunks", r.shape.chunks, s.chunks, "chunks per rank");
  bool json = o.sub != nullptr && o.sub->get_option("--json")->count() > 0;
  if (!json) print_import(imp, o.path);
  return imp.sched;
}}};

// --- export --torch-csv FILE -----------------------------------------------------------------

cli::register_command export_command{{.name = "export", .order = 60, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("export", "write a loom schedule in another tool's format (--torch-csv: PyTorch pipelining)");
  auto req = cli::add_request_options(*sub);
  struct export_text {
    std::string path, spelling = "current";
    bool lowered = false, no_waits = false;
  };
  auto t = std::make_shared<export_text>();
  sub->add_option("--torch-csv", t->path, "write PyTorch pipelining's schedule CSV to this file (\"-\": standard output)")
      ->required();
  sub->add_flag("--lowered", t->lowered,
                "write the compute+comms form (SEND_F/RECV_F/SEND_B/RECV_B from loom's lowering, REDUCE_GRAD, and the "
                "WAIT_SEND_F/WAIT_SEND_B/WAIT_REDUCE_GRAD completion points of PyTorch 2.15) instead of compute-only");
  sub->add_flag("--no-waits", t->no_waits,
                "with --lowered: leave out the WAIT_* cells, for PyTorch 2.10-2.14 (which does not know them)");
  sub->add_option("--torch-spelling", t->spelling, "current|legacy: B = full backward and I = input gradient, or B for both")
      ->capture_default_str();
  sub->callback([req, t] {
    cli::request r = cli::parse_request(*req);
    const auto spelling = parse_spelling(t->spelling, false);
    loom::schedule s = cli::make_schedule(r);
    if (auto v = loom::validate(s); !v.ok)
      throw cli::run_failure("schedule '" + s.name + "' is not valid: " + v.message);
    if (t->no_waits && !t->lowered) throw cli::usage_error("--no-waits applies to the --lowered form only");
    const auto form = t->lowered ? loom::torch_csv_form::compute_comms : loom::torch_csv_form::compute_only;
    const std::string csv = loom::write_torch_csv(s, {.spelling = spelling, .form = form, .waits = !t->no_waits});
    if (t->path == "-") fmt::print("{}", csv);
    else cli::write_file("--torch-csv", t->path, csv);
  });
}}};

}  // namespace
