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

__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ inline float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ inline float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ inline double sqrt_rn(double a) { return __dsqrt_rn(a); }

// The operations of loom::detail::adam_element (loom/exec/optimizer_math.hpp), each rounded on its own.
template <class T>
__global__ void adam_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v, T b1, T b2, T lr_t,
                            T eps_t, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T gi = g[i];
    const T mi = add_rn(mul_rn(b1, m[i]), mul_rn(sub_rn(T(1), b1), gi));
    const T vi = add_rn(mul_rn(b2, v[i]), mul_rn(sub_rn(T(1), b2), mul_rn(gi, gi)));
    m[i] = mi;
    v[i] = vi;
    p[i] = sub_rn(p[i], div_rn(mul_rn(lr_t, mi), add_rn(sqrt_rn(vi), eps_t)));
  }
}


// The sequence-parallel patterns' kernels: one thread per item of loom/exec/pattern_math.hpp.
template <class T>
__global__ void fill_kernel(T* __restrict__ x, T value, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = value;
}
template <class F>
__global__ void items_kernel(F f, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}
template <class T>
struct forward_item {
  attention_block<T> b;
  __device__ void operator()(std::size_t e) const { b.forward(e); }
};
template <class T>
struct query_item {
  attention_block<T> b;
  __device__ void operator()(std::size_t e) const { b.backward_query(e); }
};
template <class T>
struct linear_forward_item {
  linear_items<T> f;
  __device__ void operator()(std::size_t e) const { f.forward(e); }
};
template <class T>
struct linear_forward_add_item {
  linear_items<T> f;
  __device__ void operator()(std::size_t e) const { f.forward_add(e); }
};
template <class T>
struct linear_set_bias_item {
  linear_items<T> f;
  __device__ void operator()(std::size_t e) const { f.set_bias(e); }
};
template <class T>
struct linear_input_item {
  linear_items<T> f;
  __device__ void operator()(std::size_t e) const { f.backward_input(e); }
};
template <class T>
struct linear_weight_item {
  linear_items<T> f;
  __device__ void operator()(std::size_t e) const { f.backward_weight(e); }
};
template <class T>
struct bias_item {
  linear_items<T> f;
  __device__ void operator()(std::size_t e) const { f.add_bias(e); }
};
template <class T>
struct key_item {
  attention_block<T> b;
  __device__ void operator()(std::size_t e) const { b.backward_key(e); }
};

template <class T>
struct norm_item {
  norm_items<T> m;
  norm_step step;
  __device__ void operator()(std::size_t i) const { m(step, i); }
};

template <class T>
struct vocab_item {
  vocab_items<T, std::int64_t> m;
  vocab_step step;
  __device__ void operator()(std::size_t i) const { m(step, i); }
};

template <class T>
struct moe_item {
  moe_items<T> m;
  moe_step step;
  __device__ void operator()(std::size_t e) const { m(step, e); }
};

constexpr unsigned threads_per_block = 256;
inline unsigned blocks_for(std::size_t n) {
  const std::size_t want = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(want < 4096 ? want : 4096);
}

