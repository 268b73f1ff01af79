// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan with a mixture of experts (issue 26): the MoE closed forms against values by hand
// and against the executor's routing contract (the capacity of loom::moe_capacity), the stage
// cost model's FLOPs, all-to-alls and activations, evaluate_plan's expert state, all-to-all
// volume and two gradient reductions, and the search over ep: every ranked configuration divides
// the cluster, the experts and the batch, and a model whose experts do not fit unsharded is
// ranked with ep > 1 only.
#include <doctest/doctest.h>

#include <loom/exec/moe.hpp>
#include <loom/plan.hpp>

#include "plan_support.hpp"

#include <cmath>
#include <string>

namespace {

namespace pf = loom::plan_formulas;

// 4 layers, every other one MoE (layers 1 and 3), 8 experts, top-2.
constexpr loom::model_desc moe_tiny{.layers = 4, .hidden = 64, .heads = 4, .seq = 128, .vocab = 1024, .micro_batch = 1, .global_batch = 8,
                                    .experts = 8, .top_k = 2, .moe_every = 2, .capacity_factor = 1.0};

// 8 layers of h = 1024, all MoE, 16 experts: the experts hold 16 x 8.4M parameters per layer.
constexpr loom::model_desc moe_small{.layers = 8, .hidden = 1024, .heads = 16, .seq = 1024, .vocab = 32000, .micro_batch = 1,
                                     .global_batch = 64, .experts = 16, .top_k = 2, .moe_every = 1, .capacity_factor = 1.25};

using plan_test::close;
constexpr auto cluster = plan_test::small_cluster;

}  // namespace

TEST_CASE("moe plan: parameters, MoE layers, capacity, all-to-all bytes and expert FLOPs by hand") {
  const double h = 64, E = 8;
  CHECK(!pf::is_moe_layer(moe_tiny, 0));
  CHECK(pf::is_moe_layer(moe_tiny, 1));
  CHECK(!pf::is_moe_layer(moe_tiny, 2));
  CHECK(pf::is_moe_layer(moe_tiny, 3));
  CHECK(pf::moe_layers_in(moe_tiny, 0, 4) == 2);
  CHECK(pf::moe_layers_in(moe_tiny, 0, 1) == 0);
  CHECK(pf::moe_layers_in(moe_tiny, 1, 2) == 1);
  CHECK(pf::moe_layers_in(moe_tiny, 2, 2) == 1);
  CHECK(pf::expert_params(moe_tiny) == 8 * h * h + 5 * h);
  CHECK(pf::moe_layer_dense_params(moe_tiny) == 4 * h * h + 8 * h + h * E);
  CHECK(pf::total_params(moe_tiny) ==
        2 * (12 * h * h + 13 * h) + 2 * (4 * h * h + 8 * h + h * E + E * (8 * h * h + 5 * h)) + 1024 * h + 128 * h);
  // n = 128 tokens (64 over tp = 2): C = k floor(f ceil(n / E)) = 2 x 16 (2 x 8 over tp 2).
  CHECK(pf::moe_capacity(moe_tiny, 1) == 32);
  CHECK(pf::moe_capacity(moe_tiny, 2) == 16);
  CHECK(pf::moe_all_to_all_bytes(moe_tiny, 1) == E * 32 * h * 2);
  CHECK(pf::moe_expert_forward_flops(moe_tiny, 1) == 16 * h * h * E * 32 + 2 * 128 * h * E);
  CHECK(pf::all_to_all_time(1000, 4, {.alpha = 1e-6, .beta = 1e-9}) == doctest::Approx(3e-6 + 0.75 * 1000 * 1e-9));
  CHECK(pf::all_to_all_time(1000, 1, {.alpha = 1e-6, .beta = 1e-9}) == 0);
  // A dense model is unchanged: no MoE layer.
  loom::model_desc dense = moe_tiny;
  dense.experts = 0;
  CHECK(pf::moe_layers_in(dense, 0, 4) == 0);
  CHECK(pf::total_params(dense) == 4 * (12 * h * h + 13 * h) + 1024 * h + 128 * h);
}

