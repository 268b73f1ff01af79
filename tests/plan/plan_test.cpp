// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan: the closed forms of loom/plan/formulas.hpp against values computed by hand, the
// per-stage cost model against the whole-model FLOP count of Narayanan et al. (eq. 3), and the
// search's rules (every ranked configuration divides the cluster and the batch, fits in memory,
// and the ranking is sorted) over a grid of clusters.
#include <doctest/doctest.h>

#include <loom/plan.hpp>

#include "plan_support.hpp"

#include <cmath>
#include <string>

namespace {

namespace pf = loom::plan_formulas;

// A small model whose numbers are easy by hand: s b h = 128 x 1 x 64 = 8192.
constexpr loom::model_desc tiny{.layers = 2, .hidden = 64, .heads = 4, .seq = 128, .vocab = 1024, .micro_batch = 1, .global_batch = 8};

constexpr loom::model_desc small{.layers = 8, .hidden = 1024, .heads = 16, .seq = 1024, .vocab = 32000, .micro_batch = 1, .global_batch = 64};

using plan_test::close;
using plan_test::small_cluster;

}  // namespace

TEST_CASE("parameter counts follow Narayanan et al.'s 12 h^2 + 13 h per layer") {
  static_assert(pf::layer_params(tiny) == 12 * 64 * 64 + 13 * 64);  // 49984
  static_assert(pf::embedding_params(tiny) == 1024 * 64 + 128 * 64);
  CHECK(pf::total_params(tiny) == 2 * 49984 + 65536 + 8192);
  loom::model_desc gpt3{.layers = 96, .hidden = 12288, .heads = 96, .seq = 2048, .vocab = 51200, .global_batch = 1536};
  CHECK(pf::layer_params(gpt3) == 1812099072.0);
  CHECK(std::fabs(pf::total_params(gpt3) / 1e9 - 174.6) < 0.1);  // "GPT-3 175B"
}

TEST_CASE("per-layer FLOPs: forward 24bsh^2 + 4bs^2h, and B + W is twice the forward") {
  // 24 * 128 * 64^2 = 12582912; 4 * 128^2 * 64 = 4194304.
  static_assert(pf::layer_forward_flops(tiny) == 16777216.0);
  static_assert(pf::layer_input_grad_flops(tiny) == 12582912.0 + 8388608.0);
  static_assert(pf::layer_weight_grad_flops(tiny) == 12582912.0);
  static_assert(pf::layer_input_grad_flops(tiny) + pf::layer_weight_grad_flops(tiny) == 2 * pf::layer_forward_flops(tiny));
  static_assert(pf::logit_forward_flops(tiny) == 2.0 * 128 * 64 * 1024);
  static_assert(pf::layer_recompute_flops(tiny, loom::recompute_kind::full) == 16777216.0);
  static_assert(pf::layer_recompute_flops(tiny, loom::recompute_kind::selective) == 4194304.0);
  static_assert(pf::layer_recompute_flops(tiny, loom::recompute_kind::none) == 0);
}

TEST_CASE("Narayanan et al.'s eq. (3) by hand, and the per-stage costs add up to it under full recomputation") {
  // 96 B s l h^2 (1 + s/6h + V/16lh) = 96*8*128*2*4096 * (1 + 1/3 + 1/2) = 805306368 * 11/6.
  CHECK(close(pf::narayanan_step_flops(tiny), 805306368.0 * 11 / 6));
  // With tp = 1, free links and rate 1 FLOP/s, a stage's f + b + w is its FLOPs; summed over
  // the stages, the microbatches and the replicas it is eq. (3) (recompute = full).
  loom::cluster_desc c{.gpus = 4, .gpus_per_node = 4, .memory_bytes = 1e12, .peak_flops = 1, .achievable_fraction = 1};
  for (long long pp : {1, 2}) {
    loom::plan_config k{.dp = 4 / pp, .tp = 1, .pp = pp, .recompute = loom::recompute_kind::full, .chunks = 1,
                        .microbatches = 8 / (4 / pp)};
    auto cm = loom::plan_cost_model(tiny, c, k);
    REQUIRE(cm.stages.size() == static_cast<std::size_t>(pp));
    double sum = 0;
    for (auto const& s : cm.stages) sum += s.f + s.b + s.w;
    CHECK(close(sum * static_cast<double>(k.microbatches * k.dp), pf::narayanan_step_flops(tiny)));
  }
}

