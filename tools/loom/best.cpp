// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom best`: given costs, a shape and a memory limit, generates every registered family that
// can run the shape (cost-aware ones such as zb-auto on both the loop and the V placement),
// validates and simulates each, and prints them ranked: schedules within the memory limit first,
// then by bubble rate, peak activation and communication volume, each with the certified lower
// bound on its placement (loom::lower_bound) and its gap to it. With --json, one JSON object.
// With --steps T > 1 the asynchronous families (pipedream, pipedream-2bw, ...) join, run over T
// steps without a flush; a synchronous family's T flushed steps have its one-step bubble rate and
// T times its makespan (with --costs, plus the slowest rank's update of its stages after each
// step) and its transfers. "params" is the most weight versions any rank holds (per rank in --json).
// With --offload-time T, every schedule PipeOffload's plan accepts (loop placement, split
// backward, even ranks) is also ranked with its first k chunks offloaded, k = 1..chunks
// (loom::plan_offload, the copies as actions: loom::with_offload, each copy taking the plan's time
// on its rank's host link); its bound is the schedule's own (the copies change no order).
// With --vocab-parallel, the vocabulary-parallel families (1f1b-vocab-1/2, v-half-vocab-1/2) join:
// their passes take --vocab-s/--vocab-t/--vocab-e (or the cost file's "vocab"), their memory holds
// the extra microbatches the papers state, and their bound is left out (it does not model the
// vocabulary passes' barriers).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "loom/schedule/offload.hpp"

