// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::mpi`: a communicator whose ranks are MPI processes (CMake target `loom::mpi`).
//!
//! Transport. Point-to-point messages are `MPI_Isend`/`MPI_Irecv` of bytes with one tag on a
//! duplicate of the user's communicator; MPI's non-overtaking rule for one (source, tag,
//! communicator) gives the per-peer FIFO matching of the concept. Collectives are the
//! non-blocking MPI collectives (`MPI_Iallreduce`, `MPI_Iallgather`, `MPI_Ireduce_scatter_block`,
//! `MPI_Ialltoall`, `MPI_Ibarrier`), so that waiting for them can be bounded. MPI chooses the
//! reduction order; results exact in the element type are identical to the threads backend's.
//!
//! Failures. MPI has no bounded blocking call, so every wait here is a polling loop: it tests
//! the request, probes a second, private duplicate of `MPI_COMM_WORLD` (the control channel) for
//! an abort notice, and checks the deadline. `abort(reason)` (and a timeout, and `run_mpi` after
//! an exception) sends an abort notice naming this rank and the cause to every rank of the world;
//! each rank's next poll turns it into a `comm_error`. A process that calls `exit` or ends in
//! `std::terminate` while a world is alive sends the notice from an `atexit` / terminate hook,
//! so the others end with an error naming it instead of waiting for their timeout. A process
//! killed by a signal cannot say anything: the others end at their timeout (or `mpiexec` ends
//! the job). As a last resort, an `environment` whose world was aborted ends the process with
//! `_Exit` if `MPI_Finalize` has not returned within 5 s (finalizing with a dead peer may hang).
//!
//! Threading. A communicator is driven by one thread at a time; `environment` asks for
//! `MPI_THREAD_MULTIPLE` so that different communicators may live on different threads.

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom {
namespace detail::mpi {

inline constexpr int data_tag = 0;
inline constexpr int abort_tag = 7;

//! Text of an MPI error code.
inline std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}

inline bool mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init != 0 && fin == 0;
}

//! The MPI datatype of an arithmetic element type (by size and signedness).
template <comm_element T>
MPI_Datatype datatype() {
  if constexpr (std::is_floating_point_v<T>) {
    if constexpr (sizeof(T) == sizeof(float)) return MPI_FLOAT;
    else if constexpr (sizeof(T) == sizeof(double)) return MPI_DOUBLE;
    else return MPI_LONG_DOUBLE;
  } else if constexpr (std::is_signed_v<T>) {
    if constexpr (sizeof(T) == 1) return MPI_INT8_T;
    else if constexpr (sizeof(T) == 2) return MPI_INT16_T;
    else if constexpr (sizeof(T) == 4) return MPI_INT32_T;
    else return MPI_INT64_T;
  } else {
    if constexpr (sizeof(T) == 1) return MPI_UINT8_T;
    else if constexpr (sizeof(T) == 2) return MPI_UINT16_T;
    else if constexpr (sizeof(T) == 4) return MPI_UINT32_T;
    else return MPI_UINT64_T;
  }
}

inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return MPI_SUM;
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
  }
  return MPI_SUM;
}

//! What every communicator of one world shares: the control channel and the abort state.
struct world_state {
  MPI_Comm ctrl = MPI_COMM_NULL;
  int rank = 0;  // this process's rank in the world
  int size = 0;
  std::mutex m;
  std::mutex poll_m;  // one poll of the control channel at a time
  std::atomic<bool> aborted{false};
  int abort_rank = -1;
  std::string abort_cause;
  std::string notice;                  // the text this rank sent, kept alive for the sends
  std::vector<MPI_Request> notices;    // abort notices in flight

  ~world_state() {
    if (!mpi_live()) return;
    for (auto& r : notices)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    if (ctrl != MPI_COMM_NULL) MPI_Comm_free(&ctrl);
  }

  comm_error error() {
    std::lock_guard lk(m);
    return comm_error(abort_rank, abort_cause);
  }

