// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan with context parallelism (a cp degree and its kind: Ulysses, ring attention, USP,
// TokenRing; DSP for a spatial-temporal model; issue 25): each kind's exchanges per layer by hand,
// what the attention core hides, the split of FLOPs, activations and the pipeline message over cp,
// the search's rules, and on a GPT 70B shape at 32768 tokens a faster plan with cp than without.
#include <doctest/doctest.h>

#include <loom/plan.hpp>

#include "plan_support.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace {

namespace pf = loom::plan_formulas;
using loom::context_kind;
using plan_test::close;
using plan_test::small_cluster;

// s b h = 4096 x 1 x 512; 16 heads.
constexpr loom::model_desc lm{.layers = 4, .hidden = 512, .heads = 16, .seq = 4096, .vocab = 1000, .micro_batch = 1, .global_batch = 16};

loom::plan_config cp_config(long long tp, long long cp, context_kind kind, long long u) {
  return {.dp = 16 / (tp * cp), .tp = tp, .pp = 1, .family = "1f1b", .chunks = 1, .microbatches = 16 / (16 / (tp * cp)),
          .cp = cp, .cp_kind = kind, .cp_ulysses = u};
}

}  // namespace

TEST_CASE("plan, context: each kind's exchanges per layer by hand, and what the attention core hides") {
  // 8 GPUs per node; tp 2: cp 4 stays in a node (tp x cp = 8), cp 8 leaves it.
  const loom::cluster_desc c = small_cluster(16, 8, 80);
  const double n = 4096.0 * 512 / (2 * 4) * 2, lse = 4096.0 * 16 / (2 * 4) * 2;  // bytes of a rank's Q (or K, V, O) and log-sum-exp at cp 4
  const auto& in = c.intra;
  auto a2a = [](double bytes, double ranks, const loom::link_cost& l) { return (ranks - 1) * l.alpha + (ranks - 1) / ranks * bytes * l.beta; };
  struct expect {
    context_kind kind;
    long long u;
    double f, b;
  };
  for (const expect& e : {expect{context_kind::ulysses, 4, 4 * a2a(n, 4, in), 4 * a2a(n, 4, in)},
                          expect{context_kind::ring, 1, 3 * in.time(2 * n), 7 * in.time(2 * n)},
                          expect{context_kind::tokenring, 1, 3 * in.time(n + lse), 3 * in.time(2 * n + 2 * lse) + 4 * in.time(n)},
                          expect{context_kind::usp, 2, 4 * a2a(n, 2, in) + in.time(2 * n), 4 * a2a(n, 2, in) + 3 * in.time(2 * n)}}) {
    INFO(loom::to_string(e.kind));
    const loom::plan_config k = cp_config(2, 4, e.kind, e.u);
    const auto bare = loom::detail::context_times(lm, c, k, 0, 0);
    CHECK(close(bare.f, e.f));
    CHECK(close(bare.b, e.b));
    // An attention core longer than every message hides the ring part, not Ulysses' all-to-alls.
    const auto hidden = loom::detail::context_times(lm, c, k, 1e9, 1e9);
    const double uly = e.kind == context_kind::ulysses ? e.f : e.kind == context_kind::usp ? 4 * a2a(n, 2, in) : 0;
    CHECK(close(hidden.f + 1, uly + 1));
    CHECK(close(hidden.b + 1, uly + 1));
  }
  // cp 8 with tp 2 leaves the node: the ring runs on the inter-node link.
  const auto far = loom::detail::context_times(lm, c, cp_config(2, 8, context_kind::ring, 1), 0, 0);
  CHECK(close(far.f, 7 * c.inter.time(2 * n / 2)));
  // TokenRing sends less per step than ring attention in both directions' busiest one.
  for (long long cp : {2, 4, 8}) {
    const auto r = loom::detail::context_times(lm, c, cp_config(2, cp, context_kind::ring, 1), 0, 0);
    const auto t = loom::detail::context_times(lm, c, cp_config(2, cp, context_kind::tokenring, 1), 0, 0);
    CHECK(t.f < r.f);
    CHECK(t.b < r.b);
  }
}

