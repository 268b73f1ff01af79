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
__global__ void combine_kernel(reduce_op op, T* __restrict__ acc, const T* __restrict__ x, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T a = acc[i], b = x[i];
    acc[i] = op == reduce_op::sum ? a + b : op == reduce_op::max ? (a < b ? b : a) : (b < a ? b : a);
  }
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, T a, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= a;
}

__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <class T>
__global__ void sub_scaled_kernel(T* __restrict__ y, T a, const T* __restrict__ x, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = y[i] - mul_rn(a, x[i]);  // the product rounded on its own: no fused multiply-add
}

constexpr unsigned threads_per_block = 256;
inline unsigned blocks_for(std::size_t n) {
  const std::size_t want = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(want < 4096 ? want : 4096);
}

template <class T>
void launch_add(T* acc, const T* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<T><<<blocks_for(n), threads_per_block, 0, s>>>(acc, x, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}

template <class T>
void launch_combine(reduce_op op, T* acc, const T* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  combine_kernel<T><<<blocks_for(n), threads_per_block, 0, s>>>(op, acc, x, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}

}  // namespace

void add_async(float* acc, const float* x, std::size_t n, cudaStream_t s) { launch_add(acc, x, n, s); }
void add_async(double* acc, const double* x, std::size_t n, cudaStream_t s) { launch_add(acc, x, n, s); }
void scale_async(float* x, float a, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<float><<<blocks_for(n), threads_per_block, 0, s>>>(x, a, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
void scale_async(double* x, double a, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<double><<<blocks_for(n), threads_per_block, 0, s>>>(x, a, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
void sub_scaled_async(float* y, float a, const float* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  sub_scaled_kernel<float><<<blocks_for(n), threads_per_block, 0, s>>>(y, a, x, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
void sub_scaled_async(double* y, double a, const double* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  sub_scaled_kernel<double><<<blocks_for(n), threads_per_block, 0, s>>>(y, a, x, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
void combine_async(reduce_op op, float* acc, const float* x, std::size_t n, cudaStream_t s) { launch_combine(op, acc, x, n, s); }
void combine_async(reduce_op op, double* acc, const double* x, std::size_t n, cudaStream_t s) { launch_combine(op, acc, x, n, s); }

}  // namespace loom::cuda::detail
