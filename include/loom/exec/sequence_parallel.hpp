// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Sequence parallelism: the sequence of a microbatch split over ranks, and the attention that
//! still sees all of it. Four patterns (Megatron-SP itself, which splits the sequence over the
//! tensor-parallel group outside its regions, is in `loom/exec/tensor_parallel.hpp`):
//!
//! - **Ulysses** (DeepSpeed-Ulysses, Jacobs et al. 2023, §3): each of `u` ranks holds `N/u` tokens
//!   of all heads; an all-to-all before attention gives each rank all `N` tokens of `H/u` heads,
//!   attention runs locally, and a second all-to-all gives the tokens back. The heads must be
//!   divisible by `u`. Per layer (forward) a rank sends `4 N h / u` elements' worth of all-to-all
//!   input (Q, K, V and the output; the paper's "4Nh/P per link"), of which `(u-1)/u` leaves it.
//! - **Ring attention** (Liu, Zaharia and Abbeel 2023): each of `R` ranks keeps its queries and
//!   passes its keys and values around the ring, `R - 1` times in the forward; each block of
//!   scores is merged into the output with the log-sum-exp update (online softmax, Milakov and
//!   Gimelshein 2018; Dao et al. 2022). With a causal mask the sequence is cut into `2R` chunks
//!   and rank `r` holds chunks `r` and `2R-1-r` (zig-zag, as Brandon et al. 2023's striped
//!   attention and ring-flash-attention balance it): every step then costs every rank two
//!   unmasked chunk blocks (one on the diagonal step) and the masked blocks are skipped, not
//!   computed. The backward passes K/V around again (`R - 1` times) and the K/V gradients once
//!   more (`R` times, the last hop bringing them home).
//! - **USP** (Fang and Zhao 2024, "USP: A Unified Sequence Parallelism Approach"): `sp = u x R`
//!   ranks, Ulysses inside groups of `u` adjacent ranks, ring attention across the `R` groups (each
//!   group's tokens are its ring position's zig-zag chunks, split contiguously over its `u` ranks).
//!   Ulysses alone is `R = 1` and ring attention alone `u = 1`: `usp_attention` is the one
//!   implementation of all three (and, with `u = R = 1`, of plain local attention).
//!
//! Layouts: Q, K, V, O are `[tokens][heads][head_dim]`, the log-sum-exp `[tokens][heads]`.
//! Sums run over their index in increasing order and blocks are merged in a fixed order
//! (documented at `ring_attention`), so deterministic runs are reproducible bit for bit; a
//! single-rank reference that merges the same blocks in the same order reproduces them
//! (`attention_block_forward`/`attention_block_backward` are public for that).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/mesh/mesh.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! The sequence-parallel patterns of this file, plus Megatron-SP (over the tp group).
enum class sp_kind : unsigned char { megatron, ulysses, ring, usp };

//! Name of a kind ("megatron", "ulysses", "ring", "usp").
constexpr std::string_view to_string(sp_kind k) noexcept {
  switch (k) {
    case sp_kind::megatron: return "megatron";
    case sp_kind::ulysses: return "ulysses";
    case sp_kind::ring: return "ring";
    case sp_kind::usp: return "usp";
  }
  return "?";
}

//! USP's default Ulysses degree for `sp` ranks: the largest divisor of `sp` not above sqrt(sp).
constexpr int default_ulysses_degree(int sp) {
  int best = 1;
  for (int d = 1; d * d <= sp; ++d)
    if (sp % d == 0) best = d;
  return best;
}

//! How a sequence of `sequence` tokens is split over `u x ring` ranks (USP's layout; Ulysses is
//! `ring = 1`, ring attention `u = 1`). Rank `r` is ring position `r / u`, Ulysses index `r % u`.
struct seq_split {
  int sequence = 1;  //!< tokens of the whole sequence
  int u = 1;         //!< Ulysses degree
  int ring = 1;      //!< ring degree