TEST_CASE("plan, context: the FLOPs, the activations, the tp all-reduces and the pipeline message split over cp, the weights do not") {
  loom::cluster_desc c = small_cluster(16, 8, 80);
  c.intra = c.inter = {.alpha = 0, .beta = 0};
  const auto one = loom::plan_cost_model(lm, c, cp_config(2, 1, context_kind::none, 1));
  for (const auto& [kind, u] : loom::detail::context_choices(lm, 2, 4)) {
    INFO(loom::to_string(kind) << " " << u);
    const auto cm = loom::plan_cost_model(lm, c, cp_config(2, 4, kind, u));
    const auto& s = cm.stages.at(0);
    CHECK(close(s.f * 4, one.stages[0].f));  // free links: the FLOPs alone, over tp x cp
    CHECK(close(s.w * 4, one.stages[0].w));
    CHECK(close(s.activation * 4, one.stages[0].activation));
    CHECK(close(s.message_bytes * 4, one.stages[0].message_bytes));
    CHECK(close(s.param_bytes, one.stages[0].param_bytes));
  }
  // With links priced, tp's all-reduces carry a quarter of the tokens.
  const loom::cluster_desc priced = small_cluster(16, 8, 80);
  const auto p1 = loom::plan_cost_model(lm, priced, cp_config(2, 1, context_kind::none, 1));
  const auto p4 = loom::plan_cost_model(lm, priced, cp_config(2, 4, context_kind::ulysses, 4));
  const double coll1 = pf::ring_allreduce_time(pf::tp_collective_bytes(lm), 2, priced.intra),
               coll4 = pf::ring_allreduce_time(pf::tp_collective_bytes(lm) / 4, 2, priced.intra);
  const double uly = loom::detail::context_times(lm, priced, cp_config(2, 4, context_kind::ulysses, 4), 0, 0).f;
  CHECK(close(p4.stages[0].f - (one.stages[0].f / 4), 4 * (2 * coll4 + uly)));
  CHECK(close(p1.stages[0].f - one.stages[0].f, 4 * 2 * coll1));
}

TEST_CASE("plan, context: searched only when asked, for dense models, every kind within its rules") {
  const loom::cluster_desc c = small_cluster(16, 8, 80);
  loom::plan_options o;
  o.families = {"1f1b"};
  auto cps = [&](const loom::model_desc& m, const loom::plan_options& opts) {
    int count = 0;
    for (const auto& r : loom::plan(m, c, opts).ranked) count += r.config.cp > 1 ? 1 : 0;
    return count;
  };
  CHECK(cps(lm, o) == 0);  // off by default
  o.context = true;
  const auto rep = loom::plan(lm, c, o);
  CHECK(rep.context);
  int seen[5] = {};
  for (const auto& r : rep.ranked) {
    const auto& k = r.config;
    ++seen[static_cast<int>(k.cp_kind)];
    CHECK(c.gpus % (k.dp * k.cp * k.tp * k.pp) == 0);
    CHECK(k.microbatches == lm.global_batch / (k.dp * lm.micro_batch));  // cp ranks share their sequences
    const auto choices = loom::detail::context_choices(lm, k.tp, k.cp);
    CHECK(std::find(choices.begin(), choices.end(), std::pair{k.cp_kind, k.cp_ulysses}) != choices.end());
    CHECK(k.tp_grid == loom::tp_kind::d1);
  }
  for (int kind = 0; kind < 5; ++kind) CHECK(seen[kind] > 0);  // none, ulysses, ring, usp, tokenring all ranked
  // The rules: Ulysses needs the heads per tp rank to split; a sequence that does not form 2 cp
  // zig-zag chunks gets neither ring attention nor TokenRing.
  loom::model_desc odd = lm;
  odd.heads = 8;
  odd.seq = 4100;  // 4100 = 4 x 1025: 2 cp chunks for cp = 2 only
  const auto ch = loom::detail::context_choices(odd, 2, 4);  // 4 heads per tp rank: Ulysses only
  REQUIRE(ch.size() == 1);
  CHECK(ch[0] == std::pair{context_kind::ulysses, 4LL});
  CHECK(loom::detail::context_choices(odd, 2, 8).empty());  // neither 8 | 4 heads nor 16 | 4100
  const auto ch2 = loom::detail::context_choices(odd, 2, 2);
  CHECK(ch2.size() == 3);  // ulysses (4 heads per tp rank), ring, tokenring
  loom::model_desc moe = lm;
  moe.experts = 4;
  CHECK(cps(moe, o) == 0);
}

