// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! loom's own device kernels, enqueued by the executor: `acc[i] += x[i]` (the deterministic fold
//! of weight gradients and the sum of two parameter copies).
//!
//! loom's headers compile with a host compiler, so they contain no `<<<>>>`. On a GPU these
//! functions are defined in one small CUDA translation unit that the `loom::cuda` target
//! compiles with nvcc (`src/cuda/kernels.cu`); built against loom's simulator they are host
//! loops enqueued as simulated kernels. Element types: float and double.

#include <cstddef>

#include <cuda_runtime_api.h>

#if defined(LOOM_CUDA_SIM)
#include "loom/cudasim/sim.hpp"
#endif

namespace loom::cuda::detail {

#if defined(LOOM_CUDA_SIM)
//! `acc[i] += x[i]` for `i < n`, enqueued on `s`.
template <class T>
void add_async(T* acc, const T* x, std::size_t n, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda add", [=] {
    for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
  });
}
#else
//! `acc[i] += x[i]` for `i < n`, enqueued on `s`.
void add_async(float* acc, const float* x, std::size_t n, cudaStream_t s);
//! `acc[i] += x[i]` for `i < n`, enqueued on `s`.
void add_async(double* acc, const double* x, std::size_t n, cudaStream_t s);
#endif

}  // namespace loom::cuda::detail
