// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The mesh example's kernels: each a function object over one item (a token row, a feature
//! column or an element) whose call is `__host__ __device__` under nvcc, with a fixed order of
//! additions. The host stage and the reference run them over their items in a loop
//! (`kernels::host_loop`); the device stage launches the same objects on its stream
//! (`device.hpp`: one thread per item on a GPU, a host loop in stream order under loom's CUDA
//! simulator). This header needs only `loom/exec/pattern_math.hpp`, so nvcc compiles it alone.

#include <cstddef>

#include <loom/exec/pattern_math.hpp>

namespace mesh_example {
namespace kernels {

inline constexpr double ln_eps = 1e-5;

namespace math = loom::device_math;  // exp, log, sqrt, tanh on host and device

//! Runs `f` over items `[0, n)` on the host.
template <class F>
void each(std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

//! The host stage's executor: `each(n, f, label)` runs `f` over items `[0, n)` in order.
struct host_loop {
  template <class F>
  void each(std::size_t n, const F& f, const char* /*label*/ = nullptr) const {
    kernels::each(n, f);
  }
};

//! Layer norm of token row `t`: y = xhat g + b, keeping xhat and 1/sigma.
template <class T>
struct ln_forward_row {
  const T *x, *g, *b;
  T *y, *xhat, *rstd;
  std::size_t h;
  LOOM_HOST_DEVICE void operator()(std::size_t t) const {
    T mu = 0;
    for (std::size_t i = 0; i < h; ++i) mu += x[t * h + i];
    mu /= static_cast<T>(h);
    T var = 0;
    for (std::size_t i = 0; i < h; ++i) var += (x[t * h + i] - mu) * (x[t * h + i] - mu);
    var /= static_cast<T>(h);
    const T r = T(1) / math::sqrt(var + static_cast<T>(ln_eps));
    rstd[t] = r;
    for (std::size_t i = 0; i < h; ++i) {
      xhat[t * h + i] = (x[t * h + i] - mu) * r;
      y[t * h + i] = xhat[t * h + i] * g[i] + b[i];
    }
  }
};
//! Layer norm of `n` rows of `h`.
template <class T>
void ln_forward(const T* x, const T* g, const T* b, T* y, T* xhat, T* rstd, std::size_t n, std::size_t h) {
  each(n, ln_forward_row<T>{x, g, b, y, xhat, rstd, h});
}

//! Row `t` of dx = res + rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy g.
template <class T>
struct ln_backward_input_row {
  const T *dy, *xhat, *rstd, *g, *res;
  T* dx;
  std::size_t h;
  LOOM_HOST_DEVICE void operator()(std::size_t t) const {
    T m1 = 0, m2 = 0;
    for (std::size_t i = 0; i < h; ++i) {
      const T d = dy[t * h + i] * g[i];
      m1 += d;
      m2 += d * xhat[t * h + i];
    }
    m1 /= static_cast<T>(h);
    m2 /= static_cast<T>(h);
    for (std::size_t i = 0; i < h; ++i) {
      const T d = dy[t * h + i] * g[i];
      dx[t * h + i] = res[t * h + i] + rstd[t] * (d - m1 - xhat[t * h + i] * m2);
    }
  }
};
//! The layer norm's input gradient over `n` rows.
template <class T>
void ln_backward_input(const T* dy, const T* xhat, const T* rstd, const T* g, const T* res, T* dx, std::size_t n, std::size_t h) {
  each(n, ln_backward_input_row<T>{dy, xhat, rstd, g, res, dx, h});
}

//! Feature `i`: dg[i] += dy xhat and db[i] += dy (`db` may be null), token by token.
template <class T>
struct ln_backward_weight_col {
  const T *dy, *xhat;
  T *dg, *db;
  std::size_t n, h;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const {
    for (std::size_t t = 0; t < n; ++t) {
      if (xhat != nullptr) dg[i] += dy[t * h + i] * xhat[t * h + i];
      db[i] += dy[t * h + i];
    }
  }
};
//! dg += dy xhat, db += dy, token by token.
template <class T>
void ln_backward_weight(const T* dy, const T* xhat, T* dg, T* db, std::size_t n, std::size_t h) {
  each(h, ln_backward_weight_col<T>{dy, xhat, dg, db, n, h});
}
//! db += dy, token by token.
template <class T>
void bias_backward(const T* dy, T* db, std::size_t n, std::size_t h) {
  each(h, ln_backward_weight_col<T>{dy, nullptr, nullptr, db, n, h});
}

//! Token `t` of the cross-entropy of logits (n x V) against `target`: the softmax into `probs`
//! and `scale * loss_t` into `terms[t]`.
template <class T>
struct loss_row {
  const T *logits, *target;
  T *probs, *terms;
  std::size_t V;
  T scale;
  LOOM_HOST_DEVICE void operator()(std::size_t t) const {
    T mx = logits[t * V];
    for (std::size_t v = 1; v < V; ++v) mx = math::max(mx, logits[t * V + v]);
    T s = 0;
    for (std::size_t v = 0; v < V; ++v) s += math::exp(logits[t * V + v] - mx);
    const T lse = mx + math::log(s);
    for (std::size_t v = 0; v < V; ++v) probs[t * V + v] = math::exp(logits[t * V + v] - lse);
    terms[t] = scale * (lse - logits[t * V + static_cast<std::size_t>(target[t])]);
  }
};
//! Cross-entropy of logits (n x V) against `target`: returns sum_t scale * loss_t (in order);
//! keeps the softmax in `probs`.
template <class T>
T loss_forward(const T* logits, const T* target, T* probs, std::size_t n, std::size_t V, T scale) {
  T total = 0, term = 0;
  for (std::size_t t = 0; t < n; ++t) {  // each row on its own (no buffer of terms), added in order
    loss_row<T>{logits + t * V, target + t, probs + t * V, &term, V, scale}(0);
    total += term;
  }
  return total;
}
//! Element `e = t V + v`: dlogits = seed scale (p - onehot).
template <class T>
struct loss_backward_elem {
  const T *probs, *target, *seed;
  T scale;
  T* dlogits;
  std::size_t V;
  LOOM_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t t = e / V, v = e % V;
    dlogits[e] = seed[0] * scale * (probs[e] - (v == static_cast<std::size_t>(target[t]) ? T(1) : T(0)));
  }
};
//! dlogits = seed scale (p - onehot).
template <class T>
void loss_backward(const T* probs, const T* target, T seed, T scale, T* dlogits, std::size_t n, std::size_t V) {
  each(n * V, loss_backward_elem<T>{probs, target, &seed, scale, dlogits, V});
}

//! Element `e = t h + i` of the embedding: x = E[token] + P[position].
template <class T>
struct embed_elem {
  const T *ids, *E, *P;
  const int* pos;
  T* x;
  std::size_t h;
  LOOM_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t t = e / h, i = e % h;
    const auto tok = static_cast<std::size_t>(ids[t]), p = static_cast<std::size_t>(pos[t]);
    x[e] = E[tok * h + i] + P[p * h + i];
  }
};
//! Feature `i` of the embedding's gradient: dE[token][i] += dx and dP[position][i] += dx, token
//! by token.
template <class T>
struct embed_backward_col {
  const T *ids, *dx;
  const int* pos;
  T *dE, *dP;
  std::size_t n, h;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const {
    for (std::size_t t = 0; t < n; ++t) {
      const auto tok = static_cast<std::size_t>(ids[t]), p = static_cast<std::size_t>(pos[t]);
      dE[tok * h + i] += dx[t * h + i];
      dP[p * h + i] += dx[t * h + i];
    }
  }
};
//! Element `e = t h + i` of the vocabulary-parallel first stage's input: x = parts + P[position]
//! (`parts`: the embedding rows the vocabulary layers summed over the shards).
template <class T>
struct position_elem {
  const T *parts, *P;
  const int* pos;
  T* x;
  std::size_t h;
  LOOM_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t t = e / h, i = e % h;
    x[e] = parts[e] + P[static_cast<std::size_t>(pos[t]) * h + i];
  }
};
//! Feature `i` of the position embedding's gradient: dP[position][i] += dx, token by token.
template <class T>
struct position_backward_col {
  const T* dx;
  const int* pos;
  T* dP;
  std::size_t n, h;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const {
    for (std::size_t t = 0; t < n; ++t) dP[static_cast<std::size_t>(pos[t]) * h + i] += dx[t * h + i];
  }
};
//! y = a + b, element by element (`y` may be `a`).
template <class T>
struct add_elem {
  const T *a, *b;
  T* y;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const { y[i] = a[i] + b[i]; }
};
//! y = a b, element by element (`y` may be `a` or `b`).
template <class T>
struct mul_elem {
  const T *a, *b;
  T* y;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const { y[i] = a[i] * b[i]; }
};
//! y = s a, element by element (`y` may be `a`).
template <class T>
struct scale_elem {
  const T* a;
  T s;
  T* y;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const { y[i] = s * a[i]; }
};
//! act = tanh(u).
template <class T>
struct tanh_elem {
  const T* u;
  T* act;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const { act[i] = math::tanh(u[i]); }
};
//! du = du (1 - act^2), tanh's derivative from its output.
template <class T>
struct tanh_grad_elem {
  const T* act;
  T* du;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const { du[i] = du[i] * (T(1) - act[i] * act[i]); }
};
//! Element `e` of `[tokens][3][features]` (the Q/K/V projection's rows) against
//! `[3][tokens][features]`: `to_heads` copies the first into the second, else back.
template <class T>
struct qkv_layout_elem {
  const T* in;
  T* out;
  std::size_t tokens, features;
  bool to_heads;
  LOOM_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t i = e % features, p = e / features % 3, t = e / (3 * features);
    const std::size_t tok = (t * 3 + p) * features + i, heads = (p * tokens + t) * features + i;
    if (to_heads) out[heads] = in[tok];
    else out[tok] = in[heads];
  }
};

}  // namespace kernels

}  // namespace mesh_example
