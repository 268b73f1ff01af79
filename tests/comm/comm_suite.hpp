// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! One test body per property of the `communicator` concept, written once over the concept
//! and run by every backend that can run here (threads in tests/comm, MPI in tests/mpi).
//! Each body is called collectively by every rank of a communicator; it throws
//! `comm_suite::failure` (with a sentence naming the rank and what was wrong) when a property
//! does not hold, and returns normally otherwise. Expected values come from closed formulas,
//! never from the backend under test.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace comm_suite {

//! A property of the communicator that did not hold on this rank.
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void expect(bool ok, int rank, const std::string& what) {
  if (!ok) throw failure("rank " + std::to_string(rank) + ": " + what);
}

using clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Point-to-point: per-peer FIFO matching, asynchronous sends, any posting order.

//! Length in bytes of the k-th message from p to q (0 included; the last one is 1 MiB-ish so
//! that MPI's rendezvous protocol is exercised too).
inline std::size_t message_length(int p, int q, int k, int count) {
  if (k == count - 1) return (std::size_t{1} << 20) + static_cast<std::size_t>(p * 3 + q);
  return static_cast<std::size_t>((p * 7 + q * 3 + k * 5) % 37);
}
inline std::byte message_byte(int p, int q, int k, std::size_t i) {
  return static_cast<std::byte>((static_cast<std::size_t>(p) * 31 + static_cast<std::size_t>(q) * 17 +
                                 static_cast<std::size_t>(k) * 13 + i) & 0xffu);
}

//! Every rank sends `count` messages of varied sizes (zero bytes included) to every rank,
//! itself included; half of the receives are posted before the sends and half after, so both
//! "send finds receive" and "receive finds send" matches happen. Each message must arrive
//! whole, in order, from the right peer.
template <loom::communicator C>
void fifo_per_peer(C& c, int count = 12) {
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(n * count)), in(static_cast<std::size_t>(n * count));
  std::vector<typename C::request> reqs;
  auto idx = [&](int peer, int k) { return static_cast<std::size_t>(peer * count + k); };
  for (int q = 0; q < n; ++q)
    for (int k = 0; k < count; ++k) {
      auto& o = out[idx(q, k)];
      o.resize(message_length(me, q, k, count));
      for (std::size_t i = 0; i < o.size(); ++i) o[i] = message_byte(me, q, k, i);
      in[idx(q, k)].assign(message_length(q, me, k, count), std::byte{0});
    }
  // Receives for the first half of the messages, from peers in a rank-dependent order.
  for (int s = 0; s < n; ++s) {
    int p = (me + s) % n;
    for (int k = 0; k < count / 2; ++k) reqs.push_back(c.irecv(p, in[idx(p, k)]));
  }
  // All sends, interleaving destinations.
  for (int k = 0; k < count; ++k)
    for (int s = 0; s < n; ++s) {
      int q = (me + n - s) % n;
      reqs.push_back(c.isend(q, std::span<const std::byte>(out[idx(q, k)])));
    }
  for (int s = 0; s < n; ++s) {
    int p = (me + n - s) % n;
    for (int k = count / 2; k < count; ++k) reqs.push_back(c.irecv(p, in[idx(p, k)]));
  }
  for (auto& r : reqs) c.wait(r);
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < count; ++k) {
      const auto& m = in[idx(p, k)];
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < m.size(); ++i) wrong += m[i] != message_byte(p, me, k, i);
      expect(wrong == 0, me,
             "message " + std::to_string(k) + " from rank " + std::to_string(p) + " has " + std::to_string(wrong) +
                 " wrong bytes of " + std::to_string(m.size()));
    }
}

//! `test` eventually reports completion of a receive whose send is posted later, by polling.
template <loom::communicator C>
void test_polls_to_completion(C& c) {
  const int n = c.size(), me = c.rank();
  const int to = (me + 1) % n, from = (me + n - 1) % n;
  std::int64_t got = -1, sent = 1000 + me;
  auto r = c.irecv(from, std::as_writable_bytes(std::span<std::int64_t>(&got, 1)));
  c.barrier();
  auto s = c.isend(to, std::as_bytes(std::span<const std::int64_t>(&sent, 1)));
  auto deadline = clock::now() + std::chrono::seconds(20);
  while (!c.test(r)) {
    expect(clock::now() < deadline, me, "test() never reported the receive complete");
    std::this_thread::yield();
  }
  c.wait(s);
  expect(got == 1000 + from, me, "polled receive holds " + std::to_string(got));
}

