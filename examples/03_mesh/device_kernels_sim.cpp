// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mesh example's device kernels against loom's CUDA simulator: the host compiler compiles the
// launches of device_kernels.cuh, which the simulator runs on the host in stream order.
#include "device_kernels.cuh"
