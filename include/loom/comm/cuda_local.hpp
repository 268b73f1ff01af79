// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::cuda_local`: all ranks of a pipeline as streams on one GPU, each rank driven by its own
//! host thread, exchanging through device-to-device copies. For developing and profiling a
//! pipeline on one GPU (every rank's kernels share it, so timings show overlap, not speed-up).
//!
//! Transfers, eagerly, with device flags (opt-in: `set_device_flags(true)` or
//! `LOOM_CUDA_LOCAL_DEVICE_FLAGS=1`; off by default since they hang on real GPUs, see below). The receiver pushes nothing and never waits on its host:
//! each receive is published in a per-channel mailbox (destination, size, the event after which
//! the destination is free), and its compute stream waits on the device for a 32-bit flag of that
//! mailbox slot (`cuStreamWaitValue32`). The sender, when it reaches the send (or, if the receive
//! is not posted yet, at its next communication call), enqueues the copy on its send stream for
//! that peer after the producer's event and the receiver's free event, then raises the flag
//! (`cuStreamWriteValue32`). So no host thread waits for another's progress inside a step: the
//! receiver's host runs on, and a sender waits only when it is a whole mailbox (1024 receives)
//! ahead of the receiver, or at the end of the step for receives not posted yet. Flags count laps
//! of the mailbox, so they never need resetting. The stream memory operations come from the driver
//! through `cudaGetDriverEntryPointByVersion` (no link to libcuda); where the driver lacks them,
//! or `set_device_flags(false)`, every rank uses the hand-off below.
//!
//! Why flags are off by default. On an H100 and an H200 (CUDA 13.0, 2026-11-25) eager steps with
//! flags hung: every rank's host thread stopped inside `cuLaunchKernel` (one deep in the driver,
//! the others on its lock) while streams were parked on flags whose writers were still to be
//! launched (a 2-rank step whose rank 1 sleeps, a 4-rank step whose rank 1 throws), and even
//! without a fault a 2-rank V-Half step never finished after many families had passed. Two causes
//! fit and the CUDA documentation warns of both: a kernel's first launch loads its module (lazy
//! loading) and may wait for the whole context, and a parked stream blocks the hardware queue it
//! shares with other streams (`CUDA_DEVICE_MAX_CONNECTIONS`), so a flag's writer can queue behind
//! its own waiter. The first eager step of a world with flags uses the hand-off (it loads every
//! kernel the step launches), which fixed the sleeping-rank hang on the H200 but not the others.
//! The simulator checks the flags' ordering and failure release; the hand-off is the default.
//!
//! Transfers inside a capture (and without device flags): a send posts a small descriptor
//! (source address, size, the producer's event, and where to acknowledge) to the receiver through
//! an in-process `loom::threads` communicator (per-peer FIFO, as everywhere in loom). The
//! receiver, when its program reaches the receive, takes the descriptor (its host waits for the
//! sender's host to have posted it, bounded by the timeout) and enqueues the copy on its receive
//! stream for that peer, after the producer's event and after the event that freed its buffer;
//! its compute stream then waits for the copy's event. That event is the sender's, and the
//! receiver raises the sender's acknowledgement flag once it is recorded, so `wait(send, stream)`
//! makes the sender's stream wait for the copy before the buffer is written again. In a captured
//! step the host hand-off happens once, at capture; replays have none.
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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cuda.h>  // the driver API's types for the stream memory operations (no libcuda is linked)

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

//! One receive published for its sender (the device-flag path).
struct posted_recv {
  std::byte* dst = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t free = nullptr;           // the receiver's; null: free since the step began
  std::atomic<std::uint64_t> seq{0};    // 1 + the transfer's number once published
};

//! The mailbox of one channel (sender -> receiver) on the device-flag path: a ring of published
//! receives and, in device memory, one flag per slot that the sender raises to the slot's lap.
struct mailbox {
  static constexpr std::uint64_t capacity = 1024;  //!< receives published ahead of the sender, at most
  std::unique_ptr<posted_recv[]> slots = std::make_unique<posted_recv[]>(capacity);
  std::uint32_t* flags = nullptr;          // device memory, `capacity` words, zero at first
  std::atomic<std::uint64_t> taken{0};     // transfers the sender has enqueued
  //! The value the flag of transfer `n` is raised to (the slot's lap, from 1).
  static std::uint32_t lap(std::uint64_t n) { return static_cast<std::uint32_t>(n / capacity + 1); }
  mailbox() = default;
  mailbox(const mailbox&) = delete;
  mailbox& operator=(const mailbox&) = delete;
  ~mailbox() {
    if (flags != nullptr) (void)cudaFree(flags);
  }
};

