// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The example's `--sp-kind dsp` mode (issue 25): a spatial-temporal transformer, the model DSP
//! is made for (Zhao et al., ICML 2025, "DSP: Dynamic Sequence Parallelism for Multi-Dimensional
//! Transformers", §3-4), trained over dp x pp x sp x tp and checked against a single-rank
//! reference. A microbatch is one clip of `T` frames of `S` patches (`[T][S][h]`); a block pair is
//! a temporal block (pre-LN attention along `T` for every patch position, then a pre-LN MLP) and
//! a spatial block (the same with the attention along `S` for every frame), with a squared error
//! `0.5 (y - target)^2` per element after the last pair.
//!
//! **DSP over `sp`.** The temporal block runs on the tokens sharded along `S` (`[T][S/P][h]`: its
//! attention lines are whole on each rank); one all-to-all (`loom::dsp_switch::to_first`) moves
//! them to the sharding along `T` (`[T/P][S][h]`) for the spatial block, and one moves them back
//! after it: two switches of a shard per pair in the forward and two in the backward (each
//! switch's backward is the other switch). Ulysses would exchange Q, K, V and the output around
//! the attention along the sharded dimension, forward and backward: twice DSP's volume.
//!
//! **Megatron over `tp`** (Shoeybi et al. 2019, §3), the activations replicated over tp: Q, K, V
//! and the MLP's first layer column-parallel (heads and MLP features split), the output
//! projection and the MLP's second layer row-parallel (`loom::row_parallel_linear`, all-reduced
//! over tp); the input gradients of the column-parallel layers all-reduced (Q's, K's and V's
//! partial sums added on each rank first, one all-reduce).
//!
//! Every weight gradient is a sum over the tokens of the rank's sp shard (partial over `sp`), so
//! `loom::data_parallel` reduces it over dp x sp. The reference runs the whole clip on one rank
//! with the same per-token and per-line kernels and the tensor-parallel sums in rank order,
//! computes each sp rank's weight gradients over that rank's tokens in its order, folds each
//! rank's microbatches from zero and the ranks in dp x sp order, and steps SGD: a deterministic
//! run equals it bit for bit, any run within 1e-12 of each tensor's largest value.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/exec/data_parallel.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/exec/sequence_parallel.hpp"
#include "loom/exec/tensor_grid.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/mesh.hpp"
#include "model_check.hpp"
#include "moe_model.hpp"
#include "train.hpp"

namespace mesh_example::dsp {

inline constexpr double dsp_lr = 0.0005;  //!< SGD's learning rate (the loss is a sum over every element)

//! One run of the spatial-temporal model: the mesh and the model's shape.
struct dsp_setup {
  int dp = 1, pp = 1, sp = 1, tp = 1;  //!< the mesh
  int frames = 8;                      //!< T, the temporal sequence dimension
  int patches = 12;                    //!< S, the spatial sequence dimension
  int hidden = 24;                     //!< the model's width
  int heads = 4;                       //!< attention heads
  int ffn = 48;                        //!< the MLP's hidden features
  int pairs = 1;                       //!< block pairs (raised to the number of virtual stages)
  int steps = 2;                       //!< training steps
  bool causal = false;                 //!< causal attention along both dimensions
  bool det = false;                    //!< deterministic mode (rank-ordered sums)
  //! Tokens per clip.
  int tokens() const { return frames * patches; }
};

//! The mesh of the DSP mode: data, pipeline, sequence, tensor (innermost).
using dsp_mesh = loom::mesh<loom::dp<>, loom::pp<>, loom::sp<>, loom::tp<>>;

//! The mesh of `s`.
inline dsp_mesh make_dsp_mesh(const dsp_setup& s) { return dsp_mesh{loom::dp<>{s.dp}, loom::pp<>{s.pp}, loom::sp<>{s.sp}, loom::tp<>{s.tp}}; }

//! The rule `s` breaks, in one line, or "".
inline std::string dsp_rule(const dsp_setup& s) {
  for (auto [name, v] : {std::pair<const char*, int>{"--dp", s.dp}, {"--pp", s.pp}, {"--sp", s.sp}, {"--tp", s.tp}, {"--frames", s.frames},
                         {"--patches", s.patches}, {"--hidden", s.hidden}, {"--heads", s.heads}, {"--ffn", s.ffn}, {"--blocks", s.pairs},
                         {"--steps", s.steps}})
    if (v < 1) return std::string(name) + " " + std::to_string(v) + " must be at least 1";
  for (auto [name, v] : {std::pair<const char*, int>{"--frames", s.frames}, {"--patches", s.patches}})
    if (v % s.sp != 0)
      return std::string(name) + " " + std::to_string(v) + " is not divisible by --sp " + std::to_string(s.sp) +
             ": DSP shards each sequence dimension in turn over the sp ranks";
  if (s.hidden % s.heads != 0) return "--hidden " + std::to_string(s.hidden) + " is not divisible by --heads " + std::to_string(s.heads);
  return std::string(loom::tp_rule(s.tp, s.heads, s.ffn).view());
}

//! The parts of a block, each with two tensors: the norms' weight and bias, the linear layers'
//! weight `[out][in]` and bias `[out]`.
enum : std::size_t { ln1, wq, wk, wv, wo, ln2, w1, w2, part_count };

//! Where a block's tensors sit in its parameter vector, whole (`tp = 1`) or a tensor-parallel
//! rank's: Q, K, V and W1 hold `1/tp` of their rows (and biases), Wo and W2 `1/tp` of their
//! columns (their biases and the norms whole).
struct block_layout : tensor_table<2 * part_count> {

