// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3) and Megatron's sequence parallelism
//! around it (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
//! Models", §4.2.2), as building blocks for stages written by users with their own kernels.
//!
//! A tensor-parallel *region* is a column-parallel linear layer (each rank owns a slice of the
//! output features) followed by element-wise work and a row-parallel linear layer (each rank owns
//! the matching slice of the input features and produces a partial sum of the full output). The
//! region is entered and left through a conjugate pair of operators:
//!
//! | mode | enter, forward | enter, backward | exit, forward | exit, backward |
//! |---|---|---|---|---|
//! | `tp_mode::replicated` (Megatron's f / g) | identity | all-reduce | all-reduce | identity |
//! | `tp_mode::sequence_sharded` (Megatron-SP's g / g-bar) | all-gather along the sequence | reduce-scatter | reduce-scatter along the sequence | all-gather |
//!
//! In the replicated mode the activations outside the region are whole and identical on every
//! rank of the group; in the sequence-sharded mode each rank holds `1/tp` of the tokens
//! (contiguous, in rank order) outside the region, so layer norms, residuals and dropout work on
//! `1/tp` of the activations. A transformer layer has two regions (attention and MLP); per layer
//! and microbatch the replicated mode all-reduces `2` activations of `s x h` in the forward and `2`
//! in the backward, the sequence-sharded mode all-gathers and reduce-scatters the same tensors:
//! the same bytes (an all-reduce is a reduce-scatter plus an all-gather), less activation memory.
//!
//! On a GPU the operators run on device memory when the group is a device group bound to a stream
//! (`loom::on_stream` over a `cuda_local` or `nccl` group, or a `mesh_comm`'s counted one): every
//! collective and copy is enqueued on that stream, with no host synchronisation. The linear blocks
//! run there too with a device kernel, `loom::cuda::linear_kernel{stream}` (`loom/cuda/patterns.hpp`).
//!
//! Activations are token-major, `[tokens][features]`. `tp_group` carries the group's
//! communicator, the mode, and whether sums must be rank-ordered (`ordered`: deterministic mode,
//! `loom/comm/ordered.hpp`); on a group of one rank every operator is a copy and nothing is sent.
//!
//! `column_parallel_linear` and `row_parallel_linear` put the operators and a local kernel
//! together; the kernel (default `linear_kernel`, plain loops in a fixed order of additions) is a
//! template parameter (and a member, so a kernel can carry state such as its stream): a user's own
//! (CUDA, BLAS) kernel can take its place. A kernel provides `forward`, `backward_input` and
//! `backward_weight` with `linear_kernel`'s signatures, and `add_bias` when its memory is not the
//! host's (without it the bias is added in a host loop).

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/comm/ordered.hpp"
#include "loom/exec/pattern_math.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! How the activations outside a tensor-parallel region are laid out (see the file comment).
enum class tp_mode : unsigned char { replicated, sequence_sharded };

//! A tensor-parallel group: its communicator (any `nonblocking_communicator`), its mode, and
//! whether reductions must be rank-ordered (bitwise reproducible on every backend).
template <class C>
struct tp_group {
  C* comm = nullptr;                     //!< the group (size 1: no communication)
  tp_mode mode = tp_mode::replicated;    //!< replicated or sequence-sharded activations
  bool ordered = false;                  //!< rank-ordered sums (deterministic mode)

  //! Ranks in the group.
  int size() const { return comm == nullptr ? 1 : comm->size(); }
  //! This rank's index.
  int rank() const { return comm == nullptr ? 0 : comm->rank(); }
};

