// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mesh example's device kernels for a GPU: nvcc compiles the launches of device_kernels.cuh.
#include "device_kernels.cuh"
