// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::data_parallel over dp x pp on the threads backend, with the quickstart MLP: every
// registered family trains to the single-rank reference (bitwise in deterministic mode, where the
// reference sums the replicas' gradients in replica order; 1e-12 otherwise), sharded or not,
// with buckets small enough to split stages; buckets launch right after their stages' last
// weight-gradient action (and the sends it produced); a failure anywhere stops every rank with one error and changes nothing.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../../examples/01_quickstart/mlp.hpp"
#include "loom/comm/threads.hpp"
#include "loom/exec/data_parallel.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/mesh.hpp"
#include "loom/schedule.hpp"

namespace {

using mesh_t = loom::mesh<loom::dp<>, loom::pp<>>;
constexpr double lr = 0.05;

quickstart::mlp_spec spec_for(int stages) {
  quickstart::mlp_spec m;
  const int L = std::max(5, stages);
  m.widths.clear();
  m.widths.push_back(4);
  for (int l = 1; l < L; ++l) m.widths.push_back(3 + (l * 5) % 4);
  m.widths.push_back(3);
  m.lr = 0;  // the stages' own update() is a no-op: loom::data_parallel runs the optimizer
  return m;
}

//! Microbatches [first, first + count) of `b`.
quickstart::batch slice(const quickstart::mlp_spec& m, const quickstart::batch& b, int first, int count) {
  quickstart::batch out;
  const auto in = static_cast<std::size_t>(m.samples) * m.width(0), fin = static_cast<std::size_t>(m.samples) * m.width(m.layers());
  out.inputs.assign(b.inputs.begin() + static_cast<std::ptrdiff_t>(in * static_cast<std::size_t>(first)),
                    b.inputs.begin() + static_cast<std::ptrdiff_t>(in * static_cast<std::size_t>(first + count)));
  out.targets.assign(b.targets.begin() + static_cast<std::ptrdiff_t>(fin * static_cast<std::size_t>(first)),
                     b.targets.begin() + static_cast<std::ptrdiff_t>(fin * static_cast<std::size_t>(first + count)));
  return out;
}

using layers = std::vector<std::vector<double>>;

//! The single-rank reference. Deterministic: each replica's gradient folded over its
//! microbatches (scale 1/m), the replicas summed in order, times 1/dp, then SGD. Otherwise the
//! plain full-batch step (scale 1/(dp m)).
layers reference(const quickstart::mlp_spec& m, int dp, int mb, int steps, bool ordered, const loom::adam<double>* adam = nullptr) {
  layers params, m1, m2;  // m1, m2: Adam's moments
  long t = 0;
  for (int l = 0; l < m.layers(); ++l) params.push_back(quickstart::initial_params(m, l));
  quickstart::mlp_spec with_lr = m;
  with_lr.lr = lr;
  for (int st = 0; st < steps; ++st) {
    auto data = quickstart::make_batch(m, dp * mb, st);
    layers grads;
    if (!ordered) {
      quickstart::reference_step(with_lr, dp * mb, data, 1.0 / (dp * mb), params, grads);
      continue;
    }
    layers total;
    for (int d = 0; d < dp; ++d) {
      layers g, p = params;
      quickstart::reference_step(m, mb, slice(m, data, d * mb, mb), 1.0 / mb, p, g);  // lr 0: p unchanged
      if (d == 0) total = g;
      else
        for (std::size_t l = 0; l < g.size(); ++l)
          for (std::size_t i = 0; i < g[l].size(); ++i) total[l][i] += g[l][i];
    }
    if (adam != nullptr) {  // Adam on the scaled sum, the operations of loom::detail::adam_element
      if (t++ == 0)
        for (auto const& l : params) m1.emplace_back(l.size(), 0.0), m2.emplace_back(l.size(), 0.0);
      const double c1 = 1 - std::pow(adam->beta1, static_cast<double>(t)), c2 = std::sqrt(1 - std::pow(adam->beta2, static_cast<double>(t)));
      for (std::size_t l = 0; l < params.size(); ++l)
        for (std::size_t i = 0; i < params[l].size(); ++i)
          loom::detail::adam_element(params[l][i], total[l][i] * (1.0 / dp), m1[l][i], m2[l][i], adam->beta1, adam->beta2,
                                     adam->lr * c2 / c1, adam->eps * c2);
      continue;
    }
    for (std::size_t l = 0; l < params.size(); ++l)
      for (std::size_t i = 0; i < params[l].size(); ++i) params[l][i] -= lr * (total[l][i] * (1.0 / dp));
  }
  return params;
}

struct outcome {
  layers params;              // from replica 0
  bool replicas_equal = true;  // every replica holds the same bits
  std::vector<std::vector<loom::bucket_report>> reports;  // per world rank, after the last step
  std::size_t state_bytes = 0;  // rank 0's optimizer state
};

template <class Opt = loom::sgd>
outcome train(const loom::schedule& s, int dp, int steps, loom::data_parallel_options o, bool det, Opt opt = loom::sgd{.lr = lr}) {
  const auto m = spec_for(s.stages);
  const int P = s.ranks, mb = s.microbatches;
  mesh_t mesh{loom::dp<>{dp}, loom::pp<>{P}};
  outcome out;
  out.params.assign(static_cast<std::size_t>(m.layers()), {});
  out.reports.resize(static_cast<std::size_t>(dp * P));
  std::mutex mu;
  o.deterministic = det;
  o.grad_scale = 1.0 / dp;
  loom::run_threads(dp * P, [&](loom::threads::comm& c) {
    loom::mesh_comm g(mesh, c);
    std::vector<double> targets;
    loom::data_parallel<decltype(g), quickstart::mlp_stage, Opt> sync(g, o, opt);
    loom::pipeline p(s, g.pp(), [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
    }, {.deterministic = det, .observer = &sync});
    sync.attach(p);
    const int d = g.coord(loom::dim::dp);
    for (int st = 0; st < steps; ++st) {
      auto mine = slice(m, quickstart::make_batch(m, dp * mb, st), d * mb, mb);
      targets = mine.targets;
      p.step(mine.inputs);
    }
    sync.finish();
    std::lock_guard lk(mu);
    out.reports[static_cast<std::size_t>(c.rank())] = sync.report();
    if constexpr (requires { sync.optimizer().state_bytes(); })
      if (c.rank() == 0) out.state_bytes = sync.optimizer().state_bytes();
    for (auto& stg : p.stages())
      for (int l = stg.first_layer(); l < stg.last_layer(); ++l) {
        auto w = stg.layer_params(l);
        auto& slot = out.params[static_cast<std::size_t>(l)];
        if (slot.empty()) {
          slot.assign(w.begin(), w.end());
        } else {
          for (std::size_t i = 0; i < w.size(); ++i)
            if (std::bit_cast<std::uint64_t>(w[i]) != std::bit_cast<std::uint64_t>(slot[i])) out.replicas_equal = false;
        }
      }
  });
  return out;
}

//! Values of `got` that differ from `want`: bitwise, or beyond 1e-12 of the layer's largest value.
long long differences(const layers& got, const layers& want, bool bitwise) {
  long long bad = 0;
  for (std::size_t l = 0; l < want.size(); ++l) {
    double norm = 0;
    for (double v : want[l]) norm = std::max(norm, std::abs(v));
    if (got[l].size() != want[l].size()) return 1 << 30;
    for (std::size_t i = 0; i < want[l].size(); ++i)
      bad += bitwise ? std::bit_cast<std::uint64_t>(got[l][i]) != std::bit_cast<std::uint64_t>(want[l][i])
                     : std::abs(got[l][i] - want[l][i]) > 1e-12 * norm;
  }
  return bad;
}

}  // namespace

