// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::nccl`: one rank per GPU over NCCL.
//!
//! Communicators. A `nccl::comm` holds one NCCL communicator for its group (created
//! non-blocking: `ncclCommInitRankConfig` with `blocking = 0`, polled under the timeout) and,
//! after `open_channels`, one two-rank sub-communicator per directed channel of the pipeline,
//! created up front by `ncclCommSplit` (in rounds: each round splits off a set of channels that
//! share no rank), each with its own stream on both sides. Never lazily created pair
//! communicators: they are what made Megatron's and PyTorch's point-to-point hang (a rank
//! creating a pair communicator its peer is not creating at the same time).
//!
//! Why one communicator per channel. NCCL runs the operations of one communicator in the order
//! they were issued, one group after another. A receive posted ahead on a shared communicator
//! would hold back every later send of the rank until its partner arrived: the sends and
//! receives of the whole pipeline would have to be issued in one global order that is
//! deadlock-free under that rule, which loom's lowering does not promise. loom's validator proves
//! the lowered programs deadlock-free under *asynchronous sends and per-peer FIFO receives*
//! (`loom::validate`); a channel communicator whose operations are exactly that channel's sends
//! (on the sender) and receives (on the receiver), in program order, is that model, so the proof
//! carries over. Each send or receive is its own NCCL operation on its channel's stream, after
//! the CUDA event that makes its buffer ready (`isend`) or free (`irecv`).
//!
//! Failures. Every rank of a world shares a *failure channel* (in-process for ranks that are
//! threads, a shared file for environment bootstrap, MPI messages for MPI bootstrap). A failure
//! on any rank (a stage throws, a timeout, an asynchronous NCCL error) posts its cause there and
//! calls `ncclCommAbort` on the rank's communicators; every other rank's bounded waits poll the
//! channel and NCCL's asynchronous errors, abort their own communicators and throw a
//! `comm_error` naming the rank and the cause, within the poll interval (about a millisecond).
//!
//! Bootstrap. `nccl::run(n, f)`: `n` ranks as threads of one process, rank r on device r.
//! `nccl::from_env()`: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (the device) and a file path shared by
//! the ranks in `LOOM_NCCL_ID_FILE` (rank 0 writes the unique id there; torchrun/srun-style
//! launches). `nccl::from_mpi(comm)` (`loom/comm/nccl_mpi.hpp`): rank 0 broadcasts the id over
//! MPI. The exact launch lines are in docs/cuda.md.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nccl.h>

#include "loom/comm/device.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/buffer.hpp"
#include "loom/cuda/error.hpp"
#include "loom/schedule/error.hpp"

namespace loom::nccl {

//! Where the ranks of a world tell each other that one of them failed (see the file comment).
class failure_channel {
 public:
  virtual ~failure_channel() = default;
  //! Announces that `rank` failed with `cause` (the first announcement wins).
  virtual void post(int rank, const std::string& cause) = 0;
  //! The first announced failure, if any (non-blocking).
  virtual std::optional<std::pair<int, std::string>> poll() = 0;
};

//! Failure channel of ranks that are threads of one process.
class in_process_failures final : public failure_channel {
 public:
  void post(int rank, const std::string& cause) override {
    std::lock_guard lk(m_);
    if (!first_) first_ = std::pair{rank, cause};
    set_.store(true, std::memory_order_release);
  }
  std::optional<std::pair<int, std::string>> poll() override {
    if (!set_.load(std::memory_order_acquire)) return std::nullopt;
    std::lock_guard lk(m_);
    return first_;
  }

