// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the stage layer: the `stage` / `split_stage` / `updatable_stage` concepts,
//! the buffers and context a stage function receives, and the buffer plan computed from a
//! schedule. Host compiler only.

#include "loom/stage/buffer_plan.hpp"
#include "loom/stage/stage.hpp"
