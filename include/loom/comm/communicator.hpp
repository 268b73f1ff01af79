// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The `loom::communicator` concept that every backend (threads, MPI, CUDA-local, NCCL) models,
//! the error it raises, the reduction operators, and small helpers written once over the concept.
//!
//! Semantics shared by every backend:
//! - Point-to-point messages are tagless and matched per peer in FIFO order, as NCCL matches
//!   them: the k-th `isend(to = q)` posted by rank p pairs with the k-th `irecv(from = p)` posted
//!   by rank q. The two sizes must be equal; a mismatch fails both requests with a `comm_error`.
//! - `isend`/`irecv` return at once. The buffer must stay valid (and a send buffer unchanged)
//!   until `wait` returned or `test` returned true for its request.
//! - Every blocking call (`wait`, the collectives, `barrier`, `split`) is bounded: it throws
//!   `comm_error` when the communicator's timeout passes (and then aborts the communicator, so
//!   the other ranks stop too) or when any rank aborted the communicator.
//! - `abort(reason)` makes every pending and future call on every rank of the communicator (and
//!   of every communicator split from the same world) throw a `comm_error` naming the rank that
//!   aborted and the reason, within a bounded time.
//! - Collectives are called by every rank of the group in the same order, with the same element
//!   type and consistent sizes; a detected mismatch throws `comm_error` on the ranks that see it.
//!   Each backend documents the order in which reductions combine the ranks' contributions; the
//!   threads backend combines them in rank order (0, 1, ..., n-1), so every rank receives
//!   bitwise-identical results. Results that are exact in the element type (integers, or
//!   floating-point values whose sums are representable) are identical on every backend.

#include <chrono>
#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace loom {

//! A communication failure: a timeout, an abort (by this rank or another), a dead peer, or
//! mismatched arguments. `rank()` is the (world) rank whose failure it is: the rank that aborted,
//! the rank that timed out, or the rank that exited; -1 when unknown. `cause()` is the sentence
//! without the rank prefix; `what()` is "rank R: cause".
class comm_error : public std::runtime_error {
 public:
  //! An error attributed to `rank` (-1: unknown) with the sentence `cause`.
  comm_error(int rank, std::string cause)
      : std::runtime_error(compose(rank, cause)), rank_(rank), cause_(std::move(cause)) {}

  //! The world rank that failed (aborted, timed out, exited), or -1 when unknown.
  int rank() const noexcept { return rank_; }
  //! The cause, without the "rank R: " prefix.
  const std::string& cause() const noexcept { return cause_; }

 private:
  static std::string compose(int rank, const std::string& cause) {
    if (rank < 0) return "loom comm: " + cause;
    return "loom comm: rank " + std::to_string(rank) + ": " + cause;
  }
  int rank_;
  std::string cause_;
};

//! The reduction applied by `all_reduce` and `reduce_scatter`, element-wise, in rank order.
enum class reduce_op { sum, max, min };

//! Name of a reduction ("sum", "max", "min").
constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

//! Element types the typed collectives accept: arithmetic types other than `bool`.
template <class T>
concept comm_element = std::is_arithmetic_v<T> && !std::same_as<std::remove_cv_t<T>, bool>;

//! A directed point-to-point channel: sends from rank `from` to rank `to` (device communicators
//! create what a channel needs up front, `open_channels`).
struct channel {
  int from = 0;  //!< sending rank
  int to = 0;    //!< receiving rank
  friend constexpr bool operator==(const channel&, const channel&) = default;
  friend constexpr auto operator<=>(const channel&, const channel&) = default;
};

