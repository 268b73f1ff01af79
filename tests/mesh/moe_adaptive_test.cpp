// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Tutel's adaptive parallelism (loom::ep_adaptive, issue 26) on threads: E FFN experts over W > E
// expert-parallel ranks, each holding one hidden slice of one expert; every valid degree r gives
// the outputs, input and router gradients, dropped pairs and slice gradients of one process
// holding every expert whole (1e-12 relative: the r partial sums reassociate the hidden sum);
// the counted volume equals ep_adaptive_volume; ep_adaptive_choose picks the least of them.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/comm/threads.hpp"
#include "loom/exec/moe.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "moe_adaptive_support.hpp"

using namespace moe_adaptive_test;

TEST_CASE("moe, adaptive r: every valid degree gives the reference's outputs and gradients, and the counted volume is ep_adaptive_volume") {
  int cases = 0;
  for (auto [W, E] : {std::pair{4, 1}, std::pair{4, 2}, std::pair{6, 2}, std::pair{8, 2}})
    for (int k : {1, 2})
      for (double f : {0.0, 1.0}) {
        if (k > E) continue;
        const ffn_problem p = make_ffn(W, E, k, f, static_cast<std::uint64_t>(W * 100 + E * 10 + k) + static_cast<std::uint64_t>(f * 3));
        const auto want = reference(p);
        const std::size_t slice = p.H / static_cast<std::size_t>(p.S()) * p.h;
        for (int r : loom::ep_adaptive_degrees(E, W)) {
          INFO("W=" << W << " E=" << E << " k=" << k << " f=" << f << " r=" << r);
          std::vector<result> got(static_cast<std::size_t>(W));
          loom::run_threads(W, [&](loom::threads::comm& world) {
            loom::counted<loom::threads::comm> comm(world.split(0, world.rank()));
            got[static_cast<std::size_t>(comm.rank())] = adaptive_run(p, comm, r);
          });
          std::size_t dropped = 0;
          for (int w = 0; w < W; ++w) {
            const result& a = got[static_cast<std::size_t>(w)];
            const result& b = want[static_cast<std::size_t>(w)];
            CAPTURE(w);
            CHECK(a.capacity == b.capacity);
            CHECK(a.dropped == b.dropped);
            CHECK(far(a.y, b.y) == 0);
            CHECK(far(a.dx, b.dx) == 0);
            CHECK(far(a.dwg, b.dwg) == 0);
            const std::size_t at = static_cast<std::size_t>(w / p.S()) * p.H * p.h + static_cast<std::size_t>(w % p.S()) * slice;
            CHECK(far(a.dw1, vec(want[0].dw1.begin() + static_cast<std::ptrdiff_t>(at), want[0].dw1.begin() + static_cast<std::ptrdiff_t>(at + slice))) == 0);
            CHECK(far(a.dw2, vec(want[0].dw2.begin() + static_cast<std::ptrdiff_t>(at), want[0].dw2.begin() + static_cast<std::ptrdiff_t>(at + slice))) == 0);
            const double formula =
                loom::ep_adaptive_volume({W, E, r}, static_cast<std::size_t>(a.capacity), p.h, p.params_per_expert());
            CHECK(std::abs(a.volume - formula) <= 1e-9 * formula);
            CHECK(a.all_to_alls == (r == 0 ? 0u : 4u));
            dropped += a.dropped.size();
          }
          if (f == 0.0) CHECK(dropped == 0);
          ++cases;
        }
      }
  CHECK(cases == 48);
}