//! The driver's stream memory operations, looked up once (null where the driver lacks them).
struct stream_memops {
  using fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  fn wait = nullptr, write = nullptr;
  static const stream_memops& get() {
    static const stream_memops m = [] {
      stream_memops r;
      auto find = [](const char* name) -> fn {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
          (void)cudaGetLastError();
          return nullptr;
        }
        return reinterpret_cast<fn>(p);
      };
      r.wait = find("cuStreamWaitValue32");
      r.write = find("cuStreamWriteValue32");
      return r;
    }();
    return m;
  }
};

//! Shared by the ranks of one world: the whole-step graph and the channels' mailboxes.
struct shared_graph {
  explicit shared_graph(int n) : boxes(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)) {}
  std::vector<std::unique_ptr<mailbox>> boxes;  // [from * n + to], made by the receiver
  std::mutex m;
  cudaStream_t release = nullptr;  // raises every flag after a failure (made with the first mailbox)
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
    if (release != nullptr) (void)cudaStreamDestroy(release);
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
    bool flagged = false;                   //!< on the device-flag path (else the hand-off)
    std::uint64_t seq = 0;                  //!< device flags: the transfer's number on its channel
    std::uint32_t* flag = nullptr;          //!< device flags, receive: the flag raised after the copy
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
    for (auto& s : send_streams_)
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

  //! Chooses between device flags and the host hand-off for eager steps (`true` uses flags where
  //! the driver has them; the default is the hand-off unless `LOOM_CUDA_LOCAL_DEVICE_FLAGS=1`).
  //! Takes effect at the next `open_channels`, where the ranks agree: one rank without flags makes
  //! every rank use the hand-off.
  void set_device_flags(bool on) { want_flags_ = on; }
  //! Whether eager transfers use device flags (decided by `open_channels`; they start with the
  //! second eager step, see the file's notes on lazy loading).
  bool device_flags() const { return flags_; }

  //! Opens every channel of `chans` that involves this rank (collective): a receive stream and a
  //! mailbox with its device flags for each channel into it, a send stream for each out of it.
  void open_channels(std::span<const channel> chans) {
    const auto n = static_cast<std::size_t>(size());
    recv_streams_.resize(n, nullptr);
    send_streams_.resize(n, nullptr);
    next_send_.resize(n, 0);
    next_recv_.resize(n, 0);
    pending_.resize(n);
    joined_.resize(n, 0);
    auto stream = [&](cudaStream_t& st, const std::string& name) {
      if (st != nullptr) return;
      LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      cuda::name_stream(st, name);
    };
    const auto& ops = detail::stream_memops::get();
    std::int64_t ok = want_flags_ && ops.wait != nullptr && ops.write != nullptr ? 1 : 0;
    if (ok != 0) {
      // Made now, not at a failure: creating a stream then could wait behind the device work
      // that the release must unblock. Only where flags may be used: the hand-off needs none.
      std::lock_guard lk(graph_->m);
      if (graph_->release == nullptr) {
        LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&graph_->release, cudaStreamNonBlocking));
        cuda::name_stream(graph_->release, "cuda_local flag release");
      }
    }
    for (auto const& c : chans) {
      if (c.from < 0 || c.from >= size() || c.to < 0 || c.to >= size() || c.from == c.to) continue;
      if (c.from == rank())
        stream(send_streams_[static_cast<std::size_t>(c.to)], "r" + std::to_string(rank()) + " send->" + std::to_string(c.to));
      if (c.to != rank()) continue;
      stream(recv_streams_[static_cast<std::size_t>(c.from)], "r" + std::to_string(rank()) + " recv<-" + std::to_string(c.from));
      auto& box = graph_->boxes[static_cast<std::size_t>(c.from) * n + static_cast<std::size_t>(rank())];
      if (box) continue;
      auto b = std::make_unique<detail::mailbox>();
      const std::size_t bytes = detail::mailbox::capacity * sizeof(std::uint32_t);
      LOOM_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&b->flags), bytes));
      cuda::name_memory(b->flags, "r" + std::to_string(rank()) + " flags<-" + std::to_string(c.from));
      LOOM_CUDA_TRY(cudaMemset(b->flags, 0, bytes));
      if (ok != 0) {  // the driver takes both operations on this device (a flag of 0 is already 0)
        cudaStream_t st = recv_streams_[static_cast<std::size_t>(c.from)];
        const auto addr = reinterpret_cast<CUdeviceptr>(b->flags);
        ok = ops.write(st, addr, 0, 0) == CUDA_SUCCESS && ops.wait(st, addr, 0, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS &&
             cudaStreamSynchronize(st) == cudaSuccess;
        (void)cudaGetLastError();
      }
      box = std::move(b);
    }
    host_.all_reduce(std::span<std::int64_t>(&ok, 1), reduce_op::min);  // also the barrier: every mailbox exists
    flags_ = ok != 0;
  }

  //! Sends `bytes` (device memory) to `peer` once `ready` has completed.
  request isend(int peer, std::span<const std::byte> bytes, cudaEvent_t ready) {
    if (flagged_now()) {
      box_of(rank(), peer);
      request r;
      r.peer = peer;
      r.flagged = true;
      r.seq = next_send_[static_cast<std::size_t>(peer)]++;
      pending_[static_cast<std::size_t>(peer)].push_back({bytes.data(), bytes.size(), ready, r.seq});
      progress();
      return r;
    }
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
    if (flagged_now()) {
      auto& box = box_of(peer, rank());
      const std::uint64_t n = next_recv_[static_cast<std::size_t>(peer)]++;
      if (n >= box.taken.load(std::memory_order_acquire) + detail::mailbox::capacity)  // the ring is full
        wait_host([&] { return n < box.taken.load(std::memory_order_acquire) + detail::mailbox::capacity; },
                  "waiting for rank " + std::to_string(peer) + " to take a receive");
      auto& slot = box.slots[n % detail::mailbox::capacity];
      slot.dst = bytes.data();
      slot.bytes = bytes.size();
      slot.free = free;
      cuda::host_release(&slot);
      slot.seq.store(n + 1, std::memory_order_release);
      request r;
      r.peer = peer;
      r.is_recv = true;
      r.flagged = true;
      r.seq = n;
      r.flag = box.flags + n % detail::mailbox::capacity;
      progress();
      return r;
    }
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

  //! Makes `stream` wait for the transfer. Device flags: a receive waits for its flag, a send for
  //! its copy (enqueued now if its receive was not yet published). Hand-off: a receive enqueues
  //! the copy (once the sender posted) and waits for it; a send waits for the receiver's copy.
  void wait(request& r, cudaStream_t stream) {
    if (r.flagged) {
      const auto p = static_cast<std::size_t>(r.peer);
      if (r.is_recv) {
        host_.check();
        progress();
        const auto& ops = detail::stream_memops::get();
        try_driver(ops.wait(stream, reinterpret_cast<CUdeviceptr>(r.flag), detail::mailbox::lap(r.seq), CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue32");
        return;
      }
      flush(p);  // the copy is enqueued
      if (joined_[p] <= r.seq) {  // one event covers every copy enqueued to the peer so far
        cudaEvent_t e = events_.next();
        LOOM_CUDA_TRY(cudaEventRecord(e, send_streams_[p]));
        LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, e, 0));
        joined_[p] = next_send_[p];
      }
      return;
    }
    host_.wait(r.host);
    r.host = threads::request{};
    if (!r.is_recv) {
      auto* ack = &r.slot->ack;
      wait_host([&] { return ack->load(std::memory_order_acquire); }, "waiting for rank " + std::to_string(r.peer) + " to copy a send");
      LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, r.slot->d.done, 0));
      return;
    }
    const detail::descriptor d = r.slot->d;
    cudaStream_t s = recv_streams_[static_cast<std::size_t>(r.peer)];
    copy(s, r.peer, rank(), d.src, d.bytes, d.ready, r.dst, r.bytes, r.free);
    LOOM_CUDA_TRY(cudaEventRecord(d.done, s));
    LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, d.done, 0));
    d.ack->store(true, std::memory_order_release);  // the sender may wait for the copy now
  }

  //! Starts a step: the send and receive streams fork from `stream`.
  void begin_step(cudaStream_t stream) {
    events_.rewind();
    next_desc_ = 0;
    std::fill(joined_.begin(), joined_.end(), 0);
    cudaEvent_t e = events_.next();
    LOOM_CUDA_TRY(cudaEventRecord(e, stream));
    for (auto* v : {&recv_streams_, &send_streams_})
      for (auto s : *v)
        if (s != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(s, e, 0));
  }

  //! Ends a step: the pending sends are enqueued and `stream` joins the send and receive streams.
  void end_step(cudaStream_t stream) {
    for (std::size_t p = 0; p < pending_.size(); ++p) flush(p);
    for (auto* v : {&recv_streams_, &send_streams_})
      for (auto s : *v) {
        if (s == nullptr) continue;
        cudaEvent_t e = events_.next();
        LOOM_CUDA_TRY(cudaEventRecord(e, s));
        LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, e, 0));
      }
    if (!capturing_) warmed_ = true;  // every kernel of the step is loaded: flags from now on
  }

  //! Waits on the host until `stream`'s work has finished, bounded by the timeout; an abort by
  //! any rank ends the wait.
  void synchronize(cudaStream_t stream) {
    wait_host([&] { return loom::detail::stream_done(stream); }, "waiting for its CUDA stream to finish the step");
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
    capturing_ = true;  // a captured step uses the hand-off: a flag's value would be frozen into the graph
    LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, graph_->fork, 0));
  }

  //! Ends the capture begun by `begin_capture` and instantiates the graph (collective).
  void end_capture(cudaStream_t stream) {
    capturing_ = false;
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
  void abort(std::string reason) {
    release_flags();
    host_.abort(std::move(reason));
  }
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
  //! Enqueues on `st` the copy of a transfer `from` -> `to` (one of them is this rank): after the
  //! producer's event `ready` and the event `free` that frees the destination (either may be
  //! null), as one region the race detector sees. Sizes must match.
  void copy(cudaStream_t st, int from, int to, const std::byte* src, std::size_t bytes, cudaEvent_t ready, std::byte* dst,
            std::size_t expected, cudaEvent_t free) {
    if (bytes != expected)
      throw comm_error(host_.world_rank(), "cuda_local: rank " + std::to_string(from) + " sent " + std::to_string(bytes) +
                                               " bytes to rank " + std::to_string(to) + ", whose matching receive expects " +
                                               std::to_string(expected) + " bytes");
    if (ready != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(st, ready, 0));
    if (free != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(st, free, 0));
    if (labels_.empty())  // "copy rF -> rT" for every peer, into this rank then out of it
      for (int in : {1, 0})
        for (int p = 0; p < size(); ++p)
          labels_.push_back("copy r" + std::to_string(in ? p : rank()) + " -> r" + std::to_string(in ? rank() : p));
    const int peer = from == rank() ? to : from;
    const auto label = labels_[static_cast<std::size_t>((from == rank() ? size() : 0) + peer)].c_str();
    const cuda::byte_access acc[] = {{src, bytes, false}, {dst, bytes, true}};
    cuda::region reg(st, label, acc);
    LOOM_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  }

  //! A send waiting for its receive to be published (device flags).
  struct pending_send {
    const std::byte* src = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t ready = nullptr;
    std::uint64_t seq = 0;
  };

  //! The mailbox of the channel `from` -> `to` (one of them is this rank).
  detail::mailbox& box_of(int from, int to) {
    const int peer = from == rank() ? to : from;
    if (peer < 0 || peer >= size() || peer == rank() || !graph_->boxes[static_cast<std::size_t>(from * size() + to)])
      throw comm_error(host_.world_rank(), "cuda_local: no channel from rank " + std::to_string(from) + " to rank " +
                                               std::to_string(to) + " was opened (open_channels)");
    return *graph_->boxes[static_cast<std::size_t>(from * size() + to)];
  }
  void try_driver(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS)
      throw comm_error(host_.world_rank(), "cuda_local: " + std::string(call) + " failed (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  }
  //! Waits on the host until `ready()`, bounded by the timeout; an abort by any rank ends it.
  template <class Ready>
  void wait_host(Ready&& ready, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    loom::detail::poll_until(ready, [&] {
      host_.check();
      if (std::chrono::steady_clock::now() > deadline) host_.timed_out(what);
    });
  }
  //! Enqueues the pending sends whose receives are published, in order per peer.
  void progress() {
    for (std::size_t p = 0; p < pending_.size(); ++p)
      while (!pending_[p].empty() && push(p, false)) {}
  }
  //! Enqueues every pending send to `p`, waiting on the host for their receives to be published.
  void flush(std::size_t p) {
    while (!pending_[p].empty()) push(p, true);
  }
  //! Enqueues the oldest pending send to `p` if its receive is published (or, with `block`, once
  //! it is): the copy on the send stream after the producer's and the receiver's events, then the
  //! flag. Returns whether it was enqueued.
  bool push(std::size_t p, bool block) {
    host_.check();  // after an abort the receiver may have freed its buffers: push nothing more
    auto& box = box_of(rank(), static_cast<int>(p));
    const pending_send s = pending_[p].front();
    auto& slot = box.slots[s.seq % detail::mailbox::capacity];
    auto published = [&] { return slot.seq.load(std::memory_order_acquire) == s.seq + 1; };
    if (!published()) {
      if (!block) return false;
      wait_host(published, "waiting for rank " + std::to_string(p) + " to post the receive of a send");
    }
    cuda::host_acquire(&slot);
    cudaStream_t st = send_streams_[p];
    copy(st, rank(), static_cast<int>(p), s.src, s.bytes, s.ready, slot.dst, slot.bytes, slot.free);
    const auto flag = reinterpret_cast<CUdeviceptr>(box.flags + s.seq % detail::mailbox::capacity);
    try_driver(detail::stream_memops::get().write(st, flag, detail::mailbox::lap(s.seq), 0), "cuStreamWriteValue32");
    box.taken.store(s.seq + 1, std::memory_order_release);  // the slot may be published again
    pending_[p].pop_front();
    return true;
  }
  //! After a failure: raises every flag of every channel of the world, so that no stream waits
  //! forever on one (the data is garbage; the world is aborted). The rank that aborts first does
  //! it for all ranks before the abort is published, so no rank depends on another rank's host
  //! thread still making CUDA calls (one may already be freeing memory, which waits for the whole
  //! device); the ranks that abort after it repeat it harmlessly.
  void release_flags() noexcept {
    if (graph_->release == nullptr || !flags_) return;  // no stream waits on a flag
    for (auto& b : graph_->boxes)
      if (b && b->flags != nullptr)  // 0x7f7f7f7f is at or after every lap in the flags' cyclic order
        (void)cudaMemsetAsync(b->flags, 0x7f, detail::mailbox::capacity * sizeof(std::uint32_t), graph_->release);
    (void)cudaGetLastError();
  }
  //! Whether this transfer uses device flags: decided, eager, and not the world's first step.
  bool flagged_now() const { return flags_ && warmed_ && !capturing_; }
  //! `LOOM_CUDA_LOCAL_DEVICE_FLAGS=1` makes device flags every world's default.
  static bool flags_requested_by_environment() {
    const char* v = std::getenv("LOOM_CUDA_LOCAL_DEVICE_FLAGS");
    return v != nullptr && std::string_view(v) == "1";
  }

  threads::comm host_;
  int device_ = 0;
  std::shared_ptr<detail::shared_graph> graph_;
  std::vector<cudaStream_t> recv_streams_;
  loom::detail::event_pool events_;
  std::vector<std::unique_ptr<detail::transfer_slot[]>> descs_;
  std::size_t next_desc_ = 0;
  std::vector<std::string> labels_;  // copy labels: from each peer, then to each peer
  std::chrono::milliseconds timeout_ = default_comm_timeout;
  // Device flags.
  bool want_flags_ = flags_requested_by_environment(), flags_ = false, capturing_ = false, warmed_ = false;
  std::vector<cudaStream_t> send_streams_;
  std::vector<std::uint64_t> next_send_, next_recv_;  // per peer: transfers so far
  std::vector<std::deque<pending_send>> pending_;     // per peer: sends whose receive is not published yet
  std::vector<std::uint64_t> joined_;                 // per peer: sends the compute stream waited for this step
};

static_assert(device_communicator<comm>);

//! The `n` ranks of a new world on `device` (rank i at index i).
inline std::vector<comm> world(int n, int device = 0) {
  auto hosts = threads::world(n);
  auto g = std::make_shared<detail::shared_graph>(n);
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
  auto g = std::make_shared<detail::shared_graph>(n);
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
