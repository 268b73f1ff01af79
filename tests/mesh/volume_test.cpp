// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Communication volumes read from the counters equal the papers' formulas: tensor parallelism's
// all-reduces move as much as Megatron-SP's all-gathers plus reduce-scatters (Korthikanti et al.
// 2022, §4.2.2); Ulysses sends 4 N h / P per layer (Jacobs et al. 2023, §3.2); ring attention
// passes K/V P - 1 times (Liu et al. 2023); USP splits them (Fang and Zhao 2024, §3); ZeRO's
// reduce-scatter plus all-gather move one all-reduce's volume (Rajbhandari et al. 2020, §7).
// Counts are of the example's whole training step (4 blocks) and of single attention calls.

#include <doctest/doctest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/comm/threads.hpp"
#include "loom/exec/sequence_parallel.hpp"
#include "mesh_support.hpp"

namespace {

using namespace mesh_test;
using loom::comm_op;

constexpr int N = 16, h = 8, L = 4, M = 2;  // the example's default sequence, width, blocks; microbatches
constexpr double B = sizeof(double);

//! Counts of communicator `name` in step 1 on rank `r` (step 0 also holds the pipeline's handshake).
loom::comm_counters counts(const outcome& o, int r, const std::string& name) { return o.ranks[static_cast<std::size_t>(r)].counts(1, name); }

run_options opts(const sharding& s, bool zero = false) {
  return {.layout = s, .microbatches = M, .steps = 2, .deterministic = true, .zero = zero};
}

}  // namespace

TEST_CASE("volume: tensor parallelism's all-reduces and Megatron-SP's all-gathers and reduce-scatters move the same bytes") {
  for (int P : {2, 4}) {
    INFO("tp " << P);
    auto tp = run("1f1b", opts(layout(1, P, 1, 1)));
    auto sp = run("1f1b", opts(layout(1, P, 1, P, seq_kind::megatron)));
    REQUIRE(tp.differing() == 0);
    REQUIRE(sp.differing() == 0);
    for (int r = 0; r < P; ++r) {
      auto a = counts(tp, r, "tp"), b = counts(sp, r, "tp");
      // Per block and microbatch: 2 regions, each entered and left once forward and once backward.
      const double size = N * h * B;
      CHECK(a[comm_op::all_reduce].calls == 4u * L * M);
      CHECK(a[comm_op::all_reduce].bytes == static_cast<std::uint64_t>(4 * L * M * size));
      CHECK(a[comm_op::all_reduce].bus_bytes == doctest::Approx(4 * L * M * size * 2 * (P - 1) / P));
      CHECK(b[comm_op::all_reduce].calls == 0);
      CHECK(b[comm_op::all_gather].calls == 4u * L * M);
      CHECK(b[comm_op::reduce_scatter].calls == 4u * L * M);
      CHECK(b[comm_op::all_gather].bytes == static_cast<std::uint64_t>(4 * L * M * size));
      CHECK(b[comm_op::reduce_scatter].bytes == static_cast<std::uint64_t>(4 * L * M * size));
      CHECK(a[comm_op::all_reduce].bus_bytes == b[comm_op::all_gather].bus_bytes + b[comm_op::reduce_scatter].bus_bytes);
    }
  }
}

TEST_CASE("volume: Ulysses sends 4 N h / P per layer forward and the same backward") {
  for (int P : {2, 4}) {
    INFO("sp " << P);
    auto o = run("1f1b", opts(layout(1, 1, 1, P, seq_kind::ulysses)));
    REQUIRE(o.differing() == 0);
    for (int r = 0; r < P; ++r) {
      auto c = counts(o, r, "sp (ulysses)");
      // Forward: Q, K, V in one all-to-all and the output back; backward: the output gradient and
      // the Q/K/V gradients. Each all-to-all's input is this rank's N/P tokens.
      CHECK(c[comm_op::all_to_all].calls == 4u * L * M);
      CHECK(c[comm_op::all_to_all].bytes == static_cast<std::uint64_t>(2 * L * M * (4.0 * N * h / P) * B));
      CHECK(c[comm_op::all_to_all].bus_bytes == doctest::Approx(2 * L * M * (4.0 * N * h / P) * B * (P - 1) / P));
      CHECK(c[comm_op::send].calls == 0);
    }
  }
}

