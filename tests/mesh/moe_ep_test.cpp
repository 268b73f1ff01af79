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
#include "moe_support.hpp"

using namespace moe_test;

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
