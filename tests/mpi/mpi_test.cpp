// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The communicator test bodies (tests/comm/comm_suite.hpp) on the MPI backend. Every process
// runs this program under mpiexec; each test case runs the body collectively on a new world.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <vector>
#include <string>

#include "../comm/comm_suite.hpp"
#include "../comm/nonblocking_suite.hpp"
#include "../mesh/dsp_suite.hpp"
#include "../mesh/tensor_grid_suite.hpp"
#include "../mesh/token_ring_suite.hpp"
#include "loom/comm/mpi.hpp"

namespace {

template <class Body>
void run_suite(Body body) {
  try {
    loom::run_mpi(body, std::chrono::seconds(30));
  } catch (const std::exception& e) {
    FAIL(std::string(e.what()));
  }
}

}  // namespace

static_assert(loom::communicator<loom::mpi::comm>);

TEST_CASE("mpi: sends and receives are matched per peer in FIFO order whatever the posting order") {
  run_suite([](auto& c) { comm_suite::fifo_per_peer(c); });
}

TEST_CASE("mpi: test() polls a receive to completion") {
  run_suite([](auto& c) { comm_suite::test_polls_to_completion(c); });
}

TEST_CASE("mpi: a receive whose size differs from the matching send fails naming the sizes") {
  run_suite([](auto& c) { comm_suite::size_mismatch_fails_the_receive(c); });
}

TEST_CASE("mpi: every collective is exact for every reduction, size and element type") {
  run_suite([](auto& c) { comm_suite::collectives_exact(c); });
}

TEST_CASE("mpi: broadcast and reduce are exact from every root, and refuse a root outside the group by name") {
  static_assert(loom::rooted_communicator<loom::mpi::comm>);
  run_suite([](auto& c) { comm_suite::rooted_collectives_exact(c); });
}

TEST_CASE("mpi: split forms sub-groups ordered by key that work beside their parent") {
  run_suite([](auto& c) { comm_suite::split_forms_subgroups(c); });
}

TEST_CASE("mpi: non-blocking collectives are exact, in flight together and beside a blocking one") {
  run_suite([](auto& c) { comm_suite::nonblocking_exact(c); });
}

TEST_CASE("mpi: ordered sums equal the rank-order sum bit for bit") {
  static_assert(loom::nonblocking_communicator<loom::mpi::comm> && !loom::reduces_in_rank_order<loom::mpi::comm>);
  run_suite([](auto& c) { comm_suite::ordered_sums_are_rank_order(c); });
}

TEST_CASE("mpi: the tensor grids' SUMMA and 3D layers and layer norm equal the single-rank reference (bitwise when deterministic) with the documented volume") {
  // The grids that fit the world: 2 and 3 processes run 1 x 1 grids beside data parallelism, 4 a
  // 2 x 2 grid, 8 two 2 x 2 grids over dp and a 2.5D grid of depth 2, 9 a 3 x 3 grid (where the
  // deterministic mode's rank-ordered reduce is the sends to the root, counted as sends).
  run_suite([](auto& c) {
    using grid_suite::grid_case;
    std::vector<grid_case> cases;
    switch (c.size()) {
      case 4: cases = {grid_case{1, loom::tp_kind::d2, 4, 0}}; break;
      case 8: cases = {grid_case{2, loom::tp_kind::d2, 4, 0}, grid_case{1, loom::tp_kind::d2_5, 8, 2}}; break;
      case 9: cases = {grid_case{1, loom::tp_kind::d2, 9, 0}}; break;
      default: cases = {grid_case{c.size(), loom::tp_kind::d2, 1, 0}}; break;
    }
    for (const grid_case& g : cases)
      for (bool ordered : {true, false}) {
        const bool count = !ordered || loom::make_tp_grid(g.kind, g.tp, g.depth).q <= 2;
        grid_suite::summa_matches_reference(c, g, ordered, count);
        grid_suite::norm_matches_reference(c, g, false, ordered, count);
      }
    // The 3D layers and the norm on their two layouts: a 2 x 2 x 2 cube on 8 processes, 1 x 1 x 1
    // cubes beside data parallelism on 2 and 3.
    if (c.size() == 8 || c.size() < 4)
      for (bool ordered : {true, false}) {
        grid_suite::cube_matches_reference(c, c.size() == 8 ? 1 : c.size(), c.size() == 8 ? 8 : 1, ordered, true);
        for (bool odd : {false, true})
          grid_suite::norm_matches_reference(c, grid_case{c.size() == 8 ? 1 : c.size(), loom::tp_kind::d3, c.size() == 8 ? 8 : 1, 0},
                                             odd, ordered, true);
      }
  });
}

TEST_CASE("mpi: TokenRing keeps K and V home and equals its single-rank order, its backward ring attention's, bitwise") {
  run_suite([](auto& c) {
    for (bool causal : {true, false}) token_ring_suite::matches_reference(c, causal);
  });
}

TEST_CASE("mpi: DSP's switch equals one rank bitwise on a spatial-temporal block pair and moves half of Ulysses' volume") {
  run_suite([](auto& c) {
    if (4 % c.size() != 0) return;  // the pair's 8 x 12 tokens and 4 heads split over 1, 2 or 4 ranks
    for (bool causal : {false, true}) {
      const auto v = dsp_suite::matches_one_rank(c, causal);
      if (v.dsp * 2 != v.ulysses || v.ulysses != (c.size() > 1 ? 4 * v.shard_bytes : 0))
        throw dsp_suite::failure("rank " + std::to_string(c.rank()) + ": DSP counted " + std::to_string(v.dsp) + " bytes, Ulysses " +
                                 std::to_string(v.ulysses));
    }
  });
}

// The failure cases leave a dead world behind; ctest runs each in its own mpiexec.
TEST_CASE("mpi fault: an abort ends every rank's pending call with an error naming the aborting rank") {
  run_suite([](auto& c) { comm_suite::abort_reaches_every_rank(c, c.size() - 1); });
}

TEST_CASE("mpi fault: a timeout ends the waiting rank and, through the abort it raises, every other rank") {
  run_suite([](auto& c) { comm_suite::timeout_ends_every_rank(c, 0); });
}

int main(int argc, char** argv) {
  loom::mpi::environment env(argc, argv);
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  return rc;
}
