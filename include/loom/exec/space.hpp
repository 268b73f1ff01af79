// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Execution spaces of `loom::pipeline`: where an action's work runs and how its buffers are
//! ordered. The pipeline is one executor; the space is the one place it consults for
//! - memory (`allocate`, `zero`, `fill`, `add`, `copy`),
//! - running a stage function (`call`: on the host it runs to completion; on a device it
//!   enqueues on the rank's compute stream),
//! - the microbatch losses (`record_loss`, `collect_losses`),
//! - transfers (`irecv`, `wait_recv`, `isend`, `wait_send`), and the step's bracket (`begin`,
//!   `end`).
//! `host_space` (here, std only) serves every host `loom::communicator` (threads, MPI): an
//! action's buffers are free when it returns. `device_space` (`loom/exec/device_space.hpp`,
//! included by `loom/exec/pipeline.hpp` when the build links `loom::cuda`) serves
//! `loom::device_communicator`s (`cuda_local`, `nccl`): an action enqueues, and buffers are
//! ordered by CUDA events. `space_for<T, Comm>::type` picks one.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/stage/buffer_plan.hpp"
#include "loom/stage/stage.hpp"

namespace loom {

//! How the step's loss (and so every gradient) is scaled: the mean over microbatches (the
//! last stage's backward is seeded with `1/m`) or their sum (seeded with `1`).
enum class loss_scaling : unsigned char { mean, sum };

//! Fault injection for loom's own tests of the device path (each a deliberate bug that the
//! simulator must catch); all off by default.
struct device_faults {
  bool skip_send_wait = false;   //!< a send does not wait for the event of the action producing its buffer
  bool skip_free_wait = false;   //!< a receive reuses its buffer without waiting for the event that frees it
  bool skip_offload_wait = false;  //!< a forward reuses a slot an offload frees without waiting for the copy to host (overwritten early)
  bool skip_reload_wait = false;   //!< a backward reads a reloaded activation without waiting for the copy back (reloaded late)
  int swap_receives = -1;        //!< if >= 0: the receives at program positions k and k+1 are posted in swapped order
};

class step_observer;  // loom/exec/step_observer.hpp

//! Knobs of a pipeline (designated initialisers: `{.deterministic = true}`).
struct pipeline_options {
  bool deterministic = false;                 //!< fold weight gradients in microbatch order
  loss_scaling scaling = loss_scaling::mean;  //!< loss and gradient scale
  int recv_ahead = default_recv_ahead;        //!< receives posted ahead of the program (>= 1)
  bool measure = false;                       //!< time every stage call (for the measured bubble)
  std::chrono::milliseconds timeout{0};       //!< if positive, set as the communicator's timeout
  bool graph = false;                         //!< device: capture the step once and replay it (CUDA graphs)
  device_faults faults{};                     //!< device: deliberate bugs, for loom's tests
  //! Told when stages are first used, when their gradients are final and when the step ends
  //! (data-parallel gradient sync; `loom/exec/step_observer.hpp`). Not owned; may be null.
  step_observer* observer = nullptr;
};

namespace detail {

//! A buffer a stage call reads or writes (device spaces give them to the race detector).
struct buffer_access {
  const void* ptr = nullptr;  //!< first byte
  std::size_t bytes = 0;      //!< length
  bool write = false;         //!< written (else read)
};
//! `s` read by a stage call.
template <class T>
constexpr buffer_access reads(std::span<T> s) noexcept {
  return {s.data(), s.size_bytes(), false};
}
//! `s` written by a stage call.
template <class T>
constexpr buffer_access writes(std::span<T> s) noexcept {
  return {s.data(), s.size_bytes(), true};
}
//! The accesses of one stage call.
template <class... A>
constexpr std::array<buffer_access, sizeof...(A)> accesses(A... a) noexcept {
  return {a...};
}

//! One copy of a host-copy action (`offload`, `reload`): `dst = src`.
template <class T>
struct copy_pair {
  std::span<T> dst;        //!< written
  std::span<const T> src;  //!< read
};

//! The host execution space (see the file comment): stage functions run to completion on the
//! calling thread; buffers are host vectors owned by the space.
template <class T, class Comm>
class host_space {
 public:
  //! Host spaces run actions to completion.
  static constexpr bool on_device = false;
  using request = typename Comm::request;  //!< the communicator's request

  host_space(Comm& c, const pipeline_options& o) : comm_(&c), measure_(o.measure) {}