//! The timeout a communicator starts with; `set_timeout` changes it per communicator.
inline constexpr std::chrono::milliseconds default_comm_timeout{60'000};

namespace detail {

//! `op` applied to `a` and `b` (a is the accumulated value of the lower ranks).
template <comm_element T>
constexpr T reduce_apply(reduce_op op, T a, T b) noexcept {
  switch (op) {
    case reduce_op::sum: return static_cast<T>(a + b);
    case reduce_op::max: return a < b ? b : a;
    case reduce_op::min: return b < a ? b : a;
  }
  return a;
}

//! Requirements of the typed collectives for one element type `T`.
template <class C, class T>
concept communicator_collectives_for =
    requires(C& c, std::span<T> out, std::span<const T> in, reduce_op op) {
      c.all_reduce(out, op);
      c.all_gather(in, out);
      c.reduce_scatter(in, out, op);
      c.all_to_all(in, out);
    };

//! The sentence a rooted collective's `root` breaks (a rank of the group of `n`), or "".
inline std::string root_rule(const char* name, int root, int n) {
  if (root >= 0 && root < n) return {};
  return std::string(name) + ": root " + std::to_string(root) + " is not a rank of this group of " + std::to_string(n);
}

//! Whether the element ranges `[a, a + an)` and `[b, b + bn)` overlap (both non-empty).
template <class T>
bool overlapping(const T* a, std::size_t an, const T* b, std::size_t bn) noexcept {
  return an != 0 && bn != 0 && a < b + bn && b < a + an;
}

//! The sentence an all-gather's sizes break (`out` must be `n` times `in`), or "".
inline std::string gather_rule(const char* name, std::size_t in, std::size_t out, int n) {
  if (out == in * static_cast<std::size_t>(n)) return {};
  return std::string(name) + ": output has " + std::to_string(out) + " elements, expected " + std::to_string(n) + " x " +
         std::to_string(in);
}
//! The sentence a reduce-scatter's sizes break (`in` must be `n` times `out`), or "".
inline std::string scatter_rule(const char* name, std::size_t in, std::size_t out, int n) {
  if (in == out * static_cast<std::size_t>(n)) return {};
  return std::string(name) + ": input has " + std::to_string(in) + " elements, expected " + std::to_string(n) + " x " +
         std::to_string(out);
}
//! The sentence an all-to-all's arguments break (equal sizes, a multiple of `n`, no overlap), or "".
inline std::string all_to_all_rule(const char* name, std::size_t in, std::size_t out, int n, bool overlap) {
  if (in != out || in % static_cast<std::size_t>(n) != 0)
    return std::string(name) + ": input has " + std::to_string(in) + " and output " + std::to_string(out) +
           " elements; both must be the same multiple of the group size " + std::to_string(n);
  if (overlap) return std::string(name) + ": input and output buffers overlap";
  return {};
}

}  // namespace detail

//! A group of `size()` ranks that exchange bytes point-to-point and typed data collectively.
//! See the file comment for the semantics (per-peer FIFO matching, asynchronous sends, bounded
//! waits, abort). `split(color, key)` is collective and returns the sub-group of the ranks that
//! passed the same `color`, ordered by `key` then by rank.
template <class C>
concept communicator =
    std::movable<C> && std::copyable<typename C::request> &&
    requires(C& c, const C& cc, int peer, std::span<const std::byte> sbuf, std::span<std::byte> rbuf,
             typename C::request& req, std::string reason, std::chrono::milliseconds ms) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      { c.isend(peer, sbuf) } -> std::same_as<typename C::request>;
      { c.irecv(peer, rbuf) } -> std::same_as<typename C::request>;
      c.wait(req);
      { c.test(req) } -> std::same_as<bool>;
      c.barrier();
      { c.split(0, 0) } -> std::same_as<C>;
      c.abort(reason);
      c.set_timeout(ms);
    } &&
    detail::communicator_collectives_for<C, float> && detail::communicator_collectives_for<C, double> &&
    detail::communicator_collectives_for<C, std::int32_t> &&
    detail::communicator_collectives_for<C, std::int64_t>;

//! What `loom::counted` and `loom::mesh_comm` need of a backend: its rank and size, `split` into
//! sub-groups, `abort` and `set_timeout`. Every `communicator` models it, and so do the device
//! communicators with collectives (`loom::device_collective_communicator`: `cuda_local`, `nccl`).
template <class C>
concept group_communicator =
    std::movable<C> && requires { typename C::request; } &&
    requires(C& c, const C& cc, std::string reason, std::chrono::milliseconds ms) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      { c.split(0, 0) } -> std::same_as<C>;
      c.abort(reason);
      c.set_timeout(ms);
    };

