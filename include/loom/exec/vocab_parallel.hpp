// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The vocabulary-parallel input and output layers (Yeung, Qi, Lin, Wan, "Balancing Pipeline
//! Parallelism with Vocabulary Parallelism", MLSys 2025) as patterns over users' kernels: every
//! rank holds the same contiguous rows of both tables (`vocab_shard`, from
//! `loom::split_vocabulary`), runs the passes of `loom/schedule/vocab.hpp` on them, and the
//! ranks exchange small per-token statistics instead of logits.
//!
//! Tokens are `n` per microbatch, hidden width `h`, the shard `rows` wide; the output table `W`
//! and the input table `E` are `[rows][h]` row-major on each rank; activations token-major.
//!
//! **Input layer.** `IF`: the shard's rows of the tokens it holds, zeros for the others
//! (`vocab_input_layer::forward`); the first stage's input is the sum of every rank's part, which
//! is exact (each token has one non-zero term), so it equals the unsplit lookup bit for bit.
//! `IB`: the shard's rows receive the tokens' gradients, in token order (`backward`), as the
//! unsplit scatter-add does to the same rows.
//!
//! **Output layer** (`vocab_output_layer`), with the online softmax of Milakov and Gimelshein
//! (2018) across shards; for token t with logits l over the whole vocabulary and target y:
//! - `S`: the shard's logits `l_r = X W_r^T` (the kernel's product), their maximum
//!   `m_r = max_v l_rv`, `s_r = sum_v exp(l_rv - m_r)` (in row order) and `z_r` = the target's
//!   logit if the shard holds it, else 0 (`statistics`); `e_rv = exp(l_rv - m_r)` stays in the
//!   pass's stash until `T`. The three per-token numbers are what a rank sends.
//! - combination (`combine`, every rank's statistics in rank order): `M = max_r m_r`,
//!   `sigma = sum_r s_r exp(m_r - M)` in rank order, `z = sum_r z_r`; the token's loss is
//!   `log(sigma) + M - z`, i.e. `-log softmax(l)_y`.
//! - `T`: with the per-token loss gradient `dl` (the loss scale), the logits' gradient
//!   `g_rv = (e_rv exp(m_r - M) / sigma - [v = y]) dl`, the shard's weight gradient
//!   `dW_r += g_r^T X` (the kernel) and, in Algorithm 1, the partial input gradient
//!   `dX_r = g_r W_r` (the kernel), summed over the ranks in rank order.
//! - Algorithm 2 (backward fusion) forms the input gradient in `S` instead, before the global
//!   statistics exist: `G_r = (e_r / s_r) W_r` and `Y_r = W_r[y]` (0 where the shard does not hold
//!   y); then `dX = dl (sum_r a_r G_r - sum_r Y_r)` with `a_r = s_r exp(m_r - M) / sigma`
//!   (`fused_input_gradient`), which is `g W` regrouped.
//!
//! Split sums are grouped by shard, so the results equal the unsplit layer up to rounding
//! (tests: 1e-12 relative in double), and are the same bits on every rank and every run. The
//! math is loom's own; the authors' implementation (`vocab_output.py` and `cross_entropy.py` in
//! sail-sg/VocabularyParallelism at 6191c3bf) was read for the pass split, not copied.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "loom/exec/pattern_math.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! One rank's rows of the vocabulary: ids `[first, first + rows)` of both tables, `hidden` wide.
struct vocab_shard {
  std::int64_t first = 0;   //!< the first vocabulary id the shard holds
  std::size_t rows = 0;     //!< ids held (padding rows included)
  std::size_t hidden = 0;   //!< h, the width of a row
  //! True when the shard holds id `v`.
  constexpr bool holds(std::int64_t v) const { return v >= first && v < first + static_cast<std::int64_t>(rows); }
};

//! The shard of rank `r` of `p` over a padded vocabulary of `padded` ids (`split_vocabulary`'s
//! `padded`), `hidden` wide; throws `config_error` when `padded` does not split into p equal shards.
inline vocab_shard shard_of(std::int64_t padded, int p, int r, std::size_t hidden) {
  if (p < 1 || r < 0 || r >= p || padded < p || padded % p != 0)
    throw config_error("vocabulary parallelism: a vocabulary of " + std::to_string(padded) + " ids does not split into " + std::to_string(p) +
                       " equal shards for rank " + std::to_string(r) + " (pad it with loom::split_vocabulary)");
  const std::int64_t rows = padded / p;
  return {.first = rows * r, .rows = static_cast<std::size_t>(rows), .hidden = hidden};
}

