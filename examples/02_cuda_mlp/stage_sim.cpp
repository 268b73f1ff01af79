// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// cuda_mlp::stage against loom's CUDA simulator: the host compiler compiles stage_impl.cuh, whose
// kernels the simulator runs on the host in stream order.
#include "stage_impl.cuh"
