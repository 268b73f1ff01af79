// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Failures end the step on every rank, quickly, with an error naming the rank and the cause;
// a failed step leaves the weights untouched and can be retried.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "training_support.hpp"

using namespace loom_test;
using clock_type = std::chrono::steady_clock;

namespace {

//! Runs `body(rank, comm)` on P threads of one world (no run_threads: each rank handles its own
//! errors, so the test sees what every rank saw).
template <class Body>
void on_threads(int P, std::chrono::milliseconds timeout, Body body) {
  auto comms = loom::threads::world(P);
  for (auto& c : comms) c.set_timeout(timeout);
  std::vector<std::thread> ts;
  for (int r = 0; r < P; ++r) ts.emplace_back([&, r] { body(r, comms[static_cast<std::size_t>(r)]); });
  for (auto& t : ts) t.join();
}

struct rank_report {
  std::string error;  // what() of the pipeline_error, or empty
  int error_rank = -2;
  double seconds = 0;
  std::vector<double> losses;
};

//! The MLP stage with `pad` extra weight-gradient elements (a stage whose gradient size differs
//! from its copy's).
struct grad_padded : quickstart::mlp_stage {
  grad_padded(quickstart::mlp_stage s, unsigned pad) : quickstart::mlp_stage(std::move(s)) {
    auto g = quickstart::mlp_stage::weight_grad();
    padded.assign(g.size() + pad, 0.0);
  }
  std::span<double> weight_grad() { return padded; }
  std::vector<double> padded;
};

}  // namespace

TEST_CASE("a stage that throws on one rank fails the step on every rank, and the retried step matches the reference") {
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    loom::shape sh = e.resolve({.ranks = 3, .microbatches = 6});
    if (!e.check(sh).empty()) continue;
    CAPTURE(e.name);
    loom::schedule s = e.make(sh);
    auto m = spec_for(s.stages);
    std::vector<rank_report> rep(3);
    std::mutex mu;
    std::vector<std::vector<double>> params(static_cast<std::size_t>(m.layers()));
    on_threads(3, std::chrono::milliseconds(5000), [&](int r, loom::threads::comm& c) {
      std::vector<double> targets;
      loom::pipeline p(s, c, [&](loom::stage_id id) {
        auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
        return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
      }, {.deterministic = true});
      for (auto& st : p.stages()) st.fail_on = r == 1 ? 2 : -1;  // every stage of rank 1, microbatch 2
      auto data = quickstart::make_batch(m, sh.microbatches, 0);
      targets = data.targets;
      auto t0 = clock_type::now();
      try {
        p.step(data.inputs);
      } catch (const loom::pipeline_error& err) {
        rep[static_cast<std::size_t>(r)].error = err.what();
        rep[static_cast<std::size_t>(r)].error_rank = err.rank();
      }
      rep[static_cast<std::size_t>(r)].seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
      for (auto& st : p.stages()) st.fail_on = -1;
      auto res = p.step(data.inputs);  // the retry: same data, weights must be the initial ones
      rep[static_cast<std::size_t>(r)].losses.push_back(res.loss);
      std::lock_guard lk(mu);
      for (auto& st : p.stages())
        for (int l = st.first_layer(); l < st.last_layer(); ++l) {
          auto w = st.layer_params(l);
          params[static_cast<std::size_t>(l)].assign(w.begin(), w.end());
        }
    });
    auto want = run_reference(m, sh.microbatches, 1, loom::loss_scaling::mean);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      auto const& x = rep[static_cast<std::size_t>(r)];
      CHECK(x.error_rank == 1);
      CHECK(x.error.find("rank 1") != std::string::npos);
      CHECK(x.error.find("injected failure") != std::string::npos);
      CHECK(x.error.find("microbatch 2") != std::string::npos);
      CHECK(x.seconds < 3.0);
      REQUIRE(x.losses.size() == 1);
      CHECK(std::memcmp(&x.losses[0], &want.losses[0], sizeof(double)) == 0);
    }
    for (std::size_t l = 0; l < params.size(); ++l) CHECK(same_bits(params[l], want.params[l]));
  }
}

TEST_CASE("a batch of the wrong size on the first rank fails the step on every rank naming that rank") {
  loom::schedule s = loom::generate(loom::one_f_one_b{}, {.ranks = 3, .microbatches = 4});
  auto m = spec_for(s.stages);
  std::vector<rank_report> rep(3);
  on_threads(3, std::chrono::milliseconds(5000), [&](int r, loom::threads::comm& c) {
    std::vector<double> targets;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
    });
    auto data = quickstart::make_batch(m, 4, 0);
    targets = data.targets;
    try {
      p.step(std::span<const double>(data.inputs).first(data.inputs.size() - 1));
    } catch (const loom::pipeline_error& err) {
      rep[static_cast<std::size_t>(r)].error = err.what();
      rep[static_cast<std::size_t>(r)].error_rank = err.rank();
    }
    rep[static_cast<std::size_t>(r)].losses.push_back(p.step(data.inputs).loss);
  });
  auto want = run_reference(m, 4, 1, loom::loss_scaling::mean);
  for (auto const& x : rep) {
    CHECK(x.error_rank == 0);
    CHECK(x.error.find("wrong buffer size") != std::string::npos);
    CHECK(std::abs(x.losses.at(0) - want.losses[0]) <= 1e-12 * want.losses[0]);
  }
}

