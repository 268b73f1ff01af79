// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of everything loom offers to a host-compiled program.

#include "loom/comm.hpp"
#include "loom/exec.hpp"
#include "loom/mesh.hpp"
#include "loom/render.hpp"
#include "loom/schedule.hpp"
#include "loom/stage.hpp"
