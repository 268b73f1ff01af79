// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Expert parallelism on the threads backend (loom/exec/moe.hpp): E experts split over ep ranks,
// each rank routing its own tokens, dispatch and combine as all-to-alls, forward and backward,
// against one process that holds every expert and routes each rank's tokens the same way:
// outputs, input gradients, router and expert gradients and the dropped pairs equal bit for
// bit; the all-to-all bytes equal the documented 4 E C h per rank and layer. The same runs on
// MPI processes are tests/mesh_mpi's `moe` mode.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "loom/comm/threads.hpp"
#include "../../examples/03_mesh/moe_layer.hpp"

using namespace mesh_example::moe;

TEST_CASE("moe, expert parallel: ep ranks with their own tokens equal one process holding every expert, bit for bit, and move 4 E C h per rank") {
  int cases = 0;
  for (int ep : {1, 2, 4})
    for (int E : {4, 8})
      for (int k : {1, 2})
        for (double f : {0.0, 0.5, 1.25}) {
          CAPTURE(ep);
          CAPTURE(E);
          CAPTURE(k);
          CAPTURE(f);
          const problem p = make(E, ep, k, f, static_cast<std::uint64_t>(ep * 1000 + E * 100 + k * 10) + static_cast<std::uint64_t>(f * 4));
          const std::vector<rank_result> want = reference(p);
          std::vector<rank_result> got(static_cast<std::size_t>(ep));
          std::vector<loom::comm_counters> counts(static_cast<std::size_t>(ep));
          loom::run_threads(ep, [&](loom::threads::comm& world) {
            loom::counted<loom::threads::comm> comm(world.split(0, world.rank()));
            const auto r = static_cast<std::size_t>(comm.rank());
            got[r] = ep_run(p, comm, counts[r]);
          });
          std::size_t dropped = 0;
          for (int r = 0; r < ep; ++r) {
            CAPTURE(r);
            const auto d = differences(p, r, ep, got[static_cast<std::size_t>(r)], want[static_cast<std::size_t>(r)], counts[static_cast<std::size_t>(r)]);
            CHECK_MESSAGE(d.empty(), (d.empty() ? std::string() : d.front()));
            dropped += got[static_cast<std::size_t>(r)].dropped.size();
          }
          if (f == 0.5) CHECK(dropped > 0);
          if (f == 0.0) CHECK(dropped == 0);
          ++cases;
        }
  CHECK(cases == 36);
}

TEST_CASE("moe, expert parallel: experts that do not split over the group are refused in one line") {
  CHECK(loom::ep_rule(6, 4) == "moe: 6 experts do not split evenly over 4 expert-parallel ranks");
  CHECK(loom::ep_rule(8, 4).empty());
  loom::run_threads(4, [&](loom::threads::comm& world) {
    loom::ep_group<loom::threads::comm> g{&world};
    vec a(6 * 2), b(a.size()), c(a.size());
    CHECK_THROWS_WITH_AS(loom::ep_to_experts(g, 6, std::span<const double>(a), std::span<double>(b), std::span<double>(c)),
                         "moe: 6 experts do not split evenly over 4 expert-parallel ranks", loom::config_error);
  });
}

TEST_CASE("moe, Pipeline MoE: experts over a tensor-parallel group of 1, 2 and 4 equal one rank holding every expert, with one all-reduce forward") {
  int cases = 0;
  for (int tp : {1, 2, 4})
    for (int E : {4, 8})
      for (int k : {1, 2})
        for (double f : {0.0, 0.5, 1.25}) {
          CAPTURE(tp);
          CAPTURE(E);
          CAPTURE(k);
          CAPTURE(f);
          const problem p = make(E, 1, k, f, static_cast<std::uint64_t>(tp * 1000 + E * 100 + k * 10 + 5) + static_cast<std::uint64_t>(f * 4));
          const rank_result want = reference(p)[0];
          std::vector<rank_result> got(static_cast<std::size_t>(tp));
          std::vector<loom::comm_counters> counts(static_cast<std::size_t>(tp));
          loom::run_threads(tp, [&](loom::threads::comm& world) {
            loom::counted<loom::threads::comm> comm(world.split(0, world.rank()));
            const auto r = static_cast<std::size_t>(comm.rank());
            got[r] = tp_run(p, comm, counts[r]);
          });
          for (int r = 0; r < tp; ++r) {
            CAPTURE(r);
            const auto& a = got[static_cast<std::size_t>(r)];
            const auto d = result_differences(p, r, tp, a, want);
            CHECK_MESSAGE(d.empty(), (d.empty() ? std::string() : d.front()));
            const auto& c = counts[static_cast<std::size_t>(r)];
            CHECK(c[loom::comm_op::all_to_all].calls == 0);
            // Forward: one all-reduce of n h; backward: n h (the input gradient) and n k (the gates).
            CHECK(c[loom::comm_op::all_reduce].calls == (tp > 1 ? 3u : 0u));
            CHECK(c[loom::comm_op::all_reduce].bytes == (tp > 1 ? (2 * p.n * p.h + p.n * static_cast<std::size_t>(k)) * sizeof(double) : 0u));
          }
          ++cases;
        }
  CHECK(cases == 36);
}