//! The per-token statistics of one shard (what `S` sends), `[3][n]`: the maxima `m`, the sums
//! `s` of `exp(l - m)`, the target logits `z` (0 where the shard does not hold the target).
template <class T>
struct vocab_statistics {
  std::span<T> data;  //!< `3 n` values: m, then s, then z
  std::size_t n = 0;  //!< tokens
  //! The maxima.
  std::span<T> m() const { return data.subspan(0, n); }
  //! The sums of exponentials.
  std::span<T> s() const { return data.subspan(n, n); }
  //! The target logits.
  std::span<T> z() const { return data.subspan(2 * n, n); }
  //! The same statistics, read-only.
  operator vocab_statistics<const T>() const
    requires(!std::is_const_v<T>)
  {
    return {data, n};
  }
};

namespace detail {

template <class I>
void check_targets(std::span<const I> targets, std::size_t n, const char* what) {
  if (targets.size() != n)
    throw config_error(std::string("vocabulary parallelism: ") + what + " got " + std::to_string(targets.size()) + " token ids for " +
                       std::to_string(n) + " tokens");
}

}  // namespace detail

//! The vocabulary-parallel input layer on one shard (see the file comment).
struct vocab_input_layer {
  vocab_shard shard;  //!< the rows this rank holds

  //! `IF`: `part[t] = E[ids[t] - first]` for the tokens the shard holds, 0 for the others
  //! (`part` `[n][h]`, `table` `[rows][h]`).
  template <class T, class I>
  void forward(std::span<const I> ids, std::span<const T> table, std::span<T> part) const {
    const std::size_t h = shard.hidden;
    detail::check_targets(ids, part.size() / h, "the input layer");
    for (std::size_t t = 0; t < ids.size(); ++t) {
      const std::int64_t v = static_cast<std::int64_t>(ids[t]);
      for (std::size_t i = 0; i < h; ++i)
        part[t * h + i] = shard.holds(v) ? table[static_cast<std::size_t>(v - shard.first) * h + i] : T{};
    }
  }
  //! `IB`: `grad[ids[t] - first] += d[t]` for the tokens the shard holds, in token order.
  template <class T, class I>
  void backward(std::span<const I> ids, std::span<const T> d, std::span<T> grad) const {
    const std::size_t h = shard.hidden;
    detail::check_targets(ids, d.size() / h, "the input layer's backward");
    for (std::size_t t = 0; t < ids.size(); ++t) {
      const std::int64_t v = static_cast<std::int64_t>(ids[t]);
      if (!shard.holds(v)) continue;
      for (std::size_t i = 0; i < h; ++i) grad[static_cast<std::size_t>(v - shard.first) * h + i] += d[t * h + i];
    }
  }
};

//! The vocabulary-parallel output layer with the cross-entropy loss on one shard (see the file
//! comment). `Kernel` computes the three products (`linear_kernel`'s signatures); the per-token
//! and per-logit work runs in host loops in a fixed order.
template <class Kernel = linear_kernel>
struct vocab_output_layer {
  vocab_shard shard;  //!< the rows this rank holds
  Kernel kernel{};    //!< the shard's products (a device kernel carries its stream)

  //! Elements of `S`'s stash per microbatch of `n` tokens: the exponentials `e`, `[n][rows]`.
  std::size_t stash_size(std::size_t n) const { return n * shard.rows; }

  //! `S`: the shard's logits of `x` (`[n][h]`) into `e` (`[n][rows]`, left holding
  //! `exp(l - m)`), and the statistics `st` against the targets.
  template <class T, class I>
  void forward(std::span<const T> x, std::type_identity_t<std::span<const T>> w, std::span<const I> targets, std::type_identity_t<std::span<T>> e,
               std::type_identity_t<vocab_statistics<T>> st) const {
    const std::size_t n = st.n, rows = shard.rows;
    detail::check_targets(targets, n, "the output layer");
    kernel.forward(x, w, std::span<const T>{}, e, n, shard.hidden, rows);
    for (std::size_t t = 0; t < n; ++t) {
      std::span<T> row = e.subspan(t * rows, rows);
      T m = row[0];
      for (std::size_t v = 1; v < rows; ++v) m = device_math::max(m, row[v]);
      const std::int64_t y = static_cast<std::int64_t>(targets[t]);
      st.z()[t] = shard.holds(y) ? row[static_cast<std::size_t>(y - shard.first)] : T{};
      T s{};
      for (std::size_t v = 0; v < rows; ++v) {
        row[v] = device_math::exp(row[v] - m);
        s += row[v];
      }
      st.m()[t] = m;
      st.s()[t] = s;
    }
  }

  //! Every rank's statistics (`all[r]`, rank order) into the global ones `out` (m: the maximum M,
  //! s: sigma, z: the target's logit); returns nothing, see `loss`.
  template <class T>
  static void combine(std::span<const vocab_statistics<T>> all, std::type_identity_t<vocab_statistics<T>> out) {
    const std::size_t n = out.n;
    for (std::size_t t = 0; t < n; ++t) {
      T big = all[0].m()[t];
      for (std::size_t r = 1; r < all.size(); ++r) big = device_math::max(big, all[r].m()[t]);
      T sigma{}, z{};
      for (std::size_t r = 0; r < all.size(); ++r) {
        sigma += all[r].s()[t] * device_math::exp(all[r].m()[t] - big);
        z += all[r].z()[t];
      }
      out.m()[t] = big;
      out.s()[t] = sigma;
      out.z()[t] = z;
    }
  }