  //! Chunks of the sequence: `2 * ring` (zig-zag) when `ring > 1`, else 1.
  constexpr int chunks() const { return ring > 1 ? 2 * ring : 1; }
  //! Tokens per chunk.
  constexpr int chunk_tokens() const { return sequence / chunks(); }
  //! Tokens of one ring position (all its Ulysses ranks together).
  constexpr int position_tokens() const { return sequence / ring; }
  //! Tokens of one rank.
  constexpr int rank_tokens() const { return sequence / (ring * u); }
  //! The chunks of ring position `p`, in local order.
  constexpr std::pair<int, int> position_chunks(int p) const { return {p, 2 * ring - 1 - p}; }
  //! Global position of local token `i` of ring position `p` (its tokens in local order).
  constexpr int position_token(int p, int i) const {
    if (ring == 1) return i;
    const int c = chunk_tokens();
    return i < c ? p * c + i : (2 * ring - 1 - p) * c + (i - c);
  }
  //! Global position of local token `i` of sequence-parallel rank `r`.
  constexpr int token(int r, int i) const { return position_token(r / u, (r % u) * rank_tokens() + i); }

  //! The rule the split breaks for a layer with `heads` attention heads on this rank, or "".
  constexpr text rule(int heads) const {
    if (u < 1 || ring < 1)
      return "sequence parallel: degrees must be positive (ulysses " + detail::to_text(u) + ", ring " +
             detail::to_text(ring) + ")";
    if (heads % u != 0)
      return "ulysses: " + detail::to_text(heads) + " attention heads are not divisible by the Ulysses degree " +
             detail::to_text(u);
    if (sequence % (chunks() * u) != 0) {
      if (ring > 1)
        return "ring attention: the sequence of " + detail::to_text(sequence) + " tokens is not divisible into " +
               detail::to_text(chunks()) + " zig-zag chunks x " + detail::to_text(u) + " Ulysses ranks";
      return "sequence parallel: the sequence of " + detail::to_text(sequence) + " tokens is not divisible by " +
             detail::to_text(u) + " ranks";
    }
    return {};
  }
};

//! Which part of a key chunk a query chunk sees under a causal mask.
enum class block_mask : unsigned char { none, full, causal };

//! The mask between query chunk `qc` and key chunk `kc` (chunks in sequence order).
constexpr block_mask chunk_mask(int qc, int kc, bool causal) {
  if (!causal || kc < qc) return block_mask::full;
  return kc == qc ? block_mask::causal : block_mask::none;
}

//! Sizes of an attention call: `heads` per rank, `head_dim`, the scale of the scores.
struct attention_dims {
  int heads = 1;       //!< heads in the tensors
  int head_dim = 1;    //!< features per head
  double scale = 1.0;  //!< scores are scale * q . k (usually 1/sqrt(head_dim))
};

//! One block of attention, merged into a running output: query rows `[q0, q0 + nq)` of `q`
//! against key/value rows `[k0, k0 + nk)` of `k`, `v` (with `block_mask::causal`, row `i` sees
//! keys up to `k0 + (i - q0)`). For each row and head the block's softmax output `o_b` and
//! log-sum-exp `l_b` are merged into `o`, `lse` by `l = log(e^lse + e^l_b)`,
//! `o = o e^(lse - l) + o_b e^(l_b - l)`; start with `lse = -inf`, `o = 0` (the first merge is
//! exact). `scratch` holds `nk` values.
template <class T>
void attention_block_forward(const attention_dims& a, std::span<const T> q, std::span<const T> k, std::span<const T> v,
                             std::span<T> o, std::span<T> lse, int q0, int nq, int k0, int nk, block_mask mask,
                             std::span<T> scratch) {
  const auto H = static_cast<std::size_t>(a.heads), D = static_cast<std::size_t>(a.head_dim);
  const T scale = static_cast<T>(a.scale);
  std::vector<T> ob(D);
  for (int i = 0; i < nq; ++i) {
    const auto qi = static_cast<std::size_t>(q0 + i);
    const int visible = mask == block_mask::causal ? i + 1 : nk;
    for (std::size_t h = 0; h < H; ++h) {
      const T* qv = q.data() + (qi * H + h) * D;
      T m = -std::numeric_limits<T>::infinity();
      for (int j = 0; j < visible; ++j) {
        const T* kv = k.data() + (static_cast<std::size_t>(k0 + j) * H + h) * D;
        T s{};
        for (std::size_t d = 0; d < D; ++d) s += qv[d] * kv[d];
        s *= scale;
        scratch[static_cast<std::size_t>(j)] = s;
        m = std::max(m, s);
      }
      T l{};
      std::fill(ob.begin(), ob.end(), T{});
      for (int j = 0; j < visible; ++j) {
        const T p = std::exp(scratch[static_cast<std::size_t>(j)] - m);
        l += p;
        const T* vv = v.data() + (static_cast<std::size_t>(k0 + j) * H + h) * D;
        for (std::size_t d = 0; d < D; ++d) ob[d] += p * vv[d];
      }
      const T lb = m + std::log(l);
      T& L = lse[qi * H + h];
      const T mx = std::max(L, lb);
      const T nl = mx + std::log(std::exp(L - mx) + std::exp(lb - mx));
      const T wa = std::exp(L - nl), wb = std::exp(lb - nl);
      T* ov = o.data() + (qi * H + h) * D;
      for (std::size_t d = 0; d < D; ++d) ov[d] = ov[d] * wa + (ob[d] / l) * wb;
      L = nl;
    }
  }
}

