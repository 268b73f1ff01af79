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
#include "loom/cuda/error.hpp"

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
