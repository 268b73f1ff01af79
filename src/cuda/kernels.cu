// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom's own device kernels (see include/loom/cuda/kernels.hpp), compiled by nvcc into the
// loom::cuda target when it runs on the real CUDA runtime.

#include "loom/cuda/error.hpp"
#include "loom/cuda/kernels.hpp"

namespace loom::cuda::detail {

namespace {

template <class T>
__global__ void add_kernel(T* __restrict__ acc, const T* __restrict__ x, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) acc[i] += x[i];
}

template <class T>
void launch_add(T* acc, const T* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr unsigned threads = 256;
  const std::size_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 4096 ? want : 4096);
  add_kernel<T><<<blocks, threads, 0, s>>>(acc, x, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}

}  // namespace

void add_async(float* acc, const float* x, std::size_t n, cudaStream_t s) { launch_add(acc, x, n, s); }
void add_async(double* acc, const double* x, std::size_t n, cudaStream_t s) { launch_add(acc, x, n, s); }

}  // namespace loom::cuda::detail
