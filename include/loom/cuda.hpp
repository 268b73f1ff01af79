// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella of loom's CUDA utilities (host compiler is enough): errors, streams and events,
//! graphs, buffers, devices, NVTX and simulator annotations. Link `loom::cuda`.

#include "loom/cuda/annotate.hpp"
#include "loom/cuda/buffer.hpp"
#include "loom/cuda/device.hpp"
#include "loom/cuda/error.hpp"
#include "loom/cuda/graph.hpp"
#include "loom/cuda/kernels.hpp"
#include "loom/cuda/stream.hpp"
