// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The user's side of a pipeline: a *stage* is one virtual stage of the model (a contiguous
//! slice of its layers). loom owns every buffer a stage touches and hands it spans; a stage
//! owns its parameters and its weight-gradient accumulator.
//!
//! Concepts, refined in a chain:
//! - `loom::stage`: `forward` and a fused full `backward` (input gradient and weight gradient in
//!   one call). Enough for schedules whose programs hold only `F`, `BW` (and `FB` with a `BW`
//!   half): GPipe, 1F1B, interleaved 1F1B.
//! - `loom::split_stage`: additionally `backward_input` and `backward_weight`, the split the
//!   Zero Bubble schedules need (Qi et al., ICLR 2024, §2: B computes the gradient with respect
//!   to the stage input, W the gradient with respect to the weights, later).
//! - `loom::versioned_stage`: additionally `weights()` (the parameters its calls read) and
//!   `update(const update_context&)`, what the asynchronous schedules need (PipeDream,
//!   PipeDream-2BW, pipelined backpropagation: `loom/schedule/pipedream.hpp`). loom keeps the
//!   schedule's weight versions in buffers of its own, loads the version an action reads into
//!   `weights()` before the call, and calls `update` where the schedule updates.
//!
//! Buffers (all sizes in elements of `value_type`, per microbatch):
//! - `input` (`input_size()`): the activation entering the stage; read-only; alive from the
//!   forward until the stage's last backward action of that microbatch.
//! - `output` (`output_size()`): written by `forward`. On the last stage of a path the output is
//!   the microbatch's loss terms: loom sums them into the microbatch loss, and seeds the backward
//!   with `output_grad` filled with the loss scale (`1/m` for `loss_scaling::mean`, `1` for
//!   `sum`), so the stage returns d(scale * loss)/d(input).
//! - `stash` (`stash_size()`): private scratch of the stage for this microbatch, alive from the
//!   forward until the last backward action (e.g. inner layer activations; what B leaves for W).
//! - `output_grad`: gradient with respect to `output`; `input_grad`: written by the backward,
//!   gradient with respect to `input` (discarded on the first stage).
//! - `weight_grad` (`weight_grad().size()` elements): the stage must *add* this microbatch's weight
//!   gradient into it (never overwrite). In the default mode it is the stage's own accumulator,
//!   so gradients accumulate in execution order; in deterministic mode it is a zeroed scratch
//!   slot that loom folds into the accumulator in microbatch order.
//!
//! Gradient scaling: accumulators are zeroed by the pipeline at the start of a step and hold
//! d(scaled loss)/d(weights) at its end, where the scaled loss is the mean (default) or the sum
//! of the microbatch losses.

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

struct CUstream_st;  // cudaStream_t is CUstream_st*: named here without including CUDA