  //! `n` zeroed elements owned by the space (`name` is for device spaces' reports).
  std::span<T> allocate(std::size_t n, const std::string& /*name*/) {
    storage_.emplace_back(n, T{});
    return storage_.back();
  }
  //! How many microbatches' loss terms the pipeline keeps in separate buffers: the host sums a
  //! microbatch's terms as soon as they are computed, so one buffer serves them all.
  static constexpr std::size_t loss_buffers(std::size_t /*m*/, std::size_t /*loss_width*/) { return 1; }
  //! Sizes the space for a program of `actions` compute halves and `m` microbatches whose last
  //! stage writes `loss_width` loss terms into `loss_terms` (`loss_buffers(m, loss_width)` buffers of
  //! `loss_width`; device spaces preallocate from this).
  void reserve(std::size_t /*actions*/, std::size_t /*m*/, std::size_t /*loss_width*/, std::span<const T> /*loss_terms*/) {}
  //! `s[i] = 0`.
  void zero(std::span<T> s) { std::fill(s.begin(), s.end(), T{}); }
  //! `s[i] = v` (used when the pipeline is built).
  void fill(std::span<T> s, T v) { std::fill(s.begin(), s.end(), v); }
  //! `acc[i] += g[i]`.
  void add(std::span<T> acc, std::span<const T> g) {
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += g[i];
  }
  //! `dst = src`.
  void copy(std::span<T> dst, std::span<const T> src) { std::copy(src.begin(), src.end(), dst.begin()); }
  //! `n` zeroed elements of host memory for offloaded activations: on the host, memory like any
  //! other (device spaces pin it).
  std::span<T> allocate_host(std::size_t n, const std::string& name) { return allocate(n, name); }
  //! The copies of one `offload` (`to_host`) or `reload` action, `dst = src` each, after the
  //! actions run so far (`clock`) and the earlier copies `after` (tickets); returns the ticket of
  //! these copies (-1: they are done). The host copies now; device spaces enqueue them on a copy
  //! stream of their direction and return a ticket that `await` and `irecv` wait for.
  int host_copy(bool /*to_host*/, std::span<const copy_pair<T>> copies, int /*clock*/, std::span<const int> /*after*/,
                const char* /*label*/) {
    for (auto const& c : copies) copy(c.dst, c.src);
    return -1;
  }
  //! The work enqueued next waits for the copies of `ticket` (host: they are done).
  void await(int /*ticket*/) {}
  //! Sizes the space for `copies` host-copy actions per step (device spaces keep an event each).
  void reserve_copies(std::size_t /*copies*/) {}

  //! Runs `fn()` (the stage call labelled `label`); returns its duration in seconds when
  //! measuring, else 0. `accesses()` (what the call reads and writes) matters on devices only and
  //! is not called here.
  template <class Fn, class Accesses>
  double call(const char* /*label*/, stage_context& /*ctx*/, const Accesses& /*accesses*/, Fn&& fn) {
    if (!measure_) {
      fn();
      return 0;
    }
    auto t = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  //! Records microbatch `mb`'s loss: the sum of `out` (the last stage's output) in order.
  void record_loss(std::span<const T> out, int mb, std::span<double> losses) {
    double sum = 0;
    for (auto v : out) sum += static_cast<double>(v);
    losses[static_cast<std::size_t>(mb)] = sum;
  }
  //! Device spaces fill `losses` here, after the step; the host recorded them already.
  void collect_losses(std::span<double> /*losses*/) {}

  //! Posts a receive into `buf` from `peer`; `freed_at` (device spaces) is the action count after
  //! which the buffer is free, `ticket` a host copy that last read it (-1: none).
  request irecv(int peer, std::span<T> buf, int /*freed_at*/, int /*clock*/, int /*ticket*/ = -1) {
    return comm_->irecv(peer, std::as_writable_bytes(buf));
  }
  //! Waits for a receive before its consumer runs.
  void wait_recv(request& r) { comm_->wait(r); }
  //! Posts a send of `buf` (produced by the actions run so far, `clock`) to `peer`.
  request isend(int peer, std::span<const T> buf, int /*clock*/) { return comm_->isend(peer, std::as_bytes(buf)); }
  //! Waits for a send at the end of the step.
  void wait_send(request& r) { comm_->wait(r); }

  //! The batch the step reads: the caller's (device spaces in graph mode copy it into the buffer
  //! their captured step reads).
  std::span<const T> stage_batch(std::span<const T> in) { return in; }
  //! Starts a step's program, or (`program = false`) a communication phase after it: nothing to
  //! do on the host.
  void begin(bool /*program*/ = true) {}
  //! Ends a step's program: the host already waited for everything.
  void end() {}
  //! Whether the step's work can be replayed from a graph instead of run (devices only).
  bool replaying() const { return false; }

 private:
  Comm* comm_;
  bool measure_;
  std::vector<std::vector<T>> storage_;
};

//! The execution space of a pipeline of `T` over `Comm` (the host space unless
//! `loom/exec/device_space.hpp` specialises it for a device communicator).
template <class T, class Comm>
struct space_for {
  using type = host_space<T, Comm>;  //!< the space
};

//! True for communicators the pipeline runs over (`device_space.hpp` adds device ones).
template <class Comm>
inline constexpr bool is_device_communicator = false;

//! What `loom::pipeline` accepts as a communicator.
template <class Comm>
concept pipeline_communicator = communicator<Comm> || is_device_communicator<Comm>;

}  // namespace detail
}  // namespace loom
