// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The `loom::device_communicator` concept: what the executor's device flavour needs from a
//! communicator whose ranks run on CUDA devices (`loom::cuda_local`, `loom::nccl`).
//!
//! Transfers are between device buffers and ordered by CUDA events, never by the host:
//! - `isend(peer, bytes, ready)`: sends `bytes` once the last record of event `ready` (taken on
//!   the producer's stream) has completed;
//! - `irecv(peer, bytes, free)`: receives into `bytes`, not before the last record of `free`
//!   (the point where the buffer's previous use ended; null for none);
//! - `wait(request, stream)`: makes later work on `stream` wait for the transfer.
//! Matching is per peer in FIFO order, as on every loom communicator. Before the first transfer
//! every rank calls `open_channels` with the same list of directed channels (collective): the
//! backend creates what each channel needs up front (streams; NCCL sub-communicators by
//! `ncclCommSplit`), never lazily.
//!
//! A step is bracketed by `begin_step(stream)` (the communicator's streams fork from `stream`)
//! and `end_step(stream)` (`stream` joins them). `synchronize(stream)` waits on the host, bounded
//! by the timeout, and throws `comm_error` on a timeout, an abort by any rank or an asynchronous
//! error; `abort(reason)` makes every rank's pending and later calls throw, naming the rank and
//! the reason. Host-memory `all_reduce` serves the executor's agreement.
//!
//! Graphs: `begin_capture(stream)` / `end_capture(stream)` capture a step, `launch(stream)`
//! replays it (see each backend for what a replay covers).

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "loom/comm/communicator.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/error.hpp"
#include "loom/cuda/kernels.hpp"

namespace loom {

//! A communicator of ranks on CUDA devices (see the file comment).
template <class C>
concept device_communicator =
    std::movable<C> && requires { typename C::request; } &&
    requires(C& c, const C& cc, int peer, std::span<const std::byte> s, std::span<std::byte> r, cudaEvent_t ev,
             cudaStream_t st, typename C::request& q, std::span<const channel> chans, std::string why,
             std::chrono::milliseconds ms, std::span<std::int64_t> i64, std::span<double> f64) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      { cc.device() } -> std::same_as<int>;
      c.open_channels(chans);
      { c.isend(peer, s, ev) } -> std::same_as<typename C::request>;
      { c.irecv(peer, r, ev) } -> std::same_as<typename C::request>;
      c.wait(q, st);
      c.begin_step(st);
      c.end_step(st);
      c.synchronize(st);
      c.begin_capture(st);
      c.end_capture(st);
      c.launch(st);
      c.all_reduce(i64, reduce_op::sum);
      c.all_reduce(f64, reduce_op::sum);
      c.abort(why);
      c.set_timeout(ms);
    };

namespace detail {
//! Requirements of the device collectives for one element type `T`.
template <class C, class T>
concept device_collectives_for = requires(C& c, std::span<T> out, std::span<const T> in, reduce_op op, cudaStream_t st) {
  c.all_reduce(out, op, st);
  c.all_gather(in, out, st);
  c.reduce_scatter(in, out, op, st);
  c.all_to_all(in, out, st);
  c.broadcast(out, 0, st);
  c.reduce(out, 0, op, st);
};
}  // namespace detail

//! A device communicator with collectives over device memory, NCCL's stream-ordered model: each
//! call enqueues on `stream`, starts after the work enqueued on it so far on every rank, and
//! later work on `stream` sees its result (`all_reduce(data, op, stream)` in place,
//! `all_gather(in, out, stream)`, `reduce_scatter(in, out, op, stream)`, `all_to_all(in, out,
//! stream)`, `broadcast(data, root, stream)`, `reduce(data, root, op, stream)`, for `float` and
//! `double`), and `split(color, key)`
//! into sub-groups (collective; `ncclCommSplit` on `nccl`). To order a collective after an event
//! rather than a whole stream, make a communication stream wait for the event and pass that
//! stream (what the point-to-point calls do inside). A group, like a communicator, runs its
//! collectives in the order every rank posts them.
template <class C>
concept device_collective_communicator =
    device_communicator<C> && detail::device_collectives_for<C, float> && detail::device_collectives_for<C, double> &&
    requires(C& c) {
      { c.split(0, 0) } -> std::same_as<C>;
    };

