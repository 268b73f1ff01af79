// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::threads`: a communicator whose ranks are threads of one process.
//!
//! Transport. Every ordered pair of ranks (p, q) has a channel holding the sends p posted to q
//! that q has not received yet and the receives q posted from p that no send matched yet. The
//! call that finds its partner at the head of the other queue pairs the two (under the channel's
//! lock, so pairing follows posting order: per-peer FIFO as in NCCL) and then copies the bytes
//! once, straight from the sender's buffer into the receiver's buffer, outside the lock: no
//! intermediate copy. The waiting rank is woken through its doorbell (a mutex and condition
//! variable per rank).
//!
//! Allocation. A request's control block comes from its rank's pool and goes back to it once the
//! last handle on the request is gone and the operation completed (whichever happens last); the
//! channel queues are intrusive lists threaded through the control blocks. So `isend`, `irecv`,
//! `wait` and `test` allocate only while the pool grows, i.e. when a rank holds more requests at
//! once than it ever did before; a loop that repeats the same pattern (a training step) allocates
//! in its first iteration at most. Collectives reuse one scratch buffer per communicator, grown
//! to the largest slice seen. Errors (their messages) may allocate.
//!
//! Collectives are zero-copy too: the ranks publish their buffer addresses, meet, read each
//! other's buffers directly, and meet again before anyone returns, so no buffer is released
//! while another rank reads it. `all_reduce` is parallel: rank r reduces the r-th slice of the
//! vector over all ranks in rank order into a private scratch area, and after a second meeting
//! writes it into every rank's buffer; every rank therefore gets bitwise-identical sums.
//!
//! Failures. An abort (explicit, or by a timeout, or by `run_threads` after an exception) is
//! shared by the world and every communicator split from it: it wakes every waiting rank, which
//! throws a `comm_error` naming the rank that aborted and why. Waits are bounded by the
//! communicator's timeout.
//!
//! Threading. One communicator object is driven by one thread at a time (its owner rank);
//! `abort` may be called from any thread.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace loom {
namespace detail::thr {

struct group;

//! What every communicator of one world shares: the abort state and the groups to wake.
struct world_state {
  std::atomic<bool> aborted{false};
  std::mutex m;
  int abort_rank = -1;
  std::string abort_cause;
  std::vector<std::weak_ptr<group>> groups;

  //! Records the first abort (later ones are ignored) and wakes every waiting rank.
  inline void abort(int rank, std::string cause);

  comm_error error() {
    std::lock_guard lk(m);
    return comm_error(abort_rank, abort_cause);
  }
};

//! A mutex and condition variable a rank sleeps on while it waits for a request.
struct doorbell {
  std::mutex m;
  std::condition_variable cv;

  void ring() {
    { std::lock_guard lk(m); }
    cv.notify_all();
  }
};

struct op_pool;

//! The low two bits of `p2p_op::word`: 0 pending, 1 done, 2 failed (see `error`).
inline constexpr unsigned op_state_mask = 3u;
//! One request handle in `p2p_op::word` (the bits above the state count the handles).
inline constexpr unsigned op_ref = 4u;

//! One posted send or receive: a pooled control block. Its state and the number of request
//! handles on it share one atomic word, so that exactly one party sees the block become free
//! (no handle left and the operation finished) and returns it to its pool.
struct p2p_op {
  std::atomic<unsigned> word{0};
  const std::byte* sdata = nullptr;
  std::byte* rdata = nullptr;
  std::size_t size = 0;
  doorbell* owner = nullptr;
  int peer = -1;  // world rank of the partner, for messages
  bool is_send = false;
  const char* coll = nullptr;  // the non-blocking collective's name, or nullptr for a send/receive
  std::string error;
  p2p_op* next = nullptr;   // the channel queue while pending, the pool's free list while free
  op_pool* pool = nullptr;  // where the block goes back
};

//! The control blocks of one rank of one group. Only the rank's driving thread takes blocks
//! (`acquire`); any thread may give one back (`recycle`: a lock-free push onto `returned`, which
//! the taker empties in one exchange, so there is no ABA hazard). The pool lives while its group
//! does or while any of its blocks is in use (`refs`), so a request may outlive its communicator.
struct op_pool {
  std::atomic<std::size_t> refs{1};  // the group's, plus one per block in use
  std::atomic<p2p_op*> returned{nullptr};
  p2p_op* free = nullptr;  // the taker's private free list
  std::size_t capacity = 0;
  struct chunk {
    std::unique_ptr<p2p_op[]> ops;
    std::unique_ptr<chunk> next;
  };
  std::unique_ptr<chunk> chunks;