namespace detail {

// Deterministic mode: the rank-ordered helpers of `loom/comm/ordered.hpp` on a host group, the
// group's own ordered sums on a device group bound to a stream (`loom::on_stream`).
template <class C, class T>
void tp_sum(tp_group<C>& g, std::span<T> x) {
  if (g.size() == 1) return;
  if (g.ordered) {
    if constexpr (requires { g.comm->ordered_all_reduce(x); }) return g.comm->ordered_all_reduce(x);
    else return ordered_all_reduce(*g.comm, x);
  }
  g.comm->all_reduce(x, reduce_op::sum);
}

template <class C, class T>
void tp_sum_scatter(tp_group<C>& g, std::span<const T> in, std::span<T> out) {
  if (g.ordered) {
    if constexpr (requires { g.comm->ordered_reduce_scatter(in, out); }) return g.comm->ordered_reduce_scatter(in, out);
    else return ordered_reduce_scatter(*g.comm, in, out);
  }
  g.comm->reduce_scatter(in, out, reduce_op::sum);
}

//! `to = from`: the group's own copy where it has one (a device group, `loom::on_stream`, copies
//! on its stream), else on the host.
template <class C, class T>
void copy_into(tp_group<C>& g, std::span<const T> from, std::span<T> to) {
  if (from.size() != to.size())
    throw std::length_error("loom tensor parallel: buffer of " + std::to_string(to.size()) + " elements for " +
                            std::to_string(from.size()));
  if (from.data() == to.data()) return;
  if constexpr (requires { g.comm->copy(from, to); }) {
    if (g.comm != nullptr) return g.comm->copy(from, to);
  }
  std::copy(from.begin(), from.end(), to.begin());
}

}  // namespace detail

//! Enters a region, forward: `full` receives the region's input, all tokens (replicated: a copy
//! of `in`; sequence-sharded: the all-gather of every rank's tokens, `tp` times `in`).
template <class C, class T>
void tp_enter_forward(tp_group<C>& g, std::span<const T> in, std::span<T> full) {
  if (g.size() == 1 || g.mode == tp_mode::replicated) return detail::copy_into(g, in, full);
  g.comm->all_gather(in, full);
}

//! Enters a region, backward: `full_grad` holds this rank's partial input gradient over all the
//! region's tokens; `grad` receives the sum over the group (replicated: all-reduce, `full_grad`
//! is summed in place; sequence-sharded: reduce-scatter, this rank's tokens only).
template <class C, class T>
void tp_enter_backward(tp_group<C>& g, std::span<T> full_grad, std::span<T> grad) {
  if (g.size() == 1) return detail::copy_into(g, std::span<const T>(full_grad), grad);
  if (g.mode == tp_mode::replicated) {
    detail::tp_sum(g, full_grad);
    return detail::copy_into(g, std::span<const T>(full_grad), grad);
  }
  detail::tp_sum_scatter(g, std::span<const T>(full_grad), grad);
}

//! Leaves a region, forward: `partial` holds this rank's partial output over all the region's
//! tokens; `out` receives the sum (replicated: all-reduce in place of `partial`, then copied;
//! sequence-sharded: reduce-scatter to this rank's tokens).
template <class C, class T>
void tp_exit_forward(tp_group<C>& g, std::span<T> partial, std::span<T> out) {
  tp_enter_backward(g, partial, out);  // the same operator: g's forward is f's backward
}

//! Leaves a region, backward: `full_grad` receives the output gradient over all the region's
//! tokens (replicated: a copy of `grad`; sequence-sharded: the all-gather).
template <class C, class T>
void tp_exit_backward(tp_group<C>& g, std::span<const T> grad, std::span<T> full_grad) {
  tp_enter_forward(g, grad, full_grad);  // g's backward is f's forward
}

