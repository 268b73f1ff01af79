// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The device execution space of `loom::pipeline` (see `loom/exec/space.hpp`), for
//! `loom::device_communicator`s (`loom::cuda_local`, `loom::nccl`). Included by
//! `loom/exec/pipeline.hpp` when the build links `loom::cuda`.
//!
//! Streams. The rank has one compute stream; its communicator has a stream per channel. A stage
//! function receives the compute stream in `stage_context::stream` and enqueues its kernels there;
//! the host never waits inside a step, only at its end (bounded, and for the agreement).
//!
//! Events. An action's completion is the compute stream's position after it. The space counts
//! the compute actions enqueued in the step (the *clock*) and records an event at a position
//! only when something on another stream must wait for it:
//! - a send waits for the event at the current position (its buffer's producer is the last
//!   action enqueued; consecutive sends share one event);
//! - a receive into a reused buffer waits for the first event recorded at or after the position
//!   where the buffer was freed (the slot pool remembers it); when none was recorded, it records
//!   one now, which is later than needed but correct (the receive's consumer comes later still).
//! The compute stream waits for a receive's event before its consumer (`wait_recv`). Buffers are
//! device memory from the same buffer plan as on the host.
//!
//! Host copies (`offload`, `reload`; PipeOffload). Offloaded activations live in pinned host
//! slots. Each direction has its own copy stream, created with the first host slot. A copy action
//! forks its stream from the compute stream at the action's place (an event at the current
//! position), waits for the earlier copies it depends on, enqueues its copies and records a
//! *ticket* (an event on the copy stream). Whoever uses a buffer a copy touched waits for its
//! ticket, and nothing else waits: the next writer of a device slot an offload read (a forward on
//! the compute stream, a receive, a reload), the reload that reads the host slot an offload wrote,
//! the next offload into a host slot a reload read, and the backward that reads what a reload
//! wrote. The step's end joins both copy streams into the compute stream.
//!
//! Losses. Each microbatch's loss terms stay in their own device buffer (`loss_buffers`) and the
//! end of the step copies them to pinned host memory at once: one copy per step rather than one
//! per microbatch (each is an API call eagerly and a graph node in a captured step). When the
//! terms of all microbatches would take more than `max_kept_loss_bytes`, one buffer serves them
//! all and each microbatch's terms are copied as soon as they are written. The host sums them
//! after the step, in the same order as on the host. Measurement (`pipeline_options::measure`): the
//! pipeline records a mark (a timing event, `mark`) before and after every action of an eager step;
//! after the step it reads each action's device time from them (`pipeline::last_timeline()`), and
//! the step's busy time is the sum over its stage calls.
//!
//! Graphs (`pipeline_options::graph`): the first step is captured (the compute stream, the
//! communicator's streams forked from it, NCCL calls or copies included) and launched; later steps
//! replay it, so the host's cost of a step is one launch (and a copy of the batch into the
//! buffer the graph reads). Stage functions then run only during the capture: they must enqueue
//! the same work every step (the CUDA graph contract).

#include <algorithm>
#include <array>
#include <cstddef>
#include <tuple>
#include <utility>
#include <type_traits>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/device.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/buffer.hpp"
#include "loom/cuda/device.hpp"
#include "loom/cuda/kernels.hpp"
#include "loom/cuda/stream.hpp"
#include "loom/exec/memory.hpp"
#include "loom/exec/space.hpp"

namespace loom {
namespace detail {

template <class C>
  requires device_communicator<C>
inline constexpr bool is_device_communicator<C> = true;

//! The device execution space (see the file comment).
template <class T, class Comm>
class device_space {
 public:
  //! Device spaces enqueue.
  static constexpr bool on_device = true;
  using request = typename Comm::request;  //!< the communicator's request

  device_space(Comm& c, const pipeline_options& o) : comm_(&c), opt_(o), compute_(init_device(c)) {
    cuda::name_stream(compute_.get(), "r" + std::to_string(c.rank()) + " compute");
  }