  //! A free block (allocates only when every block is in use: the pool doubles).
  p2p_op* acquire() {
    if (free == nullptr) free = returned.exchange(nullptr, std::memory_order_acquire);
    if (free == nullptr) grow();
    p2p_op* op = free;
    free = op->next;
    op->next = nullptr;
    refs.fetch_add(1, std::memory_order_relaxed);
    return op;
  }
  //! Gives a block back (any thread); the last reference frees the pool.
  void recycle(p2p_op* op) noexcept {
    p2p_op* head = returned.load(std::memory_order_relaxed);
    do {
      op->next = head;
    } while (!returned.compare_exchange_weak(head, op, std::memory_order_release, std::memory_order_relaxed));
    unref();
  }
  void unref() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  void grow() {
    const std::size_t n = capacity == 0 ? 16 : capacity;
    auto c = std::make_unique<chunk>();
    c->ops = std::make_unique<p2p_op[]>(n);
    for (std::size_t i = 0; i < n; ++i) {
      c->ops[i].pool = this;
      c->ops[i].next = i + 1 < n ? &c->ops[i + 1] : nullptr;
    }
    free = &c->ops[0];
    c->next = std::move(chunks);
    chunks = std::move(c);
    capacity += n;
  }
};

//! Drops one handle on `op`; the block goes back to its pool if the operation finished too.
inline void release(p2p_op* op) noexcept {
  const unsigned old = op->word.fetch_sub(op_ref, std::memory_order_acq_rel);
  if (old / op_ref == 1 && (old & op_state_mask) != 0) op->pool->recycle(op);
}

//! Publishes the outcome of `op` (1 done, 2 failed). The caller must not touch `op` afterwards:
//! if no handle is left the block goes back to its pool here.
inline void finish(p2p_op& op, unsigned state) noexcept {
  const unsigned old = op.word.fetch_or(state, std::memory_order_acq_rel);
  if (old / op_ref == 0) op.pool->recycle(&op);
}

//! A FIFO of pending operations, linked through `p2p_op::next` (never allocates).
struct op_queue {
  p2p_op* head = nullptr;
  p2p_op* tail = nullptr;

  bool empty() const noexcept { return head == nullptr; }
  void push(p2p_op* op) noexcept {
    op->next = nullptr;
    if (tail != nullptr) tail->next = op;
    else head = op;
    tail = op;
  }
  p2p_op* pop() noexcept {
    p2p_op* op = head;
    head = op->next;
    if (head == nullptr) tail = nullptr;
    op->next = nullptr;
    return op;
  }
};

//! Posted, not yet matched sends from p to q and receives at q from p.
struct channel {
  std::mutex m;
  op_queue sends;
  op_queue recvs;
};

//! Everything a rank publishes for one collective call.
struct coll_slot {
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t in_count = 0;
  std::size_t out_count = 0;
  int type_tag = 0;
  int op = 0;
  int kind = 0;
  int color = 0;
  int key = 0;
  int root = 0;                 // broadcast, reduce: the root rank
  std::shared_ptr<group> made;  // split: the new group, published by its leader
};

//! One rank's part of a non-blocking collective: its buffers and its request.
struct nb_part {
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t in_count = 0;
  std::size_t out_count = 0;
  int type_tag = 0;
  int op = 0;
  int kind = 0;
  p2p_op* req = nullptr;
};

//! A non-blocking collective being assembled: the `seq`-th one posted by each rank of the group.
//! The rank that posts last runs it (`run`, typed by the element type) and completes every part.
struct nb_coll {
  std::uint64_t seq = 0;
  int arrived = 0;
  std::vector<nb_part> parts;
  void (*run)(nb_coll&) = nullptr;
};

//! The state of one group of ranks (a world or a split sub-group).
struct group {
  std::shared_ptr<world_state> world;
  int n = 0;
  std::vector<int> world_ranks;
  std::unique_ptr<channel[]> channels;  // [from * n + to]
  std::unique_ptr<doorbell[]> bells;    // [rank]
  std::unique_ptr<coll_slot[]> slots;   // [rank]
  std::vector<op_pool*> pools;          // [rank], each holding one reference
  std::mutex cm;
  std::condition_variable ccv;
  std::uint64_t generation = 0;
  int arrived = 0;
  std::mutex nbm;                               // guards nb_open
  std::vector<std::unique_ptr<nb_coll>> nb_open;  // non-blocking collectives not every rank posted yet

  group(std::shared_ptr<world_state> w, std::vector<int> wr)
      : world(std::move(w)),
        n(static_cast<int>(wr.size())),
        world_ranks(std::move(wr)),
        channels(new channel[static_cast<std::size_t>(n) * static_cast<std::size_t>(n)]),
        bells(new doorbell[static_cast<std::size_t>(n)]),
        slots(new coll_slot[static_cast<std::size_t>(n)]) {
    pools.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) pools.push_back(new op_pool);
  }

  group(const group&) = delete;
  group& operator=(const group&) = delete;

  //! Operations still queued were never matched: they fail (a handle that outlives the group
  //! then frees its block), and the group drops its reference on every pool.
  ~group() {
    const auto cells = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
    for (std::size_t i = 0; i < cells; ++i)
      for (op_queue* q : {&channels[i].sends, &channels[i].recvs})
        while (!q->empty()) finish(*q->pop(), 2);
    for (auto& c : nb_open)
      for (auto& part : c->parts)
        if (part.req != nullptr) {
          part.req->error = "a non-blocking collective was never posted by every rank of its group";
          finish(*part.req, 2);
        }
    for (op_pool* p : pools) p->unref();
  }

  channel& chan(int from, int to) { return channels[static_cast<std::size_t>(from) * static_cast<std::size_t>(n) + static_cast<std::size_t>(to)]; }

  static std::shared_ptr<group> make(std::shared_ptr<world_state> w, std::vector<int> world_ranks) {
    auto g = std::make_shared<group>(w, std::move(world_ranks));
    std::lock_guard lk(w->m);
    std::erase_if(w->groups, [](const std::weak_ptr<group>& p) { return p.expired(); });
    w->groups.push_back(g);
    return g;
  }

  void wake_all() {
    for (int r = 0; r < n; ++r) bells[static_cast<std::size_t>(r)].ring();
    { std::lock_guard lk(cm); }
    ccv.notify_all();
  }
};