namespace loom {

//! Identifies a virtual stage: its index along a path and the path (direction 0, or 1 on
//! bidirectional schedules).
struct stage_id {
  int stage = 0;      //!< virtual stage index along the path, 0..S-1
  int direction = 0;  //!< path: 0, or 1 for the second direction of a bidirectional schedule
  friend constexpr bool operator==(const stage_id&, const stage_id&) = default;
};

//! What a stage function is told about the call: which microbatch, which virtual stage, on which
//! rank, whether this stage is the first or the last of its path, and on CUDA backends the stream
//! the stage must enqueue its kernels on.
struct stage_context {
  int microbatch = 0;   //!< microbatch index within the step, 0..m-1
  int stage = 0;        //!< virtual stage index along the path
  int direction = 0;    //!< path of the microbatch
  int rank = 0;         //!< rank running the call
  int stages = 1;       //!< S, the number of virtual stages per path
  int microbatches = 1; //!< m, microbatches in the step (an asynchronous run: T m, microbatch t m + i)
  //! Versioned (asynchronous) schedules: the weight version this call reads, already loaded into
  //! the stage's `weights()`; 0 otherwise.
  int version = 0;
  //! CUDA backends: the rank's compute stream (a `cudaStream_t`); the stage enqueues its kernels
  //! there and returns without waiting. Null on host backends.
  CUstream_st* stream = nullptr;
  //! True on the first stage of the path (its input is the user's batch).
  constexpr bool first() const { return stage == 0; }
  //! True on the last stage of the path (its output is the loss).
  constexpr bool last() const { return stage == stages - 1; }
};

//! Buffers of a forward call (see the file comment).
template <class T>
struct forward_buffers {
  std::span<const T> input;  //!< activation entering the stage
  std::span<T> output;       //!< activation leaving the stage (loss terms on the last stage)
  std::span<T> stash;        //!< the stage's private per-microbatch scratch
};

//! Buffers of a backward call, fused (`backward`) or input-only (`backward_input`, where
//! `weight_grad` is empty).
template <class T>
struct backward_buffers {
  std::span<const T> input;        //!< the activation the forward received
  std::span<T> stash;              //!< the same stash the forward wrote (B may leave data for W)
  std::span<const T> output_grad;  //!< gradient with respect to the output
  std::span<T> input_grad;         //!< written: gradient with respect to the input
  std::span<T> weight_grad;        //!< add this microbatch's weight gradient here (fused only)
};

//! Buffers of a weight-gradient call (`backward_weight`).
template <class T>
struct weight_buffers {
  std::span<const T> input;   //!< the activation the forward received
  std::span<T> stash;         //!< the stash, as `backward_input` left it
  std::span<T> weight_grad;   //!< add this microbatch's weight gradient here
};

//! A virtual stage with a forward and a fused backward. Requirements (sizes per microbatch,
//! constant for the life of the object): `value_type`, `input_size()`, `output_size()`,
//! `stash_size()`, `weight_grad()` (the accumulator, a `std::span<value_type>`),
//! `forward(ctx, forward_buffers)`, `backward(ctx, backward_buffers)`.
template <class S>
concept stage =
    std::is_arithmetic_v<typename S::value_type> &&
    requires(S& s, const S& cs, const stage_context& ctx, forward_buffers<typename S::value_type> fb,
             backward_buffers<typename S::value_type> bb) {
      { cs.input_size() } -> std::convertible_to<std::size_t>;
      { cs.output_size() } -> std::convertible_to<std::size_t>;
      { cs.stash_size() } -> std::convertible_to<std::size_t>;
      { s.weight_grad() } -> std::convertible_to<std::span<typename S::value_type>>;
      s.forward(ctx, fb);
      s.backward(ctx, bb);
    };

//! A stage whose backward is also available in two halves, for schedules with separate `B` and
//! `W` actions: `backward_input(ctx, backward_buffers)` (with an empty `weight_grad`) and
//! `backward_weight(ctx, weight_buffers)`.
template <class S>
concept split_stage =
    stage<S> && requires(S& s, const stage_context& ctx, backward_buffers<typename S::value_type> bb,
                         weight_buffers<typename S::value_type> wb) {
      s.backward_input(ctx, bb);
      s.backward_weight(ctx, wb);
    };

//! A stage with an optimizer hook: `update()` is called by the pipeline after every rank agreed
//! that the step succeeded (never after a failed step).
template <class S>
concept updatable_stage = stage<S> && requires(S& s) { s.update(); };

//! What a versioned stage's update is told (see `versioned_stage`).
struct update_context {
  int stage = 0;      //!< virtual stage index
  int direction = 0;  //!< path (always 0: versioned schedules have one)
  int rank = 0;       //!< rank running the update
  //! The version this update writes: the stage's updates so far, this one included (1 for the
  //! first). `weights()` holds the previous latest version when `update` is called.
  int version = 1;
  //! CUDA backends: the rank's compute stream; the update enqueues there. Null on host backends.
  CUstream_st* stream = nullptr;
};

//! A stage that runs asynchronous (versioned) schedules: `weights()` is the span of parameters
//! every call reads (a `std::span<value_type>`, fixed for the life of the object), and
//! `update(const update_context&)` applies the gradient accumulated in `weight_grad()` to
//! `weights()` (weights -= lr * gradient, or any optimizer). loom holds the schedule's versions
//! (`schedule::version_slots`) in buffers of `weights().size()` elements, copies the version an
//! action reads into `weights()` before the call, and, at an update, loads the latest version,
//! calls `update`, stores the result as the next version and zeroes `weight_grad()`.
template <class S>
concept versioned_stage = stage<S> && requires(S& s, const update_context& u) {
  { s.weights() } -> std::convertible_to<std::span<typename S::value_type>>;
  s.update(u);
};

}  // namespace loom
