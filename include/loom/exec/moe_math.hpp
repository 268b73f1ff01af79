// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The per-item work of a mixture-of-experts layer (`loom/exec/moe.hpp`), written once as
//! functions that a host loop and a CUDA kernel both call, as `loom/exec/pattern_math.hpp` does
//! for the tensor- and sequence-parallel patterns: the routing per token (softmax, top-k, gates),
//! the slot assignment per expert (a scan of the (choice, token) pairs in the contract's order),
//! the auxiliary loss and the largest load (one item each), dispatch and combine and their
//! backward per element, the router's backward per token, and the all-to-all layouts as block
//! transposes. Every accumulator takes its terms in the same order in every form, so host runs
//! and runs under loom's CUDA simulator are equal bit for bit; on a GPU `exp` may differ from the
//! host's in the last bits.

#include <cstddef>

#include "loom/exec/pattern_math.hpp"

namespace loom {

//! What one kernel of an MoE layer computes (the items of `moe_items`).
enum class moe_step : unsigned char {
  route,             //!< per token: softmax, top-k, gates
  slots,             //!< per expert: slots of its pairs, its load and first-choice count
  aux,               //!< one item: GShard's auxiliary loss
  max_load,          //!< one item: the largest load, as a double (exact below 2^53)
  dispatch,          //!< per (pair, feature): a kept pair's input into its slot (slots zeroed before)
  combine,           //!< per (token, feature): the gate-weighted sum of its kept slots
  combine_backward,  //!< per pair: the slot's gradient and the gate's
  dispatch_backward, //!< per (token, feature): the input gradient, adding its kept slots' gradients
  route_backward,    //!< per token: the logits' gradient
};

//! The buffers and sizes of one MoE layer's routing and data movement for `n` tokens, as plain
//! pointers (device memory on a device, host memory on the host); each step uses some of them
//! (see `moe_step` and the members' comments). The equations are `loom/exec/moe.hpp`'s.
template <class T>
struct moe_items {
  std::size_t n = 0;            //!< tokens
  std::size_t experts = 1;      //!< E
  std::size_t top_k = 1;        //!< k
  std::size_t h = 1;            //!< features per token
  long long capacity = 0;       //!< C (dispatch, combine and their backward)
  long long held_first = 0;     //!< the first expert held (dispatch, combine: the slots' experts)
  long long held_count = 0;     //!< experts held
  bool normalize = true;        //!< gate normalisation for k > 1
  T eps{};                      //!< the normalisation's floor (the type's epsilon)
  T daux{};                     //!< d loss / d l_aux (route_backward)
  const T* daux_scale = nullptr;  //!< route_backward: when set, d loss / d l_aux is `*daux_scale * daux` (one element, read per token)
  const T* logits = nullptr;    //!< `[n][E]`
  T* scores = nullptr;          //!< `[n][E]`
  int* expert = nullptr;        //!< `[n][k]`
  T* gate = nullptr;            //!< `[n][k]`
  T* raw_gate = nullptr;        //!< `[n][k]`
  long long* slot = nullptr;    //!< `[n][k]`
  long long* load = nullptr;    //!< `[E]`
  long long* first = nullptr;   //!< `[E]`
  T* scalar = nullptr;          //!< aux: one element, the loss
  double* largest = nullptr;    //!< max_load: one element (a double: 8 bytes in the group's all-reduce, as the host's integer)
  const T* x = nullptr;         //!< dispatch: input `[n][h]`; combine_backward: the experts' output slots
  T* slots_out = nullptr;       //!< dispatch: slots; combine_backward: the slots' gradient
  const T* slots_in = nullptr;  //!< combine: the experts' output slots; dispatch_backward: the slots' gradient
  T* y = nullptr;               //!< combine: `[n][h]`; dispatch_backward: the input gradient (added to)
  const T* dy = nullptr;        //!< combine_backward: `[n][h]`
  T* dgate = nullptr;           //!< combine_backward: `[n][k]` (written); route_backward: read
  T* dlogits = nullptr;         //!< route_backward: `[n][E]`

  //! Items of `s`.
  LOOM_HOST_DEVICE std::size_t count(moe_step s) const {
    switch (s) {
      case moe_step::route: return n;
      case moe_step::slots: return experts;
      case moe_step::aux: return 1;
      case moe_step::max_load: return 1;
      case moe_step::dispatch: return n * top_k * h;
      case moe_step::combine: return n * h;
      case moe_step::combine_backward: return n * top_k;
      case moe_step::dispatch_backward: return n * h;
      case moe_step::route_backward: return n;
    }
    return 0;
  }
  //! Item `e` of `s`.
  LOOM_HOST_DEVICE void operator()(moe_step s, std::size_t e) const {
    switch (s) {
      case moe_step::route: route(e); return;
      case moe_step::slots: assign_slots(e); return;
      case moe_step::aux: aux_loss(); return;
      case moe_step::max_load: largest_load(); return;
      case moe_step::dispatch: dispatch(e); return;
      case moe_step::combine: combine(e); return;
      case moe_step::combine_backward: combine_backward(e); return;
      case moe_step::dispatch_backward: dispatch_backward(e); return;
      case moe_step::route_backward: route_backward(e); return;
    }
  }

