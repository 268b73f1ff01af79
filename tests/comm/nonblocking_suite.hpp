// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test bodies of the non-blocking collectives (`loom::nonblocking_communicator`) and of the
// rank-ordered sums (`loom/comm/ordered.hpp`), written once over the concept and run on threads
// (tests/comm) and MPI (tests/mpi). Expected values come from closed formulas.

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm_suite.hpp"
#include "loom/comm/ordered.hpp"

namespace comm_suite {

//! Several non-blocking collectives of each kind posted back to back (a blocking one between
//! them), completed in reverse order, half by polling `test`: every element exact.
template <class T, loom::nonblocking_communicator C>
void nonblocking_exact_for(C& c, const char* type) {
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t count : collective_sizes(n)) {
    const std::string where = std::string(type) + " x " + std::to_string(count);
    std::vector<T> red(count), gin(count), gout(count * un), rsin(count * un), rsout(count), a2in(count * un),
        a2out(count * un), blocking(count);
    for (std::size_t i = 0; i < count; ++i) red[i] = value<T>(me, i), gin[i] = value<T>(me, i + 5), blocking[i] = value<T>(me, i);
    for (std::size_t i = 0; i < rsin.size(); ++i) rsin[i] = value<T>(me, i), a2in[i] = value<T>(me, i + 1);
    std::vector<typename C::request> reqs;
    reqs.push_back(c.iall_reduce(std::span<T>(red), loom::reduce_op::sum));
    reqs.push_back(c.iall_gather(std::span<const T>(gin), std::span<T>(gout)));
    c.all_reduce(std::span<T>(blocking), loom::reduce_op::max);  // a blocking collective while they are in flight
    reqs.push_back(c.ireduce_scatter(std::span<const T>(rsin), std::span<T>(rsout), loom::reduce_op::min));
    reqs.push_back(c.iall_to_all(std::span<const T>(a2in), std::span<T>(a2out)));
    for (std::size_t k = reqs.size(); k-- > 0;) {
      if (k % 2 == 0) {
        while (!c.test(reqs[k])) {
        }
      } else {
        c.wait(reqs[k]);
      }
      reqs[k] = typename C::request{};
    }
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      wrong += red[i] != fold<T>(loom::reduce_op::sum, n, [&](int r) { return value<T>(r, i); });
      wrong += blocking[i] != fold<T>(loom::reduce_op::max, n, [&](int r) { return value<T>(r, i); });
      wrong += rsout[i] != fold<T>(loom::reduce_op::min, n, [&](int r) { return value<T>(r, static_cast<std::size_t>(me) * count + i); });
      for (std::size_t j = 0; j < un; ++j) {
        wrong += gout[j * count + i] != value<T>(static_cast<int>(j), i + 5);
        wrong += a2out[j * count + i] != value<T>(static_cast<int>(j), static_cast<std::size_t>(me) * count + i + 1);
      }
    }
    expect(wrong == 0, me, "non-blocking collectives " + where + ": " + std::to_string(wrong) + " wrong");
  }
}

//! Every non-blocking collective on three element types.
template <loom::nonblocking_communicator C>
void nonblocking_exact(C& c) {
  nonblocking_exact_for<std::int32_t>(c, "int32");
  nonblocking_exact_for<std::int64_t>(c, "int64");
  nonblocking_exact_for<double>(c, "double");
  c.barrier();
}

//! A contribution whose sum depends on the order of addition: 1e16-scale values mixed with
//! small ones, so that any other association than rank order changes the bits.
inline double order_sensitive(int r, std::size_t i) {
  const double big = (r % 2 == 0 ? 1.0 : -1.0) * 1e16 * static_cast<double>(1 + (i % 3));
  return (r + static_cast<int>(i)) % 3 == 0 ? big : 1.0 + 0.25 * static_cast<double>(r) + 1e-3 * static_cast<double>(i);
}
inline double rank_order_sum(int n, std::size_t i) {
  double acc = order_sensitive(0, i);
  for (int r = 1; r < n; ++r) acc += order_sensitive(r, i);
  return acc;
}

//! `ordered_all_reduce`, `ordered_reduce_scatter` and `loom::reduction` (blocking, polled,
//! ordered) give the rank-order sum bit for bit, for sizes that do and do not divide evenly.
template <loom::nonblocking_communicator C>
void ordered_sums_are_rank_order(C& c) {
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, un, un * 5 + 3}) {
    std::vector<double> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = order_sensitive(me, i);
    loom::ordered_all_reduce(c, std::span<double>(v));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += std::bit_cast<std::uint64_t>(v[i]) != std::bit_cast<std::uint64_t>(rank_order_sum(n, i));
    expect(wrong == 0, me, "ordered_all_reduce x " + std::to_string(count) + ": " + std::to_string(wrong) + " not the rank-order sum");

    std::vector<double> in(count * un), out(count);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = order_sensitive(me, i);
    loom::ordered_reduce_scatter(c, std::span<const double>(in), std::span<double>(out));
    wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      wrong += std::bit_cast<std::uint64_t>(out[i]) != std::bit_cast<std::uint64_t>(rank_order_sum(n, static_cast<std::size_t>(me) * count + i));
    expect(wrong == 0, me, "ordered_reduce_scatter x " + std::to_string(count) + ": " + std::to_string(wrong) + " wrong");

    // Two reductions in flight at once, completed by polling.
    std::vector<double> w(count), rs(count);
    for (std::size_t i = 0; i < count; ++i) w[i] = order_sensitive(me, i);
    loom::reduction<C, double> r1, r2;
    r1.start_all_reduce(c, std::span<double>(w), true);
    r2.start_reduce_scatter(c, std::span<const double>(in), std::span<double>(rs), true);
    while (!(r1.test() && r2.test())) {
    }
    wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      wrong += std::bit_cast<std::uint64_t>(w[i]) != std::bit_cast<std::uint64_t>(rank_order_sum(n, i));
      wrong += std::bit_cast<std::uint64_t>(rs[i]) != std::bit_cast<std::uint64_t>(out[i]);
    }
    expect(wrong == 0, me, "loom::reduction (polled) x " + std::to_string(count) + ": " + std::to_string(wrong) + " wrong");
  }
  c.barrier();
}

}  // namespace comm_suite