 private:
  std::mutex m_;
  std::atomic<bool> set_{false};
  std::optional<std::pair<int, std::string>> first_;
};

//! Failure channel through a file every rank can see (`path`): the first failing rank creates it.
class file_failures final : public failure_channel {
 public:
  //! Uses `path` (which must not exist when the world starts).
  explicit file_failures(std::string path) : path_(std::move(path)) {}
  void post(int rank, const std::string& cause) override {
    const std::string tmp = path_ + ".tmp" + std::to_string(rank);
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << rank << '\n' << cause;
    }
    // link() fails when the file exists already: the first failure stays.
    if (::link(tmp.c_str(), path_.c_str()) != 0) {
      // the file exists: an earlier failure was announced, and it stays the cause
    }
    if (::unlink(tmp.c_str()) != 0) {
    }
  }
  std::optional<std::pair<int, std::string>> poll() override {
    if (cached_) return cached_;
    std::ifstream f(path_);
    if (!f) return std::nullopt;
    int rank = -1;
    std::string cause;
    f >> rank;
    f.ignore(1);
    std::getline(f, cause, '\0');
    if (rank < 0) return std::nullopt;  // being written
    cached_ = std::pair{rank, cause};
    return cached_;
  }

 private:
  std::string path_;
  std::optional<std::pair<int, std::string>> cached_;
};

namespace detail {

//! NCCL's element type for `T`.
template <class T>
constexpr ncclDataType_t dtype() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::byte>) return ncclUint8;
  else static_assert(sizeof(T) == 0, "loom::nccl: element type without an NCCL data type");
}

inline ncclRedOp_t red(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

//! A non-blocking communicator: waits until NCCL finished creating it (bounded by `check`).
template <class Check>
void wait_ready(ncclComm_t c, Check&& check) {
  ncclResult_t st = ncclInProgress;
  loom::detail::poll_until([&] {
    LOOM_NCCL_TRY(ncclCommGetAsyncError(c, &st));
    return st != ncclInProgress;
  }, check);
  if (st != ncclSuccess) cuda::detail::throw_nccl(st, "ncclCommGetAsyncError(comm) while it was being created", __FILE__, __LINE__);
}

inline ncclConfig_t nonblocking() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

}  // namespace detail

//! One rank of an NCCL world (see the file comment). Movable; driven by one thread.
class comm {
 public:
  //! A posted send or receive: the event recorded after it on its channel's stream.
  struct request {
    cudaEvent_t done = nullptr;  //!< completes with the transfer
  };

  //! Device memory every communicator (world or split) allocates when it is made, for its host
  //! all-reduces (the executor's and the reducer's agreements); a larger host all-reduce replaces
  //! it with one of its size.
  static constexpr std::size_t host_staging_bytes = 4096;