  //! Where pair `p = t k + j` lands in the held experts' slots `[count][C][h]`, or -1 when it is
  //! dropped or its expert is not held.
  LOOM_HOST_DEVICE long long offset(std::size_t p) const {
    const long long e = expert[p];
    if (slot[p] >= capacity || e < held_first || e >= held_first + held_count) return -1;
    return ((e - held_first) * capacity + slot[p]) * static_cast<long long>(h);
  }

  //! Token `t`: `s = softmax(l)`, the k largest scores (ties to the lower expert), the gates.
  LOOM_HOST_DEVICE void route(std::size_t t) const {
    const T* l = logits + t * experts;
    T* s = scores + t * experts;
    T big = l[0];
    for (std::size_t e = 1; e < experts; ++e) big = device_math::max(big, l[e]);
    T sum{};
    for (std::size_t e = 0; e < experts; ++e) {
      s[e] = device_math::exp(l[e] - big);
      sum += s[e];
    }
    for (std::size_t e = 0; e < experts; ++e) s[e] /= sum;
    int* x = expert + t * top_k;
    T total{};
    for (std::size_t j = 0; j < top_k; ++j) {  // the j-th largest: the best expert not chosen yet
      long long best = -1;
      for (std::size_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (std::size_t i = 0; i < j; ++i) taken = taken || x[i] == static_cast<int>(e);
        if (!taken && (best < 0 || s[e] > s[best])) best = static_cast<long long>(e);
      }
      x[j] = static_cast<int>(best);
      raw_gate[t * top_k + j] = s[best];
      total += s[best];
    }
    const T denom = total < eps ? eps : total;
    for (std::size_t j = 0; j < top_k; ++j)
      gate[t * top_k + j] = normalize && top_k > 1 ? raw_gate[t * top_k + j] / denom : raw_gate[t * top_k + j];
  }
  //! Expert `e`: every first choice in token order, then every second choice, ...; its load and
  //! its first-choice count (the load after the first choices).
  LOOM_HOST_DEVICE void assign_slots(std::size_t e) const {
    long long c = 0;
    for (std::size_t j = 0; j < top_k; ++j) {
      for (std::size_t t = 0; t < n; ++t)
        if (expert[t * top_k + j] == static_cast<int>(e)) slot[t * top_k + j] = c++;
      if (j == 0) first[e] = c;
    }
    load[e] = c;
  }
  //! `l_aux = (E / n^2) sum_e (sum_t s[t][e]) N_e`, experts and tokens in order.
  LOOM_HOST_DEVICE void aux_loss() const {
    const T tokens = static_cast<T>(n);
    T sum{};
    for (std::size_t e = 0; e < experts; ++e) {
      T me{};
      for (std::size_t t = 0; t < n; ++t) me += scores[t * experts + e];
      sum += me * static_cast<T>(first[e]);
    }
    *scalar = sum * static_cast<T>(experts) / (tokens * tokens);
  }
  //! The largest load.
  LOOM_HOST_DEVICE void largest_load() const {
    long long m = 0;
    for (std::size_t e = 0; e < experts; ++e) m = load[e] > m ? load[e] : m;
    *largest = static_cast<double>(m);
  }
  //! Item `(t k + j) h + i`.
  LOOM_HOST_DEVICE void dispatch(std::size_t w) const {
    const std::size_t p = w / h, i = w % h;
    if (const long long at = offset(p); at >= 0) slots_out[static_cast<std::size_t>(at) + i] = x[p / top_k * h + i];
  }
  //! Item `t h + i`: `y[t][i] = sum_j g[t][j] out[slot(t, j)][i]` over the kept pairs, j in order.
  LOOM_HOST_DEVICE void combine(std::size_t w) const {
    const std::size_t t = w / h, i = w % h;
    T acc{};
    for (std::size_t j = 0; j < top_k; ++j)
      if (const long long at = offset(t * top_k + j); at >= 0) acc += gate[t * top_k + j] * slots_in[static_cast<std::size_t>(at) + i];
    y[w] = acc;
  }
  //! Pair `p`: the slot's gradient `g dy[t]` and `dgate[p] = dy[t] . out[slot]` (0 when dropped).
  LOOM_HOST_DEVICE void combine_backward(std::size_t p) const {
    const std::size_t t = p / top_k;
    T d{};
    if (const long long sat = offset(p); sat >= 0) {
      const auto at = static_cast<std::size_t>(sat);
      const T g = gate[p];
      for (std::size_t i = 0; i < h; ++i) {
        slots_out[at + i] = g * dy[t * h + i];
        d += dy[t * h + i] * x[at + i];
      }
    }
    dgate[p] = d;
  }
  //! Item `t h + i`: `dx[t][i] += dslots[slot(t, j)][i]` over the kept pairs, j in order.
  LOOM_HOST_DEVICE void dispatch_backward(std::size_t w) const {
    const std::size_t t = w / h, i = w % h;
    for (std::size_t j = 0; j < top_k; ++j)
      if (const long long at = offset(t * top_k + j); at >= 0) y[w] += slots_in[static_cast<std::size_t>(at) + i];
  }
  //! Token `t`: `ds[e] = daux E N_e / n^2` plus the gate terms of its chosen experts (through the
  //! normalisation), then `dl[e] = s[e] (ds[e] - sum_e' s[e'] ds[e'])`.
  LOOM_HOST_DEVICE void route_backward(std::size_t t) const {
    const T tokens = static_cast<T>(n);
    const T* raw = raw_gate + t * top_k;
    const T* dg = dgate + t * top_k;
    const int* x = expert + t * top_k;
    const bool norm = normalize && top_k > 1;
    T denom{}, cross{};
    bool clamped = false;
    if (norm) {
      T total{};
      for (std::size_t j = 0; j < top_k; ++j) total += raw[j];
      clamped = total < eps;
      denom = clamped ? eps : total;
      for (std::size_t j = 0; j < top_k; ++j) cross += dg[j] * raw[j];  // sum_i dg_i raw_i
    }
    const T weight = daux_scale == nullptr ? daux : *daux_scale * daux;
    auto ds = [&](std::size_t e) {
      T d = weight * static_cast<T>(experts) * static_cast<T>(first[e]) / (tokens * tokens);
      for (std::size_t j = 0; j < top_k; ++j)
        if (x[j] == static_cast<int>(e)) d += norm ? dg[j] / denom - (clamped ? T{} : cross / (denom * denom)) : dg[j];
      return d;
    };
    const T* s = scores + t * experts;
    T dot{};
    for (std::size_t e = 0; e < experts; ++e) dot += s[e] * ds(e);
    for (std::size_t e = 0; e < experts; ++e) dlogits[t * experts + e] = s[e] * (ds(e) - dot);
  }
};

//! A grid of `rows x cols` blocks of `block` elements, transposed: block `(r, c)` of `in` (at
//! `(r cols + c) in_stride`) becomes block `(c, r)` of `out` (at `(c rows + r) out_stride`); the
//! strides default to `block` (packed grids); with `add` it accumulates. The expert-parallel exchange's layout changes and
//! the overlap's packing of pieces are all of this form (`loom/exec/moe.hpp`; a 1 x n grid is a
//! strided copy). Item `w` is element `w % block` of block `w / block`.
template <class T>
struct block_transpose {
  const T* in = nullptr;        //!< `rows x cols` blocks
  T* out = nullptr;             //!< `cols x rows` blocks
  std::size_t rows = 1;         //!< block rows of `in`
  std::size_t cols = 1;         //!< block columns of `in`
  std::size_t block = 0;        //!< elements per block
  std::size_t in_stride = 0;    //!< elements from one block of `in` to the next (0: `block`)
  std::size_t out_stride = 0;   //!< elements from one block of `out` to the next (0: `block`)
  bool add = false;             //!< `out += in` (else `out = in`)
  //! Items (the elements moved).
  LOOM_HOST_DEVICE std::size_t size() const { return rows * cols * block; }
  //! Elements of `in` from the first moved to one past the last.
  LOOM_HOST_DEVICE std::size_t in_extent() const { return size() == 0 ? 0 : (rows * cols - 1) * (in_stride == 0 ? block : in_stride) + block; }
  //! Elements of `out` from the first written to one past the last.
  LOOM_HOST_DEVICE std::size_t out_extent() const { return size() == 0 ? 0 : (rows * cols - 1) * (out_stride == 0 ? block : out_stride) + block; }
  //! Item `w`.
  LOOM_HOST_DEVICE void operator()(std::size_t w) const {
    const std::size_t b = w / block, i = w % block, r = b / cols, c = b % cols;
    const std::size_t is = in_stride == 0 ? block : in_stride, os = out_stride == 0 ? block : out_stride;
    T& to = out[(c * rows + r) * os + i];
    to = add ? to + in[b * is + i] : in[b * is + i];
  }
};

}  // namespace loom
