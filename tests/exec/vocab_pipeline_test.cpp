// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Vocabulary-parallel schedules (1f1b-vocab-1/2, v-half-vocab-1/2) run by loom::pipeline on the
// threads backend with loom::vocab_layers: a model of token-wise tanh layers between a sharded
// embedding and a sharded output layer trains like the single-rank reference, bit for bit
// against the same shards computed on one rank in order, and within 1e-12 of the unsplit layers
// (one shard holding the whole vocabulary); lowered programs validate and carry the layers'
// messages; bad inputs are refused with one line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <loom/comm/threads.hpp>

#include "vocab_support.hpp"

namespace {

using namespace vocab_test;

// The model trained on threads: the ranks' parts summed.
result run(const model& md, const loom::schedule& s, const std::vector<tok_t>& ids, const std::vector<tok_t>& targets, loom::pipeline_options opt,
           int steps = 1, double weight = 1) {
  std::vector<result> parts(static_cast<std::size_t>(s.ranks));
  loom::run_threads(s.ranks, [&](loom::threads::comm& c) {
    parts[static_cast<std::size_t>(c.rank())] = run_rank(c, md, s, ids, targets, opt, steps, static_cast<const loom::schedule*>(nullptr), weight);
  });
  result r = parts[0];
  for (std::size_t k = 1; k < parts.size(); ++k) {
    auto add = [](vec& to, const vec& v) {
      for (std::size_t i = 0; i < to.size(); ++i) to[i] += v[i];
    };
    add(r.out_grad, parts[k].out_grad);
    add(r.in_grad, parts[k].in_grad);
    for (std::size_t st = 0; st < r.stage_grads.size(); ++st) add(r.stage_grads[st], parts[k].stage_grads[st]);
  }
  return r;
}

}  // namespace

TEST_CASE("vocab pipeline: lowered vocabulary-parallel programs validate and carry every layer message once") {
  for (const auto& f : families)
    for (int p : {2, 4, 8})
      for (int m : {p + 2, 2 * p + 1}) {
        CAPTURE(f.name);
        CAPTURE(p);
        CAPTURE(m);
        const loom::schedule s = f.make(p, m);
        const loom::schedule low = loom::lower(s);
        const auto v = loom::validate(low);
        REQUIRE_MESSAGE(v.ok, v.message);
        // Per microbatch: p - 1 outputs, p (p - 1) statistics, p - 1 gradient parts, p - 1
        // embedding parts, p - 1 embedding gradients.
        std::size_t sends = 0, recvs = 0;
        for (auto const& prog : low.programs)
          for (auto const& a : prog)
            if (loom::is_transfer(a.kind) && loom::is_vocab(a.what)) (a.kind == loom::op::send ? sends : recvs) += 1;
        const auto P = static_cast<std::size_t>(p), M = static_cast<std::size_t>(m);
        CHECK(sends == M * (4 * (P - 1) + P * (P - 1)));
        CHECK(recvs == sends);
      }
}

TEST_CASE("vocab pipeline: a lowered program without a layer message, or with one moved after its consumer, is refused") {
  const loom::schedule low = loom::lower(loom::generate(loom::one_f_one_b_vocab_1{}, {.ranks = 4, .microbatches = 6}));
  int dropped = 0, moved = 0;
  for (loom::payload w : {loom::payload::vocab_output, loom::payload::vocab_stats, loom::payload::vocab_grad, loom::payload::vocab_embed,
                          loom::payload::vocab_embed_grad}) {
    CAPTURE(std::string(loom::short_name(w)));
    for (std::size_t r = 0; r < low.programs.size(); ++r) {
      auto const& prog = low.programs[r];
      for (std::size_t i = 0; i < prog.size(); ++i) {
        if (prog[i].kind != loom::op::recv || prog[i].what != w) continue;
        loom::schedule bad = low;  // the receive dropped
        auto& bp = bad.programs[r];
        bp.erase(bp.begin() + static_cast<std::ptrdiff_t>(i));
        const auto v = loom::validate(bad);
        CHECK_FALSE(v.ok);
        CHECK(v.message.find("rank " + std::to_string(r)) != std::string::npos);
        ++dropped;
        loom::schedule late = low;  // the receive moved to the end of the program
        auto& lp = late.programs[r];
        const loom::action a = lp[i];
        lp.erase(lp.begin() + static_cast<std::ptrdiff_t>(i));
        lp.push_back(a);
        CHECK_FALSE(loom::validate(late).ok);
        ++moved;
        break;  // one per payload and rank
      }
    }
  }
  CHECK(dropped >= 5);
  CHECK(moved == dropped);
}

