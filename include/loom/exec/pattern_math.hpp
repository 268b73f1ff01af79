// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The per-element work of the tensor- and sequence-parallel patterns
//! (`loom/exec/tensor_parallel.hpp`, `loom/exec/sequence_parallel.hpp`), written once as
//! functions a host loop and a CUDA kernel both call: the linear blocks' products per output
//! element (Megatron's column- and row-parallel layers), one attention block's
//! forward per (query row, head), its backward split by what each item writes (the query
//! gradient per (query row, head), the key and value gradients per (key row, head)), the row term
//! `delta`, and Ulysses' all-to-all layout changes as index maps. On the host they run in loops
//! (threads and MPI groups, and loom's CUDA simulator); compiled by nvcc they are the bodies of
//! loom's kernels (`src/cuda/kernels.cu`). Each accumulator receives its terms in the same order
//! in every form (the order `ring_attention` documents), so host and simulated-device runs are
//! bitwise equal; on a GPU `exp`, `log` and contraction differ from the host's in the last bits.
//!
//! The math follows the online softmax (Milakov and Gimelshein 2018) and FlashAttention's backward
//! (Dao et al. 2022, Alg. 4) with the final log-sum-exp; it is loom's own code.

#include <cmath>
#include <cstddef>

#if defined(__CUDACC__)
//! Marks a function callable from host and device code (empty for a host compiler).
#define LOOM_HOST_DEVICE __host__ __device__
#else
//! Marks a function callable from host and device code (empty for a host compiler).
#define LOOM_HOST_DEVICE
#endif

namespace loom {

//! Which part of a key chunk a query chunk sees under a causal mask.
enum class block_mask : unsigned char { none, full, causal };

//! The elementary functions the patterns (and users' per-item code) need, the same call in host
//! and device code: the standard library's on the host, CUDA's in device code (whose `exp`,
//! `log`, `sqrt` and `tanh` may differ from the host's in the last bits).
namespace device_math {
//! e^x.
template <class T>
LOOM_HOST_DEVICE inline T exp(T x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
//! The natural logarithm.
template <class T>
LOOM_HOST_DEVICE inline T log(T x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}
//! The square root.
template <class T>
LOOM_HOST_DEVICE inline T sqrt(T x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}
//! The hyperbolic tangent.
template <class T>
LOOM_HOST_DEVICE inline T tanh(T x) {
#if defined(__CUDA_ARCH__)
  return ::tanh(x);
#else
  return std::tanh(x);
#endif
}
//! The larger of `a` and `b` (`b` when `a < b`, as `std::max`).
template <class T>
LOOM_HOST_DEVICE inline T max(T a, T b) {
  return a < b ? b : a;
}
}  // namespace device_math

//! The linear layer `y = x W^T (+ b)` over `n` tokens, `W` `[out][in]` row-major, as items: each
//! sum runs over its index in increasing order, starting from the bias (or zero), so every form
//! gives the same bits.
template <class T>
struct linear_items {
  const T* x = nullptr;  //!< input `[n][in]`
  const T* w = nullptr;  //!< weight `[out][in]`
  const T* b = nullptr;  //!< bias `[out]` (forward; null: none)
  const T* dy = nullptr; //!< output gradient `[n][out]` (backward)
  T* y = nullptr;        //!< output (forward) or input gradient `[n][in]` (backward input)
  T* gw = nullptr;       //!< weight gradient accumulator (backward weight)
  T* gb = nullptr;       //!< bias gradient accumulator (backward weight; null: none)
  std::size_t n = 0;     //!< tokens
  std::size_t in = 0;    //!< input features
  std::size_t out = 0;   //!< output features

