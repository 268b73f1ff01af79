// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan with tensor-parallel grids (2D, 2.5D, 3D; issue 25): a grid layer's collectives are
// `grid_block_volume` (the volumes the mesh example's counters equal) priced per grid group on
// the link the group runs on, the memory splits as the grids split it, the search tries exactly
// the grids that fit the cluster and the model, and on a GPT 70B shape a 3D grid wins at 16
// sequences per microbatch but not at 4.
#include <doctest/doctest.h>

#include <loom/plan.hpp>

#include "plan_support.hpp"

#include <cmath>
#include <set>
#include <string>

namespace {

namespace pf = loom::plan_formulas;
using loom::grid_group;
using loom::tp_kind;
using plan_test::close;
using plan_test::small_cluster;

// Eight sequences of 64 tokens per microbatch: the grids below split them into whole sequences.
constexpr loom::model_desc gm{.layers = 4, .hidden = 256, .heads = 8, .seq = 64, .vocab = 1000, .micro_batch = 8, .global_batch = 64};

struct grid_case {
  tp_kind kind;
  long long tp;
  int depth;
};

// The configuration of `g` on 16 GPUs, one pipeline rank.
loom::plan_config config_of(const grid_case& g) {
  const long long dp = 16 / g.tp;
  return {.dp = dp, .tp = g.tp, .pp = 1, .family = "1f1b", .chunks = 1, .microbatches = gm.global_batch / (gm.micro_batch * dp),
          .tp_grid = g.kind, .tp_depth = g.depth};
}

}  // namespace

TEST_CASE("plan, grids: a grid layer's collectives are grid_block_volume priced per grid group on its link") {
  // 4 GPUs per node, tp innermost: a grid's rows and columns (members t and t + 1, t + 2) stay in
  // a node on these grids, its depth group (members t and t + 4) leaves it.
  const loom::cluster_desc c = small_cluster(16, 4, 80);
  loom::cluster_desc free = c;
  free.intra = free.inter = {.alpha = 0, .beta = 0};
  for (const grid_case& g : {grid_case{tp_kind::d2, 4, 1}, grid_case{tp_kind::d2_5, 8, 2}, grid_case{tp_kind::d3, 8, 2}}) {
    const loom::plan_config k = config_of(g);
    const loom::tp_grid grid = loom::make_tp_grid(g.kind, static_cast<int>(g.tp), g.kind == tp_kind::d2_5 ? g.depth : 0);
    INFO(std::string(grid.describe().view()));
    const auto cm = loom::plan_cost_model(gm, c, k), cm0 = loom::plan_cost_model(gm, free, k);
    // The member's tokens: 8 x 64 over q (2D), q d (2.5D) or q^2 (3D) token blocks.
    const std::size_t n = g.kind == tp_kind::d2 ? 512 / 2 : 512 / 4;
    auto priced = [&](loom::grid_block_volume::call call) {
      const auto v = loom::grid_block_volume::of(grid, n, 256, 1024, call);
      double t = 0;
      for (const auto& [key, e] : v.elements) {
        const auto [x, op] = key;
        const int size = x == grid_group::depth ? grid.depth : grid.q;
        const loom::link_cost& l = x == grid_group::depth ? c.inter : c.intra;
        t += static_cast<double>(v.calls.at(key)) * (size - 1) * l.alpha + static_cast<double>(e) * 2 * loom::bus_factor(op, size) * l.beta;
      }
      return t;
    };
    const double L = 4;
    const auto& s = cm.stages.at(0);
    const auto& s0 = cm0.stages.at(0);
    CHECK(close(s.f - s0.f, L * priced(loom::grid_block_volume::call::forward)));
    CHECK(close(s.b - s0.b, L * priced(loom::grid_block_volume::call::input)));
    CHECK(close(s.w - s0.w, L * priced(loom::grid_block_volume::call::weight)));
    CHECK(s.w > s0.w);  // the weight gradient's broadcasts and reduces (1D's W has no collective)
    // Full recomputation runs the forward's collectives again in B.
    loom::plan_config kf = k;
    kf.recompute = loom::recompute_kind::full;
    const auto fr = loom::plan_cost_model(gm, c, kf), fr0 = loom::plan_cost_model(gm, free, kf);
    CHECK(close(fr.stages[0].b - fr0.stages[0].b,
                L * (priced(loom::grid_block_volume::call::input) + priced(loom::grid_block_volume::call::forward))));
  }
}

TEST_CASE("plan, grids: the weights split over tp (2.5D over q x q), every activation and the pipeline message over tp") {
  const loom::cluster_desc c = small_cluster(16, 4, 80);
  for (const grid_case& g : {grid_case{tp_kind::d2, 4, 1}, grid_case{tp_kind::d2_5, 8, 2}, grid_case{tp_kind::d3, 8, 2}}) {
    const loom::plan_config k = config_of(g);
    const auto cm = loom::plan_cost_model(gm, c, k);
    const double weights_over = g.kind == tp_kind::d2_5 ? 4 : static_cast<double>(g.tp);
    const double params = 4 * pf::layer_params(gm) + pf::embedding_params(gm) + static_cast<double>(gm.vocab) * gm.hidden;
    CHECK(close(cm.stages[0].param_bytes, params / weights_over * 2));
    CHECK(close(cm.stages[0].activation,
                4 * pf::layer_activation_bytes(gm, g.tp, true, loom::recompute_kind::none) + pf::logit_activation_bytes(gm, g.tp)));
    CHECK(close(cm.stages[0].message_bytes, pf::p2p_message_bytes(gm, g.tp, true)));
    // evaluate_plan's model state: the same split.
    const auto r = loom::evaluate_plan(gm, c, k, loom::default_registry().at("1f1b").make({1, static_cast<int>(k.microbatches), 1}));
    CHECK(close(r.state_bytes, params / weights_over * gm.state_bytes_per_param));
  }
}

