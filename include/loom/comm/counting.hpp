// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::counted<C>`: a communicator that forwards every call to a backend communicator `C` and
//! counts, per kind of operation, the calls and the bytes. `loom::mesh_comm` gives each mesh
//! dimension such a communicator, so a program can print what each dimension communicated in a
//! step, and tests can compare the counts with the papers' volume formulas.
//!
//! What is counted (on the calling rank, `n` the group size, `T` the element type):
//!
//! | operation | `bytes` (the message size, as nccl-tests' "size") | `bus_bytes` |
//! |---|---|---|
//! | send | the message | = bytes |
//! | recv | the message | 0 (counted at the sender) |
//! | all_reduce | the buffer: `data.size() * sizeof(T)` | bytes * 2(n-1)/n |
//! | all_gather | the output: `n * in.size() * sizeof(T)` | bytes * (n-1)/n |
//! | reduce_scatter | the input: `n * out.size() * sizeof(T)` | bytes * (n-1)/n |
//! | all_to_all | the input: `in.size() * sizeof(T)` | bytes * (n-1)/n |
//! | barrier | 0 | 0 |
//! | broadcast | the buffer | = bytes |
//! | reduce | the buffer | = bytes |
//!
//! `bus_bytes` is what one rank sends over its link in the bandwidth-optimal (ring) algorithm of
//! the collective: nccl-tests' bus-bandwidth factors (NVIDIA nccl-tests, doc/PERFORMANCE.md), so
//! that volumes of different collectives compare directly (an all-reduce moves as much as a
//! reduce-scatter followed by an all-gather of the same buffer; a broadcast and a reduce each move
//! the buffer once per link in their pipelined forms). Non-blocking collectives count
//! under their blocking names when posted. Size-1 groups count calls and bytes too (with
//! `bus_bytes` 0): the call happened, nothing crossed a link.
//!
//! Device communicators (`loom::device_communicator`: `cuda_local`, `nccl`) are counted the same
//! way: their collectives over device memory (the `stream` forms) under the same names with the
//! same byte formulas, their event-ordered sends and receives as `send` and `recv`; every other
//! call is forwarded, so a `counted<nccl::comm>` runs a pipeline and splits like the backend.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "loom/comm/comm_op.hpp"
#include "loom/comm/communicator.hpp"

namespace loom {

//! Calls and bytes of one kind of operation.
struct op_count {
  std::uint64_t calls = 0;  //!< operations posted
  std::uint64_t bytes = 0;  //!< message bytes (see the file comment)
  double bus_bytes = 0;     //!< bytes over this rank's link in the ring algorithm
  friend constexpr bool operator==(const op_count&, const op_count&) = default;
};

//! The counts of one communicator, per `comm_op`.
struct comm_counters {
  std::array<op_count, all_comm_ops.size()> ops{};  //!< indexed by `comm_op`

  //! The count of `op`.
  constexpr op_count& operator[](comm_op op) { return ops[static_cast<std::size_t>(op)]; }
  //! The count of `op`.
  constexpr const op_count& operator[](comm_op op) const { return ops[static_cast<std::size_t>(op)]; }
  //! Sets every count to zero.
  constexpr void reset() { ops = {}; }
  //! Records one operation of `bytes` on a group of `n` ranks.
  constexpr void add(comm_op op, std::size_t bytes, int n) {
    auto& c = (*this)[op];
    ++c.calls;
    c.bytes += bytes;
    c.bus_bytes += static_cast<double>(bytes) * bus_factor(op, n);
  }
  //! Element-wise difference (`*this` minus an earlier snapshot).
  constexpr comm_counters since(const comm_counters& before) const {
    comm_counters d;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      d.ops[i].calls = ops[i].calls - before.ops[i].calls;
      d.ops[i].bytes = ops[i].bytes - before.ops[i].bytes;
      d.ops[i].bus_bytes = ops[i].bus_bytes - before.ops[i].bus_bytes;
    }
    return d;
  }
  friend constexpr bool operator==(const comm_counters&, const comm_counters&) = default;
};

//! A communicator over `C` that counts its operations (see the file comment). Models
//! `loom::communicator`, and `loom::nonblocking_communicator` when `C` does, and
//! `loom::device_collective_communicator` when `C` does; its reductions are rank-ordered exactly
//! when `C`'s are. `split` returns a new `counted<C>` with zero counts.
template <group_communicator C>
class counted {
 public:
  using request = typename C::request;  //!< the backend's request
  //! Rank-ordered reductions when the backend's are.
  static constexpr bool rank_ordered_reductions = reduces_in_rank_order<C>;

  //! Wraps (takes) `inner`.
  explicit counted(C inner) : c_(std::move(inner)) {}