//! A receive whose size differs from the matching send fails on the receiving rank.
template <loom::communicator C>
void size_mismatch_fails_the_receive(C& c) {
  const int n = c.size(), me = c.rank();
  if (n < 2) return;
  std::vector<std::byte> small(8, std::byte{1}), big(16);
  if (me == 0) {
    auto s = c.isend(1, std::span<const std::byte>(small));
    try {
      c.wait(s);  // a backend may or may not see the mismatch on the sending side
    } catch (const loom::comm_error&) {
    }
  } else if (me == 1) {
    auto r = c.irecv(0, big);
    bool threw = false;
    try {
      c.wait(r);
    } catch (const loom::comm_error& e) {
      threw = std::string(e.what()).find("8") != std::string::npos;
    }
    expect(threw, me, "a 16-byte receive matched with an 8-byte send did not fail naming the size");
  }
  c.barrier();
}

// ---------------------------------------------------------------------------------------------
// Collectives: exact results for several sizes, element types and reductions.

template <class T>
T value(int r, std::size_t i) {
  long long v = static_cast<long long>((static_cast<std::size_t>(r) * 7 + i * 3) % 23);
  if constexpr (std::is_signed_v<T>) v -= 11;
  return static_cast<T>(v);
}

template <class T>
T fold(loom::reduce_op op, int n, auto&& at) {
  T acc = at(0);
  for (int r = 1; r < n; ++r) {
    T x = at(r);
    if (op == loom::reduce_op::sum) acc = static_cast<T>(acc + x);
    if (op == loom::reduce_op::max) acc = std::max(acc, x);
    if (op == loom::reduce_op::min) acc = std::min(acc, x);
  }
  return acc;
}

inline std::vector<std::size_t> collective_sizes(int n) {
  return {0, 1, 3, static_cast<std::size_t>(n), 1000, 4099};
}

template <class T, loom::communicator C>
void collectives_exact_for(C& c, const char* type) {
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t count : collective_sizes(n)) {
    const std::string where = std::string(type) + " x " + std::to_string(count);
    for (auto op : {loom::reduce_op::sum, loom::reduce_op::max, loom::reduce_op::min}) {
      // all_reduce, in place
      std::vector<T> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = value<T>(me, i);
      c.all_reduce(std::span<T>(v), op);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) wrong += v[i] != fold<T>(op, n, [&](int r) { return value<T>(r, i); });
      expect(wrong == 0, me, "all_reduce " + std::string(to_string(op)) + " " + where + ": " + std::to_string(wrong) + " wrong");
      // reduce_scatter: rank r gets segment r reduced
      std::vector<T> in(count * un), out(count);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = value<T>(me, i);
      c.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
      wrong = 0;
      for (std::size_t i = 0; i < count; ++i)
        wrong += out[i] != fold<T>(op, n, [&](int r) { return value<T>(r, static_cast<std::size_t>(me) * count + i); });
      expect(wrong == 0, me, "reduce_scatter " + std::string(to_string(op)) + " " + where + ": " + std::to_string(wrong) + " wrong");
    }
    // all_gather, out of place and in place (input = own segment of the output)
    std::vector<T> mine(count), all(count * un, T{});
    for (std::size_t i = 0; i < count; ++i) mine[i] = value<T>(me, i);
    c.all_gather(std::span<const T>(mine), std::span<T>(all));
    std::size_t wrong = 0;
    for (std::size_t r = 0; r < un; ++r)
      for (std::size_t i = 0; i < count; ++i) wrong += all[r * count + i] != value<T>(static_cast<int>(r), i);
    expect(wrong == 0, me, "all_gather " + where + ": " + std::to_string(wrong) + " wrong");
    std::vector<T> all2(count * un, T{});
    for (std::size_t i = 0; i < count; ++i) all2[static_cast<std::size_t>(me) * count + i] = value<T>(me, i);
    c.all_gather(std::span<const T>(all2.data() + static_cast<std::size_t>(me) * count, count), std::span<T>(all2));
    wrong = 0;
    for (std::size_t r = 0; r < un; ++r)
      for (std::size_t i = 0; i < count; ++i) wrong += all2[r * count + i] != value<T>(static_cast<int>(r), i);
    expect(wrong == 0, me, "in-place all_gather " + where + ": " + std::to_string(wrong) + " wrong");
    // all_to_all: out segment j = rank j's in segment me
    std::vector<T> a(count * un), b(count * un);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = value<T>(me, i);
    c.all_to_all(std::span<const T>(a), std::span<T>(b));
    wrong = 0;
    for (std::size_t j = 0; j < un; ++j)
      for (std::size_t i = 0; i < count; ++i)
        wrong += b[j * count + i] != value<T>(static_cast<int>(j), static_cast<std::size_t>(me) * count + i);
    expect(wrong == 0, me, "all_to_all " + where + ": " + std::to_string(wrong) + " wrong");
  }
}