TEST_CASE("activation bytes per layer follow Korthikanti et al. (34 + 5as/h with SP, 10 + 24/t + 5as/ht without)") {
  using loom::recompute_kind;
  // s b h = 8192; 5 a s / h = 5 * 4 * 128 / 64 = 40.
  static_assert(pf::layer_activation_bytes(tiny, 1, false, recompute_kind::none) == 8192.0 * 74);
  static_assert(pf::layer_activation_bytes(tiny, 1, true, recompute_kind::none) == 8192.0 * 74);  // same at t = 1
  static_assert(pf::layer_activation_bytes(tiny, 2, true, recompute_kind::none) == 8192.0 * 74 / 2);
  static_assert(pf::layer_activation_bytes(tiny, 2, false, recompute_kind::none) == 8192.0 * (10 + 12 + 20));
  static_assert(pf::layer_activation_bytes(tiny, 2, true, recompute_kind::selective) == 8192.0 * 34 / 2);
  static_assert(pf::layer_activation_bytes(tiny, 2, false, recompute_kind::selective) == 8192.0 * 22);
  static_assert(pf::layer_activation_bytes(tiny, 2, true, recompute_kind::full) == 8192.0);
  static_assert(pf::layer_activation_bytes(tiny, 2, false, recompute_kind::full) == 16384.0);
  static_assert(pf::logit_activation_bytes(tiny, 2) == 4.0 * 128 * 1024 / 2);
  // 4-byte elements double everything.
  constexpr loom::model_desc wide{.layers = 2, .hidden = 64, .heads = 4, .seq = 128, .vocab = 1024, .bytes_per_element = 4, .global_batch = 8};
  static_assert(pf::layer_activation_bytes(wide, 2, true, recompute_kind::none) == 8192.0 * 74);
}

TEST_CASE("communication: ring all-reduce 2(n-1) alpha + 2(n-1)/n bytes beta, p2p message s b h bytes (/t with SP)") {
  constexpr loom::link_cost l{.alpha = 1e-6, .beta = 1e-9};
  CHECK(close(pf::ring_allreduce_time(1e6, 4, l), 6e-6 + 1.5e-3));
  CHECK(pf::ring_allreduce_time(1e6, 1, l) == 0);
  static_assert(pf::tp_collective_bytes(tiny) == 8192.0 * 2);
  static_assert(pf::p2p_message_bytes(tiny, 4, false) == 16384.0);
  static_assert(pf::p2p_message_bytes(tiny, 4, true) == 4096.0);
}

TEST_CASE("the stage cost model holds every parameter once (plus the tied output copy) and the layers' activations") {
  auto c = small_cluster(8, 4, 16);
  loom::plan_config k{.dp = 1, .tp = 2, .pp = 4, .sp = true, .recompute = loom::recompute_kind::none, .chunks = 2, .microbatches = 64};
  auto cm = loom::plan_cost_model(small, c, k);
  REQUIRE(cm.stages.size() == 8);
  double params = 0;
  for (auto const& s : cm.stages) params += s.param_bytes;
  CHECK(close(params, (pf::total_params(small) + 32000.0 * 1024) * 2 / 2));
  CHECK(close(cm.stages[3].activation, pf::layer_activation_bytes(small, 2, true, loom::recompute_kind::none)));
  CHECK(cm.stages[7].activation > cm.stages[3].activation);  // the logits live on the last stage
  CHECK(cm.stages[7].f > cm.stages[3].f);
  // tp x dp = 2 < 4 GPUs per node: 2 pipeline ranks share a node.
  CHECK(cm.ranks_per_node == 2);
  CHECK_THROWS_AS(loom::plan_cost_model(small, c, {.tp = 2, .pp = 3, .chunks = 1}), loom::config_error);
}