//! Rank-ordered sum of device memory over a device group (deterministic mode; the device form of
//! `loom/comm/ordered.hpp`): `out` receives slice `rank()` of `((x_0 + x_1) + x_2) + ...` over the
//! ranks' `in` (`size()` slices of `out.size()`), bitwise the same on every backend, on `stream`.
//! On a group whose reductions are rank-ordered already (`cuda_local`), and on groups of at most
//! two ranks (one addition per element, commutative), it is the group's own `reduce_scatter`.
//! Elsewhere (`nccl`, which promises no order) it is an all-to-all (rank r receives slice r of
//! every rank) into a stream-ordered temporary, then the received slices summed in rank order by
//! loom's kernel: the bytes of the ring reduce-scatter, one more step of latency.
template <class C, class T>
void ordered_reduce_scatter(C& c, std::span<const T> in, std::span<T> out, cudaStream_t stream) {
  if (reduces_in_rank_order<C> || c.size() <= 2) return c.reduce_scatter(in, out, reduce_op::sum, stream);
  const auto n = static_cast<std::size_t>(c.size()), k = out.size();
  if (in.size() != n * k)
    throw comm_error(-1, loom::detail::scatter_rule("ordered_reduce_scatter", in.size(), out.size(), c.size()));
  T* recv = nullptr;
  LOOM_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&recv), n * k * sizeof(T) + 1, stream));
  c.all_to_all(in, std::span<T>(recv, n * k), stream);
  {
    const cuda::byte_access acc[] = {cuda::reads(std::span<const T>(recv, n * k)), cuda::writes(out)};
    cuda::region reg(stream, "loom ordered sum", acc);
    if (k != 0) {
      LOOM_CUDA_TRY(cudaMemcpyAsync(out.data(), recv, k * sizeof(T), cudaMemcpyDeviceToDevice, stream));
      for (std::size_t q = 1; q < n; ++q) cuda::detail::combine_async(reduce_op::sum, out.data(), recv + q * k, k, stream);
    }
  }
  LOOM_CUDA_TRY(cudaFreeAsync(recv, stream));
}

//! Rank-ordered sum of device memory over a device group, in place, on `stream` (see
//! `ordered_reduce_scatter`): the vector padded with zeros to a multiple of the group size,
//! reduce-scattered in rank order, and the reduced slices all-gathered; the bytes of the ring
//! all-reduce. The group's own `all_reduce` where that is rank-ordered already.
template <class C, class T>
void ordered_all_reduce(C& c, std::span<T> data, cudaStream_t stream) {
  if (reduces_in_rank_order<C> || c.size() <= 2) return c.all_reduce(data, reduce_op::sum, stream);
  const auto n = static_cast<std::size_t>(c.size());
  const std::size_t k = (data.size() + n - 1) / n, N = data.size();
  T *padded = nullptr, *mine = nullptr;
  LOOM_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&padded), n * k * sizeof(T) + 1, stream));
  LOOM_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&mine), k * sizeof(T) + 1, stream));
  LOOM_CUDA_TRY(cudaMemsetAsync(padded + N, 0, (n * k - N) * sizeof(T), stream));
  if (N != 0) LOOM_CUDA_TRY(cudaMemcpyAsync(padded, data.data(), N * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  ordered_reduce_scatter(c, std::span<const T>(padded, n * k), std::span<T>(mine, k), stream);
  c.all_gather(std::span<const T>(mine, k), std::span<T>(padded, n * k), stream);
  if (N != 0) LOOM_CUDA_TRY(cudaMemcpyAsync(data.data(), padded, N * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  LOOM_CUDA_TRY(cudaFreeAsync(mine, stream));
  LOOM_CUDA_TRY(cudaFreeAsync(padded, stream));
}

//! A device group bound to a stream, with the host communicators' collective interface, so that
//! a parallel pattern written over `all_reduce(data, op)`, `all_gather(in, out)`,
//! `reduce_scatter(in, out, op)`, `all_to_all(in, out)` and `copy(from, to)` runs on device
//! memory unchanged (`loom::tp_enter_forward` and the other tensor-parallel operators): each call
//! is enqueued on `stream()` and returns at once; later work on the stream sees its result, as
//! later host code sees a host collective's. `C` is a `device_collective_communicator` or a
//! `counted` one (the counts are then the group's). Reductions are rank-ordered exactly when
//! `C`'s are. Holds a pointer to the group: the group must outlive it.
template <class C>
class on_stream {
 public:
  //! Rank-ordered reductions when the group's are.
  static constexpr bool rank_ordered_reductions = reduces_in_rank_order<C>;
  //! Marks a device group: the sequence-parallel patterns take their device form
  //! (`loom/cuda/patterns.hpp`).
  using device_group_tag = void;
  //! The group's point-to-point request.
  using request = typename C::request;
  //! Binds `group` to `stream`.
  on_stream(C& group, cudaStream_t stream) : c_(&group), s_(stream) {}
  //! This rank's index in the group.
  int rank() const { return c_->rank(); }
  //! The number of ranks.
  int size() const { return c_->size(); }
  //! The group.
  C& group() { return *c_; }
  //! The stream every call enqueues on.
  cudaStream_t stream() const { return s_; }
  //! Sum/max/min of device memory over the group, in place.
  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    c_->all_reduce(data, op, s_);
  }
  //! Every rank's `in` into `out`, in rank order.
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    c_->all_gather(in, out, s_);
  }
  //! This rank's slice of the reduction of `in`.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    c_->reduce_scatter(in, out, op, s_);
  }
  //! Block j of `in` to rank j.
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    c_->all_to_all(in, out, s_);
  }
  //! Rank `root`'s `data` into every rank's.
  template <class T>
  void broadcast(std::span<T> data, int root) {
    c_->broadcast(data, root, s_);
  }
  //! The reduction of every rank's `data` into rank `root`'s.
  template <class T>
  void reduce(std::span<T> data, int root, reduce_op op) {
    c_->reduce(data, root, op, s_);
  }
  //! Rank-ordered sum in place (`loom::ordered_all_reduce` on the stream).
  template <class T>
  void ordered_all_reduce(std::span<T> data) {
    loom::ordered_all_reduce(*c_, data, s_);
  }
  //! Rank-ordered reduce-scatter (`loom::ordered_reduce_scatter` on the stream).
  template <class T>
  void ordered_reduce_scatter(std::span<const T> in, std::span<T> out) {
    loom::ordered_reduce_scatter(*c_, in, out, s_);
  }
  //! `to = from` (device memory, equal sizes), a device-to-device copy on the stream.
  template <class T>
  void copy(std::span<const T> from, std::span<T> to) {
    if (from.empty() || from.data() == to.data()) return;
    LOOM_CUDA_TRY(cudaMemcpyAsync(to.data(), from.data(), from.size_bytes(), cudaMemcpyDeviceToDevice, s_));
  }

 private:
  C* c_;
  cudaStream_t s_;
};