TEST_CASE("vocab pipeline: training equals the single-rank reference, bitwise on the same shards and within 1e-12 of the unsplit layers") {
  int runs = 0;
  for (const auto& f : families)
    for (int p : {2, 4}) {
      for (int m : {p + 2, 2 * p + 1}) {
        model md;
        md.vocab = 24;
        const loom::schedule s = f.make(p, m);
        md.stages = s.stages;
        md.layers_per_stage = s.stages == p ? 2 : 1;
        const auto ids = md.tokens(m, 11 + static_cast<unsigned>(m)), targets = md.tokens(m, 12 + static_cast<unsigned>(m));
        const result same = reference(md, p, f.algorithm, m, ids, targets);
        const result unsplit = reference(md, 1, 1, m, ids, targets);
        for (bool det : {true, false}) {
          CAPTURE(f.name);
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(det);
          const result got = run(md, s, ids, targets, {.deterministic = det}, 2);  // the second step re-zeroes and repeats the first
          CHECK(std::memcmp(&got.loss, &same.loss, sizeof(double)) == 0);
          CHECK(same_bits(got.out_grad, same.out_grad));
          CHECK(same_bits(got.in_grad, same.in_grad));
          for (int k = 0; k < md.stages; ++k) CHECK(same_bits(got.stage_grads[static_cast<std::size_t>(k)], same.stage_grads[static_cast<std::size_t>(k)]));
          CHECK(std::abs(got.loss - unsplit.loss) <= 1e-12 * std::abs(unsplit.loss));
          CHECK(rel(got.out_grad, unsplit.out_grad) <= 1e-12);
          CHECK(rel(got.in_grad, unsplit.in_grad) <= 1e-12);
          for (int k = 0; k < md.stages; ++k) CHECK(rel(got.stage_grads[static_cast<std::size_t>(k)], unsplit.stage_grads[static_cast<std::size_t>(k)]) <= 1e-12);
          ++runs;
        }
      }
    }
  CHECK(runs == 32);
}

TEST_CASE("vocab pipeline: a static_schedule of a vocabulary-parallel family trains bitwise like the run-time schedule") {
  using fixed = loom::static_schedule<loom::one_f_one_b_vocab_2, loom::shape{.ranks = 2, .microbatches = 4}>;
  static_assert(fixed::lowered_program<0>.size() > 0);
  const loom::schedule s = loom::generate(loom::one_f_one_b_vocab_2{}, {.ranks = 2, .microbatches = 4});
  model md;
  md.stages = s.stages;
  md.layers_per_stage = 2;
  const auto ids = md.tokens(4, 31), targets = md.tokens(4, 32);
  const result dynamic = run(md, s, ids, targets, {.deterministic = true});
  std::vector<result> parts(2);
  const fixed sched{};
  loom::run_threads(2, [&](loom::threads::comm& c) {
    parts[static_cast<std::size_t>(c.rank())] = run_rank(c, md, s, ids, targets, {.deterministic = true}, 1, &sched);
  });
  CHECK(std::memcmp(&parts[0].loss, &dynamic.loss, sizeof(double)) == 0);
  for (std::size_t i = 0; i < dynamic.out_grad.size(); ++i) CHECK(parts[0].out_grad[i] + parts[1].out_grad[i] == dynamic.out_grad[i]);
  for (std::size_t i = 0; i < dynamic.in_grad.size(); ++i) CHECK(parts[0].in_grad[i] + parts[1].in_grad[i] == dynamic.in_grad[i]);
  for (std::size_t k = 0; k < dynamic.stage_grads.size(); ++k)
    for (std::size_t i = 0; i < dynamic.stage_grads[k].size(); ++i)
      CHECK(parts[0].stage_grads[k][i] + parts[1].stage_grads[k][i] == dynamic.stage_grads[k][i]);
}