//! The default local kernel of the linear blocks: `y = x W^T (+ b)` with `W` `[out][in]`
//! row-major, over `n` tokens, in host loops over `linear_items` (`loom/exec/pattern_math.hpp`).
//! Each sum runs over its index in increasing order, starting from the bias (or zero), so results
//! are reproducible bit for bit; `loom::cuda::linear_kernel` (`loom/cuda/patterns.hpp`) runs the
//! same items as kernels on a stream.
struct linear_kernel {
  //! `y[t][o] = b[o] + sum_i x[t][i] w[o][i]` (without `b` when it is empty).
  template <class T>
  static void forward(std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> y, std::size_t n,
                      std::size_t in, std::size_t out) {
    const linear_items<T> f{x.data(), w.data(), b.empty() ? nullptr : b.data(), nullptr, y.data(), nullptr, nullptr, n, in, out};
    for (std::size_t e = 0; e < n * out; ++e) f.forward(e);
  }
  //! `y[t][o] += sum_i x[t][i] w[o][i]`, each term added to the running `y[t][o]` in order of `i`
  //! (`linear_items::forward_add`: the rounds of the tensor-parallel grids' forward).
  template <class T>
  static void forward_add(std::span<const T> x, std::span<const T> w, std::span<T> y, std::size_t n, std::size_t in,
                          std::size_t out) {
    const linear_items<T> f{x.data(), w.data(), nullptr, nullptr, y.data(), nullptr, nullptr, n, in, out};
    for (std::size_t e = 0; e < n * out; ++e) f.forward_add(e);
  }
  //! `dx[t][i] = sum_o dy[t][o] w[o][i]`.
  template <class T>
  static void backward_input(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n,
                             std::size_t in, std::size_t out) {
    const linear_items<T> f{nullptr, w.data(), nullptr, dy.data(), dx.data(), nullptr, nullptr, n, in, out};
    for (std::size_t e = 0; e < n * in; ++e) f.backward_input(e);
  }
  //! `gw[o][i] += dy[t][o] x[t][i]` and `gb[o] += dy[t][o]`, over the tokens in order (`gb` may
  //! be empty).
  template <class T>
  static void backward_weight(std::span<const T> x, std::span<const T> dy, std::span<T> gw, std::span<T> gb,
                              std::size_t n, std::size_t in, std::size_t out) {
    const linear_items<T> f{x.data(), nullptr, nullptr, dy.data(), nullptr, gw.data(), gb.empty() ? nullptr : gb.data(), n, in, out};
    for (std::size_t e = 0; e < f.weight_items(); ++e) f.backward_weight(e);
  }
  //! `y[t][o] += b[o]` over `n` tokens.
  template <class T>
  static void add_bias(std::span<T> y, std::span<const T> b, std::size_t n, std::size_t out) {
    const linear_items<T> f{nullptr, nullptr, b.data(), nullptr, y.data(), nullptr, nullptr, n, 0, out};
    for (std::size_t e = 0; e < n * out; ++e) f.add_bias(e);
  }
  //! `y[t][o] = b[o]` over `n` tokens (zeros when `b` is empty): where the grids' forward starts.
  template <class T>
  static void set_bias(std::span<T> y, std::span<const T> b, std::size_t n, std::size_t out) {
    const linear_items<T> f{nullptr, nullptr, b.empty() ? nullptr : b.data(), nullptr, y.data(), nullptr, nullptr, n, 0, out};
    for (std::size_t e = 0; e < n * out; ++e) f.set_bias(e);
  }
  //! `acc[i] += x[i]`.
  template <class T>
  static void accumulate(std::span<T> acc, std::span<const T> x) {
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
  }
};

//! A column-parallel linear layer `Y_r = X A_r^T + b_r` (Megatron's `A = [A_1, ..., A_p]` split by
//! output features): this rank holds `out_local` rows of the weight (`[out_local][in]`) and of
//! the bias. The input enters the region (`tp_enter_forward`); the input gradient leaves through
//! `tp_enter_backward`. `Kernel` computes the local product (default `linear_kernel`).
template <class Kernel = linear_kernel>
struct column_parallel_linear {
  std::size_t in = 0;         //!< input features (whole)
  std::size_t out_local = 0;  //!< output features on this rank
  Kernel kernel{};            //!< the local product (a device kernel carries its stream)

