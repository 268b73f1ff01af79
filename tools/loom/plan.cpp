// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom plan --model FILE --cluster FILE [--top N] [--json] [--families LIST] [--vocab-parallel]
// [--offload] [--recompute LIST] [--sp on|off|both]`: searches dp x tp x pp (and ep with experts), Megatron sequence parallelism, activation
// recomputation, schedule family and chunks for a GPT model on a GPU cluster (loom::plan), and
// prints the fastest configurations that fit in memory as a markdown table (or one JSON object).
// The files' format is in plan_io.hpp and docs/plan.md. While the search runs longer than a
// second, a progress line is drawn on stderr when stderr is a terminal (never in pipes or logs).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "plan_io.hpp"

namespace {

struct plan_text {
  std::string model, cluster, top = "5", families, recompute, sp = "both";
  bool json = false;
  bool vocab_parallel = false;
  bool no_grids = false;
  bool context = false;
  bool offload = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string fmt_gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

void run_plan(const plan_text& t) {
  if (t.model.empty()) throw loom::cli::usage_error("--model FILE is required");
  if (t.cluster.empty()) throw loom::cli::usage_error("--cluster FILE is required");
  const int top = loom::cli::parse_int("--top", t.top, 1, 1000);
  loom::plan_options o;
  if (!t.families.empty()) {
    o.families.clear();
    for (auto const& f : split(t.families)) {
      if (loom::detail::find_plan_vocab_family(f) != nullptr) {  // vocabulary-parallel: planned with the layers spread over the ranks
        o.families.push_back(f);
        continue;
      }
      auto const* e = loom::default_registry().find(f);
      if (e == nullptr) throw loom::cli::usage_error("--families: unknown schedule '" + f + "' (see `loom list`)");
      if (e->multi_step)
        throw loom::cli::usage_error("--families: '" + f + "' is asynchronous (a different training rule); loom plan searches "
                                     "synchronous training (compare it with `loom best --steps T`)");
      o.families.push_back(f);
    }
  }
  if (t.vocab_parallel)
    for (auto const& f : loom::detail::plan_vocab_families)
      if (std::find(o.families.begin(), o.families.end(), f.name) == o.families.end()) o.families.emplace_back(f.name);
  if (!t.recompute.empty()) {
    o.recompute.clear();
    for (auto const& r : split(t.recompute)) {
      if (r == "none") o.recompute.push_back(loom::recompute_kind::none);
      else if (r == "selective") o.recompute.push_back(loom::recompute_kind::selective);
      else if (r == "full") o.recompute.push_back(loom::recompute_kind::full);
      else throw loom::cli::usage_error("--recompute '" + r + "' is not one of: none, selective, full");
    }
  }
  if (t.sp != "on" && t.sp != "off" && t.sp != "both") throw loom::cli::usage_error("--sp '" + t.sp + "' is not one of: on, off, both");
  o.sp_on = t.sp != "off";
  o.sp_off = t.sp != "on";
  o.grids = !t.no_grids;
  o.context = t.context;
  o.offload = t.offload;
  const auto model = loom::plan_io::read_model(t.model);
  const auto cluster = loom::plan_io::read_cluster(t.cluster);

  const bool tty = isatty(fileno(stderr)) != 0;
  const auto start = std::chrono::steady_clock::now();
  bool drawn = false;
  auto last = start;
  if (tty)
    o.progress = [&](std::size_t done, std::size_t total) {
      const auto now = std::chrono::steady_clock::now();
      // After the first second, at most ten redraws a second (and always the last).
      if (now - start < std::chrono::seconds(1) || (now - last < std::chrono::milliseconds(100) && done != total)) return;
      last = now;
      std::fprintf(stderr, "\rloom plan: %zu/%zu configurations simulated", done, total);
      std::fflush(stderr);
      drawn = true;
    };
  loom::plan_report rep = loom::plan(model.desc, cluster.desc, o);
  if (drawn) std::fprintf(stderr, "\r\033[K");
  if (rep.ranked.empty())
    throw loom::cli::run_failure("no configuration fits in " + fmt_gib(cluster.desc.usable_bytes()) + " GiB per GPU (" + std::to_string(rep.layouts) + " layouts, " + std::to_string(rep.over_memory) +
                                 " configurations over the limit)");
  if (t.json) {
    nlohmann::json j;
    j["model"] = model.name;
    j["cluster"] = cluster.name;
    j["layouts"] = rep.layouts;
    j["evaluated"] = rep.evaluated;
    j["over_memory"] = rep.over_memory;
    if (t.offload) j["refused_offload_plans"] = rep.refused;
    j["fitting"] = rep.ranked.size();
    nlohmann::json arr = nlohmann::json::array();
    for (std::size_t i = 0; i < rep.ranked.size() && i < static_cast<std::size_t>(top); ++i)
      arr.push_back(loom::plan_io::to_json(rep.ranked[i], i + 1));
    j["ranking"] = arr;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  const std::string reserved =
      cluster.desc.reserved_bytes > 0 ? " (" + fmt_gib(cluster.desc.reserved_bytes) + " GiB reserved)" : std::string();
  std::printf("# loom plan: %s on %s: %lld GPUs (%lld per node), %.0f GiB each%s, %.4g TFLOP/s x %.3g\n",
              model.name.empty() ? t.model.c_str() : model.name.c_str(), cluster.name.empty() ? t.cluster.c_str() : cluster.name.c_str(),
              cluster.desc.gpus, cluster.desc.gpus_per_node, cluster.desc.memory_bytes / (1024.0 * 1024 * 1024), reserved.c_str(),
              cluster.desc.peak_flops / 1e12, cluster.desc.achievable_fraction);
  const std::string refused = t.offload ? ", " + std::to_string(rep.refused) + " offload plans refused" : std::string();
  std::printf("# %zu layouts, %zu configurations simulated, %zu over memory%s; the %zu fastest of %zu that fit:\n", rep.layouts,
              rep.evaluated, rep.over_memory, refused.c_str(), std::min(rep.ranked.size(), static_cast<std::size_t>(top)), rep.ranked.size());
  std::fputs(loom::plan_io::table(rep, static_cast<std::size_t>(top)).c_str(), stdout);
}

loom::cli::register_command plan_cmd{{.name = "plan", .order = 70, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("plan", "search dp x tp x pp (and ep with experts, cp with --context-parallel), tensor-parallel grids, SP, recomputation and schedule for a model on a cluster");
  auto t = std::make_shared<plan_text>();
  sub->add_option("--model", t->model, "model file (JSON; see docs/plan.md)")->type_name("FILE");
  sub->add_option("--cluster", t->cluster, "cluster file (JSON; see docs/plan.md)")->type_name("FILE");
  sub->add_option("--top", t->top, "how many configurations to print")->capture_default_str()->type_name("N");
  sub->add_flag("--json", t->json, "print one JSON object");
  sub->add_option("--families", t->families, "schedule families to try, comma-separated (default: 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-auto, zb-v, v-half, v-min)")
      ->type_name("LIST");
  sub->add_flag("--vocab-parallel", t->vocab_parallel,
                "also try vocabulary parallelism: 1f1b-vocab-1, 1f1b-vocab-2, v-half-vocab-1, v-half-vocab-2 (the input and output "
                "layers split over the pipeline ranks; docs/vocab.md)");
  sub->add_option("--recompute", t->recompute, "recomputation modes to try: none,selective,full (default: all)")->type_name("LIST");
  sub->add_option("--sp", t->sp, "try Megatron sequence parallelism on, off or both (where tp > 1)")
      ->capture_default_str()->type_name("on|off|both");
  sub->add_flag("--no-grids", t->no_grids,
                "try Megatron's 1D tensor parallelism only (by default the search also tries the 2D, 2.5D and 3D grids of dense "
                "models whose microbatch splits into whole sequences per grid member; docs/plan.md)");
  sub->add_flag("--offload", t->offload,
                "also try PipeOffload: group-interleaved-1f1b with every group size and the first 0..chunks chunks of every rank "
                "offloaded to host memory over the cluster file's \"host\" link (docs/plan.md, docs/offload.md)");
  sub->add_flag("--context-parallel", t->context,
                "also try context parallelism: the sequence over cp ranks, its attention by Ulysses, ring attention, USP or TokenRing, "
                "and DSP for a spatial-temporal model (\"frames\" in the model file) (dense models on the 1D split; docs/plan.md)");
  sub->callback([t] { run_plan(*t); });
}}};

}  // namespace