//! `delta[i][h] = sum_d do[i][h][d] o[i][h][d]`, the row term of the attention backward.
template <class T>
void attention_delta(const attention_dims& a, std::span<const T> o, std::span<const T> dout, std::span<T> delta) {
  const auto H = static_cast<std::size_t>(a.heads), D = static_cast<std::size_t>(a.head_dim);
  for (std::size_t r = 0; r < delta.size(); ++r) {
    T s{};
    for (std::size_t d = 0; d < D; ++d) s += dout[r * D + d] * o[r * D + d];
    delta[r] = s;
    (void)H;
  }
}

//! The backward of one block (FlashAttention's, Dao et al. 2022, Alg. 4, with the final
//! log-sum-exp): for each visible pair, `p = e^(scale q.k - lse)`, `dv += p do`,
//! `ds = p (do.v - delta)`, `dq += scale ds k`, `dk += scale ds q`, rows in order, keys in order.
//! `dq`, `dk`, `dv` may be empty to skip that gradient (a reference that needs another order of
//! accumulation calls it twice).
template <class T>
void attention_block_backward(const attention_dims& a, std::span<const T> q, std::span<const T> k, std::span<const T> v,
                              std::span<const T> lse, std::span<const T> dout, std::span<const T> delta, std::span<T> dq,
                              std::span<T> dk, std::span<T> dv, int q0, int nq, int k0, int nk, block_mask mask) {
  const auto H = static_cast<std::size_t>(a.heads), D = static_cast<std::size_t>(a.head_dim);
  const T scale = static_cast<T>(a.scale);
  for (int i = 0; i < nq; ++i) {
    const auto qi = static_cast<std::size_t>(q0 + i);
    const int visible = mask == block_mask::causal ? i + 1 : nk;
    for (std::size_t h = 0; h < H; ++h) {
      const T* qv = q.data() + (qi * H + h) * D;
      const T* dov = dout.data() + (qi * H + h) * D;
      for (int j = 0; j < visible; ++j) {
        const auto kj = static_cast<std::size_t>(k0 + j);
        const T* kv = k.data() + (kj * H + h) * D;
        const T* vv = v.data() + (kj * H + h) * D;
        T s{};
        for (std::size_t d = 0; d < D; ++d) s += qv[d] * kv[d];
        const T p = std::exp(s * scale - lse[qi * H + h]);
        T dp{};
        for (std::size_t d = 0; d < D; ++d) dp += dov[d] * vv[d];
        const T ds = p * (dp - delta[qi * H + h]);
        if (!dv.empty())
          for (std::size_t d = 0; d < D; ++d) dv[(kj * H + h) * D + d] += p * dov[d];
        if (!dq.empty())
          for (std::size_t d = 0; d < D; ++d) dq[(qi * H + h) * D + d] += scale * ds * kv[d];
        if (!dk.empty())
          for (std::size_t d = 0; d < D; ++d) dk[(kj * H + h) * D + d] += scale * ds * qv[d];
      }
    }
  }
  (void)nk;
}

