// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::cuda_local`: all ranks of a pipeline as streams on one GPU, each rank driven by its own
//! host thread, exchanging through device-to-device copies. For developing and profiling a
//! pipeline on one GPU (every rank's kernels share it, so timings show overlap, not speed-up).
//!
//! Transfers. A send posts a small descriptor (source address, size, the producer's event, and
//! where to acknowledge) to the receiver through an in-process `loom::threads` communicator
//! (per-peer FIFO, as everywhere in loom). The receiver, when its program reaches the receive,
//! takes the descriptor (its host waits for the sender's host to have posted it, bounded by the
//! timeout: hosts run ahead of the device, so this is a hand-off between threads, never a wait
//! for the GPU) and enqueues the copy on its receive stream for that peer, after the producer's
//! event and after the event that freed its buffer; its compute stream then waits for the copy's
//! event. That event is the sender's (it travels in the descriptor, so it outlives the copy
//! whatever the receiver does next), and the receiver raises the sender's acknowledgement flag
//! once it is recorded. So the copy starts as soon as both buffers are ready on the device, and
//! `wait(send, stream)` makes the sender's stream wait for the copy before the buffer is written
//! again.
//!
//! Graphs. `begin_capture` / `end_capture` capture the whole step of every rank into one graph:
//! rank 0 begins a relaxed-mode capture on an origin stream, every rank's stream forks from it,
//! and joins back at the end; `launch` replays it (rank 0 launches, every rank's stream waits for
//! the replay). All three are collective.
//!
//! Failures: the host side is a `threads` communicator, so a timeout, an abort or an exception
//! on any rank ends every rank's waits with a `comm_error` naming the rank and the cause.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/device.hpp"
#include "loom/comm/threads.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/stream.hpp"

namespace loom::cuda_local {

namespace detail {

//! What a send tells its receiver.
struct descriptor {
  const std::byte* src = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t ready = nullptr;      // the producer's event (the sender's)
  cudaEvent_t done = nullptr;       // recorded after the copy (the sender's)
  std::atomic<bool>* ack = nullptr;  // raised once `done` is recorded
};

//! A rank's record of one transfer: the descriptor and, for a send, the acknowledgement.
struct transfer_slot {
  descriptor d;
  std::atomic<bool> ack{false};
};

//! Shared by the ranks of one world: the whole-step graph.
struct shared_graph {
  std::mutex m;
  cudaStream_t origin = nullptr;
  cudaEvent_t fork = nullptr, done = nullptr;
  std::vector<cudaEvent_t> joins;
  cudaGraphExec_t exec = nullptr;
  ~shared_graph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    for (auto e : joins)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (fork != nullptr) (void)cudaEventDestroy(fork);
    if (done != nullptr) (void)cudaEventDestroy(done);
    if (origin != nullptr) (void)cudaStreamDestroy(origin);
  }
};

}  // namespace detail

//! One rank of a `cuda_local` world (see the file comment). Movable; driven by one thread.
class comm {
 public:
  //! A posted send or receive.
  struct request {
    threads::request host;                  //!< the descriptor's hand-off
    detail::transfer_slot* slot = nullptr;  //!< the descriptor (a slot of the rank's pool)
    std::byte* dst = nullptr;               //!< receive: destination
    std::size_t bytes = 0;                  //!< receive: expected size
    cudaEvent_t free = nullptr;             //!< receive: the destination is free after this event
    int peer = -1;                          //!< the other rank
    bool is_recv = false;                   //!< receive (else send)
  };

  //! Rank `host.rank()` of a world whose host side is `host`, running on `device`; `graph` is
  //! shared by the ranks of the world (`world()` makes both).
  comm(threads::comm host, int device, std::shared_ptr<detail::shared_graph> graph)
      : host_(std::move(host)), device_(device), graph_(std::move(graph)) {}

  comm(comm&&) noexcept = default;
  comm& operator=(comm&&) noexcept = default;
  ~comm() {
    for (auto& s : recv_streams_)
      if (s != nullptr) (void)cudaStreamDestroy(s);
  }