TEST_CASE("plan, context: a configuration outside the rules is a config_error in one line") {
  const loom::cluster_desc c = small_cluster(16, 8, 80);
  loom::model_desc m = lm;
  m.heads = 8;  // 4 heads per tp rank: Ulysses over 8 does not split them
  CHECK_THROWS_WITH_AS(loom::plan_cost_model(m, c, cp_config(2, 8, context_kind::ulysses, 8)),
                       "plan: context parallelism cp 8 (ulysses, Ulysses degree 8) is not one plan models for this model (dense, on the 1D "
                       "split, heads / tp divisible by the Ulysses degree, the sequence (a spatial-temporal model's patches per frame) into 2 cp chunks; DSP: a "
                       "spatial-temporal model whose frames and patches per frame divide by cp)",
                       loom::config_error);
  CHECK_THROWS_AS(loom::plan_cost_model(m, c, cp_config(2, 4, context_kind::none, 1)), loom::config_error);
  CHECK_THROWS_AS(loom::plan_cost_model(m, c, cp_config(2, 1, context_kind::ring, 1)), loom::config_error);
}

TEST_CASE("plan, context: on a GPT 70B shape at 32768 tokens over 64 A100s the fastest plan splits the sequence") {
  // docs/plan/gpt-70b.model.json at sequence 32768 and 64 sequences per step, selene-64.cluster.json.
  const loom::model_desc m = plan_test::gpt_70b(32768, 1, 64);
  const loom::cluster_desc c = plan_test::selene_64();
  loom::plan_options o;
  o.families = {"1f1b", "interleaved-1f1b", "zb-h1"};
  const auto without = loom::plan(m, c, o);
  o.context = true;
  const auto with = loom::plan(m, c, o);
  REQUIRE_FALSE(without.ranked.empty());
  REQUIRE_FALSE(with.ranked.empty());
  CHECK(with.ranked[0].config.cp > 1);
  CHECK(with.ranked[0].step_time < 0.9 * without.ranked[0].step_time);
}

