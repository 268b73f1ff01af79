// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// ep as a mesh dimension (issue 26), on threads: a pipeline of linear stages ending in an MoE layer,
// trained by loom::data_parallel over dp x pp x ep, equals the single-process reference holding
// every expert (examples/03_mesh/moe_model.hpp). Dense weights are reduced over dp x ep, experts
// over dp alone; bitwise in deterministic mode (the reference adds in the mesh's documented
// order), within 1e-12 otherwise; several pipeline families, ZeRO and local SGD too. Every step's
// all-to-all bytes on ep equal 4 E h sum_j C_j x 8 bytes on every rank; the last step's MoE outputs,
// dropped pairs and auxiliary losses equal the reference's. tp inside: the tokens split
// over tp before the router, or Pipeline MoE's layout (the experts over tp).

#include <doctest/doctest.h>

#include <mutex>
#include <utility>
#include <vector>

#include "loom/comm/threads.hpp"
#include "../../examples/03_mesh/moe_model.hpp"

namespace {

using namespace mesh_example::moe;

//! Trains `s` with `family` on threads; every rank's result.
std::vector<mesh_rank_result> train(const mesh_setup& s, const char* family) {
  const auto& entry = loom::default_registry().at(family);
  loom::shape sh = entry.resolve({s.pp, s.pp == 1 ? 1 : 2 * s.pp, 0});
  const std::string rule = entry.check(sh);
  REQUIRE_MESSAGE(rule.empty(), rule);
  const loom::schedule sched = entry.make(sh);
  std::vector<std::vector<rank_result>> last;
  const auto want = mesh_reference(s, sched.stages, sched.microbatches, &last);
  const int world = s.dp * s.pp * s.ep * s.tp;
  std::vector<mesh_rank_result> out(static_cast<std::size_t>(world));
  std::mutex mu;
  loom::run_threads(world, [&](loom::threads::comm& c) {
    auto r = mesh_train_rank(c, s, sched, want, &last);
    std::lock_guard lk(mu);
    out[static_cast<std::size_t>(c.rank())] = std::move(r);
  });
  long long forwards = 0, compared = 0;  // every microbatch of every (dp, ep) rank through one MoE stage, every step
  for (const auto& r : out) {
    forwards += r.moe_microbatches;
    compared += r.forwards_compared;
  }
  CHECK(compared == forwards / s.steps);  // the last step's, each once
  CHECK(forwards == static_cast<long long>(s.dp) * s.ep * s.tp * s.steps * sched.microbatches);  // each tp rank its token rows
  return out;
}

//! Every rank's weights equal the reference's, and moved.
void check(const mesh_setup& s, const char* family = "1f1b") {
  INFO(describe(s) << " " << family);
  const auto results = train(s, family);
  for (std::size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r);
    CHECK(results[r].compared > 0);
    CHECK(results[r].differing == 0);
    CHECK(results[r].moved > 0);  // a reducer that did nothing would not pass
    CHECK(results[r].volume_mismatches == 0);  // all-to-all bytes on ep = 4 E h sum_j C_j x 8 per step
    CHECK(results[r].forward_differing == 0);  // the last step's outputs, dropped pairs, auxiliary losses
  }
}

}  // namespace

TEST_CASE("ep mesh: an MoE layer over dp x ep trains to the reference holding every expert, the router over dp x ep, the experts over dp") {
  int runs = 0;
  for (auto [dp, ep] : {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 1}, std::pair{2, 2}, std::pair{3, 2}})
    for (int k : {1, 2})
      for (double f : {0.0, 0.5})
        for (bool det : {true, false}) {
          check({.dp = dp, .ep = ep, .k = k, .f = f, .det = det});
          ++runs;
        }
  CHECK(runs == 40);
}

TEST_CASE("ep mesh: ep with pp over several families (1f1b, zb-h1, interleaved, zb-v, chimera, dualpipe) trains to the reference") {
  int runs = 0;
  for (const char* family : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "chimera", "dualpipe"})
    for (auto [dp, ep] : {std::pair{1, 2}, std::pair{2, 2}})
      for (bool det : {true, false}) {
        check({.dp = dp, .pp = 2, .ep = ep, .det = det}, family);
        ++runs;
      }
  CHECK(runs == 24);
}

TEST_CASE("ep mesh: the reducer's buckets name their groups: dense dp x ep, experts dp, and with one ep rank both dp") {
  for (auto [dp, ep] : {std::pair{2, 2}, std::pair{2, 1}}) {
    const auto results = train({.dp = dp, .ep = ep, .steps = 1}, "1f1b");
    const loom::dim_set dense = ep > 1 ? loom::dim::dp | loom::dim::ep : loom::dim_set{loom::dim::dp};
    for (const auto& r : results) {
      const auto& rep = r.buckets;
      if (ep == 1) {  // one group for both: one bucket
        REQUIRE(rep.size() == 1);
        CHECK(rep[0].group == dense);
        CHECK(rep[0].elements == 4 * 4 + 4 * 16);
        continue;
      }
      REQUIRE(rep.size() == 2);
      CHECK(rep[0].group == dense);
      CHECK(rep[0].elements == 4 * 4);  // the router: E x h
      CHECK(rep[1].group == loom::dim_set{loom::dim::dp});
      CHECK(rep[1].elements == static_cast<std::size_t>(4 / ep) * 16);  // E/ep experts of h x h
    }
  }
}