//! Calls `f.template operator()<T>(name)` for each element type the suite covers.
template <class F>
void for_element_types(F&& f) {
  f.template operator()<std::int32_t>("int32");
  f.template operator()<std::int64_t>("int64");
  f.template operator()<float>("float");
  f.template operator()<double>("double");
  f.template operator()<std::uint8_t>("uint8");
}

//! Every collective, every reduction, sizes 0..4099, five element types: no wrong element.
template <loom::communicator C>
void collectives_exact(C& c) {
  for_element_types([&]<class T>(const char* type) { collectives_exact_for<T>(c, type); });
  c.barrier();
}

// ---------------------------------------------------------------------------------------------
// Rooted collectives (loom::rooted_communicator): broadcast and reduce from every root.

template <class T, loom::rooted_communicator C>
void rooted_exact_for(C& c, const char* type) {
  const int n = c.size(), me = c.rank();
  for (std::size_t count : collective_sizes(n))
    for (int root = 0; root < n; ++root) {
      const std::string where = std::string(type) + " x " + std::to_string(count) + " from root " + std::to_string(root);
      std::vector<T> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = value<T>(me, i);
      c.broadcast(std::span<T>(v), root);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) wrong += v[i] != value<T>(root, i);
      expect(wrong == 0, me, "broadcast " + where + ": " + std::to_string(wrong) + " wrong");
      for (auto op : {loom::reduce_op::sum, loom::reduce_op::max, loom::reduce_op::min}) {
        for (std::size_t i = 0; i < count; ++i) v[i] = value<T>(me, i);
        c.reduce(std::span<T>(v), root, op);
        wrong = 0;
        for (std::size_t i = 0; i < count; ++i)
          wrong += v[i] != (me == root ? fold<T>(op, n, [&](int r) { return value<T>(r, i); }) : value<T>(me, i));
        expect(wrong == 0, me, "reduce " + std::string(to_string(op)) + " " + where + ": " + std::to_string(wrong) + " wrong" +
                                   (me == root ? "" : " (a rank other than the root must keep its data)"));
      }
    }
}

//! broadcast and reduce from every root, every reduction, sizes 0..4099, five element types; a
//! root outside the group is refused on every rank with a sentence naming it.
template <loom::rooted_communicator C>
void rooted_collectives_exact(C& c) {
  for_element_types([&]<class T>(const char* type) { rooted_exact_for<T>(c, type); });
  for (int bad : {-1, c.size()}) {
    std::vector<double> v(3, 1.0);
    std::string what;
    try {
      c.reduce(std::span<double>(v), bad, loom::reduce_op::sum);
    } catch (const loom::comm_error& e) {
      what = e.what();
    }
    expect(what.find("reduce: root " + std::to_string(bad) + " is not a rank of this group of " + std::to_string(c.size())) != std::string::npos,
           c.rank(), "reduce from root " + std::to_string(bad) + " was not refused by name (got '" + what + "')");
    what.clear();
    try {
      c.broadcast(std::span<double>(v), bad);
    } catch (const loom::comm_error& e) {
      what = e.what();
    }
    expect(what.find("broadcast: root " + std::to_string(bad) + " is not a rank") != std::string::npos, c.rank(),
           "broadcast from root " + std::to_string(bad) + " was not refused by name (got '" + what + "')");
  }
  c.barrier();
}

// ---------------------------------------------------------------------------------------------
// Sub-groups.

//! split(rank % 2, -rank): groups of equal parity ordered by descending rank; collectives and
//! point-to-point inside a group see only its members; a nested split and the parent still work.
template <loom::communicator C>
void split_forms_subgroups(C& c) {
  const int n = c.size(), me = c.rank();
  const int color = me % 2;
  C sub = c.split(color, -me);
  int expected_size = 0, expected_rank = 0;
  for (int r = 0; r < n; ++r)
    if (r % 2 == color) {
      ++expected_size;
      if (r > me) ++expected_rank;
    }
  expect(sub.size() == expected_size, me, "sub-group size " + std::to_string(sub.size()));
  expect(sub.rank() == expected_rank, me, "sub-group rank " + std::to_string(sub.rank()));
  // all_reduce over the members' parent ranks
  std::int64_t sum = me, expected_sum = 0;
  for (int r = color; r < n; r += 2) expected_sum += r;
  sub.all_reduce(std::span<std::int64_t>(&sum, 1), loom::reduce_op::sum);
  expect(sum == expected_sum, me, "sub-group sum " + std::to_string(sum));
  // all_gather lists the members in sub-group order (descending parent rank)
  std::vector<std::int32_t> members(static_cast<std::size_t>(sub.size()));
  std::int32_t mine = me;
  sub.all_gather(std::span<const std::int32_t>(&mine, 1), std::span<std::int32_t>(members));
  for (int i = 0; i < sub.size(); ++i) {
    int r_expected = (n - 1 - ((n - 1 - color) % 2)) - 2 * i;
    expect(members[static_cast<std::size_t>(i)] == r_expected, me, "sub-group member " + std::to_string(i));
  }
  // point-to-point ring inside the sub-group, interleaved with a parent collective
  const int sn = sub.size(), sr = sub.rank();
  std::int32_t got = -1, sent = me;
  auto rr = sub.irecv((sr + sn - 1) % sn, std::as_writable_bytes(std::span<std::int32_t>(&got, 1)));
  auto sr_req = sub.isend((sr + 1) % sn, std::as_bytes(std::span<const std::int32_t>(&sent, 1)));
  std::int32_t world_sum = 1;
  c.all_reduce(std::span<std::int32_t>(&world_sum, 1), loom::reduce_op::sum);
  expect(world_sum == n, me, "parent all_reduce after split gave " + std::to_string(world_sum));
  sub.wait(sr_req);
  sub.wait(rr);
  expect(got == members[static_cast<std::size_t>((sr + sn - 1) % sn)], me, "sub-group ring received " + std::to_string(got));
  // nested split: everyone in one group, same key order => same ranks as sub
  C again = sub.split(0, sub.rank());
  expect(again.size() == sub.size() && again.rank() == sub.rank(), me, "nested split reordered the ranks");
  again.barrier();
  sub.barrier();
  c.barrier();
}

