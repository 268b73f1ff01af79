// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the execution layer: `loom::pipeline`, which runs one training step of a
//! rank's lowered program over the user's stages and any `loom::communicator`; the data-parallel
//! gradient synchronisation that observes it; the tensor-parallel (Megatron's 1D split and the
//! 2D, 2.5D and 3D grids), sequence-parallel, expert-parallel (MoE) and vocabulary-parallel
//! building blocks; calibration of a cost model from measured steps.
//! Host compiler only; pair it with a backend ("loom/comm.hpp" for threads, "loom/comm/mpi.hpp"
//! for MPI).

#include "loom/exec/action_timing.hpp"
#include "loom/exec/calibrate.hpp"
#include "loom/exec/data_parallel.hpp"
#include "loom/exec/memory.hpp"
#include "loom/exec/moe.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/exec/sequence_parallel.hpp"
#include "loom/exec/step_observer.hpp"
#include "loom/exec/tensor_grid.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/exec/timeline.hpp"
#include "loom/exec/vocab_parallel.hpp"