  //! Joins the world of `size` ranks identified by `id` as `rank`, on `device`, sharing
  //! `failures` with the other ranks; waits (bounded by `timeout`) for every rank to join.
  comm(ncclUniqueId id, int rank, int size, int device, std::shared_ptr<failure_channel> failures,
       std::chrono::milliseconds timeout = default_comm_timeout)
      : rank_(rank), size_(size), device_(device), failures_(std::move(failures)), timeout_(timeout) {
    if (size < 1 || rank < 0 || rank >= size)
      throw comm_error(rank, "nccl: rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");
    LOOM_CUDA_TRY(cudaSetDevice(device));
    ncclConfig_t cfg = detail::nonblocking();
    LOOM_NCCL_TRY(ncclCommInitRankConfig(&world_, size, id, rank, &cfg));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    detail::wait_ready(world_, [&] { check_deadline(deadline, "waiting for every rank to create the NCCL communicator"); });
    LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&agree_stream_, cudaStreamNonBlocking));
    cuda::name_stream(agree_stream_, "r" + std::to_string(rank_) + " agreement");
    make_staging(host_staging_bytes);
  }

  comm(comm&& o) noexcept { swap(o); }
  comm& operator=(comm&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  comm(const comm&) = delete;
  comm& operator=(const comm&) = delete;
  ~comm() { release(); }

  //! This rank.
  int rank() const { return rank_; }
  //! The number of ranks.
  int size() const { return size_; }
  //! This rank's device.
  int device() const { return device_; }
  //! The NCCL communicator of the whole group.
  ncclComm_t get() const { return world_; }

  //! Creates the sub-communicator and streams of every channel this rank takes part in
  //! (collective: every rank passes the same list). A channel opened by an earlier call is
  //! skipped on every rank alike (the group remembers every channel opened, its own or not), so
  //! the calls' lists may overlap.
  void open_channels(std::span<const channel> chans) {
    check_live();
    std::vector<channel> todo(chans.begin(), chans.end());
    std::sort(todo.begin(), todo.end());
    todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
    std::erase_if(todo, [&](const channel& c) { return c.from == c.to || c.from < 0 || c.to < 0 || c.from >= size_ || c.to >= size_; });
    std::erase_if(todo, [&](const channel& c) { return opened_.contains({c.from, c.to}); });
    for (const channel& c : todo) opened_.insert({c.from, c.to});
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!todo.empty()) {
      // One round: channels that share no rank, split off together.
      std::vector<char> busy(static_cast<std::size_t>(size_), 0);
      std::vector<channel> round, rest;
      for (auto const& c : todo) {
        if (busy[static_cast<std::size_t>(c.from)] || busy[static_cast<std::size_t>(c.to)]) {
          rest.push_back(c);
          continue;
        }
        busy[static_cast<std::size_t>(c.from)] = busy[static_cast<std::size_t>(c.to)] = 1;
        round.push_back(c);
      }
      int color = NCCL_SPLIT_NOCOLOR, key = 0;
      channel mine{};
      for (std::size_t i = 0; i < round.size(); ++i)
        if (round[i].from == rank_ || round[i].to == rank_) {
          color = static_cast<int>(i);
          key = round[i].from == rank_ ? 0 : 1;
          mine = round[i];
        }
      ncclConfig_t cfg = detail::nonblocking();
      ncclComm_t sub = nullptr;
      LOOM_NCCL_TRY(ncclCommSplit(world_, color, key, &sub, &cfg));
      if (color != NCCL_SPLIT_NOCOLOR) {
        if (sub == nullptr) throw comm_error(rank_, "nccl: ncclCommSplit gave no communicator for a channel");
        detail::wait_ready(sub, [&] { check_deadline(deadline, "waiting for the channel communicators"); });
        auto& ch = channels_[{mine.from, mine.to}];
        ch.comm = sub;
        LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking));
        cuda::name_stream(ch.stream, "r" + std::to_string(rank_) + (mine.from == rank_ ? " send->" + std::to_string(mine.to)
                                                                                          : " recv<-" + std::to_string(mine.from)));
      }
      todo = std::move(rest);
    }
  }

  //! Sends `bytes` (device memory) to `peer` once `ready` has completed.
  request isend(int peer, std::span<const std::byte> bytes, cudaEvent_t ready) {
    auto& ch = channel_of(rank_, peer);
    if (ready != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(ch.stream, ready, 0));
    LOOM_NCCL_TRY(ncclSend(bytes.data(), bytes.size(), ncclUint8, 1, ch.comm, ch.stream));
    request r{events_.next()};
    LOOM_CUDA_TRY(cudaEventRecord(r.done, ch.stream));
    return r;
  }

  //! Receives into `bytes` (device memory) from `peer`, not before `free` (may be null).
  request irecv(int peer, std::span<std::byte> bytes, cudaEvent_t free) {
    auto& ch = channel_of(peer, rank_);
    if (free != nullptr) LOOM_CUDA_TRY(cudaStreamWaitEvent(ch.stream, free, 0));
    LOOM_NCCL_TRY(ncclRecv(bytes.data(), bytes.size(), ncclUint8, 0, ch.comm, ch.stream));
    request r{events_.next()};
    LOOM_CUDA_TRY(cudaEventRecord(r.done, ch.stream));
    return r;
  }

  //! Makes later work on `stream` wait for the transfer of `r`.
  void wait(request& r, cudaStream_t stream) { LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, r.done, 0)); }

  //! Starts a step: every channel stream forks from `stream`.
  void begin_step(cudaStream_t stream) {
    check_live();
    events_.rewind();
    cudaEvent_t e = events_.next();
    LOOM_CUDA_TRY(cudaEventRecord(e, stream));
    for (auto& [key, ch] : channels_) LOOM_CUDA_TRY(cudaStreamWaitEvent(ch.stream, e, 0));
  }

  //! Ends a step: `stream` joins every channel stream.
  void end_step(cudaStream_t stream) {
    for (auto& [key, ch] : channels_) {
      cudaEvent_t e = events_.next();
      LOOM_CUDA_TRY(cudaEventRecord(e, ch.stream));
      LOOM_CUDA_TRY(cudaStreamWaitEvent(stream, e, 0));
    }
  }

  //! Waits on the host until `stream`'s work has finished, bounded by the timeout; a failure of
  //! any rank or an asynchronous NCCL error ends the wait with a `comm_error`.
  void synchronize(cudaStream_t stream) {
    check_live();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    loom::detail::poll_until([&] { return loom::detail::stream_done(stream); },
                             [&] { check_deadline(deadline, "waiting for its CUDA stream to finish the step"); });
  }

  //! Begins capturing this rank's step (its stream, and the channel streams forked from it at
  //! `begin_step`, NCCL calls included) into a graph.
  void begin_capture(cudaStream_t stream) { LOOM_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal)); }
  //! Ends the capture and instantiates the graph.
  void end_capture(cudaStream_t stream) {
    cudaGraph_t g = nullptr;
    LOOM_CUDA_TRY(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t x = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g);
    LOOM_CUDA_TRY(e);
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    exec_ = x;
  }
  //! Replays the captured step on `stream`.
  void launch(cudaStream_t stream) {
    check_live();
    LOOM_CUDA_TRY(cudaGraphLaunch(exec_, stream));
  }

  //! Reduces host memory over the ranks (through device staging and `ncclAllReduce`; blocking,
  //! bounded).
  void all_reduce(std::span<std::int64_t> v, reduce_op op) { host_all_reduce(v, op); }
  //! Reduces host memory over the ranks (blocking, bounded).
  void all_reduce(std::span<double> v, reduce_op op) { host_all_reduce(v, op); }

  //! `ncclAllReduce` of device memory on `stream` (in place).
  template <class T>
  void all_reduce(std::span<T> device_data, reduce_op op, cudaStream_t stream) {
    check_live();
    LOOM_NCCL_TRY(ncclAllReduce(device_data.data(), device_data.data(), device_data.size(), detail::dtype<T>(), detail::red(op), world_, stream));
  }
  //! `ncclAllGather` of device memory on `stream`: `out` holds every rank's `in`, in rank order.
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out, cudaStream_t stream) {
    check_live();
    if (out.size() != in.size() * static_cast<std::size_t>(size_)) throw comm_error(rank_, "nccl all_gather: output is not size() inputs");
    LOOM_NCCL_TRY(ncclAllGather(in.data(), out.data(), in.size(), detail::dtype<T>(), world_, stream));
  }
  //! `ncclReduceScatter` of device memory on `stream`: `out` is this rank's slice of the reduction.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, cudaStream_t stream) {
    check_live();
    if (in.size() != out.size() * static_cast<std::size_t>(size_)) throw comm_error(rank_, "nccl reduce_scatter: input is not size() outputs");
    LOOM_NCCL_TRY(ncclReduceScatter(in.data(), out.data(), out.size(), detail::dtype<T>(), detail::red(op), world_, stream));
  }
  //! `ncclAlltoAll` of device memory on `stream`: block j of `in` goes to rank j.
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out, cudaStream_t stream) {
    check_live();
    if (in.size() != out.size() || in.size() % static_cast<std::size_t>(size_) != 0)
      throw comm_error(rank_, "nccl all_to_all: sizes must be equal and a multiple of size()");
    LOOM_NCCL_TRY(ncclAlltoAll(in.data(), out.data(), in.size() / static_cast<std::size_t>(size_), detail::dtype<T>(), world_, stream));
  }

  //! `ncclBroadcast` of device memory on `stream`, in place: rank `root`'s `data` into every rank's.
  template <class T>
  void broadcast(std::span<T> data, int root, cudaStream_t stream) {
    check_live();
    if (std::string rule = loom::detail::root_rule("nccl broadcast", root, size_); !rule.empty()) throw comm_error(rank_, rule);
    LOOM_NCCL_TRY(ncclBroadcast(data.data(), data.data(), data.size(), detail::dtype<T>(), root, world_, stream));
  }
  //! `ncclReduce` of device memory on `stream`, in place: the reduction of every rank's `data`
  //! into rank `root`'s (NCCL's order of the terms); the other ranks' `data` unchanged.
  template <class T>
  void reduce(std::span<T> data, int root, reduce_op op, cudaStream_t stream) {
    check_live();
    if (std::string rule = loom::detail::root_rule("nccl reduce", root, size_); !rule.empty()) throw comm_error(rank_, rule);
    LOOM_NCCL_TRY(ncclReduce(data.data(), data.data(), data.size(), detail::dtype<T>(), detail::red(op), root, world_, stream));
  }

  //! The sub-group of the ranks that pass the same `color`, ordered by `key` (collective).
  comm split(int color, int key) {
    check_live();
    ncclConfig_t cfg = detail::nonblocking();
    ncclComm_t sub = nullptr;
    LOOM_NCCL_TRY(ncclCommSplit(world_, color, key, &sub, &cfg));
    if (sub == nullptr) throw comm_error(rank_, "nccl: split gave no communicator (color " + std::to_string(color) + ")");
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    detail::wait_ready(sub, [&] { check_deadline(deadline, "waiting for a split communicator"); });
    comm c;
    c.world_ = sub;
    LOOM_NCCL_TRY(ncclCommUserRank(sub, &c.rank_));
    LOOM_NCCL_TRY(ncclCommCount(sub, &c.size_));
    c.device_ = device_;
    c.failures_ = failures_;
    c.timeout_ = timeout_;
    LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&c.agree_stream_, cudaStreamNonBlocking));
    c.make_staging(host_staging_bytes);
    return c;
  }

  //! Aborts: posts the cause on the failure channel and aborts this rank's NCCL communicators;
  //! every rank's pending and later waits then throw a `comm_error` naming this rank.
  void abort(std::string reason) { abort_with(rank_, "aborted the communicator: " + reason); }
  //! Bounds every later wait.
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0) throw comm_error(rank_, "timeout " + std::to_string(t.count()) + " ms is not positive");
    timeout_ = t;
  }
  //! Throws the `comm_error` of a failure announced by any rank, or of an asynchronous NCCL
  //! error (aborting this rank's communicators first).
  void check() { check_deadline(std::chrono::steady_clock::time_point::max(), ""); }

 private:
  comm() = default;

  struct chan {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };

  chan& channel_of(int from, int to) {
    check_live();
    auto it = channels_.find({from, to});
    if (it == channels_.end())
      throw comm_error(rank_, "nccl: no channel from rank " + std::to_string(from) + " to rank " + std::to_string(to) +
                                  " was opened (open_channels)");
    return it->second;
  }

  void check_live() {
    if (aborted_) throw comm_error(abort_rank_, abort_cause_);
  }

  //! One poll of everything that ends a wait: another rank's failure, an asynchronous NCCL
  //! error, the deadline.
  void check_deadline(std::chrono::steady_clock::time_point deadline, const char* what) {
    check_live();
    if (failures_) {
      if (auto f = failures_->poll()) {
        abort_with(f->first, f->second, false);
        check_live();
      }
    }
    for (ncclComm_t c : all_comms()) {
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
        abort_with(rank_, std::string("NCCL asynchronous error ") + ncclGetErrorString(st) + " on rank " + std::to_string(rank_));
        check_live();
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      abort_with(rank_, "timed out after " + std::to_string(timeout_.count()) + " ms " + what);
      check_live();
    }
  }

  std::vector<ncclComm_t> all_comms() const {
    std::vector<ncclComm_t> out;
    if (world_ != nullptr) out.push_back(world_);
    for (auto const& [key, ch] : channels_)
      if (ch.comm != nullptr) out.push_back(ch.comm);
    return out;
  }

  void abort_with(int rank, std::string cause, bool announce = true) {
    if (aborted_) return;
    aborted_ = true;
    abort_rank_ = rank;
    abort_cause_ = cause;
    if (announce && failures_) failures_->post(rank, cause);
    for (ncclComm_t c : all_comms()) (void)ncclCommAbort(c);
    world_ = nullptr;
    for (auto& [key, ch] : channels_) ch.comm = nullptr;
  }

  //! The host all-reduce's device and pinned staging, `bytes` of each.
  void make_staging(std::size_t bytes) {
    staging_ = cuda::device_buffer<std::byte>(bytes);
    pinned_ = cuda::pinned_buffer<std::byte>(bytes);
    cuda::name_memory(staging_.data(), "r" + std::to_string(rank_) + " nccl host all-reduce staging");
  }
  template <class T>
  void host_all_reduce(std::span<T> v, reduce_op op) {
    check_live();
    const std::size_t bytes = v.size_bytes();
    if (staging_.bytes() < bytes) make_staging(bytes);
    if (bytes != 0) std::memcpy(pinned_.data(), v.data(), bytes);  // an empty span may have no storage (memcpy's null is UB)
    LOOM_CUDA_TRY(cudaMemcpyAsync(staging_.data(), pinned_.data(), bytes, cudaMemcpyHostToDevice, agree_stream_));
    LOOM_NCCL_TRY(ncclAllReduce(staging_.data(), staging_.data(), v.size(), detail::dtype<T>(), detail::red(op), world_, agree_stream_));
    LOOM_CUDA_TRY(cudaMemcpyAsync(pinned_.data(), staging_.data(), bytes, cudaMemcpyDeviceToHost, agree_stream_));
    synchronize(agree_stream_);
    if (bytes != 0) std::memcpy(v.data(), pinned_.data(), bytes);
  }

  void release() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    for (auto& [key, ch] : channels_) {
      if (ch.comm != nullptr) (void)ncclCommDestroy(ch.comm);
      if (ch.stream != nullptr) (void)cudaStreamDestroy(ch.stream);
    }
    channels_.clear();
    opened_.clear();
    if (world_ != nullptr) (void)ncclCommDestroy(world_);
    if (agree_stream_ != nullptr) (void)cudaStreamDestroy(agree_stream_);
    world_ = nullptr;
    agree_stream_ = nullptr;
    exec_ = nullptr;
  }

  void swap(comm& o) noexcept {
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    std::swap(world_, o.world_);
    std::swap(channels_, o.channels_);
    std::swap(opened_, o.opened_);
    std::swap(agree_stream_, o.agree_stream_);
    std::swap(exec_, o.exec_);
    std::swap(events_, o.events_);
    std::swap(staging_, o.staging_);
    std::swap(pinned_, o.pinned_);
    std::swap(failures_, o.failures_);
    std::swap(timeout_, o.timeout_);
    std::swap(aborted_, o.aborted_);
    std::swap(abort_rank_, o.abort_rank_);
    std::swap(abort_cause_, o.abort_cause_);
  }

  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t world_ = nullptr;
  std::map<std::pair<int, int>, chan> channels_;
  std::set<std::pair<int, int>> opened_;  // every channel opened on the group, this rank's or not
  cudaStream_t agree_stream_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  loom::detail::event_pool events_;
  cuda::device_buffer<std::byte> staging_;
  cuda::pinned_buffer<std::byte> pinned_;
  std::shared_ptr<failure_channel> failures_;
  std::chrono::milliseconds timeout_ = default_comm_timeout;
  bool aborted_ = false;
  int abort_rank_ = -1;
  std::string abort_cause_;
};

