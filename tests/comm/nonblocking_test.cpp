// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Non-blocking collectives and rank-ordered sums on the threads backend (the same bodies run on
// MPI in tests/mpi), plus the counting communicator.

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <utility>

#include "loom/comm/counting.hpp"
#include "loom/comm/ordered.hpp"
#include "loom/comm/threads.hpp"
#include "nonblocking_suite.hpp"

namespace {

template <class Body>
void run_suite(int n, Body body) {
  INFO("ranks = " << n);
  try {
    loom::run_threads(n, body, std::chrono::seconds(30));
  } catch (const std::exception& e) {
    FAIL(std::string(e.what()));
  }
}

//! The threads backend with its rank-order promise hidden, so that `loom/comm/ordered.hpp` takes
//! its all-to-all path (the one MPI uses) here too.
struct unordered : loom::counted<loom::threads::comm> {
  static constexpr bool rank_ordered_reductions = false;
  explicit unordered(loom::threads::comm c) : loom::counted<loom::threads::comm>(std::move(c)) {}
  unordered split(int color, int key) { return unordered(inner().split(color, key)); }
};
static_assert(loom::nonblocking_communicator<unordered> && !loom::reduces_in_rank_order<unordered>);
static_assert(loom::nonblocking_communicator<loom::threads::comm> && loom::reduces_in_rank_order<loom::threads::comm>);
static_assert(loom::nonblocking_communicator<loom::counted<loom::threads::comm>>);
static_assert(loom::reduces_in_rank_order<loom::counted<loom::threads::comm>>);

}  // namespace

TEST_CASE("threads: non-blocking collectives are exact, in flight together and beside a blocking one") {
  for (int n : {1, 2, 3, 4, 5}) run_suite(n, [](auto& c) { comm_suite::nonblocking_exact(c); });
}

TEST_CASE("threads: ordered sums equal the rank-order sum bit for bit, natively and through all-to-all") {
  for (int n : {1, 2, 3, 4, 5}) {
    run_suite(n, [](auto& c) { comm_suite::ordered_sums_are_rank_order(c); });
    run_suite(n, [](loom::threads::comm& c) {
      unordered u(std::move(c));
      comm_suite::ordered_sums_are_rank_order(u);
      // The emulation moves what the ring algorithms move: an all-to-all and an all-gather (two
      // ranks need no emulation: one addition per element is the same in either order).
      if (u.size() > 2) {
        CHECK(u.counters()[loom::comm_op::all_reduce].calls == 0);
        CHECK(u.counters()[loom::comm_op::all_to_all].calls > 0);
      }
    });
  }
}

TEST_CASE("threads: a non-blocking collective posted with another size fails on every rank naming both") {
  run_suite(3, [](loom::threads::comm& c) {
    std::vector<double> v(c.rank() == 2 ? 4 : 3, 1.0);
    auto r = c.iall_reduce(std::span<double>(v), loom::reduce_op::sum);
    try {
      c.wait(r);
      comm_suite::expect(false, c.rank(), "no error");
    } catch (const loom::comm_error& e) {
      comm_suite::expect(std::string(e.what()).find("rank 2 posted iall_reduce of 4 input elements but rank 0 posted iall_reduce of 3") !=
                             std::string::npos,
                         c.rank(), e.what());
    }
  });
}

TEST_CASE("counted: calls, bytes and bus bytes per operation follow the documented formulas") {
  run_suite(4, [](loom::threads::comm& raw) {
    loom::counted c(std::move(raw));
    std::vector<double> v(8), out(32), seg(2);
    c.all_reduce(std::span<double>(v), loom::reduce_op::sum);
    c.all_gather(std::span<const double>(v), std::span<double>(out));
    c.reduce_scatter(std::span<const double>(v), std::span<double>(seg), loom::reduce_op::sum);
    std::vector<double> a(8), b(8);
    c.all_to_all(std::span<const double>(a), std::span<double>(b));
    auto r = c.iall_reduce(std::span<double>(v), loom::reduce_op::sum);
    c.wait(r);
    const auto& k = c.counters();
    CHECK(k[loom::comm_op::all_reduce] == loom::op_count{2, 128, 2 * 64 * 2 * 0.75});
    CHECK(k[loom::comm_op::all_gather] == loom::op_count{1, 256, 256 * 0.75});
    CHECK(k[loom::comm_op::reduce_scatter] == loom::op_count{1, 64, 64 * 0.75});
    CHECK(k[loom::comm_op::all_to_all] == loom::op_count{1, 64, 64 * 0.75});
    // Point to point: a ring of 16-byte messages.
    std::vector<std::byte> s(16), rcv(16);
    auto rr = c.irecv((c.rank() + 3) % 4, rcv);
    auto sr = c.isend((c.rank() + 1) % 4, s);
    c.wait(rr);
    c.wait(sr);
    CHECK(c.counters()[loom::comm_op::send] == loom::op_count{1, 16, 16});
    CHECK(c.counters()[loom::comm_op::recv] == loom::op_count{1, 16, 0});
    auto snap = c.counters();
    c.barrier();
    CHECK(c.counters().since(snap)[loom::comm_op::barrier].calls == 1);
    c.reset_counters();
    CHECK(c.counters() == loom::comm_counters{});
  });
}
