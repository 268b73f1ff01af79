// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan with PipeOffload (plan_options::offload): the cost model carries the host link and
// what a copy moves, offloading chunks lowers the predicted peak by the activations away while the
// copies are timed on the host link, the search tries the grouped family only when asked and
// within its rules, needs a host link, and on a GPT 70B shape over 64 A100s with PCIe host links
// offload lets a layout with fewer pipeline stages fit and lead (docs/plan.md's table).
#include <doctest/doctest.h>

#include <loom/plan.hpp>

#include "plan_support.hpp"

#include <string>

namespace {

constexpr loom::model_desc small{.layers = 8, .hidden = 1024, .heads = 16, .seq = 1024, .vocab = 32000, .micro_batch = 1, .global_batch = 64};

// plan_test::small_cluster with a host link of 100 GB/s (the small model's stages are short: at
// 25 GB/s PipeOffload's rules refuse every plan, which the search test checks too).
loom::cluster_desc with_host(loom::cluster_desc c, double bytes_per_second = 100e9) {
  c.host = {.alpha = 1e-5, .beta = 1 / bytes_per_second};
  return c;
}

loom::plan_config grouped(int g, int off) {
  return {.dp = 1, .tp = 2, .pp = 4, .sp = true, .recompute = loom::recompute_kind::selective, .family = "group-interleaved-1f1b", .chunks = 2,
          .microbatches = 16, .group = g, .offload_chunks = off};
}

}  // namespace

TEST_CASE("plan, offload: the cost model carries the cluster's host link and what a copy of each stage moves") {
  const auto c = with_host(plan_test::small_cluster(8, 4, 16));
  const auto cm = loom::plan_cost_model(small, c, grouped(2, 1));
  CHECK(cm.host == c.host);
  for (auto const& st : cm.stages) CHECK(st.activation_bytes == st.activation);
}

TEST_CASE("plan, offload: offloading chunks lowers the predicted peak, the copies are in the program and timed on the host link") {
  const auto c = with_host(plan_test::small_cluster(8, 4, 64));
  const loom::schedule s = loom::default_registry().at("group-interleaved-1f1b").make({.ranks = 4, .microbatches = 16, .chunks = 2, .group = 2});
  const auto plain = loom::evaluate_plan(small, c, grouped(2, 0), s);
  double last = plain.activation_bytes;
  for (int off : {1, 2}) {
    CAPTURE(off);
    const auto k = grouped(2, off);
    const loom::offload_plan op = loom::detail::plan_offload_for(small, c, k, s);
    REQUIRE_MESSAGE(op.ok, std::string(op.error.view()));
    const loom::schedule with = loom::with_offload(s, op);
    std::size_t copies = 0;
    for (auto const& prog : with.programs)
      for (auto const& a : prog) copies += loom::is_host_copy(a.kind) ? 1 : 0;
    CHECK(copies == op.copies.size());
    CHECK(copies > 0);
    const auto r = loom::evaluate_plan(small, c, k, with);
    CHECK(r.activation_bytes < plain.activation_bytes);
    CHECK(r.activation_bytes <= last);
    CHECK(r.state_bytes == plain.state_bytes);
    CHECK(r.pipeline_time >= plain.pipeline_time);  // the copies never make the compute start earlier
    last = r.activation_bytes;
    // A slower host link: the copies take longer, the step is no faster.
    auto slow = c;
    slow.host.beta *= 20;
    const loom::offload_plan op_slow = loom::detail::plan_offload_for(small, slow, k, s);
    if (op_slow.ok) CHECK(loom::evaluate_plan(small, slow, k, loom::with_offload(s, op_slow)).pipeline_time >= r.pipeline_time);
  }
}

TEST_CASE("plan, offload: searched only when asked, with a host link, within the family's rules") {
  const auto c = with_host(plan_test::small_cluster(8, 4, 16));
  loom::plan_options o;
  o.families = {"1f1b", "group-interleaved-1f1b"};
  o.recompute = {loom::recompute_kind::selective};
  const auto without = loom::plan(small, c, o);
  for (auto const& r : without.ranked) CHECK(r.config.offload_chunks == 0);
  CHECK(without.refused == 0);
  o.offload = true;
  const auto with = loom::plan(small, c, o);
  CHECK(with.evaluated > without.evaluated);
  bool offloaded = false;
  for (auto const& r : with.ranked) {
    const auto& k = r.config;
    CAPTURE(k.family);
    if (k.family != "group-interleaved-1f1b") {
      CHECK(k.group == 0);
      CHECK(k.offload_chunks == 0);
      continue;
    }
    CHECK(k.group >= (k.pp + 1) / 2);
    CHECK(k.group <= k.pp);
    CHECK(k.offload_chunks <= k.chunks);
    if (k.offload_chunks > 0) CHECK(k.pp % 2 == 0);  // PipeOffload pairs the ranks on a host link
    offloaded = offloaded || k.offload_chunks > 0;
  }
  CHECK(offloaded);
  // A slower host link: PipeOffload's rules refuse more plans (a copy back that cannot fit before
  // its backward); they are counted and left out.
  const auto slow = loom::plan(small, with_host(plan_test::small_cluster(8, 4, 16), 25e9), o);
  CHECK(slow.refused > with.refused);
  CHECK(slow.ranked.size() <= with.ranked.size());
  // Without a host link in the cluster, offload is refused in one line naming the field.
  CHECK_THROWS_WITH_AS(loom::plan(small, plan_test::small_cluster(8, 4, 16), o), doctest::Contains("\"host\""), loom::config_error);
  // A host link that is not a finite number >= 0 is refused naming it.
  auto bad = c;
  bad.host.beta = -1;
  CHECK_THROWS_WITH_AS(loom::plan(small, bad, o), doctest::Contains("host.beta"), loom::config_error);
}

TEST_CASE("plan, offload: on a GPT 70B shape over 64 A100s with PCIe host links, offload lets fewer pipeline stages fit and lead") {
  // docs/plan/gpt-70b.model.json on docs/plan/selene-64-host.cluster.json (docs/plan.md's table).
  const auto m = plan_test::gpt_70b(4096, 1, 512);
  auto c = plan_test::selene_64();
  c.host = {.alpha = 1e-5, .beta = 4e-11};
  loom::plan_options o;
  o.families = {"1f1b", "interleaved-1f1b", "zb-h1"};
  o.recompute = {loom::recompute_kind::selective};
  o.grids = false;
  const auto a = loom::plan(m, c, o).ranked.at(0);
  o.offload = true;
  const auto b = loom::plan(m, c, o).ranked.at(0);
  CHECK(b.config.offload_chunks > 0);
  CHECK(b.step_time < a.step_time);
  CHECK_FALSE((a.config.dp == b.config.dp && a.config.tp == b.config.tp && a.config.pp == b.config.pp));  // another layout
  CHECK(b.config.pp < a.config.pp);  // fewer, longer stages: more activations per GPU, which the copies make room for
  // The same configuration without its copies does not fit.
  auto k = b.config;
  k.offload_chunks = 0;
  const auto s = loom::default_registry().at(k.family).make(
      {.ranks = static_cast<int>(k.pp), .microbatches = static_cast<int>(k.microbatches), .chunks = k.chunks, .group = k.group});
  CHECK_FALSE(loom::evaluate_plan(m, c, k, s).fits);
}
