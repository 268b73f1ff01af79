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
//! Collectives over device memory (`all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`,
//! `broadcast`, each with a `stream`), NCCL's stream-ordered model: the collective starts after
//! the work enqueued on each rank's `stream` so far, and later work on it sees the result. Every
//! rank's buffers are in one address space (one GPU), so a collective is device-to-device copies
//! and loom's own reduction kernel (`loom/cuda/kernels.hpp`) that each rank enqueues on its own
//! stream, reading the other ranks' buffers directly. The ranks exchange their buffer addresses
//! and CUDA events through the host communicator, and each phase waits for the events of the
//! phase before on every rank; so a collective costs one host exchange and one host barrier per
//! phase (one phase; two for `all_reduce`), and no host thread waits for device work.
//! - Reductions combine the ranks in rank order, `((x_0 op x_1) op x_2) ...`, on every element:
//!   `all_reduce` is a reduce-scatter (rank r reduces slice r of the buffer into a scratch buffer
//!   of its own) followed by an all-gather of the slices; the results are bitwise those of the
//!   threads backend and the simulator's NCCL (`rank_ordered_reductions`).
//! - Reductions take `float` and `double`; the copies any trivially copyable element type.
//! - `all_reduce`'s scratch buffer grows (`cudaMalloc`) the first time a larger buffer is reduced:
//!   do that once outside a graph capture. A grown-out buffer is kept until the communicator goes
//!   (another rank may still read it).
//! - A collective ends when every rank's phase has ended: each rank's `stream` then waits for
//!   all of them, so no rank writes a buffer another still reads. The next collective on the
//!   communicator also waits for them, whatever stream it is on.
//! - Every copy and reduction is a simulator region ("cuda_local all_reduce r1 (reduce)") that
//!   names the bytes it reads and writes, so the race detector checks collectives against the
//!   compute streams as it checks transfers.
//! - `split(color, key)` is the threads backend's split of the host side; the ranks of each new
//!   group share a new world state (mailboxes, graph).
//!
//! Failures: the host side is a `threads` communicator, so a timeout, an abort or an exception
//! on any rank ends every rank's waits with a `comm_error` naming the rank and the cause.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda.h>  // the driver API's types for the stream memory operations (no libcuda is linked)