TEST_CASE("plan, grids: the search tries every grid that fits the cluster and the model, and no other") {
  const loom::cluster_desc c = small_cluster(16, 4, 80);
  loom::plan_options o;
  o.families = {"1f1b", "interleaved-1f1b"};
  const loom::plan_report rep = loom::plan(gm, c, o);
  std::set<std::string> seen;
  for (const auto& r : rep.ranked) {
    const auto& k = r.config;
    if (k.tp_grid == tp_kind::d1) continue;
    const loom::tp_grid g = loom::detail::plan_grid(k);
    seen.insert(std::string(g.describe().view()));
    CHECK(loom::detail::plan_grid_rule(gm, g).empty());
    CHECK(c.gpus % (k.tp * k.pp * k.dp) == 0);
    CHECK((k.tp % c.gpus_per_node == 0 || c.gpus_per_node % k.tp == 0));
    CHECK_FALSE(k.sp);
  }
  // 16 GPUs, 8 heads, 8 sequences per microbatch: 2d 2x2 and 4x4, 2.5d 2x2x2 and 2x2x4 (8 token
  // blocks of one sequence each), 3d 2x2x2; 3d 4x4x4 needs 64 GPUs.
  CHECK(seen == std::set<std::string>{"2d 2x2", "2d 4x4", "2.5d 2x2x2", "2.5d 2x2x4", "3d 2x2x2"});
  // A grid and the 1D split of the same degrees are both kept (different configurations).
  bool both = false;
  for (const auto& a : rep.ranked)
    for (const auto& b : rep.ranked)
      both = both || (a.config.tp_grid == tp_kind::d2 && b.config.tp_grid == tp_kind::d1 && a.config.tp == b.config.tp &&
                      a.config.dp == b.config.dp && a.config.pp == b.config.pp && a.config.family == b.config.family);
  CHECK(both);

  auto grids_in = [&](const loom::model_desc& m, const loom::plan_options& opts) {
    int count = 0;
    for (const auto& r : loom::plan(m, c, opts).ranked) count += r.config.tp_grid != tp_kind::d1 ? 1 : 0;
    return count;
  };
  CHECK(grids_in(gm, o) > 0);
  // One sequence per microbatch: no grid has whole sequences per member.
  loom::model_desc one = gm;
  one.micro_batch = 1;
  CHECK(grids_in(one, o) == 0);
  // Switched off.
  loom::plan_options off = o;
  off.grids = false;
  CHECK(grids_in(gm, off) == 0);
  // A mixture of experts: not modelled on grids.
  loom::model_desc moe = gm;
  moe.experts = 4;
  CHECK(grids_in(moe, o) == 0);
}

TEST_CASE("plan, grids: a grid the model does not fit is a config_error naming the rule") {
  const loom::cluster_desc c = small_cluster(16, 4, 80);
  loom::model_desc one = gm;
  one.micro_batch = 1;
  loom::plan_config k = config_of({tp_kind::d2, 4, 1});
  k.microbatches = 16;
  CHECK_THROWS_WITH_AS(loom::plan_cost_model(one, c, k),
                       "plan: tensor parallel 2d 2x2: a microbatch of 1 sequences does not split into 2 token blocks of whole sequences",
                       loom::config_error);
  loom::model_desc narrow = gm;
  narrow.hidden = 250;
  narrow.heads = 5;
  CHECK_THROWS_WITH_AS(loom::plan_cost_model(narrow, c, config_of({tp_kind::d3, 8, 2})),
                       "plan: tensor parallel 3d 2x2x2: 250 output features are not divisible by q x q = 4", loom::config_error);
  loom::model_desc moe = gm;
  moe.experts = 4;
  CHECK_THROWS_AS(loom::plan_cost_model(moe, c, config_of({tp_kind::d2, 4, 1})), loom::config_error);
}

TEST_CASE("plan, grids: on a GPT 70B shape over 64 A100s a 3D grid is fastest at 16 sequences per microbatch, the 1D split at 4") {
  // docs/plan/gpt-70b.model.json and selene-64.cluster.json (docs/plan.md, "Tensor-parallel grids").
  loom::model_desc m = plan_test::gpt_70b(4096, 16, 512);
  const loom::cluster_desc c = plan_test::selene_64();
  loom::plan_options o;
  o.families = {"1f1b", "interleaved-1f1b", "zb-h1"};
  const auto at16 = loom::plan(m, c, o);
  REQUIRE_FALSE(at16.ranked.empty());
  CHECK(at16.ranked[0].config.tp_grid == tp_kind::d3);
  m.micro_batch = 4;
  const auto at4 = loom::plan(m, c, o);
  REQUIRE_FALSE(at4.ranked.empty());
  CHECK(at4.ranked[0].config.tp_grid == tp_kind::d1);
  bool grid_ranked = false;
  for (const auto& r : at4.ranked) grid_ranked = grid_ranked || r.config.tp_grid != tp_kind::d1;
  CHECK(grid_ranked);  // the grids were in the race
}
