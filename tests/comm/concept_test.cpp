// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Compile-only checks of the communicator concept: its models and some non-models.

#include <doctest/doctest.h>

#include <chrono>
#include <span>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/comm/threads.hpp"

namespace {

//! Has point-to-point but no collectives: not a communicator.
struct p2p_only {
  using request = int;
  int rank() const { return 0; }
  int size() const { return 1; }
  request isend(int, std::span<const std::byte>) { return 0; }
  request irecv(int, std::span<std::byte>) { return 0; }
  void wait(request&) {}
  bool test(request&) { return true; }
  void barrier() {}
  p2p_only split(int, int) { return {}; }
  void abort(std::string) {}
  void set_timeout(std::chrono::milliseconds) {}
};

//! p2p_only plus the typed collectives: a (trivial) communicator.
struct single_rank : p2p_only {
  single_rank split(int, int) { return {}; }
  template <loom::comm_element T>
  void all_reduce(std::span<T>, loom::reduce_op) {}
  template <loom::comm_element T>
  void all_gather(std::span<const T>, std::span<T>) {}
  template <loom::comm_element T>
  void reduce_scatter(std::span<const T>, std::span<T>, loom::reduce_op) {}
  template <loom::comm_element T>
  void all_to_all(std::span<const T>, std::span<T>) {}
};

}  // namespace

static_assert(loom::communicator<loom::threads::comm>);
static_assert(loom::communicator<single_rank>);
static_assert(!loom::communicator<p2p_only>);
static_assert(!loom::communicator<int>);
static_assert(loom::comm_element<double> && loom::comm_element<std::uint8_t>);
static_assert(!loom::comm_element<bool> && !loom::comm_element<std::string>);

TEST_CASE("comm: the communicator concept accepts the backends and rejects types missing collectives") {
  CHECK(loom::communicator<loom::threads::comm>);
  CHECK_FALSE(loom::communicator<p2p_only>);
}

TEST_CASE("comm: comm_error carries the failing rank and the cause") {
  loom::comm_error e(3, "timed out after 10 ms");
  CHECK(e.rank() == 3);
  CHECK(e.cause() == "timed out after 10 ms");
  CHECK(std::string(e.what()) == "loom comm: rank 3: timed out after 10 ms");
  CHECK(std::string(loom::comm_error(-1, "x").what()) == "loom comm: x");
}