// ---------------------------------------------------------------------------------------------
// Failures: abort and timeout end every rank with the error, within seconds.

//! The last rank aborts while rank 0 waits for a message from it and the others wait in a
//! barrier: every rank's call throws a comm_error naming the last rank and the reason within
//! 5 s (the timeout is 30 s, so it is the abort, not a timeout, that ends them), and later
//! calls on the aborting rank throw too.
template <loom::communicator C>
void abort_reaches_every_rank(C& c, int abort_world_rank) {
  const int n = c.size(), me = c.rank();
  c.set_timeout(std::chrono::seconds(30));
  c.barrier();
  const auto t0 = clock::now();
  const int last = n - 1;
  bool threw = false;
  std::string what;
  int blamed = -2;
  if (me == last) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.abort("stop requested by the test");
    try {
      c.barrier();
    } catch (const loom::comm_error& e) {
      threw = true;
      blamed = e.rank();
      what = e.what();
    }
  } else {
    std::int32_t x = 0;
    try {
      if (me == 0) {
        auto r = c.irecv(last, std::as_writable_bytes(std::span<std::int32_t>(&x, 1)));
        c.wait(r);
      } else {
        c.barrier();
      }
    } catch (const loom::comm_error& e) {
      threw = true;
      blamed = e.rank();
      what = e.what();
    }
  }
  const auto took = clock::now() - t0;
  expect(threw, me, "no comm_error after rank " + std::to_string(last) + " aborted");
  expect(blamed == abort_world_rank, me, "the error blames rank " + std::to_string(blamed) + ": " + what);
  expect(what.find("stop requested by the test") != std::string::npos, me, "the error lacks the reason: " + what);
  expect(took < std::chrono::seconds(5), me, "the abort took more than 5 s to arrive");
}

//! Rank 0 (timeout 300 ms) waits for a message nobody sends; the other ranks (timeout 30 s)
//! wait in a barrier. Rank 0 throws a timeout error naming itself, and its timeout aborts the
//! others, whose errors name rank 0, all within 5 s.
template <loom::communicator C>
void timeout_ends_every_rank(C& c, int rank0_world_rank) {
  const int n = c.size(), me = c.rank();
  c.set_timeout(std::chrono::seconds(30));
  c.barrier();
  if (me == 0) c.set_timeout(std::chrono::milliseconds(300));
  const auto t0 = clock::now();
  bool threw = false;
  std::string what;
  int blamed = -2;
  try {
    if (me == 0) {
      std::int32_t x = 0;
      auto r = c.irecv(n - 1, std::as_writable_bytes(std::span<std::int32_t>(&x, 1)));
      c.wait(r);
    } else {
      c.barrier();
    }
  } catch (const loom::comm_error& e) {
    threw = true;
    blamed = e.rank();
    what = e.what();
  }
  const auto took = clock::now() - t0;
  expect(threw, me, "no comm_error although rank 0 timed out");
  expect(blamed == rank0_world_rank, me, "the error blames rank " + std::to_string(blamed) + ": " + what);
  expect(what.find("timed out") != std::string::npos, me, "the error does not say it timed out: " + what);
  if (me == 0) expect(took >= std::chrono::milliseconds(250), me, "timed out before the timeout");
  expect(took < std::chrono::seconds(5), me, "the timeout took more than 5 s to end the rank");
}

}  // namespace comm_suite