  //! A rank's tensors of a block of width `h` and MLP features `f` over `tp` ranks.
  static block_layout of(std::size_t h, std::size_t f, std::size_t tp = 1) {
    block_layout b;
    const std::size_t hl = h / tp, fl = f / tp;
    b.size = {h, h, hl * h, hl, hl * h, hl, hl * h, hl, h * hl, h, h, h, fl * h, fl, h * fl, h};
    b.place();
    return b;
  }
};

//! Block `b`'s whole parameters: norms' weights `1 + 0.1 r`, biases `0.1 r`, weights
//! `r / sqrt(in)` for reproducible `r` in [-1, 1).
inline std::vector<double> initial_block(int b, std::size_t h, std::size_t f) {
  const block_layout w = block_layout::of(h, f);
  std::vector<double> p(w.total);
  for (std::size_t i = 0; i < w.size.size(); ++i)
    for (std::size_t e = 0; e < w.size[i]; ++e) {
      const double r = hashed(8000 + static_cast<std::uint64_t>(b) * 32 + i, e, 0);
      const std::size_t part = i / 2, in = part == w2 ? f : h;
      p[w.offset[i] + e] = i % 2 == 1 ? 0.1 * r : part == ln1 || part == ln2 ? 1.0 + 0.1 * r : r / std::sqrt(static_cast<double>(in));
    }
  return p;
}

//! Tensor-parallel rank `r`'s pieces of block `whole`, or put back (`to_whole`).
inline void cut(std::span<double> whole, std::span<double> mine, std::size_t h, std::size_t f, std::size_t tp, std::size_t r, bool to_whole) {
  const block_layout W = block_layout::of(h, f), m = block_layout::of(h, f, tp);
  auto move = [&](double& w, double& x) {
    if (to_whole) w = x;
    else x = w;
  };
  for (std::size_t i = 0; i < W.size.size(); ++i) {
    const std::span<double> a = W.tensor(whole, i), b = m.tensor(mine, i);
    const std::size_t part = i / 2;
    const bool rows = part == wq || part == wk || part == wv || part == w1;
    if (rows || ((part == wo || part == w2) && i % 2 == 0)) {
      if (rows) {  // column-parallel: a contiguous block of rows (and of the bias)
        for (std::size_t e = 0; e < b.size(); ++e) move(a[r * b.size() + e], b[e]);
      } else {  // row-parallel weight [out][in]: columns [r in/tp, (r+1) in/tp) of every row
        const std::size_t in = part == w2 ? f : h, il = in / tp, out = h;
        for (std::size_t o = 0; o < out; ++o)
          for (std::size_t e = 0; e < il; ++e) move(a[o * in + r * il + e], b[o * il + e]);
      }
    } else {
      for (std::size_t e = 0; e < b.size(); ++e) move(a[e], b[e]);
    }
  }
}

//! Clip `j` of step `st` of replica `d`: the input (`target = false`) or the target, `[T][S][h]`.
inline std::vector<double> clip(const dsp_setup& s, int d, int st, int M, int j, bool target) {
  const std::size_t size = static_cast<std::size_t>(s.tokens()) * static_cast<std::size_t>(s.hidden);
  std::vector<double> v(size);
  const auto seed = static_cast<std::uint64_t>((d * s.steps + st) * M + j);
  for (std::size_t i = 0; i < size; ++i) v[i] = (target ? 0.5 : 1.0) * hashed(target ? 9700 : 9600, seed, i);
  return v;
}

//! The tokens `[A][B]` of a rank, attended along one dimension: along `A` for every `b`
//! (`first`: the temporal block on `[T][S/P]`) or along `B` for every `a` (the spatial block on
//! `[T/P][S]`).
struct lines {
  int A = 1, B = 1;    //!< the rank's tokens, `A x B`
  bool first = true;   //!< attention along `A`
  //! Lines of attention.
  int count() const { return first ? B : A; }
  //! Tokens per line.
  int length() const { return first ? A : B; }
  //! Row of token `i` of line `l`.
  std::size_t row(int l, int i) const { return static_cast<std::size_t>(first ? i * B + l : l * B + i); }
};

//! Attention along `L` of `q`, `k`, `v` (`[A B][heads][head_dim]`) into `o` and `lse`, line by
//! line (each gathered, `loom::attention_block_forward`, scattered back): a line's bits do not
//! depend on which other lines or heads the rank holds.
inline void line_forward(const loom::attention_dims& a, const lines& L, bool causal, std::span<const double> q, std::span<const double> k,
                         std::span<const double> v, std::span<double> o, std::span<double> lse) {
  const auto F = static_cast<std::size_t>(a.heads * a.head_dim), H = static_cast<std::size_t>(a.heads);
  const int n = L.length();
  std::vector<double> lq(static_cast<std::size_t>(n) * F), lk(lq.size()), lv(lq.size()), lo(lq.size()), ll(static_cast<std::size_t>(n) * H);
  for (int l = 0; l < L.count(); ++l) {
    for (int i = 0; i < n; ++i) {
      const std::size_t at = L.row(l, i) * F, to = static_cast<std::size_t>(i) * F;
      std::copy_n(q.begin() + static_cast<std::ptrdiff_t>(at), F, lq.begin() + static_cast<std::ptrdiff_t>(to));
      std::copy_n(k.begin() + static_cast<std::ptrdiff_t>(at), F, lk.begin() + static_cast<std::ptrdiff_t>(to));
      std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(at), F, lv.begin() + static_cast<std::ptrdiff_t>(to));
    }
    std::fill(lo.begin(), lo.end(), 0.0);
    std::fill(ll.begin(), ll.end(), -std::numeric_limits<double>::infinity());
    loom::attention_block_forward<double>(a, lq, lk, lv, lo, ll, 0, n, 0, n, causal ? loom::block_mask::causal : loom::block_mask::full);
    for (int i = 0; i < n; ++i) {
      std::copy_n(lo.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * F), F, o.begin() + static_cast<std::ptrdiff_t>(L.row(l, i) * F));
      std::copy_n(ll.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * H), H, lse.begin() + static_cast<std::ptrdiff_t>(L.row(l, i) * H));
    }
  }
}

