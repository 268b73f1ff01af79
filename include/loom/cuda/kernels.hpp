// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! loom's own device kernels, enqueued by the executor: `acc[i] += x[i]` (the deterministic fold
//! of weight gradients and the sum of two parameter copies) and `acc[i] = op(acc[i], x[i])` (the
//! rank-ordered reductions of `cuda_local`'s collectives), `x[i] *= a` and `y[i] -= a * x[i]` (the
//! data-parallel gradient scale and SGD step; the product is rounded before the subtraction, as
//! on the host, never contracted into a fused multiply-add).
//!
//! loom's headers compile with a host compiler, so they contain no `<<<>>>`. On a GPU these
//! functions are defined in one small CUDA translation unit that the `loom::cuda` target
//! compiles with nvcc (`src/cuda/kernels.cu`); built against loom's simulator they are host
//! loops enqueued as simulated kernels. Element types: float and double.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "loom/comm/communicator.hpp"
#include "loom/exec/moe_math.hpp"
#include "loom/exec/pattern_math.hpp"
#include "loom/exec/optimizer_math.hpp"
#include "loom/exec/vocab_math.hpp"

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
//! `acc[i] = op(acc[i], x[i])` for `i < n` (`acc` holds the lower ranks' result), enqueued on `s`.
template <class T>
void combine_async(reduce_op op, T* acc, const T* x, std::size_t n, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda combine", [=] {
    for (std::size_t i = 0; i < n; ++i) acc[i] = loom::detail::reduce_apply(op, acc[i], x[i]);
  });
}
//! `x[i] *= a` for `i < n`, enqueued on `s`.
template <class T>
void scale_async(T* x, T a, std::size_t n, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda scale", [=] {
    for (std::size_t i = 0; i < n; ++i) x[i] *= a;
  });
}
//! `y[i] -= a * x[i]` for `i < n` (the product rounded first), enqueued on `s`.
template <class T>
void sub_scaled_async(T* y, T a, const T* x, std::size_t n, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda sub_scaled", [=] {
    for (std::size_t i = 0; i < n; ++i) {
      volatile T d = a * x[i];  // rounded, as the GPU kernel's __fmul_rn
      y[i] -= d;
    }
  });
}
//! One Adam step on `n` elements, enqueued on `s` (see `loom::adam`): `m = b1 m + (1 - b1) g`,
//! `v = b2 v + (1 - b2) g g`, `p -= (lr_t m) / (sqrt(v) + eps_t)`, every operation rounded on its
//! own (no fused multiply-add), as `loom::adam`'s host loop.
template <class T>
void adam_async(T* p, const T* g, T* m, T* v, T b1, T b2, T lr_t, T eps_t, std::size_t n, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda adam", [=] {
    for (std::size_t i = 0; i < n; ++i) loom::detail::adam_element(p[i], g[i], m[i], v[i], b1, b2, lr_t, eps_t);
  });
}
//! `x[i] = value` for `i < n`, enqueued on `s`.
template <class T>
void fill_async(T* x, T value, std::size_t n, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda fill", [=] {
    for (std::size_t i = 0; i < n; ++i) x[i] = value;
  });
}
//! One attention block's forward (`attention_block::forward` per query row and head), on `s`.
template <class T>
void attention_forward_async(const attention_block<T>& b, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda attention forward", [b] {
    for (std::size_t e = 0; e < b.query_items(); ++e) b.forward(e);
  });
}
//! One attention block's backward on `s`: the query gradients (one item per query row and head),
//! then the key and value gradients (one per key row and head), as two kernels.
template <class T>
void attention_backward_async(const attention_block<T>& b, cudaStream_t s) {
  if (b.dq != nullptr)
    cudasim::launch(s, "loom::cuda attention backward (queries)", [b] {
      for (std::size_t e = 0; e < b.query_items(); ++e) b.backward_query(e);
    });
  if (b.dk != nullptr || b.dv != nullptr)
    cudasim::launch(s, "loom::cuda attention backward (keys)", [b] {
      for (std::size_t e = 0; e < b.key_items(); ++e) b.backward_key(e);
    });
}
//! The attention backward's row term for `rows` rows and heads, on `s`.
template <class T>
void attention_delta_async(const attention_delta_rows<T>& f, std::size_t rows, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda attention delta", [f, rows] {
    for (std::size_t r = 0; r < rows; ++r) f(r);
  });
}
//! TokenRing's merge of a partial output into the running one (`attention_merge_rows` per row
//! and head), on `s`.
template <class T>
void attention_merge_async(const attention_merge_rows<T>& f, std::size_t rows, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda attention merge", [f, rows] {
    for (std::size_t r = 0; r < rows; ++r) f(r);
  });
}
//! DSP's layout change (`dsp_move` per buffer element of `ranks` blocks), on `s`.
template <class T>
void dsp_move_async(const dsp_move<T>& f, std::size_t ranks, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda dsp layout", [f, ranks] {
    for (std::size_t w = 0; w < f.size(ranks); ++w) f(w);
  });
}
//! Ulysses' layout change (`ulysses_move` per buffer element), on `s`.
template <class T>
void ulysses_move_async(const ulysses_move<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda ulysses layout", [f] {
    for (std::size_t w = 0; w < f.l.size(); ++w) f(w);
  });
}
//! The linear layer's forward (`linear_items::forward` per output element), on `s`.
template <class T>
void linear_forward_async(const linear_items<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda linear forward", [f] {
    for (std::size_t e = 0; e < f.n * f.out; ++e) f.forward(e);
  });
}
//! The linear layer's forward continuing `y` (`linear_items::forward_add` per element), on `s`.
template <class T>
void linear_forward_add_async(const linear_items<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda linear forward (add)", [f] {
    for (std::size_t e = 0; e < f.n * f.out; ++e) f.forward_add(e);
  });
}
//! `y[t][o] = b[o]` or 0 (`linear_items::set_bias` per element), on `s`.
template <class T>
void linear_set_bias_async(const linear_items<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda linear set bias", [f] {
    for (std::size_t e = 0; e < f.n * f.out; ++e) f.set_bias(e);
  });
}
//! The linear layer's input gradient (`linear_items::backward_input` per element), on `s`.
template <class T>
void linear_backward_input_async(const linear_items<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda linear backward (input)", [f] {
    for (std::size_t e = 0; e < f.n * f.in; ++e) f.backward_input(e);
  });
}
//! The linear layer's weight and bias gradients (`linear_items::backward_weight`), on `s`.
template <class T>
void linear_backward_weight_async(const linear_items<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda linear backward (weight)", [f] {
    for (std::size_t e = 0; e < f.weight_items(); ++e) f.backward_weight(e);
  });
}
//! `y[t][o] += b[o]` (`linear_items::add_bias`), on `s`.
template <class T>
void linear_add_bias_async(const linear_items<T>& f, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda bias", [f] {
    for (std::size_t e = 0; e < f.n * f.out; ++e) f.add_bias(e);
  });
}
//! One step of an MoE layer (`moe_items` per item of `step`), on `s`.
template <class T>
void moe_async(const moe_items<T>& m, moe_step step, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda moe", [m, step] {
    const std::size_t n = m.count(step);
    for (std::size_t e = 0; e < n; ++e) m(step, e);
  });
}
//! One step of a layer norm on a member's feature block (`norm_items` per item of `step`), on `s`.
template <class T>
void norm_async(const norm_items<T>& m, norm_step step, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda layer norm", [m, step] {
    const std::size_t n = m.count(step);
    for (std::size_t i = 0; i < n; ++i) m(step, i);
  });
}
//! One step of the vocabulary-parallel layers (`vocab_items` per item of `step`), on `s`.
template <class T, class I>
void vocab_async(const vocab_items<T, I>& m, vocab_step step, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda vocabulary layers", [m, step] {
    const std::size_t n = m.count(step);
    for (std::size_t i = 0; i < n; ++i) m(step, i);
  });
}
//! A block transpose (`block_transpose` per element), on `s`.
template <class T>
void block_transpose_async(const block_transpose<T>& b, cudaStream_t s) {
  cudasim::launch(s, "loom::cuda block transpose", [b] {
    const std::size_t n = b.size();
    for (std::size_t w = 0; w < n; ++w) b(w);
  });
}
#else
//! `acc[i] += x[i]` for `i < n`, enqueued on `s`.
void add_async(float* acc, const float* x, std::size_t n, cudaStream_t s);
//! `acc[i] += x[i]` for `i < n`, enqueued on `s`.
void add_async(double* acc, const double* x, std::size_t n, cudaStream_t s);
//! `acc[i] = op(acc[i], x[i])` for `i < n` (`acc` holds the lower ranks' result), enqueued on `s`.
void combine_async(reduce_op op, float* acc, const float* x, std::size_t n, cudaStream_t s);
//! `acc[i] = op(acc[i], x[i])` for `i < n` (`acc` holds the lower ranks' result), enqueued on `s`.
void combine_async(reduce_op op, double* acc, const double* x, std::size_t n, cudaStream_t s);
//! `x[i] *= a` for `i < n`, enqueued on `s`.
void scale_async(float* x, float a, std::size_t n, cudaStream_t s);
//! `x[i] *= a` for `i < n`, enqueued on `s`.
void scale_async(double* x, double a, std::size_t n, cudaStream_t s);
//! `y[i] -= a * x[i]` for `i < n` (the product rounded first), enqueued on `s`.
void sub_scaled_async(float* y, float a, const float* x, std::size_t n, cudaStream_t s);
//! `y[i] -= a * x[i]` for `i < n` (the product rounded first), enqueued on `s`.
void sub_scaled_async(double* y, double a, const double* x, std::size_t n, cudaStream_t s);
//! One Adam step on `n` elements, enqueued on `s` (see `loom::adam`).
void adam_async(float* p, const float* g, float* m, float* v, float b1, float b2, float lr_t, float eps_t, std::size_t n,
                cudaStream_t s);