  //! Records the first abort and, when it is this rank's own, notifies every other rank.
  void abort(int who, std::string cause, bool notify) {
    std::lock_guard lk(m);
    if (aborted.load(std::memory_order_relaxed)) return;
    abort_rank = who;
    abort_cause = std::move(cause);
    aborted.store(true, std::memory_order_release);
    if (!notify || !mpi_live()) return;
    notice = std::to_string(who) + "\n" + abort_cause;
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(notice.data(), static_cast<int>(notice.size()), MPI_CHAR, q, abort_tag, ctrl, &r) == MPI_SUCCESS)
        notices.push_back(r);
    }
  }

  //! Picks up an abort notice from another rank, if one arrived.
  void poll() {
    if (aborted.load(std::memory_order_acquire)) return;
    // Communicators of one world driven by different threads poll the same control channel: one
    // probe-and-receive at a time, or two threads could probe one notice and one block receiving.
    std::unique_lock lk(poll_m, std::try_to_lock);
    if (!lk.owns_lock()) return;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, abort_tag, ctrl, &flag, &st) != MPI_SUCCESS || flag == 0) return;
    int len = 0;
    MPI_Get_count(&st, MPI_CHAR, &len);
    std::string text(static_cast<std::size_t>(std::max(len, 0)), '\0');
    MPI_Recv(text.data(), len, MPI_CHAR, st.MPI_SOURCE, abort_tag, ctrl, MPI_STATUS_IGNORE);
    int who = st.MPI_SOURCE;
    std::string cause = text;
    if (auto nl = text.find('\n'); nl != std::string::npos) {
      who = std::atoi(text.substr(0, nl).c_str());
      cause = text.substr(nl + 1);
    }
    abort(who, std::move(cause), false);
  }

  //! Gives this rank's abort notices up to `limit` to leave (used before the process ends).
  void flush(std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    std::lock_guard lk(m);
    for (auto& r : notices) {
      int done = 0;
      while (r != MPI_REQUEST_NULL && !done && std::chrono::steady_clock::now() < deadline) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }
};

//! The worlds alive in this process, for the exit and terminate hooks.
struct world_registry {
  std::mutex m;
  std::vector<std::weak_ptr<world_state>> worlds;

  static world_registry& get() {
    static world_registry reg;
    return reg;
  }

  //! Notifies the other ranks of every live, not yet aborted world that this process ends.
  void notify_all(const std::string& cause) {
    if (!mpi_live()) return;
    std::vector<std::shared_ptr<world_state>> live;
    {
      std::lock_guard lk(m);
      for (auto& w : worlds)
        if (auto p = w.lock()) live.push_back(std::move(p));
    }
    for (auto& w : live) {
      w->poll();
      if (w->aborted.load()) continue;
      w->abort(w->rank, cause, true);
      w->flush(std::chrono::milliseconds(1000));
    }
  }
};

inline std::terminate_handler& previous_terminate() {
  static std::terminate_handler h = nullptr;
  return h;
}

//! Installs (once) the hooks that tell the other ranks when this process exits or terminates.
inline void install_exit_hooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    world_registry::get();  // constructed before the atexit hook: destroyed after it runs
    std::atexit([] { world_registry::get().notify_all("exited (exit() was called while its communicator was in use)"); });
    previous_terminate() = std::set_terminate([] {
      std::string cause = "terminated";
      if (auto e = std::current_exception()) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          cause += " (uncaught exception: " + std::string(x.what()) + ")";
        } catch (...) {
          cause += " (uncaught exception)";
        }
      }
      world_registry::get().notify_all(cause);
      if (auto h = previous_terminate()) h();
      std::abort();
    });
  });
}

//! One posted send or receive.
struct request_state {
  MPI_Request req = MPI_REQUEST_NULL;
  std::size_t size = 0;
  int peer = -1;  // world rank, for messages
  bool is_send = false;
  bool done = false;
  const char* coll = nullptr;  // the non-blocking collective's name, or nullptr for a send/receive
};

//! Owns an MPI communicator handle.
struct comm_handle {
  MPI_Comm c = MPI_COMM_NULL;
  ~comm_handle() {
    if (c != MPI_COMM_NULL && mpi_live()) MPI_Comm_free(&c);
  }
};

}  // namespace detail::mpi