#include "loom/comm/device.hpp"
#include "loom/comm/threads.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/kernels.hpp"
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
  explicit shared_graph(int n)
      : boxes(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)), coll_events(static_cast<std::size_t>(n)) {}
  std::vector<std::unique_ptr<mailbox>> boxes;  // [from * n + to], made by the receiver
  // Per rank, the events of three collectives in turn (made and recorded by that rank, waited
  // for by every rank: they live as long as the world, so no rank waits on a destroyed one).
  std::vector<std::array<std::vector<cudaEvent_t>, 3>> coll_events;
  std::mutex m;
  cudaStream_t release = nullptr;  // raises every flag after a failure (made with the first mailbox)
  cudaStream_t origin = nullptr;
  cudaEvent_t fork = nullptr, done = nullptr;
  std::vector<cudaEvent_t> joins;
  cudaGraphExec_t exec = nullptr;
  ~shared_graph() {
    for (auto& sets : coll_events)
      for (auto& set : sets)
        for (auto e : set) (void)cudaEventDestroy(e);
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
  //! Releases this communicator's streams and scratch, then takes `o`'s (a moved-from
  //! communicator holds none: its vectors are empty).
  comm& operator=(comm&& o) noexcept {
    if (this != &o) {
      this->~comm();
      ::new (static_cast<void*>(this)) comm(std::move(o));
    }
    return *this;
  }
  ~comm() {
    for (auto& s : recv_streams_)
      if (s != nullptr) (void)cudaStreamDestroy(s);
    for (auto& s : send_streams_)
      if (s != nullptr) (void)cudaStreamDestroy(s);
    for (auto* p : scratch_)
      if (p != nullptr) (void)cudaFree(p);
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

  //! Device memory this rank allocates for each channel into it that `open_channels` opens (the
  //! mailbox of device flags).
  static constexpr std::size_t channel_bytes = detail::mailbox::capacity * sizeof(std::uint32_t);
  //! Bytes of scratch an `all_reduce` of `bytes` bytes of `T` over this group needs (its slice of
  //! the reduce-scatter, plus one element).
  template <class T>
  std::size_t all_reduce_scratch(std::size_t bytes) const {
    return bytes / static_cast<std::size_t>(size()) + sizeof(T);
  }
  //! Makes the reductions' scratch at least `bytes` (one `cudaMalloc` when it grows; the old
  //! buffer stays until the communicator goes, a peer may still read it). Collectives grow it
  //! themselves; a caller that reserves their largest need first (outside a capture) makes the
  //! group's scratch exactly that (`loom::data_parallel` does at `attach`).
  void reserve_scratch(std::size_t bytes) {
    if (bytes <= scratch_bytes_) return;
    void* p = nullptr;
    LOOM_CUDA_TRY(cudaMalloc(&p, bytes));
    cuda::name_memory(p, "r" + std::to_string(rank()) + " cuda_local collective scratch");
    scratch_.push_back(p);
    scratch_bytes_ = bytes;
  }
  //! Bytes of the reductions' scratch now in use (older, smaller buffers are kept too).
  std::size_t scratch_bytes() const { return scratch_bytes_; }

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

  //! Rank-ordered reductions: `((x_0 op x_1) op x_2) ...` on every rank (see the file comment).
  static constexpr bool rank_ordered_reductions = true;

  //! Reduces `data` (device memory) over the ranks in place, in rank order, on `stream` (see the
  //! file comment). `float` or `double`; every rank passes the same size.
  template <class T>
  void all_reduce(std::span<T> data, reduce_op op, cudaStream_t stream) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "cuda_local reductions take float or double");
    const auto n = static_cast<std::size_t>(size());
    auto& d = exchange("all_reduce", data.data(), data.data(), data.size_bytes(), stream, 2, all_reduce_scratch<T>(data.size_bytes()));
    // Phase 1: slice r of every rank's buffer, reduced into this rank's scratch.
    const auto [lo, hi] = slice(data.size(), rank());
    T* mine = reinterpret_cast<T*>(scratch_.back());
    {
      std::vector<cuda::byte_access> acc;
      for (std::size_t q = 0; q < n; ++q) acc.push_back({at<T>(d[q].in, lo), (hi - lo) * sizeof(T), false});
      acc.push_back({mine, (hi - lo) * sizeof(T), true});
      cuda::region reg(stream, label(0), acc);
      if (hi > lo) {
        LOOM_CUDA_TRY(cudaMemcpyAsync(mine, at<T>(d[0].in, lo), (hi - lo) * sizeof(T), cudaMemcpyDeviceToDevice, stream));
        for (std::size_t q = 1; q < n; ++q) cuda::detail::combine_async(op, mine, at<T>(d[q].in, lo), hi - lo, stream);
      }
    }
    phase_end(d, 0, stream);
    // Phase 2: every rank's reduced slice, copied into this rank's buffer.
    {
      std::vector<cuda::byte_access> acc;
      for (std::size_t q = 0; q < n; ++q) {
        const auto [qlo, qhi] = slice(data.size(), static_cast<int>(q));
        acc.push_back({reinterpret_cast<const T*>(d[q].scratch), (qhi - qlo) * sizeof(T), false});
        acc.push_back({data.data() + qlo, (qhi - qlo) * sizeof(T), true});
      }
      cuda::region reg(stream, label(1), acc);
      for (std::size_t q = 0; q < n; ++q) {
        const auto [qlo, qhi] = slice(data.size(), static_cast<int>(q));
        if (qhi > qlo)
          LOOM_CUDA_TRY(cudaMemcpyAsync(data.data() + qlo, reinterpret_cast<const T*>(d[q].scratch), (qhi - qlo) * sizeof(T),
                                        cudaMemcpyDeviceToDevice, stream));
      }
    }
    phase_end(d, 1, stream);
  }

  //! Gathers every rank's `in` into `out` (device memory), rank r's at `r * in.size()`, on
  //! `stream`. `in` may be this rank's segment of `out` (NCCL's in-place form); no other overlap.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void all_gather(std::span<const T> in, std::span<T> out, cudaStream_t stream) {
    check_sizes(loom::detail::gather_rule("cuda_local all_gather", in.size(), out.size(), size()));
    const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank()) * in.size();
    if (!in_place && loom::detail::overlapping(in.data(), in.size(), static_cast<const T*>(out.data()), out.size()))
      check_sizes("cuda_local all_gather: input and output overlap (other than the in-place form)");
    auto& d = exchange("all_gather", in.data(), out.data(), in.size_bytes(), stream, 1, 0);
    std::vector<cuda::byte_access> acc;
    for (std::size_t q = 0; q < d.size(); ++q) {
      if (d[q].in == out.data() + q * in.size()) continue;  // this rank's own segment, in place: no copy
      acc.push_back({d[q].in, in.size_bytes(), false});
      acc.push_back({out.data() + q * in.size(), in.size_bytes(), true});
    }
    cuda::region reg(stream, label(0), acc);
    for (std::size_t q = 0; q < d.size(); ++q)
      copy_if(out.data() + q * in.size(), static_cast<const T*>(d[q].in), in.size_bytes(), stream);
    phase_end(d, 0, stream);
  }

  //! Reduces `in` (device memory, `size()` slices of `out.size()`) over the ranks in rank order;
  //! `out` receives slice `rank()` of the result, on `stream`. `float` or `double`; `in` and `out`
  //! must not overlap.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, cudaStream_t stream) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "cuda_local reductions take float or double");
    check_sizes(loom::detail::scatter_rule("cuda_local reduce_scatter", in.size(), out.size(), size()));
    if (loom::detail::overlapping(in.data(), in.size(), static_cast<const T*>(out.data()), out.size()))
      check_sizes("cuda_local reduce_scatter: input and output overlap");
    auto& d = exchange("reduce_scatter", in.data(), out.data(), in.size_bytes(), stream, 1, 0);
    const std::size_t lo = static_cast<std::size_t>(rank()) * out.size();
    std::vector<cuda::byte_access> acc;
    for (std::size_t q = 0; q < d.size(); ++q) acc.push_back({at<T>(d[q].in, lo), out.size_bytes(), false});
    acc.push_back({out.data(), out.size_bytes(), true});
    cuda::region reg(stream, label(0), acc);
    if (!out.empty()) {
      LOOM_CUDA_TRY(cudaMemcpyAsync(out.data(), at<T>(d[0].in, lo), out.size_bytes(), cudaMemcpyDeviceToDevice, stream));
      for (std::size_t q = 1; q < d.size(); ++q) cuda::detail::combine_async(op, out.data(), at<T>(d[q].in, lo), out.size(), stream);
    }
    phase_end(d, 0, stream);
  }

  //! Block j of every rank's `in` goes to rank j: `out`'s block q is block `rank()` of rank q's
  //! `in` (device memory), on `stream`. Equal sizes, a multiple of `size()`, no overlap.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void all_to_all(std::span<const T> in, std::span<T> out, cudaStream_t stream) {
    check_sizes(loom::detail::all_to_all_rule("cuda_local all_to_all", in.size(), out.size(), size(),
                                              loom::detail::overlapping(in.data(), in.size(), static_cast<const T*>(out.data()), out.size())));
    auto& d = exchange("all_to_all", in.data(), out.data(), in.size_bytes(), stream, 1, 0);
    const std::size_t block = in.size() / d.size();
    std::vector<cuda::byte_access> acc;
    for (std::size_t q = 0; q < d.size(); ++q) {
      acc.push_back({at<T>(d[q].in, static_cast<std::size_t>(rank()) * block), block * sizeof(T), false});
      acc.push_back({out.data() + q * block, block * sizeof(T), true});
    }
    cuda::region reg(stream, label(0), acc);
    for (std::size_t q = 0; q < d.size(); ++q)
      copy_if(out.data() + q * block, at<T>(d[q].in, static_cast<std::size_t>(rank()) * block), block * sizeof(T), stream);
    phase_end(d, 0, stream);
  }

  //! Rank `root`'s `data` (device memory) copied into every other rank's, on `stream`.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void broadcast(std::span<T> data, int root, cudaStream_t stream) {
    if (std::string rule = loom::detail::root_rule("cuda_local broadcast", root, size()); !rule.empty()) check_sizes(rule);
    auto& d = exchange("broadcast", data.data(), data.data(), data.size_bytes(), stream, 1, 0);
    const auto r = static_cast<std::size_t>(root);
    const cuda::byte_access acc[] = {{d[r].in, data.size_bytes(), false}, {data.data(), rank() == root ? 0 : data.size_bytes(), true}};
    cuda::region reg(stream, label(0), acc);
    if (rank() != root) copy_if(data.data(), static_cast<const T*>(d[r].in), data.size_bytes(), stream);
    phase_end(d, 0, stream);
  }

  //! The reduction of every rank's `data` (device memory) into rank `root`'s, in rank order as
  //! `all_reduce`, on `stream`; the other ranks' `data` unchanged. `float` or `double`; every rank
  //! passes the same root. The root's scratch grows to the buffer (the others' does not).
  template <class T>
  void reduce(std::span<T> data, int root, reduce_op op, cudaStream_t stream) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "cuda_local reductions take float or double");
    if (std::string rule = loom::detail::root_rule("cuda_local reduce", root, size()); !rule.empty()) check_sizes(rule);
    auto& d = exchange("reduce", data.data(), data.data(), data.size_bytes(), stream, 1, rank() == root ? data.size_bytes() : 0);
    // The root sums every rank's buffer into its scratch (its own buffer is one of the inputs),
    // then copies the sum into its buffer; the others only keep theirs until the root is done.
    std::vector<cuda::byte_access> acc;
    if (rank() == root) {
      for (std::size_t q = 0; q < d.size(); ++q) acc.push_back({d[q].in, data.size_bytes(), false});
      acc.push_back({scratch_.back(), data.size_bytes(), true});
      acc.push_back({data.data(), data.size_bytes(), true});
    }
    cuda::region reg(stream, label(0), acc);
    if (rank() == root && !data.empty()) {
      T* sum = reinterpret_cast<T*>(scratch_.back());
      LOOM_CUDA_TRY(cudaMemcpyAsync(sum, static_cast<const T*>(d[0].in), data.size_bytes(), cudaMemcpyDeviceToDevice, stream));
      for (std::size_t q = 1; q < d.size(); ++q) cuda::detail::combine_async(op, sum, static_cast<const T*>(d[q].in), data.size(), stream);
      LOOM_CUDA_TRY(cudaMemcpyAsync(data.data(), sum, data.size_bytes(), cudaMemcpyDeviceToDevice, stream));
    }
    phase_end(d, 0, stream);
  }

  //! The sub-group of the ranks that pass the same `color`, ordered by `key` then rank
  //! (collective over this communicator): its host side is the threads backend's split, and its
  //! ranks share a new world state. Channels and device flags are opened anew on it.
  comm split(int color, int key) {
    threads::comm h = host_.split(color, key);
    std::shared_ptr<detail::shared_graph> g;
    if (h.rank() == 0) g = std::make_shared<detail::shared_graph>(h.size());
    std::int64_t addr = h.rank() == 0 ? static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&g)) : 0;
    h.all_reduce(std::span<std::int64_t>(&addr, 1), reduce_op::max);  // rank 0's handle, in this process
    if (h.rank() != 0) g = *reinterpret_cast<std::shared_ptr<detail::shared_graph>*>(static_cast<std::intptr_t>(addr));
    h.barrier();  // every rank holds the state before rank 0's handle goes
    comm c(std::move(h), device_, std::move(g));
    c.set_timeout(timeout_);
    c.want_flags_ = want_flags_;
    return c;
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

  //! What a rank tells the others about one collective: its buffers, its scratch, and the
  //! events it records at the end of each phase (recorded after the exchange, waited for after
  //! the barrier that follows them).
  struct coll_desc {
    const void* in = nullptr;
    void* out = nullptr;
    const void* scratch = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t ready = nullptr;  // recorded on the caller's stream before the exchange
    cudaEvent_t phase[2] = {nullptr, nullptr};
    const char* op = nullptr;     // a literal: the operation's name, checked to be the same on every rank
  };
  //! Starts a collective of `phases` phases: records this rank's ready event, makes `stream`
  //! wait for the previous collective of every rank, sizes the scratch to `scratch_bytes`, and
  //! exchanges the descriptors; `stream` then waits for every rank's ready event. Returns the
  //! descriptors, in rank order.
  std::vector<coll_desc>& exchange(const char* op, const void* in, void* out, std::size_t bytes, cudaStream_t stream, int phases,
                                   std::size_t scratch_bytes) {
    host_.check();
    op_ = op;
    reserve_scratch(scratch_bytes);
    for (auto e : last_) LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, e, 0));  // the previous collective, on any stream
    auto& sets = graph_->coll_events[static_cast<std::size_t>(rank())];
    auto& set = sets[coll_count_++ % sets.size()];
    if (set.empty())
      for (int i = 0; i < 3; ++i) {
        cudaEvent_t e = nullptr;
        LOOM_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        set.push_back(e);
      }
    coll_desc mine{in, out, scratch_.empty() ? nullptr : scratch_.back(), bytes, set[0], {set[1], phases > 1 ? set[2] : nullptr}, op};
    LOOM_CUDA_TRY(cudaEventRecord(mine.ready, stream));
    descs_in_.resize(static_cast<std::size_t>(size()));
    static_assert(sizeof(coll_desc) % sizeof(std::int64_t) == 0 && std::is_trivially_copyable_v<coll_desc>);
    constexpr std::size_t words = sizeof(coll_desc) / sizeof(std::int64_t);
    host_.all_gather(std::span<const std::int64_t>(reinterpret_cast<const std::int64_t*>(&mine), words),
                     std::span<std::int64_t>(reinterpret_cast<std::int64_t*>(descs_in_.data()), words * descs_in_.size()));
    for (auto const& d : descs_in_)
      if (std::string_view(d.op) != op || d.bytes != bytes)
        throw comm_error(host_.world_rank(), "cuda_local: rank " + std::to_string(rank()) + " called " + op + " of " +
                                                 std::to_string(bytes) + " bytes while another rank called " + d.op + " of " +
                                                 std::to_string(d.bytes) + " bytes");
    for (auto const& d : descs_in_) LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, d.ready, 0));
    return descs_in_;
  }
  //! Ends phase `k`: records this rank's event, waits (on the host) until every rank recorded
  //! its own, and makes `stream` wait for all of them.
  void phase_end(const std::vector<coll_desc>& d, int k, cudaStream_t stream) {
    LOOM_CUDA_TRY(cudaEventRecord(d[static_cast<std::size_t>(rank())].phase[k], stream));
    host_.barrier();
    last_.clear();
    for (auto const& x : d) {
      LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, x.phase[k], 0));
      last_.push_back(x.phase[k]);
    }
  }
  //! The simulator label of phase `k` of the current collective ("cuda_local all_reduce r1 (reduce)").
  const char* label(int k) {
    auto key = std::string(op_) + (k == 0 ? "" : "+");
    auto& l = coll_labels_[key];
    if (l.empty())
      l = "cuda_local " + std::string(op_) + " r" + std::to_string(rank()) +
          (std::string_view(op_) == "all_reduce" ? (k == 0 ? " (reduce)" : " (gather)") : "");
    return l.c_str();
  }
  //! Elements [lo, hi) of slice `r` of `n` elements cut into `size()` slices.
  std::pair<std::size_t, std::size_t> slice(std::size_t n, int r) const {
    const auto p = static_cast<std::size_t>(size()), q = static_cast<std::size_t>(r);
    return {n * q / p, n * (q + 1) / p};
  }
  template <class T>
  static const T* at(const void* base, std::size_t i) {
    return static_cast<const T*>(base) + i;
  }
  void copy_if(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
    if (bytes != 0 && dst != src) LOOM_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  void check_sizes(const std::string& why) {
    if (!why.empty()) throw comm_error(host_.world_rank(), why);
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
  // Collectives.
  std::vector<void*> scratch_;                        // the newest is in use; older ones a peer may still read
  std::size_t scratch_bytes_ = 0;
  std::uint64_t coll_count_ = 0;
  std::vector<coll_desc> descs_in_;
  std::vector<cudaEvent_t> last_;                     // every rank's last phase of the previous collective
  const char* op_ = "";
  std::map<std::string, std::string> coll_labels_;
};

static_assert(device_collective_communicator<comm>);

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