inline void world_state::abort(int rank, std::string cause) {
  std::vector<std::shared_ptr<group>> live;
  {
    std::lock_guard lk(m);
    if (aborted.load(std::memory_order_relaxed)) return;
    abort_rank = rank;
    abort_cause = std::move(cause);
    aborted.store(true, std::memory_order_release);
    for (auto& w : groups)
      if (auto g = w.lock()) live.push_back(std::move(g));
  }
  for (auto& g : live) g->wake_all();
}

//! Completes a matched pair: one copy from the sender's buffer into the receiver's. Neither
//! block is touched after `finish` (its owner may reuse it at once).
inline void complete_pair(p2p_op& s, p2p_op& r, int sender_world, int receiver_world) {
  doorbell* sbell = s.owner;
  doorbell* rbell = r.owner;
  unsigned outcome = 1;
  if (s.size != r.size) {
    std::string msg = "rank " + std::to_string(sender_world) + " sent " + std::to_string(s.size) +
                      " bytes to rank " + std::to_string(receiver_world) +
                      ", whose matching receive expects " + std::to_string(r.size) +
                      " bytes (sends and receives are matched per peer in FIFO order and must have equal sizes)";
    s.error = msg;
    r.error = std::move(msg);
    outcome = 2;
  } else if (s.size != 0) {
    std::memcpy(r.rdata, s.sdata, s.size);
  }
  finish(s, outcome);
  finish(r, outcome);
  sbell->ring();
  if (rbell != sbell) rbell->ring();
}

//! A small integer identifying an arithmetic type's representation, so that ranks calling a
//! collective with different element types are detected.
template <class T>
constexpr int type_tag() {
  return static_cast<int>(sizeof(T)) * 4 + (std::is_floating_point_v<T> ? 2 : 0) + (std::is_signed_v<T> ? 1 : 0);
}

//! Names of the collective kinds (1 all_reduce, 2 all_gather, 3 reduce_scatter, 4 all_to_all).
inline const char* nb_name(int kind) {
  switch (kind) {
    case 1: return "iall_reduce";
    case 2: return "iall_gather";
    case 3: return "ireduce_scatter";
    case 4: return "iall_to_all";
  }
  return "?";
}

//! Runs a non-blocking collective of element type `T` once every rank posted its part (on the
//! thread of the rank that posted last), in rank order as the blocking forms do, then completes
//! every part. Reductions go through a private buffer, so in-place arguments are fine.
template <class T>
void run_nb(nb_coll& c) {
  const auto n = c.parts.size();
  const nb_part& a = c.parts[0];
  std::string error;
  for (std::size_t j = 1; j < n && error.empty(); ++j) {
    const nb_part& b = c.parts[j];
    if (a.kind != b.kind || a.type_tag != b.type_tag || a.in_count != b.in_count || a.out_count != b.out_count ||
        ((a.kind == 1 || a.kind == 3) && a.op != b.op))
      error = std::string("non-blocking collective #") + std::to_string(c.seq) + ": rank " + std::to_string(j) +
              " posted " + nb_name(b.kind) + " of " + std::to_string(b.in_count) + " input elements but rank 0 posted " +
              nb_name(a.kind) + " of " + std::to_string(a.in_count) +
              " (every rank must post the same collectives in the same order, with the same type, size and reduction)";
  }
  if (error.empty()) {
    auto in = [&](std::size_t j) { return static_cast<const T*>(c.parts[j].in); };
    auto out = [&](std::size_t j) { return static_cast<T*>(c.parts[j].out); };
    auto reduce = [&](std::vector<T>& acc, std::size_t base) {
      const auto op = static_cast<reduce_op>(a.op);
      std::memcpy(acc.data(), in(0) + base, acc.size() * sizeof(T));
      for (std::size_t j = 1; j < n; ++j)
        for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = reduce_apply(op, acc[i], in(j)[base + i]);
    };
    if (a.kind == 1) {
      std::vector<T> acc(a.in_count);
      if (!acc.empty()) {
        reduce(acc, 0);
        for (std::size_t j = 0; j < n; ++j) std::memcpy(out(j), acc.data(), acc.size() * sizeof(T));
      }
    } else if (a.kind == 2) {
      const std::size_t k = a.in_count;
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = 0; j < n && k != 0; ++j)
          if (in(j) != out(r) + j * k) std::memcpy(out(r) + j * k, in(j), k * sizeof(T));
    } else if (a.kind == 3) {
      const std::size_t k = a.out_count;
      std::vector<T> all(n * k), acc(k);
      for (std::size_t r = 0; r < n && k != 0; ++r) {
        reduce(acc, r * k);
        std::memcpy(all.data() + r * k, acc.data(), k * sizeof(T));
      }
      for (std::size_t r = 0; r < n && k != 0; ++r) std::memcpy(out(r), all.data() + r * k, k * sizeof(T));
    } else {
      const std::size_t k = a.in_count / n;
      for (std::size_t r = 0; r < n && k != 0; ++r)
        for (std::size_t j = 0; j < n; ++j) std::memcpy(out(r) + j * k, in(j) + r * k, k * sizeof(T));
    }
  }
  for (auto& part : c.parts) {
    p2p_op* op = std::exchange(part.req, nullptr);
    doorbell* bell = op->owner;
    if (!error.empty()) op->error = error;
    finish(*op, error.empty() ? 1u : 2u);
    bell->ring();
  }
}

//! Yields before sleeping: a short spin keeps the latency of a hand-off low when a core is free.
inline constexpr int spin_iterations = 64;

}  // namespace detail::thr

