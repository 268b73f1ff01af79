// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Rank-ordered sums on any backend: `ordered_all_reduce`, `ordered_reduce_scatter` and their
//! non-blocking form `loom::reduction`. The result is the sum of the ranks' contributions in rank
//! order, `((x_0 + x_1) + x_2) + ...`, bitwise the same on every rank and every backend, which is
//! what loom's deterministic mode needs (floating-point addition is not associative, and MPI does
//! not promise an order).
//!
//! On a backend whose reductions are already rank-ordered (`loom::reduces_in_rank_order<C>`, the
//! threads backend), and on groups of one or two ranks (one addition per element, and IEEE
//! addition is commutative, so every order gives the same bits), these are the backend's own
//! `all_reduce`/`reduce_scatter`. Elsewhere a reduce-scatter
//! is an all-to-all (rank r receives segment r of every rank) followed by the sum of the received
//! segments in rank order, and an all-reduce is that reduce-scatter followed by an all-gather of
//! the reduced segments (the vector padded with zeros to a multiple of the group size). The data
//! moved is the same as the ring algorithms': (n-1)/n of the buffer per rank for the
//! reduce-scatter, twice that for the all-reduce (Patarasuk and Yuan 2009), so the deterministic
//! mode costs no extra bandwidth, only the latency of its two steps.

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom {

//! One rank-ordered sum in flight (all-reduce or reduce-scatter), posted with `start_*` and
//! completed by `test` (progress without blocking) or `wait`. With `ordered == false` it is the
//! backend's own reduction, whatever its order. `C` must model `nonblocking_communicator`.
//! The buffers passed to `start_*` must stay valid until completion.
template <class C, comm_element T>
class reduction {
 public:
  reduction() = default;

  //! Posts a sum of `data` over the group into `data` (rank-ordered when `ordered`).
  void start_all_reduce(C& c, std::span<T> data, bool ordered) {
    begin(c, ordered);
    data_ = data;
    if (direct()) {
      req_ = c.iall_reduce(data, reduce_op::sum);
      phase_ = phase::last;
      return;
    }
    all_reduce_ = true;
    const auto n = static_cast<std::size_t>(c.size());
    k_ = (data.size() + n - 1) / n;
    padded_.assign(n * k_, T{});
    std::copy(data.begin(), data.end(), padded_.begin());
    recv_.assign(n * k_, T{});
    req_ = c.iall_to_all(std::span<const T>(padded_), std::span<T>(recv_));
    phase_ = phase::exchange;
  }

  //! Posts a reduce-scatter: `out` (k elements) receives the sum over the group of segment
  //! `rank` of every rank's `in` (n * k elements); rank-ordered when `ordered`.
  void start_reduce_scatter(C& c, std::span<const T> in, std::span<T> out, bool ordered) {
    begin(c, ordered);
    if (in.size() != out.size() * static_cast<std::size_t>(c.size()))
      throw std::invalid_argument("loom::reduction: reduce-scatter input of " + std::to_string(in.size()) +
                                  " elements is not the group size " + std::to_string(c.size()) + " x the output's " +
                                  std::to_string(out.size()));
    data_ = out;
    if (direct()) {
      req_ = c.ireduce_scatter(in, out, reduce_op::sum);
      phase_ = phase::last;
      return;
    }
    all_reduce_ = false;
    k_ = out.size();
    recv_.assign(in.size(), T{});
    req_ = c.iall_to_all(in, std::span<T>(recv_));
    phase_ = phase::exchange;
  }

  //! Whether the reduction completed; advances it when a step finished. Never blocks.
  bool test() {
    while (phase_ != phase::done) {
      if (!c_->test(req_)) return false;
      advance();
    }
    return true;
  }
  //! Blocks until the reduction completed.
  void wait() {
    while (phase_ != phase::done) {
      c_->wait(req_);
      advance();
    }
  }
  //! Posts every collective the reduction still needs, waiting for the ones before them (a
  //! rank-ordered all-reduce is an all-to-all, then an all-gather posted when it completed). A
  //! collective the caller posts next on the same communicator then follows all of them on every
  //! rank: MPI matches non-blocking collectives by the order in which each rank posts them, and
  //! `test` posts the second one whenever it finds the first complete, at a time that differs
  //! between ranks. Does not wait for the last collective.
  void post_remaining() {
    while (phase_ == phase::exchange && all_reduce_) {
      c_->wait(req_);
      advance();
    }
  }
  //! Whether a reduction was started and has not completed yet.
  bool pending() const { return phase_ != phase::done && phase_ != phase::idle; }

 private:
  enum class phase { idle, exchange, gather, last, done };

  void begin(C& c, bool ordered) {
    if (pending()) throw std::logic_error("loom::reduction: started while the previous one is in flight");
    c_ = &c;
    ordered_ = ordered;
  }
  bool direct() const { return !ordered_ || reduces_in_rank_order<C> || c_->size() <= 2; }

  void advance() {
    req_ = typename C::request{};
    if (phase_ == phase::exchange) {
      // recv_ holds segment `rank` of every rank, in rank order: sum them in that order.
      const auto n = static_cast<std::size_t>(c_->size());
      std::span<T> seg = all_reduce_ ? std::span<T>(padded_).subspan(static_cast<std::size_t>(c_->rank()) * k_, k_) : data_;
      std::copy(recv_.begin(), recv_.begin() + static_cast<std::ptrdiff_t>(k_), seg.begin());
      for (std::size_t j = 1; j < n; ++j)
        for (std::size_t i = 0; i < k_; ++i) seg[i] += recv_[j * k_ + i];
      if (!all_reduce_) {
        phase_ = phase::done;
        return;
      }
      req_ = c_->iall_gather(std::span<const T>(seg), std::span<T>(padded_));
      phase_ = phase::gather;
    } else if (phase_ == phase::gather) {
      std::copy(padded_.begin(), padded_.begin() + static_cast<std::ptrdiff_t>(data_.size()), data_.begin());
      phase_ = phase::done;
    } else {
      phase_ = phase::done;
    }
  }

  C* c_ = nullptr;
  typename C::request req_{};
  phase phase_ = phase::idle;
  bool ordered_ = false, all_reduce_ = false;
  std::span<T> data_;
  std::size_t k_ = 0;
  std::vector<T> padded_, recv_;
};

//! Sums `data` over the group of `c` in rank order (bitwise identical on every rank and backend;
//! see the file comment). Blocking.
template <nonblocking_communicator C, comm_element T>
void ordered_all_reduce(C& c, std::span<T> data) {
  if (c.size() == 1) return;
  if (reduces_in_rank_order<C> || c.size() == 2) {
    c.all_reduce(data, reduce_op::sum);
  } else {
    reduction<C, T> r;
    r.start_all_reduce(c, data, true);
    r.wait();
  }
}

//! `out` (k elements) receives the rank-order sum of segment `rank` of every rank's `in`
//! (n * k elements). Blocking; `in` and `out` must not overlap.
template <nonblocking_communicator C, comm_element T>
void ordered_reduce_scatter(C& c, std::span<const T> in, std::span<T> out) {
  if (c.size() == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  if (reduces_in_rank_order<C> || c.size() == 2) {
    c.reduce_scatter(in, out, reduce_op::sum);
  } else {
    reduction<C, T> r;
    r.start_reduce_scatter(c, in, out, true);
    r.wait();
  }
}

//! Sums `data` over the group of `c` into rank `root`'s `data`, in rank order, `((x_0 + x_1) + x_2)
//! + ...` (the other ranks' `data` unchanged), as the tensor-parallel grids' deterministic mode
//! needs. The backend's own `reduce` where its sums are rank-ordered or the group has at most two
//! ranks; elsewhere every other rank sends its buffer to the root, which receives them in rank
//! order and adds them in that order: the root receives `size() - 1` buffers and every other
//! rank sends one, the bytes of a linear reduce (a tree reduce moves the same per rank but the
//! root's, in fewer steps). Blocking; collective over the group.
template <rooted_communicator C, comm_element T>
void ordered_reduce(C& c, std::span<T> data, int root) {
  if (c.size() == 1) return;
  if (reduces_in_rank_order<C> || c.size() == 2) return c.reduce(data, root, reduce_op::sum);
  if (root < 0 || root >= c.size()) return c.reduce(data, root, reduce_op::sum);  // the backend names the bad root
  if (c.rank() != root) {
    auto r = isend_values(c, root, std::span<const T>(data));
    return c.wait(r);
  }
  const auto n = static_cast<std::size_t>(c.size()), k = data.size();
  std::vector<T> recv((n - 1) * k);
  std::vector<typename C::request> reqs;
  reqs.reserve(n - 1);
  for (std::size_t j = 0, slot = 0; j < n; ++j)
    if (static_cast<int>(j) != root) reqs.push_back(irecv_values(c, static_cast<int>(j), std::span<T>(recv).subspan(slot++ * k, k)));
  wait_all(c, std::span<typename C::request>(reqs));
  // The sum in rank order: the root's own contribution sits at its rank's place.
  std::vector<T> acc(k);
  for (std::size_t j = 0, slot = 0; j < n; ++j) {
    const T* src = static_cast<int>(j) == root ? data.data() : recv.data() + slot++ * k;
    if (j == 0) std::copy(src, src + k, acc.begin());
    else
      for (std::size_t i = 0; i < k; ++i) acc[i] += src[i];
  }
  std::copy(acc.begin(), acc.end(), data.begin());
}

}  // namespace loom