  //! This rank.
  int rank() const { return host_.rank(); }
  //! The number of ranks.
  int size() const { return host_.size(); }
  //! The device every rank of the world uses.
  int device() const { return device_; }
  //! The host-side communicator (collectives over host memory, barrier, abort).
  threads::comm& host() { return host_; }

  //! Creates a receive stream for every channel into this rank (collective).
  void open_channels(std::span<const channel> chans) {
    recv_streams_.assign(static_cast<std::size_t>(size()), nullptr);
    for (auto const& c : chans) {
      if (c.to != rank() || c.from < 0 || c.from >= size() || c.from == rank()) continue;
      auto& s = recv_streams_[static_cast<std::size_t>(c.from)];
      if (s != nullptr) continue;
      LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      cuda::name_stream(s, "r" + std::to_string(rank()) + " recv<-" + std::to_string(c.from));
    }
    host_.barrier();
  }

  //! Sends `bytes` (device memory) to `peer` once `ready` has completed.
  request isend(int peer, std::span<const std::byte> bytes, cudaEvent_t ready) {
    auto* t = next_slot();
    t->ack.store(false, std::memory_order_relaxed);
    t->d = {bytes.data(), bytes.size(), ready, events_.next(), &t->ack};
    request r;
    r.slot = t;
    r.peer = peer;
    r.host = host_.isend(peer, std::as_bytes(std::span<const detail::descriptor>(&t->d, 1)));
    return r;
  }

  //! Receives into `bytes` (device memory) from `peer`, not before `free` (may be null).
  request irecv(int peer, std::span<std::byte> bytes, cudaEvent_t free) {
    if (peer < 0 || peer >= static_cast<int>(recv_streams_.size()) || recv_streams_[static_cast<std::size_t>(peer)] == nullptr)
      throw comm_error(host_.world_rank(), "cuda_local: no channel from rank " + std::to_string(peer) + " to rank " +
                                               std::to_string(rank()) + " was opened (open_channels)");
    auto* t = next_slot();
    request r;
    r.slot = t;
    r.dst = bytes.data();
    r.bytes = bytes.size();
    r.free = free;
    r.peer = peer;
    r.is_recv = true;
    r.host = host_.irecv(peer, std::as_writable_bytes(std::span<detail::descriptor>(&t->d, 1)));
    return r;
  }

