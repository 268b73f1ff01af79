// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::pipeline`: binds a schedule, the user's stages and a communicator, and runs one
//! training step of this rank's lowered program.
//!
//! The loop. For a `loom::static_schedule` the rank's lowered program
//! (`Sched::lowered_program<Rank>`) is a compile-time constant: the step is a fold over its
//! indices, each action a template argument, so every dispatch is resolved at compile time and no
//! table is interpreted. For a run-time `loom::schedule` the same action handlers run from the
//! program vector. Overlapped `FB` actions (DualPipe) run as their forward, then their backward.
//!
//! Communication. Receives are posted `recv_ahead` ahead of their place in the program, into the
//! slots of the buffer plan (`loom/stage/buffer_plan.hpp`); sends are asynchronous, each from its
//! own slot, and are completed at the end of the step. So the step never blocks on a send, and
//! runs the lowered program exactly as `validate`'s FIFO replay proves deadlock-free.
//!
//! Buffers. Everything is allocated when the pipeline is built, sized by the buffer plan and the
//! stages' sizes. After the first step (the handshake, and the communicator's warm-up) a
//! successful step allocates nothing: no vector, string or function object on its path, and every
//! request is handed back as soon as it completed, so the communicator can reuse its control
//! block (the threads backend then allocates nothing either; MPI's internals are MPI's). Errors
//! may allocate (their messages).
//!
//! Handshake. Before the first step the ranks exchange a hash of their lowered schedule and
//! options, then the sizes of their stages' inputs and outputs; a mismatch throws
//! `pipeline_error` on every rank, naming the ranks and what differs.
//!
//! Failures. An exception in a stage function, or a user batch of the wrong size, does not stop
//! this rank's program: the rank keeps sending and receiving as the program says (skipping the
//! stage functions), so no peer waits forever; at the end of the step every rank contributes its
//! status to an all-reduce and every rank throws the same `pipeline_error` naming the first
//! failed rank and its cause. Communication failures (a dead peer, a timeout, an abort) abort the
//! communicator so every rank stops within its bounded wait, and are reported the same way.
//! Optimizer hooks (`update()`) run only after every rank agreed that the step succeeded, so a
//! failed step leaves every weight as it was and can be retried.
//!
//! Measurement. With `pipeline_options::measure` the host space times every stage call
//! (`steady_clock` around the user's function); `step_result::busy_seconds` is their sum and
//! `last_timings()` lists each one of the last step (kind, microbatch, stage, seconds), the input
//! of `loom::calibrate` (`loom/exec/calibrate.hpp`). The list is reserved when the pipeline is
//! built (one entry per compute half of the rank's program), so a measured step allocates nothing
//! either. On a device space the timings are CUDA events summed into `busy_seconds`;
//! `last_timings()` is empty there for now (calibration is host-only). `last_timeline()` places
//! every executed action of the step on the rank's clock (start and duration of each stage call,
//! each posted send and each wait for a receive), the input of the measured renderers
//! (`loom/render/measured.hpp`); it is reserved the same way. A versioned schedule's optimizer
//! updates (`action::update`) are busy time too, and each is an entry of both lists after its
//! action's (`update = true`), timed with the copies of weight versions it makes.
//!
//! Execution spaces. Everything above is one code for the host and for CUDA devices. The
//! communicator's type picks an *execution space* (`loom/exec/space.hpp`), the one place the
//! pipeline consults for memory, stage calls, losses and transfers: over a host
//! `loom::communicator` (threads, MPI) an action runs to completion; over a
//! `loom::device_communicator` (`loom::cuda_local`, `loom::nccl`, with `loom/exec/device_space.hpp`)
//! an action *enqueues* on the rank's compute stream (`stage_context::stream`), transfers are
//! ordered by CUDA events, buffers are device memory from the same buffer plan and are reused only
//! after the event that frees them, and the host waits only at the end of the step.
//!
//! Numerics. Gradient accumulators are zeroed at the start of each step. In the default mode a
//! stage adds each microbatch's weight gradient into its accumulator in execution order. In
//! deterministic mode it adds into a zeroed per-microbatch slot and the pipeline folds the slots
//! into the accumulator in microbatch order, `acc += g(0); acc += g(1); ...`, so the result is
//! bitwise the same for every schedule and rank count. The step's loss is the sum of the
//! microbatch losses in microbatch order, times the loss scale.
//!
//! Two parameter copies. Bidirectional schedules (two paths, `param_copies = 2`: DualPipe,
//! Chimera, BitPipe) hold virtual stage `s` of each path as a copy of the same model chunk; each
//! copy computes the weight gradients of its direction's microbatches. After the agreement both
//! copies' accumulators are made equal, bit for bit:
//! - default mode: both are set to (direction 0's gradient) + (direction 1's), exchanged once;
//! - deterministic mode: both hold the fold of all `m` contributions in microbatch order, the
//!   single-rank reference's sum. Each copy folds while the next microbatch is its own, keeps
//!   the rest in their slots, and after the step the two ranks exchange the held contributions
//!   (and the prefix already folded) and fold them in the same order; when both copies are on
//!   one rank they share one reorder buffer. The extra memory (held slots and received buffers,
//!   `stage_slots::copy_recv`) is `2(m - k) + 1` weight-gradient buffers per stage pair, `k` the
//!   first microbatch whose direction differs from microbatch 0's; see
//!   `loom/stage/buffer_plan.hpp`.

#include <algorithm>
#include <chrono>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/static_schedule.hpp"
#include "loom/schedule/validate.hpp"
#include "loom/exec/action_timing.hpp"
#include "loom/exec/memory.hpp"
#include "loom/exec/space.hpp"
#include "loom/exec/step_observer.hpp"
#include "loom/stage/buffer_plan.hpp"
#include "loom/stage/stage.hpp"
#if defined(LOOM_HAS_CUDA)
#include "loom/exec/device_space.hpp"
#endif

namespace loom {

//! A training step failed. Thrown on every rank with the same text: the rank whose failure
//! started it (`rank()`, -1 if unknown) and the cause.
class pipeline_error : public std::runtime_error {
 public:
  //! An error started by `rank` with sentence `cause`.
  pipeline_error(int rank, std::string cause)
      : std::runtime_error(rank < 0 ? "loom pipeline: " + cause
                                    : "loom pipeline: rank " + std::to_string(rank) + ": " + cause),
        rank_(rank),
        cause_(std::move(cause)) {}
  //! The rank whose failure started it, or -1.
  int rank() const noexcept { return rank_; }
  //! The cause, without the rank prefix.
  const std::string& cause() const noexcept { return cause_; }

 private:
  int rank_;
  std::string cause_;
};

//! The default `Vocab` of `loom::pipeline`: no vocabulary layers (a schedule that is not
//! vocabulary-parallel).
struct no_vocab_layers {};

//! What one step reports (identical on every rank except `seconds` and `busy_seconds`).
struct step_result {
  double loss = 0;          //!< scaled loss: (sum of microbatch losses in order) * scale
  double seconds = 0;       //!< this rank's wall time for the program (excluding the agreement)
  //! The part of `seconds` the host spent issuing the program: on the host, all of it; on a
  //! device, enqueueing the step (or launching its graph), before waiting for the device.
  double host_seconds = 0;
  double busy_seconds = 0;  //!< this rank's time inside stage functions and versioned updates (`measure` only)
  double busy_sum = 0;      //!< sum of every rank's busy time (`measure` only)
  double makespan = 0;      //!< largest rank wall time (`measure` only)
  //! Measured bubble ratio 1 - busy_sum / (P * makespan) (`measure` only).
  double bubble_ratio = 0;
};

namespace detail {

//! FNV-1a over 64-bit words.
struct fnv64 {
  std::uint64_t h = 1469598103934665603ull;
  constexpr void add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
};

//! A hash of everything two ranks must agree on: the lowered schedule and the numerics options.
constexpr std::uint64_t schedule_hash(const schedule& s, const pipeline_options& o) {
  fnv64 f;
  for (char c : s.name) f.add(static_cast<unsigned char>(c));
  for (int v : {s.ranks, s.microbatches, s.chunks, s.stages, s.directions, s.param_copies, static_cast<int>(s.placement),
                s.steps, static_cast<int>(s.stash)})
    f.add(static_cast<std::uint64_t>(v));
  for (int v : s.version_slots) f.add(static_cast<std::uint64_t>(v));
  for (int v : s.stage_to_rank) f.add(static_cast<std::uint64_t>(v));
  for (int v : s.mb_direction) f.add(static_cast<std::uint64_t>(v));
  for (auto const& p : s.programs) {
    f.add(p.size());
    for (auto const& a : p)
      for (int v : {static_cast<int>(a.kind), static_cast<int>(a.bkind), static_cast<int>(a.what), static_cast<int>(a.mb),
                    static_cast<int>(a.stage), static_cast<int>(a.bmb), static_cast<int>(a.bstage), static_cast<int>(a.peer),
                    static_cast<int>(a.version), static_cast<int>(a.update)})
        f.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
  }
  f.add(o.deterministic ? 1 : 0);
  f.add(static_cast<std::uint64_t>(o.scaling));
  f.add(o.graph ? 1 : 0);
  return f.h;
}

//! Which actions of `s` need a split stage: the first `B`, `W` or `FB` with a `B` half, or none.
constexpr bool needs_split_stage(const schedule& s) {
  for (auto const& p : s.programs)
    for (auto const& a : p)
      if (a.kind == op::B || a.kind == op::W || (a.kind == op::FB && a.bkind == op::B)) return true;
  return false;
}

//! The sentence explaining why `Stage` cannot run schedule `s`, or "".
template <class Stage>
constexpr text split_rule(const schedule& s) {
  if constexpr (split_stage<Stage>) {
    return {};
  } else {
    if (!needs_split_stage(s)) return {};
    text missing;
    if constexpr (!requires(Stage& st, const stage_context& c, backward_buffers<typename Stage::value_type> b) {
                    st.backward_input(c, b);
                  })
      missing = "backward_input";
    if constexpr (!requires(Stage& st, const stage_context& c, weight_buffers<typename Stage::value_type> w) {
                    st.backward_weight(c, w);
                  })
      missing += missing.empty() ? "backward_weight" : " and backward_weight";
    return "schedule " + s.name + " has separate B and W actions, so its stage must be a loom::split_stage; the stage type has no member " + missing;
  }
}

//! Instantiated with a non-empty message, fails to compile with the message in the diagnostic.
template <fixed_message Why>
struct stage_cannot_run_schedule {
  static_assert(no_message(message_text<exact_of<Why>>{}),
                "loom: this stage type cannot run this static schedule; the reason is the text in "
                "'message_text<exact_message<N>{\"...\"}>' above");
};

//! True for `static_schedule` types.
template <class Sched>
concept static_schedule_type = requires {
  Sched::shape_v;
  typename Sched::family;
  Sched::ranks;
};

//! The diagnostic text for a static schedule `Sched` run by `Stage`, or empty.
template <class Sched, class Stage>
constexpr fixed_message static_split_message() {
  if constexpr (static_schedule_type<Sched>) {
    if constexpr (Sched::ok) return fixed_message{split_rule<Stage>(typename Sched::family{}.generate(Sched::shape_v))};
    else return fixed_message{};
  } else {
    return fixed_message{};
  }
}

//! A fixed set of equal-width slots of `T`, handed out per microbatch (a stack of free slots).
//! The storage belongs to the pipeline's execution space. Each slot remembers when it was
//! given back (`freed_at`: the step's action count after which it is free; 0 = since the step
//! began), so a device space can order its next use after that point.
template <class T>
struct slot_pool {
  std::span<T> data;
  std::size_t width = 0;
  std::vector<int> free;      // free slot indices; the top is free[top - 1]
  std::vector<int> slot;      // slot of each microbatch, -1 if none
  std::vector<int> freed_at;  // per slot
  std::vector<int> ticket;    // per slot: the host copy that last read it (device spaces wait for it), -1 none
  const int* clock = nullptr;  // the pipeline's count of compute actions run in the step
  int count = 0;
  int top = 0;
  int last_freed_at = 0;      // freed_at of the slot handed out by the last take()
  int last_ticket = -1;       // ticket of the slot handed out by the last take()

