// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the executor tests: train the quickstart MLP through loom::pipeline on the threads
// backend and through the single-rank reference, and compare.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>

#include "../../examples/01_quickstart/mlp.hpp"

namespace loom_test {

//! A model deep enough for S virtual stages (at least one layer per stage).
inline quickstart::mlp_spec spec_for(int stages) {
  quickstart::mlp_spec m;
  const int L = std::max(6, stages);
  m.widths.clear();
  m.widths.push_back(4);
  for (int l = 1; l < L; ++l) m.widths.push_back(3 + (l * 5) % 4);
  m.widths.push_back(3);
  return m;
}

//! What a run produced: the loss of each step and the final parameters and gradients per layer
//! (for two-direction schedules, one copy's).
struct outcome {
  std::vector<double> losses;
  std::vector<std::vector<double>> params, grads;
  bool copies_identical = true;  // two-direction schedules: both copies hold the same bits
};

inline outcome run_reference(const quickstart::mlp_spec& m, int microbatches, int steps, loom::loss_scaling sc) {
  outcome o;
  for (int l = 0; l < m.layers(); ++l) o.params.push_back(quickstart::initial_params(m, l));
  const double scale = sc == loom::loss_scaling::mean ? 1.0 / microbatches : 1.0;
  for (int st = 0; st < steps; ++st)
    o.losses.push_back(quickstart::reference_step(m, microbatches, quickstart::make_batch(m, microbatches, st), scale, o.params, o.grads));
  return o;
}

//! Trains `steps` steps of `sched` (a loom::schedule, or a static_schedule type instance) on threads.
template <class Sched>
outcome run_pipeline(const Sched& sched, const loom::schedule& rt, const quickstart::mlp_spec& m, int steps,
                     loom::pipeline_options opt) {
  outcome o;
  const int L = m.layers();
  o.params.assign(static_cast<std::size_t>(L), {});
  o.grads.assign(static_cast<std::size_t>(L), {});
  o.losses.assign(static_cast<std::size_t>(steps), 0.0);
  std::mutex mu;
  loom::run_threads(rt.ranks, [&](loom::threads::comm& c) {
    std::vector<double> targets;
    auto make = [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, rt.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == rt.stages - 1, &targets);
    };
    loom::pipeline p(sched, c, make, opt);
    for (int st = 0; st < steps; ++st) {
      auto data = quickstart::make_batch(m, rt.microbatches, st);
      targets = data.targets;
      auto r = p.step(data.inputs);
      if (c.rank() == 0) o.losses[static_cast<std::size_t>(st)] = r.loss;
    }
    std::lock_guard lk(mu);
    for (auto& s : p.stages())
      for (int l = s.first_layer(); l < s.last_layer(); ++l) {
        auto ul = static_cast<std::size_t>(l);
        auto g = s.layer_grad(l);
        if (o.grads[ul].empty()) {
          o.grads[ul].assign(g.begin(), g.end());
          auto w = s.layer_params(l);
          o.params[ul].assign(w.begin(), w.end());
        } else {
          auto w = s.layer_params(l);
          o.copies_identical = o.copies_identical && std::equal(g.begin(), g.end(), o.grads[ul].begin()) &&
                               std::equal(w.begin(), w.end(), o.params[ul].begin());
        }
      }
  });
  return o;
}

//! Largest |a - b| / max|b| over a layer's values (0 when equal).
inline double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    n = std::max(n, std::abs(b[i]));
  }
  if (a.size() != b.size()) return 1e300;
  return n > 0 ? d / n : d;
}

//! Bitwise comparison.
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return false;
  return true;
}

}  // namespace loom_test