TEST_CASE("stages whose boundary sizes disagree fail the handshake on every rank") {
  loom::schedule s = loom::generate(loom::gpipe{}, {.ranks = 2, .microbatches = 2});
  auto m = spec_for(2);
  auto other = m;
  other.widths[static_cast<std::size_t>(m.layers() / 2)] += 1;  // rank 1's view of the cut differs
  std::vector<rank_report> rep(2);
  on_threads(2, std::chrono::milliseconds(5000), [&](int r, loom::threads::comm& c) {
    std::vector<double> targets;
    auto const& mine = r == 0 ? m : other;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(mine, id.stage, 2);
      return quickstart::mlp_stage(mine, a, b, id.stage == 1, &targets);
    });
    auto data = quickstart::make_batch(mine, 2, 0);
    targets = data.targets;
    try {
      p.step(data.inputs);
    } catch (const loom::pipeline_error& err) {
      rep[static_cast<std::size_t>(r)].error = err.what();
      rep[static_cast<std::size_t>(r)].error_rank = err.rank();
    }
  });
  for (auto const& x : rep) {
    CHECK(x.error_rank == 1);
    CHECK(x.error.find("wrong buffer size: stage 1 (rank 1)") != std::string::npos);
  }
}

TEST_CASE("the two copies of a stage with different weight-gradient sizes fail the handshake on every rank") {
  // Chimera on 2 ranks: stage 0 of direction 0 is on rank 0, its copy (direction 1) on rank 1.
  loom::schedule s = loom::generate(loom::chimera{}, {.ranks = 2, .microbatches = 2});
  REQUIRE(s.directions == 2);
  REQUIRE(s.stage_to_rank[0] != s.stage_to_rank[static_cast<std::size_t>(s.stages)]);
  auto m = spec_for(s.stages);
  std::vector<rank_report> rep(2);
  on_threads(2, std::chrono::milliseconds(5000), [&](int r, loom::threads::comm& c) {
    std::vector<double> targets;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      auto st = quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
      return grad_padded{st, id.direction == 1 && id.stage == 0 ? 1u : 0u};
    });
    auto data = quickstart::make_batch(m, 2, 0);
    targets = data.targets;
    try {
      p.step(data.inputs);
    } catch (const loom::pipeline_error& err) {
      rep[static_cast<std::size_t>(r)].error = err.what();
      rep[static_cast<std::size_t>(r)].error_rank = err.rank();
    }
  });
  const int r1 = s.stage_to_rank[static_cast<std::size_t>(s.stages)];
  for (auto const& x : rep) {
    CAPTURE(x.error);
    CHECK(x.error_rank == r1);
    CHECK(x.error.find("the two copies of stage 0 hold weight gradients") != std::string::npos);
  }
}

TEST_CASE("ranks holding different schedules fail before the first step with a mismatch error on every rank") {
  loom::schedule a = loom::generate(loom::gpipe{}, {.ranks = 3, .microbatches = 4});
  loom::schedule b = loom::generate(loom::one_f_one_b{}, {.ranks = 3, .microbatches = 4});
  auto m = spec_for(3);
  std::vector<rank_report> rep(3);
  on_threads(3, std::chrono::milliseconds(5000), [&](int r, loom::threads::comm& c) {
    std::vector<double> targets;
    auto const& s = r == 2 ? b : a;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [lo, hi] = quickstart::stage_layers(m, id.stage, 3);
      return quickstart::mlp_stage(m, lo, hi, id.stage == 2, &targets);
    });
    auto data = quickstart::make_batch(m, 4, 0);
    targets = data.targets;
    auto t0 = clock_type::now();
    try {
      p.step(data.inputs);
    } catch (const loom::pipeline_error& err) {
      rep[static_cast<std::size_t>(r)].error = err.what();
      rep[static_cast<std::size_t>(r)].error_rank = err.rank();
    }
    rep[static_cast<std::size_t>(r)].seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  });
  for (auto const& x : rep) {
    CHECK(x.error_rank == 2);
    CHECK(x.error.find("schedule mismatch") != std::string::npos);
    CHECK(x.error.find("rank 0 holds gpipe") != std::string::npos);
    CHECK(x.error.find("rank 2 holds 1f1b") != std::string::npos);
    CHECK(x.seconds < 3.0);
  }
}

TEST_CASE("a rank that leaves mid-step ends the step on the others within the communicator timeout") {
  loom::schedule s = loom::generate(loom::one_f_one_b{}, {.ranks = 3, .microbatches = 6});
  auto m = spec_for(3);
  std::vector<rank_report> rep(3);
  on_threads(3, std::chrono::milliseconds(400), [&](int r, loom::threads::comm& c) {
    std::vector<double> targets;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [lo, hi] = quickstart::stage_layers(m, id.stage, 3);
      return quickstart::mlp_stage(m, lo, hi, id.stage == 2, &targets);
    });
    auto data = quickstart::make_batch(m, 6, 0);
    targets = data.targets;
    p.step(data.inputs);  // one good step: the handshake is behind us
    if (r == 1) return;   // rank 1 leaves before the second step
    auto t0 = clock_type::now();
    try {
      p.step(data.inputs);
    } catch (const loom::pipeline_error& err) {
      rep[static_cast<std::size_t>(r)].error = err.what();
      rep[static_cast<std::size_t>(r)].error_rank = err.rank();
    }
    rep[static_cast<std::size_t>(r)].seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  });
  for (int r : {0, 2}) {
    auto const& x = rep[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CAPTURE(x.error);
    CHECK(x.error.find("communication failed") != std::string::npos);
    CHECK(x.error.find("timed out") != std::string::npos);
    CHECK(x.seconds < 3.0);
  }
}
