// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! A small decoder-only transformer in double precision on the CPU, written as a loom pipeline
//! stage whose layers shard over a mesh: token and position embedding, pre-LN blocks (layer norm,
//! causal multi-head attention, residual; layer norm, MLP with tanh, residual), a final layer
//! norm, the output projection and a softmax cross-entropy loss per token.
//!
//! Sharding of a block (Megatron-LM, Shoeybi et al. 2019, §3): the Q/K/V projection and the first
//! MLP layer are column-parallel over `tp` (heads and MLP features split), the attention output
//! projection and the second MLP layer row-parallel; everything else is replicated. The sequence
//! of a microbatch is split in one of four ways (`loom/exec/sequence_parallel.hpp`,
//! `loom/exec/tensor_parallel.hpp`):
//! - `megatron`: over the tp group outside the tensor-parallel regions (Megatron-SP);
//! - `ulysses`, `ring`, `usp`: over the `sp` dimension everywhere; the attention gathers the
//!   sequence by Ulysses all-to-alls, ring attention or both (USP).
//! Blocks are cut into pipeline stages (stage 0 also embeds, the last stage also computes the
//! loss), the stages run by any loom schedule over `pp`, and the whole is replicated over `dp`.
//!
//! Every kernel fixes its order of additions. A deterministic run is bitwise equal to the
//! single-rank reference of `reference.hpp` computed with the same blocking (the reduction order
//! of the layout); any run is within 1e-12 of the plain reference.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <loom/exec/data_parallel.hpp>
#include <loom/exec/sequence_parallel.hpp>
#include <loom/exec/tensor_parallel.hpp>
#include <loom/mesh/mesh.hpp>
#include <loom/stage/stage.hpp>

namespace mesh_example {

//! The model's shape and the optimizer's learning rate.
struct model_spec {
  int vocab = 11;     //!< tokens of the vocabulary
  int seq = 16;       //!< tokens per sequence (one sequence per microbatch)
  int hidden = 8;     //!< model width h
  int heads = 4;      //!< attention heads (head size h / heads)
  int ffn = 16;       //!< MLP hidden features
  int blocks = 4;     //!< transformer blocks (raised to the number of virtual stages)
  double lr = 0.1;    //!< SGD learning rate
  int head_dim() const { return hidden / heads; }
};

//! How the sequence is split.
enum class seq_kind { none, megatron, ulysses, ring, usp };

//! Name of a kind.
inline std::string to_string(seq_kind k) {
  switch (k) {
    case seq_kind::none: return "none";
    case seq_kind::megatron: return "megatron";
    case seq_kind::ulysses: return "ulysses";
    case seq_kind::ring: return "ring";
    case seq_kind::usp: return "usp";
  }
  return "?";
}

//! The parallel layout: degrees of the mesh dimensions and the sequence split.
struct sharding {
  int dp = 1, tp = 1, pp = 1, sp = 1;
  seq_kind kind = seq_kind::none;
  int ulysses = 1;  //!< USP's Ulysses degree (ulysses: sp; ring: 1)