  //! Forward of item `e = t * out + o`: `y[t][o] = b[o] + sum_i x[t][i] w[o][i]`.
  LOOM_HOST_DEVICE void forward(std::size_t e) const {
    const std::size_t t = e / out, o = e % out;
    T z = b == nullptr ? T{} : b[o];
    for (std::size_t i = 0; i < in; ++i) z += x[t * in + i] * w[o * in + i];
    y[e] = z;
  }
  //! Forward of item `e = t * out + o` continuing a running sum: `y[t][o] += sum_i x[t][i]
  //! w[o][i]`, the terms added one by one to `y[t][o]` in order of `i`. A product split by input
  //! features into blocks, run block after block into the same `y` (SUMMA's rounds, the 2D
  //! tensor-parallel grid's forward) gives `forward`'s bits over the whole input when `y` starts
  //! as the bias.
  LOOM_HOST_DEVICE void forward_add(std::size_t e) const {
    const std::size_t t = e / out, o = e % out;
    T z = y[e];
    for (std::size_t i = 0; i < in; ++i) z += x[t * in + i] * w[o * in + i];
    y[e] = z;
  }
  //! Input gradient of item `e = t * in + i`: `dx[t][i] = sum_o dy[t][o] w[o][i]`.
  LOOM_HOST_DEVICE void backward_input(std::size_t e) const {
    const std::size_t t = e / in, i = e % in;
    T s{};
    for (std::size_t o = 0; o < out; ++o) s += dy[t * out + o] * w[o * in + i];
    y[e] = s;
  }
  //! Items of the weight gradient: `out x in` weights, then `out` biases when `gb` is set.
  LOOM_HOST_DEVICE std::size_t weight_items() const { return out * in + (gb == nullptr ? 0 : out); }
  //! Weight gradient of item `e`: `gw[o][i] += dy[t][o] x[t][i]` (`e = o * in + i`) or
  //! `gb[o] += dy[t][o]` (`e = out * in + o`), over the tokens in order.
  LOOM_HOST_DEVICE void backward_weight(std::size_t e) const {
    if (e < out * in) {
      const std::size_t o = e / in, i = e % in;
      for (std::size_t t = 0; t < n; ++t) gw[e] += dy[t * out + o] * x[t * in + i];
    } else {
      const std::size_t o = e - out * in;
      for (std::size_t t = 0; t < n; ++t) gb[o] += dy[t * out + o];
    }
  }
  //! `y[t][o] = b[o]` (or 0 without `b`) for item `e = t * out + o`: where the grids' forward
  //! starts each output element's running sum.
  LOOM_HOST_DEVICE void set_bias(std::size_t e) const { y[e] = b == nullptr ? T{} : b[e % out]; }
  //! `y[t][o] += b[o]` for item `e = t * out + o` (the row-parallel layer's bias after the sum).
  LOOM_HOST_DEVICE void add_bias(std::size_t e) const { y[e] += b[e % out]; }
};

//! One block of attention as plain data (device pointers on a device, host pointers on the host):
//! query rows `[q0, q0 + nq)` of `q` against key rows `[k0, k0 + nk)` of `k`, `v`, tensors
//! `[rows][heads][head_dim]`; `o` and `lse` the running output and log-sum-exp; for the backward
//! `dout`, `delta` and the gradients (null to skip one).
template <class T>
struct attention_block {
  const T* q = nullptr;      //!< queries
  const T* k = nullptr;      //!< keys
  const T* v = nullptr;      //!< values
  T* o = nullptr;            //!< running output (forward), the forward's output (backward)
  T* lse = nullptr;          //!< running log-sum-exp (forward), the final one (backward)
  const T* dout = nullptr;   //!< output gradient (backward)
  const T* delta = nullptr;  //!< `sum_d dout o` per row and head (backward)
  T* dq = nullptr;           //!< query gradient (backward; null: not wanted)
  T* dk = nullptr;           //!< key gradient (backward; null: not wanted)
  T* dv = nullptr;           //!< value gradient (backward; null: not wanted)
  int heads = 1;             //!< heads
  int head_dim = 1;          //!< features per head
  T scale = T(1);            //!< scores are `scale q . k`
  int q0 = 0;                //!< first query row
  int nq = 0;                //!< query rows
  int k0 = 0;                //!< first key row
  int nk = 0;                //!< key rows
  block_mask mask = block_mask::full;  //!< `causal`: query row `i` sees keys up to `k0 + i - q0`

  //! Items of the forward and of the query-gradient pass: `nq x heads`.
  LOOM_HOST_DEVICE std::size_t query_items() const { return static_cast<std::size_t>(nq) * static_cast<std::size_t>(heads); }
  //! Items of the key/value-gradient pass: `nk x heads`.
  LOOM_HOST_DEVICE std::size_t key_items() const { return static_cast<std::size_t>(nk) * static_cast<std::size_t>(heads); }