  //! `n` device elements, named `name` in the simulator's reports. Not initialised: every buffer
  //! of the plan is written before it is read (a zero-fill would only hide such a bug, and would
  //! be one more write for the race detector to pair with).
  std::span<T> allocate(std::size_t n, const std::string& name) {
    storage_.emplace_back(n);
    auto& b = storage_.back();
    if (n != 0) cuda::name_memory(b.data(), "r" + std::to_string(comm_->rank()) + " " + name);
    return b.span();
  }
  //! The most bytes of loss terms kept on the device until the step's end (see the file comment).
  static constexpr std::size_t max_kept_loss_bytes = device_max_kept_loss_bytes;
  //! Every microbatch's loss terms have their own buffer until the step's end, unless they would
  //! take more than `max_kept_loss_bytes` (`loom::device_loss_buffers`).
  static constexpr std::size_t loss_buffers(std::size_t m, std::size_t loss_width) {
    return device_loss_buffers(m, loss_width, sizeof(T));
  }
  //! Events for `actions` compute halves, pinned memory for the losses; `loss_terms` is where the
  //! last stage writes microbatch `mb`'s terms (at `mb * loss_width`).
  void reserve(std::size_t actions, std::size_t m, std::size_t loss_width, std::span<const T> loss_terms) {
    events_.resize(actions + 1);
    for (auto& e : events_) e = cuda::event();
    loss_width_ = loss_width;
    loss_terms_ = loss_terms;
    kept_losses_ = m > 1 && loss_buffers(m, loss_width) == m;  // as the pipeline allocated `loss_terms`
    losses_ = cuda::pinned_buffer<T>(m * loss_width);
    recorded_.assign(m, 0);
  }
  //! `s[i] = 0`, enqueued on the compute stream.
  void zero(std::span<T> s) {
    if (!s.empty()) LOOM_CUDA_TRY(cudaMemsetAsync(s.data(), 0, s.size_bytes(), compute_.get()));
  }
  //! `s[i] = v` (when the pipeline is built: a synchronous copy from the host).
  void fill(std::span<T> s, T v) {
    std::vector<T> h(s.size(), v);
    if (!s.empty()) LOOM_CUDA_TRY(cudaMemcpy(s.data(), h.data(), s.size_bytes(), cudaMemcpyHostToDevice));
  }
  //! `acc[i] += g[i]`, enqueued on the compute stream (loom's own kernel).
  void add(std::span<T> acc, std::span<const T> g) {
    if (acc.empty()) return;
    const cuda::byte_access a[] = {cuda::reads(g), cuda::writes(acc)};
    cuda::region r(compute_.get(), "loom add", a);
    cuda::detail::add_async(acc.data(), g.data(), acc.size(), compute_.get());
  }
  //! `n` elements of pinned host memory for offloaded activations (not initialised: an offload
  //! writes each slot before its reload reads it), named `name` in the simulator's reports.
  std::span<T> allocate_host(std::size_t n, const std::string& name) {
    pinned_.emplace_back(n);
    auto& b = pinned_.back();
    if (n == 0) return {};
    cuda::name_memory(b.data(), "r" + std::to_string(comm_->rank()) + " " + name);
    copy_streams();
    return {b.data(), n};
  }
  //! Events for the tickets of `copies` host-copy actions a step runs.
  void reserve_copies(std::size_t copies) {
    tickets_.clear();
    for (std::size_t i = 0; i < copies; ++i) tickets_.emplace_back();
  }
  //! Enqueues the copies of one `offload` (`to_host`) or `reload` action on that direction's copy
  //! stream, after the compute stream's work so far (`clock`) and the tickets `after`; returns
  //! their ticket (see the file comment).
  int host_copy(bool to_host, std::span<const copy_pair<T>> copies, int clock, std::span<const int> after, const char* label) {
    if (next_ticket_ >= tickets_.size()) throw config_error("device space: more host copies in the step than reserved (a loom bug)");
    copy_streams();
    cuda::stream& s = to_host ? *to_host_ : *from_host_;
    // Fork from the compute stream at this place; a new event, since the latest may predate the
    // awaits just enqueued on the compute stream.
    const auto t = static_cast<int>(next_ticket_++);
    cuda::event& fork = tickets_[static_cast<std::size_t>(t)];
    fork.record(compute_.ref());
    s.ref().wait(fork);  // (`clock` is covered: the fork follows every action enqueued so far)
    (void)clock;
    for (int w : after)
      if (w >= 0) s.ref().wait(tickets_[static_cast<std::size_t>(w)]);
    for (auto const& c : copies) {
      if (c.dst.empty()) continue;
      const cuda::byte_access a[] = {cuda::reads(c.src), cuda::writes(c.dst)};
      cuda::region r(s.get(), label, a);
      LOOM_CUDA_TRY(cudaMemcpyAsync(c.dst.data(), c.src.data(), c.src.size_bytes(),
                                    to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s.get()));
    }
    fork.record(s.ref());  // the ticket: these copies done
    (to_host ? used_to_host_ : used_from_host_) = true;
    return t;
  }
  //! The compute stream waits for the copies of `ticket`.
  void await(int ticket) {
    if (ticket >= 0) compute_.ref().wait(tickets_[static_cast<std::size_t>(ticket)]);
  }
  //! `dst = src`, enqueued on the compute stream.
  void copy(std::span<T> dst, std::span<const T> src) {
    if (dst.empty()) return;
    const cuda::byte_access a[] = {cuda::reads(src), cuda::writes(dst)};
    cuda::region r(compute_.get(), "loom copy", a);
    LOOM_CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToDevice, compute_.get()));
  }