  bool megatron() const { return kind == seq_kind::megatron && tp > 1; }
  //! Size of the mesh's sp dimension (Megatron-SP uses the tp group).
  int sp_ranks() const { return kind == seq_kind::megatron || kind == seq_kind::none ? 1 : sp; }
  int u() const { return kind == seq_kind::ulysses ? sp : kind == seq_kind::usp ? ulysses : 1; }
  int ring() const { return kind == seq_kind::ring ? sp : kind == seq_kind::usp ? sp / ulysses : 1; }
  int world() const { return dp * tp * pp * sp_ranks(); }
  loom::seq_split split(const model_spec& m) const { return {m.seq, u(), ring()}; }
  //! Tokens a rank holds outside the tensor-parallel regions.
  int tokens(const model_spec& m) const { return megatron() ? m.seq / tp : m.seq / sp_ranks(); }
  //! Tokens inside the tensor-parallel regions.
  int region_tokens(const model_spec& m) const { return megatron() ? m.seq : tokens(m); }
  //! Global position of local token `i` of the rank with tp index `t` and sp index `s`.
  int token(const model_spec& m, int t, int s, int i) const {
    if (megatron()) return t * tokens(m) + i;
    return split(m).token(s, i);
  }
  //! The dimension whose ranks hold different tokens (their gradients and losses are partial).
  loom::dim_set seq_dims() const {
    if (megatron()) return loom::dim::tp;
    if (sp_ranks() > 1) return loom::dim::sp;
    return {};
  }
  //! "pp2 x dp2 x tp2, sp ring 2" style description.
  std::string describe() const {
    std::string s = "pp" + std::to_string(pp) + " x dp" + std::to_string(dp) + " x sp" + std::to_string(sp_ranks()) +
                    " x tp" + std::to_string(tp);
    if (kind == seq_kind::megatron) s += ", sequence over tp (megatron)";
    if (kind == seq_kind::usp) s += ", sp usp (ulysses " + std::to_string(u()) + " x ring " + std::to_string(ring()) + ")";
    else if (kind != seq_kind::none && kind != seq_kind::megatron) s += ", sp " + to_string(kind);
    return s;
  }
  //! The rule this layout breaks for model `m`, or "" (one sentence naming the values).
  std::string rule(const model_spec& m) const {
    for (auto [name, v] : {std::pair<const char*, int>{"dp", dp}, {"tp", tp}, {"pp", pp}, {"sp", sp}})
      if (v < 1) return std::string("--") + name + " " + std::to_string(v) + ": every dimension needs at least 1 rank";
    if (m.hidden % m.heads != 0)
      return "--hidden " + std::to_string(m.hidden) + " is not divisible by --heads " + std::to_string(m.heads);
    if (kind == seq_kind::none) {
      if (sp != 1) return "--sp " + std::to_string(sp) + " needs a --sp-kind (megatron, ulysses, ring or usp)";
      return loom::tp_rule(tp, m.heads, m.ffn);
    }
    if (kind == seq_kind::megatron && sp != 1 && sp != tp)
      return "--sp-kind megatron splits the sequence over the tp group: --sp " + std::to_string(sp) + " must equal --tp " +
             std::to_string(tp);
    if (kind == seq_kind::usp && (ulysses < 1 || sp % ulysses != 0))
      return "--ulysses " + std::to_string(ulysses) + " does not divide --sp " + std::to_string(sp);
    const loom::sp_kind k = kind == seq_kind::megatron ? loom::sp_kind::megatron
                            : kind == seq_kind::ulysses ? loom::sp_kind::ulysses
                            : kind == seq_kind::ring    ? loom::sp_kind::ring
                                                        : loom::sp_kind::usp;
    return loom::sharding_rule({m.seq, m.heads, m.ffn}, tp, kind == seq_kind::megatron ? tp : sp, k, u());
  }
};

//! The tensors of the model (per block where it applies).
enum class tensor : int { E, P, LN1G, LN1B, WQKV, BQKV, WO, BO, LN2G, LN2B, W1, B1, W2, B2, LNFG, LNFB, WOUT, BOUT };

//! A reproducible value in [-1, 1) from integer coordinates.
inline double hashed(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ (c + 7) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

//! Initial value of element (row, col) of tensor `t` of block `b` (-1 outside blocks).
inline double initial(const model_spec& m, tensor t, int b, int row, int col) {
  const double r = hashed(static_cast<std::uint64_t>(t) * 131 + static_cast<std::uint64_t>(b + 1), static_cast<std::uint64_t>(row),
                          static_cast<std::uint64_t>(col));
  switch (t) {
    case tensor::E:
    case tensor::P: return 0.5 * r;
    case tensor::LN1G:
    case tensor::LN2G:
    case tensor::LNFG: return 1.0 + 0.1 * r;
    case tensor::WQKV:
    case tensor::W1:
    case tensor::WOUT: return r / std::sqrt(static_cast<double>(m.hidden));
    case tensor::WO: return r / std::sqrt(static_cast<double>(m.hidden));
    case tensor::W2: return r / std::sqrt(static_cast<double>(m.ffn));
    default: return 0.1 * r;
  }
}

//! Whole shape (rows x cols) of a tensor.
inline std::pair<int, int> full_shape(const model_spec& m, tensor t) {
  const int h = m.hidden;
  switch (t) {
    case tensor::E: return {m.vocab, h};
    case tensor::P: return {m.seq, h};
    case tensor::WQKV: return {3 * h, h};
    case tensor::BQKV: return {3 * h, 1};
    case tensor::WO: return {h, h};
    case tensor::W1: return {m.ffn, h};
    case tensor::B1: return {m.ffn, 1};
    case tensor::W2: return {h, m.ffn};
    case tensor::WOUT: return {m.vocab, h};
    case tensor::BOUT: return {m.vocab, 1};
    default: return {h, 1};
  }
}

//! How a tensor is split over tp.
enum class split_kind { none, qkv_rows, rows, cols };

inline split_kind split_of(tensor t) {
  switch (t) {
    case tensor::WQKV:
    case tensor::BQKV: return split_kind::qkv_rows;
    case tensor::W1:
    case tensor::B1: return split_kind::rows;
    case tensor::WO:
    case tensor::W2: return split_kind::cols;
    default: return split_kind::none;
  }
}

//! One tensor as a stage holds it: its place in the stage's parameters, its local shape, and
//! the map from local to whole rows and columns.
struct tensor_slot {
  tensor t;
  int block = -1;          //!< block index, -1 for embedding and final tensors
  std::size_t offset = 0;  //!< in the stage's parameter vector
  int rows = 0, cols = 0;  //!< local shape
  split_kind split = split_kind::none;
  int tp_rank = 0, tp = 1;
  int heads_local = 1, head_dim = 1, hidden = 1, ffn_local = 1;
  std::size_t size() const { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }
  int row_of(int r) const {
    if (split == split_kind::qkv_rows) {
      const int hl = heads_local * head_dim, part = r / hl;
      return part * hidden + tp_rank * hl + r % hl;
    }
    if (split == split_kind::rows) return tp_rank * rows + r;
    return r;
  }
  int col_of(int c) const { return split == split_kind::cols ? tp_rank * cols + c : c; }
};

//! The tensors of a stage holding blocks [b0, b1), the embedding and/or the final layers, on tp
//! rank `t`, with their offsets.
inline std::vector<tensor_slot> stage_tensors(const model_spec& m, const sharding& s, int t, int b0, int b1, bool embed,
                                              bool final_layers) {
  std::vector<tensor_slot> out;
  std::size_t off = 0;
  auto add = [&](tensor x, int block) {
    tensor_slot ts{x, block};
    auto [r, c] = full_shape(m, x);
    ts.split = s.tp > 1 ? split_of(x) : split_kind::none;
    ts.tp_rank = t;
    ts.tp = s.tp;
    ts.heads_local = m.heads / s.tp;
    ts.head_dim = m.head_dim();
    ts.hidden = m.hidden;
    ts.ffn_local = m.ffn / s.tp;
    if (ts.split == split_kind::qkv_rows || ts.split == split_kind::rows) r /= s.tp;
    if (ts.split == split_kind::cols) c /= s.tp;
    ts.rows = r;
    ts.cols = c;
    ts.offset = off;
    off += ts.size();
    out.push_back(ts);
  };
  if (embed) add(tensor::E, -1), add(tensor::P, -1);
  for (int b = b0; b < b1; ++b)
    for (tensor x : {tensor::LN1G, tensor::LN1B, tensor::WQKV, tensor::BQKV, tensor::WO, tensor::BO, tensor::LN2G,
                     tensor::LN2B, tensor::W1, tensor::B1, tensor::W2, tensor::B2})
      add(x, b);
  if (final_layers)
    for (tensor x : {tensor::LNFG, tensor::LNFB, tensor::WOUT, tensor::BOUT}) add(x, -1);
  return out;
}

//! Whether the gradient of `slot` is a partial sum over the ranks holding other tokens.
inline bool seq_partial(const sharding& s, const tensor_slot& slot) {
  if (s.sp_ranks() > 1) return true;              // every parameter sees only this rank's tokens
  if (s.megatron()) return slot.split == split_kind::none;  // replicated ones see the local chunk
  return false;
}

//! Blocks of virtual stage `st` of `S` over `L` blocks: [st L / S, (st + 1) L / S).
inline std::pair<int, int> stage_blocks(int L, int st, int S) { return {st * L / S, (st + 1) * L / S}; }

// ---- kernels (fixed order of additions; shared with the reference) ----------------------------
// Each kernel is a function object over one item (a token row, a feature column or an element)
// whose call is `__host__ __device__` under nvcc, and a host function that runs it over every
// item; the stage and the reference run the items, so a device form can launch the same objects.
namespace kernels {

inline constexpr double ln_eps = 1e-5;

namespace math = loom::device_math;  // exp, log, sqrt, tanh on host and device

//! Runs `f` over items `[0, n)` on the host.
template <class F>
void each(std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

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
//! y = a + b, element by element (`y` may be `a`).
template <class T>
struct add_elem {
  const T *a, *b;
  T* y;
  LOOM_HOST_DEVICE void operator()(std::size_t i) const { y[i] = a[i] + b[i]; }
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

//! The data of a step: token ids and targets of every global microbatch, and the loss scale.
struct batch {
  std::vector<double> tokens, targets;  // [microbatches][seq]
};
//! Microbatches `[first, first + count)` of `b`.
inline batch slice(const model_spec& m, const batch& b, int first, int count) {
  const auto at = static_cast<std::ptrdiff_t>(first) * m.seq, n = static_cast<std::ptrdiff_t>(count) * m.seq;
  return {{b.tokens.begin() + at, b.tokens.begin() + at + n}, {b.targets.begin() + at, b.targets.begin() + at + n}};
}

//! Tokens and next-token-like targets of `microbatches` sequences for step `step`.
inline batch make_batch(const model_spec& m, int microbatches, int step) {
  batch b;
  const auto n = static_cast<std::size_t>(microbatches) * static_cast<std::size_t>(m.seq);
  b.tokens.resize(n);
  b.targets.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    b.tokens[i] = std::floor((hashed(static_cast<std::uint64_t>(step), i, 11) + 1) * 0.5 * m.vocab);
    b.targets[i] = std::floor((hashed(static_cast<std::uint64_t>(step), i, 12) + 1) * 0.5 * m.vocab);
  }
  return b;
}

//! The communicators a stage uses inside its functions (any of them may be null: degree 1).
template <class C>
struct stage_comms {
  C* tp = nullptr;       //!< tensor-parallel group
  C* ulysses = nullptr;  //!< Ulysses group (inside the sp dimension)
  C* ring = nullptr;     //!< ring group (across the sp dimension)
};

//! Blocks [b0, b1) of the model (plus the embedding on the first stage and the loss on the last)
//! as a `loom::split_stage` sharded by `sharding` (see the file comment). `targets` points at
//! this rank's targets of the step (`[microbatch][local token]`), set before each step.
template <class C>
class transformer_stage {
 public:
  using value_type = double;

  transformer_stage(const model_spec& m, const sharding& s, int tp_rank, int sp_rank, int b0, int b1, bool embed,
                    bool final_layers, stage_comms<C> comms, bool deterministic, double loss_scale,
                    const std::vector<double>* targets)
      : m_(&m), s_(s), tpr_(tp_rank), spr_(sp_rank), b0_(b0), b1_(b1), embed_(embed), final_(final_layers), c_(comms),
        targets_(targets), scale_(loss_scale),
        tp_{comms.tp, s.megatron() ? loom::tp_mode::sequence_sharded : loom::tp_mode::replicated, deterministic},
        T_(static_cast<std::size_t>(s.tokens(m))),
        Tr_(static_cast<std::size_t>(s.region_tokens(m))),
        h_(static_cast<std::size_t>(m.hidden)),
        hl_(static_cast<std::size_t>(m.hidden / s.tp)),
        fl_(static_cast<std::size_t>(m.ffn / s.tp)),
        att_(comms.ulysses, comms.ring, s.region_tokens(m),
             loom::attention_dims{m.heads / s.tp, m.head_dim(), 1.0 / std::sqrt(static_cast<double>(m.head_dim()))}, true) {
    slots_ = stage_tensors(m, s, tp_rank, b0, b1, embed, final_layers);
    std::size_t n = 0;
    for (auto const& ts : slots_) n += ts.size();
    params_.resize(n);
    grads_.assign(n, 0.0);
    for (auto const& ts : slots_)
      for (int r = 0; r < ts.rows; ++r)
        for (int c = 0; c < ts.cols; ++c)
          params_[ts.offset + static_cast<std::size_t>(r * ts.cols + c)] = initial(m, ts.t, ts.block, ts.row_of(r), ts.col_of(c));
    for (auto const& ts : slots_)
      ranges_.push_back({ts.offset, ts.size(), seq_partial(s, ts) ? s.seq_dims() : loom::dim_set{}});
    layout_stash();
    for (std::size_t t = 0; t < T_; ++t) pos_.push_back(s_.token(m, tpr_, spr_, static_cast<int>(t)));
    work_.assign(8 * std::max(Tr_ * std::max({h_, 3 * hl_, fl_}), T_ * static_cast<std::size_t>(m.vocab)), 0.0);
  }

  std::size_t input_size() const { return embed_ ? T_ : T_ * h_; }
  std::size_t output_size() const { return final_ ? 1 : T_ * h_; }
  std::size_t stash_size() const { return stash_total_; }
  std::span<double> weight_grad() { return grads_; }
  std::span<double> params() { return params_; }
  //! Gives up the parameters' storage (ZeRO-3, `loom::releasable_stage`): `params()` is empty
  //! until `acquire_params()`.
  void release_params() {
    params_.clear();
    params_.shrink_to_fit();
  }
  //! Storage for the parameters again (contents unspecified: the reducer fills them).
  void acquire_params() { params_.resize(grads_.size()); }
  std::span<const loom::grad_range> grad_ranges() const { return ranges_; }
  //! The tensors this stage holds (to compare with the reference).
  const std::vector<tensor_slot>& tensors() const { return slots_; }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<double> b) {
    guard([&] {
      if (ctx.microbatch == fail_on) throw std::runtime_error("injected failure");
      const double* x = b.input.data();
      std::span<double> cur(work(0), T_ * h_), next(work(1), T_ * h_);
      if (embed_) {
        embed_forward(b.input, cur);
        x = cur.data();
      } else {
        std::copy(b.input.begin(), b.input.end(), cur.begin());
      }
      for (int blk = b0_; blk < b1_; ++blk) {
        block_forward(blk, cur, next, b.stash);
        std::swap(cur, next);
      }
      (void)x;
      if (final_) {
        b.output[0] = final_forward(ctx.microbatch, cur, b.stash);
      } else {
        std::copy(cur.begin(), cur.end(), b.output.begin());
      }
    });
  }

  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<double> b) {
    guard([&] {
      std::span<double> g(work(0), T_ * h_), gn(work(1), T_ * h_);
      if (final_) final_backward(ctx.microbatch, b.output_grad[0], b.stash, g);
      else std::copy(b.output_grad.begin(), b.output_grad.end(), g.begin());
      for (int blk = b1_ - 1; blk >= b0_; --blk) {
        block_backward_input(blk, g, gn, b.stash);
        std::swap(g, gn);
      }
      if (embed_) std::copy(g.begin(), g.end(), st(b.stash, emb_grad_, T_ * h_).begin());
      else std::copy(g.begin(), g.end(), b.input_grad.begin());
    });
  }

  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) {
    guard([&] {
      double* gw = b.weight_grad.data();
      if (embed_) {
        const double* dx = st(b.stash, emb_grad_, T_ * h_).data();
        kernels::each(h_, kernels::embed_backward_col<double>{b.input.data(), dx, pos_.data(), gw + slot(tensor::E, -1).offset,
                                                               gw + slot(tensor::P, -1).offset, T_, h_});
      }
      for (int blk = b0_; blk < b1_; ++blk) block_backward_weight(blk, b.stash, gw);
      if (final_) final_backward_weight(b.stash, gw);
    });
  }

  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> b) {
    backward_input(ctx, b);
    backward_weight(ctx, {b.input, b.stash, b.weight_grad});
  }