namespace threads {

class comm;

//! Handle on one posted send or receive of a `threads::comm`; copies refer to the same
//! operation. Copying, moving and dropping handles never allocate (an atomic count). The
//! operation's control block returns to its rank's pool when the last handle is gone and the
//! operation completed; dropping every handle of a pending operation does not cancel it (its
//! buffer must stay valid until the partner matched it). A default-constructed or moved-from
//! handle is empty; `wait` and `test` reject it.
class request {
 public:
  //! An empty handle.
  request() noexcept = default;
  //! Another handle on the same operation.
  request(const request& o) noexcept : op_(o.op_) {
    if (op_ != nullptr) op_->word.fetch_add(detail::thr::op_ref, std::memory_order_relaxed);
  }
  //! Takes `o`'s operation; `o` becomes empty.
  request(request&& o) noexcept : op_(std::exchange(o.op_, nullptr)) {}
  request& operator=(const request& o) noexcept {
    request t(o);
    swap(t);
    return *this;
  }
  request& operator=(request&& o) noexcept {
    request t(std::move(o));
    swap(t);
    return *this;
  }
  ~request() {
    if (op_ != nullptr) detail::thr::release(op_);
  }
  //! Exchanges the operations of two handles.
  void swap(request& o) noexcept { std::swap(op_, o.op_); }
  //! Whether the handle refers to an operation.
  explicit operator bool() const noexcept { return op_ != nullptr; }

 private:
  friend class comm;
  explicit request(detail::thr::p2p_op* op) noexcept : op_(op) {}
  detail::thr::p2p_op* op_ = nullptr;
};

//! A rank's handle on a group of threads (see the file comment). Created by `world(n)` or
//! `split`; movable, not copyable; one thread drives it at a time.
class comm {
 public:
  //! Handle on one posted send or receive (see `threads::request`).
  using request = ::loom::threads::request;
  //! Reductions combine the ranks in rank order on every rank (see `loom::reduces_in_rank_order`).
  static constexpr bool rank_ordered_reductions = true;

  comm(comm&&) noexcept = default;
  comm& operator=(comm&&) noexcept = default;
  comm(const comm&) = delete;
  comm& operator=(const comm&) = delete;

  //! This rank's index in the group, 0..size()-1.
  int rank() const { return rank_; }
  //! The number of ranks in the group.
  int size() const { return g_->n; }
  //! This rank's index in the world the group was split from (the rank named in errors).
  int world_rank() const { return g_->world_ranks[static_cast<std::size_t>(rank_)]; }