  //! Receive: enqueues the copy (once the sender posted) and makes `stream` wait for it. Send:
  //! makes `stream` wait for the receiver's copy (once the receiver enqueued it).
  void wait(request& r, cudaStream_t stream) {
    host_.wait(r.host);
    r.host = threads::request{};
    if (!r.is_recv) {
      auto* ack = &r.slot->ack;
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      loom::detail::poll_until([&] { return ack->load(std::memory_order_acquire); }, [&] {
        host_.check();
        if (std::chrono::steady_clock::now() > deadline)
          host_.timed_out("waiting for rank " + std::to_string(r.peer) + " to copy a send");
      });
      LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, r.slot->d.done, 0));
      return;
    }
    const detail::descriptor d = r.slot->d;
    if (d.bytes != r.bytes)
      throw comm_error(host_.world_rank(), "cuda_local: rank " + std::to_string(r.peer) + " sent " + std::to_string(d.bytes) +
                                               " bytes to rank " + std::to_string(rank()) + ", whose matching receive expects " +
                                               std::to_string(r.bytes) + " bytes");
    cudaStream_t s = recv_streams_[static_cast<std::size_t>(r.peer)];
    if (d.ready != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(s, d.ready, 0));
    if (r.free != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(s, r.free, 0));
    {
      const cuda::byte_access acc[] = {{d.src, d.bytes, false}, {r.dst, r.bytes, true}};
      cuda::region reg(s, copy_label(r.peer), acc);
      LOOM_CUDA_TRY(cudaMemcpyAsync(r.dst, d.src, d.bytes, cudaMemcpyDeviceToDevice, s));
    }
    LOOM_CUDA_TRY(cudaEventRecord(d.done, s));
    LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, d.done, 0));
    d.ack->store(true, std::memory_order_release);  // the sender may wait for the copy now
  }

  //! Starts a step: the receive streams fork from `stream`.
  void begin_step(cudaStream_t stream) {
    events_.rewind();
    next_desc_ = 0;
    cudaEvent_t e = events_.next();
    LOOM_CUDA_TRY(cudaEventRecord(e, stream));
    for (auto s : recv_streams_)
      if (s != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(s, e, 0));
  }

  //! Ends a step: `stream` joins the receive streams.
  void end_step(cudaStream_t stream) {
    for (auto s : recv_streams_) {
      if (s == nullptr) continue;
      cudaEvent_t e = events_.next();
      LOOM_CUDA_TRY(cudaEventRecord(e, s));
      LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, e, 0));
    }
  }

  //! Waits on the host until `stream`'s work has finished, bounded by the timeout; an abort by
  //! any rank ends the wait.
  void synchronize(cudaStream_t stream) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    loom::detail::poll_until([&] { return loom::detail::stream_done(stream); }, [&] {
      host_.check();
      if (std::chrono::steady_clock::now() > deadline) host_.timed_out("waiting for its CUDA stream to finish the step");
    });
  }

  //! Begins capturing the whole step of every rank into one graph (collective).
  void begin_capture(cudaStream_t stream) {
    if (rank() == 0) {
      std::lock_guard lk(graph_->m);
      if (graph_->origin == nullptr) {
        LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&graph_->origin, cudaStreamNonBlocking));
        cuda::name_stream(graph_->origin, "cuda_local graph origin");
        LOOM_CUDA_TRY(cudaEventCreateWithFlags(&graph_->fork, cudaEventDisableTiming));
        LOOM_CUDA_TRY(cudaEventCreateWithFlags(&graph_->done, cudaEventDisableTiming));
        graph_->joins.assign(static_cast<std::size_t>(size()), nullptr);
        for (auto& e : graph_->joins) LOOM_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
      LOOM_CUDA_TRY(cudaStreamBeginCapture(graph_->origin, cudaStreamCaptureModeRelaxed));
      LOOM_CUDA_TRY(cudaEventRecord(graph_->fork, graph_->origin));
    }
    host_.barrier();
    LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, graph_->fork, 0));
  }

  //! Ends the capture begun by `begin_capture` and instantiates the graph (collective).
  void end_capture(cudaStream_t stream) {
    LOOM_CUDA_TRY(cudaEventRecord(graph_->joins[static_cast<std::size_t>(rank())], stream));
    host_.barrier();
    std::int64_t ok = 1;
    std::string why;
    if (rank() == 0) {
      try {
        for (auto e : graph_->joins) LOOM_CUDA_TRY(cudaStreamWaitEvent(graph_->origin, e, 0));
        cudaGraph_t g = nullptr;
        LOOM_CUDA_TRY(cudaStreamEndCapture(graph_->origin, &g));
        cudaGraphExec_t x = nullptr;
        const cudaError_t e = cudaGraphInstantiate(&x, g, 0);
        (void)cudaGraphDestroy(g);
        LOOM_CUDA_TRY(e);
        if (graph_->exec != nullptr) (void)cudaGraphExecDestroy(graph_->exec);
        graph_->exec = x;
      } catch (const std::exception& e) {
        ok = 0;
        why = e.what();
      }
    }
    std::int64_t all = ok;
    host_.all_reduce(std::span<std::int64_t>(&all, 1), reduce_op::min);
    if (all == 0) {
      if (rank() == 0) throw comm_error(host_.world_rank(), "cuda_local: capturing the step failed: " + why);
      throw comm_error(0, "cuda_local: capturing the step failed on rank 0");
    }
  }

  //! Replays the captured step (collective): `stream`'s later work waits for the replay.
  void launch(cudaStream_t stream) {
    // The replay runs on rank 0's origin stream: it must follow every rank's work since the last
    // replay (parameter updates, batch copies), and every rank must be done with its results.
    LOOM_CUDA_TRY(cudaEventRecord(graph_->joins[static_cast<std::size_t>(rank())], stream));
    host_.barrier();
    if (rank() == 0) {
      for (auto e : graph_->joins) LOOM_CUDA_TRY(cudaStreamWaitEvent(graph_->origin, e, 0));
      LOOM_CUDA_TRY(cudaGraphLaunch(graph_->exec, graph_->origin));
      LOOM_CUDA_TRY(cudaEventRecord(graph_->done, graph_->origin));
    }
    host_.barrier();
    LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, graph_->done, 0));
  }

  //! Sum/max/min over ranks of host memory (blocking, bounded).
  void all_reduce(std::span<std::int64_t> v, reduce_op op) { host_.all_reduce(v, op); }
  //! Sum/max/min over ranks of host memory (blocking, bounded).
  void all_reduce(std::span<double> v, reduce_op op) { host_.all_reduce(v, op); }
  //! Aborts every rank's pending and later calls, naming this rank and `reason`.
  void abort(std::string reason) { host_.abort(std::move(reason)); }
  //! Bounds every later wait.
  void set_timeout(std::chrono::milliseconds t) {
    host_.set_timeout(t);
    timeout_ = t;
  }

 private:
  detail::transfer_slot* next_slot() {
    // Slots live in chunks that never move (a request, and a peer's acknowledgement, point into
    // them) and are reused step after step: the first step grows the pool, later ones allocate
    // nothing. A slot is reused only after the step that used it ended on every rank.
    const std::size_t chunk = 64, i = next_desc_++;
    if (i / chunk >= descs_.size()) descs_.push_back(std::make_unique<detail::transfer_slot[]>(chunk));
    return &descs_[i / chunk][i % chunk];
  }
  const char* copy_label(int peer) {
    if (labels_.empty())
      for (int p = 0; p < size(); ++p) labels_.push_back("copy r" + std::to_string(p) + " -> r" + std::to_string(rank()));
    return labels_[static_cast<std::size_t>(peer)].c_str();
  }

  threads::comm host_;
  int device_ = 0;
  std::shared_ptr<detail::shared_graph> graph_;
  std::vector<cudaStream_t> recv_streams_;
  loom::detail::event_pool events_;
  std::vector<std::unique_ptr<detail::transfer_slot[]>> descs_;
  std::size_t next_desc_ = 0;
  std::vector<std::string> labels_;
  std::chrono::milliseconds timeout_ = default_comm_timeout;
};