//! Ring attention over the ranks of `ring` (see the file comment), for this rank's `2` zig-zag
//! chunks (or, on a ring of one, its whole sequence as one chunk). Order of merging, which a
//! reference must follow to be bitwise equal: ring position `p` holds chunks `(p, 2R-1-p)`; at
//! step `s = 0..R-1` it holds the keys of position `(p - s) mod R`; for each of its query chunks
//! (lower first) the key chunks of that step (lower first) are merged in, skipping masked ones.
//! The gradient of a key chunk of position `p` accumulates on positions `p, p+1, ..., p-1` in
//! that order (it travels with the keys). Messages go to `(p+1) mod R`, from `(p-1) mod R`: K and
//! V together (`2 x tokens x heads x head_dim`) `R-1` times in the forward and the backward, and
//! their gradients `R` times in the backward.
template <class C, class T>
class ring_attention {
 public:
  //! A ring attention on `ring` for `tokens` tokens of this rank (two equal zig-zag chunks when
  //! the ring has more than one rank), `dims` heads and head size.
  ring_attention(C* ring, int tokens, attention_dims dims, bool causal)
      : c_(ring), R_(ring == nullptr ? 1 : ring->size()), pos_(ring == nullptr ? 0 : ring->rank()), T_(tokens),
        a_(dims), causal_(causal) {
    if (R_ > 1 && tokens % 2 != 0)
      throw config_error("ring attention: " + std::to_string(tokens) + " tokens per rank cannot form two zig-zag chunks");
    const auto n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) * static_cast<std::size_t>(dims.head_dim);
    kv_.assign(2 * n, T{});
    kv_next_.assign(2 * n, T{});
    if (R_ > 1) {
      dkv_.assign(2 * n, T{});
      dkv_next_.assign(2 * n, T{});
    }
    scratch_.assign(static_cast<std::size_t>(tokens), T{});
    elems_ = n;
  }

  //! Chunk blocks skipped (fully masked) in the last forward.
  int skipped_blocks() const { return skipped_; }
  //! Chunk blocks computed in the last forward.
  int computed_blocks() const { return computed_; }

  //! `o` and `lse` (log-sum-exp per row and head) of this rank's queries over the whole sequence.
  void forward(std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<T> o, std::span<T> lse) {
    std::fill(o.begin(), o.end(), T{});
    std::fill(lse.begin(), lse.end(), -std::numeric_limits<T>::infinity());
    std::copy(k.begin(), k.end(), kv_.begin());
    std::copy(v.begin(), v.end(), kv_.begin() + static_cast<std::ptrdiff_t>(elems_));
    skipped_ = computed_ = 0;
    for (int s = 0; s < R_; ++s) {
      typename C::request rr{}, sr{};
      if (s + 1 < R_) {
        rr = c_->irecv(prev(), std::as_writable_bytes(std::span<T>(kv_next_)));
        sr = c_->isend(next(), std::as_bytes(std::span<const T>(kv_)));
      }
      for_blocks(s, true, [&](int q0, int k0, int n, block_mask m) {
        attention_block_forward<T>(a_, q, kview(), vview(), o, lse, q0, n, k0, n, m, scratch_);
      });
      if (s + 1 < R_) {
        c_->wait(rr);
        c_->wait(sr);
        std::swap(kv_, kv_next_);
      }
    }
  }

  //! Gradients of this rank's `q`, `k`, `v` (overwritten) given the forward's `o`, `lse` and the
  //! output gradient `dout`.
  void backward(std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<const T> o,
                std::span<const T> lse, std::span<const T> dout, std::span<T> dq, std::span<T> dk, std::span<T> dv) {
    delta_.assign(lse.size(), T{});
    attention_delta<T>(a_, o, dout, delta_);
    std::fill(dq.begin(), dq.end(), T{});
    std::copy(k.begin(), k.end(), kv_.begin());
    std::copy(v.begin(), v.end(), kv_.begin() + static_cast<std::ptrdiff_t>(elems_));
    std::vector<T>& acc = R_ > 1 ? dkv_ : kv_next_;  // one rank: accumulate in place
    std::fill(acc.begin(), acc.end(), T{});
    for (int s = 0; s < R_; ++s) {
      typename C::request rr{}, sr{}, gr{}, gs{};
      if (s + 1 < R_) {
        rr = c_->irecv(prev(), std::as_writable_bytes(std::span<T>(kv_next_)));
        sr = c_->isend(next(), std::as_bytes(std::span<const T>(kv_)));
      }
      std::vector<T>& g = R_ > 1 ? dkv_ : kv_next_;
      std::span<T> gk(g.data(), elems_), gv(g.data() + elems_, elems_);
      for_blocks(s, false, [&](int q0, int k0, int n, block_mask m) {
        attention_block_backward<T>(a_, q, kview(), vview(), lse, dout, delta_, dq, gk, gv, q0, n, k0, n, m);
      });
      if (R_ > 1) {
        gr = c_->irecv(prev(), std::as_writable_bytes(std::span<T>(dkv_next_)));
        gs = c_->isend(next(), std::as_bytes(std::span<const T>(dkv_)));
      }
      if (s + 1 < R_) {
        c_->wait(rr);
        c_->wait(sr);
      }
      if (R_ > 1) {
        c_->wait(gr);
        c_->wait(gs);
        std::swap(dkv_, dkv_next_);
      }
      if (s + 1 < R_) std::swap(kv_, kv_next_);
    }
    const std::vector<T>& g = R_ > 1 ? dkv_ : kv_next_;
    std::copy(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(elems_), dk.begin());
    std::copy(g.begin() + static_cast<std::ptrdiff_t>(elems_), g.end(), dv.begin());
  }

 private:
  int prev() const { return (pos_ + R_ - 1) % R_; }
  int next() const { return (pos_ + 1) % R_; }
  std::span<const T> kview() const { return {kv_.data(), elems_}; }
  std::span<const T> vview() const { return {kv_.data() + elems_, elems_}; }

  //! Calls `f(q0, k0, rows, mask)` for the unmasked chunk blocks of step `s`, in merge order
  //! (counting them when `count`).
  template <class F>
  void for_blocks(int s, bool count, F&& f) {
    if (R_ == 1) {
      computed_ += count ? 1 : 0;
      f(0, 0, T_, causal_ ? block_mask::causal : block_mask::full);
      return;
    }
    const int c = T_ / 2, src = (pos_ - s + R_) % R_;
    const int qch[2] = {pos_, 2 * R_ - 1 - pos_}, kch[2] = {src, 2 * R_ - 1 - src};
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb) {
        const block_mask m = chunk_mask(qch[qa], kch[kb], causal_);
        if (m == block_mask::none) {
          skipped_ += count ? 1 : 0;
          continue;
        }
        computed_ += count ? 1 : 0;
        f(qa * c, kb * c, c, m);
      }
  }

  C* c_;
  int R_, pos_, T_;
  attention_dims a_;
  bool causal_;
  std::size_t elems_ = 0;
  std::vector<T> kv_, kv_next_, dkv_, dkv_next_, scratch_, delta_;
  int skipped_ = 0, computed_ = 0;
};