static_assert(device_collective_communicator<comm>);

//! Runs `f(comm&)` for `n` ranks that are threads of this process, rank r on device r (named
//! "rank r"). The first exception posts its cause on the world's failure channel (so every rank's
//! waits end), every thread is joined, and that exception is rethrown.
template <class F>
  requires std::invocable<F&, comm&>
void run(int n, F f, std::chrono::milliseconds timeout = default_comm_timeout) {
  if (n < 1) throw comm_error(-1, "nccl::run needs at least 1 rank, got " + std::to_string(n));
  ncclUniqueId id;
  LOOM_NCCL_TRY(ncclGetUniqueId(&id));
  auto failures = std::make_shared<in_process_failures>();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::mutex m;
  std::vector<int> order;
  auto body = [&](int r) {
    try {
      LOOM_CUDA_TRY(cudaSetDevice(r));
      cuda::name_thread("rank " + std::to_string(r));
      comm c(id, r, n, r, failures, timeout);
      try {
        f(c);
      } catch (const comm_error&) {
        throw;
      } catch (const std::exception& e) {
        c.abort(std::string("threw: ") + e.what());
        throw;
      }
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      std::lock_guard lk(m);
      order.push_back(r);
      try {
        throw;
      } catch (const std::exception& e) {
        failures->post(r, std::string("threw: ") + e.what());
      } catch (...) {
        failures->post(r, "threw an exception");
      }
    }
  };
  std::vector<std::thread> pool;
  for (int r = 1; r < n; ++r) pool.emplace_back(body, r);
  body(0);
  for (auto& t : pool) t.join();
  if (order.empty()) return;
  if (auto first = failures->poll())
    if (errors[static_cast<std::size_t>(first->first)]) std::rethrow_exception(errors[static_cast<std::size_t>(first->first)]);
  std::rethrow_exception(errors[static_cast<std::size_t>(order.front())]);
}