  void init(std::span<T> storage, int slots, std::size_t w, int microbatches, const int* step_clock) {
    data = storage;
    count = slots;
    width = w;
    clock = step_clock;
    free.assign(static_cast<std::size_t>(slots), 0);
    slot.assign(static_cast<std::size_t>(microbatches), -1);
    freed_at.assign(static_cast<std::size_t>(slots), 0);
    ticket.assign(static_cast<std::size_t>(slots), -1);
    reset();
  }
  void reset() {
    for (int i = 0; i < count; ++i) free[static_cast<std::size_t>(i)] = count - 1 - i;
    top = count;
    std::fill(slot.begin(), slot.end(), -1);
    std::fill(freed_at.begin(), freed_at.end(), 0);
    std::fill(ticket.begin(), ticket.end(), -1);
  }
  std::span<T> at(int s) { return data.subspan(static_cast<std::size_t>(s) * width, width); }
  std::span<T> take(int mb) {
    if (top == 0) throw std::logic_error("loom: buffer plan exhausted (a loom bug)");
    int s = free[static_cast<std::size_t>(--top)];
    slot[static_cast<std::size_t>(mb)] = s;
    last_freed_at = freed_at[static_cast<std::size_t>(s)];
    last_ticket = std::exchange(ticket[static_cast<std::size_t>(s)], -1);
    return at(s);
  }
  std::span<T> get(int mb) {
    int s = slot[static_cast<std::size_t>(mb)];
    if (s < 0) throw std::logic_error("loom: microbatch has no slot (a loom bug)");
    return at(s);
  }
  //! Frees `mb`'s slot once the running action has completed and, on a device, the host copy
  //! `copy` that reads it (-1: none).
  void give(int mb, int copy = -1) {
    int& s = slot[static_cast<std::size_t>(mb)];
    ticket[static_cast<std::size_t>(s)] = copy;
    free[static_cast<std::size_t>(top++)] = s;
    freed_at[static_cast<std::size_t>(s)] = *clock + 1;  // free once the running action completed
    s = -1;
  }
};

}  // namespace detail

//! Runs one training step of this rank's part of a pipeline schedule (see the file comment).
//! `Sched` is `loom::schedule` (run-time shape) or a `loom::static_schedule<F, shape{...}>`
//! type; `Stage` models `loom::stage` (`loom::split_stage` for schedules with separate B/W);
//! `Comm` models `loom::communicator` (host) or `loom::device_communicator` (CUDA) and must have
//! as many ranks as the schedule.
template <class Sched, stage Stage, class Comm, class Vocab = no_vocab_layers>
  requires detail::pipeline_communicator<Comm>
class pipeline {
 public:
  using value_type = typename Stage::value_type;  //!< element type of every buffer
  //! True when the pipeline runs vocabulary layers (`Vocab`, e.g. `loom::vocab_layers`).
  static constexpr bool has_vocab = !std::is_same_v<Vocab, no_vocab_layers>;
  //! True when the rank's program is a compile-time constant.
  static constexpr bool is_static = detail::static_schedule_type<Sched>;
  //! The execution space (`loom/exec/space.hpp`): host, or a CUDA device.
  using space_type = typename detail::space_for<value_type, Comm>::type;
  //! True when actions enqueue on CUDA streams.
  static constexpr bool on_device = space_type::on_device;

  static_assert([] {
    if constexpr (has_vocab) return Vocab::on_device == on_device;
    else return true;
  }(),
                "vocabulary layers must run where the pipeline does: loom::vocab_layers<T, loom::cuda::vocab_kernel> (loom/cuda/patterns.hpp) "
                "on a device communicator, a host kernel (the default) on threads and MPI");

 private:
  [[no_unique_address]] detail::stage_cannot_run_schedule<detail::static_split_message<Sched, Stage>()> split_check_{};

 public:
  //! Builds the pipeline for a run-time schedule `s` (generated or lowered). `make_stage(id)`
  //! is called once per virtual stage placed on this rank, in (direction, stage) order.
  template <class Factory>
    requires(!is_static && std::is_invocable_r_v<Stage, Factory&, stage_id>)
  pipeline(const schedule& s, Comm& comm, Factory&& make_stage, pipeline_options opt = {})
      : comm_(&comm), opt_(opt), space_(comm, opt) {
    init(s, make_stage);
  }

  //! Builds the pipeline for a vocabulary-parallel run-time schedule `s` (`schedule::vocab` 1 or
  //! 2): `vocab` is this rank's shard of the input and output layers (`loom::vocab_layers`,
  //! `loom/exec/vocab_parallel.hpp`), which the pipeline binds here and drives in every step; the
  //! first stage's input is the embedding, the last stage's output goes to the output layer.
  //! Host backends (threads, MPI).
  template <class Factory>
    requires(!is_static && has_vocab && std::is_invocable_r_v<Stage, Factory&, stage_id>)
  pipeline(const schedule& s, Comm& comm, Factory&& make_stage, Vocab& vocab, pipeline_options opt = {})
      : comm_(&comm), opt_(opt), space_(comm, opt), vocab_(&vocab) {
    init(s, make_stage);
  }

  //! Builds the pipeline for a vocabulary-parallel static schedule `Sched` (pass `Sched{}`; e.g.
  //! `static_schedule<one_f_one_b_vocab_2, shape{...}>`) with this rank's vocabulary layers, as the
  //! run-time constructor above.
  template <class Factory>
    requires(is_static && has_vocab && std::is_invocable_r_v<Stage, Factory&, stage_id>)
  pipeline(Sched, Comm& comm, Factory&& make_stage, Vocab& vocab, pipeline_options opt = {})
      : comm_(&comm), opt_(opt), space_(comm, opt), vocab_(&vocab) {
    init(typename Sched::family{}.generate(Sched::shape_v), make_stage);
  }

  //! Builds the pipeline for the static schedule `Sched` (pass `Sched{}`).
  template <class Factory>
    requires(is_static && std::is_invocable_r_v<Stage, Factory&, stage_id>)
  pipeline(Sched, Comm& comm, Factory&& make_stage, pipeline_options opt = {})
      : comm_(&comm), opt_(opt), space_(comm, opt) {
    init(typename Sched::family{}.generate(Sched::shape_v), make_stage);
  }

  //! Runs one step over the microbatches of `inputs` (`m * input_size()` elements of the first
  //! stage, microbatch-major; ranks without a first stage may pass an empty span). Returns the
  //! scaled loss on every rank, or throws `pipeline_error` on every rank (see the file comment).
  step_result step(std::span<const value_type> inputs) {
    step_result res;
    auto t0 = std::chrono::steady_clock::now();
    step_t0_ = t0;
    try {
      if (!handshaken_) handshake();
      inputs = space_.stage_batch(inputs);  // graph mode: the batch goes to the buffer the graph reads
      if constexpr (has_vocab)  // the token ids, checked (and copied to a device) outside any capture
        if (vocab_ != nullptr) vocab_refusal_ = vocab_->load_batch();
      if (space_.replaying()) {
        timeline_.clear();  // a replay is one launch: no per-action timeline
        res.host_seconds = replay_step(inputs, t0);
      } else {
        space_.begin();  // first: in graph mode the whole step, zeroing included, is captured
        begin_step(inputs);
        run_program();
        for (std::size_t i = 0; i < nsend_; ++i) {
          space_.wait_send(send_reqs_[i]);
          send_reqs_[i] = request_type{};  // hand the request back now: the next step reuses it
        }
        res.host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        space_.end();
        space_.collect_losses(losses_);
        if constexpr (on_device) place_device_timeline();
        if constexpr (on_device)
          if (opt_.graph) save_held_slots();
      }
      if constexpr (has_vocab)  // the microbatch losses from the combined statistics, on the last stage's rank
        if (vocab_ != nullptr && failed_rank_ < 0 && rank_ == sched_.rank_of(0, S_ - 1)) vocab_->losses(losses_);
      res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if constexpr (on_device) res.busy_seconds = device_busy_seconds();
      else res.busy_seconds = busy_;
      agree(res);
    } catch (const pipeline_error&) {
      throw;  // a handshake mismatch: every rank found the same and throws the same
    } catch (const comm_error& e) {
      abort_quietly(std::string("stopped its pipeline step: ") + e.what());
      restore_weights_quietly();
      throw pipeline_error(e.rank(), "communication failed: " + e.cause());
    } catch (const std::exception& e) {
      abort_quietly(std::string("stopped its pipeline step: ") + e.what());
      restore_weights_quietly();
      throw pipeline_error(rank_, e.what());
    }
    if (failed_rank_ < 0 && sched_.directions == 2) {
      try {
        sync_copies();
      } catch (const comm_error& e) {
        abort_quietly(std::string("stopped its pipeline step: ") + e.what());
        throw pipeline_error(e.rank(), "communication failed while summing the two parameter copies: " + e.cause());
      }
    }
    if (opt_.observer != nullptr) observe_step_end();
    if (failed_rank_ >= 0) {
      if constexpr (on_device) space_.drop_graph();  // a failed capture is never replayed
      if (versioned_) restore_weights();
      throw pipeline_error(failed_rank_, failure_);
    }
    if constexpr (updatable_stage<Stage>)
      if (!versioned_)  // an asynchronous run updated where its schedule says
        for (auto& st : stages_) st.update();
    return res;
  }