TEST_CASE("moe, expert parallel: the hierarchical all-to-all (2 nodes x 2, 2 x 4, 4 x 2) gives the flat one's results bit for bit") {
  struct shape {
    int nodes, per_node;
  };
  int cases = 0;
  for (shape sh : {shape{2, 2}, shape{2, 4}, shape{4, 2}})
    for (int k : {1, 2})
      for (double f : {0.0, 0.5}) {
        const int ep = sh.nodes * sh.per_node, E = 8;
        CAPTURE(sh.nodes);
        CAPTURE(sh.per_node);
        CAPTURE(k);
        CAPTURE(f);
        const problem p = make(E, ep, k, f, static_cast<std::uint64_t>(ep * 1000 + k * 10 + 3) + static_cast<std::uint64_t>(f * 4));
        const std::vector<rank_result> want = reference(p);
        std::vector<rank_result> got(static_cast<std::size_t>(ep));
        std::vector<loom::comm_counters> counts(static_cast<std::size_t>(ep)), node_counts(counts), cross_counts(counts);
        loom::run_threads(ep, [&](loom::threads::comm& world) {
          loom::counted<loom::threads::comm> comm(world.split(0, world.rank()));
          const int r = comm.rank(), L = sh.per_node;
          loom::counted<loom::threads::comm> node(world.split(r / L, r % L)), cross(world.split(r % L, r / L));
          const auto u = static_cast<std::size_t>(r);
          node.reset_counters();
          cross.reset_counters();
          got[u] = ep_run(p, comm, counts[u], &node, &cross);
          node_counts[u] = node.counters();
          cross_counts[u] = cross.counters();
        });
        for (int r = 0; r < ep; ++r) {
          CAPTURE(r);
          const auto u = static_cast<std::size_t>(r);
          const auto& a = got[u];
          const auto d = result_differences(p, r, ep, a, want[u]);
          CHECK_MESSAGE(d.empty(), (d.empty() ? std::string() : d.front()));
          // No flat all-to-all: four on the node and four across nodes, each of the whole E C h buffer.
          CHECK(counts[u][loom::comm_op::all_to_all].calls == 0);
          const std::uint64_t bytes = 4 * static_cast<std::uint64_t>(E) * static_cast<std::uint64_t>(a.capacity) * p.h * sizeof(double);
          CHECK(node_counts[u][loom::comm_op::all_to_all].calls == 4);
          CHECK(node_counts[u][loom::comm_op::all_to_all].bytes == bytes);
          CHECK(cross_counts[u][loom::comm_op::all_to_all].calls == 4);
          CHECK(cross_counts[u][loom::comm_op::all_to_all].bytes == bytes);
        }
        ++cases;
      }
  CHECK(cases == 12);
}

TEST_CASE("moe, expert parallel: FSMoE-style overlap in 1, 2, 3 and 5 chunks of non-blocking all-to-alls gives the unchunked results bit for bit") {
  int cases = 0;
  for (int ep : {1, 2, 4})
    for (int chunks : {1, 2, 3, 5})
      for (double f : {0.0, 1.25}) {
        const int E = 8, k = 2;
        CAPTURE(ep);
        CAPTURE(chunks);
        CAPTURE(f);
        const problem p = make(E, ep, k, f, static_cast<std::uint64_t>(ep * 1000 + chunks * 10 + 7) + static_cast<std::uint64_t>(f * 4));
        const std::vector<rank_result> want = reference(p);
        std::vector<rank_result> got(static_cast<std::size_t>(ep));
        std::vector<loom::comm_counters> counts(static_cast<std::size_t>(ep));
        loom::run_threads(ep, [&](loom::threads::comm& world) {
          loom::counted<loom::threads::comm> comm(world.split(0, world.rank()));
          const auto r = static_cast<std::size_t>(comm.rank());
          got[r] = ep_run_overlapped(p, comm, counts[r], chunks);
        });
        for (int r = 0; r < ep; ++r) {
          CAPTURE(r);
          const auto u = static_cast<std::size_t>(r);
          const auto& a = got[u];
          const auto d = result_differences(p, r, ep, a, want[u]);
          CHECK_MESSAGE(d.empty(), (d.empty() ? std::string() : d.front()));
          if (ep > 1) {
            // Two all-to-alls per piece each way, the pieces together the whole E C h buffer.
            const auto n = static_cast<std::uint64_t>(std::min<long long>(chunks, a.capacity));
            CHECK(counts[u][loom::comm_op::all_to_all].calls == 4 * n);
            CHECK(counts[u][loom::comm_op::all_to_all].bytes == 4 * static_cast<std::uint64_t>(E) * static_cast<std::uint64_t>(a.capacity) * p.h * sizeof(double));
          }
        }
        ++cases;
      }
  CHECK(cases == 24);
  std::vector<double> none;
  loom::ep_group<loom::threads::comm> alone{};
  CHECK_THROWS_WITH_AS(loom::ep_overlapped(alone, 4, 2, 1, 0, std::span<const double>(none), std::span<double>(none), std::span<double>(none),
                                           std::span<double>(none), std::span<double>(none), [](int, std::span<const double>, std::span<double>, std::size_t) {}),
                       "moe: the overlap needs >= 1 chunk (got 0)", loom::config_error);
  // The overlap is flat: a hierarchical group is refused, not run flat in silence.
  loom::run_threads(2, [&](loom::threads::comm& world) {
    loom::threads::comm node(world.split(world.rank(), 0)), cross(world.split(0, world.rank()));
    loom::ep_group<loom::threads::comm> two{&world, &node, &cross};
    CHECK_THROWS_WITH_AS(loom::ep_overlapped(two, 4, 2, 1, 2, std::span<const double>(none), std::span<double>(none), std::span<double>(none),
                                             std::span<double>(none), std::span<double>(none), [](int, std::span<const double>, std::span<double>, std::size_t) {}),
                         doctest::Contains("moe: the overlapped exchange is flat"), loom::config_error);
  });
}
