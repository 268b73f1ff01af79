// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan with context parallelism (a cp degree and its kind: Ulysses, ring attention, USP,
// TokenRing; issue 25): each kind's exchanges per layer by hand, what the attention core hides,
// the split of FLOPs, activations and the pipeline message over cp, the search's rules, and on
// a GPT 70B shape at 32768 tokens a faster plan with cp than without.
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
                       "split, heads / tp divisible by the Ulysses degree, the sequence into 2 cp chunks)",
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