  //! This rank's stages, in (direction, stage) order (see `ids()`).
  std::span<Stage> stages() { return stages_; }
  //! The virtual stage of each element of `stages()`.
  std::span<const stage_id> ids() const { return ids_; }
  //! The buffer plan in use.
  const buffer_plan& plan() const { return plan_; }
  //! The lowered schedule being run.
  const schedule& lowered() const { return sched_; }
  //! The loss of each microbatch of the last step (unscaled; identical on every rank).
  std::span<const double> microbatch_losses() const { return {losses_.data(), static_cast<std::size_t>(M_)}; }
  //! This rank.
  int rank() const { return rank_; }
  //! Measure mode on the host: the duration of every stage call of the last step on this rank,
  //! in the order they ran (an `FB` action as its two halves, `action_timing::in_fb`); exactly one
  //! entry per compute half of the rank's program after a successful step, and one per versioned
  //! update after its action's (`action_timing::update`). Empty when not
  //! measuring, on a device space (calibration is host-only for now), and after a step in which
  //! this rank's stage threw (the calls after it were skipped). Valid until the next `step`.
  std::span<const action_timing> last_timings() const { return timings_; }
  //! Measure mode on the host: every executed action of the last step on this rank, in the order
  //! it ran, with its start (seconds from this rank's `step` entry) and duration: each compute half
  //! (an `FB` action as its two halves), each send posted and each receive waited for (the wait).
  //! One entry per action of the rank's program (two per `FB`; an update its own, after its
  //! action's: `expected_timeline`) after a successful step. On a device
  //! space the times are device times on the rank's compute stream, from events recorded around
  //! each action (a stage call's kernels; a receive's wait for its copy; a send posts nothing on
  //! the stream and is a point), eager steps only (empty after a replay). Empty when not
  //! measuring; collect every rank's with `gather_timeline` (`loom/exec/timeline.hpp`). Valid
  //! until the next `step`.
  std::span<const measured_action> last_timeline() const { return timeline_; }
  //! The execution space (on a device: `space().stream()` is the rank's compute stream).
  space_type& space() { return space_; }
  //! The options the pipeline was built with.
  const pipeline_options& options() const { return opt_; }
  //! Bytes of activation, gradient, stash and send buffers the pipeline allocated for this rank
  //! (the buffer plan's slots times the stages' sizes, plus the loss-term buffers (one on the
  //! host, one per microbatch on a device unless they would exceed 1 MiB), the loss seed and the
  //! discarded input gradient and, on two-direction schedules, the buffers received from the
  //! other copy).
  std::size_t buffer_bytes() const { return buffer_elements_ * sizeof(value_type); }
  //! Bytes of host memory the pipeline allocated for offloaded activations (programs with
  //! `offload`/`reload` actions: the buffer plan's host slots times the stages' input and stash
  //! sizes; on a device, pinned); 0 without host copies.
  std::size_t host_buffer_bytes() const { return host_elements_ * sizeof(value_type); }
  //! Versioned (asynchronous) schedules: bytes of the weight-version buffers (K per stage, the
  //! schedule's `version_slots`) and of the copy of every stage's weights at the run's start
  //! (restored if the run fails); 0 for synchronous schedules.
  std::size_t version_bytes() const { return version_elements_ * sizeof(value_type); }
  //! Versioned schedules: the most weight versions local stage `i` (of `stages()`) held at once in
  //! the last run, counted by the executor as its buffers were written (the version buffers in
  //! use, at most `version_slots`); 1 for a synchronous schedule.
  int versions_held(std::size_t i) const { return versioned_ ? locals_[i].held_peak : 1; }

 private:
  struct local_stage {
    detail::slot_pool<value_type> in, stash, grad, send_act, send_grad, wgrad;
    detail::slot_pool<value_type> host_in, host_stash;  // offloaded activations (host memory)
    std::vector<int> offloaded, reloaded;               // per microbatch: the ticket of its copies, -1 none
    std::vector<char> contributed;   // deterministic mode, on the fold leader: microbatches handed in
    std::span<value_type> twin;      // two copies on two ranks: buffers received from the other copy
    std::size_t leader = 0;          // local stage whose accumulator this stage's folds go to
    int twin_rank = -1;              // rank of the other copy (two directions), or -1
    int next_fold = 0;
    std::size_t in_size = 0, out_size = 0, stash_size = 0, wg_size = 0;
    // Versioned schedules: K buffers of the stage's weights (version v in buffer v mod K), the
    // weights at the run's start, the version now in `weights()`, the latest version, and the
    // most buffers that held a version at once.
    std::span<value_type> versions, backup;
    std::size_t w_size = 0;
    int K = 0, loaded = 0, latest = 0, held_peak = 0;
  };