//! A communicator with the rooted collectives (blocking, collective over the group):
//! `broadcast(data, root)` copies rank `root`'s `data` into every rank's, and
//! `reduce(data, root, op)` leaves the element-wise reduction of every rank's `data` in rank
//! `root`'s (the other ranks' `data` unchanged; the threads backend adds in rank order, as its
//! `all_reduce`). A root outside the group is a `comm_error` naming it. Kept out of
//! `communicator`, so a user's communicator without them still is one; the tensor-parallel
//! grids' SUMMA rounds need them (threads, MPI, and the mesh's counted groups of either).
template <class C>
concept rooted_communicator =
    communicator<C> && requires(C& c, std::span<double> d, std::span<std::int64_t> i, int root, reduce_op op) {
      c.broadcast(d, root);
      c.broadcast(i, root);
      c.reduce(d, root, op);
      c.reduce(i, root, op);
    };

//! A communicator that also posts collectives without waiting for them: `iall_reduce(data, op)`,
//! `iall_gather(in, out)`, `ireduce_scatter(in, out, op)` and `iall_to_all(in, out)` take the
//! arguments of their blocking forms, return a `C::request` at once, and complete through the
//! same `wait`/`test` as point-to-point requests. The buffers must stay valid (inputs unchanged)
//! until then; `ireduce_scatter`'s input and output must not overlap. Every rank of the group
//! posts its collectives, blocking and non-blocking together, in the same order (MPI's rule);
//! the threads backend matches the k-th non-blocking collective of every rank with the others'
//! k-th. Reductions combine the ranks in the order their blocking forms document. Used by the
//! data-parallel gradient reducer (`loom/exec/data_parallel.hpp`) to overlap its all-reduces with
//! the pipeline's tail.
template <class C>
concept nonblocking_communicator =
    communicator<C> &&
    requires(C& c, std::span<double> out, std::span<const double> in, std::span<std::int64_t> iout, reduce_op op) {
      { c.iall_reduce(out, op) } -> std::same_as<typename C::request>;
      { c.iall_reduce(iout, op) } -> std::same_as<typename C::request>;
      { c.iall_gather(in, out) } -> std::same_as<typename C::request>;
      { c.ireduce_scatter(in, out, op) } -> std::same_as<typename C::request>;
      { c.iall_to_all(in, out) } -> std::same_as<typename C::request>;
    };

//! True when `C`'s reductions (`all_reduce`, `reduce_scatter` and their non-blocking forms)
//! combine the contributions in rank order, `((x_0 op x_1) op x_2) ...`, on every rank, so that
//! their floating-point results are reproducible bit for bit. A backend says so with
//! `static constexpr bool rank_ordered_reductions = true;` (the threads backend does; MPI leaves
//! the order to the library). `loom/comm/ordered.hpp` gives rank-ordered reductions on any backend.
template <class C>
inline constexpr bool reduces_in_rank_order = requires {
  requires C::rank_ordered_reductions;
};

//! Waits for every request of `reqs` in order (each wait is bounded by the communicator's
//! timeout; the first failure is thrown and the remaining requests are left pending).
template <communicator C>
void wait_all(C& c, std::span<typename C::request> reqs) {
  for (auto& r : reqs) c.wait(r);
}

//! Sends the bytes of `data` to `peer` and waits for completion.
template <communicator C>
void send(C& c, int peer, std::span<const std::byte> data) {
  auto r = c.isend(peer, data);
  c.wait(r);
}

//! Receives exactly `data.size()` bytes from `peer` and waits for completion.
template <communicator C>
void recv(C& c, int peer, std::span<std::byte> data) {
  auto r = c.irecv(peer, data);
  c.wait(r);
}

//! Posts a send of the elements of `data` (any trivially copyable `T`) to `peer`.
template <communicator C, class T>
  requires std::is_trivially_copyable_v<T>
typename C::request isend_values(C& c, int peer, std::span<const T> data) {
  return c.isend(peer, std::as_bytes(data));
}

//! Posts a receive of `data.size()` elements (any trivially copyable `T`) from `peer`.
template <communicator C, class T>
  requires std::is_trivially_copyable_v<T>
typename C::request irecv_values(C& c, int peer, std::span<T> data) {
  return c.irecv(peer, std::as_writable_bytes(data));
}

}  // namespace loom