TEST_CASE("data_parallel: every family over dp x pp trains to the single-rank reference, sharded or not, in small buckets or one") {
  int runs = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    for (int P : {2, 3})
      for (int dp : {2, 3}) {
        if (dp == 3 && P == 3) continue;
        const int mb = 2 * P + 1;
        loom::shape sh = e.resolve({P, mb, 0});
        if (!e.check(sh).empty()) sh = e.resolve({P, 2 * P, 0});
        if (!e.check(sh).empty()) continue;
        loom::schedule s = e.make(sh);
        for (bool det : {true, false})
          for (bool sharded : {false, true})
            for (std::size_t bytes : {std::size_t{40}, std::size_t{25} << 20}) {
              INFO(e.name << " P=" << P << " dp=" << dp << " m=" << sh.microbatches << (det ? " deterministic" : "")
                          << (sharded ? " sharded" : "") << " bucket " << bytes << " B");
              auto got = train(s, dp, 2, {.bucket_bytes = bytes, .sharded = sharded}, det);
              auto want = reference(spec_for(s.stages), dp, sh.microbatches, 2, det);
              CHECK(got.replicas_equal);
              CHECK(differences(got.params, want, det) == 0);
              ++runs;
            }
      }
  }
  CHECK(runs > 200);
}

TEST_CASE("data_parallel: a bucket is launched right after the last weight-gradient action of its stages and the sends it produced") {
  // interleaved 1F1B with 2 chunks: rank 0's chunk-1 stage finishes its backward well before the
  // end of the program, so its buckets go out while chunk 0 still computes.
  for (const char* fam : {"interleaved-1f1b", "zb-h1", "1f1b", "zb-v"}) {
    loom::schedule s = loom::default_registry().at(fam).make({2, 4, 0});
    auto got = train(s, 2, 1, {.bucket_bytes = 64}, true);
    for (int r = 0; r < 4; ++r) {
      const int P = 2;
      const loom::schedule low = loom::lower(s);
      const auto& prog = low.programs[static_cast<std::size_t>(r % P)];
      const loom::buffer_plan plan = loom::plan_buffers(low, r % P);
      for (const auto& b : got.reports[static_cast<std::size_t>(r)]) {
        // The position of the last W/BW of the bucket's stages in this rank's lowered program.
        long last = -1;
        for (std::size_t li : b.stages) {
          long at = -1;
          for (std::size_t i = 0; i < prog.size(); ++i)
            if ((prog[i].kind == loom::op::W || prog[i].kind == loom::op::BW) && plan.local[li].id.stage == prog[i].stage)
              at = static_cast<long>(i);
          // ... and after the sends that directly follow it (the gradient it produced).
          while (at + 1 < static_cast<long>(prog.size()) && prog[static_cast<std::size_t>(at + 1)].kind == loom::op::send) ++at;
          last = std::max(last, at);
        }
        INFO(fam << " rank " << r << " bucket of " << b.elements << " elements");
        CHECK(b.launched_at == last);
        CHECK(b.launched_at >= 0);
      }
    }
    if (std::string(fam) == "interleaved-1f1b" || std::string(fam) == "zb-v") {
      // On rank 0, some bucket launches before the program's last action (overlap).
      const loom::schedule low = loom::lower(s);
      const auto& prog = low.programs[0];
      bool early = false;
      for (const auto& b : got.reports[0]) early = early || b.launched_at + 1 < static_cast<long>(prog.size());
      CHECK(early);
    }
  }
}