namespace mpi {

//! Initializes MPI (asking for `MPI_THREAD_MULTIPLE`) unless it is already, and finalizes it on
//! destruction if it initialized it. If a world was aborted, finalizing may hang on a dead
//! peer: the destructor then ends the process with `_Exit(1)` after 5 s.
class environment {
 public:
  //! Initializes MPI with the program's arguments.
  environment(int& argc, char**& argv) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided_);
    owner_ = true;
  }
  //! Initializes MPI without arguments.
  environment() {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided_);
    owner_ = true;
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (!owner_ || !detail::mpi::mpi_live()) return;
    if (any_aborted()) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::_Exit(1);
      }).detach();
    }
    MPI_Finalize();
  }
  //! The thread support level MPI provided.
  int provided() const { return provided_; }

 private:
  static bool any_aborted() {
    auto& reg = detail::mpi::world_registry::get();
    std::lock_guard lk(reg.m);
    for (auto& w : reg.worlds)
      if (auto p = w.lock(); p && p->aborted.load()) return true;
    return false;
  }
  bool owner_ = false;
  int provided_ = 0;
};

//! A rank's handle on a group of MPI processes (see the file comment). Created by `world()`
//! (all of `MPI_COMM_WORLD`), `from(MPI_Comm)` or `split`; movable, not copyable.
class comm {
 public:
  //! Handle on one posted send or receive; copies refer to the same operation.
  using request = std::shared_ptr<detail::mpi::request_state>;

  comm(comm&&) noexcept = default;
  comm& operator=(comm&&) noexcept = default;
  comm(const comm&) = delete;
  comm& operator=(const comm&) = delete;

  //! Every process of `MPI_COMM_WORLD` (collective). MPI must be initialized.
  static comm world() { return from(MPI_COMM_WORLD); }