  template <class Factory>
  void init(const schedule& generated, Factory& make_stage) {
    rank_ = comm_->rank();
    if (comm_->size() != generated.ranks)
      throw config_error("schedule " + generated.name + " has " + std::to_string(generated.ranks) +
                         " ranks but the communicator has " + std::to_string(comm_->size()));
    if (opt_.timeout.count() > 0) comm_->set_timeout(opt_.timeout);
    if (auto v = validate(generated); !v.ok) throw schedule_error("schedule " + generated.name + " is invalid: " + v.message);
    if (generated.versioned()) {
      if constexpr (!versioned_stage<Stage>)
        throw config_error("schedule " + generated.name +
                           " is asynchronous (weight versions across steps): its stage type needs weights() and "
                           "update(const loom::update_context&) (loom::versioned_stage)");
      if (opt_.observer != nullptr)
        throw config_error("schedule " + generated.name +
                           " is asynchronous: a step observer (data parallelism) is not supported over it, every update would "
                           "need its own gradient all-reduce");
      if (opt_.graph)
        throw config_error("schedule " + generated.name + " is asynchronous: graph mode is not supported for it; run it eagerly");
      versioned_ = true;
    }
    if (generated.vocab != 0) {
      if (vocab_ == nullptr)
        throw config_error("schedule " + generated.name +
                           " is vocabulary-parallel: build the pipeline with this rank's vocabulary layers (loom::vocab_layers, "
                           "docs/vocab.md)");
      if (opt_.observer != nullptr)
        throw config_error("schedule " + generated.name +
                           " is vocabulary-parallel: a step observer (data parallelism) is not supported over it yet, the vocabulary "
                           "layers' gradients would need their own all-reduce");
    } else if (vocab_ != nullptr) {
      throw config_error("vocabulary layers were given, but schedule " + generated.name + " is not vocabulary-parallel");
    }
    bool lowered = false;
    for (auto const& p : generated.programs)
      for (auto const& a : p) lowered = lowered || is_transfer(a.kind);
    sched_ = lowered || generated.ranks == 1 ? generated : lower(generated);
    if (std::string why = detail::split_rule<Stage>(sched_); !why.empty()) throw config_error(why);
    plan_ = plan_buffers(sched_, rank_, opt_.recv_ahead);
    hash_ = detail::schedule_hash(sched_, opt_);
    S_ = sched_.stages;
    M_ = sched_.microbatches;
    program_ = sched_.programs[static_cast<std::size_t>(rank_)];
    const auto L = plan_.local.size();
    stages_.reserve(L);
    locals_.resize(L);
    std::size_t max_out_last = 0, max_in_first = 0, sends = 0, copy_req_count = 0;
    first_change_ = detail::first_direction_change(sched_);
    for (std::size_t li = 0; li < L; ++li) {
      auto const& sl = plan_.local[li];
      ids_.push_back(sl.id);
      stages_.push_back(make_stage(sl.id));
      Stage& st = stages_.back();
      auto& l = locals_[li];
      l.in_size = static_cast<std::size_t>(st.input_size());
      l.out_size = static_cast<std::size_t>(st.output_size());
      l.stash_size = static_cast<std::size_t>(st.stash_size());
      l.wg_size = std::span<value_type>(st.weight_grad()).size();
      const std::string where = "stage " + std::to_string(sl.id.stage) + (sched_.directions == 2 ? " dir " + std::to_string(sl.id.direction) : "");
      // Device slots (host slots for offloaded activations: `on_host`).
      auto pool = [&](detail::slot_pool<value_type>& p, int slots, std::size_t width, const char* what, bool on_host = false) {
        const std::size_t n = static_cast<std::size_t>(slots) * width;
        (on_host ? host_elements_ : buffer_elements_) += n;
        const std::string name = where + " " + what + " slots";
        p.init(on_host ? space_.allocate_host(n, name) : space_.allocate(n, name), slots, width, M_, &clock_);
      };
      pool(l.in, sl.input, l.in_size, "input");
      pool(l.stash, sl.stash, l.stash_size, "stash");
      pool(l.grad, sl.grad, l.out_size, "output-gradient");
      pool(l.send_act, sl.send_act, l.out_size, "activation-send");
      pool(l.send_grad, sl.send_grad, l.in_size, "gradient-send");
      pool(l.wgrad, opt_.deterministic ? sl.wgrad : 0, l.wg_size, "weight-gradient");
      pool(l.host_in, sl.host_input, l.in_size, "offloaded-input", true);
      pool(l.host_stash, sl.host_stash, l.stash_size, "offloaded-stash", true);
      if constexpr (versioned_stage<Stage>)
        if (versioned_) {
          l.w_size = std::span<value_type>(st.weights()).size();
          l.K = sched_.version_slots[static_cast<std::size_t>(sl.id.stage)];
          l.versions = space_.allocate(static_cast<std::size_t>(l.K) * l.w_size, where + " weight versions");
          l.backup = space_.allocate(l.w_size, where + " weights at the run's start");
          version_elements_ += static_cast<std::size_t>(l.K + 1) * l.w_size;
        }
      l.contributed.assign(static_cast<std::size_t>(M_), 0);
      l.offloaded.assign(static_cast<std::size_t>(M_), -1);
      l.reloaded.assign(static_cast<std::size_t>(M_), -1);
      l.leader = li;
      l.twin_rank = detail::twin_rank(sched_, sl.id.direction, sl.id.stage);
      if (l.twin_rank == rank_) {
        l.leader = static_cast<std::size_t>(plan_.index_of(0, sl.id.stage));
      } else if (l.twin_rank >= 0) {
        const int bufs = opt_.deterministic ? sl.copy_recv : 1;
        buffer_elements_ += static_cast<std::size_t>(bufs) * l.wg_size;
        l.twin = space_.allocate(static_cast<std::size_t>(bufs) * l.wg_size, where + " other-copy gradients");
        // Requests of the exchange: one per received buffer and one per sent one (the held
        // slots of this copy, plus the prefix on the leader; the accumulator in default mode).
        int sent = 1;
        if (opt_.deterministic) {
          sent = sched_.direction_of(0) == sl.id.direction ? 1 : 0;
          for (int j = first_change_; j < M_; ++j) sent += sched_.direction_of(j) == sl.id.direction ? 1 : 0;
        }
        copy_req_count += static_cast<std::size_t>(bufs + sent);
      }
      sends += static_cast<std::size_t>(sl.send_act + sl.send_grad);
      if (sl.id.stage == S_ - 1) max_out_last = std::max(max_out_last, l.out_size);
      if (sl.id.stage == 0) max_in_first = std::max(max_in_first, l.in_size);
    }
    int open_s = 0, stash_slots = 0;  // the most S stashes open at once on this rank (S opens, its T closes)
    for (auto const& a : program_) {
      sends += a.kind == op::send && is_vocab(a.what) ? 1 : 0;
      open_s += a.kind == op::S ? 1 : a.kind == op::T ? -1 : 0;
      stash_slots = std::max(stash_slots, open_s);
    }
    if constexpr (has_vocab)
      if (vocab_ != nullptr)
        vocab_->bind({.rank = rank_, .ranks = sched_.ranks, .microbatches = M_, .last = sched_.rank_of(0, S_ - 1), .first = sched_.rank_of(0, 0),
                      .algorithm = sched_.vocab, .scale = opt_.scaling == loss_scaling::mean ? 1.0 / M_ : 1.0,
                      .last_output = max_out_last, .first_input = max_in_first, .stream = [&]() -> CUstream_st* {
                        if constexpr (on_device) return space_.stream();
                        else return nullptr;
                      }(), .stash_slots = stash_slots});
    const std::size_t loss_bufs = space_type::loss_buffers(static_cast<std::size_t>(M_), max_out_last);
    loss_stride_ = loss_bufs > 1 ? max_out_last : 0;
    loss_out_ = space_.allocate(loss_bufs * max_out_last, "loss terms");
    seed_ = space_.allocate(max_out_last, "loss seed");
    discard_ = space_.allocate(max_in_first, "discarded input gradient");
    buffer_elements_ += (loss_bufs + 1) * max_out_last + max_in_first;
    // The mean over a step's microbatches (an asynchronous run's T steps each have m of them).
    const double scale = opt_.scaling == loss_scaling::mean ? 1.0 / sched_.step_microbatches() : 1.0;
    space_.fill(seed_, static_cast<value_type>(scale));
    scale_ = scale;
    std::size_t halves = 0, updates = 0;
    for (auto const& a : program_) {
      halves += a.kind == op::FB ? 2 : is_compute(a.kind) ? 1 : 0;
      updates += a.update ? 1 : 0;
    }
    space_.reserve(halves, static_cast<std::size_t>(M_), max_out_last, std::span<const value_type>(loss_out_));
    std::size_t host_copies = 0;
    for (auto const& a : program_) host_copies += is_host_copy(a.kind) ? 1 : 0;
    space_.reserve_copies(host_copies);
    if (opt_.measure) {  // once: a measured step appends without allocating
      if constexpr (!on_device) timings_.reserve(halves + updates);
      std::size_t transfers = 0;
      for (auto const& a : program_) transfers += is_compute(a.kind) ? 0 : 1;  // send, recv, offload, reload
      timeline_.reserve(halves + transfers + updates);
      if constexpr (on_device) {
        device_marks_.reserve(halves + transfers + updates);
        space_.reserve_marks(2 * (halves + transfers + updates));
      }
    }
    make_labels();
    recv_reqs_.resize(plan_.recv_positions.size());
    send_reqs_.resize(sends);
    copy_reqs_.resize(copy_req_count);
    copy_is_recv_.assign(copy_req_count, 0);
    for (std::size_t li = 0; li < L; ++li) copy_order_.push_back(li);
    // By stage, ties in index order (std::sort: libstdc++ 12's std::stable_sort warns under clang).
    std::sort(copy_order_.begin(), copy_order_.end(), [&](std::size_t a, std::size_t b) {
      return ids_[a].stage != ids_[b].stage ? ids_[a].stage < ids_[b].stage : a < b;
    });
    const auto P = static_cast<std::size_t>(sched_.ranks);
    status_.assign(P * status_words, 0);
    losses_.assign(static_cast<std::size_t>(M_) + 2 * P, 0.0);
    observed_use_.assign(L, 0);
    observed_w_.assign(L, 0);
  }

  void abort_quietly(const std::string& why) noexcept {
    try {
      comm_->abort(why);
    } catch (...) {
    }
  }

  // ---- handshake ---------------------------------------------------------------------------
  static constexpr std::size_t name_words = 4;
  static constexpr std::size_t hs_words = 7 + name_words;

  void handshake() {
    const auto P = static_cast<std::size_t>(sched_.ranks);
    std::vector<std::int64_t> hs(P * hs_words, 0);
    auto* me = hs.data() + static_cast<std::size_t>(rank_) * hs_words;
    me[0] = static_cast<std::int64_t>(hash_);
    me[1] = sched_.ranks;
    me[2] = sched_.microbatches;
    me[3] = sched_.chunks;
    me[4] = sched_.stages;
    me[5] = sched_.directions;
    me[6] = opt_.deterministic ? 1 : 0;
    pack(sched_.name, std::span<std::int64_t>(me + 7, name_words));
    comm_->all_reduce(std::span<std::int64_t>(hs), reduce_op::sum);
    auto describe = [&](std::size_t r) {
      const auto* w = hs.data() + r * hs_words;
      return "rank " + std::to_string(r) + " holds " + unpack(std::span<const std::int64_t>(w + 7, name_words)) +
             " (ranks " + std::to_string(w[1]) + ", microbatches " + std::to_string(w[2]) + ", chunks " +
             std::to_string(w[3]) + ", stages " + std::to_string(w[4]) + (w[6] ? ", deterministic" : "") + ", hash " +
             std::to_string(static_cast<std::uint64_t>(w[0])) + ")";
    };
    for (std::size_t r = 1; r < P; ++r)
      if (hs[r * hs_words] != hs[0])
        throw pipeline_error(static_cast<int>(r), "schedule mismatch: " + describe(0) + " but " + describe(r) +
                                                      "; every rank must run the same schedule with the same options");
    // Sizes: every stage's input, output and weight gradient, gathered; neighbours must agree,
    // and so must the two copies of a stage on two-direction schedules (they exchange gradients).
    const auto D = static_cast<std::size_t>(sched_.directions), S = static_cast<std::size_t>(S_);
    std::vector<std::int64_t> sz(D * S * 3, 0);
    for (std::size_t li = 0; li < locals_.size(); ++li) {
      auto id = ids_[li];
      auto k = (static_cast<std::size_t>(id.direction) * S + static_cast<std::size_t>(id.stage)) * 3;
      sz[k] = static_cast<std::int64_t>(locals_[li].in_size);
      sz[k + 1] = static_cast<std::int64_t>(locals_[li].out_size);
      sz[k + 2] = static_cast<std::int64_t>(locals_[li].wg_size);
    }
    comm_->all_reduce(std::span<std::int64_t>(sz), reduce_op::sum);
    if (D == 2)
      for (std::size_t s = 0; s < S; ++s)
        if (sz[s * 3 + 2] != sz[(S + s) * 3 + 2]) {
          int r0 = sched_.stage_to_rank[s], r1 = sched_.stage_to_rank[S + s];
          throw pipeline_error(r1, "wrong buffer size: the two copies of stage " + std::to_string(s) +
                                       " hold weight gradients of " + std::to_string(sz[s * 3 + 2]) + " (rank " +
                                       std::to_string(r0) + ", direction 0) and " + std::to_string(sz[(S + s) * 3 + 2]) +
                                       " (rank " + std::to_string(r1) + ", direction 1) elements; they must be equal");
        }
    for (std::size_t d = 0; d < D; ++d)
      for (std::size_t s = 1; s < S; ++s) {
        auto in = sz[(d * S + s) * 3], out = sz[(d * S + s - 1) * 3 + 1];
        if (in != out) {
          int r = sched_.stage_to_rank[d * S + s], q = sched_.stage_to_rank[d * S + s - 1];
          throw pipeline_error(r, "wrong buffer size: stage " + std::to_string(s) + " (rank " + std::to_string(r) +
                                      ") takes inputs of " + std::to_string(in) + " elements but stage " +
                                      std::to_string(s - 1) + " (rank " + std::to_string(q) + ") produces " +
                                      std::to_string(out) + (D > 1 ? " on direction " + std::to_string(d) : std::string{}));
        }
      }
    if constexpr (on_device) open_channels();
    handshaken_ = true;
  }

  //! Device: every directed channel the lowered programs send on, and both directions between
  //! the two copies of a stage; opened once, collectively, after the handshake proved that every
  //! rank holds the same schedule.
  void open_channels() { comm_->open_channels(device_channels(sched_)); }

