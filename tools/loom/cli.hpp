// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The extension point of the `loom` command-line program, and the helpers its subcommands
//! share.
//!
//! Every `.cpp` file in `tools/loom/` is compiled into `loom` (the CMakeLists globs them), so a
//! new feature lives in its own file and registers itself with static objects; nobody edits
//! another engineer's file. `main.cpp` creates the `CLI::App`, installs every registered
//! command (by `order`, then name), applies every registered option extension to the
//! subcommand it names, parses, and turns every error into one line on stderr.
//!
//! Add a subcommand (`loom best`):
//! ```
//! namespace {
//! loom::cli::register_command best{{.name = "best", .order = 40, .install = [](CLI::App& app) {
//!   auto* sub = app.add_subcommand("best", "rank every family on a shape");
//!   auto req = loom::cli::add_request_options(*sub);          // --schedule --ranks ... --placement
//!   sub->callback([req] {
//!     loom::cli::request r = loom::cli::parse_request(*req);  // throws usage_error (exit 2)
//!     ...                                                      // print to stdout
//!   });
//! }}};
//! }
//! ```
//! Add an option to someone else's subcommand (`simulate --torch-csv FILE`), and a schedule
//! source that supplies the schedule instead of the registry when that option is set:
//! ```
//! namespace {
//! std::string csv_path;
//! loom::cli::register_options opt{"simulate", [](CLI::App& sub) {
//!   sub.add_option("--torch-csv", csv_path, "read the schedule from a PyTorch pipelining CSV");
//! }};
//! loom::cli::register_source src{{.name = "--torch-csv", .provide =
//!   [](const loom::cli::request& r) -> std::optional<loom::schedule> {
//!     if (csv_path.empty()) return std::nullopt;   // not selected: next source / the registry
//!     return read_torch_csv(csv_path);             // throw usage_error on a malformed file
//!   }}};
//! }
//! ```
//! `make_schedule(request)` (used by `simulate` and `render`) asks every source in turn; the
//! first that returns a schedule wins, and giving `--schedule` as well is an error. A source
//! active on a command line needs none of `--schedule --ranks --microbatches`.
//!
//! Errors and exit codes: throw `usage_error` (or `loom::schedule_error` / `loom::config_error`)
//! for bad input — unknown names, malformed numbers, shapes a family cannot run, unreadable or
//! unwritable files: `main` prints `loom: <message>` on ONE line to stderr and exits 2
//! (`exit_usage`). Throw `run_failure` when the input is fine but the result is not (an invalid
//! or deadlocking schedule): exit 1 (`exit_failure`). Everything else that escapes is an
//! internal error: one line, exit 1. Never print partial output before throwing a usage error.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <loom/schedule.hpp>
#include <loom/schedule/bound.hpp>

