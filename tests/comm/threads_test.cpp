// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The communicator test bodies (comm_suite.hpp) on the threads backend, over several world
// sizes, plus what only threads can show: run_threads' exception propagation.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm_suite.hpp"
#include "loom/comm/counting.hpp"
#include "loom/comm/threads.hpp"

namespace {

constexpr int world_sizes[] = {1, 2, 3, 4, 5};

//! Runs `body(comm)` on every rank of an n-rank threads world and reports the first failure.
template <class Body>
void run_suite(int n, Body body) {
  INFO("ranks = " << n);
  try {
    loom::run_threads(n, body, std::chrono::seconds(30));
  } catch (const std::exception& e) {
    FAIL(std::string(e.what()));
  }
}

}  // namespace

TEST_CASE("threads: sends and receives are matched per peer in FIFO order whatever the posting order") {
  for (int n : world_sizes) run_suite(n, [](auto& c) { comm_suite::fifo_per_peer(c); });
}

TEST_CASE("threads: test() polls a receive to completion") {
  for (int n : world_sizes) run_suite(n, [](auto& c) { comm_suite::test_polls_to_completion(c); });
}

TEST_CASE("threads: a receive whose size differs from the matching send fails naming the sizes") {
  for (int n : {2, 3}) run_suite(n, [](auto& c) { comm_suite::size_mismatch_fails_the_receive(c); });
}

TEST_CASE("threads: every collective is exact for every reduction, size and element type") {
  for (int n : world_sizes) run_suite(n, [](auto& c) { comm_suite::collectives_exact(c); });
}

TEST_CASE("threads: broadcast and reduce are exact from every root, and refuse a root outside the group by name") {
  static_assert(loom::rooted_communicator<loom::threads::comm>);
  static_assert(loom::rooted_communicator<loom::counted<loom::threads::comm>>);
  for (int n : world_sizes) run_suite(n, [](auto& c) { comm_suite::rooted_collectives_exact(c); });
}

TEST_CASE("threads: reduce adds in rank order at the root, and counted counts broadcast and reduce by their buffer") {
  for (int n : {2, 3, 5})
    run_suite(n, [n](loom::threads::comm& w) {
      loom::counted<loom::threads::comm> c(w.split(0, w.rank()));
      const int me = c.rank();
      std::vector<double> v(7);
      // Terms whose sum depends on the order of the additions.
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = (me % 2 == 0 ? 1e16 : 1.0) * (me == 0 ? 1.0 : -1.0) + static_cast<double>(i);
      c.reduce(std::span<double>(v), n - 1, loom::reduce_op::sum);
      if (me == n - 1)
        for (std::size_t i = 0; i < v.size(); ++i) {
          double want = 1e16 + static_cast<double>(i);
          for (int r = 1; r < n; ++r) want += (r % 2 == 0 ? 1e16 : 1.0) * -1.0 + static_cast<double>(i);
          if (std::memcmp(&v[i], &want, sizeof want) != 0) throw std::runtime_error("reduce is not the rank-order sum at " + std::to_string(i));
        }
      c.broadcast(std::span<double>(v), n - 1);
      const auto& k = c.counters();
      if (k[loom::comm_op::reduce].calls != 1 || k[loom::comm_op::reduce].bytes != 56 || k[loom::comm_op::broadcast].calls != 1 ||
          k[loom::comm_op::broadcast].bytes != 56 || k[loom::comm_op::broadcast].bus_bytes != 56 || k[loom::comm_op::reduce].bus_bytes != 56)
        throw std::runtime_error("counted: broadcast and reduce not counted as one call of their 56-byte buffer each");
    });
}

TEST_CASE("threads: split forms sub-groups ordered by key that work beside their parent") {
  for (int n : world_sizes) run_suite(n, [](auto& c) { comm_suite::split_forms_subgroups(c); });
}

TEST_CASE("threads: an abort ends every rank's pending call with an error naming the aborting rank") {
  for (int n : world_sizes) run_suite(n, [n](auto& c) { comm_suite::abort_reaches_every_rank(c, n - 1); });
}

TEST_CASE("threads: a timeout ends the waiting rank and, through the abort it raises, every other rank") {
  for (int n : {1, 2, 4}) run_suite(n, [](auto& c) { comm_suite::timeout_ends_every_rank(c, 0); });
}