namespace detail {

//! A pool of CUDA events (timing disabled) reused step after step: `next()` hands out the events
//! in order and grows the pool only the first time a step needs more; `rewind()` starts again.
class event_pool {
 public:
  event_pool() = default;
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  event_pool(event_pool&& o) noexcept : events_(std::move(o.events_)), used_(o.used_) { o.events_.clear(); }
  event_pool& operator=(event_pool&& o) noexcept {
    if (this != &o) {
      release();
      events_ = std::move(o.events_);
      used_ = o.used_;
      o.events_.clear();
    }
    return *this;
  }
  ~event_pool() { release(); }
  //! The next event of this step.
  cudaEvent_t next() {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      LOOM_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    return events_[used_++];
  }
  //! Hands the events out again from the first.
  void rewind() noexcept { used_ = 0; }

 private:
  void release() noexcept {
    for (auto e : events_) (void)cudaEventDestroy(e);
    events_.clear();
  }
  std::vector<cudaEvent_t> events_;
  std::size_t used_ = 0;
};

//! Polls `ready()` until it is true, with a short spin then growing sleeps (the device keeps the
//! host free); calls `check()` between polls (it throws on a timeout, an abort or an error).
template <class Ready, class Check>
void poll_until(Ready&& ready, Check&& check) {
  auto sleep = std::chrono::microseconds(0);
  for (int spins = 0; !ready(); ++spins) {
    check();
    if (spins < 16) {
      std::this_thread::yield();
      continue;
    }
    sleep = std::min(std::chrono::microseconds(500), sleep + std::chrono::microseconds(25));
    std::this_thread::sleep_for(sleep);
  }
}

//! True when the work enqueued on `s` so far has finished (throws `cuda_error` on a failure).
inline bool stream_done(cudaStream_t s) {
  const cudaError_t e = cudaStreamQuery(s);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) cuda::detail::throw_cuda(e, "cudaStreamQuery(stream)", __FILE__, __LINE__);
  return true;
}

}  // namespace detail
}  // namespace loom