static_assert(device_communicator<comm>);

//! The `n` ranks of a new world on `device` (rank i at index i).
inline std::vector<comm> world(int n, int device = 0) {
  auto hosts = threads::world(n);
  auto g = std::make_shared<detail::shared_graph>();
  std::vector<comm> out;
  out.reserve(static_cast<std::size_t>(n));
  for (auto& h : hosts) out.emplace_back(std::move(h), device, g);
  return out;
}

//! Runs `f(comm&)` for every rank of a new `n`-rank world on `device`, each on its own thread
//! (the thread's current device is `device`, and it is named "rank r" for Nsight Systems and the
//! simulator). Failures as `loom::run_threads`: the first exception aborts the world and is
//! rethrown after every thread has been joined.
template <class F>
  requires std::invocable<F&, comm&>
void run(int n, F f, int device = 0, std::chrono::milliseconds timeout = default_comm_timeout) {
  auto g = std::make_shared<detail::shared_graph>();
  loom::run_threads(n, [&](threads::comm& h) {
    LOOM_CUDA_TRY(cudaSetDevice(device));
    cuda::name_thread("rank " + std::to_string(h.rank()));
    // The rank's handle on the world; `h` stays in run_threads' hands for its error handling.
    comm c(h.split(0, h.rank()), device, g);
    c.set_timeout(timeout);
    f(c);
  }, timeout);
}

}  // namespace loom::cuda_local