//! One Adam step on `n` elements, enqueued on `s` (see `loom::adam`).
void adam_async(double* p, const double* g, double* m, double* v, double b1, double b2, double lr_t, double eps_t, std::size_t n,
                cudaStream_t s);
//! `x[i] = value` for `i < n`, enqueued on `s`.
void fill_async(float* x, float value, std::size_t n, cudaStream_t s);
//! `x[i] = value` for `i < n`, enqueued on `s`.
void fill_async(double* x, double value, std::size_t n, cudaStream_t s);
//! One attention block's forward (`attention_block::forward` per query row and head), on `s`.
void attention_forward_async(const attention_block<float>& b, cudaStream_t s);
//! One attention block's forward (`attention_block::forward` per query row and head), on `s`.
void attention_forward_async(const attention_block<double>& b, cudaStream_t s);
//! One attention block's backward on `s` (the query gradients, then the key and value gradients).
void attention_backward_async(const attention_block<float>& b, cudaStream_t s);
//! One attention block's backward on `s` (the query gradients, then the key and value gradients).
void attention_backward_async(const attention_block<double>& b, cudaStream_t s);
//! The attention backward's row term for `rows` rows and heads, on `s`.
void attention_delta_async(const attention_delta_rows<float>& f, std::size_t rows, cudaStream_t s);
//! The attention backward's row term for `rows` rows and heads, on `s`.
void attention_delta_async(const attention_delta_rows<double>& f, std::size_t rows, cudaStream_t s);
//! TokenRing's merge of a partial output (`attention_merge_rows` per row and head), on `s`.
void attention_merge_async(const attention_merge_rows<float>& f, std::size_t rows, cudaStream_t s);
//! TokenRing's merge of a partial output (`attention_merge_rows` per row and head), on `s`.
void attention_merge_async(const attention_merge_rows<double>& f, std::size_t rows, cudaStream_t s);
//! DSP's layout change (`dsp_move` per buffer element of `ranks` blocks), on `s`.
void dsp_move_async(const dsp_move<float>& f, std::size_t ranks, cudaStream_t s);
//! DSP's layout change (`dsp_move` per buffer element of `ranks` blocks), on `s`.
void dsp_move_async(const dsp_move<double>& f, std::size_t ranks, cudaStream_t s);
//! Ulysses' layout change (`ulysses_move` per buffer element), on `s`.
void ulysses_move_async(const ulysses_move<float>& f, cudaStream_t s);
//! Ulysses' layout change (`ulysses_move` per buffer element), on `s`.
void ulysses_move_async(const ulysses_move<double>& f, cudaStream_t s);
//! The linear layer's forward (`linear_items::forward` per output element), on `s`.
void linear_forward_async(const linear_items<float>& f, cudaStream_t s);
//! The linear layer's forward (`linear_items::forward` per output element), on `s`.
void linear_forward_async(const linear_items<double>& f, cudaStream_t s);
//! The linear layer's forward continuing `y` (`linear_items::forward_add` per element), on `s`.
void linear_forward_add_async(const linear_items<float>& f, cudaStream_t s);
//! The linear layer's forward continuing `y` (`linear_items::forward_add` per element), on `s`.
void linear_forward_add_async(const linear_items<double>& f, cudaStream_t s);
//! `y[t][o] = b[o]` or 0 (`linear_items::set_bias` per element), on `s`.
void linear_set_bias_async(const linear_items<float>& f, cudaStream_t s);
//! `y[t][o] = b[o]` or 0 (`linear_items::set_bias` per element), on `s`.
void linear_set_bias_async(const linear_items<double>& f, cudaStream_t s);
//! The linear layer's input gradient (`linear_items::backward_input` per element), on `s`.
void linear_backward_input_async(const linear_items<float>& f, cudaStream_t s);
//! The linear layer's input gradient (`linear_items::backward_input` per element), on `s`.
void linear_backward_input_async(const linear_items<double>& f, cudaStream_t s);
//! The linear layer's weight and bias gradients (`linear_items::backward_weight`), on `s`.
void linear_backward_weight_async(const linear_items<float>& f, cudaStream_t s);
//! The linear layer's weight and bias gradients (`linear_items::backward_weight`), on `s`.
void linear_backward_weight_async(const linear_items<double>& f, cudaStream_t s);
//! `y[t][o] += b[o]` (`linear_items::add_bias`), on `s`.
void linear_add_bias_async(const linear_items<float>& f, cudaStream_t s);
//! `y[t][o] += b[o]` (`linear_items::add_bias`), on `s`.
void linear_add_bias_async(const linear_items<double>& f, cudaStream_t s);
//! One step of an MoE layer (`moe_items` per item of `step`), on `s`.
void moe_async(const moe_items<float>& m, moe_step step, cudaStream_t s);
//! One step of an MoE layer (`moe_items` per item of `step`), on `s`.
void moe_async(const moe_items<double>& m, moe_step step, cudaStream_t s);
//! One step of a layer norm on a member's feature block (`norm_items` per item of `step`), on `s`.
void norm_async(const norm_items<float>& m, norm_step step, cudaStream_t s);
//! One step of a layer norm on a member's feature block (`norm_items` per item of `step`), on `s`.
void norm_async(const norm_items<double>& m, norm_step step, cudaStream_t s);
//! One step of the vocabulary-parallel layers (`vocab_items` per item of `step`), on `s`.
void vocab_async(const vocab_items<float, std::int64_t>& m, vocab_step step, cudaStream_t s);
//! One step of the vocabulary-parallel layers (`vocab_items` per item of `step`), on `s`.
void vocab_async(const vocab_items<double, std::int64_t>& m, vocab_step step, cudaStream_t s);
//! A block transpose (`block_transpose` per element), on `s`.
void block_transpose_async(const block_transpose<float>& b, cudaStream_t s);
//! A block transpose (`block_transpose` per element), on `s`.
void block_transpose_async(const block_transpose<double>& b, cudaStream_t s);
#endif

}  // namespace loom::cuda::detail