  //! A new world over a duplicate of `base` (collective over `base`); its abort notices reach
  //! the ranks of `base`. MPI must be initialized.
  static comm from(MPI_Comm base) {
    if (!detail::mpi::mpi_live())
      throw comm_error(-1, "MPI is not initialized (create a loom::mpi::environment first) or already finalized");
    detail::mpi::install_exit_hooks();
    auto w = std::make_shared<detail::mpi::world_state>();
    MPI_Comm_dup(base, &w->ctrl);
    MPI_Comm_set_errhandler(w->ctrl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(w->ctrl, &w->rank);
    MPI_Comm_size(w->ctrl, &w->size);
    {
      auto& reg = detail::mpi::world_registry::get();
      std::lock_guard lk(reg.m);
      std::erase_if(reg.worlds, [](auto& p) { return p.expired(); });
      reg.worlds.push_back(w);
    }
    auto h = std::make_shared<detail::mpi::comm_handle>();
    MPI_Comm_dup(base, &h->c);
    MPI_Comm_set_errhandler(h->c, MPI_ERRORS_RETURN);
    std::vector<int> ranks(static_cast<std::size_t>(w->size));
    for (int i = 0; i < w->size; ++i) ranks[static_cast<std::size_t>(i)] = i;
    return comm(std::move(w), std::move(h), std::move(ranks));
  }

  //! This rank's index in the group.
  int rank() const { return rank_; }
  //! The number of ranks in the group.
  int size() const { return static_cast<int>(world_ranks_.size()); }
  //! This rank's index in the world (the rank named in errors).
  int world_rank() const { return w_->rank; }
  //! The underlying MPI communicator (for interoperation, e.g. NCCL bootstrap).
  MPI_Comm native() const { return h_->c; }

  //! Bounds every later blocking call of this communicator; must be positive.
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0)
      throw comm_error(world_rank(), "timeout " + std::to_string(t.count()) + " ms is not positive");
    timeout_ = t;
  }
  //! The current timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }

  //! Posts a send of `data` to `peer` (`data` must stay valid and unchanged until completion).
  request isend(int peer, std::span<const std::byte> data) {
    check_live();
    check_peer(peer, "send to");
    auto r = make_request(peer, data.size(), true);
    try_mpi(MPI_Isend(data.data(), count_of(data.size(), "isend"), MPI_BYTE, peer, detail::mpi::data_tag, h_->c,
                      &r->req),
            "MPI_Isend");
    return r;
  }

  //! Posts a receive of exactly `data.size()` bytes from `peer`.
  request irecv(int peer, std::span<std::byte> data) {
    check_live();
    check_peer(peer, "receive from");
    auto r = make_request(peer, data.size(), false);
    try_mpi(MPI_Irecv(data.data(), count_of(data.size(), "irecv"), MPI_BYTE, peer, detail::mpi::data_tag, h_->c,
                      &r->req),
            "MPI_Irecv");
    return r;
  }

  //! Whether `req` completed (throws if it failed or the world was aborted).
  bool test(request& req) {
    check_live();
    if (req->done) return true;
    MPI_Status st;
    int flag = 0;
    int rc = MPI_Test(&req->req, &flag, &st);
    if (rc != MPI_SUCCESS || flag) finish(*req, rc, st);
    w_->poll();
    check_live();
    return req->done;
  }

  //! Waits until `req` completes; throws `comm_error` on failure, abort, or timeout (which
  //! then aborts the world).
  void wait(request& req) {
    check_live();
    if (req->done) return;
    MPI_Status st;
    int rc = progress(req->req, &st, [&] {
      if (req->coll != nullptr)
        return std::string("waiting for a non-blocking ") + req->coll + " of " + std::to_string(req->size) +
               " bytes (waiting for the other ranks of the group)";
      return std::string("waiting for a ") + (req->is_send ? "send of " : "receive of ") + std::to_string(req->size) +
             " bytes " + (req->is_send ? "to" : "from") + " rank " + std::to_string(req->peer);
    });
    finish(*req, rc, st);
  }

  //! Element-wise reduction of `data` over all ranks; result in `data` on every rank.
  template <comm_element T>
  void all_reduce(std::span<T> data, reduce_op op) {
    check_live();
    MPI_Request r = MPI_REQUEST_NULL;
    try_mpi(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count_of(data.size(), "all_reduce"), detail::mpi::datatype<T>(),
                           detail::mpi::mpi_op(op), h_->c, &r),
            "MPI_Iallreduce");
    collective(r, "all_reduce");
  }

  //! Rank `root`'s `data` copied into every rank's `data` (`MPI_Ibcast`).
  template <comm_element T>
  void broadcast(std::span<T> data, int root) {
    check_live();
    if (std::string rule = detail::root_rule("broadcast", root, size()); !rule.empty()) throw comm_error(world_rank(), rule);
    MPI_Request r = MPI_REQUEST_NULL;
    try_mpi(MPI_Ibcast(data.data(), count_of(data.size(), "broadcast"), detail::mpi::datatype<T>(), root, h_->c, &r), "MPI_Ibcast");
    collective(r, "broadcast");
  }

  //! The element-wise reduction of every rank's `data` into rank `root`'s `data` (`MPI_Ireduce`,
  //! in place at the root; the order of the terms is MPI's); the other ranks' `data` unchanged.
  template <comm_element T>
  void reduce(std::span<T> data, int root, reduce_op op) {
    check_live();
    if (std::string rule = detail::root_rule("reduce", root, size()); !rule.empty()) throw comm_error(world_rank(), rule);
    MPI_Request r = MPI_REQUEST_NULL;
    const bool me = rank_ == root;
    try_mpi(MPI_Ireduce(me ? MPI_IN_PLACE : data.data(), me ? data.data() : nullptr, count_of(data.size(), "reduce"), detail::mpi::datatype<T>(),
                        detail::mpi::mpi_op(op), root, h_->c, &r),
            "MPI_Ireduce");
    collective(r, "reduce");
  }

  //! Concatenates every rank's `in` into `out` in rank order (`in` may be this rank's segment).
  template <comm_element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_live();
    if (auto rule = detail::gather_rule("all_gather", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank_) * in.size();
    MPI_Request r = MPI_REQUEST_NULL;
    const int k = count_of(in.size(), "all_gather");
    try_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), k, detail::mpi::datatype<T>(), out.data(), k,
                           detail::mpi::datatype<T>(), h_->c, &r),
            "MPI_Iallgather");
    collective(r, "all_gather");
  }

  //! Rank r gets the reduction of segment r of every rank's `in` (size() * out.size()).
  template <comm_element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    check_live();
    if (auto rule = detail::scatter_rule("reduce_scatter", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    const bool overlap = !out.empty() && out.data() < in.data() + in.size() && in.data() < out.data() + out.size();
    std::vector<T> tmp(overlap ? out.size() : 0);
    T* dst = overlap ? tmp.data() : out.data();
    MPI_Request r = MPI_REQUEST_NULL;
    try_mpi(MPI_Ireduce_scatter_block(in.data(), dst, count_of(out.size(), "reduce_scatter"),
                                      detail::mpi::datatype<T>(), detail::mpi::mpi_op(op), h_->c, &r),
            "MPI_Ireduce_scatter_block");
    collective(r, "reduce_scatter");
    if (overlap) std::copy(tmp.begin(), tmp.end(), out.begin());
  }

  //! Rank r's `out` segment j receives rank j's `in` segment r. `in` and `out` must not overlap.
  template <comm_element T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    check_live();
    if (auto rule = detail::all_to_all_rule("all_to_all", in.size(), out.size(), size(),
                                            detail::overlapping(in.data(), in.size(), out.data(), out.size()));
        !rule.empty())
      throw comm_error(world_rank(), rule);
    const int k = count_of(in.size() / static_cast<std::size_t>(size()), "all_to_all");
    MPI_Request r = MPI_REQUEST_NULL;
    try_mpi(MPI_Ialltoall(in.data(), k, detail::mpi::datatype<T>(), out.data(), k, detail::mpi::datatype<T>(), h_->c,
                          &r),
            "MPI_Ialltoall");
    collective(r, "all_to_all");
  }

  // ---- non-blocking collectives (loom::nonblocking_communicator) ----------------------------
  // `MPI_Iallreduce`, `MPI_Iallgather`, `MPI_Ireduce_scatter_block`, `MPI_Ialltoall`, completed by
  // `wait`/`test` like a send or receive. MPI progresses them when this rank calls into MPI (any
  // `test` or `wait`, on any request); the data-parallel reducer tests its requests between the
  // pipeline's actions for that reason.

  //! Non-blocking `all_reduce`: `data` holds the result once the request completed.
  template <comm_element T>
  request iall_reduce(std::span<T> data, reduce_op op) {
    check_live();
    auto r = make_collective("iall_reduce", data.size() * sizeof(T));
    try_mpi(MPI_Iallreduce(MPI_IN_PLACE, data.data(), count_of(data.size(), "iall_reduce"), detail::mpi::datatype<T>(),
                           detail::mpi::mpi_op(op), h_->c, &r->req),
            "MPI_Iallreduce");
    return r;
  }
  //! Non-blocking `all_gather` (`in` may be this rank's segment of `out`).
  template <comm_element T>
  request iall_gather(std::span<const T> in, std::span<T> out) {
    check_live();
    if (auto rule = detail::gather_rule("iall_gather", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank_) * in.size();
    auto r = make_collective("iall_gather", in.size() * sizeof(T));
    const int k = count_of(in.size(), "iall_gather");
    try_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), k, detail::mpi::datatype<T>(), out.data(), k,
                           detail::mpi::datatype<T>(), h_->c, &r->req),
            "MPI_Iallgather");
    return r;
  }
  //! Non-blocking `reduce_scatter` (`in` and `out` must not overlap).
  template <comm_element T>
  request ireduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    check_live();
    if (auto rule = detail::scatter_rule("ireduce_scatter", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    if (detail::overlapping(in.data(), in.size(), out.data(), out.size()))
      throw comm_error(world_rank(), "ireduce_scatter: input and output buffers overlap");
    auto r = make_collective("ireduce_scatter", out.size() * sizeof(T));
    try_mpi(MPI_Ireduce_scatter_block(in.data(), out.data(), count_of(out.size(), "ireduce_scatter"),
                                      detail::mpi::datatype<T>(), detail::mpi::mpi_op(op), h_->c, &r->req),
            "MPI_Ireduce_scatter_block");
    return r;
  }
  //! Non-blocking `all_to_all` (`in` and `out` must not overlap).
  template <comm_element T>
  request iall_to_all(std::span<const T> in, std::span<T> out) {
    check_live();
    if (auto rule = detail::all_to_all_rule("iall_to_all", in.size(), out.size(), size(),
                                            detail::overlapping(in.data(), in.size(), out.data(), out.size()));
        !rule.empty())
      throw comm_error(world_rank(), rule);
    const int k = count_of(in.size() / static_cast<std::size_t>(size()), "iall_to_all");
    auto r = make_collective("iall_to_all", in.size() * sizeof(T));
    try_mpi(MPI_Ialltoall(in.data(), k, detail::mpi::datatype<T>(), out.data(), k, detail::mpi::datatype<T>(), h_->c,
                          &r->req),
            "MPI_Ialltoall");
    return r;
  }

  //! Returns when every rank of the group called `barrier`.
  void barrier() {
    check_live();
    MPI_Request r = MPI_REQUEST_NULL;
    try_mpi(MPI_Ibarrier(h_->c, &r), "MPI_Ibarrier");
    collective(r, "barrier");
  }

  //! Collective: the ranks passing the same `color` (>= 0) form a group ordered by `key`, then
  //! rank. The exchange of colours is bounded; the final `MPI_Comm_split` runs once every rank
  //! is known to have arrived.
  comm split(int color, int key) {
    check_live();
    if (color < 0) throw comm_error(world_rank(), "split: color " + std::to_string(color) + " is negative");
    std::int32_t mine[3] = {color, key, world_rank()};
    std::vector<std::int32_t> all(static_cast<std::size_t>(3 * size()));
    all_gather(std::span<const std::int32_t>(mine, 3), std::span<std::int32_t>(all));
    std::vector<int> members;
    for (int j = 0; j < size(); ++j)
      if (all[static_cast<std::size_t>(3 * j)] == color) members.push_back(j);
    // By key, ties in rank order (members is ascending and unique); std::sort rather than
    // std::stable_sort, whose libstdc++ 12 body warns under clang (deprecated get_temporary_buffer).
    std::sort(members.begin(), members.end(), [&](int a, int b) {
      const auto ka = all[static_cast<std::size_t>(3 * a + 1)], kb = all[static_cast<std::size_t>(3 * b + 1)];
      return ka != kb ? ka < kb : a < b;
    });
    std::vector<int> wr;
    int my_index = 0;
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] == rank_) my_index = static_cast<int>(i);
      wr.push_back(all[static_cast<std::size_t>(3 * members[i] + 2)]);
    }
    auto h = std::make_shared<detail::mpi::comm_handle>();
    try_mpi(MPI_Comm_split(h_->c, color, key, &h->c), "MPI_Comm_split");
    MPI_Comm_set_errhandler(h->c, MPI_ERRORS_RETURN);
    comm c(w_, std::move(h), std::move(wr));
    int got = -1;
    MPI_Comm_rank(c.h_->c, &got);
    if (got != my_index)
      throw comm_error(world_rank(), "split: MPI placed this rank at " + std::to_string(got) + ", expected " +
                                         std::to_string(my_index));
    c.timeout_ = timeout_;
    return c;
  }

  //! Aborts the world: every rank's pending and later calls throw a `comm_error` naming this
  //! rank and `reason`, as soon as they poll (within a millisecond or so of the notice arriving).
  void abort(std::string reason) { w_->abort(world_rank(), "aborted the communicator: " + reason, true); }

  //! Aborts with a caller-chosen cause sentence (used by `run_mpi`: "threw: <what()>").
  void abort_with_cause(std::string cause) { w_->abort(world_rank(), std::move(cause), true); }

  //! Whether the world was aborted (polls for a notice first).
  bool aborted() const {
    w_->poll();
    return w_->aborted.load();
  }

 private:
  comm(std::shared_ptr<detail::mpi::world_state> w, std::shared_ptr<detail::mpi::comm_handle> h, std::vector<int> wr)
      : w_(std::move(w)), h_(std::move(h)), world_ranks_(std::move(wr)) {
    MPI_Comm_rank(h_->c, &rank_);
  }

  request make_request(int peer, std::size_t size, bool is_send) const {
    auto r = std::make_shared<detail::mpi::request_state>();
    r->size = size;
    r->peer = world_ranks_[static_cast<std::size_t>(peer)];
    r->is_send = is_send;
    return r;
  }

  request make_collective(const char* name, std::size_t bytes) const {
    auto r = std::make_shared<detail::mpi::request_state>();
    r->size = bytes;
    r->peer = world_rank();
    r->coll = name;
    return r;
  }

  void finish(detail::mpi::request_state& r, int rc, MPI_Status& st) {
    r.done = true;
    if (r.coll != nullptr) {
      if (rc != MPI_SUCCESS)
        throw comm_error(world_rank(), std::string(r.coll) + " failed: " + detail::mpi::error_text(rc));
      return;
    }
    if (rc != MPI_SUCCESS)
      throw comm_error(world_rank(), std::string(r.is_send ? "send of " : "receive of ") + std::to_string(r.size) +
                                         " bytes " + (r.is_send ? "to" : "from") + " rank " + std::to_string(r.peer) +
                                         " failed: " + detail::mpi::error_text(rc) +
                                         (r.is_send ? "" : " (the matching send was larger)"));
    if (!r.is_send) {
      int got = 0;
      MPI_Get_count(&st, MPI_BYTE, &got);
      if (static_cast<std::size_t>(got) != r.size)
        throw comm_error(world_rank(), "rank " + std::to_string(r.peer) + " sent " + std::to_string(got) +
                                           " bytes, whose matching receive expects " + std::to_string(r.size) +
                                           " bytes (sends and receives are matched per peer in FIFO order and must have equal sizes)");
    }
  }

  void check_live() const {
    if (w_->aborted.load(std::memory_order_acquire)) throw w_->error();
  }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size())
      throw comm_error(world_rank(), std::string("cannot ") + what + " rank " + std::to_string(peer) +
                                         ": the group has ranks 0.." + std::to_string(size() - 1));
  }
  int count_of(std::size_t n, const char* what) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw comm_error(world_rank(), std::string(what) + ": " + std::to_string(n) +
                                         " elements exceed MPI's int count limit");
    return static_cast<int>(n);
  }
  void try_mpi(int rc, const char* call) const {
    if (rc != MPI_SUCCESS) throw comm_error(world_rank(), std::string(call) + " failed: " + detail::mpi::error_text(rc));
  }

  //! Polls `r` to completion: bounded by the timeout, broken by an abort notice. Returns the
  //! MPI return code of the completing test.
  template <class What>
  int progress(MPI_Request& r, MPI_Status* st, What&& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (unsigned i = 0;; ++i) {
      int flag = 0;
      int rc = MPI_Test(&r, &flag, st);
      if (rc != MPI_SUCCESS || flag) return rc;
      w_->poll();
      check_live();
      if ((i & 15u) == 15u && std::chrono::steady_clock::now() > deadline) {
        std::string cause = "timed out after " + std::to_string(timeout_.count()) + " ms " + what();
        w_->abort(world_rank(), cause, true);
        throw w_->error();
      }
      if (i < 256)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void collective(MPI_Request& r, const char* name) {
    MPI_Status st;
    int rc = progress(r, &st, [&] { return std::string("in ") + name + " waiting for the other ranks of the group"; });
    if (rc != MPI_SUCCESS) throw comm_error(world_rank(), std::string(name) + " failed: " + detail::mpi::error_text(rc));
  }

  std::shared_ptr<detail::mpi::world_state> w_;
  std::shared_ptr<detail::mpi::comm_handle> h_;
  std::vector<int> world_ranks_;
  int rank_ = 0;
  std::chrono::milliseconds timeout_ = default_comm_timeout;
};

static_assert(communicator<comm>);

}  // namespace mpi

//! Runs `f(comm&)` on this process's rank of a new world over `MPI_COMM_WORLD` (MPI must be
//! initialized). If `f` throws, the world is aborted with "threw: <what()>" so that no other
//! rank hangs, and the exception is rethrown. `timeout` bounds every wait.
template <class F>
  requires std::invocable<F&, mpi::comm&>
void run_mpi(F f, std::chrono::milliseconds timeout = default_comm_timeout) {
  auto c = mpi::comm::world();
  c.set_timeout(timeout);
  try {
    f(c);
  } catch (const comm_error& e) {
    c.abort_with_cause(std::string("failed: ") + e.what());  // no-op when this error is an abort
    throw;
  } catch (const std::exception& e) {
    c.abort_with_cause(std::string("threw: ") + e.what());
    throw;
  } catch (...) {
    c.abort_with_cause("threw an exception");
    throw;
  }
}

}  // namespace loom