//! The gradients `dq`, `dk`, `dv` of `line_forward` from the output gradient `dout`.
inline void line_backward(const loom::attention_dims& a, const lines& L, bool causal, std::span<const double> q, std::span<const double> k,
                          std::span<const double> v, std::span<const double> o, std::span<const double> lse, std::span<const double> dout,
                          std::span<double> dq, std::span<double> dk, std::span<double> dv) {
  const auto F = static_cast<std::size_t>(a.heads * a.head_dim), H = static_cast<std::size_t>(a.heads);
  const int n = L.length();
  const std::size_t size = static_cast<std::size_t>(n) * F;
  std::vector<double> lq(size), lk(size), lv(size), lo(size), ld(size), ll(static_cast<std::size_t>(n) * H), delta(ll.size()), gq(size), gk(size),
      gv(size);
  for (int l = 0; l < L.count(); ++l) {
    for (int i = 0; i < n; ++i) {
      const auto at = static_cast<std::ptrdiff_t>(L.row(l, i) * F), to = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * F);
      for (auto [from, into] : {std::pair{q, &lq}, std::pair{k, &lk}, std::pair{v, &lv}, std::pair{o, &lo}, std::pair{dout, &ld}})
        std::copy_n(from.begin() + at, F, into->begin() + to);
      std::copy_n(lse.begin() + static_cast<std::ptrdiff_t>(L.row(l, i) * H), H, ll.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * H));
    }
    loom::attention_delta<double>(a, lo, ld, delta);
    std::fill(gq.begin(), gq.end(), 0.0);
    std::fill(gk.begin(), gk.end(), 0.0);
    std::fill(gv.begin(), gv.end(), 0.0);
    loom::attention_block_backward<double>(a, lq, lk, lv, ll, ld, delta, gq, gk, gv, 0, n, 0, n,
                                           causal ? loom::block_mask::causal : loom::block_mask::full);
    for (int i = 0; i < n; ++i) {
      const auto at = static_cast<std::ptrdiff_t>(L.row(l, i) * F), from = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * F);
      std::copy_n(gq.begin() + from, F, dq.begin() + at);
      std::copy_n(gk.begin() + from, F, dk.begin() + at);
      std::copy_n(gv.begin() + from, F, dv.begin() + at);
    }
  }
}

//! A block's saved tensors: the forward's (the norms' `xhat` and `1 / sigma`, their outputs
//! `z1`, `z2`, Q, K, V, the attention's output and log-sum-exp, `u = tanh(a)`), and what `B`
//! leaves for `W` (the gradients of the block's output `gy`, of the MLP's hidden `da`, of the
//! norms' outputs `dz1`, `dz2`, of the attention half's output `gx1`, of Q, K, V).
struct block_stash {
  std::span<double> xhat1, rstd1, z1, q, k, v, o, lse, xhat2, rstd2, z2, u, gy, da, dz2, gx1, dq, dk, dv, dz1;
};

//! Adds the gradients of one block's weights over `n` tokens (`tp` slices `hl`, `fl`) to `gw`
//! from its saved tensors: the stage's `W` and the reference's per-rank sums, the same calls.
inline void block_weights(const block_stash& st, std::span<double> gw, std::size_t n, std::size_t h, std::size_t f, std::size_t hl, std::size_t fl,
                    const block_layout& L, const loom::grid_norm_reference& norm) {
  (void)f;
  using K = loom::linear_kernel;
  auto c = [](std::span<double> s) { return std::span<const double>(s); };
  auto G = [&](std::size_t i) { return L.tensor(gw, i); };
  K::backward_weight(c(st.u), c(st.gy), G(2 * w2), std::span<double>{}, n, fl, h);
  K::backward_weight(std::span<const double>{}, c(st.gy), std::span<double>{}, G(2 * w2 + 1), n, 0, h);
  K::backward_weight(c(st.z2), c(st.da), G(2 * w1), G(2 * w1 + 1), n, h, fl);
  norm.backward_weight(c(st.dz2), c(st.xhat2), G(2 * ln2), G(2 * ln2 + 1), n, 1, 1);
  K::backward_weight(c(st.o), c(st.gx1), G(2 * wo), std::span<double>{}, n, hl, h);
  K::backward_weight(std::span<const double>{}, c(st.gx1), std::span<double>{}, G(2 * wo + 1), n, 0, h);
  K::backward_weight(c(st.z1), c(st.dq), G(2 * wq), G(2 * wq + 1), n, h, hl);
  K::backward_weight(c(st.z1), c(st.dk), G(2 * wk), G(2 * wk + 1), n, h, hl);
  K::backward_weight(c(st.z1), c(st.dv), G(2 * wv), G(2 * wv + 1), n, h, hl);
  norm.backward_weight(c(st.dz1), c(st.xhat1), G(2 * ln1), G(2 * ln1 + 1), n, 1, 1);
}

//! One virtual stage of the spatial-temporal model on one rank: block pairs `[first, last)`
//! (and the loss on the last stage). A split stage: `B` leaves every layer's output gradient in
//! the stash for `W`.
template <class C>
class dsp_stage {
 public:
  using value_type = double;