TEST_CASE("moe, adaptive r: the hierarchical all-to-all (2 nodes x 4, 4 x 2) gives the flat one's results bit for bit at every degree") {
  int cases = 0;
  for (auto [nodes, per_node] : {std::pair{2, 4}, std::pair{4, 2}})
    for (int k : {1, 2}) {
      const int W = nodes * per_node, E = 2;
      const ffn_problem p = make_ffn(W, E, k, 1.0, static_cast<std::uint64_t>(900 + nodes * 10 + k));
      for (int r : loom::ep_adaptive_degrees(E, W)) {
        INFO("nodes=" << nodes << " per_node=" << per_node << " k=" << k << " r=" << r);
        std::vector<result> flat(static_cast<std::size_t>(W)), hier(flat);
        std::vector<loom::comm_counters> node_counts(static_cast<std::size_t>(W)), cross_counts(node_counts);
        loom::run_threads(W, [&](loom::threads::comm& world) {
          const auto u = static_cast<std::size_t>(world.rank());
          loom::counted<loom::threads::comm> comm(world.split(0, world.rank()));
          flat[u] = adaptive_run(p, comm, r);
          const int w = world.rank(), L = per_node;
          loom::counted<loom::threads::comm> node(world.split(w / L, w % L)), cross(world.split(w % L, w / L));
          hier[u] = adaptive_run(p, comm, r, &node, &cross);
          node_counts[u] = node.counters();
          cross_counts[u] = cross.counters();
        });
        for (std::size_t u = 0; u < flat.size(); ++u) {
          CAPTURE(u);
          CHECK(hier[u].y == flat[u].y);
          CHECK(hier[u].dx == flat[u].dx);
          CHECK(hier[u].dwg == flat[u].dwg);
          CHECK(hier[u].dw1 == flat[u].dw1);
          CHECK(hier[u].dw2 == flat[u].dw2);
          CHECK(hier[u].dropped == flat[u].dropped);
          // r >= 1: the four exchanges on the node and across nodes, none on the flat group.
          CHECK(hier[u].all_to_alls == 0u);
          CHECK(node_counts[u][loom::comm_op::all_to_all].calls == (r == 0 ? 0u : 4u));
          CHECK(cross_counts[u][loom::comm_op::all_to_all].calls == (r == 0 ? 0u : 4u));
        }
        ++cases;
      }
    }
  CHECK(cases == 16);
}

TEST_CASE("moe, adaptive r: the rule takes the degree with the least volume, ties to the larger r, and follows Tutel's regimes") {
  // Large experts against few tokens: no gather at all (r = S, Tutel's model parallelism).
  CHECK(loom::ep_adaptive_choose(2, 8, 16, 1024, 2 * 4096 * 1024) == 4);
  // Small experts against many tokens: gather every expert, no all-to-all (r = 0).
  CHECK(loom::ep_adaptive_choose(2, 8, 4096, 1024, 2 * 64 * 1024) == 0);
  // In between, for every shape: the least volume, ties to the larger r.
  for (int W : {4, 6, 8, 12})
    for (int E : {1, 2, 3})
      for (std::size_t C : {std::size_t{8}, std::size_t{64}, std::size_t{512}})
        for (std::size_t P : {std::size_t{1} << 10, std::size_t{1} << 16, std::size_t{1} << 22}) {
          if (W % E != 0) continue;
          const int chosen = loom::ep_adaptive_choose(E, W, C, 256, P);
          const double v = loom::ep_adaptive_volume({W, E, chosen}, C, 256, P);
          for (int r : loom::ep_adaptive_degrees(E, W)) {
            const double u = loom::ep_adaptive_volume({W, E, r}, C, 256, P);
            CHECK(v <= u);
            if (u == v) CHECK(chosen >= r);
          }
        }
}

TEST_CASE("moe, adaptive r: ranks not a multiple of the experts, a degree that does not divide S, a capacity that does not split, one line each") {
  CHECK(loom::ep_adaptive_rule({6, 4, 0}) == "moe: adaptive parallelism needs the 6 expert-parallel ranks to be a multiple of the 4 experts");
  CHECK(loom::ep_adaptive_rule({8, 2, 3}) == "moe: the adaptive degree r must be 0 or a divisor of the 4 ranks per expert (got 3)");
  CHECK(loom::ep_adaptive_rule({8, 2, 2}).empty());
  CHECK(loom::ep_adaptive_degrees(2, 8) == std::vector<int>{0, 1, 2, 4});
  loom::run_threads(4, [&](loom::threads::comm& world) {
    loom::ep_group<loom::threads::comm> g{&world};
    vec a(2 * 3 * 4), b(4 * a.size()), c(a.size());
    CHECK_THROWS_WITH_AS(loom::ep_adaptive_to_experts(g, {4, 2, 1}, 3, 4, std::span<const double>(a), std::span<double>(b), std::span<double>(c)),
                         "moe: the capacity 3 does not split over the 2 ranks of a gather group (route with alignment 2)", loom::config_error);
    CHECK_THROWS_WITH_AS(loom::ep_adaptive_to_experts(g, {8, 2, 1}, 4, 4, std::span<const double>(a), std::span<double>(b), std::span<double>(c)),
                         "moe: adaptive parallelism over 8 ranks on an expert-parallel group of 4", loom::config_error);
  });
}