TEST_CASE("evaluate_plan: memory is the rank's model state (16 bytes per parameter / tp) plus its simulated peak") {
  auto c = small_cluster(8, 4, 16);
  loom::plan_config k{.dp = 1, .tp = 2, .pp = 4, .sp = true, .recompute = loom::recompute_kind::selective, .family = "1f1b", .chunks = 1,
                      .microbatches = 64};
  auto s = loom::default_registry().at("1f1b").make({.ranks = 4, .microbatches = 64, .chunks = 1});
  auto r = loom::evaluate_plan(small, c, k, s);
  auto sim = loom::simulate(s, loom::plan_cost_model(small, c, k));
  CHECK(r.pipeline_time == sim.makespan);
  CHECK(r.dp_time == 0);  // dp = 1
  CHECK(r.step_time == r.pipeline_time);
  CHECK(r.memory_bytes == doctest::Approx(r.state_bytes + r.activation_bytes));
  // Rank 0 holds 2 layers and the embeddings; 1F1B keeps p = 4 microbatches of its 2 layers live.
  const double rank0_state = (2 * pf::layer_params(small) + pf::embedding_params(small)) * 16 / 2;
  const double rank0_act = 4 * 2 * pf::layer_activation_bytes(small, 2, true, loom::recompute_kind::selective);
  CHECK(r.memory_bytes >= rank0_state + rank0_act - 1);
  CHECK(r.fits);
}

TEST_CASE("the search keeps to GPU-count divisibility, the batch and the memory limit, over a grid of clusters") {
  for (long long gpus : {4, 8, 16, 32}) {
    for (long long per_node : {4, 8}) {
      if (gpus % per_node != 0 && gpus > per_node) continue;
      for (double gib : {2.0, 4.0, 16.0}) {
        INFO("gpus=" << gpus << " per_node=" << per_node << " GiB=" << gib);
        auto c = small_cluster(gpus, per_node, gib);
        loom::plan_options o;
        o.families = {"1f1b", "interleaved-1f1b", "zb-h1", "zb-auto", "zb-v", "v-half"};
        auto rep = loom::plan(small, c, o);
        double prev = 0;
        for (auto const& r : rep.ranked) {
          auto const& k = r.config;
          CHECK(k.dp * k.tp * k.pp == gpus);
          CHECK(per_node % k.tp == 0);
          CHECK(small.heads % k.tp == 0);
          CHECK(small.layers % (k.pp * k.chunks) == 0);
          CHECK(k.microbatches * k.dp * small.micro_batch == small.global_batch);
          CHECK(r.fits);
          CHECK(r.memory_bytes <= c.memory_bytes);
          CHECK(r.step_time >= prev);
          CHECK((!k.sp || k.tp > 1));
          prev = r.step_time;
        }
        CHECK(rep.ranked.size() <= rep.evaluated);
      }
    }
  }
}

TEST_CASE("a tighter memory limit never adds configurations, and too little memory leaves none") {
  loom::plan_options o;
  o.families = {"1f1b", "zb-h1"};
  auto roomy = loom::plan(small, small_cluster(8, 4, 64), o);
  auto tight = loom::plan(small, small_cluster(8, 4, 1.2), o);
  auto none = loom::plan(small, small_cluster(8, 4, 0.01), o);
  CHECK(roomy.ranked.size() > 0);
  CHECK(tight.ranked.size() < roomy.ranked.size());
  for (auto const& r : tight.ranked) CHECK(r.memory_bytes <= 1.2 * (1LL << 30));
  CHECK(none.ranked.empty());
  CHECK(none.over_memory > 0);
}

TEST_CASE("a bad model or cluster is a config_error that names the field") {
  auto msg = [](auto f) -> std::string {
    try {
      f();
    } catch (const loom::config_error& e) {
      return e.what();
    }
    return "";
  };
  loom::model_desc m = small;
  m.hidden = -3;
  CHECK(msg([&] { loom::plan(m, small_cluster(8, 4, 16)); }) == "field \"hidden\" must be a positive integer (got -3)");
  m = small;
  m.heads = 7;
  CHECK(msg([&] { loom::plan(m, small_cluster(8, 4, 16)); }).find("\"heads\" must divide \"hidden\"") != std::string::npos);
  auto c = small_cluster(8, 4, 16);
  c.achievable_fraction = 1.5;
  CHECK(msg([&] { loom::plan(small, c); }).find("\"achievable_fraction\"") != std::string::npos);
  c = small_cluster(10, 4, 16);
  CHECK(msg([&] { loom::plan(small, c); }).find("\"gpus\" must be a multiple of \"gpus_per_node\"") != std::string::npos);
  c = small_cluster(8, 4, 16);
  c.gpus = 1LL << 30;
  CHECK(msg([&] { loom::plan(small, c); }).find("\"gpus\" must be at most 16777216") != std::string::npos);
  loom::plan_options o;
  o.families = {"no-such"};
  CHECK(msg([&] { loom::plan(small, small_cluster(8, 4, 16), o); }).find("no-such") != std::string::npos);
}