//! Ulysses' all-to-alls over `c` (`u` ranks). `scatter_heads`: `in` holds `count` tensors
//! `[tokens][heads][head_dim]` of this rank's tokens; `out` receives `count` tensors
//! `[u x tokens][heads/u][head_dim]`: every rank's tokens (in rank order) of this rank's group of
//! heads. `gather_heads` is its inverse (and each is the other's backward).
template <class C, class T>
class ulysses {
 public:
  //! Ulysses over `c` (null or one rank: the identity) for `count` tensors of `tokens` tokens.
  ulysses(C* c, int count, int tokens, int heads, int head_dim)
      : c_(c), u_(c == nullptr ? 1 : c->size()), n_(count), t_(tokens), h_(heads), d_(head_dim) {
    if (heads % u_ != 0)
      throw config_error("ulysses: " + std::to_string(heads) + " attention heads are not divisible by the Ulysses degree " +
                         std::to_string(u_));
    const auto size = static_cast<std::size_t>(count) * static_cast<std::size_t>(tokens) * static_cast<std::size_t>(heads) *
                      static_cast<std::size_t>(head_dim);
    send_.assign(size, T{});
    recv_.assign(size, T{});
  }

  //! Heads to tokens (see the class comment).
  void scatter_heads(std::span<const T> in, std::span<T> out) {
    if (u_ == 1) return copy(in, out);
    const std::size_t hg = static_cast<std::size_t>(h_ / u_), D = static_cast<std::size_t>(d_), t = static_cast<std::size_t>(t_),
                      n = static_cast<std::size_t>(n_), H = static_cast<std::size_t>(h_);
    // send segment j = [count][tokens][head group j][head_dim]
    std::size_t w = 0;
    for (std::size_t j = 0; j < static_cast<std::size_t>(u_); ++j)
      for (std::size_t x = 0; x < n; ++x)
        for (std::size_t i = 0; i < t; ++i)
          for (std::size_t h = 0; h < hg; ++h)
            for (std::size_t d = 0; d < D; ++d) send_[w++] = in[((x * t + i) * H + j * hg + h) * D + d];
    c_->all_to_all(std::span<const T>(send_), std::span<T>(recv_));
    // recv segment j = rank j's tokens of this head group: out[x][j*t + i][h][d]
    w = 0;
    for (std::size_t j = 0; j < static_cast<std::size_t>(u_); ++j)
      for (std::size_t x = 0; x < n; ++x)
        for (std::size_t i = 0; i < t; ++i)
          for (std::size_t h = 0; h < hg; ++h)
            for (std::size_t d = 0; d < D; ++d)
              out[((x * t * static_cast<std::size_t>(u_) + j * t + i) * hg + h) * D + d] = recv_[w++];
  }

