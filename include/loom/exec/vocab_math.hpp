// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The per-token and per-logit work of the vocabulary-parallel layers
//! (`loom/exec/vocab_parallel.hpp`) as items a host loop and a CUDA kernel both run
//! (`loom::vocab_items`, one `loom::vocab_step` at a time), as `loom::norm_items` does for the
//! tensor grids' layer norm: on the host in loops (threads, MPI, loom's CUDA simulator), compiled
//! by nvcc as the bodies of loom's kernels (`src/cuda/kernels.cu`). Every sum starts from zero
//! and adds its terms in increasing index (tokens, rows, ranks), so the host and the simulated
//! device give the same bits; on a GPU `exp` and `log` may differ from the host's in the last
//! bits. The math is described in `loom/exec/vocab_parallel.hpp`.

#include <cstddef>
#include <cstdint>

#include "loom/exec/pattern_math.hpp"

namespace loom {

//! The steps of the vocabulary-parallel layers (`vocab_items`), with what one item does. Shapes:
//! `n` tokens, hidden width `h`, the shard's `rows`; statistics blocks are `[3][n]` (m, s, z).
enum class vocab_step : unsigned char {
  embed,       //!< per element of `[n][h]`: `out[t][i] = table[ids[t] - first][i]` where the shard holds `ids[t]`, else 0
  embed_grad,  //!< per feature `i`: `out[ids[t] - first][i] += x[t][i]` over the tokens in order (those the shard holds)
  statistics,  //!< per token: the row of logits `e[t]`'s maximum m, the target's logit z (0 when not held), `e = exp(e - m)` and its sum s, into `own`
  combine,     //!< per token: `ranks` statistics blocks at `stats` (consecutive) into the global M, sigma, z at `out`
  logit_grad,  //!< per logit of `[n][rows]`: `e = (e exp(own.m - M) / sigma - [v = target]) dl`, the global statistics at `global`
  scale_rows,  //!< per logit: `out = e / own.s` (Algorithm 2)
  fused_grad,  //!< per element of `[n][h]`: `out = (sum_r a_r G_r - sum_r Y_r) dl`, `a_r = s_r exp(m_r - M) / sigma`; `G_r` at `parts + r stride`, `Y_r` `n h` after it
  sum_parts,   //!< per element of `[n][h]`: `out = sum_r parts[r stride + k]`, from zero in rank order
};

//! One shard's vocabulary-layer work as items (see the file comment and `vocab_step`). Pointers
//! are device memory on a device, host memory on the host; a step reads and writes only the
//! fields its `vocab_step` names. `I` is the token id type.
template <class T, class I>
struct vocab_items {
  const I* ids = nullptr;     //!< token ids (`embed`, `embed_grad`) or targets (`statistics`, `logit_grad`), `[n]`
  const T* table = nullptr;   //!< the shard's table `[rows][h]` (`embed`)
  const T* x = nullptr;       //!< the tokens' gradients `[n][h]` (`embed_grad`)
  const T* stats = nullptr;   //!< `ranks` statistics blocks in rank order (`combine`, `fused_grad`)
  const T* global = nullptr;  //!< the combined statistics `[3][n]` (`logit_grad`, `fused_grad`)
  const T* parts = nullptr;   //!< the ranks' parts, `stride` apart (`fused_grad`, `sum_parts`)
  T* e = nullptr;             //!< the shard's logits, then exponentials, then logit gradients `[n][rows]`
  T* own = nullptr;           //!< this shard's statistics `[3][n]` (written by `statistics`, read after)
  T* out = nullptr;           //!< what the step writes (see `vocab_step`)
  std::size_t n = 0;          //!< tokens
  std::size_t h = 0;          //!< hidden width
  std::size_t rows = 0;       //!< the shard's rows
  std::size_t ranks = 1;      //!< statistics blocks or parts
  std::size_t stride = 0;     //!< elements between two ranks' parts
  std::int64_t first = 0;     //!< the first vocabulary id of the shard
  T dl = T(1);                //!< the loss scale (`logit_grad`, `fused_grad`)

  //! Row of id `v` in the shard, or -1 when the shard does not hold it.
  LOOM_HOST_DEVICE std::int64_t row_of(I v) const {
    const auto d = static_cast<std::int64_t>(v) - first;
    return d >= 0 && d < static_cast<std::int64_t>(rows) ? d : -1;
  }
  //! Items of `step`.
  LOOM_HOST_DEVICE std::size_t count(vocab_step step) const {
    switch (step) {
      case vocab_step::embed_grad: return h;
      case vocab_step::statistics:
      case vocab_step::combine: return n;
      case vocab_step::logit_grad:
      case vocab_step::scale_rows: return n * rows;
      default: return n * h;
    }
  }
  //! Item `k` of `step`.
  LOOM_HOST_DEVICE void operator()(vocab_step step, std::size_t k) const {
    switch (step) {
      case vocab_step::embed: {
        const std::size_t t = k / h, i = k % h;
        const std::int64_t r = row_of(ids[t]);
        out[k] = r >= 0 ? table[static_cast<std::size_t>(r) * h + i] : T{};
        break;
      }
      case vocab_step::embed_grad:
        for (std::size_t t = 0; t < n; ++t) {
          const std::int64_t r = row_of(ids[t]);
          if (r >= 0) out[static_cast<std::size_t>(r) * h + k] += x[t * h + k];
        }
        break;
      case vocab_step::statistics: {
        T* row = e + k * rows;
        T m = row[0];
        for (std::size_t v = 1; v < rows; ++v) m = device_math::max(m, row[v]);
        const std::int64_t y = row_of(ids[k]);
        const T z = y >= 0 ? row[static_cast<std::size_t>(y)] : T{};
        T s{};
        for (std::size_t v = 0; v < rows; ++v) {
          row[v] = device_math::exp(row[v] - m);
          s += row[v];
        }
        own[k] = m;
        own[n + k] = s;
        own[2 * n + k] = z;
        break;
      }
      case vocab_step::combine: {
        T big = stats[k];
        for (std::size_t r = 1; r < ranks; ++r) big = device_math::max(big, stats[r * 3 * n + k]);
        T sigma{}, z{};
        for (std::size_t r = 0; r < ranks; ++r) {
          sigma += stats[r * 3 * n + n + k] * device_math::exp(stats[r * 3 * n + k] - big);
          z += stats[r * 3 * n + 2 * n + k];
        }
        out[k] = big;
        out[n + k] = sigma;
        out[2 * n + k] = z;
        break;
      }
      case vocab_step::logit_grad: {
        const std::size_t t = k / rows, v = k % rows;
        const T scale = device_math::exp(own[t] - global[t]) / global[n + t];
        T p = e[k] * scale;
        if (row_of(ids[t]) == static_cast<std::int64_t>(v)) p -= T{1};
        e[k] = p * dl;
        break;
      }
      case vocab_step::scale_rows: out[k] = e[k] / own[n + k / rows]; break;
      case vocab_step::fused_grad: {
        const std::size_t t = k / h;
        T a{}, y{};
        for (std::size_t r = 0; r < ranks; ++r) {
          const T* st = stats + r * 3 * n;
          const T alpha = st[n + t] * device_math::exp(st[t] - global[t]) / global[n + t];
          a += alpha * parts[r * stride + k];
          y += parts[r * stride + n * h + k];
        }
        out[k] = (a - y) * dl;
        break;
      }
      case vocab_step::sum_parts: {
        T s{};
        for (std::size_t r = 0; r < ranks; ++r) s += parts[r * stride + k];
        out[k] = s;
        break;
      }
    }
  }
};

}  // namespace loom