  //! The wrapped communicator (calls made on it directly are not counted).
  C& inner() { return c_; }
  //! The wrapped communicator.
  const C& inner() const { return c_; }
  //! The counts since construction or the last `reset_counters()`.
  const comm_counters& counters() const { return n_; }
  //! Sets every count to zero.
  void reset_counters() { n_.reset(); }

  //! This rank's index in the group.
  int rank() const { return c_.rank(); }
  //! The number of ranks.
  int size() const { return c_.size(); }
  //! This rank in the world (backends that know it).
  int world_rank() const
    requires requires(const C& c) { c.world_rank(); }
  {
    return c_.world_rank();
  }

  //! Counted `isend`.
  request isend(int peer, std::span<const std::byte> data) {
    auto r = c_.isend(peer, data);
    n_.add(comm_op::send, data.size(), 2);
    return r;
  }
  //! Counted `irecv`.
  request irecv(int peer, std::span<std::byte> data) {
    auto r = c_.irecv(peer, data);
    n_.add(comm_op::recv, data.size(), 2);
    return r;
  }
  //! Forwards `wait`.
  void wait(request& r) { c_.wait(r); }
  //! Forwards `test`.
  bool test(request& r) { return c_.test(r); }

  //! Counted `all_reduce`.
  template <comm_element T>
  void all_reduce(std::span<T> data, reduce_op op) {
    c_.all_reduce(data, op);
    n_.add(comm_op::all_reduce, data.size_bytes(), size());
  }
  //! Counted `all_gather`.
  template <comm_element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    c_.all_gather(in, out);
    n_.add(comm_op::all_gather, out.size_bytes(), size());
  }
  //! Counted `reduce_scatter`.
  template <comm_element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    c_.reduce_scatter(in, out, op);
    n_.add(comm_op::reduce_scatter, in.size_bytes(), size());
  }
  //! Counted `all_to_all`.
  template <comm_element T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    c_.all_to_all(in, out);
    n_.add(comm_op::all_to_all, in.size_bytes(), size());
  }

  //! Counted `broadcast` (communicators with it: `loom::rooted_communicator`).
  template <comm_element T>
    requires requires(C& c, std::span<T> d) { c.broadcast(d, 0); }
  void broadcast(std::span<T> data, int root) {
    c_.broadcast(data, root);
    n_.add(comm_op::broadcast, data.size_bytes(), size());
  }
  //! Counted `reduce` (communicators with it: `loom::rooted_communicator`).
  template <comm_element T>
    requires requires(C& c, std::span<T> d, reduce_op op) { c.reduce(d, 0, op); }
  void reduce(std::span<T> data, int root, reduce_op op) {
    c_.reduce(data, root, op);
    n_.add(comm_op::reduce, data.size_bytes(), size());
  }

  //! Counted `iall_reduce`.
  template <comm_element T>
    requires nonblocking_communicator<C>
  request iall_reduce(std::span<T> data, reduce_op op) {
    auto r = c_.iall_reduce(data, op);
    n_.add(comm_op::all_reduce, data.size_bytes(), size());
    return r;
  }
  //! Counted `iall_gather`.
  template <comm_element T>
    requires nonblocking_communicator<C>
  request iall_gather(std::span<const T> in, std::span<T> out) {
    auto r = c_.iall_gather(in, out);
    n_.add(comm_op::all_gather, out.size_bytes(), size());
    return r;
  }
  //! Counted `ireduce_scatter`.
  template <comm_element T>
    requires nonblocking_communicator<C>
  request ireduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    auto r = c_.ireduce_scatter(in, out, op);
    n_.add(comm_op::reduce_scatter, in.size_bytes(), size());
    return r;
  }
  //! Counted `iall_to_all`.
  template <comm_element T>
    requires nonblocking_communicator<C>
  request iall_to_all(std::span<const T> in, std::span<T> out) {
    auto r = c_.iall_to_all(in, out);
    n_.add(comm_op::all_to_all, in.size_bytes(), size());
    return r;
  }

  // Device communicators (`loom::device_communicator`; the stream and event types are the
  // backend's, so this header needs no CUDA).

  //! The device (device communicators).
  int device() const
    requires requires(const C& c) { c.device(); }
  {
    return c_.device();
  }
  //! Counted event-ordered `isend` (device communicators).
  template <class Event>
    requires requires(C& c, std::span<const std::byte> d, Event e) { c.isend(0, d, e); }
  request isend(int peer, std::span<const std::byte> data, Event ready) {
    auto r = c_.isend(peer, data, ready);
    n_.add(comm_op::send, data.size(), 2);
    return r;
  }
  //! Counted event-ordered `irecv` (device communicators).
  template <class Event>
    requires requires(C& c, std::span<std::byte> d, Event e) { c.irecv(0, d, e); }
  request irecv(int peer, std::span<std::byte> data, Event free) {
    auto r = c_.irecv(peer, data, free);
    n_.add(comm_op::recv, data.size(), 2);
    return r;
  }
  //! Forwards the stream-ordered `wait` (device communicators).
  template <class Stream>
    requires requires(C& c, request& q, Stream s) { c.wait(q, s); }
  void wait(request& r, Stream s) {
    c_.wait(r, s);
  }
  //! Forwards `open_channels` (device communicators).
  template <class Channels>
    requires requires(C& c, Channels ch) { c.open_channels(ch); }
  void open_channels(Channels chans) {
    c_.open_channels(chans);
  }
  //! Forwards `begin_step` (device communicators).
  template <class Stream>
    requires requires(C& c, Stream s) { c.begin_step(s); }
  void begin_step(Stream s) {
    c_.begin_step(s);
  }
  //! Forwards `end_step` (device communicators).
  template <class Stream>
    requires requires(C& c, Stream s) { c.end_step(s); }
  void end_step(Stream s) {
    c_.end_step(s);
  }
  //! Forwards `synchronize` (device communicators).
  template <class Stream>
    requires requires(C& c, Stream s) { c.synchronize(s); }
  void synchronize(Stream s) {
    c_.synchronize(s);
  }
  //! Forwards `begin_capture` (device communicators).
  template <class Stream>
    requires requires(C& c, Stream s) { c.begin_capture(s); }
  void begin_capture(Stream s) {
    c_.begin_capture(s);
  }
  //! Forwards `end_capture` (device communicators).
  template <class Stream>
    requires requires(C& c, Stream s) { c.end_capture(s); }
  void end_capture(Stream s) {
    c_.end_capture(s);
  }
  //! Forwards `launch` (device communicators).
  template <class Stream>
    requires requires(C& c, Stream s) { c.launch(s); }
  void launch(Stream s) {
    c_.launch(s);
  }
  //! Counted `all_reduce` of device memory on `stream`.
  template <comm_element T, class Stream>
    requires requires(C& c, std::span<T> d, Stream s) { c.all_reduce(d, reduce_op::sum, s); }
  void all_reduce(std::span<T> data, reduce_op op, Stream stream) {
    c_.all_reduce(data, op, stream);
    n_.add(comm_op::all_reduce, data.size_bytes(), size());
  }
  //! Counted `all_gather` of device memory on `stream`.
  template <comm_element T, class Stream>
    requires requires(C& c, std::span<const T> i, std::span<T> o, Stream s) { c.all_gather(i, o, s); }
  void all_gather(std::span<const T> in, std::span<T> out, Stream stream) {
    c_.all_gather(in, out, stream);
    n_.add(comm_op::all_gather, out.size_bytes(), size());
  }
  //! Counted `reduce_scatter` of device memory on `stream`.
  template <comm_element T, class Stream>
    requires requires(C& c, std::span<const T> i, std::span<T> o, Stream s) { c.reduce_scatter(i, o, reduce_op::sum, s); }
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, Stream stream) {
    c_.reduce_scatter(in, out, op, stream);
    n_.add(comm_op::reduce_scatter, in.size_bytes(), size());
  }
  //! Counted `all_to_all` of device memory on `stream`.
  template <comm_element T, class Stream>
    requires requires(C& c, std::span<const T> i, std::span<T> o, Stream s) { c.all_to_all(i, o, s); }
  void all_to_all(std::span<const T> in, std::span<T> out, Stream stream) {
    c_.all_to_all(in, out, stream);
    n_.add(comm_op::all_to_all, in.size_bytes(), size());
  }
  //! Counted `broadcast` of device memory on `stream`.
  template <comm_element T, class Stream>
    requires requires(C& c, std::span<T> d, Stream s) { c.broadcast(d, 0, s); }
  void broadcast(std::span<T> data, int root, Stream stream) {
    c_.broadcast(data, root, stream);
    n_.add(comm_op::broadcast, data.size_bytes(), size());
  }
  //! Counted `reduce` of device memory on `stream`.
  template <comm_element T, class Stream>
    requires requires(C& c, std::span<T> d, reduce_op op, Stream s) { c.reduce(d, 0, op, s); }
  void reduce(std::span<T> data, int root, reduce_op op, Stream stream) {
    c_.reduce(data, root, op, stream);
    n_.add(comm_op::reduce, data.size_bytes(), size());
  }

  //! Counted `barrier`.
  void barrier() {
    c_.barrier();
    n_.add(comm_op::barrier, 0, size());
  }
  //! A counted sub-group (collective; not itself counted).
  counted split(int color, int key) { return counted(c_.split(color, key)); }
  //! Forwards `abort`.
  void abort(std::string reason) { c_.abort(std::move(reason)); }
  //! Forwards `set_timeout`.
  void set_timeout(std::chrono::milliseconds t) { c_.set_timeout(t); }

 private:
  C c_;
  comm_counters n_;
};

}  // namespace loom
