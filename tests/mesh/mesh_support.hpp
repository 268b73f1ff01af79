// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the mesh tests: run the mesh example's training loop (examples/03_mesh/train.hpp) on
// a threads world and collect every rank's report.

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

}  // namespace mesh_test
