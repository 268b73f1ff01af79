// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom simulate`: validates and simulates a schedule under the normative cost and memory model
// (ARCHITECTURE.md) and prints a summary, or with --json one JSON object (the CLI contract of
// issue 2, with issue 3's FB actions and param_copies).
#include <algorithm>
#include <optional>

#include <fmt/core.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "loom/schedule/offload.hpp"

namespace {

using nlohmann::json;

json action_json(const loom::action& a, const loom::action_time& t, bool versioned) {
  json j;
  j["op"] = std::string(loom::to_string(a.kind));
  j["mb"] = a.mb;
  j["stage"] = a.stage;
  if (a.kind == loom::op::FB) {
    j["bop"] = std::string(loom::to_string(a.bkind));
    j["bmb"] = a.bmb;
    j["bstage"] = a.bstage;
  }
  j["start"] = t.start;
  j["end"] = t.end;
  if (versioned) {
    j["version"] = a.version;
    if (a.update) j["update"] = true;
  }
  return j;
}

json to_json(const loom::cli::evaluated& e, const loom::cli::request& req) {
  const loom::costs& k = req.cost;
  const double mem_limit = req.options.mem_limit;
  auto const& s = e.sched;
  auto const& sim = e.sim;
  json j;
  j["schedule"] = s.name;
  j["ranks"] = s.ranks;
  j["microbatches"] = s.microbatches;
  j["chunks"] = s.chunks;
  j["stages"] = s.stages;
  j["directions"] = s.directions;
  j["placement"] = std::string(loom::to_string(s.placement));
  if (req.model) {
    j["costs"] = {{"file", req.costs_file}, {"stages", req.model->stages.size()}};
  } else {
    j["costs"] = {{"f", k.f}, {"b", k.b}, {"w", k.w}, {"c", k.c}, {"mem_w_ratio", k.mem_w_ratio}};
    j["costs"]["fb"] = k.fb >= 0 ? json(k.fb) : json(nullptr);
  }
  j["valid"] = e.valid.ok && sim.ok;
  if (!e.valid.ok) j["error"] = loom::cli::one_line(e.valid.message);
  else if (!sim.ok) j["error"] = loom::cli::one_line(sim.error);
  j["makespan"] = sim.makespan;
  j["bubble_ratio"] = sim.bubble_ratio;
  j["bubble_rate"] = sim.bubble_rate;
  j["peak_activation"] = sim.peak_activation;
  json str = json::array();
  for (int d = 0; d < s.directions; ++d) {
    json row = json::array();
    for (int st = 0; st < s.stages; ++st) {
      auto i = static_cast<std::size_t>(d * s.stages + st);
      row.push_back(i < s.stage_to_rank.size() ? s.stage_to_rank[i] : -1);
    }
    str.push_back(row);
  }
  j["stage_to_rank"] = str;
  json dirs = json::array();
  for (int mb = 0; mb < s.microbatches; ++mb) dirs.push_back(s.direction_of(mb));
  j["mb_direction"] = dirs;
  j["param_copies"] = s.param_copies;
  if (s.versioned()) {  // asynchronous families only, so the synchronous contract is unchanged
    j["steps"] = s.steps;
    j["stash"] = s.stash;
    j["version_slots"] = s.version_slots;
    j["weight_copies"] = sim.weight_copies;
  }
  json actions = json::array();
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    json row = json::array();
    for (std::size_t i = 0; i < s.programs[r].size(); ++i) {
      auto const& a = s.programs[r][i];
      if (!loom::is_compute(a.kind)) continue;
      loom::action_time t{};
      if (r < sim.times.size() && i < sim.times[r].size()) t = sim.times[r][i];
      row.push_back(action_json(a, t, s.versioned()));
    }
    actions.push_back(row);
  }
  j["actions"] = actions;
  if (sim.ok && req.model) {
    j["lower_bound"] = nullptr;  // the bound assumes uniform stages
    j["gap"] = nullptr;
  } else if (sim.ok) {
    const auto bd = loom::cli::bound_of(e, k, mem_limit);
    j["lower_bound"] = {{"makespan", bd.lb.makespan}, {"max_span", bd.lb.max_span}, {"bubble_rate", bd.lb.bubble_rate},
                        {"mem_limit", bd.limit}, {"mem_limit_source", bd.own_peak ? "own peak" : "--mem-limit"}};
    j["gap"] = {{"makespan", bd.gap_makespan}, {"bubble_rate", bd.gap_rate}};
  }
  return j;
}