  //! `targets`: this rank's shards of the step's targets (`[M][T][S/P][h]`, a stable address the
  //! trainer refills every step).
  dsp_stage(const dsp_setup& s, C* sp, C* tp, const double* targets, int index, int stages)
      : h_(static_cast<std::size_t>(s.hidden)), f_(static_cast<std::size_t>(s.ffn)), R_(static_cast<std::size_t>(s.tp)),
        r_(static_cast<std::size_t>(tp->rank())), n_(static_cast<std::size_t>(s.tokens() / s.sp)), hl_(h_ / R_), fl_(f_ / R_),
        causal_(s.causal), att_{s.heads / s.tp, s.hidden / s.heads, 1.0 / std::sqrt(static_cast<double>(s.hidden / s.heads))},
        temporal_{s.frames, s.patches / s.sp, true}, spatial_{s.frames / s.sp, s.patches, false}, first_(index * s.pairs / stages),
        last_((index + 1) * s.pairs / stages), index_(index), loss_(index == stages - 1), targets_(targets), tg_{tp, loom::tp_mode::replicated, s.det},
        sw_(sp, s.frames, s.patches, s.hidden), layout_(block_layout::of(h_, f_, R_)), norm_{h_, 1},
        params_(static_cast<std::size_t>(2 * (last_ - first_)) * layout_.total), grad_(params_.size()) {
    for (auto& v : act_) v.resize(n_ * h_);
    part_.resize(n_ * h_);
    part2_.resize(n_ * h_);
    local_.resize(n_ * std::max(hl_, fl_));
    for (int b = 2 * first_; b < 2 * last_; ++b) {
      std::vector<double> whole = initial_block(b, h_, f_);
      cut(whole, block_params(b - 2 * first_), h_, f_, R_, r_, false);
    }
  }

  //! The virtual stage's index.
  int index() const { return index_; }
  //! The block pairs this stage holds, `[first, last)`.
  std::pair<int, int> pairs() const { return {first_, last_}; }
  //! Calls so far: forwards, input gradients.
  std::array<long long, 2> calls() const { return calls_; }
  //! Elements of the stage's input per microbatch (the rank's shard).
  std::size_t input_size() const { return n_ * h_; }
  //! Elements of its output (on the last stage: the loss terms of the rank's shard).
  std::size_t output_size() const { return n_ * h_; }
  //! Elements of its stash per microbatch (every block's saved tensors; the output before the loss).
  std::size_t stash_size() const { return static_cast<std::size_t>(2 * (last_ - first_)) * per_block() + (loss_ ? n_ * h_ : 0); }
  //! The rank's parameters of the stage's blocks, in block order.
  std::span<double> params() { return params_; }
  //! The same, read-only.
  std::span<const double> params() const { return params_; }
  //! Their gradient accumulator, laid out as `params()`.
  std::span<double> weight_grad() { return grad_; }
  //! Every gradient is a sum over this rank's tokens: partial over sp.
  std::span<const loom::grad_range> grad_ranges() const {
    range_ = {0, params_.size(), loom::dim::sp};
    return {&range_, 1};
  }

  //! The forward of the stage's blocks (and the loss terms on the last stage).
  void forward(const loom::stage_context& ctx, loom::forward_buffers<double> fb) {
    ++calls_[0];
    std::span<const double> x = fb.input;
    const int np = last_ - first_;
    for (int p = 0; p < np; ++p) {
      const std::span<double> a = act_[0], b = act_[1], c = act_[2];
      const std::span<double> out = p + 1 < np ? std::span<double>(act_[3]) : loss_ ? final(fb.stash) : fb.output;
      block_forward(2 * p, temporal_, x, a, stash(fb.stash, 2 * p));
      sw_.to_first(cs(a), b);  // [T][S/P] -> [T/P][S]
      block_forward(2 * p + 1, spatial_, cs(b), c, stash(fb.stash, 2 * p + 1));
      sw_.to_second(cs(c), out);
      x = out;
    }
    if (!loss_) return;
    const double* t = targets_ + static_cast<std::size_t>(ctx.microbatch) * n_ * h_;
    for (std::size_t e = 0; e < n_ * h_; ++e) fb.output[e] = 0.5 * (x[e] - t[e]) * (x[e] - t[e]);
  }