  //! Tokens to heads: the inverse of `scatter_heads`.
  void gather_heads(std::span<const T> in, std::span<T> out) {
    if (u_ == 1) return copy(in, out);
    const std::size_t hg = static_cast<std::size_t>(h_ / u_), D = static_cast<std::size_t>(d_), t = static_cast<std::size_t>(t_),
                      n = static_cast<std::size_t>(n_), H = static_cast<std::size_t>(h_), U = static_cast<std::size_t>(u_);
    std::size_t w = 0;
    for (std::size_t j = 0; j < U; ++j)
      for (std::size_t x = 0; x < n; ++x)
        for (std::size_t i = 0; i < t; ++i)
          for (std::size_t h = 0; h < hg; ++h)
            for (std::size_t d = 0; d < D; ++d) send_[w++] = in[((x * t * U + j * t + i) * hg + h) * D + d];
    c_->all_to_all(std::span<const T>(send_), std::span<T>(recv_));
    w = 0;
    for (std::size_t j = 0; j < U; ++j)
      for (std::size_t x = 0; x < n; ++x)
        for (std::size_t i = 0; i < t; ++i)
          for (std::size_t h = 0; h < hg; ++h)
            for (std::size_t d = 0; d < D; ++d) out[((x * t + i) * H + j * hg + h) * D + d] = recv_[w++];
  }

 private:
  static void copy(std::span<const T> in, std::span<T> out) {
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }
  C* c_;
  int u_, n_, t_, h_, d_;
  std::vector<T> send_, recv_;
};

//! USP attention (see the file comment): Ulysses over `ulysses_comm` (`u` ranks), ring attention
//! over `ring_comm` (`R` ranks) on the ring position's tokens (`u x tokens`, its two zig-zag
//! chunks) for `heads / u` heads. Either communicator may be null (degree 1). `forward` keeps in
//! `stash` (`stash_size()` elements) what `backward` needs.
template <class C, class T>
class usp_attention {
 public:
  //! Attention over `tokens` tokens of this rank, `dims.heads` heads on this rank.
  usp_attention(C* ulysses_comm, C* ring_comm, int tokens, attention_dims dims, bool causal)
      : u_(ulysses_comm == nullptr ? 1 : ulysses_comm->size()),
        t_(tokens),
        dims_(dims),
        inner_{dims.heads / u_, dims.head_dim, dims.scale},
        a2a3_(ulysses_comm, 3, tokens, dims.heads, dims.head_dim),
        a2a1_(ulysses_comm, 1, tokens, dims.heads, dims.head_dim),
        ring_(ring_comm, tokens * u_, inner_, causal) {
    n_ = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dims.heads) * static_cast<std::size_t>(dims.head_dim);
    packed_.assign(3 * n_, T{});
    grads_.assign(3 * n_, T{});
  }

  //! Elements of the per-call stash: Q, K, V, O and the log-sum-exp in the ring's layout.
  std::size_t stash_size() const { return 4 * n_ + lse_size(); }
  //! The ring attention inside (for its block counts).
  const ring_attention<C, T>& ring() const { return ring_; }

  //! `qkv` is `[3][tokens][heads][head_dim]` (Q, K, V of this rank's tokens); `o` receives
  //! `[tokens][heads][head_dim]`.
  void forward(std::span<const T> qkv, std::span<T> o, std::span<T> stash) {
    std::span<T> s3 = stash.subspan(0, 3 * n_), so = stash.subspan(3 * n_, n_), sl = stash.subspan(4 * n_, lse_size());
    a2a3_.scatter_heads(qkv, s3);
    ring_.forward(s3.subspan(0, n_), s3.subspan(n_, n_), s3.subspan(2 * n_, n_), so, sl);
    a2a1_.gather_heads(std::span<const T>(so), o);
  }

  //! `dqkv` (`[3][tokens][heads][head_dim]`) receives the gradients of Q, K, V given `dout`.
  void backward(std::span<const T> dout, std::span<T> dqkv, std::span<const T> stash) {
    std::span<const T> s3 = stash.subspan(0, 3 * n_), so = stash.subspan(3 * n_, n_), sl = stash.subspan(4 * n_, lse_size());
    std::span<T> dos(packed_.data(), n_);
    a2a1_.scatter_heads(dout, dos);
    std::span<T> g(grads_);
    ring_.backward(s3.subspan(0, n_), s3.subspan(n_, n_), s3.subspan(2 * n_, n_), so, sl, dos, g.subspan(0, n_),
                   g.subspan(n_, n_), g.subspan(2 * n_, n_));
    a2a3_.gather_heads(std::span<const T>(grads_), dqkv);
  }

 private:
  std::size_t lse_size() const { return static_cast<std::size_t>(t_) * static_cast<std::size_t>(dims_.heads); }

  int u_, t_;
  attention_dims dims_, inner_;
  ulysses<C, T> a2a3_, a2a1_;
  ring_attention<C, T> ring_;
  std::size_t n_ = 0;
  std::vector<T> packed_, grads_;
};