  int fail_on = -1;  //!< microbatch whose forward throws (fault tests), or -1

 private:
  // A stage function that throws while its tp/sp peers wait in a collective would leave them
  // waiting: abort the world first, so every rank stops and names this one.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const loom::comm_error&) {
      throw;
    } catch (const std::exception& e) {
      abort_peers(std::string("a stage function threw: ") + e.what());
      throw;
    }
  }
  void abort_peers(const std::string& why) {
    for (C* c : {c_.tp, c_.ulysses, c_.ring})
      if (c != nullptr && c->size() > 1) {
        c->abort(why);
        return;
      }
  }

  double* work(int i) { return work_.data() + static_cast<std::size_t>(i) * (work_.size() / 8); }

  // ---- stash layout -------------------------------------------------------------------------
  struct block_stash {
    std::size_t xhat1, rstd1, afull, att, o, xhat2, rstd2, cfull, act;       // forward
    std::size_t dqkv, dyfull, dyin, du, dzfull, dzin, da, dc;               // backward_input, for W
  };
  void layout_stash() {
    std::size_t off = 0;
    auto take = [&](std::size_t n) {
      std::size_t at = off;
      off += n;
      return at;
    };
    for (int blk = b0_; blk < b1_; ++blk) {
      block_stash bs{};
      bs.xhat1 = take(T_ * h_);
      bs.rstd1 = take(T_);
      bs.afull = take(Tr_ * h_);
      bs.att = take(att_.stash_size());
      bs.o = take(Tr_ * hl_);
      bs.xhat2 = take(T_ * h_);
      bs.rstd2 = take(T_);
      bs.cfull = take(Tr_ * h_);
      bs.act = take(Tr_ * fl_);
      bs.dqkv = take(Tr_ * 3 * hl_);
      bs.dyfull = take(Tr_ * h_);
      bs.dyin = take(T_ * h_);
      bs.du = take(Tr_ * fl_);
      bs.dzfull = take(Tr_ * h_);
      bs.dzin = take(T_ * h_);
      bs.da = take(T_ * h_);
      bs.dc = take(T_ * h_);
      bstash_.push_back(bs);
    }
    const auto V = static_cast<std::size_t>(m_->vocab);
    if (final_) {
      fin_xhat_ = take(T_ * h_);
      fin_rstd_ = take(T_);
      fin_f_ = take(T_ * h_);
      fin_probs_ = take(T_ * V);
      fin_dlogits_ = take(T_ * V);
      fin_df_ = take(T_ * h_);
    }
    if (embed_) emb_grad_ = take(T_ * h_);
    stash_total_ = off;
  }
  static std::span<double> st(std::span<double> stash, std::size_t at, std::size_t n) { return stash.subspan(at, n); }

  const tensor_slot& slot(tensor t, int block) const {
    for (auto const& ts : slots_)
      if (ts.t == t && ts.block == block) return ts;
    throw std::logic_error("transformer_stage: no tensor");
  }
  std::span<const double> P(tensor t, int block) const {
    auto const& ts = slot(t, block);
    return {params_.data() + ts.offset, ts.size()};
  }

  // ---- embedding ----------------------------------------------------------------------------
  void embed_forward(std::span<const double> ids, std::span<double> x) {
    kernels::each(T_ * h_, kernels::embed_elem<double>{ids.data(), P(tensor::E, -1).data(), P(tensor::P, -1).data(), pos_.data(),
                                                        x.data(), h_});
  }

  // ---- one block ----------------------------------------------------------------------------
  void block_forward(int blk, std::span<const double> x, std::span<double> y, std::span<double> stash) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    std::span<double> a(work(2), T_ * h_), qkv_tok(work(3), Tr_ * 3 * hl_), qkv(work(4), Tr_ * 3 * hl_),
        part(work(5), Tr_ * h_), out(work(6), T_ * h_);
    // attention branch
    kernels::ln_forward(x.data(), P(tensor::LN1G, blk).data(), P(tensor::LN1B, blk).data(), a.data(),
                        st(stash, bs.xhat1, T_ * h_).data(), st(stash, bs.rstd1, T_).data(), T_, h_);
    loom::column_parallel_linear<> wqkv{h_, 3 * hl_};
    wqkv.forward(tp_, std::span<const double>(a), st(stash, bs.afull, Tr_ * h_), P(tensor::WQKV, blk), P(tensor::BQKV, blk),
                 qkv_tok);
    to_heads(qkv_tok, qkv);
    std::span<double> o = st(stash, bs.o, Tr_ * hl_);
    att_.forward(std::span<const double>(qkv), o, st(stash, bs.att, att_.stash_size()));
    loom::row_parallel_linear<> wo{hl_, h_};
    wo.forward(tp_, std::span<const double>(o), P(tensor::WO, blk), P(tensor::BO, blk), part, out);
    kernels::each(T_ * h_, kernels::add_elem<double>{x.data(), out.data(), y.data()});  // x1, kept in y
    // MLP branch
    std::span<double> c(work(2), T_ * h_), u(work(3), Tr_ * fl_);
    kernels::ln_forward(y.data(), P(tensor::LN2G, blk).data(), P(tensor::LN2B, blk).data(), c.data(),
                        st(stash, bs.xhat2, T_ * h_).data(), st(stash, bs.rstd2, T_).data(), T_, h_);
    loom::column_parallel_linear<> w1{h_, fl_};
    w1.forward(tp_, std::span<const double>(c), st(stash, bs.cfull, Tr_ * h_), P(tensor::W1, blk), P(tensor::B1, blk), u);
    std::span<double> act = st(stash, bs.act, Tr_ * fl_);
    kernels::each(act.size(), kernels::tanh_elem<double>{u.data(), act.data()});
    loom::row_parallel_linear<> w2{fl_, h_};
    w2.forward(tp_, std::span<const double>(act), P(tensor::W2, blk), P(tensor::B2, blk), part, out);
    kernels::each(T_ * h_, kernels::add_elem<double>{y.data(), out.data(), y.data()});
  }

  //! `g` is the gradient of the block's output; `gx` receives the gradient of its input.
  void block_backward_input(int blk, std::span<const double> g, std::span<double> gx, std::span<double> stash) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    // MLP branch: g is also dz (the gradient of W2's output, this rank's tokens).
    std::span<double> dzin = st(stash, bs.dzin, T_ * h_);
    std::copy(g.begin(), g.end(), dzin.begin());
    loom::row_parallel_linear<> w2{fl_, h_};
    std::span<double> du = st(stash, bs.du, Tr_ * fl_);
    w2.backward_input(tp_, std::span<const double>(dzin), st(stash, bs.dzfull, Tr_ * h_), P(tensor::W2, blk), du);
    std::span<const double> act = st(stash, bs.act, Tr_ * fl_);
    kernels::each(du.size(), kernels::tanh_grad_elem<double>{act.data(), du.data()});
    loom::column_parallel_linear<> w1{h_, fl_};
    std::span<double> dc = st(stash, bs.dc, T_ * h_), scratch(work(5), Tr_ * h_);
    w1.backward_input(tp_, std::span<const double>(du), P(tensor::W1, blk), scratch, dc);
    std::span<double> g1 = st(stash, bs.dyin, T_ * h_);  // the gradient of x1 is dy of the attention branch
    kernels::ln_backward_input(dc.data(), st(stash, bs.xhat2, T_ * h_).data(), st(stash, bs.rstd2, T_).data(),
                               P(tensor::LN2G, blk).data(), g.data(), g1.data(), T_, h_);
    // attention branch
    loom::row_parallel_linear<> wo{hl_, h_};
    std::span<double> dout(work(2), Tr_ * hl_);
    wo.backward_input(tp_, std::span<const double>(g1), st(stash, bs.dyfull, Tr_ * h_), P(tensor::WO, blk), dout);
    std::span<double> dqkv(work(3), Tr_ * 3 * hl_), dqkv_tok = st(stash, bs.dqkv, Tr_ * 3 * hl_);
    att_.backward(std::span<const double>(dout), dqkv, st(stash, bs.att, att_.stash_size()));
    from_heads(dqkv, dqkv_tok);
    loom::column_parallel_linear<> wqkv{h_, 3 * hl_};
    std::span<double> da = st(stash, bs.da, T_ * h_);
    wqkv.backward_input(tp_, std::span<const double>(dqkv_tok), P(tensor::WQKV, blk), scratch, da);
    kernels::ln_backward_input(da.data(), st(stash, bs.xhat1, T_ * h_).data(), st(stash, bs.rstd1, T_).data(),
                               P(tensor::LN1G, blk).data(), g1.data(), gx.data(), T_, h_);
  }

  void block_backward_weight(int blk, std::span<double> stash, double* gw) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    auto G = [&](tensor t) {
      auto const& ts = slot(t, blk);
      return std::span<double>(gw + ts.offset, ts.size());
    };
    loom::row_parallel_linear<> w2{fl_, h_};
    w2.backward_weight(std::span<const double>(st(stash, bs.act, Tr_ * fl_)), std::span<const double>(st(stash, bs.dzfull, Tr_ * h_)),
                       G(tensor::W2));
    kernels::bias_backward(st(stash, bs.dzin, T_ * h_).data(), G(tensor::B2).data(), T_, h_);
    loom::column_parallel_linear<> w1{h_, fl_};
    w1.backward_weight(std::span<const double>(st(stash, bs.cfull, Tr_ * h_)), std::span<const double>(st(stash, bs.du, Tr_ * fl_)),
                       G(tensor::W1), G(tensor::B1));
    kernels::ln_backward_weight(st(stash, bs.dc, T_ * h_).data(), st(stash, bs.xhat2, T_ * h_).data(), G(tensor::LN2G).data(),
                                G(tensor::LN2B).data(), T_, h_);
    loom::row_parallel_linear<> wo{hl_, h_};
    wo.backward_weight(std::span<const double>(st(stash, bs.o, Tr_ * hl_)), std::span<const double>(st(stash, bs.dyfull, Tr_ * h_)),
                       G(tensor::WO));
    kernels::bias_backward(st(stash, bs.dyin, T_ * h_).data(), G(tensor::BO).data(), T_, h_);
    loom::column_parallel_linear<> wqkv{h_, 3 * hl_};
    wqkv.backward_weight(std::span<const double>(st(stash, bs.afull, Tr_ * h_)),
                         std::span<const double>(st(stash, bs.dqkv, Tr_ * 3 * hl_)), G(tensor::WQKV), G(tensor::BQKV));
    kernels::ln_backward_weight(st(stash, bs.da, T_ * h_).data(), st(stash, bs.xhat1, T_ * h_).data(), G(tensor::LN1G).data(),
                                G(tensor::LN1B).data(), T_, h_);
  }

  //! `[tokens][3][heads][d]` (the Q/K/V projection's rows) to `[3][tokens][heads][d]`.
  void to_heads(std::span<const double> tok, std::span<double> heads) const {
    kernels::each(tok.size(), kernels::qkv_layout_elem<double>{tok.data(), heads.data(), Tr_, hl_, true});
  }
  //! The inverse of `to_heads`.
  void from_heads(std::span<const double> heads, std::span<double> tok) const {
    kernels::each(heads.size(), kernels::qkv_layout_elem<double>{heads.data(), tok.data(), Tr_, hl_, false});
  }

  // ---- final layer norm, output projection, loss -------------------------------------------
  const double* targets_of(int mb) const { return targets_->data() + static_cast<std::size_t>(mb) * T_; }

  double final_forward(int mb, std::span<const double> x, std::span<double> stash) {
    const auto V = static_cast<std::size_t>(m_->vocab);
    std::span<double> f = st(stash, fin_f_, T_ * h_), logits(work(2), T_ * V);
    kernels::ln_forward(x.data(), P(tensor::LNFG, -1).data(), P(tensor::LNFB, -1).data(), f.data(),
                        st(stash, fin_xhat_, T_ * h_).data(), st(stash, fin_rstd_, T_).data(), T_, h_);
    loom::linear_kernel::forward<double>(f, P(tensor::WOUT, -1), P(tensor::BOUT, -1), logits, T_, h_, V);
    return kernels::loss_forward(logits.data(), targets_of(mb), st(stash, fin_probs_, T_ * V).data(), T_, V, scale_);
  }
  void final_backward(int mb, double seed, std::span<double> stash, std::span<double> g) {
    const auto V = static_cast<std::size_t>(m_->vocab);
    std::span<double> dl = st(stash, fin_dlogits_, T_ * V), df = st(stash, fin_df_, T_ * h_), zero(work(7), T_ * h_);
    kernels::loss_backward(st(stash, fin_probs_, T_ * V).data(), targets_of(mb), seed, scale_, dl.data(), T_, V);
    loom::linear_kernel::backward_input<double>(dl, P(tensor::WOUT, -1), df, T_, h_, V);
    std::fill(zero.begin(), zero.end(), 0.0);
    kernels::ln_backward_input(df.data(), st(stash, fin_xhat_, T_ * h_).data(), st(stash, fin_rstd_, T_).data(),
                               P(tensor::LNFG, -1).data(), zero.data(), g.data(), T_, h_);
  }
  void final_backward_weight(std::span<double> stash, double* gw) {
    const auto V = static_cast<std::size_t>(m_->vocab);
    auto G = [&](tensor t) {
      auto const& ts = slot(t, -1);
      return std::span<double>(gw + ts.offset, ts.size());
    };
    loom::linear_kernel::backward_weight<double>(st(stash, fin_f_, T_ * h_), st(stash, fin_dlogits_, T_ * V), G(tensor::WOUT),
                                                 G(tensor::BOUT), T_, h_, V);
    kernels::ln_backward_weight(st(stash, fin_df_, T_ * h_).data(), st(stash, fin_xhat_, T_ * h_).data(),
                                G(tensor::LNFG).data(), G(tensor::LNFB).data(), T_, h_);
  }

  const model_spec* m_;
  sharding s_;
  int tpr_, spr_, b0_, b1_;
  bool embed_, final_;
  stage_comms<C> c_;
  const std::vector<double>* targets_;
  double scale_;
  loom::tp_group<C> tp_;
  std::size_t T_, Tr_, h_, hl_, fl_;
  loom::usp_attention<C, double> att_;
  std::vector<tensor_slot> slots_;
  std::vector<loom::grad_range> ranges_;
  std::vector<double> params_, grads_, work_;
  std::vector<int> pos_;  //!< global position of each local token
  std::vector<block_stash> bstash_;
  std::size_t fin_xhat_ = 0, fin_rstd_ = 0, fin_f_ = 0, fin_probs_ = 0, fin_dlogits_ = 0, fin_df_ = 0, emb_grad_ = 0;
  std::size_t stash_total_ = 0;
};

}  // namespace mesh_example