  //! The input gradient (`B`), leaving in the stash what `W` needs.
  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    ++calls_[1];
    std::span<const double> g = bb.output_grad;
    if (loss_) {
      const double* t = targets_ + static_cast<std::size_t>(ctx.microbatch) * n_ * h_;
      const std::span<const double> y = final(bb.stash);
      for (std::size_t e = 0; e < n_ * h_; ++e) act_[3][e] = bb.output_grad[e] * (y[e] - t[e]);
      g = act_[3];
    }
    for (int p = last_ - first_; p-- > 0;) {
      const std::span<double> a = act_[0], b = act_[1], c = act_[2];
      sw_.to_first(g, a);  // the backward of to_second
      block_backward(2 * p + 1, spatial_, cs(a), b, stash(bb.stash, 2 * p + 1));
      sw_.to_second(cs(b), c);  // the backward of to_first
      const bool wanted = p > 0 || !bb.input_grad.empty();
      const std::span<double> dx = p == 0 ? bb.input_grad : std::span<double>(act_[3]);
      block_backward(2 * p, temporal_, cs(c), wanted ? dx : std::span<double>{}, stash(bb.stash, 2 * p));
      g = dx;
    }
  }

  //! The weight gradients (`W`), added to `weight_grad`.
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> wb) {
    for (int k = 2 * (last_ - first_); k-- > 0;) {
      const block_stash st = stash(wb.stash, k);
      const std::span<double> gw = wb.weight_grad.subspan(static_cast<std::size_t>(k) * layout_.total, layout_.total);
      block_weights(st, gw, n_, h_, f_, hl_, fl_, layout_, norm_);
    }
  }

  //! `B` then `W` (the fused backward).
  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    backward_input(ctx, {bb.input, bb.stash, bb.output_grad, bb.input_grad, {}});
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  std::size_t per_block() const { return 8 * n_ * h_ + 7 * n_ * hl_ + 2 * n_ * fl_ + 2 * n_ + n_ * static_cast<std::size_t>(att_.heads); }
  block_stash stash(std::span<double> all, int k) const {
    std::span<double> s = all.subspan(static_cast<std::size_t>(k) * per_block(), per_block());
    auto take = [&](std::size_t size) {
      const std::span<double> r = s.first(size);
      s = s.subspan(size);
      return r;
    };
    block_stash b;
    for (std::span<double>* x : {&b.xhat1, &b.z1, &b.xhat2, &b.z2, &b.gy, &b.dz2, &b.gx1, &b.dz1}) *x = take(n_ * h_);
    for (std::span<double>* x : {&b.q, &b.k, &b.v, &b.o, &b.dq, &b.dk, &b.dv}) *x = take(n_ * hl_);
    b.u = take(n_ * fl_);
    b.da = take(n_ * fl_);
    b.rstd1 = take(n_);
    b.rstd2 = take(n_);
    b.lse = take(n_ * static_cast<std::size_t>(att_.heads));
    return b;
  }
  std::span<double> final(std::span<double> all) const {
    return all.subspan(static_cast<std::size_t>(2 * (last_ - first_)) * per_block(), n_ * h_);
  }
  std::span<double> block_params(int k) { return std::span<double>(params_).subspan(static_cast<std::size_t>(k) * layout_.total, layout_.total); }
  static std::span<const double> cs(std::span<double> s) { return s; }

  void block_forward(int k, const lines& L, std::span<const double> x, std::span<double> y, const block_stash& st) {
    using K = loom::linear_kernel;
    const std::span<const double> w = block_params(k);
    auto W = [&](std::size_t i) { return layout_.tensor(w, i); };
    norm_.forward(x, W(2 * ln1), W(2 * ln1 + 1), st.z1, st.xhat1, st.rstd1, n_);
    for (std::size_t p : {wq, wk, wv}) K::forward(cs(st.z1), W(2 * p), W(2 * p + 1), p == wq ? st.q : p == wk ? st.k : st.v, n_, h_, hl_);
    line_forward(att_, L, causal_, cs(st.q), cs(st.k), cs(st.v), st.o, st.lse);
    const std::span<double> x1 = part2_;
    loom::row_parallel_linear<>{hl_, h_}.forward(tg_, cs(st.o), W(2 * wo), W(2 * wo + 1), std::span<double>(part_), x1);
    for (std::size_t e = 0; e < x1.size(); ++e) x1[e] = x[e] + x1[e];
    norm_.forward(cs(x1), W(2 * ln2), W(2 * ln2 + 1), st.z2, st.xhat2, st.rstd2, n_);
    K::forward(cs(st.z2), W(2 * w1), W(2 * w1 + 1), st.u, n_, h_, fl_);
    for (double& v : st.u) v = std::tanh(v);
    loom::row_parallel_linear<>{fl_, h_}.forward(tg_, cs(st.u), W(2 * w2), W(2 * w2 + 1), std::span<double>(part_), y);
    for (std::size_t e = 0; e < y.size(); ++e) y[e] = x1[e] + y[e];
  }

  //! The block's input gradient into `dx` (empty: not wanted) from its output gradient `g`.
  void block_backward(int k, const lines& L, std::span<const double> g, std::span<double> dx, const block_stash& st) {
    using K = loom::linear_kernel;
    const std::span<const double> w = block_params(k);
    auto W = [&](std::size_t i) { return layout_.tensor(w, i); };
    std::copy(g.begin(), g.end(), st.gy.begin());
    const std::span<double> du = std::span<double>(local_).first(n_ * fl_), dout = std::span<double>(local_).first(n_ * hl_);
    K::backward_input(cs(st.gy), W(2 * w2), du, n_, fl_, h_);  // row-parallel: the output gradient is replicated
    for (std::size_t e = 0; e < du.size(); ++e) st.da[e] = du[e] * (1.0 - st.u[e] * st.u[e]);
    K::backward_input(cs(st.da), W(2 * w1), std::span<double>(part_), n_, h_, fl_);
    loom::tp_enter_backward(tg_, std::span<double>(part_), st.dz2);
    norm_.backward_input(cs(st.dz2), cs(st.xhat2), cs(st.rstd2), W(2 * ln2), cs(st.gy), st.gx1, n_);
    K::backward_input(cs(st.gx1), W(2 * wo), dout, n_, hl_, h_);
    line_backward(att_, L, causal_, cs(st.q), cs(st.k), cs(st.v), cs(st.o), cs(st.lse), cs(dout), st.dq, st.dk, st.dv);
    // Q's, K's and V's partial input gradients added on this rank, then one all-reduce.
    K::backward_input(cs(st.dq), W(2 * wq), std::span<double>(part_), n_, h_, hl_);
    for (std::size_t p : {wk, wv}) {
      K::backward_input(cs(p == wk ? st.dk : st.dv), W(2 * p), std::span<double>(part2_), n_, h_, hl_);
      for (std::size_t e = 0; e < part_.size(); ++e) part_[e] += part2_[e];
    }
    loom::tp_enter_backward(tg_, std::span<double>(part_), st.dz1);
    if (dx.empty()) return;
    norm_.backward_input(cs(st.dz1), cs(st.xhat1), cs(st.rstd1), W(2 * ln1), cs(st.gx1), dx, n_);
  }

  std::size_t h_, f_, R_, r_;
  std::size_t n_, hl_, fl_;
  bool causal_;
  loom::attention_dims att_;
  lines temporal_, spatial_;
  int first_, last_, index_;
  bool loss_;
  const double* targets_;
  loom::tp_group<C> tg_;
  loom::dsp_switch<C, double> sw_;
  block_layout layout_;
  loom::grid_norm_reference norm_;
  std::vector<double> params_, grad_;
  std::array<std::vector<double>, 4> act_;
  std::vector<double> part_, part2_, local_;
  std::array<long long, 2> calls_{};
  mutable loom::grad_range range_{};
};

//! The single-rank reference: every block's whole parameters after `s.steps` steps of `M` clips
//! per replica, and each step's loss.
struct dsp_reference_result {
  std::vector<std::vector<double>> blocks;  //!< per block (2 per pair)
  std::vector<double> losses;               //!< per step
};