//! The sizes of a transformer layer that tensor and sequence parallelism split.
struct layer_shape {
  int sequence = 1;  //!< tokens per sequence
  int heads = 1;     //!< attention heads
  int ffn = 1;       //!< MLP hidden features
};

//! The rule a layer of shape `l` breaks on `tp` tensor-parallel ranks with its sequence split by
//! `kind` over `sp` ranks (Megatron-SP over the tp ranks; USP as `ulysses` x `sp / ulysses`,
//! `ulysses = 0` for `default_ulysses_degree`), or "". One sentence naming the values.
constexpr text sharding_rule(layer_shape l, int tp, int sp, sp_kind kind, int ulysses = 0) {
  if (text r = tp_rule(tp, l.heads, l.ffn); !r.empty()) return r;
  if (sp < 1) return "sequence parallel: sp " + detail::to_text(sp) + " is not a positive number of ranks";
  const int heads = l.heads / tp;
  switch (kind) {
    case sp_kind::megatron:
      if (l.sequence % tp != 0)
        return "megatron sequence parallel: the sequence of " + detail::to_text(l.sequence) + " tokens is not divisible by tp " +
               detail::to_text(tp);
      return {};
    case sp_kind::ulysses: return seq_split{l.sequence, sp, 1}.rule(heads);
    case sp_kind::ring: return seq_split{l.sequence, 1, sp}.rule(heads);
    case sp_kind::usp: {
      const int u = ulysses == 0 ? default_ulysses_degree(sp) : ulysses;
      if (u < 1 || sp % u != 0)
        return "usp: the Ulysses degree " + detail::to_text(u) + " does not divide sp " + detail::to_text(sp);
      return seq_split{l.sequence, u, sp / u}.rule(heads);
    }
  }
  return {};
}

//! Compile-time check of a layer of shape `L` on the static mesh `Mesh` (its `tp` and `sp` sizes)
//! with the sequence split by `Kind`: a shape the split cannot divide does not compile, and the
//! diagnostic carries `sharding_rule`'s sentence ("ulysses: 6 attention heads are not divisible by
//! the Ulysses degree 4").
template <layer_shape L, class Mesh, sp_kind Kind, int Ulysses = 0>
struct static_sharding {
  static_assert(Mesh::is_static, "loom::static_sharding needs a mesh of static dimensions");
  //! The rule broken, or empty.
  static constexpr detail::fixed_message rule{sharding_rule(L, Mesh{}.size(dim::tp), Mesh{}.size(dim::sp), Kind, Ulysses)};
  [[no_unique_address]] detail::mesh_rule_violated<rule> check_{};
  //! True (the type exists only when the check passed).
  static constexpr bool ok = true;
};

}  // namespace loom
