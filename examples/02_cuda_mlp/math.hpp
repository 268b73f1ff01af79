// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The per-element math of the CUDA MLP, as `__host__ __device__` function objects: the GPU
//! kernels (`kernels.cuh`), the kernels the simulator runs on the host and the CPU reference
//! (`reference.hpp`) call the same code, so they perform the same floating-point operations.
//! Every multiply-add is an explicit `fmaf` (one rounding, identical on host and device) and the
//! GPU build is compiled with `--fmad=false`, so no other expression is contracted; the hidden
//! activation is softsign, x / (1 + |x|), whose value and derivative need only +, -, *, / and |.|
//! (correctly rounded everywhere, unlike tanhf/expf). Float element type.

#include <cstddef>

#include <cuda_runtime.h>  // __host__ / __device__ (empty for a host compiler)
#include <math.h>

namespace cuda_mlp {

//! Softsign: x / (1 + |x|).
__host__ __device__ inline float softsign(float x) { return x / (1.0f + fabsf(x)); }
//! Its derivative from its output y: (1 - |y|)^2.
__host__ __device__ inline float softsign_grad(float y) {
  const float a = 1.0f - fabsf(y);
  return a * a;
}

//! Forward of one layer, element e = (sample k, output o):
//! y[k,o] = act(b[o] + sum_i W[o,i] x[k,i]), the sum over i in index order.
struct layer_forward {
  const float* p;  // W (out x in, row-major) then b (out)
  const float* x;
  float* y;
  unsigned in, out;
  bool act;
  __host__ __device__ void operator()(std::size_t e) const {
    const std::size_t k = e / out, o = e % out;
    float z = p[static_cast<std::size_t>(out) * in + o];
    for (unsigned i = 0; i < in; ++i) z = fmaf(p[o * in + i], x[k * in + i], z);
    y[e] = act ? softsign(z) : z;
  }
};

//! The loss term of one output element: 0.5 (y - t)^2.
struct loss_term {
  __host__ __device__ float operator()(float y, float t) const {
    const float d = y - t;
    return 0.5f * (d * d);
  }
};

//! Gradient of the scaled loss with respect to the last layer's output: og * (y - t).
struct loss_grad {
  const float* og;
  const float* y;
  const float* t;
  float* g;
  __host__ __device__ void operator()(std::size_t e) const { g[e] = og[e] * (y[e] - t[e]); }
};

//! dz = g * act'(y) in place (hidden layers).
struct activation_backward {
  const float* y;
  float* g;
  __host__ __device__ void operator()(std::size_t e) const { g[e] = g[e] * softsign_grad(y[e]); }
};

//! Input gradient of one layer, element e = (sample k, input i): gx[k,i] = sum_o W[o,i] dz[k,o],
//! the sum over o in index order.
struct input_grad {
  const float* p;
  const float* dz;
  float* gx;
  unsigned in, out;
  __host__ __device__ void operator()(std::size_t e) const {
    const std::size_t k = e / in, i = e % in;
    float s = 0.0f;
    for (unsigned o = 0; o < out; ++o) s = fmaf(p[o * in + i], dz[k * out + o], s);
    gx[e] = s;
  }
};

//! Adds one microbatch's weight gradient of one layer, element e of (W, b): gW[o,i] += sum_k
//! dz[k,o] x[k,i] and gb[o] += sum_k dz[k,o], over the samples k in order.
struct weight_grad_add {
  const float* x;
  const float* dz;
  float* g;
  unsigned in, out, samples;
  __host__ __device__ void operator()(std::size_t e) const {
    const std::size_t wn = static_cast<std::size_t>(out) * in;
    float v = g[e];
    if (e < wn) {
      const std::size_t o = e / in, i = e % in;
      for (unsigned k = 0; k < samples; ++k) v = fmaf(dz[k * out + o], x[k * in + i], v);
    } else {
      const std::size_t o = e - wn;
      for (unsigned k = 0; k < samples; ++k) v = v + dz[k * out + o];
    }
    g[e] = v;
  }
};

//! Writes 0 at `p` (the race detector's tests: a kernel that writes where it should not).
struct poke {
  float* p;
  __host__ __device__ void operator()(std::size_t) const { *p = 0.0f; }
};

//! SGD: p -= lr g (one fused multiply-add).
struct sgd {
  float* p;
  const float* g;
  float lr;
  __host__ __device__ void operator()(std::size_t e) const { p[e] = fmaf(-lr, g[e], p[e]); }
};

}  // namespace cuda_mlp