namespace loom::cli {

//! Exit status of a successful run.
inline constexpr int exit_ok = 0;
//! Exit status when the input was fine but the schedule is invalid or deadlocks.
inline constexpr int exit_failure = 1;
//! Exit status for bad input of any kind (one line on stderr).
inline constexpr int exit_usage = 2;

//! Bad input: `main` prints `loom: <what()>` on one line to stderr and exits with `exit_usage`.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! The input was fine but the outcome is a failure (e.g. an imported schedule that deadlocks):
//! one line on stderr, exit status `exit_failure`. Output already printed stays.
struct run_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! A subcommand: `install` adds it to the top-level app (`app.add_subcommand(name, ...)`) and
//! sets its callback. `order` sorts `loom --help` (built-ins use 10, 20, 30).
struct command {
  std::string name;
  int order = 100;
  std::function<void(CLI::App& app)> install;
};

//! An option (or flag) added to another file's subcommand `command`. Installed after every
//! command, in registration order; `install` receives that subcommand.
struct option_extension {
  std::string command;
  std::function<void(CLI::App& sub)> install;
};

struct request;

//! Where a schedule can come from other than the registry (e.g. `--torch-csv FILE`).
//! `provide` returns `std::nullopt` when its option was not given on this command line.
//! `name` is the option a user would type; it appears in conflict messages.
struct schedule_source {
  std::string name;
  std::function<std::optional<schedule>(const request&)> provide;
};

//! Every registered command (registration order).
inline std::vector<command>& commands() {
  static std::vector<command> v;
  return v;
}
//! Every registered option extension.
inline std::vector<option_extension>& option_extensions() {
  static std::vector<option_extension> v;
  return v;
}
//! Every registered schedule source.
inline std::vector<schedule_source>& schedule_sources() {
  static std::vector<schedule_source> v;
  return v;
}

//! Registers a command when constructed (use a namespace-scope static object).
struct register_command {
  explicit register_command(command c) { commands().push_back(std::move(c)); }
};
//! Registers an option extension of subcommand `cmd` when constructed.
struct register_options {
  register_options(std::string cmd, std::function<void(CLI::App&)> install) {
    option_extensions().push_back({std::move(cmd), std::move(install)});
  }
};
//! Registers a schedule source when constructed.
struct register_source {
  explicit register_source(schedule_source s) { schedule_sources().push_back(std::move(s)); }
};

// ---------------------------------------------------------------------------------------------
// Strict number parsing. CLI11 would accept "4x"-style input in places and its messages differ
// from ours; every numeric option is therefore taken as text and parsed here.

//! Upper bounds that keep a mistyped size from exhausting memory (a rule, never a clamp); ranks
//! and ranks x microbatches x chunks are the library's own limits (loom/schedule/shape.hpp).
inline constexpr int max_ranks = loom::max_ranks;
inline constexpr int max_microbatches = 1 << 16;
inline constexpr int max_chunks = 64;
//! Upper bound on ranks x microbatches x chunks (about the number of forwards).
inline constexpr long long max_cells = loom::max_shape_cells;

//! Parses `text` (the value of option `flag`) as a decimal integer in [lo, hi]; throws
//! `usage_error` naming the option and the value otherwise.
inline int parse_int(std::string_view flag, const std::string& text, int lo, int hi) {
  auto bad = [&](std::string why) {
    return usage_error(std::string(flag) + " '" + text + "' " + why);
  };
  if (text.empty()) throw bad("is empty; give an integer");
  long long v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec == std::errc::result_out_of_range) throw bad("is out of range");
  if (ec != std::errc{} || p != e) throw bad("is not an integer");
  if (v < lo) throw bad("must be >= " + std::to_string(lo));
  if (v > hi) throw bad("exceeds the limit of " + std::to_string(hi));
  return static_cast<int>(v);
}