TEST_CASE("ep mesh: ZeRO stages 1 and 2 shard the dense weights over dp x ep and the experts over dp, with the unsharded bits") {
  for (int zero : {1, 2})
    for (bool det : {true, false}) {
      check({.dp = 2, .ep = 2, .det = det, .zero = zero});
      check({.dp = 2, .pp = 2, .ep = 2, .det = det, .zero = zero}, "zb-h1");
    }
}

TEST_CASE("ep mesh: local SGD reduces dense weights over ep every step, never the experts, and averages both over dp every H steps") {
  for (int H : {1, 2})
    for (auto [dp, ep] : {std::pair{2, 2}, std::pair{2, 1}}) {
      check({.dp = dp, .ep = ep, .steps = 3, .local_steps = H});
      check({.dp = dp, .pp = 2, .ep = ep, .steps = 3, .local_steps = H}, "interleaved-1f1b");
    }
}

TEST_CASE("ep mesh: ep with tp (the tokens split over tp before the router, column-parallel linear stages), with dp and pp, trains to the reference") {
  int runs = 0;
  for (const char* family : {"1f1b", "zb-h1", "dualpipe"})
    for (auto [dp, pp] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}})
      for (bool det : {true, false}) {
        if (pp == 1 && family != std::string("1f1b")) continue;
        check({.dp = dp, .pp = pp, .ep = 2, .det = det, .tp = 2}, family);
        ++runs;
      }
  CHECK(runs == 14);
  check({.dp = 2, .ep = 2, .det = true, .zero = 2, .tp = 2});
  check({.dp = 2, .ep = 2, .steps = 3, .det = true, .local_steps = 2, .tp = 2});
}

TEST_CASE("ep mesh: the MoE exchange overlapped with the experts (FSMoE, 2, 3 and 5 pieces) trains to the reference bit for bit, with 4 x pieces all-to-alls") {
  int runs = 0;
  for (int chunks : {2, 3, 5})
    for (const char* family : {"1f1b", "zb-h1", "dualpipe"}) {
      check({.dp = 2, .pp = 2, .ep = 2, .det = true, .chunks = chunks}, family);
      ++runs;
    }
  CHECK(runs == 9);
  check({.ep = 2, .f = 0.0, .det = false, .tp = 2, .chunks = 3});  // no dropping, with tp, 1e-12
  check({.dp = 2, .ep = 2, .det = true, .zero = 2, .chunks = 2});
}

TEST_CASE("ep mesh: Tutel's hierarchical exchange (nodes of 1, 2 and 4 ep ranks) trains to the reference bit for bit, with no flat all-to-all") {
  int runs = 0;
  for (const char* family : {"1f1b", "zb-h1", "dualpipe"}) {
    check({.pp = 2, .ep = 4, .det = true, .node_size = 2}, family);
    ++runs;
  }
  for (int L : {1, 4}) {
    check({.dp = 2, .ep = 4, .det = true, .node_size = L});
    ++runs;
  }
  check({.ep = 4, .f = 0.0, .det = false, .tp = 2, .node_size = 2});  // no dropping, with tp, 1e-12
  CHECK(runs == 5);
}

TEST_CASE("ep mesh: Tutel's adaptive degree r inside the stage (E < ep, a slice per rank), every valid r and r switched per step, trains to the reference within 1e-12") {
  int runs = 0;
  for (auto [ep, E] : {std::pair{4, 1}, std::pair{4, 2}})
    for (int k : {1, 2})
      for (double f : {0.0, 1.0}) {
        if (k > E) continue;
        for (int r : loom::ep_adaptive_degrees(E, ep)) {
          check({.ep = ep, .E = E, .k = k, .f = f, .det = true, .adaptive = {r}});
          ++runs;
        }
        check({.ep = ep, .E = E, .k = k, .steps = 3, .f = f, .det = true, .adaptive = loom::ep_adaptive_degrees(E, ep)});  // r switched per step
        ++runs;
      }
  CHECK(runs == 26);  // E = 1: top-1, r in {0, 1, 2, 4} and switched; E = 2: top-1 and top-2, r in {0, 1, 2} and switched; f in {0, 1}
  for (const char* family : {"1f1b", "zb-h1", "dualpipe"}) check({.dp = 2, .pp = 2, .ep = 4, .E = 2, .det = true, .adaptive = {2, 0, 1}}, family);
}

TEST_CASE("ep mesh: Pipeline MoE's layout (the experts over tp, every token on each tp rank) composes with dp and the pipeline families") {
  int runs = 0;
  for (const char* family : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "chimera", "dualpipe"})
    for (bool det : {true, false}) {
      check({.dp = 2, .pp = 2, .ep = 1, .det = det, .tp = 2, .pipeline_moe = true}, family);
      ++runs;
    }
  CHECK(runs == 12);
  check({.dp = 2, .ep = 1, .det = true, .zero = 2, .tp = 2, .pipeline_moe = true});
}