  //! Lets the stage enqueue its work (`fn()`) on the compute stream inside an NVTX range and a
  //! simulator region named `label` that touches `accesses`. Returns 0: device time is measured
  //! by the pipeline's marks around the call (`mark`).
  template <class Fn, class Accesses>
  double call(const char* label, stage_context& ctx, const Accesses& accesses, Fn&& fn) {
    ctx.stream = compute_.get();
    const auto list = accesses();
    std::array<cuda::byte_access, std::tuple_size_v<std::remove_cvref_t<decltype(list)>>> acc{};
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = {list[i].ptr, list[i].bytes, list[i].write};
    cuda::region r(compute_.get(), label, acc);
    fn();
    return 0;
  }

  //! Microbatch `mb`'s loss terms `out` are enqueued: `end` copies them to the host with the
  //! others, or (one buffer for all) their copy to pinned host memory is enqueued now.
  void record_loss(std::span<const T> out, int mb, std::span<double> /*losses*/) {
    recorded_[static_cast<std::size_t>(mb)] = out.size() + 1;
    if (kept_losses_) return;
    T* dst = losses_.data() + static_cast<std::size_t>(mb) * loss_width_;
    const cuda::byte_access a[] = {cuda::reads(out), {dst, out.size_bytes(), true}};
    cuda::region r(compute_.get(), "loss to host", a);
    LOOM_CUDA_TRY(cudaMemcpyAsync(dst, out.data(), out.size_bytes(), cudaMemcpyDeviceToHost, compute_.get()));
  }
  //! After the step: the losses of the microbatches this rank's last stage computed.
  void collect_losses(std::span<double> losses) {
    for (std::size_t mb = 0; mb < recorded_.size(); ++mb) {
      if (recorded_[mb] == 0) continue;
      double sum = 0;
      const T* v = losses_.data() + mb * loss_width_;
      for (std::size_t i = 0; i + 1 < recorded_[mb]; ++i) sum += static_cast<double>(v[i]);
      losses[mb] = sum;
    }
  }

  //! Posts a receive into `buf`, not before the buffer's last use ended (`freed_at`, an action
  //! count; 0: free since the step began) and the host copy `ticket` that last read it.
  request irecv(int peer, std::span<T> buf, int freed_at, int clock, int ticket = -1) {
    cudaEvent_t free = opt_.faults.skip_free_wait ? nullptr : event_covering(freed_at, clock);
    if (ticket >= 0) free = tickets_[static_cast<std::size_t>(ticket)].get();  // recorded after the compute work it forked from
    return comm_->irecv(peer, std::as_writable_bytes(buf), free);
  }
  //! The compute stream waits for the receive.
  void wait_recv(request& r) { comm_->wait(r, compute_.get()); }
  //! Posts a send of `buf` once the actions enqueued so far (`clock`) have run.
  request isend(int peer, std::span<const T> buf, int clock) {
    cudaEvent_t ready = opt_.faults.skip_send_wait ? nullptr : event_covering(clock, clock);
    return comm_->isend(peer, std::as_bytes(buf), ready);
  }
  //! The compute stream waits for the send (its buffer may be written next).
  void wait_send(request& r) { comm_->wait(r, compute_.get()); }