TEST_CASE("vocab pipeline: a loss weight scales every token's gradient and the reported losses, bitwise as the reference weighs them") {
  // The mesh example's objective, the mean over the step's m n tokens: loss_scaling::sum and a
  // weight of 1 / (m n); here also a weight on top of the mean (1 / m) scaling.
  for (const auto& f : families) {
    const int p = 2, m = 5;
    model md;
    const loom::schedule s = f.make(p, m);
    md.stages = s.stages;
    const auto ids = md.tokens(m, 41), targets = md.tokens(m, 42);
    CAPTURE(f.name);
    const double w = 1.0 / static_cast<double>(static_cast<std::size_t>(m) * md.n);
    const auto make = [&](int st) { return md.make(st); };
    // Mean scaling with weight w: dl = (1/m) w.
    const result want = reference_with(md, p, f.algorithm, m, ids, targets, make, w);
    const result got = run(md, s, ids, targets, {.deterministic = true}, 1, w);
    CHECK(std::memcmp(&got.loss, &want.loss, sizeof(double)) == 0);
    CHECK(same_bits(got.out_grad, want.out_grad));
    CHECK(same_bits(got.in_grad, want.in_grad));
    for (int k = 0; k < md.stages; ++k) CHECK(same_bits(got.stage_grads[static_cast<std::size_t>(k)], want.stage_grads[static_cast<std::size_t>(k)]));
    // The weight changes the result (a test that could not fail otherwise): unweighted differs.
    const result plain = run(md, s, ids, targets, {.deterministic = true}, 1);
    CHECK(std::abs(plain.loss - got.loss / w) <= 1e-12 * std::abs(plain.loss));
    CHECK(rel(got.out_grad, plain.out_grad) > 0.5);
  }
  model md;
  const auto sh = loom::shard_of(24, 2, 0, md.h);
  vec w(sh.rows * md.h), e(w.size()), g1(w.size()), g2(w.size());
  loom::vocab_layers<double> layers(sh, md.n, w, e, g1, g2);
  CHECK(layers.loss_weight() == 1.0);
  CHECK_THROWS_WITH_AS(layers.loss_weight(0.0), "vocabulary layers: the loss weight must be finite and positive (got 0.000000)", loom::config_error);
  CHECK_THROWS_AS(layers.loss_weight(std::nan("")), loom::config_error);
  CHECK(layers.loss_weight() == 1.0);
}

