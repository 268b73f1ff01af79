// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the parallel-configuration planner (`loom::plan`): the model and cluster
//! descriptions and their closed forms (`loom/plan/formulas.hpp`), and the search that turns
//! them into per-stage cost models, simulates each schedule and ranks the configurations
//! (`loom/plan/search.hpp`). `loom plan` (tools/loom/plan.cpp) is its command line; docs/plan.md
//! compares it with published layouts.

#include "loom/plan/formulas.hpp"
#include "loom/plan/search.hpp"