  //! Bounds every later blocking call of this communicator; must be positive.
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0)
      throw comm_error(world_rank(), "timeout " + std::to_string(t.count()) + " ms is not positive");
    timeout_ = t;
  }
  //! The current timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }

  //! Posts a send of `data` to `peer` (asynchronous: `data` must stay valid and unchanged
  //! until the request completes). Matched with `peer`'s receives from this rank in FIFO order.
  //! Allocation-free once this rank's request pool is warm (see the file comment).
  request isend(int peer, std::span<const std::byte> data) {
    check_live();
    check_peer(peer, "send to");
    detail::thr::p2p_op* op = post(peer, data.size(), true);
    op->sdata = data.data();
    request req(op);
    auto& ch = g_->chan(rank_, peer);
    detail::thr::p2p_op* match = nullptr;
    {
      std::lock_guard lk(ch.m);
      if (!ch.recvs.empty()) match = ch.recvs.pop();
      else ch.sends.push(op);
    }
    if (match != nullptr) detail::thr::complete_pair(*op, *match, world_rank(), op->peer);
    return req;
  }

  //! Posts a receive of exactly `data.size()` bytes from `peer` into `data` (valid until the
  //! request completes). Matched with `peer`'s sends to this rank in FIFO order.
  //! Allocation-free once this rank's request pool is warm (see the file comment).
  request irecv(int peer, std::span<std::byte> data) {
    check_live();
    check_peer(peer, "receive from");
    detail::thr::p2p_op* op = post(peer, data.size(), false);
    op->rdata = data.data();
    request req(op);
    auto& ch = g_->chan(peer, rank_);
    detail::thr::p2p_op* match = nullptr;
    {
      std::lock_guard lk(ch.m);
      if (!ch.sends.empty()) match = ch.sends.pop();
      else ch.recvs.push(op);
    }
    if (match != nullptr) detail::thr::complete_pair(*match, *op, op->peer, world_rank());
    return req;
  }

  //! Whether `req` completed (throws if it failed or the communicator was aborted).
  bool test(request& req) {
    check_live();
    const unsigned st = state_of(req, "test");
    if (st == 2) throw comm_error(-1, req.op_->error);
    return st == 1;
  }

  //! Waits until `req` completes; throws `comm_error` when it failed, when the communicator is
  //! aborted, or after the timeout (which then aborts the communicator on every rank).
  void wait(request& req) {
    check_live();
    (void)state_of(req, "wait");
    auto& op = *req.op_;
    auto pending = [&op] { return (op.word.load(std::memory_order_acquire) & detail::thr::op_state_mask) == 0; };
    for (int i = 0; i < detail::thr::spin_iterations && pending(); ++i) std::this_thread::yield();
    if (pending()) {
      auto deadline = std::chrono::steady_clock::now() + timeout_;
      std::unique_lock lk(op.owner->m);
      bool ok = op.owner->cv.wait_until(lk, deadline, [&] {
        return !pending() || g_->world->aborted.load(std::memory_order_acquire);
      });
      lk.unlock();
      if (!ok && op.coll != nullptr)
        fail_timeout(std::string("waiting for a non-blocking ") + op.coll + " of " + std::to_string(op.size) +
                     " bytes (waiting for the other ranks of the group)");
      if (!ok)
        fail_timeout(std::string("waiting for a ") + (op.is_send ? "send of " : "receive of ") +
                     std::to_string(op.size) + " bytes " + (op.is_send ? "to" : "from") + " rank " +
                     std::to_string(op.peer));
    }
    if ((op.word.load(std::memory_order_acquire) & detail::thr::op_state_mask) == 2) throw comm_error(-1, op.error);
    check_live();
  }

  //! The number of request control blocks this rank's pool holds (in use or free) in this
  //! communicator's group. It grows only when the rank holds more requests at once than ever
  //! before; after a warm-up iteration of a repeated pattern it stays constant.
  std::size_t request_pool_capacity() const { return g_->pools[static_cast<std::size_t>(rank_)]->capacity; }

  //! Element-wise reduction of `data` over all ranks (rank order), result in `data` on every rank.
  template <comm_element T>
  void all_reduce(std::span<T> data, reduce_op op) {
    check_live();
    if (size() == 1) return;
    publish(data.data(), data.data(), data.size(), data.size(), detail::thr::type_tag<T>(), op, 1);
    meet("all_reduce");
    check_same("all_reduce", true);
    auto [lo, hi] = slice(data.size(), rank_);
    auto tmp = scratch<T>(hi - lo);
    reduce_segment(op, tmp, lo);
    meet("all_reduce");
    if (hi > lo)
      for (int j = 0; j < size(); ++j) std::memcpy(out_of<T>(j) + lo, tmp.data(), (hi - lo) * sizeof(T));
    meet("all_reduce");
  }

  //! Rank `root`'s `data` copied into every rank's `data` (equal sizes on every rank).
  template <comm_element T>
  void broadcast(std::span<T> data, int root) {
    check_live();
    check_root("broadcast", root);
    if (size() == 1) return;
    publish(data.data(), data.data(), data.size(), data.size(), detail::thr::type_tag<T>(), reduce_op::sum, 6).root = root;
    meet("broadcast");
    check_same("broadcast", false);
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), in_of<T>(root), data.size() * sizeof(T));
    meet("broadcast");
  }

  //! The element-wise reduction of every rank's `data` (rank order, as `all_reduce`) into rank
  //! `root`'s `data`; the other ranks' `data` is left as it was. Each rank reduces a slice, then
  //! the root's buffer receives them all.
  template <comm_element T>
  void reduce(std::span<T> data, int root, reduce_op op) {
    check_live();
    check_root("reduce", root);
    if (size() == 1) return;
    publish(data.data(), data.data(), data.size(), data.size(), detail::thr::type_tag<T>(), op, 7).root = root;
    meet("reduce");
    check_same("reduce", true);
    auto [lo, hi] = slice(data.size(), rank_);
    auto tmp = scratch<T>(hi - lo);
    reduce_segment(op, tmp, lo);
    meet("reduce");  // every slice reduced before the root's input is overwritten
    if (hi > lo) std::memcpy(out_of<T>(root) + lo, tmp.data(), (hi - lo) * sizeof(T));
    meet("reduce");
  }

  //! Concatenates every rank's `in` (equal sizes) into `out` (size() * in.size() elements) in
  //! rank order. `in` may be the rank's own segment of `out`.
  template <comm_element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_live();
    publish(in.data(), out.data(), in.size(), out.size(), detail::thr::type_tag<T>(), reduce_op::sum, 2);
    if (auto rule = detail::gather_rule("all_gather", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    meet("all_gather");
    check_same("all_gather", false);
    for (int j = 0; j < size(); ++j) {
      const T* src = in_of<T>(j);
      T* dst = out.data() + static_cast<std::size_t>(j) * in.size();
      if (src != dst && !in.empty()) std::memcpy(dst, src, in.size() * sizeof(T));
    }
    meet("all_gather");
  }

  //! Rank r receives in `out` the reduction over all ranks (rank order) of the r-th segment of
  //! their `in` (size() * out.size() elements). `out` may be the rank's own segment of `in`.
  template <comm_element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    check_live();
    publish(in.data(), out.data(), in.size(), out.size(), detail::thr::type_tag<T>(), op, 3);
    if (auto rule = detail::scatter_rule("reduce_scatter", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    meet("reduce_scatter");
    check_same("reduce_scatter", true);
    // Into scratch first: `out` may be this rank's own segment of `in`, still needed as input.
    auto tmp = scratch<T>(out.size());
    reduce_segment(op, tmp, static_cast<std::size_t>(rank_) * out.size());
    if (!out.empty()) std::memcpy(out.data(), tmp.data(), out.size() * sizeof(T));
    meet("reduce_scatter");
  }

  //! Rank r's `out` segment j receives rank j's `in` segment r (segments of in.size()/size()
  //! elements). `in` and `out` must not overlap.
  template <comm_element T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    check_live();
    publish(in.data(), out.data(), in.size(), out.size(), detail::thr::type_tag<T>(), reduce_op::sum, 4);
    if (auto rule = detail::all_to_all_rule("all_to_all", in.size(), out.size(), size(),
                                            detail::overlapping(in.data(), in.size(), out.data(), out.size()));
        !rule.empty())
      throw comm_error(world_rank(), rule);
    meet("all_to_all");
    check_same("all_to_all", false);
    const std::size_t k = in.size() / static_cast<std::size_t>(size());
    for (int j = 0; j < size(); ++j)
      if (k != 0)
        std::memcpy(out.data() + static_cast<std::size_t>(j) * k, in_of<T>(j) + static_cast<std::size_t>(rank_) * k,
                    k * sizeof(T));
    meet("all_to_all");
  }

  // ---- non-blocking collectives (loom::nonblocking_communicator) ----------------------------
  // Each returns a request at once; the k-th non-blocking collective posted by each rank of the
  // group forms one collective (independently of the blocking ones), which the rank posting last
  // runs on its own thread, in rank order as the blocking forms, and completes for every rank. So
  // no rank ever waits inside the call and no helper thread is needed; the wait is `wait(req)`.
  // Each call allocates (the assembly record and, for reductions, a scratch vector).

  //! Non-blocking `all_reduce`: `data` holds the result once the request completed.
  template <comm_element T>
  request iall_reduce(std::span<T> data, reduce_op op) {
    return post_collective<T>(1, data.data(), data.data(), data.size(), data.size(), op);
  }
  //! Non-blocking `all_gather` (`in` may be this rank's segment of `out`).
  template <comm_element T>
  request iall_gather(std::span<const T> in, std::span<T> out) {
    if (auto rule = detail::gather_rule("iall_gather", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    return post_collective<T>(2, in.data(), out.data(), in.size(), out.size(), reduce_op::sum);
  }
  //! Non-blocking `reduce_scatter` (`in` and `out` must not overlap).
  template <comm_element T>
  request ireduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    if (auto rule = detail::scatter_rule("ireduce_scatter", in.size(), out.size(), size()); !rule.empty())
      throw comm_error(world_rank(), rule);
    if (detail::overlapping(in.data(), in.size(), out.data(), out.size()))
      throw comm_error(world_rank(), "ireduce_scatter: input and output buffers overlap");
    return post_collective<T>(3, in.data(), out.data(), in.size(), out.size(), op);
  }
  //! Non-blocking `all_to_all` (`in` and `out` must not overlap).
  template <comm_element T>
  request iall_to_all(std::span<const T> in, std::span<T> out) {
    if (auto rule = detail::all_to_all_rule("iall_to_all", in.size(), out.size(), size(),
                                            detail::overlapping(in.data(), in.size(), out.data(), out.size()));
        !rule.empty())
      throw comm_error(world_rank(), rule);
    return post_collective<T>(4, in.data(), out.data(), in.size(), out.size(), reduce_op::sum);
  }

  //! Returns when every rank of the group called `barrier`.
  void barrier() {
    check_live();
    meet("barrier");
  }

  //! Collective: the ranks passing the same `color` (>= 0) form a new group, ordered by `key`
  //! then by rank. The new communicator shares the world's abort state and this one's timeout.
  comm split(int color, int key) {
    check_live();
    if (color < 0) throw comm_error(world_rank(), "split: color " + std::to_string(color) + " is negative");
    auto& me = g_->slots[static_cast<std::size_t>(rank_)];
    me.kind = 5;
    me.color = color;
    me.key = key;
    me.made.reset();
    meet("split");
    std::vector<int> members;
    for (int j = 0; j < size(); ++j)
      if (g_->slots[static_cast<std::size_t>(j)].color == color) members.push_back(j);
    // By key, ties in rank order (members is ascending and unique); std::sort rather than
    // std::stable_sort, whose libstdc++ 12 body warns under clang (deprecated get_temporary_buffer).
    std::sort(members.begin(), members.end(), [&](int a, int b) {
      const int ka = g_->slots[static_cast<std::size_t>(a)].key, kb = g_->slots[static_cast<std::size_t>(b)].key;
      return ka != kb ? ka < kb : a < b;
    });
    int my_index = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    int leader = *std::min_element(members.begin(), members.end());
    if (leader == rank_) {
      std::vector<int> wr;
      for (int j : members) wr.push_back(g_->world_ranks[static_cast<std::size_t>(j)]);
      me.made = detail::thr::group::make(g_->world, std::move(wr));
    }
    meet("split");
    auto made = g_->slots[static_cast<std::size_t>(leader)].made;
    meet("split");
    comm c(std::move(made), my_index);
    c.timeout_ = timeout_;
    return c;
  }

  //! Aborts the world: every pending and later call on every rank (of this communicator and of
  //! every communicator split from the same world) throws a `comm_error` naming this rank and
  //! `reason`. Thread-safe; the first abort wins.
  void abort(std::string reason) { g_->world->abort(world_rank(), "aborted the communicator: " + reason); }

  //! Whether the world was aborted.
  bool aborted() const { return g_->world->aborted.load(std::memory_order_acquire); }

  //! The world rank that aborted the world, or -1 while it is not aborted.
  int abort_rank() const {
    if (!aborted()) return -1;
    std::lock_guard lk(g_->world->m);
    return g_->world->abort_rank;
  }

  //! Throws the world's `comm_error` if it was aborted (a non-blocking check for callers that
  //! wait on something else, e.g. a CUDA stream).
  void check() const { check_live(); }

  //! Aborts the world because this rank waited `what` for longer than the timeout, and throws
  //! the resulting `comm_error` (for callers that bound their own waits by this communicator's
  //! timeout).
  [[noreturn]] void timed_out(const std::string& what) { fail_timeout(what); }

  //! Aborts with a caller-chosen cause sentence (used by `run_threads` to report the original
  //! failure, e.g. "threw: <what()>").
  void abort_with_cause(std::string cause) { g_->world->abort(world_rank(), std::move(cause)); }

  //! Creates the `n` communicators of a new world (rank i at index i).
  static std::vector<comm> make_world(int n) {
    if (n < 1) throw comm_error(-1, "a threads world needs at least 1 rank, got " + std::to_string(n));
    auto w = std::make_shared<detail::thr::world_state>();
    std::vector<int> ranks(static_cast<std::size_t>(n));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto g = detail::thr::group::make(w, std::move(ranks));
    std::vector<comm> out;
    out.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) out.push_back(comm(g, r));
    return out;
  }

 private:
  comm(std::shared_ptr<detail::thr::group> g, int r) : g_(std::move(g)), rank_(r) {}

  void check_live() const {
    if (g_->world->aborted.load(std::memory_order_acquire)) throw g_->world->error();
  }
  //! Posts this rank's part of the next non-blocking collective; runs it if it is the last part.
  template <class T>
  request post_collective(int kind, const T* in, T* out, std::size_t in_count, std::size_t out_count, reduce_op op) {
    check_live();
    const std::size_t bytes = (kind == 3 ? out_count : in_count) * sizeof(T);
    detail::thr::p2p_op* rq = post(rank_, bytes, false);
    rq->coll = detail::thr::nb_name(kind);
    request req(rq);  // the part in the group refers to the block without a handle of its own
    std::unique_ptr<detail::thr::nb_coll> ready;
    {
      std::lock_guard lk(g_->nbm);
      const std::uint64_t seq = nb_seq_++;
      auto it = std::find_if(g_->nb_open.begin(), g_->nb_open.end(), [&](auto const& c) { return c->seq == seq; });
      if (it == g_->nb_open.end()) {
        auto c = std::make_unique<detail::thr::nb_coll>();
        c->seq = seq;
        c->parts.resize(static_cast<std::size_t>(size()));
        g_->nb_open.push_back(std::move(c));
        it = std::prev(g_->nb_open.end());
      }
      auto& c = **it;
      c.parts[static_cast<std::size_t>(rank_)] = {in, out, in_count, out_count, detail::thr::type_tag<T>(),
                                                  static_cast<int>(op), kind, rq};
      if (rank_ == 0 || c.run == nullptr) c.run = &detail::thr::run_nb<T>;
      if (++c.arrived == size()) {
        ready = std::move(*it);
        g_->nb_open.erase(it);
      }
    }
    if (ready) ready->run(*ready);
    return req;
  }

  //! A fresh control block from this rank's pool, holding one handle, for a send or a receive.
  detail::thr::p2p_op* post(int peer, std::size_t size, bool is_send) {
    detail::thr::p2p_op* op = g_->pools[static_cast<std::size_t>(rank_)]->acquire();
    op->word.store(detail::thr::op_ref, std::memory_order_relaxed);
    op->sdata = nullptr;
    op->rdata = nullptr;
    op->size = size;
    op->owner = &g_->bells[static_cast<std::size_t>(rank_)];
    op->peer = g_->world_ranks[static_cast<std::size_t>(peer)];
    op->is_send = is_send;
    op->coll = nullptr;
    op->error.clear();
    return op;
  }
  //! The state bits of `req`'s operation; an empty handle is an error.
  unsigned state_of(const request& req, const char* what) const {
    if (req.op_ == nullptr)
      throw comm_error(world_rank(), std::string(what) + " on an empty request (default-constructed or moved from)");
    return req.op_->word.load(std::memory_order_acquire) & detail::thr::op_state_mask;
  }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size())
      throw comm_error(world_rank(), std::string("cannot ") + what + " rank " + std::to_string(peer) +
                                         ": the group has ranks 0.." + std::to_string(size() - 1));
  }
  [[noreturn]] void fail_timeout(const std::string& what) {
    std::string cause = "timed out after " + std::to_string(timeout_.count()) + " ms " + what;
    g_->world->abort(world_rank(), cause);
    throw g_->world->error();
  }

  detail::thr::coll_slot& publish(const void* in, void* out, std::size_t in_count, std::size_t out_count, int tag,
                                  reduce_op op, int kind) {
    auto& s = g_->slots[static_cast<std::size_t>(rank_)];
    s.in = in;
    s.out = out;
    s.in_count = in_count;
    s.out_count = out_count;
    s.type_tag = tag;
    s.op = static_cast<int>(op);
    s.kind = kind;
    return s;
  }

  //! A `comm_error` naming `root` when it is not a rank of this group.
  void check_root(const char* name, int root) const {
    if (std::string rule = detail::root_rule(name, root, size()); !rule.empty()) throw comm_error(world_rank(), rule);
  }

  //! Every rank agrees on the call, the element type, the sizes, (for reductions) the op and (for
  //! the rooted collectives) the root.
  void check_same(const char* name, bool with_op) const {
    const auto& a = g_->slots[0];
    for (int j = 1; j < size(); ++j) {
      const auto& b = g_->slots[static_cast<std::size_t>(j)];
      if (a.kind != b.kind || a.type_tag != b.type_tag || a.in_count != b.in_count || a.out_count != b.out_count ||
          (with_op && a.op != b.op) || ((a.kind == 6 || a.kind == 7) && a.root != b.root))
        throw comm_error(g_->world_ranks[static_cast<std::size_t>(j)],
                         std::string(name) + ": rank " + std::to_string(j) +
                             " called a different collective, element type, size, reduction or root than rank 0 (" +
                             std::to_string(b.in_count) + " vs " + std::to_string(a.in_count) + " input elements)");
    }
  }

  //! acc[i] = in_0[base+i] op in_1[base+i] op ... in rank order; rank-major loops so that the
  //! inner loop streams (and vectorizes), with the operator chosen outside it.
  template <class T>
  void reduce_segment(reduce_op op, std::span<T> acc, std::size_t base) const {
    if (acc.empty()) return;
    std::memcpy(acc.data(), in_of<T>(0) + base, acc.size() * sizeof(T));
    for (int j = 1; j < size(); ++j) {
      const T* src = in_of<T>(j) + base;
      T* a = acc.data();
      const std::size_t k = acc.size();
      switch (op) {
        case reduce_op::sum:
          for (std::size_t i = 0; i < k; ++i) a[i] = static_cast<T>(a[i] + src[i]);
          break;
        case reduce_op::max:
          for (std::size_t i = 0; i < k; ++i) a[i] = a[i] < src[i] ? src[i] : a[i];
          break;
        case reduce_op::min:
          for (std::size_t i = 0; i < k; ++i) a[i] = src[i] < a[i] ? src[i] : a[i];
          break;
      }
    }
  }

  template <class T>
  const T* in_of(int j) const {
    return static_cast<const T*>(g_->slots[static_cast<std::size_t>(j)].in);
  }
  template <class T>
  T* out_of(int j) const {
    return static_cast<T*>(g_->slots[static_cast<std::size_t>(j)].out);
  }

  //! The half-open range of the r-th of size() near-equal slices of `count` elements.
  std::pair<std::size_t, std::size_t> slice(std::size_t count, int r) const {
    const std::size_t n = static_cast<std::size_t>(size()), q = count / n, rem = count % n, ur = static_cast<std::size_t>(r);
    std::size_t lo = ur * q + std::min(ur, rem);
    return {lo, lo + q + (ur < rem ? 1 : 0)};
  }

  template <class T>
  std::span<T> scratch(std::size_t count) {
    const std::size_t blocks = (count * sizeof(T) + sizeof(scratch_block) - 1) / sizeof(scratch_block);
    if (scratch_.size() < blocks) scratch_.resize(blocks);
    return {reinterpret_cast<T*>(scratch_.data()), count};
  }

  //! A rendezvous of all ranks of the group, bounded by the timeout and broken by an abort.
  void meet(const char* what) {
    auto& g = *g_;
    std::unique_lock lk(g.cm);
    if (g.world->aborted.load(std::memory_order_acquire)) {
      lk.unlock();
      throw g.world->error();
    }
    const auto gen = g.generation;
    if (++g.arrived == g.n) {
      g.arrived = 0;
      ++g.generation;
      lk.unlock();
      g.ccv.notify_all();
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    bool ok = g.ccv.wait_until(lk, deadline, [&] {
      return g.generation != gen || g.world->aborted.load(std::memory_order_acquire);
    });
    bool passed = g.generation != gen;
    lk.unlock();
    if (passed) return;
    if (ok) throw g.world->error();
    fail_timeout(std::string("in ") + what + " waiting for the other ranks of the group");
  }

  std::shared_ptr<detail::thr::group> g_;
  int rank_ = 0;
  std::chrono::milliseconds timeout_ = default_comm_timeout;
  // Max-aligned raw storage. Not `std::vector<std::max_align_t>`: nvcc 13's front end aborts
  // (internal error in find_allocated_name_reference) on destroying that vector in a .cu file.
  struct alignas(alignof(std::max_align_t)) scratch_block {
    std::byte bytes[alignof(std::max_align_t)];
  };
  std::vector<scratch_block> scratch_;
  std::uint64_t nb_seq_ = 0;  // non-blocking collectives this rank posted on this group
};