  //! `x_full` receives the region's input (tokens of the whole region; may alias `x` in the
  //! replicated mode), `y` (`[n_full][out_local]`) the local output.
  template <class C, class T>
  void forward(tp_group<C>& g, std::span<const T> x, std::span<T> x_full, std::span<const T> w, std::span<const T> b,
               std::span<T> y) const {
    tp_enter_forward(g, x, x_full);
    kernel.forward(std::span<const T>(x_full), w, b, y, x_full.size() / in, in, out_local);
  }
  //! `dx_full` (scratch, `[n_full][in]`) receives the local partial input gradient, `dx` (this
  //! rank's tokens) its sum over the group.
  template <class C, class T>
  void backward_input(tp_group<C>& g, std::span<const T> dy, std::span<const T> w, std::span<T> dx_full,
                      std::span<T> dx) const {
    kernel.backward_input(dy, w, dx_full, dx_full.size() / in, in, out_local);
    tp_enter_backward(g, dx_full, dx);
  }
  //! Adds the weight and bias gradients of the local slice (no communication).
  template <class T>
  void backward_weight(std::span<const T> x_full, std::span<const T> dy, std::span<T> gw, std::span<T> gb) const {
    kernel.backward_weight(x_full, dy, gw, gb, x_full.size() / in, in, out_local);
  }
};

//! A row-parallel linear layer `Y = sum_r X_r A_r^T + b` (Megatron's `A` split by input
//! features): this rank holds `in_local` columns of the weight (`[out][in_local]`); the partial
//! products leave the region through `tp_exit_forward` (all-reduce or reduce-scatter) and the
//! bias is added after the sum, once. `Kernel` computes the local product.
template <class Kernel = linear_kernel>
struct row_parallel_linear {
  std::size_t in_local = 0;  //!< input features on this rank
  std::size_t out = 0;       //!< output features (whole)
  Kernel kernel{};           //!< the local product and the bias (a device kernel carries its stream)

  //! `partial` (scratch, `[n_full][out]`) receives the local partial product; `y` (this rank's
  //! tokens) the sum over the group plus `b`.
  template <class C, class T>
  void forward(tp_group<C>& g, std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> partial,
               std::span<T> y) const {
    kernel.forward(x, w, std::span<const T>{}, partial, x.size() / in_local, in_local, out);
    tp_exit_forward(g, partial, y);
    if (b.empty()) return;
    if constexpr (requires { kernel.add_bias(y, b, y.size() / out, out); }) kernel.add_bias(y, b, y.size() / out, out);
    else linear_kernel::add_bias(y, b, y.size() / out, out);  // a host kernel without its own
  }
  //! `dy_full` receives the output gradient over the region's tokens (`tp_exit_backward`), `dx`
  //! the local input gradient.
  template <class C, class T>
  void backward_input(tp_group<C>& g, std::span<const T> dy, std::span<T> dy_full, std::span<const T> w,
                      std::span<T> dx) const {
    tp_exit_backward(g, dy, dy_full);
    kernel.backward_input(std::span<const T>(dy_full), w, dx, dy_full.size() / out, in_local, out);
  }
  //! Adds the weight gradient of the local slice (`dy_full` as `backward_input` left it); the
  //! bias gradient is the caller's (it is taken over the tokens outside the region).
  template <class T>
  void backward_weight(std::span<const T> x, std::span<const T> dy_full, std::span<T> gw) const {
    kernel.backward_weight(x, dy_full, gw, std::span<T>{}, x.size() / in_local, in_local, out);
  }
};

//! The rule a tensor-parallel degree `tp` breaks for a layer with `heads` attention heads and
//! `ffn` hidden MLP features (Megatron splits both), or "".
constexpr text tp_rule(int tp, int heads, int ffn) {
  if (tp < 1) return "tensor parallel: tp " + detail::to_text(tp) + " is not a positive number of ranks";
  if (heads % tp != 0)
    return "tensor parallel: " + detail::to_text(heads) + " attention heads are not divisible by tp " + detail::to_text(tp);
  if (ffn % tp != 0)
    return "tensor parallel: " + detail::to_text(ffn) + " MLP features are not divisible by tp " + detail::to_text(tp);
  return {};
}

}  // namespace loom
