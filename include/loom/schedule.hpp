// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the schedule algebra: actions, schedules, families, generate, validate,
//! lower, simulate, static schedules and the registry. Host compiler only.

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/format.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/registry.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/shape.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/static_schedule.hpp"
#include "loom/schedule/validate.hpp"