TEST_CASE("vocab pipeline: the S stash is held only from S to its T, in as many slots as the program keeps open") {
  model md;
  for (const auto& f : families)
    for (int p : {2, 4}) {
      const int m = 2 * p + 1;
      const loom::schedule s = f.make(p, m);
      md.stages = s.stages;
      const vec W = md.table(7), E = md.table(8);
      const auto ids = md.tokens(m, 41), targets = md.tokens(m, 42);
      std::vector<std::size_t> slots(static_cast<std::size_t>(p));
      std::vector<double> loss(static_cast<std::size_t>(p));
      loom::run_threads(p, [&](loom::threads::comm& c) {
        const auto sh = loom::shard_of(static_cast<std::int64_t>(md.vocab), p, c.rank(), md.h);
        const std::size_t rh = sh.rows * md.h, at = static_cast<std::size_t>(c.rank()) * rh;
        vec gw(rh), ge(rh);
        loom::vocab_layers<double> layers(sh, md.n, std::span<const double>(W).subspan(at, rh), std::span<const double>(E).subspan(at, rh), gw, ge);
        loom::pipeline<loom::schedule, tanh_stage, loom::threads::comm, loom::vocab_layers<double>> pipe(
            s, c, [&](loom::stage_id id) { return md.make(id.stage); }, layers);
        layers.set_batch(ids, targets);
        for (int k = 0; k < 2; ++k) loss[static_cast<std::size_t>(c.rank())] = pipe.step({}).loss;
        slots[static_cast<std::size_t>(c.rank())] = layers.stash_slots();
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(f.name);
        CAPTURE(p);
        CAPTURE(r);
        // The most S open before their T in the rank's program, counted here independently.
        int open = 0, most = 0;
        for (auto const& a : s.programs[static_cast<std::size_t>(r)]) {
          open += a.kind == loom::op::S ? 1 : a.kind == loom::op::T ? -1 : 0;
          most = std::max(most, open);
        }
        CHECK(slots[static_cast<std::size_t>(r)] == static_cast<std::size_t>(most));
        CHECK(most < m);  // not one per microbatch
        CHECK(std::isfinite(loss[static_cast<std::size_t>(r)]));
      }
    }
}

TEST_CASE("vocab pipeline: refusals, one line each") {
  model md;
  const loom::schedule s = loom::generate(loom::one_f_one_b_vocab_1{}, {.ranks = 2, .microbatches = 4});
  auto error_of = [&](auto&& body) {
    std::string what;
    std::mutex mu;
    loom::run_threads(2, [&](loom::threads::comm& c) {
      try {
        body(c);
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        what += std::string(e.what()) + "\n";
      }
    });
    return what;
  };
  const vec W = md.table(7), E = md.table(8);
  // A vocabulary-parallel schedule without layers.
  CHECK(error_of([&](loom::threads::comm& c) {
          loom::pipeline pipe(s, c, [&](loom::stage_id id) { return md.make(id.stage); });
        }).find("build the pipeline with this rank's vocabulary layers") != std::string::npos);
  // Layers whose hidden width does not match the stages'.
  CHECK(error_of([&](loom::threads::comm& c) {
          const auto sh = loom::shard_of(24, 2, c.rank(), 2);
          vec w(sh.rows * 2), g(sh.rows * 2), e(sh.rows * 2), ge(sh.rows * 2);
          loom::vocab_layers<double> layers(sh, md.n, w, e, g, ge);
          loom::pipeline<loom::schedule, tanh_stage, loom::threads::comm, loom::vocab_layers<double>> pipe(s, c, [&](loom::stage_id id) { return md.make(id.stage); },
                                                                                                        layers);
        }).find("the last stage produces 12 elements per microbatch, but the output layer takes 3 tokens x 2 = 6") != std::string::npos);
  // A token id outside the vocabulary: the step fails on every rank with that sentence.
  std::vector<tok_t> ids = md.tokens(4, 1), targets = md.tokens(4, 2);
  targets[5] = 24;
  const std::string bad = error_of([&](loom::threads::comm& c) {
    const auto sh = loom::shard_of(24, 2, c.rank(), md.h);
    const std::size_t rh = sh.rows * md.h, at = static_cast<std::size_t>(c.rank()) * rh;
    vec gw(rh), ge(rh);
    loom::vocab_layers<double> layers(sh, md.n, std::span<const double>(W).subspan(at, rh), std::span<const double>(E).subspan(at, rh), gw, ge);
    loom::pipeline<loom::schedule, tanh_stage, loom::threads::comm, loom::vocab_layers<double>> pipe(s, c, [&](loom::stage_id id) { return md.make(id.stage); },
                                                                                                  layers);
    layers.set_batch(ids, targets);
    pipe.step({});
  });
  CHECK(bad.find("token 2 of microbatch 1 names id 24, outside the vocabulary of 24 ids") != std::string::npos);
  // A table of the wrong size.
  vec small(40), t(48), g1(48), g2(48);
  CHECK_THROWS_WITH_AS(loom::vocab_layers<double>(loom::shard_of(24, 2, 0, 4), 3, small, t, g1, g2),
                       "vocabulary layers: the output table has 40 elements, but the shard holds 12 rows x 4 = 48", loom::config_error);
}