  //! Device: NVTX/simulator labels of every compute half, "F mb3 s2", built once.
  void make_labels() {
    if constexpr (on_device) {
      labels_.clear();
      for (const char* k : {"F", "B", "W", "BW", "U", "OFF", "REL"})
        for (int mb = 0; mb < M_; ++mb)
          for (int st = 0; st < S_; ++st) labels_.push_back(std::string(k) + " mb" + std::to_string(mb) + " s" + std::to_string(st));
    }
  }
  const char* label(op kind, int mb, int st) const {
    if constexpr (!on_device) {
      return "";
    } else {
      const int k = kind == op::F ? 0 : kind == op::B ? 1 : kind == op::W ? 2 : kind == op::offload ? 5 : kind == op::reload ? 6 : 3;
      return labels_[static_cast<std::size_t>((k * M_ + mb) * S_ + st)].c_str();
    }
  }

  static void pack(std::string_view text, std::span<std::int64_t> words) {
    std::fill(words.begin(), words.end(), 0);
    const std::size_t n = std::min(text.size(), words.size() * 8);
    for (std::size_t i = 0; i < n; ++i) {
      auto u = static_cast<std::uint64_t>(static_cast<unsigned char>(text[i])) << (8 * (i % 8));
      words[i / 8] = static_cast<std::int64_t>(static_cast<std::uint64_t>(words[i / 8]) | u);
    }
  }
  static std::string unpack(std::span<const std::int64_t> words) {
    std::string out;
    for (std::size_t i = 0; i < words.size() * 8; ++i) {
      auto c = static_cast<char>((static_cast<std::uint64_t>(words[i / 8]) >> (8 * (i % 8))) & 0xffu);
      if (c == '\0') break;
      out.push_back(c);
    }
    return out;
  }

  // ---- one step ----------------------------------------------------------------------------
  void begin_step(std::span<const value_type> inputs) {
    failure_.clear();
    failed_rank_ = -1;
    busy_ = 0;
    timings_.clear();  // keeps the capacity reserved in init
    timeline_.clear();
    device_marks_.clear();
    recv_k_ = 0;
    nsend_ = 0;
    clock_ = 0;
    inputs_ = inputs;
    std::fill(losses_.begin(), losses_.end(), 0.0);
    for (std::size_t li = 0; li < locals_.size(); ++li) {
      auto& l = locals_[li];
      for (auto* p : {&l.in, &l.stash, &l.grad, &l.send_act, &l.send_grad, &l.wgrad, &l.host_in, &l.host_stash}) p->reset();
      std::fill(l.contributed.begin(), l.contributed.end(), 0);
      std::fill(l.offloaded.begin(), l.offloaded.end(), -1);
      std::fill(l.reloaded.begin(), l.reloaded.end(), -1);
      l.next_fold = sched_.directions == 2 ? 0 : first_of_direction(ids_[li].direction, 0);
      space_.zero(std::span<value_type>(stages_[li].weight_grad()));
      if (versioned_) start_versions(li);
      if (ids_[li].stage == 0 && vocab_ == nullptr && inputs.size() != static_cast<std::size_t>(M_) * l.in_size)
        fail("wrong buffer size: the batch has " + std::to_string(inputs.size()) + " elements but stage 0 needs " +
             std::to_string(M_) + " microbatches x " + std::to_string(l.in_size) + " = " +
             std::to_string(static_cast<std::size_t>(M_) * l.in_size));
    }
    if constexpr (has_vocab)
      if (vocab_ != nullptr)
        vocab_->begin_step();
    if (!vocab_refusal_.empty()) fail(vocab_refusal_);
    if (opt_.observer != nullptr) observe_begin();
  }

  //! Graph mode after the first step: the captured step is replayed (stage functions are not
  //! called; the batch was copied into the buffer the graph reads).
  double replay_step(std::span<const value_type> inputs, std::chrono::steady_clock::time_point t0) {
    double host = 0;
    failure_.clear();
    failed_rank_ = -1;
    if (!vocab_refusal_.empty()) fail(vocab_refusal_);
    if (inputs.size() != inputs_.size())
      fail("wrong buffer size: the batch has " + std::to_string(inputs.size()) + " elements but the captured step reads " +
           std::to_string(inputs_.size()));
    std::fill(losses_.begin(), losses_.end(), 0.0);
    if constexpr (on_device) {
      space_.replay([&] { host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); });
      space_.collect_losses(losses_);
      restore_held_slots();
    }
    return host;
  }

  //! Graph mode: the weight-gradient slots a captured step leaves held (two-direction
  //! deterministic mode) are what the copy exchange after the step reads; a replay runs no host
  //! bookkeeping, so the captured step's final state is kept and restored.
  void save_held_slots() {
    held_.clear();
    for (auto& l : locals_) held_.push_back(l.wgrad);
  }
  void restore_held_slots() {
    for (std::size_t i = 0; i < locals_.size() && i < held_.size(); ++i) {
      auto& w = locals_[i].wgrad;
      std::copy(held_[i].free.begin(), held_[i].free.end(), w.free.begin());
      std::copy(held_[i].slot.begin(), held_[i].slot.end(), w.slot.begin());
      w.top = held_[i].top;
    }
  }

  void run_program() {
    for (std::size_t k = 0; k < static_cast<std::size_t>(opt_.recv_ahead); ++k) post(k);
    if constexpr (is_static) {
      [&]<int... R>(std::integer_sequence<int, R...>) {
        ((rank_ == R ? run_static<R>() : void()), ...);
      }(std::make_integer_sequence<int, Sched::ranks>{});
    } else {
      for (const action& a : program_) run(a);
    }
    if (versioned_) finish_versions();
  }