TEST_CASE("reserved memory shrinks what fits: every ranked configuration fits in memory_bytes - reserved_bytes") {
  loom::plan_options o;
  o.families = {"1f1b", "zb-h1", "zb-auto"};
  auto c = small_cluster(8, 4, 4);
  auto all = loom::plan(small, c, o);
  c.reserved_bytes = 2.5 * (1LL << 30);
  CHECK(c.usable_bytes() == 1.5 * (1LL << 30));
  auto less = loom::plan(small, c, o);
  CHECK(less.ranked.size() < all.ranked.size());
  for (auto const& r : less.ranked) CHECK(r.memory_bytes <= c.usable_bytes());
  c.reserved_bytes = c.memory_bytes;
  CHECK_THROWS_WITH_AS(loom::plan(small, c, o), doctest::Contains("\"reserved_gib\""), loom::config_error);
}

TEST_CASE("a search larger than loom::max_search_cells is refused before it simulates anything") {
  // 2^20 layers on 2^24 GPUs with a batch of 2^20: about 95 million forward passes (two minutes).
  const loom::model_desc huge{.layers = 1 << 20, .hidden = 64, .heads = 8, .seq = 16, .vocab = 100, .micro_batch = 1,
                              .global_batch = 1 << 20};
  loom::cluster_desc c = small_cluster(1LL << 24, 8, 80000);
  CHECK_THROWS_WITH_AS(loom::plan(huge, c),
                       doctest::Contains("plan: the search would simulate more than 33554432 forward passes in all"),
                       loom::config_error);
  // A search within the bound reports the forward passes it simulated.
  auto rep = loom::plan(small, small_cluster(8, 4, 64));
  CHECK(rep.cells > 0);
  CHECK(rep.cells <= loom::max_search_cells);
}

TEST_CASE("vocabulary parallelism: the output layer's work and both tables leave the end stages for every rank's S, T, IF and IB") {
  auto c = small_cluster(8, 4, 16);
  for (int vocab : {1, 2}) {
    CAPTURE(vocab);
    loom::plan_config k{.dp = 1, .tp = 2, .pp = 4, .sp = true, .recompute = loom::recompute_kind::none, .chunks = 1, .microbatches = 64,
                        .vocab = vocab};
    const auto cm = loom::plan_cost_model(small, c, k);
    const auto plain = loom::plan_cost_model(small, c, {.dp = 1, .tp = 2, .pp = 4, .sp = true, .chunks = 1, .microbatches = 64});
    REQUIRE(cm.stages.size() == 4);
    // The last stage is a plain one: no logits, no output projection.
    CHECK(cm.stages[3].f == cm.stages[2].f);
    CHECK(cm.stages[3].activation == cm.stages[2].activation);
    CHECK(plain.stages[3].f > cm.stages[3].f);
    // Parameters on the stages: the layers and the position embedding; the tables are 2 V h / pp per rank.
    double params = 0;
    for (auto const& s : cm.stages) params += s.param_bytes;
    CHECK(close(params, (8 * pf::layer_params(small) + 1024.0 * 1024) * 2 / 2));
    CHECK(loom::detail::vocab_params_per_rank(small, 4) == 2.0 * 32000 * 1024 / 4);
    // Each rank's share of the three output GEMMs (2 b s h V / pp each at tp x peak x fraction),
    // S one (Algorithm 1) or two (Algorithm 2), T the rest, plus the collectives on the intra link
    // (tp x dp = 2 < 4 GPUs per node: the 4 pipeline ranks span two nodes: the inter link).
    REQUIRE(cm.ranks_per_node == 2);
    const double gemm = pf::logit_forward_flops(small) / 4 / (2 * 100e12 * 0.5), x = pf::tp_collective_bytes(small);
    const double stats = 3.0 * 4 * 1024;
    const double bcast = loom::detail::broadcast_time(x, 4, c.inter), ar = pf::ring_allreduce_time(x, 4, c.inter);
    CHECK(close(bcast, 3 * 1e-5 + x / 20e9));
    CHECK(close(cm.vocab_s, (vocab == 1 ? 1 : 2) * gemm + bcast + pf::ring_allreduce_time(stats, 4, c.inter) + (vocab == 2 ? ar : 0)));
    CHECK(close(cm.vocab_t, (vocab == 1 ? 2 : 1) * gemm + (vocab == 1 ? ar : 0)));
    CHECK(close(cm.vocab_e, (ar + bcast) / 2));
  }
}