  //! The score `scale q_i . k_j` of head `h` (rows relative to the block).
  LOOM_HOST_DEVICE T score(int i, int j, std::size_t h) const {
    const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
    const T* qv = q + (static_cast<std::size_t>(q0 + i) * H + h) * D;
    const T* kv = k + (static_cast<std::size_t>(k0 + j) * H + h) * D;
    T s{};
    for (std::size_t d = 0; d < D; ++d) s += qv[d] * kv[d];
    return s * scale;
  }
  //! Feature `d` of key row `j`'s value, head `h` (rows relative to the block).
  LOOM_HOST_DEVICE T value(int j, std::size_t h, std::size_t d) const {
    const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
    return v[(static_cast<std::size_t>(k0 + j) * H + h) * D + d];
  }
  //! Keys query row `i` sees (relative to the block).
  LOOM_HOST_DEVICE int visible(int i) const { return mask == block_mask::causal ? i + 1 : nk; }

  //! Forward of item `e = i * heads + h`: the block's softmax output and log-sum-exp of row `i`,
  //! head `h`, merged into `o`, `lse` by `l = log(e^lse + e^l_b)`, `o = o e^(lse - l) + o_b e^(l_b - l)`
  //! (start from `lse = -inf`, `o = 0`: the first merge is exact). With `ob` (`head_dim` values of
  //! scratch, the host loops) each key's weight is computed once; without it (a kernel's thread
  //! has no such array) the weights are recomputed per feature. Both add the same terms in the
  //! same order: the same bits.
  LOOM_HOST_DEVICE void forward(std::size_t e, T* ob = nullptr) const {
    const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
    const int i = static_cast<int>(e / H);
    const std::size_t h = e % H, qi = static_cast<std::size_t>(q0 + i);
    const int n = visible(i);
    T m = score(i, 0, h);
    for (int j = 1; j < n; ++j) m = device_math::max(m, score(i, j, h));
    T l{};
    for (int j = 0; j < n; ++j) l += device_math::exp(score(i, j, h) - m);
    const T lb = m + device_math::log(l);
    T& L = lse[qi * H + h];
    const T mx = device_math::max(L, lb);
    const T nl = mx + device_math::log(device_math::exp(L - mx) + device_math::exp(lb - mx));
    const T wa = device_math::exp(L - nl), wb = device_math::exp(lb - nl);
    T* ov = o + (qi * H + h) * D;
    if (ob != nullptr) {
      for (std::size_t d = 0; d < D; ++d) ob[d] = T{};
      for (int j = 0; j < n; ++j) {
        const T p = device_math::exp(score(i, j, h) - m);
        for (std::size_t d = 0; d < D; ++d) ob[d] += p * value(j, h, d);
      }
      for (std::size_t d = 0; d < D; ++d) ov[d] = ov[d] * wa + (ob[d] / l) * wb;
    } else {
      for (std::size_t d = 0; d < D; ++d) {
        T acc{};
        for (int j = 0; j < n; ++j) acc += device_math::exp(score(i, j, h) - m) * value(j, h, d);
        ov[d] = ov[d] * wa + (acc / l) * wb;
      }
    }
    L = nl;
  }

  //! `p = e^(score - lse)` and `ds = p (dout_i . v_j - delta_i)` of a visible pair.
  LOOM_HOST_DEVICE void pair(int i, int j, std::size_t h, T& p, T& ds) const {
    const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
    const std::size_t qi = static_cast<std::size_t>(q0 + i), kj = static_cast<std::size_t>(k0 + j);
    p = device_math::exp(score(i, j, h) - lse[qi * H + h]);
    const T* dov = dout + (qi * H + h) * D;
    const T* vv = v + (kj * H + h) * D;
    T dp{};
    for (std::size_t d = 0; d < D; ++d) dp += dov[d] * vv[d];
    ds = p * (dp - delta[qi * H + h]);
  }

  //! Query gradient of item `e = i * heads + h`: `dq_i += scale ds k_j` over the visible keys in
  //! order.
  LOOM_HOST_DEVICE void backward_query(std::size_t e) const {
    const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
    const int i = static_cast<int>(e / H);
    const std::size_t h = e % H, qi = static_cast<std::size_t>(q0 + i);
    for (int j = 0; j < visible(i); ++j) {
      T p, ds;
      pair(i, j, h, p, ds);
      const T* kv = k + (static_cast<std::size_t>(k0 + j) * H + h) * D;
      for (std::size_t d = 0; d < D; ++d) dq[(qi * H + h) * D + d] += scale * ds * kv[d];
    }
  }