  template <int R>
  void run_static() {
    constexpr auto& prog = Sched::template lowered_program<R>;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (run_constant<prog[I]>(), ...);
    }(std::make_index_sequence<prog.size()>{});
  }

  //! One action known at compile time: the dispatch folds away.
  template <action A>
  void run_constant() {
    if constexpr (is_compute(A.kind) && A.kind != op::FB)
      if (versioned_) use_version(A.mb, A.stage, A.version);
    run_constant_action<A>();
    if constexpr (A.update) versioned_update(A.kind, A.mb, A.stage);
    if (opt_.observer != nullptr) opt_.observer->progress();
  }
  template <action A>
  void run_constant_action() {
    if constexpr (A.kind == op::recv) on_recv();
    else if constexpr (A.kind == op::send) on_send(A);
    else if constexpr (A.kind == op::F) forward_half(A.mb, A.stage);
    else if constexpr (A.kind == op::B || A.kind == op::BW) backward_half<A.kind>(A.mb, A.stage);
    else if constexpr (A.kind == op::W) weight(A.mb, A.stage);
    else if constexpr (A.kind == op::offload) offload_half(A);
    else if constexpr (A.kind == op::reload) reload_half(A);
    else if constexpr (is_vocab(A.kind)) vocab_pass(A);
    else {
      in_fb_ = true;
      forward_half(A.mb, A.stage);
      backward_half<A.bkind>(A.bmb, A.bstage);
      in_fb_ = false;
    }
  }

  //! One action from the run-time program.
  void run(const action& a) {
    if (versioned_ && is_compute(a.kind)) use_version(a.mb, a.stage, a.version);
    run_action(a);
    if (a.update) versioned_update(a.kind, a.mb, a.stage);
    if (opt_.observer != nullptr) opt_.observer->progress();
  }
  void run_action(const action& a) {
    switch (a.kind) {
      case op::recv: on_recv(); break;
      case op::send: on_send(a); break;
      case op::F: forward_half(a.mb, a.stage); break;
      case op::B: backward_half<op::B>(a.mb, a.stage); break;
      case op::BW: backward_half<op::BW>(a.mb, a.stage); break;
      case op::W: weight(a.mb, a.stage); break;
      case op::FB:
        in_fb_ = true;
        forward_half(a.mb, a.stage);
        if (a.bkind == op::B) backward_half<op::B>(a.bmb, a.bstage);
        else backward_half<op::BW>(a.bmb, a.bstage);
        in_fb_ = false;
        break;
      case op::offload: offload_half(a); break;
      case op::reload: reload_half(a); break;
      case op::S:
      case op::T:
      case op::IF:
      case op::IB: vocab_pass(a); break;
    }
  }

  //! A vocabulary pass on this rank's shard (`vocab_layers`); a throwing kernel marks the rank
  //! failed like a stage does.
  void vocab_pass(const action& a) {
    if constexpr (has_vocab) {
      auto run = [&](const char* what, auto fn) { guarded(what, a.kind, a.mb, a.stage, [] { return detail::accesses(); }, [&](const stage_context&) { fn(); }); };
      switch (a.kind) {
        case op::S: run("vocabulary pass S", [&] { vocab_->forward_output(a.mb); }); break;
        case op::T: run("vocabulary pass T", [&] { vocab_->backward_output(a.mb); }); break;
        case op::IF: run("vocabulary pass IF", [&] { vocab_->forward_input(a.mb); }); break;
        default: run("vocabulary pass IB", [&] { vocab_->backward_input(a.mb); }); break;
      }
      ++clock_;
    } else {
      throw config_error("vocabulary pass " + to_string(a) + " without vocabulary layers");
    }
  }

  void post(std::size_t k) {
    if (k >= plan_.recv_positions.size()) return;
    std::size_t pos = k;
    // Fault injection (device tests): two receives posted in swapped order.
    if (opt_.faults.swap_receives >= 0) {
      const auto sw = static_cast<std::size_t>(opt_.faults.swap_receives);
      if (k == sw && sw + 1 < plan_.recv_positions.size()) pos = sw + 1;
      else if (k == sw + 1) pos = sw;
    }
    const action& r = program_[plan_.recv_positions[pos]];
    if constexpr (has_vocab)
      if (is_vocab(r.what)) {
        recv_reqs_[pos] = space_.irecv(r.peer, vocab_->message(r.what, r.mb, r.stage), 0, clock_);
        return;
      }
    auto& pool = r.what == payload::activation ? local(r.mb, r.stage + 1).in : local(r.mb, r.stage - 1).grad;
    std::span<value_type> buf = pool.take(r.mb);
    recv_reqs_[pos] = space_.irecv(r.peer, buf, pool.last_freed_at, clock_, opt_.faults.skip_offload_wait ? -1 : pool.last_ticket);
  }
  void on_recv() {
    const std::size_t k = recv_k_++;
    timed(program_[plan_.recv_positions[k]], [&] { space_.wait_recv(recv_reqs_[k]); });
    recv_reqs_[k] = request_type{};
    post(k + static_cast<std::size_t>(opt_.recv_ahead));
  }
  void on_send(const action& a) {
    if constexpr (has_vocab)
      if (is_vocab(a.what)) {
        std::span<value_type> buf = vocab_->message(a.what, a.mb, a.stage);
        timed(a, [&] { send_reqs_[nsend_++] = space_.isend(a.peer, buf, clock_); });
        return;
      }
    auto& l = local(a.mb, a.stage);
    std::span<value_type> buf = a.what == payload::activation ? l.send_act.get(a.mb) : l.send_grad.get(a.mb);
    timed(a, [&] { send_reqs_[nsend_++] = space_.isend(a.peer, buf, clock_); });
  }
  //! `OFFLOAD(mb, s)`: the input (stage > 0) and stash of `(mb, s)` go to host slots; their device
  //! slots are free once the copies have run (on a device, whoever takes them next waits for the
  //! copies' ticket).
  void offload_half(const action& a) {
    auto& l = local(a.mb, a.stage);
    timed(a, [&] {
      std::array<detail::copy_pair<value_type>, 2> cp{};
      std::array<int, 2> after{};
      std::size_t n = 0;
      if (a.stage > 0) {
        cp[n] = {l.host_in.take(a.mb), l.in.get(a.mb)};
        after[n++] = l.host_in.last_ticket;  // the reload that last read this host slot
      }
      cp[n] = {l.host_stash.take(a.mb), l.stash.get(a.mb)};
      after[n++] = l.host_stash.last_ticket;
      const int t = space_.host_copy(true, std::span(cp.data(), n), clock_, std::span(after.data(), n), label(a.kind, a.mb, a.stage));
      if (a.stage > 0) l.in.give(a.mb, t);
      l.stash.give(a.mb, t);
      l.offloaded[static_cast<std::size_t>(a.mb)] = t;
    });
  }
  //! `RELOAD(mb, s)`: the offloaded input and stash of `(mb, s)` come back to device slots, after
  //! their copies to host; the backward waits for it (`await_reload`).
  void reload_half(const action& a) {
    auto& l = local(a.mb, a.stage);
    timed(a, [&] {
      std::array<detail::copy_pair<value_type>, 2> cp{};
      std::array<int, 3> after{};
      std::size_t n = 0, w = 0;
      if (a.stage > 0) {
        cp[n++] = {l.in.take(a.mb), l.host_in.get(a.mb)};
        after[w++] = l.in.last_ticket;  // an offload that last read this device slot
      }
      cp[n++] = {l.stash.take(a.mb), l.host_stash.get(a.mb)};
      after[w++] = l.stash.last_ticket;
      after[w++] = std::exchange(l.offloaded[static_cast<std::size_t>(a.mb)], -1);  // the copies to host it reads
      const int t = space_.host_copy(false, std::span(cp.data(), n), clock_, std::span(after.data(), w), label(a.kind, a.mb, a.stage));
      if (a.stage > 0) l.host_in.give(a.mb, t);
      l.host_stash.give(a.mb, t);
      l.reloaded[static_cast<std::size_t>(a.mb)] = t;
    });
  }
  //! A backward of `(mb, s)` waits for the reload of its activation (if it was offloaded).
  void await_reload(local_stage& l, int mb) {
    const int t = std::exchange(l.reloaded[static_cast<std::size_t>(mb)], -1);
    if (t >= 0 && !opt_.faults.skip_reload_wait) space_.await(t);
  }
  //! A slot just taken from `pool` for a stage call to write: on a device, wait for the host copy
  //! that last read it (an offload).
  void await_slot(const detail::slot_pool<value_type>& pool) {
    if (pool.last_ticket >= 0 && !opt_.faults.skip_offload_wait) space_.await(pool.last_ticket);
  }
  //! Runs the transfer `fn` of action `a`; in measure mode on the host, places it on the timeline.
  template <class Fn>
  void timed(const action& a, Fn&& fn) {
    if (!opt_.measure) return fn();
    if constexpr (on_device) {
      const int m0 = space_.mark();
      fn();
      note_device(a.kind, a.mb, a.stage, a.peer, m0, space_.mark());
    } else {
      const auto t = std::chrono::steady_clock::now();
      fn();
      if (timeline_.size() < timeline_.capacity())
        timeline_.push_back({.kind = a.kind, .microbatch = a.mb, .stage = a.stage, .rank = rank_, .peer = a.peer,
                             .start = seconds_since(step_t0_, t),
                             .seconds = seconds_since(t, std::chrono::steady_clock::now())});
    }
  }
  //! Device measure mode: an action between marks `m0` and `m1`, timed once the step has synchronised.
  void note_device(op kind, int mb, int s, int peer, int m0, int m1, bool update = false) {
    if (timeline_.size() >= timeline_.capacity()) return;
    timeline_.push_back({.kind = kind, .microbatch = mb, .stage = s, .rank = rank_, .peer = peer, .in_fb = in_fb_, .update = update});
    device_marks_.push_back({m0, m1});
  }
  //! Device measure mode, after the step synchronised: each noted action's start and duration from
  //! its marks (device time on the compute stream from the step's start mark). A step whose marks
  //! were not all recorded (captured, or out of marks) has no timeline.
  void place_device_timeline() {
    if (!opt_.measure) return;
    for (std::size_t i = 0; i < timeline_.size(); ++i) {
      auto [m0, m1] = device_marks_[i];
      if (m0 < 0 || m1 < 0) {
        timeline_.clear();
        return;
      }
      timeline_[i].start = space_.mark_seconds(m0);
      timeline_[i].seconds = space_.mark_seconds(m1) - timeline_[i].start;
    }
  }
  //! Device measure mode: the step's device time in stage calls, from the placed timeline (0 for a
  //! replayed or captured step, which has none).
  double device_busy_seconds() const {
    double s = 0;
    for (auto const& t : timeline_)
      if (is_compute(t.kind)) s += t.seconds;
    return s;
  }
  static double seconds_since(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  }

  local_stage& local(int mb, int s) { return locals_[local_index(mb, s)]; }
  std::size_t local_index(int mb, int s) const {
    return static_cast<std::size_t>(plan_.index_of(sched_.direction_of(mb), s));
  }
  int first_of_direction(int dir, int from) const {
    while (from < M_ && sched_.direction_of(from) != dir) ++from;
    return from;
  }
  stage_context context(int mb, int s) const {
    return {.microbatch = mb, .stage = s, .direction = sched_.direction_of(mb), .rank = rank_, .stages = S_, .microbatches = M_,
            .version = version_};
  }
  std::span<const value_type> batch_input(std::size_t li, int mb) const {
    if constexpr (has_vocab)
      if (vocab_ != nullptr) return vocab_->first_input(mb);
    const auto w = locals_[li].in_size;
    if (inputs_.size() < (static_cast<std::size_t>(mb) + 1) * w) return {};
    return inputs_.subspan(static_cast<std::size_t>(mb) * w, w);
  }

  void fail(std::string why) {
    if (failed_rank_ < 0) {
      failed_rank_ = rank_;
      failure_ = std::move(why);
    }
  }
  //! Calls a stage function through the execution space (on a device: it enqueues on the
  //! compute stream, inside a region labelled `kind mb s` that touches what `accesses()` lists).
  //! A throwing stage marks this rank failed; the rank keeps communicating.
  template <class Accesses, class Fn>
  void guarded(const char* what, op kind, int mb, int s, Accesses&& accesses, Fn&& fn) {
    if (failed_rank_ >= 0) return;
    try {
      stage_context ctx = context(mb, s);
      int m0 = -1;
      if constexpr (on_device)
        if (opt_.measure) m0 = space_.mark();
      const double d = space_.call(label(kind, mb, s), ctx, accesses, [&] { fn(ctx); });
      if constexpr (on_device)
        if (opt_.measure) note_device(kind, mb, s, -1, m0, space_.mark());
      busy_ += d;
      if constexpr (!on_device)
        if (opt_.measure) {
          if (timings_.size() < timings_.capacity())
            timings_.push_back({.kind = kind, .microbatch = mb, .stage = s, .rank = rank_, .in_fb = in_fb_, .seconds = d});
          if (timeline_.size() < timeline_.capacity())  // the call ended now and lasted d
            timeline_.push_back({.kind = kind, .microbatch = mb, .stage = s, .rank = rank_, .in_fb = in_fb_,
                                 .start = seconds_since(step_t0_, std::chrono::steady_clock::now()) - d, .seconds = d});
        }
    } catch (const std::exception& e) {
      fail(std::string("stage ") + std::to_string(s) + " " + what + " of microbatch " + std::to_string(mb) + " threw: " + e.what());
    } catch (...) {
      fail(std::string("stage ") + std::to_string(s) + " " + what + " of microbatch " + std::to_string(mb) + " threw a non-standard exception");
    }
  }

  void forward_half(int mb, int s) {
    const std::size_t li = local_index(mb, s);
    auto& l = locals_[li];
    if constexpr (has_vocab)
      if (vocab_ != nullptr && s == 0) vocab_->gather_input(mb);  // the embedding: every rank's part, in rank order
    std::span<const value_type> in = s == 0 ? batch_input(li, mb) : std::span<const value_type>(l.in.get(mb));
    if (opt_.observer != nullptr) observe_use(li);
    std::span<value_type> stash = l.stash.take(mb);
    await_slot(l.stash);
    std::span<value_type> out;
    if (s == S_ - 1 && vocab_ != nullptr) {
      if constexpr (has_vocab) out = vocab_->message(payload::vocab_output, mb, rank_);  // to the output layer
    } else if (s == S_ - 1) {
      out = loss_out_.subspan(static_cast<std::size_t>(mb) * loss_stride_, l.out_size);
    } else if (sched_.rank_of(mb, s + 1) == rank_) {
      auto& next = local(mb, s + 1).in;
      out = next.take(mb);
      await_slot(next);
    } else {
      out = l.send_act.take(mb);
    }
    guarded("forward", op::F, mb, s, [&] { return detail::accesses(detail::reads(in), detail::writes(out), detail::writes(stash)); },
            [&](const stage_context& c) { stages_[li].forward(c, forward_buffers<value_type>{in, out, stash}); });
    if (s == S_ - 1 && failed_rank_ < 0 && vocab_ == nullptr) space_.record_loss(out, mb, losses_);
    ++clock_;
  }

  template <op Kind>
  void backward_half(int mb, int s) {
    const std::size_t li = local_index(mb, s);
    auto& l = locals_[li];
    await_reload(l, mb);
    std::span<const value_type> in = s == 0 ? batch_input(li, mb) : std::span<const value_type>(l.in.get(mb));
    std::span<value_type> stash = l.stash.get(mb);
    std::span<const value_type> og =
        s == S_ - 1 ? std::span<const value_type>(seed_.data(), l.out_size) : std::span<const value_type>(l.grad.get(mb));
    std::span<value_type> ig;
    if (s == 0) ig = std::span<value_type>(discard_.data(), l.in_size);
    else if (sched_.rank_of(mb, s - 1) == rank_) ig = local(mb, s - 1).grad.take(mb);
    else ig = l.send_grad.take(mb);
    if constexpr (has_vocab)
      if (vocab_ != nullptr) {
        if (s == S_ - 1) og = vocab_->output_gradient(mb);                       // the output layer's input gradient
        if (s == 0) ig = vocab_->message(payload::vocab_embed_grad, mb, rank_);  // kept for every rank's IB
      }
    if constexpr (Kind == op::BW) {
      std::span<value_type> wg = weight_target(li, mb);
      guarded("backward", op::BW, mb, s,
              [&] { return detail::accesses(detail::reads(in), detail::reads(og), detail::writes(stash), detail::writes(ig), detail::writes(wg)); },
              [&](const stage_context& c) { stages_[li].backward(c, backward_buffers<value_type>{in, stash, og, ig, wg}); });
      fold(li, mb);
      if (opt_.observer != nullptr) observe_weight_done(li);
      if (s > 0) l.in.give(mb);
      l.stash.give(mb);
    } else {
      if constexpr (split_stage<Stage>)
        guarded("backward_input", op::B, mb, s,
                [&] { return detail::accesses(detail::reads(in), detail::reads(og), detail::writes(stash), detail::writes(ig)); },
                [&](const stage_context& c) { stages_[li].backward_input(c, backward_buffers<value_type>{in, stash, og, ig, {}}); });
    }
    if (s + 1 < S_) l.grad.give(mb);
    ++clock_;
  }

  void weight(int mb, int s) {
    const std::size_t li = local_index(mb, s);
    auto& l = locals_[li];
    std::span<const value_type> in = s == 0 ? batch_input(li, mb) : std::span<const value_type>(l.in.get(mb));
    std::span<value_type> stash = l.stash.get(mb);
    std::span<value_type> wg = weight_target(li, mb);
    if constexpr (split_stage<Stage>)
      guarded("backward_weight", op::W, mb, s,
              [&] { return detail::accesses(detail::reads(in), detail::reads(stash), detail::writes(wg)); },
              [&](const stage_context& c) { stages_[li].backward_weight(c, weight_buffers<value_type>{in, stash, wg}); });
    fold(li, mb);
    if (opt_.observer != nullptr) observe_weight_done(li);
    if (s > 0) l.in.give(mb);
    l.stash.give(mb);
    ++clock_;
  }

  std::span<value_type> weight_target(std::size_t li, int mb) {
    if (!opt_.deterministic) return stages_[li].weight_grad();
    auto g = locals_[li].wgrad.take(mb);
    space_.zero(g);
    return g;
  }

  //! Deterministic mode: adds every contiguous ready microbatch's slot into the leader's
  //! accumulator. The fold sequence is the stage's direction, or on two-direction schedules every
  //! microbatch; one computed by the other copy on another rank stops it until `sync_copies`.
  void fold(std::size_t li, int mb) {
    if (!opt_.deterministic) return;
    const std::size_t ld = locals_[li].leader;
    auto& l = locals_[ld];
    l.contributed[static_cast<std::size_t>(mb)] = 1;
    const int s = ids_[ld].stage, dir = ids_[ld].direction;
    const bool paired = sched_.directions == 2;
    while (l.next_fold < M_ && l.contributed[static_cast<std::size_t>(l.next_fold)]) {
      std::span<value_type> acc = stages_[ld].weight_grad();
      auto& owner = paired ? local(l.next_fold, s) : l;
      space_.add(acc, owner.wgrad.get(l.next_fold));
      owner.wgrad.give(l.next_fold);
      l.next_fold = paired ? l.next_fold + 1 : first_of_direction(dir, l.next_fold + 1);
    }
  }

  // ---- weight versions (asynchronous schedules) --------------------------------------------
  // Version v of a local stage lives in buffer v mod K; `weights()` is the working copy the
  // stage's calls read. Every copy and update is enqueued in program order on the space (on a
  // device, the compute stream that runs the stage's calls), so no further ordering is needed.
  std::span<value_type> version_slot(local_stage& l, int v) {
    return l.versions.subspan(static_cast<std::size_t>(v % l.K) * l.w_size, l.w_size);
  }
  //! The run's start: version 0 is the stage's weights; they are also kept for a failed run.
  void start_versions(std::size_t li) {
    if constexpr (versioned_stage<Stage>) {
      auto& l = locals_[li];
      std::span<value_type> w = stages_[li].weights();
      space_.copy(version_slot(l, 0), w);
      space_.copy(l.backup, w);
      l.loaded = l.latest = 0;
      l.held_peak = 1;
    }
    version_ = 0;
  }
  //! Before a stage call reading version `v`: loads it into `weights()` unless it is there.
  void use_version(int mb, int s, int v) {
    version_ = v;
    if constexpr (versioned_stage<Stage>) {
      if (failed_rank_ >= 0) return;
      const std::size_t li = local_index(mb, s);
      auto& l = locals_[li];
      if (l.loaded == v) return;
      space_.copy(std::span<value_type>(stages_[li].weights()), version_slot(l, v));
      l.loaded = v;
    }
  }
  //! After the weight-gradient action `kind` of (mb, s) that carries the update: the stage's update
  //! turns the latest version and the gradient accumulated since the previous update into the
  //! next version, stored in its buffer; the accumulator starts again from zero. The whole of it
  //! (copies included) is busy time, and in measure mode an entry of the timings and the timeline
  //! (`update = true`): the time `stage_cost::update` calibrates.
  void versioned_update(op kind, int mb, int s) {
    if constexpr (versioned_stage<Stage>) {
      if (failed_rank_ >= 0) return;
      const std::size_t li = local_index(mb, s);
      auto& l = locals_[li];
      if (opt_.deterministic && l.next_fold <= mb) {
        fail("stage " + std::to_string(s) + " updates after microbatch " + std::to_string(mb) +
             " before the weight gradients of every earlier microbatch were folded (an out-of-order schedule)");
        return;
      }
      // Measure mode only: a step that does not measure reads no clock.
      [[maybe_unused]] const auto t0 = opt_.measure ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      [[maybe_unused]] int m0 = -1;
      if constexpr (on_device)
        if (opt_.measure) m0 = space_.mark();
      std::span<value_type> w = stages_[li].weights();
      std::span<value_type> acc = stages_[li].weight_grad();
      if (l.loaded != l.latest) space_.copy(w, version_slot(l, l.latest));
      const int next = l.latest + 1;
      stage_context ctx = context(mb, s);
      try {
        space_.call(update_label(mb, s), ctx, [&] { return detail::accesses(detail::reads(acc), detail::writes(w)); },
                    [&] { stages_[li].update(update_context{.stage = s, .direction = 0, .rank = rank_, .version = next, .stream = ctx.stream}); });
      } catch (const std::exception& e) {
        fail("stage " + std::to_string(s) + " update to version " + std::to_string(next) + " threw: " + e.what());
        return;
      } catch (...) {
        fail("stage " + std::to_string(s) + " update to version " + std::to_string(next) + " threw a non-standard exception");
        return;
      }
      space_.copy(version_slot(l, next), w);
      space_.zero(acc);
      l.latest = l.loaded = next;
      l.held_peak = std::max(l.held_peak, std::min(next + 1, l.K));
      if constexpr (on_device) {
        if (opt_.measure) note_device(kind, mb, s, -1, m0, space_.mark(), true);
      } else if (opt_.measure) {
        const double d = seconds_since(t0, std::chrono::steady_clock::now());
        busy_ += d;
        if (timings_.size() < timings_.capacity())
          timings_.push_back({.kind = kind, .microbatch = mb, .stage = s, .rank = rank_, .update = true, .seconds = d});
        if (timeline_.size() < timeline_.capacity())
          timeline_.push_back({.kind = kind, .microbatch = mb, .stage = s, .rank = rank_, .update = true,
                               .start = seconds_since(step_t0_, t0), .seconds = d});
      }
    }
  }
  //! The run's end: every stage's `weights()` holds its latest version.
  void finish_versions() {
    if constexpr (versioned_stage<Stage>) {
      if (failed_rank_ >= 0) return;
      for (std::size_t li = 0; li < locals_.size(); ++li) {
        auto& l = locals_[li];
        if (l.loaded != l.latest) space_.copy(std::span<value_type>(stages_[li].weights()), version_slot(l, l.latest));
        l.loaded = l.latest;
      }
    }
  }
  //! A failed run: every stage's weights as they were at the run's start.
  void restore_weights() {
    if constexpr (versioned_stage<Stage>) {
      space_.begin(false);
      for (std::size_t li = 0; li < locals_.size(); ++li) {
        space_.copy(std::span<value_type>(stages_[li].weights()), locals_[li].backup);
        locals_[li].loaded = locals_[li].latest = 0;
      }
      space_.end();
    }
  }
  void restore_weights_quietly() noexcept {
    if (!versioned_) return;
    try {
      restore_weights();
    } catch (...) {
    }
  }
  const char* update_label(int mb, int st) const {
    if constexpr (!on_device) {
      return "";
    } else {
      return labels_[static_cast<std::size_t>((4 * M_ + mb) * S_ + st)].c_str();
    }
  }

  // ---- step observer (data-parallel gradient sync; loom/exec/step_observer.hpp) --------------
  // Called on the host in program order, after the action was run (host) or enqueued (device:
  // an observer orders its device work after the compute stream's position, as loom::data_parallel
  // does with one event). A replayed graph step runs no host actions: only step_end is called then.
  void observe_begin() {
    std::fill(observed_use_.begin(), observed_use_.end(), 0);
    std::fill(observed_w_.begin(), observed_w_.end(), 0);
  }
  void observe_use(std::size_t li) {
    if (observed_use_[li] != 0) return;
    observed_use_[li] = 1;
    opt_.observer->before_first_use(li);
  }
  //! One weight-gradient action of local stage `li` ran and was folded; after its last one of
  //! the step the gradient is final (two directions: only after `sync_copies`).
  void observe_weight_done(std::size_t li) {
    if (sched_.directions == 2) return;
    if (++observed_w_[li] == M_) opt_.observer->gradients_ready(li);
  }
  void observe_step_end() {
    try {
      if (failed_rank_ < 0 && sched_.directions == 2)
        for (std::size_t li = 0; li < locals_.size(); ++li) opt_.observer->gradients_ready(li);
      opt_.observer->step_end(failed_rank_, failure_);
    } catch (const pipeline_error&) {
      throw;
    } catch (const comm_error& e) {
      abort_quietly(std::string("stopped its pipeline step: ") + e.what());
      throw pipeline_error(e.rank(), "communication failed after the step: " + e.cause());
    }
  }

  // ---- two parameter copies ---------------------------------------------------------------
  //! Bidirectional schedules hold stage s of each path as a copy of the same model chunk; both
  //! copies end the step with the same gradient, bit for bit (see the file comment).
  void sync_copies() {
    // Exchanges in stage order: between two ranks each stage index pairs one copy with the other,
    // so both sides post their sends and receives in the same (FIFO-matched) order.
    const bool det = opt_.deterministic;
    const int lead_dir = sched_.direction_of(0);
    std::size_t nreq = 0;
    space_.begin(false);
    for (std::size_t li : copy_order_) {
      auto& l = locals_[li];
      if (l.twin_rank < 0 || l.twin_rank == rank_) continue;
      const int dir = ids_[li].direction;
      std::span<value_type> acc = stages_[li].weight_grad();
      auto buf = [&](std::size_t i) { return l.twin.subspan(i * l.wg_size, l.wg_size); };
      auto recv = [&](std::span<value_type> b) {
        copy_is_recv_[nreq] = 1;
        copy_reqs_[nreq++] = space_.irecv(l.twin_rank, b, 0, clock_);
      };
      auto send = [&](std::span<const value_type> b) {
        copy_is_recv_[nreq] = 0;
        copy_reqs_[nreq++] = space_.isend(l.twin_rank, b, clock_);
      };
      if (!det) {
        recv(buf(0));
        send(acc);
        continue;
      }
      // Receives: the leader's prefix (on the other copy), then the other copy's held slots in
      // microbatch order. Sends: the prefix (leader), then this copy's held slots in order.
      std::size_t r = 0;
      if (lead_dir != dir) recv(buf(r++));
      for (int j = first_change_; j < M_; ++j)
        if (sched_.direction_of(j) != dir) recv(buf(r++));
      if (lead_dir == dir) send(acc);
      for (int j = first_change_; j < M_; ++j)
        if (sched_.direction_of(j) == dir) send(l.wgrad.get(j));
    }
    for (std::size_t i = 0; i < nreq; ++i) {
      if (copy_is_recv_[i]) space_.wait_recv(copy_reqs_[i]);  // on a device: the compute stream waits
      else space_.wait_send(copy_reqs_[i]);
      copy_reqs_[i] = request_type{};
    }
    for (std::size_t li = 0; li < locals_.size(); ++li) {
      auto& l = locals_[li];
      const int dir = ids_[li].direction;
      std::span<value_type> acc = stages_[li].weight_grad();
      if (l.twin_rank == rank_) {
        if (dir != 0) continue;
        std::span<value_type> other = stages_[static_cast<std::size_t>(plan_.index_of(1, ids_[li].stage))].weight_grad();
        if (!det) space_.add(acc, other);  // (direction 0's) + (direction 1's)
        space_.copy(other, acc);           // deterministic: the leader folded both copies' contributions
      } else if (!det) {
        space_.add(acc, l.twin.first(l.wg_size));  // the same bits on both copies: addition commutes
      } else {
        // Both copies now fold the same values in the same order: the leader's prefix
        // g(0) + ... + g(k-1), then g(k), ..., g(m-1) from this copy's slots or the received ones.
        std::size_t r = 0;
        if (lead_dir != dir) {
          space_.copy(acc, l.twin.first(l.wg_size));
          r = 1;
        }
        for (int j = first_change_; j < M_; ++j) {
          if (sched_.direction_of(j) == dir) {
            space_.add(acc, l.wgrad.get(j));
            l.wgrad.give(j);
          } else {
            space_.add(acc, l.twin.subspan(r++ * l.wg_size, l.wg_size));
          }
        }
      }
    }
    space_.end();
  }

  // ---- agreement ---------------------------------------------------------------------------
  static constexpr std::size_t status_words = 1 + 32;

  void agree(step_result& res) {
    const auto P = static_cast<std::size_t>(sched_.ranks);
    std::fill(status_.begin(), status_.end(), 0);
    auto* me = status_.data() + static_cast<std::size_t>(rank_) * status_words;
    if (failed_rank_ >= 0) {
      me[0] = 1;
      pack(failure_, std::span<std::int64_t>(me + 1, status_words - 1));
    }
    comm_->all_reduce(std::span<std::int64_t>(status_), reduce_op::sum);
    losses_[static_cast<std::size_t>(M_) + static_cast<std::size_t>(rank_)] = res.busy_seconds;
    losses_[static_cast<std::size_t>(M_) + P + static_cast<std::size_t>(rank_)] = res.seconds;
    comm_->all_reduce(std::span<double>(losses_), reduce_op::sum);
    failed_rank_ = -1;
    std::string others;
    for (std::size_t r = 0; r < P; ++r) {
      if (status_[r * status_words] == 0) continue;
      if (failed_rank_ < 0) {
        failed_rank_ = static_cast<int>(r);
        failure_ = unpack(std::span<const std::int64_t>(status_.data() + r * status_words + 1, status_words - 1));
      } else {
        others += (others.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (failed_rank_ >= 0) {
      failure_ += versioned_ ? "; the run was abandoned on every rank and every stage's weights were restored to the run's start "
                               "(optimizer state a stage keeps itself is not restored)"
                             : "; the step was abandoned on every rank and no weights were updated";
      if (!others.empty()) failure_ += " (ranks " + others + " failed too)";
      return;
    }
    double total = 0;
    for (int j = 0; j < M_; ++j) total += losses_[static_cast<std::size_t>(j)];
    res.loss = total * scale_;
    for (std::size_t r = 0; r < P; ++r) {
      res.busy_sum += losses_[static_cast<std::size_t>(M_) + r];
      res.makespan = std::max(res.makespan, losses_[static_cast<std::size_t>(M_) + P + r]);
    }
    if (opt_.measure && res.makespan > 0) res.bubble_ratio = 1 - res.busy_sum / (static_cast<double>(P) * res.makespan);
  }

  Comm* comm_;
  pipeline_options opt_;
  int rank_ = 0, S_ = 0, M_ = 0;
  schedule sched_;
  std::vector<action> program_;
  buffer_plan plan_;
  std::uint64_t hash_ = 0;
  bool handshaken_ = false;
  std::vector<Stage> stages_;
  std::vector<stage_id> ids_;
  std::vector<local_stage> locals_;
  space_type space_;
  std::span<value_type> loss_out_, seed_, discard_;
  std::size_t loss_stride_ = 0;  // elements between two microbatches' loss terms (0: one buffer for all)
  std::size_t buffer_elements_ = 0;
  std::size_t host_elements_ = 0;  // host slots of offloaded activations
  Vocab* vocab_ = nullptr;         // this rank's vocabulary layers (vocabulary-parallel schedules), or null
  int clock_ = 0;  // compute halves enqueued (run) in this step: the slot pools' and the device space's clock
  std::vector<std::string> labels_;  // device: "F mb3 s2", ...
  double scale_ = 1;
  using request_type = typename Comm::request;
  std::vector<request_type> recv_reqs_, send_reqs_, copy_reqs_;
  std::vector<char> copy_is_recv_;
  std::vector<detail::slot_pool<value_type>> held_;  // graph mode: weight-gradient slots after the captured step
  std::vector<std::size_t> copy_order_;  // local stages by stage index (copy exchange order)
  std::size_t recv_k_ = 0, nsend_ = 0;
  int first_change_ = 0;  // two directions: first microbatch whose direction differs from microbatch 0's
  std::span<const value_type> inputs_;
  std::vector<std::int64_t> status_;
  std::vector<double> losses_;  // [M microbatch losses | P busy times | P wall times]
  int failed_rank_ = -1;
  std::string failure_;
  std::string vocab_refusal_;  // why the vocabulary layers' batch cannot run this step (load_batch), or empty
  double busy_ = 0;
  std::vector<action_timing> timings_;  // measure mode (host): this step's stage calls; reserved in init
  std::vector<measured_action> timeline_;  // measure mode (host): this step's actions on the rank's clock
  std::chrono::steady_clock::time_point step_t0_{};  // the current step's start (`step` entry)
  std::vector<std::pair<int, int>> device_marks_;     // device measure mode: each timeline entry's marks
  bool in_fb_ = false;                  // running the halves of an FB action
  bool versioned_ = false;              // an asynchronous schedule: weight versions and in-program updates
  int version_ = 0;                     // versioned: the version the next stage call reads (its context's)
  std::size_t version_elements_ = 0;    // versioned: elements of the version and start buffers
  std::vector<char> observed_use_;  // step observer: local stages used this step
  std::vector<int> observed_w_;     // step observer: weight-gradient actions run per local stage
};

//! Deduces the stage type from the factory: `pipeline p(schedule, comm, make_stage, options)`.
template <class Sched, class Comm, class Factory>
pipeline(Sched, Comm&, Factory&&, pipeline_options = {})
    -> pipeline<Sched, std::remove_cvref_t<std::invoke_result_t<Factory&, stage_id>>, Comm>;

}  // namespace loom