//! Trains the whole model on one rank with the mesh's sums (see the file comment).
inline dsp_reference_result dsp_reference(const dsp_setup& s, int M, int pairs) {
  using vec = std::vector<double>;
  using K = loom::linear_kernel;
  const auto h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn), N = static_cast<std::size_t>(s.tokens()),
             R = static_cast<std::size_t>(s.tp), P = static_cast<std::size_t>(s.sp), n = N / P;
  const auto Tn = static_cast<std::size_t>(s.frames), Sn = static_cast<std::size_t>(s.patches);
  const block_layout W = block_layout::of(h, f);
  const loom::grid_norm_reference norm{h, 1};
  const loom::attention_dims att{s.heads, s.hidden / s.heads, 1.0 / std::sqrt(static_cast<double>(s.hidden / s.heads))};
  const loom::tp_grid blocks_of_tp{loom::tp_kind::d2, static_cast<int>(R * R), static_cast<int>(R), 1};  // R output blocks (summa_reference)
  const int blocks = 2 * pairs;
  dsp_reference_result out;
  for (int b = 0; b < blocks; ++b) out.blocks.push_back(initial_block(b, h, f));
  auto cv = [](const vec& v) { return std::span<const double>(v); };
  auto mv = [](vec& v) { return std::span<double>(v); };
  // Token `i` of sp rank `r` in a temporal (sharded along S) or spatial (along T) block.
  auto token = [&](bool temporal, std::size_t r, std::size_t i) {
    if (temporal) {
      const std::size_t sp = Sn / P;
      return (i / sp) * Sn + r * sp + i % sp;
    }
    return r * (Tn / P) * Sn + i;
  };
  for (int st = 0; st < s.steps; ++st) {
    std::vector<vec> total(static_cast<std::size_t>(blocks));
    double loss = 0;
    for (int d = 0; d < s.dp; ++d) {
      std::vector<std::vector<vec>> acc(P, std::vector<vec>(static_cast<std::size_t>(blocks), vec(W.total, 0.0)));  // per sp rank
      for (int j = 0; j < M; ++j) {
        const vec target = clip(s, d, st, M, j, true);
        vec x = clip(s, d, st, M, j, false);
        struct saved {
          vec xhat1, rstd1, z1, q, k, v, o, lse, xhat2, rstd2, z2, u;
        };
        std::vector<saved> keep(static_cast<std::size_t>(blocks));
        for (std::size_t b = 0; b < keep.size(); ++b) {
          const vec& w = out.blocks[b];
          auto T = [&](std::size_t i) { return W.tensor(std::span<const double>(w), i); };
          saved& k = keep[b];
          const lines L{static_cast<int>(Tn), static_cast<int>(Sn), b % 2 == 0};
          for (vec* v : {&k.xhat1, &k.z1, &k.q, &k.k, &k.v, &k.o, &k.xhat2, &k.z2}) v->assign(N * h, 0.0);
          k.rstd1.assign(N, 0);
          k.rstd2.assign(N, 0);
          k.lse.assign(N * static_cast<std::size_t>(s.heads), 0);
          k.u.assign(N * f, 0);
          norm.forward(cv(x), T(2 * ln1), T(2 * ln1 + 1), mv(k.z1), mv(k.xhat1), mv(k.rstd1), N);
          for (std::size_t p : {wq, wk, wv}) K::forward(cv(k.z1), T(2 * p), T(2 * p + 1), mv(p == wq ? k.q : p == wk ? k.k : k.v), N, h, h);
          line_forward(att, L, s.causal, cv(k.q), cv(k.k), cv(k.v), mv(k.o), mv(k.lse));
          vec x1(N * h);
          loom::summa_reference::blocked_forward(cv(k.o), T(2 * wo), T(2 * wo + 1), mv(x1), N, h, h, R);  // the row-parallel sum
          for (std::size_t e = 0; e < x1.size(); ++e) x1[e] = x[e] + x1[e];
          norm.forward(cv(x1), T(2 * ln2), T(2 * ln2 + 1), mv(k.z2), mv(k.xhat2), mv(k.rstd2), N);
          K::forward(cv(k.z2), T(2 * w1), T(2 * w1 + 1), mv(k.u), N, h, f);
          for (double& e : k.u) e = std::tanh(e);
          vec y(N * h);
          loom::summa_reference::blocked_forward(cv(k.u), T(2 * w2), T(2 * w2 + 1), mv(y), N, f, h, R);
          for (std::size_t e = 0; e < y.size(); ++e) y[e] = x1[e] + y[e];
          x = y;
        }
        vec dy(N * h);
        for (std::size_t e = 0; e < dy.size(); ++e) {
          loss += 0.5 * (x[e] - target[e]) * (x[e] - target[e]);
          dy[e] = 1.0 * (x[e] - target[e]);
        }
        for (std::size_t b = keep.size(); b-- > 0;) {
          const vec& w = out.blocks[b];
          auto T = [&](std::size_t i) { return W.tensor(std::span<const double>(w), i); };
          const saved& k = keep[b];
          const bool temporal = b % 2 == 0;
          const lines L{static_cast<int>(Tn), static_cast<int>(Sn), temporal};
          vec du(N * f), da(N * f), dz2(N * h), gx1(N * h), dout(N * h), dq(N * h), dk(N * h), dv(N * h), dz1(N * h), dx(N * h);
          K::backward_input(cv(dy), T(2 * w2), mv(du), N, f, h);
          for (std::size_t e = 0; e < da.size(); ++e) da[e] = du[e] * (1.0 - k.u[e] * k.u[e]);
          loom::summa_reference::backward_input(cv(da), T(2 * w1), mv(dz2), N, h, f, blocks_of_tp);  // the column-parallel sum
          norm.backward_input(cv(dz2), cv(k.xhat2), cv(k.rstd2), T(2 * ln2), cv(dy), mv(gx1), N);
          K::backward_input(cv(gx1), T(2 * wo), mv(dout), N, h, h);
          line_backward(att, L, s.causal, cv(k.q), cv(k.k), cv(k.v), cv(k.o), cv(k.lse), cv(dout), mv(dq), mv(dk), mv(dv));
          // Q, K, V: each tp rank's three partial products added, then the ranks in order.
          const std::size_t hl = h / R;
          for (std::size_t r = 0; r < R; ++r) {
            vec part(N * h), more(N * h);
            auto slice = [&](const vec& g) {  // tp rank r's heads of a [N][h] gradient
              vec v(N * hl);
              for (std::size_t t = 0; t < N; ++t) std::copy_n(g.begin() + static_cast<std::ptrdiff_t>(t * h + r * hl), hl, v.begin() + static_cast<std::ptrdiff_t>(t * hl));
              return v;
            };
            auto rows = [&](std::size_t p) { return T(2 * p).subspan(r * hl * h, hl * h); };
            K::backward_input(cv(slice(dq)), rows(wq), mv(part), N, h, hl);
            for (std::size_t p : {wk, wv}) {
              K::backward_input(cv(slice(p == wk ? dk : dv)), rows(p), mv(more), N, h, hl);
              for (std::size_t e = 0; e < part.size(); ++e) part[e] += more[e];
            }
            for (std::size_t e = 0; e < part.size(); ++e) dz1[e] = r == 0 ? part[e] : dz1[e] + part[e];
          }
          norm.backward_input(cv(dz1), cv(k.xhat1), cv(k.rstd1), T(2 * ln1), cv(gx1), mv(dx), N);
          // Each sp rank's weight gradients over its tokens, in its order.
          for (std::size_t r = 0; r < P; ++r) {
            auto rows_of = [&](const vec& whole, std::size_t width) {
              vec v(n * width);
              for (std::size_t i = 0; i < n; ++i)
                std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(token(temporal, r, i) * width), width, v.begin() + static_cast<std::ptrdiff_t>(i * width));
              return v;
            };
            vec xh1 = rows_of(k.xhat1, h), z1 = rows_of(k.z1, h), o = rows_of(k.o, h), xh2 = rows_of(k.xhat2, h), z2 = rows_of(k.z2, h),
                u = rows_of(k.u, f), gy = rows_of(dy, h), da_r = rows_of(da, f), dz2_r = rows_of(dz2, h), gx1_r = rows_of(gx1, h),
                dq_r = rows_of(dq, h), dk_r = rows_of(dk, h), dv_r = rows_of(dv, h), dz1_r = rows_of(dz1, h), none;
            const block_stash sv{mv(xh1), mv(none), mv(z1), mv(none), mv(none), mv(none), mv(o), mv(none),
                                                                          mv(xh2), mv(none), mv(z2), mv(u), mv(gy), mv(da_r), mv(dz2_r), mv(gx1_r),
                                                                          mv(dq_r), mv(dk_r), mv(dv_r), mv(dz1_r)};
            vec g(W.total, 0.0);
            block_weights(sv, mv(g), n, h, f, h, f, W, norm);
            for (std::size_t i = 0; i < g.size(); ++i) acc[r][b][i] += g[i];
          }
          dy = dx;
        }
      }
      for (std::size_t r = 0; r < P; ++r)
        for (std::size_t b = 0; b < total.size(); ++b) moe::fold(total[b], acc[r][b], d == 0 && r == 0);
    }
    const double scale = 1.0 / s.dp;
    for (std::size_t b = 0; b < total.size(); ++b)
      for (std::size_t i = 0; i < total[b].size(); ++i) out.blocks[b][i] -= dsp_lr * (total[b][i] * scale);
    out.losses.push_back(loss);
  }
  return out;
}

