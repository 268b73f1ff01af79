// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::action_timing`: the measured duration of one compute half of a pipeline step, as
//! `loom::pipeline::last_timings()` reports it in measure mode (`pipeline_options::measure`) and
//! `loom::calibrate` (`loom/exec/calibrate.hpp`) reads it. Std only, so that calibration and
//! tools can use it without the executor.

#include "loom/schedule/action.hpp"

namespace loom {

//! One stage call of a step, timed on the host (`host_space::call`: `steady_clock` around the
//! user's stage function, nothing else: no communication, no buffer bookkeeping).
//! An overlapped `FB` action is reported as its two halves, each with its own kind (`F`, then
//! `B` or `BW`) and `in_fb = true`: the host runs them one after the other. A versioned
//! schedule's optimizer update (`action::update`) is its own entry after its action's, with the
//! action's kind, microbatch and stage and `update = true`: `loom::calibrate` makes it the
//! stage's `stage_cost::update`.
struct action_timing {
  op kind = op::F;     //!< `F`, `B`, `W` or `BW`
  int microbatch = 0;  //!< the microbatch
  int stage = 0;       //!< the virtual stage (0..S-1; both directions of a two-path schedule share indices)
  int rank = 0;        //!< the rank that ran it
  bool in_fb = false;  //!< a half of an overlapped `FB` action
  bool update = false;  //!< the optimizer update after the action, not its stage call
  double seconds = 0;  //!< wall-clock duration of the stage call (of the update, with all its copies)
  friend constexpr bool operator==(const action_timing&, const action_timing&) = default;
};

//! One executed action of a measured step on one rank, placed on the rank's clock: what
//! `loom::pipeline::last_timeline()` reports in measure mode, and what the measured renderers
//! (`loom/render/measured.hpp`) draw beside the predicted timeline of the same step.
//! - `F`, `B`, `W`, `BW`: a stage call (an `FB` action is its two halves, `in_fb = true`), timed
//!   as in `action_timing`.
//! - `recv`: the wait for a received item before its consumer (on the host, the time blocked in
//!   the communicator's wait: the communication wait the prediction does not see).
//! - `send`: posting a send (non-blocking: its duration is the host's cost of posting it).
//! - `update = true` (kind `W` or `BW`): a versioned schedule's optimizer update after that
//!   action, with the copies of weight versions around it (see `action_timing`).
//! For transfers, (`microbatch`, `stage`) name the item by the stage that produced it (as in the
//! lowered program) and `peer` is the other rank.
struct measured_action {
  op kind = op::F;     //!< `F`, `B`, `W`, `BW`, `send` or `recv`
  int microbatch = 0;  //!< the microbatch
  int stage = 0;       //!< the virtual stage
  int rank = 0;        //!< the rank that ran it
  int peer = -1;       //!< `send` / `recv`: the other rank
  bool in_fb = false;  //!< a half of an overlapped `FB` action
  bool update = false;  //!< the optimizer update after the action (`action::update`), not its stage call
  double start = 0;    //!< seconds from the start of the rank's step (`pipeline::step` entry)
  double seconds = 0;  //!< its duration
  friend constexpr bool operator==(const measured_action&, const measured_action&) = default;
};

}  // namespace loom