  //! Key and value gradients of item `e = j * heads + h`: `dv_j += p dout_i`,
  //! `dk_j += scale ds q_i` over the query rows that see key `j`, in order.
  LOOM_HOST_DEVICE void backward_key(std::size_t e) const {
    const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
    const int j = static_cast<int>(e / H);
    const std::size_t h = e % H, kj = static_cast<std::size_t>(k0 + j);
    for (int i = mask == block_mask::causal ? j : 0; i < nq; ++i) {
      T p, ds;
      pair(i, j, h, p, ds);
      const std::size_t qi = static_cast<std::size_t>(q0 + i);
      const T* dov = dout + (qi * H + h) * D;
      const T* qv = q + (qi * H + h) * D;
      if (dv != nullptr)
        for (std::size_t d = 0; d < D; ++d) dv[(kj * H + h) * D + d] += p * dov[d];
      if (dk != nullptr)
        for (std::size_t d = 0; d < D; ++d) dk[(kj * H + h) * D + d] += scale * ds * qv[d];
    }
  }
};

//! Merges a partial attention result into a running one, item `r` = one row and head: `(y, lb)`
//! (a softmax output over some keys and its log-sum-exp) into `(o, lse)` by `attention_block`'s
//! rule, `l = log(e^lse + e^lb)` (about their maximum), `o = o e^(lse - l) + y e^(lb - l)`.
//! TokenRing's owner merges the partial outputs that come home with it.
template <class T>
struct attention_merge_rows {
  T* o = nullptr;           //!< running output `[rows][head_dim]`
  T* lse = nullptr;         //!< running log-sum-exp `[rows]`
  const T* y = nullptr;     //!< partial output
  const T* lb = nullptr;    //!< its log-sum-exp
  int head_dim = 1;         //!< features per head
  //! Item `r`.
  LOOM_HOST_DEVICE void operator()(std::size_t r) const {
    const auto D = static_cast<std::size_t>(head_dim);
    const T L = lse[r], b = lb[r];
    const T mx = device_math::max(L, b);
    const T nl = mx + device_math::log(device_math::exp(L - mx) + device_math::exp(b - mx));
    const T wa = device_math::exp(L - nl), wb = device_math::exp(b - nl);
    for (std::size_t d = 0; d < D; ++d) o[r * D + d] = o[r * D + d] * wa + y[r * D + d] * wb;
    lse[r] = nl;
  }
};

//! `delta[r] = sum_d dout[r][d] o[r][d]` for row-and-head `r` (rows of `head_dim` features).
template <class T>
struct attention_delta_rows {
  const T* o = nullptr;     //!< the forward's output
  const T* dout = nullptr;  //!< its gradient
  T* delta = nullptr;       //!< one value per row and head
  int head_dim = 1;         //!< features per head
  //! Item `r`.
  LOOM_HOST_DEVICE void operator()(std::size_t r) const {
    const auto D = static_cast<std::size_t>(head_dim);
    T s{};
    for (std::size_t d = 0; d < D; ++d) s += dout[r * D + d] * o[r * D + d];
    delta[r] = s;
  }
};

//! Ulysses' layout change as an index map: element `w` of the all-to-all buffer, read as
//! `[u][count][tokens][heads / u][head_dim]` (block `j` goes to or comes from rank `j`), is element
//! `heads_side(w)` of the head-major side `[count][tokens][heads][head_dim]` (this rank's tokens,
//! all heads) and element `tokens_side(w)` of the token-major side
//! `[count][u x tokens][heads / u][head_dim]` (every rank's tokens, one head group).
struct ulysses_layout {
  std::size_t u = 1;      //!< Ulysses degree
  std::size_t count = 1;  //!< tensors
  std::size_t tokens = 1; //!< tokens per rank
  std::size_t heads = 1;  //!< heads per rank before the exchange
  std::size_t head_dim = 1;  //!< features per head

