// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::step_observer`: the events of a `loom::pipeline` step that work beside the pipeline
//! needs, chiefly data-parallel gradient synchronisation (`loom/exec/data_parallel.hpp`), which
//! launches a bucket's all-reduce as soon as the gradients in it are final, so that it overlaps
//! the rest of the step (eager synchronisation).
//!
//! The pipeline calls an observer (set in `pipeline_options::observer`) on the rank's own thread:
//! - `before_first_use(local)` before the first action of local stage `local` in the step (the
//!   index into `pipeline::stages()`);
//! - `gradients_ready(local)` once that stage's weight gradient is final for the step: right after
//!   its last weight-gradient action (`W` or `BW`) ran and was folded into the accumulator. On
//!   two-direction schedules (two parameter copies) the gradient is final only after the copies
//!   were summed, after the agreement; it is called then, for every local stage, and only when
//!   the step succeeded;
//! - `progress()` after every action, to progress communication in flight (MPI progresses
//!   non-blocking collectives only inside MPI calls);
//! - `step_end(failed_rank, cause)` once per step after the pipeline's agreement (and the copy
//!   exchange), before any `update()`: `failed_rank` is -1 when every rank of the pipeline agreed
//!   the step succeeded, else the pipeline rank whose failure ended it and its cause. It may throw
//!   `loom::pipeline_error` (then the pipeline throws it and updates nothing) and must leave its
//!   own communication complete either way.
//!
//! Exceptions from the first three are failures of the step like a communication failure.

#include <cstddef>
#include <string>

namespace loom {

//! Receives the events of a pipeline step (see the file comment).
class step_observer {
 public:
  //! Before the first action of local stage `local` in the step.
  virtual void before_first_use(std::size_t local) = 0;
  //! Local stage `local`'s weight gradient is final for the step.
  virtual void gradients_ready(std::size_t local) = 0;
  //! After every action of the program.
  virtual void progress() = 0;
  //! After the agreement, before the updates; `failed_rank` -1 on success.
  virtual void step_end(int failed_rank, const std::string& cause) = 0;

 protected:
  step_observer() = default;
  step_observer(const step_observer&) = default;
  step_observer& operator=(const step_observer&) = default;
  ~step_observer() = default;
};

}  // namespace loom