TEST_CASE("vocabulary parallelism: evaluate_plan holds the tables and one S activation on every rank") {
  auto c = small_cluster(8, 4, 16);
  loom::plan_config k{.dp = 1, .tp = 2, .pp = 4, .sp = true, .recompute = loom::recompute_kind::selective, .family = "1f1b-vocab-2",
                      .chunks = 1, .microbatches = 64, .vocab = 2};
  const auto s = loom::generate(loom::one_f_one_b_vocab_2{}, {.ranks = 4, .microbatches = 64});
  const auto r = loom::evaluate_plan(small, c, k, s);
  const auto sim = loom::simulate(s, loom::plan_cost_model(small, c, k));
  CHECK(r.pipeline_time == sim.makespan);
  // Rank 0: 2 layers, the position embedding and 1/4 of both tables; p + 1 = 5 microbatches of
  // its layers, and the S pass's fp32 exponentials of 8000 rows and its s b h input.
  const double rank0_state = (2 * pf::layer_params(small) + 1024.0 * 1024 + 2.0 * 32000 * 1024 / 4) * 16 / 2;
  const double rank0_act = 5 * 2 * pf::layer_activation_bytes(small, 2, true, loom::recompute_kind::selective) +
                           4.0 * 1024 * 32000 / 2 / 4 + 1024.0 * 1024 * 2;
  CHECK(close(r.state_bytes, rank0_state));
  CHECK(close(r.activation_bytes, rank0_act));
}

TEST_CASE("vocabulary parallelism: plan ranks the vocabulary-parallel families, and they change the layout for a large vocabulary") {
  // docs/plan/gpt-70b.model.json's shape on 64 A100-80GB (docs/plan.md's table).
  loom::model_desc m{.layers = 80, .hidden = 8192, .heads = 64, .seq = 4096, .vocab = 256000, .micro_batch = 1, .global_batch = 512};
  const loom::cluster_desc c{.gpus = 64, .gpus_per_node = 8, .memory_bytes = 80.0 * (1LL << 30), .peak_flops = 312e12,
                             .achievable_fraction = 0.6, .intra = {.alpha = 5e-6, .beta = 4e-12}, .inter = {.alpha = 1e-5, .beta = 4e-11}};
  loom::plan_options without;
  without.families = {"1f1b", "interleaved-1f1b", "zb-h1", "v-half"};
  loom::plan_options with = without;
  for (auto const& f : loom::detail::plan_vocab_families) with.families.emplace_back(f.name);
  auto best = [&](const loom::plan_options& o) { return loom::plan(m, c, o).ranked.at(0); };
  const auto a = best(without), b = best(with);
  CHECK(b.config.vocab != 0);
  CHECK(b.step_time < a.step_time);
  CHECK(b.memory_bytes < a.memory_bytes);
  CHECK_FALSE((a.config.dp == b.config.dp && a.config.tp == b.config.tp && a.config.pp == b.config.pp));  // another layout
  // With a small vocabulary the output layer is light: the same best configuration either way.
  m.vocab = 32000;
  const auto a32 = best(without), b32 = best(with);
  CHECK(b32.config == a32.config);
  // Every ranked vocabulary-parallel configuration keeps to its family's shape rule.
  m.vocab = 128256;
  for (const auto& r : loom::plan(m, c, with).ranked)
    if (r.config.vocab != 0) {
      CHECK(r.config.pp >= 2);
      if (r.config.chunks == 2) CHECK(r.config.pp % 2 == 0);
    }
}