  //! Elements of the buffer (`u` blocks of `count x tokens x heads / u x head_dim`).
  LOOM_HOST_DEVICE std::size_t size() const { return count * tokens * heads * head_dim; }
  //! Index on the head-major side of buffer element `w`.
  LOOM_HOST_DEVICE std::size_t heads_side(std::size_t w) const {
    const std::size_t hg = heads / u, d = w % head_dim, h = w / head_dim % hg, i = w / (head_dim * hg) % tokens,
                      x = w / (head_dim * hg * tokens) % count, j = w / (head_dim * hg * tokens * count);
    return ((x * tokens + i) * heads + j * hg + h) * head_dim + d;
  }
  //! Index on the token-major side of buffer element `w`.
  LOOM_HOST_DEVICE std::size_t tokens_side(std::size_t w) const {
    const std::size_t hg = heads / u, d = w % head_dim, h = w / head_dim % hg, i = w / (head_dim * hg) % tokens,
                      x = w / (head_dim * hg * tokens) % count, j = w / (head_dim * hg * tokens * count);
    return ((x * tokens * u + j * tokens + i) * hg + h) * head_dim + d;
  }
};

//! `out[w] = in[map(w)]` (`gather`) or `out[map(w)] = in[w]` (scatter), for one buffer element
//! `w`; `heads` picks the map (`heads_side` or `tokens_side`).
template <class T>
struct ulysses_move {
  const T* in = nullptr;  //!< source
  T* out = nullptr;       //!< destination
  ulysses_layout l;       //!< the layout
  bool heads = true;      //!< map by `heads_side` (else `tokens_side`)
  bool gather = true;     //!< gather into the buffer (else scatter out of it)
  //! Element `w`.
  LOOM_HOST_DEVICE void operator()(std::size_t w) const {
    const std::size_t m = heads ? l.heads_side(w) : l.tokens_side(w);
    if (gather) out[w] = in[m];
    else out[m] = in[w];
  }
};

//! One element of DSP's layout change (`dsp_switch`): element `w` of the all-to-all buffer,
//! `[P][A/P][B/P][F]` (block `j` for rank `j`), is row `x`, column `y`, feature `f` of block `j`,
//! which in a tensor sharded along B (`[A][B/P][F]`) sits at row `j A/P + x`, column `y`, and in
//! one sharded along A (`[A/P][B][F]`) at row `x`, column `j B/P + y`. `gather` fills the buffer
//! from the tensor (`out[w] = in[at]`), else the tensor from the buffer (`out[at] = in[w]`).
template <class T>
struct dsp_move {
  const T* in = nullptr;  //!< source
  T* out = nullptr;       //!< destination
  std::size_t ap = 1;     //!< rows per rank, `A / P`
  std::size_t bp = 1;     //!< columns per rank, `B / P`
  std::size_t b = 1;      //!< columns, `B`
  std::size_t f = 1;      //!< features per token
  bool along_a = false;   //!< the tensor is sharded along A (else along B)
  bool gather = true;     //!< buffer from tensor (else tensor from buffer)
  //! Elements of the buffer.
  LOOM_HOST_DEVICE std::size_t size(std::size_t ranks) const { return ranks * ap * bp * f; }
  //! Element `w`.
  LOOM_HOST_DEVICE void operator()(std::size_t w) const {
    const std::size_t e = w % f, t = w / f, y = t % bp, x = (t / bp) % ap, j = t / (bp * ap);
    const std::size_t at = (along_a ? (x * b + j * bp + y) : ((j * ap + x) * bp + y)) * f + e;
    if (gather) out[w] = in[at];
    else out[at] = in[w];
  }
};

//! The steps of a layer norm over one member's feature block (`norm_items`, `loom::grid_layer_norm`):
//! the forward's three (its two row statistics are summed over the feature blocks between them),
//! the input gradient's two, the weights' one.
enum class norm_step : unsigned char {
  row_sums,     //!< per token: the sum of its block of `x` into `stats[t]`
  centre,       //!< per token: the mean from the whole row's sum `stats[t]` (left there), the block's squared deviations into `stats[n + t]`
  normalise,    //!< per token: `rstd`, `xhat` and `y` from the whole row's mean and squared deviations
  grad_sums,    //!< per token: the block's sums of `dxhat = dy g` and of `dxhat xhat` into `stats[2 t]`, `stats[2 t + 1]`
  grad_apply,   //!< per token: the input gradient into `y` from the whole row's two sums (plus `res` when given)
  weight_sums,  //!< per feature: the sums over the tokens of `dy xhat` into `pg` and of `dy` into `pb`
};

//! A layer norm `y = (x - mean) / sqrt(var + eps) g + b` over `h` features, on one member's block
//! of `hq` of them for `n` tokens (row-major `[n][hq]`), as items of the steps `norm_step` names:
//! one item per token (per feature for `weight_sums`), each sum from zero in increasing index, so
//! the host loop and the simulator's kernels give the same bits (on a GPU, contraction into fused
//! multiply-adds may change the last bits). The row statistics between the steps are summed over
//! the feature blocks by the caller (`loom::grid_layer_norm`).
template <class T>
struct norm_items {
  const T* x = nullptr;    //!< input (forward)
  const T* g = nullptr;    //!< the block's weight `[hq]`
  const T* b = nullptr;    //!< the block's bias `[hq]` (forward)
  const T* dy = nullptr;   //!< output gradient (backward)
  const T* res = nullptr;  //!< a gradient added to the input gradient (null: none)
  T* y = nullptr;          //!< output (forward) or input gradient (`grad_apply`)
  T* xhat = nullptr;       //!< the normalised input: written by `normalise`, read by the backward steps
  T* rstd = nullptr;       //!< `1 / sigma` per token `[n]`
  T* stats = nullptr;      //!< the row statistics `[2 n]` (see `norm_step`)
  T* pg = nullptr;         //!< the weight's partial gradient `[hq]` (`weight_sums`)
  T* pb = nullptr;         //!< the bias's partial gradient `[hq]` (`weight_sums`)
  std::size_t n = 0;       //!< tokens
  std::size_t hq = 0;      //!< features of the block
  std::size_t h = 0;       //!< features of the whole row
  double eps = 1e-5;       //!< added to the variance