  //! The sum over the tokens of `-log softmax(l)_y` from the global statistics, in token order.
  template <class T>
  static T loss(vocab_statistics<T> global) {
    T sum{};
    for (std::size_t t = 0; t < global.n; ++t) sum += device_math::log(global.s()[t]) + global.m()[t] - global.z()[t];
    return sum;
  }

  //! `T`: turns `e` (as `forward` left it) into the logits' gradient `g` scaled by `dl`, adds the
  //! shard's weight gradient `g^T x` into `gw` (`[rows][h]`) and, when `dx` is not empty
  //! (Algorithm 1), writes the shard's partial input gradient `g w` there (`[n][h]`).
  template <class T, class I>
  void backward(std::span<const T> x, std::type_identity_t<std::span<const T>> w, std::span<const I> targets, std::type_identity_t<std::span<T>> e,
                std::type_identity_t<vocab_statistics<const T>> own, std::type_identity_t<vocab_statistics<const T>> global, std::type_identity_t<T> dl,
                std::type_identity_t<std::span<T>> gw, std::type_identity_t<std::span<T>> dx) const {
    const std::size_t n = global.n, rows = shard.rows;
    detail::check_targets(targets, n, "the output layer's backward");
    for (std::size_t t = 0; t < n; ++t) {
      const T scale = device_math::exp(own.m()[t] - global.m()[t]) / global.s()[t];
      const std::int64_t y = static_cast<std::int64_t>(targets[t]);
      for (std::size_t v = 0; v < rows; ++v) {
        T p = e[t * rows + v] * scale;
        if (shard.holds(y) && static_cast<std::size_t>(y - shard.first) == v) p -= T{1};
        e[t * rows + v] = p * dl;
      }
    }
    const std::span<const T> g(e.data(), e.size());
    kernel.backward_weight(x, g, gw, std::span<T>{}, n, shard.hidden, rows);
    if (!dx.empty()) kernel.backward_input(g, w, dx, n, shard.hidden, rows);
  }

  //! Algorithm 2's part of `S`: `gpart = (e / s) w` and `ypart = w[y]` (0 where the shard does not
  //! hold y), both `[n][h]`; `scratch` holds `[n][rows]` elements.
  template <class T, class I>
  void input_gradient_parts(std::span<const T> w, std::span<const I> targets, std::type_identity_t<std::span<const T>> e,
                            std::type_identity_t<vocab_statistics<const T>> own, std::type_identity_t<std::span<T>> scratch,
                            std::type_identity_t<std::span<T>> gpart, std::type_identity_t<std::span<T>> ypart) const {
    const std::size_t n = own.n, rows = shard.rows, h = shard.hidden;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t v = 0; v < rows; ++v) scratch[t * rows + v] = e[t * rows + v] / own.s()[t];
    kernel.backward_input(std::span<const T>(scratch.data(), scratch.size()), w, gpart, n, h, rows);
    for (std::size_t t = 0; t < n; ++t) {
      const std::int64_t y = static_cast<std::int64_t>(targets[t]);
      for (std::size_t i = 0; i < h; ++i) ypart[t * h + i] = shard.holds(y) ? w[static_cast<std::size_t>(y - shard.first) * h + i] : T{};
    }
  }

  //! Algorithm 2's input gradient from every rank's parts and statistics (rank order):
  //! `dx = dl (sum_r a_r gpart_r - sum_r ypart_r)`, `a_r = s_r exp(m_r - M) / sigma`.
  template <class T>
  static void fused_input_gradient(std::span<const std::span<const T>> gparts, std::span<const std::span<const T>> yparts,
                                   std::span<const vocab_statistics<T>> all, std::type_identity_t<vocab_statistics<const T>> global,
                                   std::type_identity_t<T> dl, std::type_identity_t<std::span<T>> dx) {
    const std::size_t n = global.n, h = dx.size() / n;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < h; ++i) {
        T a{}, y{};
        for (std::size_t r = 0; r < all.size(); ++r) {
          const T alpha = all[r].s()[t] * device_math::exp(all[r].m()[t] - global.m()[t]) / global.s()[t];
          a += alpha * gparts[r][t * h + i];
          y += yparts[r][t * h + i];
        }
        dx[t * h + i] = (a - y) * dl;
      }
  }

  //! Algorithm 1's input gradient: the ranks' partial gradients summed in rank order, into `dx`.
  template <class T>
  static void sum_input_gradient(std::span<const std::span<const T>> parts, std::type_identity_t<std::span<T>> dx) {
    for (std::size_t k = 0; k < dx.size(); ++k) {
      T s{};
      for (auto const& p : parts) s += p[k];
      dx[k] = s;
    }
  }
};

}  // namespace loom