  //! The batch the step reads. In graph mode the captured step reads a buffer of the space, and
  //! the caller's batch is copied there (on the compute stream, before the step) every step, so
  //! the caller may pass any buffer; eagerly, the caller's own.
  std::span<const T> stage_batch(std::span<const T> in) {
    if (!opt_.graph || in.empty()) return in;
    if (batch_.size() == 0) {
      batch_ = cuda::device_buffer<T>(in.size());
      cuda::name_memory(batch_.data(), "r" + std::to_string(comm_->rank()) + " batch (graph mode)");
    }
    if (in.size() != batch_.size()) return in;  // the pipeline reports the size
    const cuda::byte_access a[] = {cuda::reads(in), cuda::writes(batch_.span())};
    cuda::region r(compute_.get(), "batch to the graph's buffer", a);
    LOOM_CUDA_TRY(cudaMemcpyAsync(batch_.data(), in.data(), in.size_bytes(), cudaMemcpyDeviceToDevice, compute_.get()));
    return batch_.span();
  }
  //! Starts a step's program (or, on the first step of graph mode, its capture); with
  //! `program = false`, a communication phase after the step (the copy exchange) that keeps the
  //! step's losses and is never captured.
  void begin(bool program = true) {
    last_event_ = -1;
    next_ticket_ = 0;
    program_ = program;
    if (program) {
      next_mark_ = 0;
      std::fill(recorded_.begin(), recorded_.end(), 0);
    }
    if (program && opt_.graph && !captured_) {
      comm_->begin_capture(compute_.get());
      capturing_ = true;
    }
    if (program) mark();  // mark 0: the step's start
    comm_->begin_step(compute_.get());
  }
  //! Ends the step's program and waits for it (bounded): joins the communicator's streams,
  //! finishes a capture and replays it, then synchronises.
  void end() {
    if (program_) losses_to_host();
    // Join the copy streams this step used (each ticket's wait already ordered what reads it).
    for (auto [used, s] : {std::pair{&used_to_host_, &to_host_}, std::pair{&used_from_host_, &from_host_}}) {
      if (!*used) continue;
      join_->record((*s)->ref());
      compute_.ref().wait(*join_);
      *used = false;
    }
    comm_->end_step(compute_.get());
    if (capturing_) {
      capturing_ = false;
      comm_->end_capture(compute_.get());
      captured_ = true;
      comm_->launch(compute_.get());
    }
    comm_->synchronize(compute_.get());
  }
  //! Graph mode after the first step: the step is a replay.
  bool replaying() const { return opt_.graph && captured_; }
  //! Replays the captured step and waits for it; `launched()` is called between the two.
  template <class Launched>
  void replay(Launched&& launched) {
    comm_->launch(compute_.get());
    launched();
    comm_->synchronize(compute_.get());
  }
  //! Forgets a captured step (it failed, or must be captured again).
  void drop_graph() {
    captured_ = false;
    capturing_ = false;
  }
  //! Measure mode, eager steps: events for `n` marks of the step's timeline (and its start).
  void reserve_marks(std::size_t n) {
    if (!opt_.measure) return;
    marks_.clear();
    for (std::size_t i = 0; i < n + 1; ++i) marks_.emplace_back(true);
  }
  //! Measure mode, eager steps: records the next mark on the compute stream (the point the
  //! stream reaches once the work enqueued before it has run) and returns its index; -1 when not
  //! measuring, capturing, or out of marks. Mark 0 is the step's start (`begin`).
  int mark() {
    if (!opt_.measure || capturing_ || next_mark_ >= marks_.size()) return -1;
    marks_[next_mark_].record(compute_.ref());
    return static_cast<int>(next_mark_++);
  }
  //! After the step has synchronised: seconds from the step's start to mark `i`.
  double mark_seconds(int i) const {
    return static_cast<double>(cuda::event::elapsed_ms(marks_[0], marks_[static_cast<std::size_t>(i)])) / 1000.0;
  }
  //! The rank's compute stream.
  cudaStream_t stream() const { return compute_.get(); }