  //! Items of `step`.
  LOOM_HOST_DEVICE std::size_t count(norm_step step) const { return step == norm_step::weight_sums ? hq : n; }
  //! Item `i` of `step`.
  LOOM_HOST_DEVICE void operator()(norm_step step, std::size_t i) const {
    const T H = static_cast<T>(h);
    switch (step) {
      case norm_step::row_sums: {
        T z{};
        for (std::size_t f = 0; f < hq; ++f) z += x[i * hq + f];
        stats[i] = z;
        break;
      }
      case norm_step::centre: {
        const T mu = stats[i] / H;
        T z{};
        for (std::size_t f = 0; f < hq; ++f) z += (x[i * hq + f] - mu) * (x[i * hq + f] - mu);
        stats[n + i] = z;
        stats[i] = mu;
        break;
      }
      case norm_step::normalise: {
        const T r = T(1) / device_math::sqrt(stats[n + i] / H + static_cast<T>(eps));
        rstd[i] = r;
        for (std::size_t f = 0; f < hq; ++f) {
          const std::size_t e = i * hq + f;
          xhat[e] = (x[e] - stats[i]) * r;
          y[e] = xhat[e] * g[f] + b[f];
        }
        break;
      }
      case norm_step::grad_sums: {
        T m1{}, m2{};
        for (std::size_t f = 0; f < hq; ++f) {
          const T d = dy[i * hq + f] * g[f];
          m1 += d;
          m2 += d * xhat[i * hq + f];
        }
        stats[2 * i] = m1;
        stats[2 * i + 1] = m2;
        break;
      }
      case norm_step::grad_apply: {
        const T m1 = stats[2 * i] / H, m2 = stats[2 * i + 1] / H;
        for (std::size_t f = 0; f < hq; ++f) {
          const std::size_t e = i * hq + f;
          const T d = dy[e] * g[f];
          const T v = rstd[i] * (d - m1 - xhat[e] * m2);
          y[e] = res == nullptr ? v : res[e] + v;
        }
        break;
      }
      case norm_step::weight_sums: {
        T a{}, c{};
        for (std::size_t t = 0; t < n; ++t) {
          a += dy[t * hq + i] * xhat[t * hq + i];
          c += dy[t * hq + i];
        }
        pg[i] = a;
        pb[i] = c;
        break;
      }
    }
  }
};

}  // namespace loom