TEST_CASE("plan, context: a spatial-temporal model: its attention span, DSP's switch by hand, the other kinds in half the layers, the rules") {
  // 16 frames of 256 patches: the same 4096 tokens as lm.
  loom::model_desc st = lm;
  st.frames = 16;
  // The attention's mean span: (256 + 16) / 2 = 136 in place of the sequence's 4096.
  static_assert(pf::attention_span(lm) == 4096.0);
  CHECK(pf::attention_span(st) == 136.0);
  CHECK(pf::layer_forward_flops(st) == 24.0 * 4096 * 512 * 512 + 4.0 * 4096 * 136 * 512);
  CHECK(pf::layer_forward_flops(st) < pf::layer_forward_flops(lm));
  CHECK(close(pf::layer_activation_bytes(st, 1, false, loom::recompute_kind::none),
              4096.0 * 512 * (10 + 24 + 5.0 * 16 * 136 / 512)));
  CHECK(pf::layer_activation_bytes(st, 1, false, loom::recompute_kind::selective) ==
        pf::layer_activation_bytes(lm, 1, false, loom::recompute_kind::selective));  // the scores' term is the only one that changes

  const loom::cluster_desc c = small_cluster(16, 8, 80);
  auto a2a = [](double bytes, double ranks, const loom::link_cost& l) { return (ranks - 1) * l.alpha + (ranks - 1) / ranks * bytes * l.beta; };
  // DSP: one switch of the rank's whole hidden state s b h / cp per layer each way (tp 2, cp 4: in a node).
  const auto dsp = loom::detail::context_times(st, c, cp_config(2, 4, context_kind::dsp, 1), 1e9, 1e9);
  const double shard = 4096.0 * 512 / 4 * 2;
  CHECK(close(dsp.f, a2a(shard, 4, c.intra)));
  CHECK(close(dsp.b, a2a(shard, 4, c.intra)));
  // cp 8 with tp 2 leaves the node.
  CHECK(close(loom::detail::context_times(st, c, cp_config(2, 8, context_kind::dsp, 1), 0, 0).f, a2a(4096.0 * 512 / 8 * 2, 8, c.inter)));
  // The other kinds exchange in the spatial half of the layers only: half of the sequence model's per layer.
  for (const auto& [kind, u] : {std::pair{context_kind::ulysses, 4LL}, {context_kind::ring, 1LL}, {context_kind::tokenring, 1LL}, {context_kind::usp, 2LL}}) {
    INFO(loom::to_string(kind));
    const auto seq = loom::detail::context_times(lm, c, cp_config(2, 4, kind, u), 0, 0);
    const auto half = loom::detail::context_times(st, c, cp_config(2, 4, kind, u), 0, 0);
    CHECK(close(half.f * 2, seq.f));
    CHECK(close(half.b * 2, seq.b));
  }
  // Per layer pair and direction DSP moves 2 switches of s b h / cp, Ulysses 4 exchanges of
  // s b h / (tp cp) (in the spatial layer): equal at tp 2, DSP half at tp 1 (on a link without latency).
  loom::cluster_desc free_alpha = c;
  free_alpha.intra.alpha = 0;
  const auto d2 = loom::detail::context_times(st, free_alpha, cp_config(2, 4, context_kind::dsp, 1), 0, 0);
  const auto u2 = loom::detail::context_times(st, free_alpha, cp_config(2, 4, context_kind::ulysses, 4), 0, 0);
  CHECK(close(d2.f, u2.f));
  const auto d1 = loom::detail::context_times(st, free_alpha, cp_config(1, 4, context_kind::dsp, 1), 0, 0);
  const auto u1 = loom::detail::context_times(st, free_alpha, cp_config(1, 4, context_kind::ulysses, 4), 0, 0);
  CHECK(close(d1.f * 2, u1.f));  // tp 1: DSP half of Ulysses (the paper's claim; docs/mesh.md's counters)

  // The rules: DSP when the frames and the patches per frame divide by cp; ring attention's zig-zag
  // over the patches; a sequence model never gets DSP.
  auto has = [](const auto& choices, context_kind k) {
    return std::any_of(choices.begin(), choices.end(), [&](const auto& x) { return x.first == k; });
  };
  CHECK(has(loom::detail::context_choices(st, 2, 4), context_kind::dsp));
  CHECK(has(loom::detail::context_choices(st, 2, 16), context_kind::dsp));
  CHECK_FALSE(has(loom::detail::context_choices(st, 2, 32), context_kind::dsp));  // 16 frames do not split over 32
  CHECK_FALSE(has(loom::detail::context_choices(lm, 2, 4), context_kind::dsp));
  loom::model_desc few = st;
  few.frames = 1024;  // 4 patches per frame: DSP over cp 4, no zig-zag over 2 x 4 chunks
  CHECK(has(loom::detail::context_choices(few, 2, 4), context_kind::dsp));
  CHECK_FALSE(has(loom::detail::context_choices(few, 2, 4), context_kind::ring));
  CHECK_THROWS_WITH_AS(loom::plan_cost_model(lm, c, cp_config(2, 4, context_kind::dsp, 1)),
                       doctest::Contains("DSP: a spatial-temporal model whose frames and patches per frame divide by cp"), loom::config_error);

  // The model's rule: the frames divide the sequence.
  loom::model_desc bad = st;
  bad.frames = 3;
  CHECK(loom::detail::check_model_desc(bad) == "field \"frames\" must divide \"seq\" (4096 tokens are not 3 frames of equal size)");
  bad.frames = -1;
  CHECK(loom::detail::check_model_desc(bad).find("\"frames\" must be >= 0") != std::string::npos);

  // The search offers DSP for the spatial-temporal model and ranks it.
  loom::plan_options o;
  o.context = true;
  o.families = {"1f1b"};
  o.grids = false;
  const loom::plan_report rep = loom::plan(st, c, o);
  CHECK(std::any_of(rep.ranked.begin(), rep.ranked.end(), [](const loom::plan_result& r) { return r.config.cp_kind == context_kind::dsp; }));
}