//! What one rank's run gives: its parameters' differences from the reference's, each step's
//! communication, and the (step, group) counts that differ from DSP's and Megatron's formulas.
struct dsp_rank_result {
  param_check params;  //!< the rank's parameters against the reference's
  long long volume_mismatches = 0;  //!< (step, group) counts on sp and tp that differ from the formulas
  std::vector<std::vector<std::pair<std::string, loom::comm_counters>>> steps;  //!< per step: the rank's groups' counts
  std::vector<std::uint64_t> formula_sp;  //!< per step: DSP's all-to-all bytes on sp by the formula
  std::vector<double> losses;             //!< per step (pipeline rank 0; else 0)
};

//! This rank of `world` trains the model of `s` with `sched` and compares its parameters with `want`.
template <class World>
dsp_rank_result dsp_train_rank(World& world, dsp_setup s, const loom::schedule& sched, const dsp_reference_result& want) {
  const int M = sched.microbatches, S = sched.stages;
  s.pairs = std::max(s.pairs, S);
  const dsp_mesh m = make_dsp_mesh(s);
  loom::mesh_comm mc(m, world);
  using C = typename decltype(mc)::comm_type;
  const int d = mc.coord(loom::dim::dp), r = mc.coord(loom::dim::sp), t = mc.coord(loom::dim::tp);
  const auto h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.ffn), P = static_cast<std::size_t>(s.sp),
             n = static_cast<std::size_t>(s.tokens()) / P, Sn = static_cast<std::size_t>(s.patches), sp = Sn / P;
  std::vector<double> inputs(static_cast<std::size_t>(M) * n * h), targets(inputs.size());
  const loom::data_parallel_options o{.deterministic = s.det, .grad_scale = 1.0 / s.dp};
  loom::data_parallel<decltype(mc), dsp_stage<C>> sync(mc, o, loom::sgd{.lr = dsp_lr});
  loom::pipeline pl(sched, mc.pp(), [&](loom::stage_id id) { return dsp_stage<C>(s, &mc.sp(), &mc.tp(), targets.data(), id.stage, S); },
                    {.deterministic = s.det, .scaling = loom::loss_scaling::sum, .observer = &sync});
  sync.attach(pl);
  dsp_rank_result out;
  std::vector<std::pair<std::string, const loom::comm_counters*>> comms{
      {"sp (dsp)", &mc.sp().counters()}, {"tp", &mc.tp().counters()}, {"pp", &mc.pp().counters()}, {"dp", &mc.dp().counters()}};
  if (s.sp > 1 && s.dp > 1) comms.push_back({"dp x sp", &mc.group(loom::dim::dp | loom::dim::sp).counters()});
  for (int st = 0; st < s.steps; ++st) {
    for (int j = 0; j < M; ++j)
      for (bool target : {false, true}) {  // this rank's shard along S, [T][S/P][h]
        const std::vector<double> whole = clip(s, d, st, M, j, target);
        std::vector<double>& into = target ? targets : inputs;
        for (std::size_t i = 0; i < n; ++i)
          std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(((i / sp) * Sn + static_cast<std::size_t>(r) * sp + i % sp) * h), h,
                      into.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(j) * n + i) * h));
      }
    std::vector<loom::comm_counters> before;
    for (auto& c : comms) before.push_back(*c.second);
    std::vector<std::array<long long, 2>> calls;
    for (const auto& stg : pl.stages()) calls.push_back(stg.calls());
    const auto res = pl.step(std::span<const double>(inputs));
    out.losses.push_back(mc.coord(loom::dim::pp) == 0 ? res.loss : 0.0);
    auto& rep = out.steps.emplace_back();
    for (std::size_t i = 0; i < comms.size(); ++i) rep.push_back({comms[i].first, comms[i].second->since(before[i])});
    // DSP: two switches of a shard per pair and call; Megatron: two all-reduces of n h per block
    // and call (forward: Wo and W2; backward: W1 and Q, K, V).
    std::uint64_t a2a = 0, ar = 0;
    std::size_t i = 0;
    for (const auto& stg : pl.stages()) {
      const auto now = stg.calls(), was = calls[i++];
      const auto [first, last] = stg.pairs();
      const auto k = static_cast<std::uint64_t>((now[0] - was[0]) + (now[1] - was[1])) * static_cast<std::uint64_t>(last - first);
      a2a += k * 2 * n * h * sizeof(double);
      ar += k * 2 * 2 * n * h * sizeof(double);
    }
    out.formula_sp.push_back(s.sp > 1 ? a2a : 0);
    if (rep[0].second[loom::comm_op::all_to_all].bytes != (s.sp > 1 ? a2a : 0)) ++out.volume_mismatches;
    if (rep[1].second[loom::comm_op::all_reduce].bytes != (s.tp > 1 ? ar : 0) && !(s.det && s.tp > 2)) ++out.volume_mismatches;
  }
  sync.finish();
  const block_layout mine = block_layout::of(h, f, static_cast<std::size_t>(s.tp));
  for (const auto& stg : pl.stages()) {
    const auto [first, last] = stg.pairs();
    for (int b = 2 * first; b < 2 * last; ++b) {
      std::vector<double> ref(mine.total), initial(mine.total), whole = want.blocks[static_cast<std::size_t>(b)], start = initial_block(b, h, f);
      cut(whole, ref, h, f, static_cast<std::size_t>(s.tp), static_cast<std::size_t>(t), false);
      cut(start, initial, h, f, static_cast<std::size_t>(s.tp), static_cast<std::size_t>(t), false);
      const auto got = stg.params().subspan(static_cast<std::size_t>(b - 2 * first) * mine.total, mine.total);
      out.params.add(got, std::span<const double>(ref), std::span<const double>(initial), s.det);
    }
  }
  return out;
}