TEST_CASE("volume: ring attention passes K/V P - 1 times forward, and USP splits the volume between its all-to-alls and its ring") {
  // One attention call, counted at the communicators (heads 4, head size 2: h = 8 as the model).
  for (auto [u, R] : {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
    const int sp = u * R;
    INFO("ulysses " << u << " ring " << R);
    std::mutex mu;
    loom::run_threads(sp, [&](loom::threads::comm& world) {
      const int r = world.rank();
      loom::counted<loom::threads::comm> uc(world.split(r / u, r % u)), rc(world.split(r % u, r / u));
      const int T = N / sp;
      loom::usp_attention<loom::counted<loom::threads::comm>, double> att(u > 1 ? &uc : nullptr, R > 1 ? &rc : nullptr, T,
                                                                         {4, 2, 0.5}, true);
      std::vector<double> qkv(static_cast<std::size_t>(3 * T * h), 0.25), o(static_cast<std::size_t>(T * h)),
          stash(att.stash_size()), dqkv(qkv.size());
      att.forward(qkv, o, stash);
      auto fu = uc.counters(), fr = rc.counters();
      att.backward(o, dqkv, stash);
      auto bu = uc.counters().since(fu), br = rc.counters().since(fr);
      std::lock_guard lk(mu);
      // Ulysses part: 4 N h / sp elements of all-to-all input per rank forward (Q, K, V, O of its
      // N / sp tokens), whatever the ring degree.
      CHECK(fu[comm_op::all_to_all].calls == (u > 1 ? 2u : 0u));
      CHECK(fu[comm_op::all_to_all].bytes == (u > 1 ? static_cast<std::uint64_t>(4.0 * N * h / sp * B) : 0u));
      CHECK(bu[comm_op::all_to_all].bytes == fu[comm_op::all_to_all].bytes);
      // Ring part: R - 1 passes of K and V of the ring position's N / R tokens for h / u features.
      const double kv = 2.0 * (N / R) * (h / u) * B;
      CHECK(fr[comm_op::send].calls == static_cast<std::uint64_t>(R - 1));
      CHECK(fr[comm_op::send].bytes == static_cast<std::uint64_t>((R - 1) * kv));
      // Backward: K/V again R - 1 times, and their gradients R times (the last hop home).
      CHECK(br[comm_op::send].calls == static_cast<std::uint64_t>(R > 1 ? 2 * R - 1 : 0));
      CHECK(br[comm_op::send].bytes == static_cast<std::uint64_t>(R > 1 ? (2 * R - 1) * kv : 0));
    });
  }
  // The same counts over a whole training step of the example: per block and microbatch.
  for (int P : {2, 4}) {
    auto o = run("1f1b", opts(layout(1, 1, 1, P, seq_kind::ring)));
    REQUIRE(o.differing() == 0);
    auto c = counts(o, 0, "sp (ring)");
    CHECK(c[comm_op::send].calls == static_cast<std::uint64_t>(L * M * (3 * P - 2)));
    CHECK(c[comm_op::send].bytes == static_cast<std::uint64_t>(L * M * (3 * P - 2) * 2.0 * (N / P) * h * B));
  }
}

TEST_CASE("volume: ZeRO's reduce-scatter plus all-gather move the bytes of one all-reduce of the same buckets") {
  for (int dp : {2, 3, 4})
    for (auto s : {layout(dp, 1, 1, 1), layout(dp, 1, 2, 1)}) {
      INFO(s.describe());
      auto plain = run("1f1b", opts(s, false));
      auto zero = run("1f1b", opts(s, true));
      REQUIRE(plain.differing() == 0);
      REQUIRE(zero.differing() == 0);
      for (int r = 0; r < s.world(); ++r) {
        auto a = counts(plain, r, "dp"), z = counts(zero, r, "dp");
        // One bucket (25 MB holds the whole stage): one all-reduce, or one reduce-scatter of the
        // bucket padded to a multiple of dp and one all-gather of the updated parameters.
        CHECK(a[comm_op::all_reduce].calls == 1);
        CHECK(z[comm_op::reduce_scatter].calls == 1);
        CHECK(z[comm_op::all_gather].calls == 1);
        CHECK(z[comm_op::all_reduce].calls == 0);
        const double padded = static_cast<double>(z[comm_op::reduce_scatter].bytes);
        CHECK(z[comm_op::all_gather].bytes == z[comm_op::reduce_scatter].bytes);
        CHECK(padded >= static_cast<double>(a[comm_op::all_reduce].bytes));
        CHECK(padded < static_cast<double>(a[comm_op::all_reduce].bytes) + dp * B);
        CHECK(z[comm_op::reduce_scatter].bus_bytes + z[comm_op::all_gather].bus_bytes ==
              doctest::Approx(padded * 2 * (dp - 1) / dp));
        if (z[comm_op::reduce_scatter].bytes == a[comm_op::all_reduce].bytes)
          CHECK(z[comm_op::reduce_scatter].bus_bytes + z[comm_op::all_gather].bus_bytes == doctest::Approx(a[comm_op::all_reduce].bus_bytes));
      }
    }
}