std::string list(const std::vector<double>& v) {
  std::string out;
  for (double x : v) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{:g}", x);
  }
  return out;
}

// `--offload-chunks K --offload-time T`: PipeOffload's plan for the schedule (loom/schedule/offload.hpp).
struct offload_request {
  std::string chunks, time = "0.2";
  CLI::Option* chunks_opt = nullptr;
};

struct offload_result {
  loom::simulation run;  // the schedule with the plan's copies as actions, each copy taking the plan's copy time
  int chunks = 0;
  double time = 0;
  loom::offload_plan plan;
};

std::optional<offload_result> plan_of(const loom::cli::evaluated& e, const loom::cli::request& req, const offload_request& o) {
  if (o.chunks_opt == nullptr || o.chunks_opt->count() == 0) return std::nullopt;
  const int k = loom::cli::parse_int("--offload-chunks", o.chunks, 0, loom::cli::max_chunks);
  const double t = loom::cli::parse_real("--offload-time", o.time, 0);
  if (!(t > 0)) throw loom::cli::usage_error("--offload-time '" + o.time + "' must be > 0");
  if (req.model) throw loom::cli::usage_error("--offload-chunks plans under uniform costs (--f --b --w --c), not --costs");
  if (!e.valid.ok || !e.sim.ok) return std::nullopt;  // the schedule's own failure is reported as usual
  auto plan = loom::plan_offload(e.sched, req.cost, {.chunks = k, .time = t});
  if (!plan.ok) throw loom::cli::usage_error(std::string(plan.error));
  loom::costs with_copies = req.cost;
  with_copies.h = plan.copy_time / e.sched.stage_fraction();  // a stage's copy takes q h = the plan's copy time
  loom::simulation run = loom::simulate(loom::with_offload(e.sched, plan), with_copies);
  return offload_result{std::move(run), k, t, std::move(plan)};
}

void print_summary(const loom::cli::evaluated& e, const loom::cli::request& req, const std::optional<offload_result>& off) {
  const loom::costs& k = req.cost;
  const double mem_limit = req.options.mem_limit;
  auto const& s = e.sched;
  auto const& sim = e.sim;
  bool ok = e.valid.ok && sim.ok;
  fmt::print("schedule         {}\n", s.name);
  fmt::print("shape            {} ranks x {} microbatches, {} chunk{} per rank, {} stages per path, {} placement{}\n",
             s.ranks, s.microbatches, s.chunks, s.chunks == 1 ? "" : "s", s.stages, loom::to_string(s.placement),
             s.directions == 2 ? ", 2 directions" : "");
  if (s.versioned())
    fmt::print("steps            {} without a flush ({} microbatches each); weight versions per stage, {}\n", s.steps,
               s.step_microbatches(), s.stash ? "a backward reading its forward's (stashed)" : "every action reading the latest");
  if (req.model)
    fmt::print("costs            {}\n", loom::cli::describe_model(*req.model, req.costs_file));
  else
    fmt::print("costs            f={:g} b={:g} w={:g} c={:g}{} mem_w_ratio={:g}\n", k.f, k.b, k.w, k.c,
               k.fb >= 0 ? fmt::format(" fb={:g}", k.fb) : std::string(), k.mem_w_ratio);
  fmt::print("valid            {}\n", ok ? "yes (dependencies, and lowered send/recv FIFO replay)"
                                         : "NO: " + loom::cli::one_line(e.valid.ok ? sim.error : e.valid.message));
  if (!sim.ok) return;
  fmt::print("makespan         {:g}\n", sim.makespan);
  std::vector<double> bubble(static_cast<std::size_t>(s.ranks)), span_bubble(bubble.size());
  for (int r = 0; r < s.ranks; ++r) {
    bubble[static_cast<std::size_t>(r)] = sim.bubble_time(r);
    span_bubble[static_cast<std::size_t>(r)] = sim.span_bubble(r);
  }
  fmt::print("bubble ratio     {:.4f}   (1 - busy / (P * makespan))\n", sim.bubble_ratio);
  fmt::print("bubble rate      {:.4f}   (1 - busy / (P * max span), Zero Bubble paper)\n", sim.bubble_rate);
  fmt::print("bubble time      {}   (per rank: makespan - busy)\n", list(bubble));
  fmt::print("span bubble      {}   (per rank: span - busy)\n", list(span_bubble));
  fmt::print("peak activation  {}   (per rank; max {:g})\n", list(sim.peak_activation), sim.max_peak_activation());
  if (off) {
    std::size_t out = 0;
    for (const auto& c : off->plan.copies) out += c.reload ? 0 : 1;
    fmt::print("offload          first {} chunk{} of each rank, one copy {:g} (--offload-time {:g}): {} activations out and back\n",
               off->chunks, off->chunks == 1 ? "" : "s", off->plan.copy_time, off->time, out);
    fmt::print("peak offloaded   {}   (per rank, with the copies of PipeOffload's plan; max {:g})\n", list(off->plan.peak_activation),
               *std::max_element(off->plan.peak_activation.begin(), off->plan.peak_activation.end()));
    if (off->run.ok)
      fmt::print("offload run      makespan {:g} (+{:.2f}%), peak {}   (the copies as actions, each on its rank's host link)\n",
                 off->run.makespan, 100 * (off->run.makespan / sim.makespan - 1), list(off->run.peak_activation));
    else
      fmt::print("offload run      NO: {}\n", loom::cli::one_line(off->run.error));
  }
  fmt::print("param copies     {}\n", s.param_copies);
  if (s.versioned())
    fmt::print("weight versions  {}   (per rank: peak versions held, in units of the rank's share; max {:g})\n", list(sim.weight_copies),
               *std::max_element(sim.weight_copies.begin(), sim.weight_copies.end()));
  fmt::print("actions          {}\n", s.size());
  if (req.model) {
    fmt::print("lower bound      n/a   (loom::lower_bound assumes uniform stages; --costs gives per-stage costs)\n");
    return;
  }
  const auto bd = loom::cli::bound_of(e, k, mem_limit);
  fmt::print("lower bound      makespan {:g}, bubble rate {:.4f}   (no order on this placement within {} units of activation{} does better)\n",
             bd.lb.makespan, bd.lb.bubble_rate, bd.limit, bd.own_peak ? ", its own peak" : "");
  fmt::print("gap              makespan {:.2f}%, bubble rate +{:.4f}\n", 100 * bd.gap_makespan, bd.gap_rate);
}