TEST_CASE("moe plan: the capacity is the executor's (loom::moe_capacity) for every token count, E, k and f > 0") {
  int cases = 0;
  for (long long seq : {1, 7, 10, 128, 1000})
    for (long long E : {1, 3, 8, 64})
      for (int k : {1, 2, 4})
        for (double f : {0.5, 1.0, 1.25, 2.0}) {
          if (k > E) continue;
          loom::model_desc m = moe_tiny;
          m.seq = seq;
          m.experts = E;
          m.top_k = k;
          m.capacity_factor = f;
          const loom::moe_options o{.experts = static_cast<int>(E), .top_k = k, .capacity_factor = f};
          CHECK(pf::moe_capacity(m, 1) == static_cast<double>(loom::moe_capacity(o, static_cast<std::size_t>(seq), 0)));
          ++cases;
        }
  CHECK(cases == 180);
}

TEST_CASE("moe plan: a stage's MLP becomes its experts' FLOPs, four all-to-alls and the experts' activation") {
  const auto c = cluster(8, 4, 16);
  const loom::plan_config k{.dp = 1, .tp = 2, .pp = 2, .sp = true, .recompute = loom::recompute_kind::none, .chunks = 1, .microbatches = 4, .ep = 4};
  const loom::plan_config dense_k{.dp = 1, .tp = 2, .pp = 2, .sp = true, .recompute = loom::recompute_kind::none, .chunks = 1, .microbatches = 4};
  loom::model_desc dense = moe_tiny;
  dense.experts = 0;
  const auto cm = loom::plan_cost_model(moe_tiny, c, k), cd = loom::plan_cost_model(dense, c, dense_k);
  REQUIRE(cm.stages.size() == 2);
  // Stage 0 holds layers 0 and 1 (one MoE layer), stage 1 layers 2 and 3 (one).
  const double rate = 100e12 * 0.5, mlp = 16.0 * 128 * 64 * 64;
  const double ef = pf::moe_expert_forward_flops(moe_tiny, 2);
  // tp x ep = 8 > 4 GPUs per node: the all-to-alls run on the inter-node link.
  const double a2a = pf::all_to_all_time(pf::moe_all_to_all_bytes(moe_tiny, 2), 4, c.inter);
  CHECK(close(cm.stages[0].f, cd.stages[0].f - mlp / 2 / rate + ef / rate + 2 * a2a));
  CHECK(close(cm.stages[0].b, cd.stages[0].b - mlp / 2 / rate + ef / rate + 2 * a2a));
  CHECK(close(cm.stages[0].w, cd.stages[0].w - mlp / 2 / rate + ef / rate));
  CHECK(close(cm.stages[0].activation,
              cd.stages[0].activation - pf::mlp_activation_bytes(moe_tiny, 2, true) + pf::moe_expert_activation_bytes(moe_tiny, 2)));
  // The stage's parameters on one GPU: the dense part over tp, 1/ep of the experts.
  CHECK(close(cm.stages[1].param_bytes,
              ((12.0 * 64 * 64 + 13 * 64 + pf::moe_layer_dense_params(moe_tiny) + 1024 * 64) / 2 + 8 * pf::expert_params(moe_tiny) / 4) * 2));
  // Full recomputation reruns the forward's two all-to-alls and the experts in the backward.
  loom::plan_config kf = k;
  kf.recompute = loom::recompute_kind::full;
  loom::plan_config df = dense_k;
  df.recompute = loom::recompute_kind::full;
  const auto cmf = loom::plan_cost_model(moe_tiny, c, kf), cdf = loom::plan_cost_model(dense, c, df);
  CHECK(close(cmf.stages[0].b, cdf.stages[0].b - 2 * mlp / 2 / rate + 2 * ef / rate + 4 * a2a));
  // ep must divide the experts.
  loom::plan_config bad = k;
  bad.ep = 3;
  CHECK_THROWS_WITH_AS(loom::plan_cost_model(moe_tiny, c, bad), "plan: 8 experts do not split over 3 expert-parallel ranks", loom::config_error);
}