 private:
  static cuda::stream init_device(Comm& c) {
    LOOM_CUDA_TRY(cudaSetDevice(c.device()));
    return cuda::stream();
  }

  //! The two copy streams, created once.
  void copy_streams() {
    if (to_host_) return;
    to_host_.emplace();
    from_host_.emplace();
    join_.emplace();
    cuda::name_stream(to_host_->get(), "r" + std::to_string(comm_->rank()) + " offload");
    cuda::name_stream(from_host_->get(), "r" + std::to_string(comm_->rank()) + " reload");
  }

  //! Enqueues one copy of the loss terms of every microbatch recorded this step (the range from
  //! the first to the last; the ones between belong to other ranks and are not summed).
  void losses_to_host() {
    std::size_t lo = recorded_.size(), hi = 0;
    for (std::size_t mb = 0; mb < recorded_.size(); ++mb)
      if (recorded_[mb] != 0) {
        lo = std::min(lo, mb);
        hi = mb + 1;
      }
    if (!kept_losses_ || lo >= hi || loss_width_ == 0) return;
    const auto src = loss_terms_.subspan(lo * loss_width_, (hi - lo) * loss_width_);
    T* dst = losses_.data() + lo * loss_width_;
    const cuda::byte_access a[] = {cuda::reads(src), {dst, src.size_bytes(), true}};
    cuda::region r(compute_.get(), "losses to host", a);
    LOOM_CUDA_TRY(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, compute_.get()));
  }

  //! An event recorded at a position >= `pos` (reusing the latest one when it is late enough;
  //! else recorded now, at `clock`); null when `pos` is 0 (nothing to wait for this step).
  cudaEvent_t event_covering(int pos, int clock) {
    if (pos <= 0) return nullptr;
    if (last_event_ < pos) {
      const auto i = static_cast<std::size_t>(clock);
      events_[i].record(compute_.ref());
      last_event_ = clock;
    }
    return events_[static_cast<std::size_t>(last_event_)].get();
  }

  Comm* comm_;
  pipeline_options opt_;
  cuda::stream compute_;
  std::vector<cuda::device_buffer<T>> storage_;
  std::vector<cuda::event> events_;
  std::vector<cuda::event> marks_;  // measure mode: the step's timeline (mark 0: its start)
  std::vector<cuda::pinned_buffer<T>> pinned_;          // host slots of offloaded activations
  std::optional<cuda::stream> to_host_, from_host_;      // copy streams, with the first host slot
  std::vector<cuda::event> tickets_;                     // per host-copy action of the step: its ticket
  std::size_t next_ticket_ = 0;
  std::optional<cuda::event> join_;                      // the step's end: the copy streams joined
  bool used_to_host_ = false, used_from_host_ = false;  // this step enqueued on the copy stream
  std::size_t next_mark_ = 0;
  int last_event_ = -1;
  cuda::pinned_buffer<T> losses_;
  std::span<const T> loss_terms_;  // the pipeline's loss-term buffers, microbatch-major
  cuda::device_buffer<T> batch_;  // graph mode: the batch the captured step reads
  std::size_t loss_width_ = 0;
  std::vector<std::size_t> recorded_;  // per microbatch: 1 + the number of loss terms, 0 if not on this rank
  bool capturing_ = false, captured_ = false;
  bool program_ = true;       // the phase between `begin` and `end` runs the step's program
  bool kept_losses_ = false;  // one loss buffer per microbatch, copied at the step's end
};

//! Pipelines over a device communicator run in the device space.
template <class T, class Comm>
  requires device_communicator<Comm>
struct space_for<T, Comm> {
  using type = device_space<T, Comm>;  //!< the space
};

}  // namespace detail
}  // namespace loom