template <class F>
void launch_items(F f, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  items_kernel<F><<<blocks_for(n), threads_per_block, 0, s>>>(f, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
template <class T>
void launch_fill(T* x, T value, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<T><<<blocks_for(n), threads_per_block, 0, s>>>(x, value, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
template <class T>
void launch_backward(const attention_block<T>& b, cudaStream_t s) {
  if (b.dq != nullptr) launch_items(query_item<T>{b}, b.query_items(), s);
  if (b.dk != nullptr || b.dv != nullptr) launch_items(key_item<T>{b}, b.key_items(), s);
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
void adam_async(float* p, const float* g, float* m, float* v, float b1, float b2, float lr_t, float eps_t, std::size_t n,
                cudaStream_t s) {
  if (n == 0) return;
  adam_kernel<float><<<blocks_for(n), threads_per_block, 0, s>>>(p, g, m, v, b1, b2, lr_t, eps_t, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
void adam_async(double* p, const double* g, double* m, double* v, double b1, double b2, double lr_t, double eps_t, std::size_t n,
                cudaStream_t s) {
  if (n == 0) return;
  adam_kernel<double><<<blocks_for(n), threads_per_block, 0, s>>>(p, g, m, v, b1, b2, lr_t, eps_t, n);
  LOOM_CUDA_TRY(cudaGetLastError());
}
void combine_async(reduce_op op, float* acc, const float* x, std::size_t n, cudaStream_t s) { launch_combine(op, acc, x, n, s); }
void combine_async(reduce_op op, double* acc, const double* x, std::size_t n, cudaStream_t s) { launch_combine(op, acc, x, n, s); }

void fill_async(float* x, float value, std::size_t n, cudaStream_t s) { launch_fill(x, value, n, s); }
void fill_async(double* x, double value, std::size_t n, cudaStream_t s) { launch_fill(x, value, n, s); }
void attention_forward_async(const attention_block<float>& b, cudaStream_t s) { launch_items(forward_item<float>{b}, b.query_items(), s); }
void attention_forward_async(const attention_block<double>& b, cudaStream_t s) { launch_items(forward_item<double>{b}, b.query_items(), s); }
void attention_backward_async(const attention_block<float>& b, cudaStream_t s) { launch_backward(b, s); }
void attention_backward_async(const attention_block<double>& b, cudaStream_t s) { launch_backward(b, s); }
void attention_delta_async(const attention_delta_rows<float>& f, std::size_t rows, cudaStream_t s) { launch_items(f, rows, s); }
void attention_delta_async(const attention_delta_rows<double>& f, std::size_t rows, cudaStream_t s) { launch_items(f, rows, s); }
void attention_merge_async(const attention_merge_rows<float>& f, std::size_t rows, cudaStream_t s) { launch_items(f, rows, s); }
void attention_merge_async(const attention_merge_rows<double>& f, std::size_t rows, cudaStream_t s) { launch_items(f, rows, s); }
void dsp_move_async(const dsp_move<float>& f, std::size_t ranks, cudaStream_t s) { launch_items(f, f.size(ranks), s); }
void dsp_move_async(const dsp_move<double>& f, std::size_t ranks, cudaStream_t s) { launch_items(f, f.size(ranks), s); }
void ulysses_move_async(const ulysses_move<float>& f, cudaStream_t s) { launch_items(f, f.l.size(), s); }
void ulysses_move_async(const ulysses_move<double>& f, cudaStream_t s) { launch_items(f, f.l.size(), s); }

void linear_forward_async(const linear_items<float>& f, cudaStream_t s) { launch_items(linear_forward_item<float>{f}, f.n * f.out, s); }
void linear_forward_add_async(const linear_items<float>& f, cudaStream_t s) { launch_items(linear_forward_add_item<float>{f}, f.n * f.out, s); }
void linear_set_bias_async(const linear_items<float>& f, cudaStream_t s) { launch_items(linear_set_bias_item<float>{f}, f.n * f.out, s); }
void linear_backward_input_async(const linear_items<float>& f, cudaStream_t s) { launch_items(linear_input_item<float>{f}, f.n * f.in, s); }
void linear_backward_weight_async(const linear_items<float>& f, cudaStream_t s) { launch_items(linear_weight_item<float>{f}, f.weight_items(), s); }
void linear_add_bias_async(const linear_items<float>& f, cudaStream_t s) { launch_items(bias_item<float>{f}, f.n * f.out, s); }
void linear_forward_async(const linear_items<double>& f, cudaStream_t s) { launch_items(linear_forward_item<double>{f}, f.n * f.out, s); }
void linear_forward_add_async(const linear_items<double>& f, cudaStream_t s) { launch_items(linear_forward_add_item<double>{f}, f.n * f.out, s); }
void linear_set_bias_async(const linear_items<double>& f, cudaStream_t s) { launch_items(linear_set_bias_item<double>{f}, f.n * f.out, s); }
void linear_backward_input_async(const linear_items<double>& f, cudaStream_t s) { launch_items(linear_input_item<double>{f}, f.n * f.in, s); }
void linear_backward_weight_async(const linear_items<double>& f, cudaStream_t s) { launch_items(linear_weight_item<double>{f}, f.weight_items(), s); }
void linear_add_bias_async(const linear_items<double>& f, cudaStream_t s) { launch_items(bias_item<double>{f}, f.n * f.out, s); }

void moe_async(const moe_items<float>& m, moe_step step, cudaStream_t s) { launch_items(moe_item<float>{m, step}, m.count(step), s); }
void moe_async(const moe_items<double>& m, moe_step step, cudaStream_t s) { launch_items(moe_item<double>{m, step}, m.count(step), s); }
void norm_async(const norm_items<float>& m, norm_step step, cudaStream_t s) { launch_items(norm_item<float>{m, step}, m.count(step), s); }
void norm_async(const norm_items<double>& m, norm_step step, cudaStream_t s) { launch_items(norm_item<double>{m, step}, m.count(step), s); }
void vocab_async(const vocab_items<float, std::int64_t>& m, vocab_step step, cudaStream_t s) {
  launch_items(vocab_item<float>{m, step}, m.count(step), s);
}
void vocab_async(const vocab_items<double, std::int64_t>& m, vocab_step step, cudaStream_t s) {
  launch_items(vocab_item<double>{m, step}, m.count(step), s);
}
void block_transpose_async(const block_transpose<float>& b, cudaStream_t s) { launch_items(b, b.size(), s); }
void block_transpose_async(const block_transpose<double>& b, cudaStream_t s) { launch_items(b, b.size(), s); }

}  // namespace loom::cuda::detail