//! Joins the world of `size` ranks as `rank` on `device`, meeting through a file `path` that
//! every rank can read and that is unique to this run: rank 0 writes the NCCL unique id there,
//! the others wait for it (bounded by `timeout`). Failures are announced through `<path>.abort`.
inline comm from_file(int rank, int size, int device, const std::string& path,
                      std::chrono::milliseconds timeout = default_comm_timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw config_error("loom::nccl: rank " + std::to_string(rank) + " is not in 0.." + std::to_string(size - 1));
  ncclUniqueId id;
  if (rank == 0) {
    LOOM_NCCL_TRY(ncclGetUniqueId(&id));
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(id.internal, sizeof id.internal);
      if (!f) throw config_error("loom::nccl: cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw config_error("loom::nccl: cannot create " + path);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::ifstream f(path, std::ios::binary);
      if (f.read(id.internal, sizeof id.internal)) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw comm_error(rank, "nccl: timed out after " + std::to_string(timeout.count()) + " ms waiting for rank 0 to write " + path);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return comm(id, rank, size, device, std::make_shared<file_failures>(path + ".abort"), timeout);
}

//! Joins the world described by the environment (torchrun style): `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK` (the device, default 0) and `LOOM_NCCL_ID_FILE`, the meeting file of `from_file`.
inline comm from_env(std::chrono::milliseconds timeout = default_comm_timeout) {
  auto need = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') throw config_error(std::string("loom::nccl::from_env: environment variable ") + name + " is not set");
    return v;
  };
  auto number = [](const char* name, const std::string& v) {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || x < 0 || x > 1 << 20)
      throw config_error(std::string("loom::nccl::from_env: ") + name + "=" + v + " is not a rank number");
    return static_cast<int>(x);
  };
  const int rank = number("RANK", need("RANK")), size = number("WORLD_SIZE", need("WORLD_SIZE"));
  const char* lr = std::getenv("LOCAL_RANK");
  const int device = lr != nullptr && *lr != '\0' ? number("LOCAL_RANK", lr) : 0;
  if (rank >= size) throw config_error("loom::nccl::from_env: RANK=" + std::to_string(rank) + " is not below WORLD_SIZE=" + std::to_string(size));
  return from_file(rank, size, device, need("LOOM_NCCL_ID_FILE"), timeout);
}

}  // namespace loom::nccl