TEST_CASE("data_parallel: launching after the step instead gives the same bits") {
  loom::schedule s = loom::default_registry().at("zb-h1").make({2, 4, 0});
  auto eager = train(s, 2, 2, {.bucket_bytes = 48}, true);
  auto late = train(s, 2, 2, {.bucket_bytes = 48, .eager = false}, true);
  CHECK(differences(eager.params, late.params, true) == 0);
  for (auto const& rep : late.reports)
    for (auto const& b : rep) CHECK(b.launched_at == -1);
}

TEST_CASE("data_parallel: a stage failure in one replica stops every rank with the same error and updates nothing") {
  loom::schedule s = loom::default_registry().at("1f1b").make({2, 4, 0});
  const auto m = spec_for(s.stages);
  mesh_t mesh{loom::dp<>{2}, loom::pp<>{2}};
  std::mutex mu;
  std::vector<std::string> errors;
  int retried_ok = 0;
  loom::run_threads(4, [&](loom::threads::comm& c) {
    loom::mesh_comm g(mesh, c);
    std::vector<double> targets;
    loom::data_parallel<decltype(g), quickstart::mlp_stage> sync(g, {.bucket_bytes = 64, .deterministic = true},
                                                                 loom::sgd{.lr = lr});
    loom::pipeline p(s, g.pp(), [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
    }, {.deterministic = true, .observer = &sync});
    sync.attach(p);
    const int d = g.coord(loom::dim::dp);
    auto mine = slice(m, quickstart::make_batch(m, 8, 0), d * 4, 4);
    targets = mine.targets;
    std::vector<double> before(p.stages()[0].params().begin(), p.stages()[0].params().end());
    if (c.rank() == 3) p.stages()[0].fail_on = 2;  // replica 1, pipeline rank 1
    try {
      p.step(mine.inputs);
    } catch (const loom::pipeline_error& e) {
      std::lock_guard lk(mu);
      errors.push_back(std::to_string(e.rank()) + ": " + e.cause());
    }
    auto now = p.stages()[0].params();
    bool same = std::equal(now.begin(), now.end(), before.begin());
    p.stages()[0].fail_on = -1;
    p.step(mine.inputs);
    std::lock_guard lk(mu);
    if (same) ++retried_ok;
  });
  REQUIRE(errors.size() == 4);
  for (auto& e : errors) {
    CHECK(e.rfind("3: stage 1 forward of microbatch 2 threw: injected failure", 0) == 0);
    CHECK(e == errors[0]);
  }
  CHECK(retried_ok == 4);
}

TEST_CASE("data_parallel with Adam: dp x pp trains to the single-rank Adam reference bitwise, sharded or not, and ZeRO keeps 1/dp of the moments") {
  const loom::adam<double> adam{.lr = 0.02};
  for (const char* fam : {"1f1b", "zb-h1", "interleaved-1f1b", "dualpipe-v"}) {
    const auto& e = loom::default_registry().at(fam);
    auto s = e.make(e.resolve({.ranks = 2, .microbatches = 4}));
    const auto m = spec_for(s.stages);
    const auto want = reference(m, 2, s.microbatches, 3, true, &adam);
    std::size_t plain_state = 0;
    for (bool sharded : {false, true}) {
      CAPTURE(std::string(fam));
      CAPTURE(sharded);
      auto got = train(s, 2, 3, {.sharded = sharded}, true, adam);
      CHECK(got.replicas_equal);
      CHECK(differences(got.params, want, true) == 0);
      if (!sharded) plain_state = got.state_bytes;
      else  // the moments of the shard: half of them, plus at most one padding element per bucket
        CHECK((got.state_bytes * 2 >= plain_state && got.state_bytes * 2 <= plain_state + 2 * 2 * sizeof(double) * got.reports[0].size()));
    }
    CHECK(plain_state > 0);
  }
}