//! One rank of `world` trains the model under `s` with `sched` and checks it against the
//! reference; rank 0 prints each step's loss, communication and DSP's volume against Ulysses'
//! for the same blocks. Returns the values that differ, summed over the world.
template <class World>
long long train_dsp(World& world, const dsp_setup& s, const loom::schedule& sched, bool print) {
  const dsp_reference_result want = dsp_reference(s, sched.microbatches, std::max(s.pairs, sched.stages));
  const dsp_rank_result got = dsp_train_rank(world, s, sched, want);
  const bool root = world.rank() == 0;
  long long losses_differing = 0;
  for (std::size_t st = 0; st < got.steps.size(); ++st) {
    // Every tensor-parallel rank holds the whole loss of its shard.
    losses_differing += step_loss_matches(world, st, got.losses[st], want.losses[st], s.tp, print) ? 0 : 1;
    if (!root || !print) continue;
    print_counters(static_cast<int>(st), got.steps[st]);
    const std::uint64_t counted = got.steps[st][0].second[loom::comm_op::all_to_all].bytes;
    std::printf("DSP's switches on sp, rank 0: %llu bytes counted, %llu by the formula (2 switches of a shard per block pair, forward and "
                "backward); Ulysses on the same blocks: %llu (Q, K, V and the output, h / tp features each, around the attention along the "
                "sharded dimension)\n",
                static_cast<unsigned long long>(counted), static_cast<unsigned long long>(got.formula_sp[st]),
                static_cast<unsigned long long>(2 * got.formula_sp[st] / static_cast<std::uint64_t>(s.tp)));
  }
  std::vector<std::int64_t> totals{got.params.differing, got.params.compared, got.params.moved, got.volume_mismatches};
  world.all_reduce(std::span<std::int64_t>(totals), loom::reduce_op::sum);
  const long long bad = totals[0] + totals[3] + losses_differing + (totals[2] == 0 ? 1 : 0);
  if (root && print)
    std::printf("reference check (%s): %lld of %lld parameter values differ (%lld moved from their initial values), %lld rank-steps' "
                "volumes on sp and tp and %lld step losses differ -> %s\n",
                s.det ? "bitwise" : "1e-12 relative", static_cast<long long>(totals[0]), static_cast<long long>(totals[1]),
                static_cast<long long>(totals[2]), static_cast<long long>(totals[3]), losses_differing, bad == 0 ? "MATCH" : "DIFFERENT");
  return bad;
}

}  // namespace mesh_example::dsp