static_assert(communicator<comm>);

//! The `n` communicators of a new world of threads (rank i at index i).
inline std::vector<comm> world(int n) { return comm::make_world(n); }

}  // namespace threads

//! Runs `f(comm&)` for every rank of a new `n`-rank threads world, each on its own thread.
//! If any rank throws, the world is aborted with "threw: <what()>" (so no rank hangs: the
//! others' pending and later calls throw `comm_error` naming it), every thread is joined, and
//! the exception that started the failure is rethrown. `timeout` bounds every wait.
template <class F>
  requires std::invocable<F&, threads::comm&>
void run_threads(int n, F f, std::chrono::milliseconds timeout = default_comm_timeout) {
  auto comms = threads::world(n);
  for (auto& c : comms) c.set_timeout(timeout);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::mutex order_m;
  std::vector<int> order;  // ranks in the order their exceptions were caught
  auto body = [&](int r) {
    auto& c = comms[static_cast<std::size_t>(r)];
    try {
      f(c);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      {
        std::lock_guard lk(order_m);
        order.push_back(r);
      }
      std::string cause = "threw an exception";
      try {
        throw;
      } catch (const comm_error& e) {
        cause = std::string("failed: ") + e.what();  // no-op when this error is the world's abort
      } catch (const std::exception& e) {
        cause = std::string("threw: ") + e.what();
      } catch (...) {
      }
      c.abort_with_cause(cause);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n > 0 ? n - 1 : 0));
  for (int r = 1; r < n; ++r) pool.emplace_back(body, r);
  body(0);
  for (auto& t : pool) t.join();
  if (order.empty()) return;
  // The error that started it: the exception of the rank that aborted the world, else the first.
  const int origin = comms[0].abort_rank();
  for (int r = 0; r < n; ++r)
    if (errors[static_cast<std::size_t>(r)] && comms[static_cast<std::size_t>(r)].world_rank() == origin)
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
  std::rethrow_exception(errors[static_cast<std::size_t>(order.front())]);
}

}  // namespace loom