TEST_CASE("threads: an abort on a sub-group reaches the ranks of the whole world") {
  for (int n : {2, 4}) {
    run_suite(n, [](loom::threads::comm& c) {
      auto sub = c.split(c.rank() % 2, c.rank());
      c.barrier();
      if (c.rank() == 1) sub.abort("sub-group gave up");
      bool threw = false;
      try {
        c.barrier();
      } catch (const loom::comm_error& e) {
        threw = e.rank() == 1 && std::string(e.what()).find("sub-group gave up") != std::string::npos;
      }
      comm_suite::expect(threw, c.rank(), "the world barrier did not fail naming rank 1");
    });
  }
}

TEST_CASE("threads: run_threads rethrows the exception that started a failure after ending every rank") {
  for (int n : {2, 3, 5}) {
    INFO("ranks = " << n);
    const int culprit = n / 2;
    std::vector<int> blamed(static_cast<std::size_t>(n), -2);
    std::vector<std::string> causes(static_cast<std::size_t>(n));
    const auto t0 = std::chrono::steady_clock::now();
    bool got_original = false;
    try {
      loom::run_threads(n, [&](loom::threads::comm& c) {
        c.barrier();
        if (c.rank() == culprit) throw std::logic_error("stage 3 failed on purpose");
        try {
          std::int32_t x = 0;
          if (c.rank() == 0) {
            auto r = c.irecv(culprit, std::as_writable_bytes(std::span<std::int32_t>(&x, 1)));
            c.wait(r);
          } else {
            c.barrier();
          }
        } catch (const loom::comm_error& e) {
          blamed[static_cast<std::size_t>(c.rank())] = e.rank();
          causes[static_cast<std::size_t>(c.rank())] = e.what();
          throw;
        }
      }, std::chrono::seconds(30));
    } catch (const std::logic_error& e) {
      got_original = std::string(e.what()) == "stage 3 failed on purpose";
    }
    CHECK(got_original);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    for (int r = 0; r < n; ++r) {
      if (r == culprit) continue;
      CHECK(blamed[static_cast<std::size_t>(r)] == culprit);
      CHECK(causes[static_cast<std::size_t>(r)].find("threw: stage 3 failed on purpose") != std::string::npos);
    }
  }
}

TEST_CASE("threads: bad arguments raise comm_error naming the value") {
  run_suite(2, [](loom::threads::comm& c) {
    std::byte b{};
    bool threw = false;
    try {
      (void)c.isend(7, std::span<const std::byte>(&b, 1));
    } catch (const loom::comm_error& e) {
      threw = std::string(e.what()).find("rank 7") != std::string::npos;
    }
    comm_suite::expect(threw, c.rank(), "isend to rank 7 of 2 was accepted");
    threw = false;
    try {
      c.set_timeout(std::chrono::milliseconds(0));
    } catch (const loom::comm_error&) {
      threw = true;
    }
    comm_suite::expect(threw, c.rank(), "a zero timeout was accepted");
    std::vector<float> in(3), out(5);
    threw = false;
    try {
      c.all_gather(std::span<const float>(in), std::span<float>(out));
    } catch (const loom::comm_error& e) {
      threw = std::string(e.what()).find("5") != std::string::npos;
    }
    comm_suite::expect(threw, c.rank(), "an all_gather output of 5 elements for 2 x 3 was accepted");
  });
  CHECK_THROWS_AS(loom::threads::world(0), loom::comm_error);
}

TEST_CASE("threads: a send is handed over without an intermediate copy") {
  // The receiver copies straight from the sender's posted buffer when the two are matched:
  // bytes written into a send buffer after isend but before the matching receive is posted
  // (which the contract forbids, and which this test does only to observe the mechanism) are
  // the ones received. A backend that copied at isend would deliver the old bytes.
  run_suite(2, [](loom::threads::comm& c) {
    std::vector<std::byte> buf(64, std::byte{0x5a});
    if (c.rank() == 0) {
      auto s = c.isend(1, std::span<const std::byte>(buf));
      std::fill(buf.begin(), buf.end(), std::byte{0xa5});
      c.barrier();
      c.wait(s);
    } else {
      c.barrier();  // the send is queued before the receive is posted
      std::vector<std::byte> got(64);
      auto r = c.irecv(0, got);
      c.wait(r);
      comm_suite::expect(std::all_of(got.begin(), got.end(), [](std::byte x) { return x == std::byte{0xa5}; }), 1,
                         "the received bytes were not read from the sender's buffer at hand-off");
    }
  });
}
