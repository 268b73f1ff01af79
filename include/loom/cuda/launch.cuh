// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Launching element-wise work from a stage: `loom::cuda::for_each(stream, n, f)` calls
//! `f(i)` for `i < n`, in stream order. `f` is a `__host__ __device__` function object (or an
//! extended lambda). Compiled by nvcc it is a grid-stride kernel launched with `<<<>>>` on
//! `stream`; built against loom's CUDA simulator it is a host loop that the simulator runs in
//! stream order, so the same stage code runs on a GPU and on a machine without one. A `.cuh`:
//! with the real CUDA runtime it needs nvcc (a host compiler gets a clear `#error`).

#include <cstddef>

#include "loom/cuda/error.hpp"

#if !defined(__CUDACC__) && !defined(LOOM_CUDA_SIM)
#error "loom/cuda/launch.cuh launches device code: compile this file with nvcc, or build against loom's CUDA simulator (-DLOOM_CUDA_RUNTIME=sim)"
#endif

#if !defined(__CUDACC__)
#include <cuda_runtime.h>  // __host__ and __device__ expand to nothing for a host compiler
#endif

namespace loom::cuda {

#if defined(__CUDACC__)
namespace detail {
//! Grid-stride loop over `[0, n)`.
template <class F>
__global__ void for_each_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}
}  // namespace detail

//! Calls `f(i)` for `i < n` on `stream` (see the file comment); `label` names it in the simulator.
template <class F>
void for_each(cudaStream_t stream, std::size_t n, F f, const char* label = "loom::cuda::for_each") {
  (void)label;
  if (n == 0) return;
  constexpr unsigned threads = 256;
  const std::size_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 8192 ? want : 8192);
  detail::for_each_kernel<<<blocks, threads, 0, stream>>>(n, f);
  LOOM_CUDA_TRY(cudaGetLastError());
}
#else
//! Calls `f(i)` for `i < n` on `stream` (see the file comment); `label` names it in the simulator.
template <class F>
void for_each(cudaStream_t stream, std::size_t n, F f, const char* label = "loom::cuda::for_each") {
  if (n == 0) return;
  cudasim::launch(stream, label, [n, f]() mutable {
    for (std::size_t i = 0; i < n; ++i) f(i);
  });
}
#endif

}  // namespace loom::cuda
