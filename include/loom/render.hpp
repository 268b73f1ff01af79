// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the rendering layer: ASCII grid, SVG timeline and Chrome/Perfetto trace
//! of a simulated schedule, and of a measured step beside its prediction. Host compiler only,
//! std only.

#include "loom/render/ascii.hpp"
#include "loom/render/common.hpp"
#include "loom/render/measured.hpp"
#include "loom/render/svg.hpp"
#include "loom/render/trace.hpp"