//! Parses `text` (the value of option `flag`) as a finite decimal number >= `lo` (and <= `hi`);
//! rejects "", "nan", "inf", overflow ("1e999") and trailing text ("4x").
inline double parse_real(std::string_view flag, const std::string& text, double lo,
                         double hi = std::numeric_limits<double>::max()) {
  auto bad = [&](std::string why) { return usage_error(std::string(flag) + " '" + text + "' " + why); };
  if (text.empty()) throw bad("is empty; give a number");
  // The decimal grammar [+-]digits[.digits][(e|E)[+-]digits] (digits on at least one side of
  // the point), checked here; then strtod, which every standard library has (libc++ 19 has no
  // floating-point std::from_chars). Named non-numbers ("nan", "inf") are not of this grammar.
  std::size_t i = 0;
  const std::size_t n = text.size();
  auto digits = [&] {
    std::size_t start = i;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  if (text[i] == '+' || text[i] == '-') ++i;
  std::size_t mantissa = digits();
  if (i < n && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  bool ok = mantissa > 0;
  if (ok && i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    ok = digits() > 0;
  }
  if (!ok || i != n) {
    std::string word;  // lower case, without a sign: "nan", "inf", "infinity", "nan(...)"
    for (char c : text.substr(text[0] == '+' || text[0] == '-' ? 1 : 0))
      word += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    if (word == "inf" || word == "infinity" || word == "nan" || (word.rfind("nan(", 0) == 0 && word.back() == ')'))
      throw bad("is not a finite number");
    throw bad("is not a number");
  }
  errno = 0;
  const double v = std::strtod(text.c_str(), nullptr);
  if (errno == ERANGE) throw bad("is out of range");
  if (!std::isfinite(v)) throw bad("is not a finite number");
  auto num = [](double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  if (v < lo) throw bad("must be >= " + num(lo));
  if (v > hi) throw bad("must be <= " + num(hi));
  return v;
}

// ---------------------------------------------------------------------------------------------
// The common request: which schedule, which shape, which costs.

//! The raw text of the common options, as CLI11 stores it (parsed by `parse_request`).
struct request_text {
  std::string schedule, ranks, microbatches, chunks, steps = "1", group;
  std::string f = "1", b = "1", w = "1", c = "0", fb, mem_w_ratio = "1";
  std::string vocab_s = "0", vocab_t = "0", vocab_e = "0";  //!< vocabulary-parallel passes' times (docs/vocab.md)
  std::string mem_limit, placement = "loop";
  std::string costs_file;  //!< `--costs FILE`: a stage- and link-resolved cost model (docs/costs.md)
  //! The options behind the optional values, set by `add_request_options`: an option given with
  //! an empty value ("--ranks ''") is an error, not "absent". Null: absent when empty.
  CLI::Option *ranks_opt = nullptr, *microbatches_opt = nullptr, *chunks_opt = nullptr, *group_opt = nullptr, *fb_opt = nullptr,
              *mem_limit_opt = nullptr, *placement_opt = nullptr, *costs_opt = nullptr;
  //! The uniform cost options (they exclude `--costs`).
  std::vector<CLI::Option*> uniform_opts;
};

//! Reads the JSON cost file at `path` (schema: docs/costs.md); throws `usage_error` with one line
//! naming the file and the field for anything malformed. Defined in costs_file.cpp.
loom::cost_model read_cost_file(const std::string& path);

//! The parsed common options. `shape.ranks`/`microbatches` are 0 when not given (a schedule
//! source may not need them); `shape.chunks` is 0 for "the family's natural value".
struct request {
  std::string schedule;
  loom::shape shape{0, 0, 0};
  loom::costs cost{};
  loom::generate_options options{};
  bool placement_given = false;  //!< `--placement` was on the command line
  //! `--costs FILE`: the stage- and link-resolved model (also in `options.model`); `cost` then
  //! holds its per-share means (`loom::share_costs`) for families that take only uniform costs.
  std::optional<loom::cost_model> model;
  std::string costs_file;  //!< where `model` came from
};

//! Adds `--schedule --ranks --microbatches --chunks --f --b --w --c --fb --mem-w-ratio
//! --vocab-s --vocab-t --vocab-e --mem-limit --placement` to `sub`; returns the storage they fill (keep it in the callback).
inline std::shared_ptr<request_text> add_request_options(CLI::App& sub) {
  auto t = std::make_shared<request_text>();
  sub.add_option("--schedule,-s", t->schedule, "schedule family (see `loom list`)")->type_name("NAME");
  t->ranks_opt = sub.add_option("--ranks,-p", t->ranks, "P: pipeline ranks (devices)")->type_name("INT");
  t->microbatches_opt = sub.add_option("--microbatches,-m", t->microbatches, "m: microbatches per step")->type_name("INT");
  t->chunks_opt = sub.add_option("--chunks,-v", t->chunks, "V: model chunks per rank (default: the family's natural value)")->type_name("INT");
  sub.add_option("--steps,-T", t->steps,
                 "T: training steps one schedule spans without a flush (asynchronous families, e.g. pipedream; the others run 1)")
      ->capture_default_str()
      ->type_name("INT");
  t->group_opt = sub.add_option("--group", t->group,
                                "g: microbatch group size of a grouped family (group-interleaved-1f1b: ceil(P/2)..P, default ceil(P/2))")
                     ->type_name("INT");
  t->uniform_opts.push_back(
      sub.add_option("--f", t->f, "forward time of one microbatch through 1/P of the model")->capture_default_str()->type_name("NUMBER"));
  t->uniform_opts.push_back(sub.add_option("--b", t->b, "input-gradient backward time")->capture_default_str()->type_name("NUMBER"));
  t->uniform_opts.push_back(sub.add_option("--w", t->w, "weight-gradient backward time")->capture_default_str()->type_name("NUMBER"));
  t->uniform_opts.push_back(
      sub.add_option("--c", t->c, "p2p latency between dependent actions on different ranks")->capture_default_str()->type_name("NUMBER"));
  t->fb_opt = sub.add_option("--fb", t->fb, "time of an overlapped forward+backward pair (default: the sum of its parts)")->type_name("NUMBER");
  t->uniform_opts.push_back(t->fb_opt);
  t->uniform_opts.push_back(sub.add_option("--mem-w-ratio", t->mem_w_ratio, "M_W/M_B: fraction of an activation that lives until W")
                                ->capture_default_str()->type_name("NUMBER"));
  t->uniform_opts.push_back(sub.add_option("--vocab-s", t->vocab_s,
                                           "vocabulary parallelism: time of one microbatch's S pass (output layer, forward part) on a rank's shard")
                                ->capture_default_str()->type_name("NUMBER"));
  t->uniform_opts.push_back(sub.add_option("--vocab-t", t->vocab_t, "vocabulary parallelism: time of a T pass (output layer, backward part)")
                                ->capture_default_str()->type_name("NUMBER"));
  t->uniform_opts.push_back(sub.add_option("--vocab-e", t->vocab_e, "vocabulary parallelism: time of an IF or IB pass (input layer)")
                                ->capture_default_str()->type_name("NUMBER"));
  t->costs_opt = sub.add_option("--costs", t->costs_file,
                                "JSON cost file: per-stage f/b/w, activation and message sizes, link classes (docs/costs.md); "
                                "replaces --f --b --w --c --fb --mem-w-ratio")
                     ->type_name("FILE");
  t->mem_limit_opt = sub.add_option("--mem-limit", t->mem_limit, "per-rank activation limit for cost-aware families")->type_name("NUMBER");
  t->placement_opt = sub.add_option("--placement", t->placement,
                                     "cost-aware families: loop (any --chunks, default 1) or v (2 chunks, V placement)")
                          ->capture_default_str()->type_name("loop|v");
  return t;
}

//! Parses and checks the common options; throws `usage_error` naming the option and the value.
inline request parse_request(const request_text& t) {
  auto given = [](const CLI::Option* o, const std::string& text) { return o != nullptr ? o->count() > 0 : !text.empty(); };
  request r;
  r.schedule = t.schedule;
  const bool ranks = given(t.ranks_opt, t.ranks), microbatches = given(t.microbatches_opt, t.microbatches);
  if (!t.schedule.empty() && !ranks) throw usage_error("--ranks is required with --schedule '" + t.schedule + "'");
  if (!t.schedule.empty() && !microbatches)
    throw usage_error("--microbatches is required with --schedule '" + t.schedule + "'");
  if (ranks) r.shape.ranks = parse_int("--ranks", t.ranks, 1, max_ranks);
  if (microbatches) r.shape.microbatches = parse_int("--microbatches", t.microbatches, 1, max_microbatches);
  if (given(t.chunks_opt, t.chunks)) r.shape.chunks = parse_int("--chunks", t.chunks, 1, max_chunks);
  r.shape.steps = parse_int("--steps", t.steps, 1, max_microbatches);
  if (given(t.group_opt, t.group)) r.shape.group = parse_int("--group", t.group, 1, max_ranks);
  r.cost.f = parse_real("--f", t.f, 0);
  r.cost.b = parse_real("--b", t.b, 0);
  r.cost.w = parse_real("--w", t.w, 0);
  r.cost.c = parse_real("--c", t.c, 0);
  if (given(t.fb_opt, t.fb)) r.cost.fb = parse_real("--fb", t.fb, 0);
  r.cost.mem_w_ratio = parse_real("--mem-w-ratio", t.mem_w_ratio, 0, 1);
  r.cost.s = parse_real("--vocab-s", t.vocab_s, 0);
  r.cost.t = parse_real("--vocab-t", t.vocab_t, 0);
  r.cost.e = parse_real("--vocab-e", t.vocab_e, 0);
  if (r.cost.f + r.cost.b + r.cost.w <= 0) throw usage_error("--f, --b and --w are all 0; at least one must be > 0");
  r.options.cost = r.cost;
  if (given(t.costs_opt, t.costs_file)) {
    for (const CLI::Option* o : t.uniform_opts)
      if (o != nullptr && o->count() > 0)
        throw usage_error("give either --costs or " + o->get_name() + ", not both (the cost file holds every cost)");
    r.model = read_cost_file(t.costs_file);
    r.costs_file = t.costs_file;
    r.options.model = *r.model;
    r.cost = r.options.cost = loom::share_costs(*r.model, ranks ? r.shape.ranks : 1);
  }
  if (given(t.mem_limit_opt, t.mem_limit)) {
    r.options.mem_limit = parse_real("--mem-limit", t.mem_limit, 0);
    if (r.options.mem_limit <= 0) throw usage_error("--mem-limit '" + t.mem_limit + "' must be > 0");
  }
  if (t.placement == "loop") r.options.placement = placement_kind::loop;
  else if (t.placement == "v") r.options.placement = placement_kind::v;
  else throw usage_error("--placement '" + t.placement + "' is not one of: loop, v");
  r.placement_given = t.placement_opt != nullptr && t.placement_opt->count() > 0;
  long long cells = 1LL * r.shape.ranks * r.shape.microbatches * (r.shape.chunks > 0 ? r.shape.chunks : 1);
  if (cells > max_cells)
    throw usage_error("--ranks x --microbatches x --chunks = " + std::to_string(cells) + " exceeds the limit of " +
                      std::to_string(max_cells));
  if (cells * r.shape.steps > max_cells)
    throw usage_error("--ranks x --microbatches x --chunks x --steps = " + std::to_string(cells * r.shape.steps) +
                      " exceeds the limit of " + std::to_string(max_cells));
  return r;
}

//! The schedule the request names: from the first active schedule source, else generated by
//! the family `--schedule` in `loom::default_registry()`. Throws `usage_error` (unknown name,
//! missing option, conflicting sources) or `schedule_error` (a shape the family cannot run).
inline schedule make_schedule(const request& r) {
  std::optional<schedule> found;
  std::string from;
  for (auto const& src : schedule_sources()) {
    auto s = src.provide(r);
    if (!s) continue;
    if (found) throw usage_error("give only one of " + from + " and " + src.name);
    found = std::move(s);
    from = src.name;
  }
  if (found) {
    if (!r.schedule.empty()) throw usage_error("give either --schedule '" + r.schedule + "' or " + from + ", not both");
    return std::move(*found);
  }
  if (r.schedule.empty()) throw usage_error("--schedule is required (see `loom list`)");
  auto const* e = default_registry().find(r.schedule);
  if (e == nullptr) {
    std::string known;
    for (auto const& x : default_registry().entries()) {
      if (!known.empty()) known += ", ";
      known += x.name;
    }
    throw usage_error("unknown schedule '" + r.schedule + "' (known: " + known + ")");
  }
  // A cost-aware family's placement and chunk count go together (loop: any number of chunks per
  // rank, 1 by default; v: 2): without --placement, 2 chunks mean the V placement; a
  // contradiction is an error, never adjusted.
  loom::shape shape = r.shape;
  loom::generate_options options = r.options;
  if (!e->cost_aware) {
    if (r.placement_given)
      throw usage_error("--placement applies to cost-aware families (e.g. zb-auto); '" + e->name + "' has a fixed placement");
  } else if (r.placement_given) {
    if (options.placement == placement_kind::v && shape.chunks != 0 && shape.chunks != 2)
      throw usage_error("--placement v runs 2 chunk(s) per rank, but --chunks is " + std::to_string(shape.chunks));
    if (shape.chunks == 0) shape.chunks = options.placement == placement_kind::v ? 2 : 1;
  } else if (shape.chunks == 2) {
    options.placement = placement_kind::v;
  }
  return e->make(shape, options);
}

//! Opens `path` (the value of option `flag`) for writing; throws `usage_error` with the reason
//! when it cannot be written.
inline std::ofstream open_output(std::string_view flag, const std::string& path) {
  if (path.empty()) throw usage_error(std::string(flag) + " needs a file name");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw usage_error("cannot write " + std::string(flag) + " '" + path + "': " + std::strerror(errno));
  return out;
}

//! Writes `text` to `path` (the value of option `flag`) completely, or throws `usage_error`.
inline void write_file(std::string_view flag, const std::string& path, std::string_view text) {
  auto out = open_output(flag, path);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw usage_error("cannot write " + std::string(flag) + " '" + path + "': write failed");
}

//! A schedule with its validation (of the programs as given and, when they validate, of their
//! lowered form) and its simulation under the request's costs.
struct evaluated {
  loom::schedule sched;
  loom::validation valid;
  loom::simulation sim;
};

//! Validates (as given, then lowered) and simulates `s` under `k`, or under `model` when given.
inline evaluated evaluate(loom::schedule s, const loom::costs& k, const std::optional<loom::cost_model>& model = std::nullopt) {
  evaluated e;
  e.valid = loom::validate(s);
  if (e.valid.ok) e.valid = loom::validate(loom::lower(s));
  e.sim = model ? loom::simulate(s, *model) : loom::simulate(s, k);
  e.sched = std::move(s);
  return e;
}

//! A schedule's certified lower bound (loom::lower_bound: no order of the passes on its placement
//! does better) and its gap to it.
struct bound_report {
  loom::schedule_bound lb;
  double limit = 0;          //!< the per-rank limit the bound assumed
  bool own_peak = false;     //!< no --mem-limit: the schedule's own peak was used
  double gap_makespan = 0;   //!< (makespan - bound) / makespan
  double gap_rate = 0;       //!< bubble rate - bound
  bool available = true;     //!< false under a stage-resolved cost model: the bound assumes uniform stages
};

//! The bound for `e`'s placement under `k` and `mem_limit` (> 0), or the schedule's own peak
//! activation when no limit is given (the bound then covers every order holding no more memory).
inline bound_report bound_of(const evaluated& e, const loom::costs& k, double mem_limit,
                             const std::optional<loom::cost_model>& model = std::nullopt) {
  bound_report b;
  if (model) {
    b.available = false;
    return b;
  }
  b.own_peak = mem_limit <= 0;
  b.limit = b.own_peak ? e.sim.max_peak_activation() : mem_limit;
  b.lb = loom::lower_bound(e.sched, k, b.limit);
  b.gap_makespan = e.sim.makespan > 0 ? (e.sim.makespan - b.lb.makespan) / e.sim.makespan : 0;
  b.gap_rate = e.sim.bubble_rate - b.lb.bubble_rate;
  return b;
}

//! One line describing a cost model for summaries: its file, stage count and link terms.
inline std::string describe_model(const loom::cost_model& m, const std::string& file) {
  double f = 0, b = 0, w = 0;
  for (auto const& c : m.stages) {
    f += c.f;
    b += c.b;
    w += c.w;
  }
  auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  std::string out = "from " + file + ": " + std::to_string(m.stages.size()) + " stage" + (m.stages.size() == 1 ? "" : "s") +
                    " (sums f=" + num(f) + " b=" + num(b) + " w=" + num(w) + "), links intra " + num(m.intra.alpha) + " + " +
                    num(m.intra.beta) + "*bytes";
  if (m.ranks_per_node > 0)
    out += ", inter " + num(m.inter.alpha) + " + " + num(m.inter.beta) + "*bytes, " + std::to_string(m.ranks_per_node) +
           " ranks per node";
  return out + ", mem_w_ratio=" + num(m.mem_w_ratio);
}

//! `msg` on one line: newlines become "; " (validator messages render a grid over many lines).
inline std::string one_line(std::string msg) {
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  std::string out;
  for (std::size_t i = 0; i < msg.size(); ++i) {
    if (msg[i] == '\n') {
      out += "; ";
      while (i + 1 < msg.size() && msg[i + 1] == ' ') ++i;
    } else {
      out += msg[i];
    }
  }
  return out;
}

}  // namespace loom::cli