loom::cli::register_command simulate_command{{.name = "simulate", .order = 20, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("simulate", "validate and simulate a schedule; print a summary or --json");
  auto req = loom::cli::add_request_options(*sub);
  auto as_json = std::make_shared<bool>(false);
  sub->add_flag("--json", *as_json, "print one JSON object (the CLI contract) instead of the summary");
  auto off = std::make_shared<offload_request>();
  off->chunks_opt = sub->add_option("--offload-chunks", off->chunks,
                                    "K: plan PipeOffload's activation offload of the first K chunks of every rank (loop placement, "
                                    "even ranks; docs/offload.md)")
                        ->type_name("INT");
  sub->add_option("--offload-time", off->time, "one copy's time as a fraction of a stage's f + b + w (PipeOffload's --offload-time)")
      ->capture_default_str()
      ->type_name("NUMBER");
  sub->callback([req, as_json, off] {
    loom::cli::request r = loom::cli::parse_request(*req);
    auto e = loom::cli::evaluate(loom::cli::make_schedule(r), r.cost, r.model);
    const auto plan = plan_of(e, r, *off);  // a refused plan is bad input: one line, nothing printed
    if (*as_json) {
      json j = to_json(e, r);
      if (plan) {
        json copies = json::array();
        for (const auto& c : plan->plan.copies)
          copies.push_back({{"rank", c.rank}, {"mb", c.mb}, {"stage", c.stage}, {"reload", c.reload}, {"start", c.start}, {"end", c.end},
                            {"position", c.position}});
        j["offload"] = {{"chunks", plan->chunks}, {"offload_time", plan->time}, {"copy_time", plan->plan.copy_time},
                        {"peak_activation", plan->plan.peak_activation}, {"copies", copies},
                        {"run", {{"valid", plan->run.ok}, {"makespan", plan->run.makespan}, {"peak_activation", plan->run.peak_activation}}}};
      }
      fmt::print("{}\n", j.dump());
    } else {
      print_summary(e, r, plan);
    }
    if (!e.valid.ok || !e.sim.ok)
      throw loom::cli::run_failure("schedule '" + e.sched.name + "' is not valid: " +
                                   (e.valid.ok ? e.sim.error : e.valid.message));
  });
}}};

}  // namespace