TEST_CASE("moe plan: evaluate_plan holds 1/ep of the experts, counts the all-to-all bytes and reduces dense over dp x ep, experts over dp") {
  const auto c = cluster(16, 8, 16);
  const loom::plan_config k{.dp = 2, .tp = 1, .pp = 2, .recompute = loom::recompute_kind::selective, .family = "1f1b", .chunks = 1,
                            .microbatches = 2, .ep = 4};
  const auto s = loom::default_registry().at("1f1b").make({.ranks = 2, .microbatches = 2, .chunks = 1});
  const auto r = loom::evaluate_plan(moe_tiny, c, k, s);
  const double expert_state = 8.0 / 4 * pf::expert_params(moe_tiny) * 16;  // one MoE layer per rank
  CHECK(close(r.expert_bytes, expert_state));
  CHECK(r.state_bytes >= expert_state);
  CHECK(close(r.all_to_all_bytes, 1 * 2 * 4 * pf::moe_all_to_all_bytes(moe_tiny, 1)));
  // Rank 0 (layers 0 and 1, both embeddings) holds the most dense parameters; each rank 1/ep of one MoE layer's experts.
  const double dense0 = 12.0 * 64 * 64 + 13 * 64 + pf::moe_layer_dense_params(moe_tiny) + (1024 + 128) * 64;
  const double experts = 8.0 / 4 * pf::expert_params(moe_tiny);
  // tp x ep x dp = 8 GPUs: one node.
  CHECK(close(r.dp_time, pf::ring_allreduce_time(dense0 * 2, 8, c.intra) + pf::ring_allreduce_time(experts * 2, 2, c.intra)));
  CHECK(r.step_time == r.pipeline_time + r.dp_time);
}

TEST_CASE("moe plan: the search over ep divides the cluster, the experts and the batch, and shards experts that do not fit") {
  loom::plan_options o;
  o.families = {"1f1b", "zb-h1"};
  o.recompute = {loom::recompute_kind::selective};
  // 8 layers x 16 experts x 8.4M parameters x 16 bytes: 17 GiB of experts, 2.1 GiB per pipeline
  // rank of 8 and ep = 1; a GPU of 3 GiB holds them only with ep >= 2 or a deep pipeline.
  for (double gib : {3.0, 64.0}) {
    INFO("GiB=" << gib);
    const auto c = cluster(16, 8, gib);
    const auto rep = loom::plan(moe_small, c, o);
    CHECK(rep.moe);
    REQUIRE(!rep.ranked.empty());
    bool some_ep = false;
    for (auto const& r : rep.ranked) {
      auto const& k = r.config;
      CHECK(k.dp * k.ep * k.tp * k.pp == 16);
      CHECK(moe_small.experts % k.ep == 0);
      CHECK(k.microbatches * k.dp * k.ep * moe_small.micro_batch == moe_small.global_batch);
      CHECK(r.memory_bytes <= c.usable_bytes());
      CHECK((r.all_to_all_bytes > 0) == (k.ep > 1));
      CHECK(r.expert_bytes > 0);
      some_ep = some_ep || k.ep > 1;
      // The experts' state: the rank's MoE layers x E/ep experts x 16 bytes per parameter.
      const double layers = static_cast<double>(moe_small.layers / k.pp);
      CHECK(close(r.expert_bytes, layers * static_cast<double>(moe_small.experts / k.ep) * pf::expert_params(moe_small) * 16));
    }
    CHECK(some_ep);
    if (gib == 3.0)
      for (auto const& r : rep.ranked) CHECK((r.config.ep > 1 || r.config.pp >= 8));
  }
  // A dense model's search is the one without ep.
  loom::model_desc dense = moe_small;
  dense.experts = 0;
  const auto rep = loom::plan(dense, cluster(16, 8, 64), o);
  CHECK(!rep.moe);
  for (auto const& r : rep.ranked) {
    CHECK(r.config.ep == 1);
    CHECK(r.all_to_all_bytes == 0);
    CHECK(r.expert_bytes == 0);
  }
}

TEST_CASE("moe plan: experts < 0, top-k above E, moe_every < 1 and a capacity factor that is negative or not finite, one line each") {
  auto msg = [](const loom::model_desc& m) -> std::string {
    try {
      loom::plan(m, cluster(8, 4, 16));
    } catch (const loom::config_error& e) {
      return e.what();
    }
    return "";
  };
  loom::model_desc m = moe_tiny;
  m.experts = -1;
  CHECK(msg(m) == "field \"experts\" must be >= 0 (got -1; 0: a dense model)");
  m = moe_tiny;
  m.top_k = 9;
  CHECK(msg(m) == "field \"top_k\" must be between 1 and \"experts\" 8 (got 9)");
  m = moe_tiny;
  m.moe_every = 0;
  CHECK(msg(m) == "field \"moe_every\" must be a positive integer (got 0)");
  m = moe_tiny;
  m.capacity_factor = -0.5;
  CHECK(msg(m) == "field \"capacity_factor\" must be a finite number >= 0 (0: no dropping; got -0.5)");
  m.capacity_factor = std::nan("");
  CHECK(msg(m).find("field \"capacity_factor\" must be a finite number >= 0") == 0);
}
