// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the mesh tests: run the mesh example's training loop (examples/03_mesh/train.hpp) on
// a threads world and collect every rank's report.

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "../../examples/03_mesh/train.hpp"
#include "loom/comm/threads.hpp"
#include "loom/schedule.hpp"

namespace mesh_test {

using mesh_example::model_spec;
using mesh_example::run_options;
using mesh_example::run_report;
using mesh_example::seq_kind;
using mesh_example::sharding;

//! Every rank's report of one run (index = world rank).
struct outcome {
  std::vector<run_report> ranks;
  long long differing() const { return ranks.empty() ? -1 : ranks[0].differing; }
  long long values() const { return ranks.empty() ? 0 : ranks[0].values; }
};

//! Trains `o` with schedule family `family` (chunks 0: the family's default) on threads.
inline outcome run(const std::string& family, run_options o, model_spec m = {}, int chunks = 0) {
  const loom::schedule s = loom::default_registry().at(family).make({o.layout.pp, o.microbatches, chunks});
  m.blocks = std::max(m.blocks, s.stages);
  outcome out;
  out.ranks.resize(static_cast<std::size_t>(o.layout.world()));
  std::mutex mu;
  loom::run_threads(o.layout.world(), [&](loom::threads::comm& c) {
    auto r = mesh_example::train(c, o, m, s);
    std::lock_guard lk(mu);
    out.ranks[static_cast<std::size_t>(c.rank())] = std::move(r);
  });
  return out;
}

//! A layout from degrees and a kind (ulysses 0: USP's default).
inline sharding layout(int dp, int tp, int pp, int sp, seq_kind k = seq_kind::none, int ulysses = 0) {
  sharding s{dp, tp, pp, sp, k, 1};
  if (k == seq_kind::megatron) s.sp = tp;
  s.ulysses = ulysses != 0 ? ulysses : loom::default_ulysses_degree(s.sp);
  return s;
}

//! pp2 x tp2 on `c` (4 ranks): world rank 1 (pipeline rank 0, tp rank 1) throws in the forward
//! of microbatch 1 while its tp peer, rank 0, waits in the forward's all-reduce. Returns what the
//! step threw on this rank (empty if nothing) and the seconds it took.
template <class Comm>
std::pair<std::string, double> tp_stage_failure(Comm& c) {
  using C = loom::counted<Comm>;
  const sharding s = layout(1, 2, 2, 1);
  const loom::schedule sched = loom::default_registry().at("1f1b").make({2, 4, 0});
  model_spec m;
  loom::mesh_comm g(mesh_example::make_mesh(s), c);
  mesh_example::stage_comms<C> sc{&g.tp(), nullptr, nullptr};
  loom::data_parallel<decltype(g), mesh_example::transformer_stage<C>> sync(g, {}, loom::sgd{.lr = m.lr});
  std::vector<double> targets(4 * 16, 1.0), inputs(4 * 16, 2.0);
  loom::pipeline p(sched, g.pp(), [&](loom::stage_id id) {
    auto [b0, b1] = mesh_example::stage_blocks(m.blocks, id.stage, 2);
    return mesh_example::transformer_stage<C>(m, s, g.coord(loom::dim::tp), 0, b0, b1, id.stage == 0, id.stage == 1, sc,
                                              false, 0.01, targets.data());
  }, {.scaling = loom::loss_scaling::sum, .observer = &sync});
  sync.attach(p);
  if (c.rank() == 1) p.stages()[0].fail_on = 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    p.step(inputs);
  } catch (const loom::pipeline_error& e) {
    what = e.what();
  }
  return {what, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace mesh_test
