// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom exact`: the exact mode (loom/schedule/exact.hpp) for small shapes: proves the best bubble
// rate any order of split F/B/W passes on the loop or V placement can reach under the costs and
// the memory limit, or reports the best found with its gap to what it proved, next to zb-auto.
#include <fmt/core.h>
#include <fmt/format.h>

#include <memory>
#include <string>

#include <loom/schedule/exact.hpp>
#include <nlohmann/json.hpp>

#include "cli.hpp"

namespace {

using nlohmann::json;

struct exact_text {
  std::shared_ptr<loom::cli::request_text> req;
  bool json = false;
  std::string seconds = "10";
};

void run_exact(const exact_text& t) {
  loom::cli::request r = loom::cli::parse_request(*t.req);
  if (!r.schedule.empty()) throw loom::cli::usage_error("loom exact searches every order; do not give --schedule");
  if (r.shape.ranks == 0) throw loom::cli::usage_error("--ranks is required");
  if (r.shape.microbatches == 0) throw loom::cli::usage_error("--microbatches is required");
  const double seconds = loom::cli::parse_real("--seconds", t.seconds, 0);
  loom::shape s = r.shape;
  const auto pk = r.options.placement;
  if (pk == loom::placement_kind::v && s.chunks != 0 && s.chunks != 2)
    throw loom::cli::usage_error("--placement v runs 2 chunk(s) per rank, but --chunks is " + std::to_string(s.chunks));
  if (s.chunks == 0) s.chunks = pk == loom::placement_kind::v ? 2 : 1;
  const double limit = r.options.mem_limit > 0 ? r.options.mem_limit : s.ranks;
  auto res = loom::solve_exact(s, pk, r.cost, limit, {.seconds = seconds});
  auto za = loom::simulate(loom::generate(loom::zb_auto{}, s, {.cost = r.cost, .mem_limit = limit, .placement = pk}), r.cost);
  double za_span = 0;
  for (double v : za.span) za_span = v > za_span ? v : za_span;
  if (t.json) {
    json j;
    j["ranks"] = s.ranks;
    j["microbatches"] = s.microbatches;
    j["chunks"] = s.chunks;
    j["placement"] = std::string(loom::to_string(pk));
    j["costs"] = {{"f", r.cost.f}, {"b", r.cost.b}, {"w", r.cost.w}, {"c", r.cost.c}, {"mem_w_ratio", r.cost.mem_w_ratio}};
    j["mem_limit"] = limit;
    j["optimal"] = res.optimal;
    j["max_span"] = res.span;
    j["bubble_rate"] = res.bubble_rate;
    j["lower_bound"] = {{"max_span", res.bound_span}, {"bubble_rate", res.bound_rate}};
    j["gap"] = {{"max_span", res.span > 0 ? (res.span - res.bound_span) / res.span : 0.0},
                {"bubble_rate", res.bubble_rate - res.bound_rate}};
    j["zb_auto"] = {{"max_span", za_span}, {"bubble_rate", za.bubble_rate}};
    j["nodes"] = res.nodes;
    j["seconds"] = res.seconds;
    json progs = json::array();
    for (auto const& prog : res.best.programs) {
      json row = json::array();
      for (auto const& a : prog) row.push_back(loom::to_string(a));
      progs.push_back(row);
    }
    j["programs"] = progs;
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("# loom exact: p={} m={} chunks={} placement={} f={:g} b={:g} w={:g} c={:g} mem_w_ratio={:g} mem_limit={:g}\n",
             s.ranks, s.microbatches, s.chunks, loom::to_string(pk), r.cost.f, r.cost.b, r.cost.w, r.cost.c,
             r.cost.mem_w_ratio, limit);
  fmt::print("result           {}\n", res.optimal ? "optimal (the search finished)"
                                                   : "best found (limit reached before the search finished)");
  fmt::print("longest span     {:g}   (bubble rate {:.4f})\n", res.span, res.bubble_rate);
  fmt::print("lower bound      {:g}   (bubble rate {:.4f}; no order in the search space does better)\n", res.bound_span,
             res.bound_rate);
  fmt::print("gap              {:.2f}% of the span, bubble rate +{:.4f}\n",
             res.span > 0 ? 100 * (res.span - res.bound_span) / res.span : 0.0, res.bubble_rate - res.bound_rate);
  fmt::print("zb-auto          {:g}   (bubble rate {:.4f})\n", za_span, za.bubble_rate);
  fmt::print("search           {} nodes in {:.2f} s\n", res.nodes, res.seconds);
}

loom::cli::register_command exact_cmd{{.name = "exact", .order = 45, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("exact", "prove the best schedule of split passes for a small shape (p <= 4, m <= 8)");
  auto t = std::make_shared<exact_text>();
  t->req = loom::cli::add_request_options(*sub);
  sub->add_flag("--json", t->json, "print one JSON object");
  sub->add_option("--seconds", t->seconds, "time limit of the search (0: none)")->capture_default_str()->type_name("NUMBER");
  sub->callback([t] { run_exact(*t); });
}}};

}  // namespace
