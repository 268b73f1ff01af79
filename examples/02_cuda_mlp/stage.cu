// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// cuda_mlp::stage for a GPU: nvcc compiles the kernels of stage_impl.cuh.
#include "stage_impl.cuh"