namespace {

using nlohmann::json;

//! One ranked row.
struct row {
  std::string name;       // family (and placement for cost-aware families)
  std::string placement;  // loop, v, bidirectional, custom
  int chunks = 1;
  double bubble_rate = 0, bubble_ratio = 0, makespan = 0, peak = 0;
  double param_copies = 1;               // the most weight versions a rank holds (units of its share)
  std::vector<double> weight_copies;     // per rank
  long long transfers = 0;  // p2p sends after lowering
  bool fits = true;         // peak <= mem limit on every rank (always true without a limit)
  loom::cli::bound_report bound;  // certified lower bound on its placement, and its gap to it
  std::size_t order = 0;          // position in the registry's order (ties keep it)
};

//! Number of point-to-point transfers in the lowered programs (sends; each has one receive).
long long transfers_of(const loom::schedule& lowered) {
  long long n = 0;
  for (auto const& p : lowered.programs)
    for (auto const& a : p) n += a.kind == loom::op::send ? 1 : 0;
  return n;
}

struct best_text {
  std::shared_ptr<loom::cli::request_text> req;
  bool json = false;
  std::string activation_bytes;
  std::string offload_time;  // empty: no offloaded rows
  bool vocab_parallel = false;  // also rank the vocabulary-parallel families
};

// The groups a grouped family is ranked with: --group g alone when given, else every g the family
// accepts (its own check decides the range) when there are at most 9 of them, and beyond that the
// two ends and the middle (a row per g would be hundreds of schedules on a large P).
std::vector<int> groups_to_try(const loom::family_entry& e, loom::shape s) {
  if (s.group != 0) return {s.group};
  std::vector<int> ok;
  for (int g = 1; g <= s.ranks; ++g) {
    s.group = g;
    if (e.check(s).empty()) ok.push_back(g);
  }
  if (ok.empty()) return {0};  // no group fits: one row, skipped with the family's own reason
  if (ok.size() <= 9) return ok;
  return {ok.front(), ok[ok.size() / 2], ok.back()};
}

void run_best(const best_text& t) {
  loom::cli::request r = loom::cli::parse_request(*t.req);
  if (!r.schedule.empty()) throw loom::cli::usage_error("loom best ranks every family; do not give --schedule");
  if (r.shape.ranks == 0) throw loom::cli::usage_error("--ranks is required");
  if (r.shape.microbatches == 0) throw loom::cli::usage_error("--microbatches is required");
  double bytes = -1;
  if (!t.activation_bytes.empty()) bytes = loom::cli::parse_real("--activation-bytes", t.activation_bytes, 0);
  double offload_time = 0;  // 0: no offloaded rows
  if (!t.offload_time.empty()) {
    offload_time = loom::cli::parse_real("--offload-time", t.offload_time, 0);
    if (!(offload_time > 0)) throw loom::cli::usage_error("--offload-time '" + t.offload_time + "' must be > 0");
    if (r.model) throw loom::cli::usage_error("--offload-time plans under uniform costs (--f --b --w --c), not --costs");
    if (r.shape.steps > 1) throw loom::cli::usage_error("--offload-time ranks one step (give no --steps)");
  }
  const double limit = r.options.mem_limit;  // 0: none given

  std::vector<row> rows;
  json skipped = json::array();
  const int T = r.shape.steps;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step && T == 1) continue;  // asynchronous families join with --steps T > 1
    if (e.vocab && !t.vocab_parallel) continue;  // vocabulary-parallel families join with --vocab-parallel
    // Cost-aware families run on every placement they support (the chunk count names it: loop 1,
    // v 2); a placement the family never runs (zb-v on loop) is not a row, and the label names
    // the placement only for families that run both.
    std::vector<std::pair<loom::shape, loom::generate_options>> runs;
    if (e.cost_aware) {
      for (auto pk : {loom::placement_kind::loop, loom::placement_kind::v}) {
        loom::generate_options o = r.options;
        o.placement = pk;
        loom::shape s = r.shape;
        s.steps = 1;
        s.chunks = pk == loom::placement_kind::v ? 2 : 1;
        // A chunk count the family rejects even on a roomy shape is not one of its placements.
        if (!e.check({.ranks = 2, .microbatches = 64, .chunks = s.chunks}).empty()) continue;
        runs.push_back({s, o});
      }
    } else {
      loom::shape s = e.resolve(r.shape);
      if (!e.multi_step) s.steps = 1;  // T flushed steps are T times one
      if (!e.grouped) {
        s.group = 0;  // --group names the grouped families' g; the others have none
        runs.push_back({s, r.options});
      } else {
        for (int g : groups_to_try(e, s)) {
          s.group = g;
          runs.push_back({s, r.options});
        }
      }
    }
    for (auto const& [s, o] : runs) {
      std::string label = e.cost_aware && runs.size() > 1 ? e.name + " (" + std::string(loom::to_string(o.placement)) + ")"
                          : e.grouped && runs.size() > 1 ? e.name + " (g=" + std::to_string(s.group) + ")"
                                                         : e.name;
      if (std::string rule = e.check(e.resolve(s)); !rule.empty()) {
        skipped.push_back({{"schedule", label}, {"reason", rule}});
        continue;
      }
      loom::schedule sched;
      try {
        sched = e.make(s, o);
      } catch (const loom::config_error&) {
        throw;  // a bad cost or limit is the user's input: report it (exit 2)
      } catch (const loom::schedule_error& ex) {
        skipped.push_back({{"schedule", label}, {"reason", loom::cli::one_line(ex.what())}});
        continue;
      }
      auto ev = loom::cli::evaluate(sched, r.cost, r.model);
      if (!ev.valid.ok || !ev.sim.ok)
        throw loom::cli::run_failure("family " + label + " produced an invalid schedule: " +
                                     loom::cli::one_line(ev.valid.ok ? ev.sim.error : ev.valid.message));
      row x;
      x.name = label;
      x.placement = std::string(loom::to_string(ev.sched.placement));
      x.chunks = ev.sched.chunks;
      x.bubble_rate = ev.sim.bubble_rate;
      x.bubble_ratio = ev.sim.bubble_ratio;
      x.makespan = ev.sim.makespan;
      if (!e.multi_step) {
        // A synchronous family runs its optimizer after each flushed step, outside the program:
        // under a model with update costs, every rank updates its stages then (the slowest rank
        // sets the time), so the asynchronous families' in-program updates compare like with like.
        if (r.model) {
          const loom::cost_model fitted = r.model->fit(ev.sched.stages);
          std::vector<double> per_rank(static_cast<std::size_t>(ev.sched.ranks), 0.0);
          // every direction's copy of a stage is updated where the schedule keeps one per direction
          const std::size_t copies = ev.sched.param_copies > 1 ? ev.sched.stage_to_rank.size() : static_cast<std::size_t>(ev.sched.stages);
          for (std::size_t i = 0; i < copies; ++i)
            per_rank[static_cast<std::size_t>(ev.sched.stage_to_rank[i])] +=
                fitted.stages[i % static_cast<std::size_t>(ev.sched.stages)].update;
          x.makespan += *std::max_element(per_rank.begin(), per_rank.end());
        }
        x.makespan *= T;
      }
      x.peak = ev.sim.max_peak_activation();
      x.weight_copies = ev.sim.weight_copies;
      x.param_copies = *std::max_element(x.weight_copies.begin(), x.weight_copies.end());
      x.transfers = transfers_of(loom::lower(ev.sched)) * (e.multi_step ? 1 : T);  // over the T steps
      x.fits = limit <= 0 || x.peak <= limit + 1e-9;
      // A schedule over the limit is measured against the bound at its own peak (it is no order within the limit).
      if (e.vocab) x.bound.available = false;  // the bound does not model the vocabulary passes and their barriers: not computed
      else x.bound = loom::cli::bound_of(ev, r.cost, x.fits ? limit : 0, r.model);
      x.order = rows.size();
      rows.push_back(x);
      // PipeOffload: the same schedule with its first k chunks offloaded, where the plan accepts it.
      if (offload_time > 0)
        for (int k = 1; k <= ev.sched.chunks; ++k) {
          const auto plan = loom::plan_offload(ev.sched, r.cost, {.chunks = k, .time = offload_time});
          if (!plan.ok) continue;
          loom::costs timed = r.cost;
          timed.h = plan.copy_time / ev.sched.stage_fraction();
          const auto run = loom::simulate(loom::with_offload(ev.sched, plan), timed);
          if (!run.ok) throw loom::cli::run_failure("family " + label + " with offload produced an invalid program: " + loom::cli::one_line(run.error));
          row y = x;
          y.name = label + " +offload " + std::to_string(k);
          y.bubble_rate = run.bubble_rate;
          y.bubble_ratio = run.bubble_ratio;
          y.makespan = run.makespan;
          y.peak = run.max_peak_activation();
          y.fits = limit <= 0 || y.peak <= limit + 1e-9;
          // The copies change no order: the schedule's bound at its own peak holds for it too.
          y.bound = loom::cli::bound_of(ev, r.cost, 0, r.model);
          y.bound.gap_makespan = y.makespan > 0 ? (y.makespan - y.bound.lb.makespan) / y.makespan : 0;
          y.bound.gap_rate = y.bubble_rate - y.bound.lb.bubble_rate;
          y.order = rows.size();
          rows.push_back(y);
        }
    }
  }
  // Under a cost model, families differ in stage count (the model is fitted to each), so the
  // step time (makespan) ranks them; under uniform costs, the bubble rate (as before).
  const bool by_time = r.model.has_value();
  // std::sort with the registry order as the last key (libstdc++ 12's std::stable_sort warns
  // under clang: deprecated get_temporary_buffer).
  std::sort(rows.begin(), rows.end(), [by_time](const row& a, const row& b) {
    if (a.fits != b.fits) return a.fits;
    if (by_time && a.makespan != b.makespan) return a.makespan < b.makespan;
    if (a.bubble_rate != b.bubble_rate) return a.bubble_rate < b.bubble_rate;
    if (a.peak != b.peak) return a.peak < b.peak;
    if (a.transfers != b.transfers) return a.transfers < b.transfers;
    return a.order < b.order;
  });

  if (t.json) {
    json j;
    j["ranks"] = r.shape.ranks;
    j["microbatches"] = r.shape.microbatches;
    j["steps"] = T;
    if (r.model)
      j["costs"] = {{"file", r.costs_file}, {"stages", r.model->stages.size()}};
    else
      j["costs"] = {{"f", r.cost.f}, {"b", r.cost.b}, {"w", r.cost.w}, {"c", r.cost.c},
                    {"fb", r.cost.fb >= 0 ? json(r.cost.fb) : json(nullptr)}, {"mem_w_ratio", r.cost.mem_w_ratio}};
    j["mem_limit"] = limit > 0 ? json(limit) : json(nullptr);
    json arr = json::array();
    int rank = 1;
    for (auto const& x : rows) {
      json o{{"rank", rank++},          {"schedule", x.name},         {"placement", x.placement},
             {"chunks", x.chunks},      {"bubble_rate", x.bubble_rate}, {"bubble_ratio", x.bubble_ratio},
             {"makespan", x.makespan},  {"peak_activation", x.peak},  {"param_copies", x.param_copies}, {"weight_copies", x.weight_copies},
             {"p2p_transfers", x.transfers}, {"within_mem_limit", x.fits}};
      if (bytes >= 0) o["p2p_bytes"] = bytes * static_cast<double>(x.transfers);
      if (x.bound.available) {
        o["lower_bound"] = {{"makespan", x.bound.lb.makespan}, {"max_span", x.bound.lb.max_span},
                            {"bubble_rate", x.bound.lb.bubble_rate}, {"mem_limit", x.bound.limit},
                            {"mem_limit_source", x.bound.own_peak ? "own peak" : "--mem-limit"}};
        o["gap"] = {{"makespan", x.bound.gap_makespan}, {"bubble_rate", x.bound.gap_rate}};
      } else {
        o["lower_bound"] = nullptr;  // the bound assumes uniform stages
        o["gap"] = nullptr;
      }
      arr.push_back(o);
    }
    j["ranking"] = arr;
    // The chosen schedule (rank 1) with its bound and gap, as in the text output.
    j["chosen"] = arr.empty() ? json(nullptr)
                              : json{{"schedule", arr[0]["schedule"]}, {"lower_bound", arr[0]["lower_bound"]}, {"gap", arr[0]["gap"]}};
    j["skipped"] = skipped;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  const std::string lim = limit > 0 ? fmt::format("{}", limit) : std::string("none");
  std::size_t nw = 24;  // the schedule column: as wide as its longest label ("group-interleaved-1f1b (g=2) +offload 1")
  for (auto const& x : rows) nw = std::max(nw, x.name.size());
  if (r.model) {
    // Per-stage costs: ranked by step time; no bound (it assumes uniform stages).
    std::string out = fmt::format("# loom best: p={} m={}{} costs {} mem_limit={}\n", r.shape.ranks, r.shape.microbatches,
                                  T > 1 ? fmt::format(" steps={}", T) : std::string(),
                                  loom::cli::describe_model(*r.model, r.costs_file), lim);
    out += fmt::format("{:>4}  {:<{}} {:>12} {:>11} {:>10} {:>6} {:>9} {:>6}", "rank", "schedule", nw, "makespan", "bubble_rate",
                       "peak_act", "params", "p2p", "fits");
    if (bytes >= 0) out += fmt::format(" {:>12}", "p2p_bytes");
    out += "\n";
    int rank = 1;
    for (auto const& x : rows) {
      out += fmt::format("{:>4}  {:<{}} {:>12.6g} {:>11.6f} {:>10.4g} {:>6g} {:>9} {:>6}", rank++, x.name, nw, x.makespan,
                         x.bubble_rate, x.peak, x.param_copies, x.transfers, x.fits ? "yes" : "no");
      if (bytes >= 0) out += fmt::format(" {:>12.6g}", bytes * static_cast<double>(x.transfers));
      out += "\n";
    }
    if (!rows.empty()) out += fmt::format("# chosen: {} (makespan {:g})\n", rows.front().name, rows.front().makespan);
    for (auto const& s : skipped)
      out += fmt::format("# skipped {}: {}\n", s["schedule"].get<std::string>(), s["reason"].get<std::string>());
    std::fputs(out.c_str(), stdout);
    return;
  }
  std::string head = fmt::format("# loom best: p={} m={}{} f={} b={} w={} c={} mem_w_ratio={} mem_limit={}\n", r.shape.ranks,
                                 r.shape.microbatches, T > 1 ? fmt::format(" steps={}", T) : std::string(), r.cost.f, r.cost.b,
                                 r.cost.w, r.cost.c, r.cost.mem_w_ratio, lim);
  std::string out = head;
  out += fmt::format("{:>4}  {:<{}} {:>11} {:>10} {:>6} {:>9} {:>6} {:>9} {:>8}", "rank", "schedule", nw, "bubble_rate", "peak_act",
                     "params", "p2p", "fits", "bound", "gap");
  if (bytes >= 0) out += fmt::format(" {:>12}", "p2p_bytes");
  out += "\n";
  int rank = 1;
  for (auto const& x : rows) {
    out += fmt::format("{:>4}  {:<{}} {:>11.6f} {:>10.3f} {:>6g} {:>9} {:>6}", rank++, x.name, nw, x.bubble_rate, x.peak, x.param_copies,
                       x.transfers, x.fits ? "yes" : "no");
    out += x.bound.available ? fmt::format(" {:>9.6f} {:>8.6f}", x.bound.lb.bubble_rate, x.bound.gap_rate) : fmt::format(" {:>9} {:>8}", "-", "-");
    if (bytes >= 0) out += fmt::format(" {:>12.6g}", bytes * static_cast<double>(x.transfers));
    out += "\n";
  }
  if (!rows.empty() && !rows.front().bound.available) {
    out += fmt::format("# chosen: {} (bubble rate {:.6f}; no bound: it does not model the vocabulary passes)\n", rows.front().name,
                       rows.front().bubble_rate);
  } else if (!rows.empty()) {
    auto const& top = rows.front();
    out += fmt::format("# chosen: {}; no order on its placement within {} units{} has a bubble rate below {:.6f} or a "
                       "makespan below {:g}; its gap: +{:.6f} bubble rate, {:.2f}% makespan\n",
                       top.name, top.bound.limit, top.bound.own_peak ? " (its own peak)" : "", top.bound.lb.bubble_rate,
                       top.bound.lb.makespan, top.bound.gap_rate, 100 * top.bound.gap_makespan);
  }
  for (auto const& s : skipped)
    out += fmt::format("# skipped {}: {}\n", s["schedule"].get<std::string>(), s["reason"].get<std::string>());
  std::fputs(out.c_str(), stdout);
}

loom::cli::register_command best_cmd{{.name = "best", .order = 40, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("best", "rank every family that can run a shape under costs and a memory limit");
  auto t = std::make_shared<best_text>();
  t->req = loom::cli::add_request_options(*sub);
  sub->add_flag("--json", t->json, "print one JSON object");
  sub->add_option("--activation-bytes", t->activation_bytes, "bytes per p2p transfer, to report communication bytes");
  sub->add_option("--offload-time", t->offload_time,
                  "also rank every schedule PipeOffload's plan accepts with its first k chunks offloaded, one copy taking T times a "
                  "stage's f + b + w (docs/offload.md)")
      ->type_name("T");
  sub->add_flag("--vocab-parallel", t->vocab_parallel,
                "also rank the vocabulary-parallel families (1f1b-vocab-1, 1f1b-vocab-2, v-half-vocab-1, v-half-vocab-2), their "
                "passes timed by --vocab-s --vocab-t --vocab-e or the cost file's \"vocab\" (docs/vocab.md)");
  sub->callback([t] { run_best(*t); });
}}};

}  // namespace
