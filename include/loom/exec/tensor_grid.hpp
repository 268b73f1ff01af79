// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Tensor parallelism over a grid of ranks (issue 25): the linear layer `y = x W^T + b` of
//! `loom/exec/tensor_parallel.hpp` with both the weights *and* the activations split over a
//! `q x q` grid, by SUMMA (van de Geijn and Watts 1997) as Optimus uses it for 2D tensor
//! parallelism (Xu et al. 2021, "An Efficient 2D Method for Training Super-Large Deep Learning
//! Models", §3), and over `depth` such grids, each on its own slice of the tokens, for 2.5D
//! (Wang et al., ICPP 2022, "Tesseract: Parallelize the Tensor Parallelism Efficiently", §3).
//! The communication pattern (a broadcast along the row and one along the column per round, the
//! backward's partial products reduced to the round's root, the bias's pieces all-gathered over
//! the column) follows ColossalAI's legacy 2D operations (`hpcaitech/ColossalAI`,
//! `colossalai/legacy/nn/layer/parallel_2d/_operation.py`, `Matmul_AB_2D`, `Matmul_ABT_2D`,
//! `Matmul_ATB_2D`, `add_bias_2d`, at commit a7cca4df5ed46fcf3be622bbb7a240ba83c4b9b7); the code is
//! loom's own, over its communicators and its kernels' interface.
//!
//! **Layout.** Member `(layer k, row i, column j)` of the grid (`loom::tp_grid`) holds
//! - `X_{k q + i, j}`: token block `k q + i` of `depth x q` (contiguous, in order) and input
//!   feature block `j` of `q`, `[n][in / q]`;
//! - `W_{j, i}`: output block `j` and input block `i` of the weight `[out][in]`, stored
//!   `[out / q][in / q]`, the same on every layer (2.5D replicates the weights over depth);
//! - piece `i` of bias block `j`: `out / q^2` biases, `b[j out / q + i out / q^2 ...]`;
//! - `Y_{k q + i, j}`: the output, token block as its input, output feature block `j`,
//!   `[n][out / q]`: the layout of the next layer's input, so layers chain.
//!
//! **Forward** (`q` rounds): the column all-gathers the bias block, `Y` starts as it; in round `l`
//! the row broadcasts `X_{., l}` from its column `l`, the column broadcasts `W_{j, l}` from its row
//! `l`, and `Y += X_{., l} W_{j, l}^T`, each output element's running sum continued
//! (`linear_items::forward_add`). The inputs are added in their global order starting from the
//! bias, so the output is **bitwise** the single-rank `linear_kernel::forward`.
//!
//! **Backward, input** (`q` rounds): in round `l` the column broadcasts `W_{j, l}`, every member
//! forms `dY_{., j} W_{j, l}` (a sum over output block `j`) and the row reduces the `q` products to
//! its column `l`, which keeps `dX_{., l}`. **Backward, weight** (`q` rounds): in round `l` the row
//! broadcasts `X_{., l}`, every member forms `dY_{., j}^T X_{., l}` (a sum over its tokens) and the
//! column reduces them to its row `l`, which keeps the gradient of its own `W_{j, l}`; 2.5D sums
//! it over the depth group (an all-reduce: the weights are replicated there) before adding it to
//! `gw`. The bias gradient is each member's column sum of `dY`, reduce-scattered over the column
//! to the pieces (and all-reduced over depth). The two halves are separate calls, as loom's
//! split backward (zero-bubble schedules) wants.
//!
//! **What the sums equal.** The backward adds blocks' partial sums: `dX` is `((P_0 + P_1) + ...)`
//! over the output blocks, each `P_j` a sum from zero over its block; the weight and bias
//! gradients likewise over token blocks (rows, then layers). `summa_reference` computes exactly
//! these sums on one rank; in deterministic mode (`tp_grid_comms::ordered`, rank-ordered sums on
//! every backend: `loom::ordered_reduce`, `ordered_reduce_scatter`, `ordered_all_reduce`) the grid
//! equals it bit for bit; otherwise within rounding.
//!
//! **Volume per rank** (elements, a broadcast and a reduce counted as their buffer, as
//! `loom::counted` counts them; `n` tokens per member, `in`, `out` whole):
//! forward `q (n in / q) + q (out in / q^2) + out / q` (broadcasts, then the bias all-gather's
//! output); backward input `q (out in / q^2)` broadcast `+ q (n in / q)` reduced; backward weight
//! `q (n in / q)` broadcast `+ q (out in / q^2)` reduced `+ out / q` reduce-scattered, and with
//! depth `d > 1` an all-reduce of `out in / q^2 + out / q^2` over the depth group.
//! **Device groups.** Every copy goes through the group's `copy` where it has one and every
//! fill and addition through the kernel (`set_bias`, `forward_add`, `accumulate`), so with the
//! grid groups bound to a stream (`loom::on_stream`) and `loom::cuda::linear_kernel` the layers
//! run on device memory, enqueued on that stream; `grid_layer_norm` likewise with
//! `loom::cuda::norm_kernel`.
//!
//! `summa_volume` returns these; the tests compare them with the counters. A group of one rank
//! (`q = 1`, or depth 1) sends nothing.

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/counting.hpp"
#include "loom/comm/ordered.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/mesh/mesh.hpp"
#include "loom/mesh/grid_volume.hpp"
#include "loom/mesh/mesh_comm.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! One member's view of a tensor-parallel grid: its row, column and depth groups (any
//! communicator with `broadcast`, `reduce`, `all_gather`, `reduce_scatter` and `all_reduce`), the
//! grid's shape, the member's place, and whether sums are rank-ordered (deterministic mode).
template <class C>
struct tp_grid_comms {
  C* row = nullptr;     //!< the member's row of its layer, ordered by column
  C* column = nullptr;  //!< the member's column of its layer, ordered by row
  C* depth = nullptr;   //!< the members at its (row, column) of every layer, ordered by layer
  tp_grid shape{};      //!< the grid
  int member = 0;       //!< the member's index in the tensor-parallel group
  bool ordered = false; //!< rank-ordered sums (bitwise reproducible on every backend)

  //! The side of the grid.
  std::size_t q() const { return static_cast<std::size_t>(shape.q); }
  //! The member's row.
  int row_index() const { return shape.row(member); }
  //! The member's column.
  int column_index() const { return shape.column(member); }
  //! The member's layer.
  int layer_index() const { return shape.layer(member); }
};

//! The grid groups of this rank of `mc` (its mesh's tensor-parallel dimension must be a grid).
template <class Mesh, class Comm>
tp_grid_comms<typename mesh_comm<Mesh, Comm>::comm_type> grid_comms(mesh_comm<Mesh, Comm>& mc, bool ordered) {
  return {&mc.grid(grid_group::row), &mc.grid(grid_group::column), &mc.grid(grid_group::depth), mc.mesh().grid(),
          mc.coord(dim::tp), ordered};
}

//! Scratch of one member for `summa_linear` (host memory; a device layer passes device spans of
//! the same sizes): `x` one input block, `w` one weight block, `b` one bias block, `part` one
//! partial product (the larger of an input block and a weight block plus a bias block), `grad`
//! the member's own weight and bias gradient before the depth sum.
template <class T>
struct summa_scratch {
  std::span<T> x, w, b, part, grad;  //!< the buffers (see the struct comment)
};

//! `summa_scratch` over owned host vectors, sized for `n` tokens per member.
template <class T>
class summa_host_scratch {
 public:
  //! Buffers for the layer `in` x `out` on a grid of side `q`, `n` tokens per member.
  summa_host_scratch(std::size_t n, std::size_t in, std::size_t out, std::size_t q)
      : x_(n * in / q), w_((out / q) * (in / q)), b_(out / q),
        part_(std::max(n * in / q, (out / q) * (in / q) + out / q)), grad_((out / q) * (in / q) + out / (q * q)) {}
  //! The spans.
  summa_scratch<T> spans() { return {x_, w_, b_, part_, grad_}; }

 private:
  std::vector<T> x_, w_, b_, part_, grad_;
};

namespace detail {

//! `to = from` on the group's stream (a device group, `loom::on_stream`) or on the host.
template <class C, class T>
void grid_copy(C& c, std::span<const T> from, std::span<T> to) {
  if constexpr (requires { c.copy(from, to); }) c.copy(from, to);
  else std::copy(from.begin(), from.end(), to.begin());
}
//! The sum of `in` over `c` scattered into `out` (rank-ordered when `ordered`; a copy on one rank).
template <class C, class T>
void grid_scatter_sum(bool ordered, C& c, std::span<const T> in, std::span<T> out) {
  if (c.size() == 1) return grid_copy(c, in, out);
  if (!ordered) return c.reduce_scatter(in, out, reduce_op::sum);
  if constexpr (requires { c.ordered_reduce_scatter(in, out); }) c.ordered_reduce_scatter(in, out);
  else ordered_reduce_scatter(c, in, out);
}
//! The sum of `data` over `c` in place (rank-ordered when `ordered`; nothing on one rank).
template <class C, class T>
void grid_all_sum(bool ordered, C& c, std::span<T> data) {
  if (c.size() == 1) return;
  if (!ordered) return c.all_reduce(data, reduce_op::sum);
  if constexpr (requires { c.ordered_all_reduce(data); }) c.ordered_all_reduce(data);
  else ordered_all_reduce(c, data);
}

}  // namespace detail

//! The linear layer `y = x W^T + b` on a 2D or 2.5D grid (see the file comment). `in` and `out`
//! are the whole layer's features; the spans each member passes are its blocks. `Kernel` is
//! the local product (`linear_kernel` by default, `loom::cuda::linear_kernel` on device groups; it
//! needs `forward_add`, `set_bias`, `accumulate`, `backward_input` and `backward_weight` with
//! `linear_kernel`'s signatures).
template <class Kernel = linear_kernel>
struct summa_linear {
  std::size_t in = 0;   //!< input features (whole)
  std::size_t out = 0;  //!< output features (whole)
  Kernel kernel{};      //!< the local products

  //! `y` (`[n][out / q]`) = this member's output block: `x` its input block `[n][in / q]`, `w` its
  //! weight block `[out / q][in / q]`, `b` its bias piece `[out / q^2]` (empty: no bias).
  template <class C, class T>
  void forward(tp_grid_comms<C>& g, std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> y,
               summa_scratch<T> s) const {
    const std::size_t q = g.q(), inq = in / q, outq = out / q, n = tokens(g, x.size());
    expect("output", y.size(), n * outq);
    expect("weight block", w.size(), outq * inq);
    std::span<const T> bias;
    if (!b.empty()) {
      expect("bias piece", b.size(), outq / q);
      gather(*g.column, b, s.b.first(outq));
      bias = s.b.first(outq);
    }
    kernel.set_bias(y, bias, n, outq);
    const std::span<T> xb = s.x.first(n * inq), wb = s.w.first(outq * inq);
    for (std::size_t l = 0; l < q; ++l) {
      const int root = static_cast<int>(l);
      if (g.column_index() == root) copy(*g.row, x, xb);
      broadcast(*g.row, xb, root);
      if (g.row_index() == root) copy(*g.column, w, wb);
      broadcast(*g.column, wb, root);
      kernel.forward_add(std::span<const T>(xb), std::span<const T>(wb), y, n, inq, outq);
    }
  }

  //! `dx` (`[n][in / q]`) = this member's input gradient block, from its output gradient block
  //! `dy` (`[n][out / q]`) and weight block `w`.
  template <class C, class T>
  void backward_input(tp_grid_comms<C>& g, std::span<const T> dy, std::span<const T> w, std::span<T> dx,
                      summa_scratch<T> s) const {
    check_reduces(g);
    const std::size_t q = g.q(), inq = in / q, outq = out / q, n = tokens(g, dx.size());
    expect("output gradient", dy.size(), n * outq);
    const std::span<T> wb = s.w.first(outq * inq), part = s.part.first(n * inq);
    for (std::size_t l = 0; l < q; ++l) {
      const int root = static_cast<int>(l);
      if (g.row_index() == root) copy(*g.column, w, wb);
      broadcast(*g.column, wb, root);
      kernel.backward_input(dy, std::span<const T>(wb), part, n, inq, outq);
      reduce(g, *g.row, part, root);
      if (g.column_index() == root) copy(*g.row, std::span<const T>(part), dx);
    }
  }

  //! Adds this member's weight-block gradient to `gw` (`[out / q][in / q]`) and its bias-piece
  //! gradient to `gb` (`[out / q^2]`; empty: no bias), from its input block `x` and output
  //! gradient block `dy`.
  template <class C, class T>
  void backward_weight(tp_grid_comms<C>& g, std::span<const T> x, std::span<const T> dy, std::span<T> gw, std::span<T> gb,
                       summa_scratch<T> s) const {
    check_reduces(g);
    const std::size_t q = g.q(), inq = in / q, outq = out / q, n = tokens(g, x.size());
    expect("output gradient", dy.size(), n * outq);
    expect("weight gradient block", gw.size(), outq * inq);
    const std::span<T> xb = s.x.first(n * inq), part = s.part.first(outq * inq), own = s.grad.first(outq * inq);
    for (std::size_t l = 0; l < q; ++l) {
      const int root = static_cast<int>(l);
      if (g.column_index() == root) copy(*g.row, x, xb);
      broadcast(*g.row, xb, root);
      kernel.set_bias(part, std::span<const T>{}, 1, part.size());
      kernel.backward_weight(std::span<const T>(xb), dy, part, std::span<T>{}, n, inq, outq);
      reduce(g, *g.column, part, root);
      if (g.row_index() == root) copy(*g.column, std::span<const T>(part), own);
    }
    std::size_t own_size = outq * inq;
    if (!gb.empty()) {
      expect("bias gradient piece", gb.size(), outq / q);
      const std::span<T> col = s.part.first(outq);
      kernel.set_bias(col, std::span<const T>{}, 1, outq);
      kernel.backward_weight(std::span<const T>{}, dy, std::span<T>{}, col, n, 0, outq);
      const std::span<T> piece = s.grad.subspan(outq * inq, outq / q);
      scatter_sum(g, *g.column, std::span<const T>(col), piece);
      own_size += outq / q;
    }
    const std::span<T> mine = s.grad.first(own_size);
    if (g.shape.depth > 1) all_sum(g, *g.depth, mine);
    kernel.accumulate(gw, std::span<const T>(mine.first(outq * inq)));
    kernel.accumulate(gb, std::span<const T>(mine.subspan(outq * inq, gb.size())));
  }

 private:
  // On a group of one rank nothing is sent (and nothing counted).
  template <class C, class T>
  static void broadcast(C& c, std::span<T> data, int root) {
    if (c.size() > 1) c.broadcast(data, root);
  }
  template <class C, class T>
  static void gather(C& c, std::span<const T> in, std::span<T> out) {
    if (c.size() > 1) c.all_gather(in, out);
    else copy(c, in, out);
  }
  template <class C, class T>
  static void reduce(tp_grid_comms<C>& g, C& c, std::span<T> data, int root) {
    if (c.size() == 1) return;
    if (!g.ordered) return c.reduce(data, root, reduce_op::sum);
    if constexpr (rooted_communicator<C>) ordered_reduce(c, data, root);
    else c.reduce(data, root, reduce_op::sum);  // a device group: rank-ordered or two ranks (`check_reduces`)
  }
  // A deterministic reduce on a device group needs the group's own reduce to be rank-ordered
  // (cuda_local) or the group to have at most two ranks: refused before any communication.
  template <class C>
  static void check_reduces(const tp_grid_comms<C>& g) {
    if constexpr (!rooted_communicator<C>) {
      if (g.ordered && !reduces_in_rank_order<C> && g.q() > 2)
        throw config_error("tensor parallel " + std::string(g.shape.describe().view()) +
                           ": a deterministic reduce over " + std::to_string(g.q()) +
                           " ranks of a device group without rank-ordered sums (nccl) is not built yet");
    }
  }
  template <class C, class T>
  static void copy(C& c, std::span<const T> from, std::span<T> to) {
    detail::grid_copy(c, from, to);
  }
  template <class C, class T>
  static void scatter_sum(tp_grid_comms<C>& g, C& c, std::span<const T> in, std::span<T> out) {
    detail::grid_scatter_sum(g.ordered, c, in, out);
  }
  template <class C, class T>
  static void all_sum(tp_grid_comms<C>& g, C& c, std::span<T> data) {
    detail::grid_all_sum(g.ordered, c, data);
  }
  template <class C>
  std::size_t tokens(const tp_grid_comms<C>& g, std::size_t block) const {
    if (!g.shape.is_grid() || g.shape.kind == tp_kind::d3)
      throw config_error("tensor parallel " + std::string(g.shape.describe().view()) +
                         ": SUMMA's layer runs on the 2d and 2.5d grids");
    const std::size_t q = g.q();
    if (in % q != 0 || out % (q * q) != 0)
      throw config_error(std::string(summa_rule(in, out, q * static_cast<std::size_t>(g.shape.depth), g.shape).view()));
    const std::size_t inq = in / q;
    if (block % inq != 0)
      throw std::length_error("loom summa_linear: an activation block of " + std::to_string(block) +
                              " elements is not a whole number of tokens of " + std::to_string(inq) + " features");
    return block / inq;
  }
  static void expect(const char* what, std::size_t got, std::size_t want) {
    if (got != want)
      throw std::length_error(std::string("loom summa_linear: the ") + what + " has " + std::to_string(got) +
                              " elements; the layer needs " + std::to_string(want));
  }
};

//! The sums of `summa_linear` and `cube_linear` on one rank, over whole matrices (tokens `[N]`, `N` a multiple of
//! `depth x q`): the order in which the grid adds its blocks' partial sums (see the file
//! comment). The forward needs none: it is `linear_kernel::forward`.
struct summa_reference {
  //! `dx[t][i] = ((P_0 + P_1) + ...)`, `P_j = sum_{o in output block j} dy[t][o] w[o][i]` from zero.
  template <class T>
  static void backward_input(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n, std::size_t in,
                             std::size_t out, const tp_grid& g) {
    const auto q = static_cast<std::size_t>(g.q);
    const std::size_t outq = out / q;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < in; ++i) {
        T acc{};
        for (std::size_t j = 0; j < q; ++j) {
          T p{};
          for (std::size_t o = j * outq; o < (j + 1) * outq; ++o) p += dy[t * out + o] * w[o * in + i];
          acc = j == 0 ? p : acc + p;
        }
        dx[t * in + i] = acc;
      }
  }
  //! `gw[o][i] += sum over layers k of (sum over rows r of P_{k q + r})`, each `P_b = sum_{t in
  //! token block b} dy[t][o] x[t][i]` from zero, the sums in order; `gb` likewise (may be empty).
  template <class T>
  static void backward_weight(std::span<const T> x, std::span<const T> dy, std::span<T> gw, std::span<T> gb, std::size_t n,
                              std::size_t in, std::size_t out, const tp_grid& g) {
    blocked_weight(x, dy, gw, gb, n, in, out, static_cast<std::size_t>(g.q), static_cast<std::size_t>(g.depth));
  }
  //! `dx` as `backward_input`, and the 3D grid's forward: `y[t][o] = ((P_0 + P_1) + ...) + b[o]`,
  //! `P_j = sum_{i in input block j} x[t][i] w[o][i]` from zero over the `q` input blocks (`b`
  //! may be empty).
  template <class T>
  static void blocked_forward(std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> y, std::size_t n,
                              std::size_t in, std::size_t out, std::size_t q) {
    const std::size_t inq = in / q;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t o = 0; o < out; ++o) {
        T acc{};
        for (std::size_t j = 0; j < q; ++j) {
          T p{};
          for (std::size_t i = j * inq; i < (j + 1) * inq; ++i) p += x[t * in + i] * w[o * in + i];
          acc = j == 0 ? p : acc + p;
        }
        y[t * out + o] = b.empty() ? acc : acc + b[o];
      }
  }
  //! `gw[o][i] += sum over layers k of (sum over rows r of P_{k rows + r})` over `rows x layers`
  //! equal token blocks, each `P` from zero, the sums in order; `gb` likewise (may be empty).
  template <class T>
  static void blocked_weight(std::span<const T> x, std::span<const T> dy, std::span<T> gw, std::span<T> gb, std::size_t n,
                             std::size_t in, std::size_t out, std::size_t q, std::size_t d) {
    const std::size_t nb = n / (q * d);
    auto sum = [&](auto term) {
      T total{};
      for (std::size_t k = 0; k < d; ++k) {
        T layer{};
        for (std::size_t r = 0; r < q; ++r) {
          T p{};
          const std::size_t b = k * q + r;
          for (std::size_t t = b * nb; t < (b + 1) * nb; ++t) p += term(t);
          layer = r == 0 ? p : layer + p;
        }
        total = k == 0 ? layer : total + layer;
      }
      return total;
    };
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t i = 0; i < in; ++i) gw[o * in + i] += sum([&](std::size_t t) { return dy[t * out + o] * x[t * in + i]; });
      if (!gb.empty()) gb[o] += sum([&](std::size_t t) { return dy[t * out + o]; });
    }
  }
};

//! Where a member's blocks sit in the whole matrices (see the file comment), to cut them out of
//! a single-rank model and put results back.
struct summa_layout {
  tp_grid grid{};   //!< the grid
  int member = 0;   //!< the member

  //! Copies the member's block of an activation `[N][features]` (its token block, feature
  //! block `column`) out of `whole` into `block`, or back when `to_whole`.
  template <class T>
  void activation(std::span<T> whole, std::span<T> block, std::size_t tokens, std::size_t features, bool to_whole) const {
    const auto q = static_cast<std::size_t>(grid.q);
    const std::size_t nb = tokens / (q * static_cast<std::size_t>(grid.depth)), fq = features / q;
    const std::size_t t0 = static_cast<std::size_t>(grid.layer(member) * grid.q + grid.row(member)) * nb;
    const std::size_t f0 = static_cast<std::size_t>(grid.column(member)) * fq;
    copy(whole, block, t0, nb, f0, fq, features, to_whole);
  }
  //! The member's weight block `W_{column, row}` of `whole` `[out][in]`, as `activation`.
  template <class T>
  void weight(std::span<T> whole, std::span<T> block, std::size_t in, std::size_t out, bool to_whole) const {
    const auto q = static_cast<std::size_t>(grid.q);
    copy(whole, block, static_cast<std::size_t>(grid.column(member)) * (out / q), out / q,
         static_cast<std::size_t>(grid.row(member)) * (in / q), in / q, in, to_whole);
  }
  //! The member's bias piece of `whole` `[out]`, as `activation`.
  template <class T>
  void bias(std::span<T> whole, std::span<T> block, std::size_t out, bool to_whole) const {
    const auto q = static_cast<std::size_t>(grid.q);
    const std::size_t at = static_cast<std::size_t>(grid.column(member)) * (out / q) +
                           static_cast<std::size_t>(grid.row(member)) * (out / (q * q));
    copy(whole, block, 0, 1, at, out / (q * q), out, to_whole);
  }

 private:
  template <class T>
  static void copy(std::span<T> whole, std::span<T> block, std::size_t r0, std::size_t rows, std::size_t c0, std::size_t cols,
                   std::size_t stride, bool to_whole) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        T& w = whole[(r0 + r) * stride + c0 + c];
        T& b = block[r * cols + c];
        if (to_whole) w = b;
        else b = w;
      }
  }
};

//! Scratch of one member for `cube_linear`, sized by `cube_host_scratch`: `x` a gathered input
//! block `[q n][in / q]`, `w` a gathered weight block `[out / q][in / q]` and its bias block
//! `[out / q]` after it, `dy` a gathered output (gradient) block `[q n][out / q]`, `part` the
//! larger of a partial product `[q n][max(in, out) / q]` and a partial weight and bias gradient,
//! `grad` the member's own weight and bias gradient pieces.
template <class T>
struct cube_scratch {
  std::span<T> x, w, dy, part, grad;  //!< the buffers (see the struct comment)
};

//! `cube_scratch` over owned host vectors, for `n` tokens per member.
template <class T>
class cube_host_scratch {
 public:
  //! Buffers for the layer `in` x `out` on a cube of side `q`, `n` tokens per member.
  cube_host_scratch(std::size_t n, std::size_t in, std::size_t out, std::size_t q)
      : x_(q * n * (in / q)), w_((out / q) * (in / q) + out / q), dy_(q * n * (out / q)),
        part_(std::max(q * n * (std::max(in, out) / q), (out / q) * (in / q) + out / q)),
        grad_((out / (q * q)) * (in / q) + out / (q * q)) {}
  //! The spans.
  cube_scratch<T> spans() { return {x_, w_, dy_, part_, grad_}; }

 private:
  std::vector<T> x_, w_, dy_, part_, grad_;
};

//! The linear layer `y = x W^T + b` on a 3D grid (Bian et al. 2021): each member all-gathers its
//! input block over the input group and its weight block over the weight group, multiplies, and
//! reduce-scatters the product over the output group (then adds the bias); the backward
//! all-gathers the output gradient over the output group, reduce-scatters the input gradient
//! over the input group and the weight and bias gradients over the weight group. Member `(a, b,
//! c)` (`cube_roles`) holds token slice `c` of `X_{a, b}` (`[n][in / q]`, `n = N / q^2`), rows
//! slice `a` of `W_{c, b}` (`[out / q^2][in / q]`), piece `a` of bias block `c` (`[out / q^2]`),
//! and receives token slice `b` of `Y_{a, c}` (`[n][out / q]`): the next layer, of the other
//! parity (`odd`), takes it as its input. Every sum is a reduce-scatter, rank-ordered in
//! deterministic mode: the forward is `summa_reference::blocked_forward`, the input gradient
//! `summa_reference::backward_input` and the weight gradient `summa_reference::blocked_weight`
//! over `q` token blocks, bit for bit. `Kernel` needs `forward`, `set_bias`, `accumulate`,
//! `backward_input` and `backward_weight` (and `add_bias` on device memory), as `linear_kernel`.
template <class Kernel = linear_kernel>
struct cube_linear {
  std::size_t in = 0;   //!< input features (whole)
  std::size_t out = 0;  //!< output features (whole)
  bool odd = false;     //!< the layer's parity (`cube_roles`)
  Kernel kernel{};      //!< the local products

  //! `y` (`[n][out / q]`) = this member's output slice, from its input slice `x` (`[n][in / q]`),
  //! weight piece `w` (`[out / q^2][in / q]`) and bias piece `b` (`[out / q^2]`; empty: none).
  template <class C, class T>
  void forward(tp_grid_comms<C>& g, std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> y,
               cube_scratch<T> s) const {
    const std::size_t q = g.q(), inq = in / q, outq = out / q, n = tokens(g, x.size());
    expect("output", y.size(), n * outq);
    expect("weight piece", w.size(), (outq / q) * inq);
    const cube_roles r = cube_roles::of(g.shape, g.member, odd);
    C& input = group(g, r.input());
    C& weights = group(g, cube_roles::weight());
    C& output = group(g, r.output());
    const std::span<T> xb = s.x.first(q * n * inq), wb = s.w.first(outq * inq), part = s.part.first(q * n * outq);
    gather(input, x, xb);
    gather(weights, w, wb);
    kernel.forward(std::span<const T>(xb), std::span<const T>(wb), std::span<const T>{}, part, q * n, inq, outq);
    scatter(g, output, std::span<const T>(part), y);
    if (b.empty()) return;
    expect("bias piece", b.size(), outq / q);
    const std::span<T> bb = s.w.subspan(outq * inq, outq);
    gather(weights, b, bb);
    if constexpr (requires { kernel.add_bias(y, std::span<const T>(bb), n, outq); }) kernel.add_bias(y, std::span<const T>(bb), n, outq);
    else linear_kernel::add_bias(y, std::span<const T>(bb), n, outq);
  }

  //! `dx` (`[n][in / q]`) = this member's input gradient slice, from its output gradient slice
  //! `dy` (`[n][out / q]`) and weight piece `w`.
  template <class C, class T>
  void backward_input(tp_grid_comms<C>& g, std::span<const T> dy, std::span<const T> w, std::span<T> dx,
                      cube_scratch<T> s) const {
    const std::size_t q = g.q(), inq = in / q, outq = out / q, n = tokens(g, dx.size());
    expect("output gradient", dy.size(), n * outq);
    const cube_roles r = cube_roles::of(g.shape, g.member, odd);
    const std::span<T> dyb = s.dy.first(q * n * outq), wb = s.w.first(outq * inq), part = s.part.first(q * n * inq);
    gather(group(g, r.output()), dy, dyb);
    gather(group(g, cube_roles::weight()), w, wb);
    kernel.backward_input(std::span<const T>(dyb), std::span<const T>(wb), part, q * n, inq, outq);
    scatter(g, group(g, r.input()), std::span<const T>(part), dx);
  }

  //! Adds this member's weight-piece gradient to `gw` (`[out / q^2][in / q]`) and bias-piece
  //! gradient to `gb` (`[out / q^2]`; empty: none), from its input slice `x` and output gradient
  //! slice `dy`.
  template <class C, class T>
  void backward_weight(tp_grid_comms<C>& g, std::span<const T> x, std::span<const T> dy, std::span<T> gw, std::span<T> gb,
                       cube_scratch<T> s) const {
    const std::size_t q = g.q(), inq = in / q, outq = out / q, n = tokens(g, x.size());
    expect("output gradient", dy.size(), n * outq);
    expect("weight gradient piece", gw.size(), (outq / q) * inq);
    const cube_roles r = cube_roles::of(g.shape, g.member, odd);
    C& weights = group(g, cube_roles::weight());
    const std::span<T> xb = s.x.first(q * n * inq), dyb = s.dy.first(q * n * outq);
    gather(group(g, r.input()), x, xb);
    gather(group(g, r.output()), dy, dyb);
    const std::size_t wsize = outq * inq, bsize = gb.empty() ? 0 : outq;
    const std::span<T> pw = s.part.first(wsize), pb = s.part.subspan(wsize, bsize);
    kernel.set_bias(s.part.first(wsize + bsize), std::span<const T>{}, 1, wsize + bsize);
    kernel.backward_weight(std::span<const T>(xb), std::span<const T>(dyb), pw, pb, q * n, inq, outq);
    // The weight pieces, then the bias pieces, each reduce-scattered over the weight group.
    const std::span<T> sw = s.grad.first(wsize / q), sb = s.grad.subspan(wsize / q, bsize / q);
    scatter(g, weights, std::span<const T>(pw), sw);
    if (!gb.empty()) {
      expect("bias gradient piece", gb.size(), outq / q);
      scatter(g, weights, std::span<const T>(pb), sb);
    }
    kernel.accumulate(gw, std::span<const T>(sw));
    kernel.accumulate(gb, std::span<const T>(sb));
  }

 private:
  template <class C>
  static C& group(tp_grid_comms<C>& g, grid_group x) {
    switch (x) {
      case grid_group::row: return *g.row;
      case grid_group::column: return *g.column;
      case grid_group::depth: return *g.depth;
    }
    return *g.row;
  }
  template <class C, class T>
  static void gather(C& c, std::span<const T> in, std::span<T> out) {
    if (c.size() > 1) c.all_gather(in, out);
    else detail::grid_copy(c, in, out);
  }
  template <class C, class T>
  static void scatter(tp_grid_comms<C>& g, C& c, std::span<const T> in, std::span<T> out) {
    detail::grid_scatter_sum(g.ordered, c, in, out);
  }
  template <class C>
  std::size_t tokens(const tp_grid_comms<C>& g, std::size_t block) const {
    const std::size_t q = g.q();
    if (g.shape.kind != tp_kind::d3 || in % q != 0 || out % (q * q) != 0)
      throw config_error(std::string(cube_rule(in, out, q * q, g.shape).view()));
    const std::size_t inq = in / q;
    if (block % inq != 0)
      throw std::length_error("loom cube_linear: an activation slice of " + std::to_string(block) +
                              " elements is not a whole number of tokens of " + std::to_string(inq) + " features");
    return block / inq;
  }
  static void expect(const char* what, std::size_t got, std::size_t want) {
    if (got != want)
      throw std::length_error(std::string("loom cube_linear: the ") + what + " has " + std::to_string(got) +
                              " elements; the layer needs " + std::to_string(want));
  }
};

//! Where a member's slices sit in the whole matrices of a 3D layer of parity `odd` (see
//! `cube_linear`), to cut them out of a single-rank model and put results back.
struct cube_layout {
  tp_grid grid{};    //!< the cube
  int member = 0;    //!< the member
  bool odd = false;  //!< the layer's parity

  //! The member's input slice of an activation `[N][features]` (token slice `c` of block `a`,
  //! feature block `b`), copied out of `whole` into `block`, or back when `to_whole`. The output
  //! slice of a layer is the input slice of the next (`odd` flipped).
  template <class T>
  void input(std::span<T> whole, std::span<T> block, std::size_t tokens, std::size_t features, bool to_whole) const {
    const cube_roles r = cube_roles::of(grid, member, odd);
    slice(whole, block, tokens, features, r.a, r.c, r.b, to_whole);
  }
  //! The member's output slice of `[N][features]` (token slice `b` of block `a`, feature block `c`).
  template <class T>
  void output(std::span<T> whole, std::span<T> block, std::size_t tokens, std::size_t features, bool to_whole) const {
    const cube_roles r = cube_roles::of(grid, member, odd);
    slice(whole, block, tokens, features, r.a, r.b, r.c, to_whole);
  }
  //! The member's weight piece of `whole` `[out][in]` (rows slice `a` of output block `c`, input
  //! block `b`).
  template <class T>
  void weight(std::span<T> whole, std::span<T> block, std::size_t in, std::size_t out, bool to_whole) const {
    const cube_roles r = cube_roles::of(grid, member, odd);
    const auto q = static_cast<std::size_t>(grid.q);
    const std::size_t rows = out / (q * q), cols = in / q;
    const std::size_t r0 = static_cast<std::size_t>(r.c) * (out / q) + static_cast<std::size_t>(r.a) * rows;
    const std::size_t c0 = static_cast<std::size_t>(r.b) * cols;
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) move(whole[(r0 + i) * in + c0 + j], block[i * cols + j], to_whole);
  }
  //! The member's bias piece of `whole` `[out]` (piece `a` of block `c`).
  template <class T>
  void bias(std::span<T> whole, std::span<T> block, std::size_t out, bool to_whole) const {
    const cube_roles r = cube_roles::of(grid, member, odd);
    const auto q = static_cast<std::size_t>(grid.q);
    const std::size_t at = static_cast<std::size_t>(r.c) * (out / q) + static_cast<std::size_t>(r.a) * (out / (q * q));
    for (std::size_t i = 0; i < out / (q * q); ++i) move(whole[at + i], block[i], to_whole);
  }

 private:
  template <class T>
  static void move(T& whole, T& block, bool to_whole) {
    if (to_whole) whole = block;
    else block = whole;
  }
  template <class T>
  void slice(std::span<T> whole, std::span<T> block, std::size_t tokens, std::size_t features, int blk, int sl, int fb,
             bool to_whole) const {
    const auto q = static_cast<std::size_t>(grid.q);
    const std::size_t n = tokens / (q * q), fq = features / q;
    const std::size_t t0 = static_cast<std::size_t>(blk) * (tokens / q) + static_cast<std::size_t>(sl) * n;
    const std::size_t f0 = static_cast<std::size_t>(fb) * fq;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t f = 0; f < fq; ++f) move(whole[(t0 + t) * features + f0 + f], block[t * fq + f], to_whole);
  }
};

//! The groups a layer norm over grid-split activations uses (see `grid_layer_norm`): `features`
//! holds a token's feature blocks (ordered by block), `pieces` the members with the same feature
//! block and other tokens of one grid layer (ordered by token block; the norm's weights are
//! split over it in pieces), `replicas` the members that hold the same pieces (2.5D's and 3D's
//! depth group; one rank on a 2D grid).
template <class C>
struct norm_groups {
  C* features = nullptr;  //!< sums of a token's statistics
  C* pieces = nullptr;    //!< the weights' pieces (all-gathered, gradients reduce-scattered)
  C* replicas = nullptr;  //!< the pieces' replicas (gradients all-reduced)
  bool ordered = false;   //!< rank-ordered sums (deterministic mode)

  //! On a 2D or 2.5D grid (`summa_linear`'s layout): the row, the column and the depth group.
  static norm_groups of_summa(const tp_grid_comms<C>& g) { return {g.row, g.column, g.depth, g.ordered}; }
  //! On a 3D grid, for activations laid out as the input of a layer of parity `odd`
  //! (`cube_linear`): the output group (it varies the feature block), the input group (the token
  //! slice) and the depth group (the token block).
  static norm_groups of_cube(const tp_grid_comms<C>& g, bool odd) {
    const cube_roles r{0, 0, 0, odd};
    auto pick = [&](grid_group x) { return x == grid_group::row ? g.row : x == grid_group::column ? g.column : g.depth; };
    return {pick(r.output()), pick(r.input()), g.depth, g.ordered};
  }
};

//! Scratch of one member for `grid_layer_norm`: `w` the gathered weight and bias blocks (`2 x
//! h / q`), `stats` two values per token, `part` the weights' partial gradients (`2 x h / q`),
//! `grad` their pieces (`2 x h / q^2`).
template <class T>
struct norm_scratch {
  std::span<T> w, stats, part, grad;  //!< the buffers (see the struct comment)
};

//! `norm_scratch` over owned host vectors, for `n` tokens per member, `h` features, side `q`.
template <class T>
class norm_host_scratch {
 public:
  //! The buffers.
  norm_host_scratch(std::size_t n, std::size_t h, std::size_t q) : w_(2 * (h / q)), stats_(2 * n), part_(2 * (h / q)), grad_(2 * (h / (q * q))) {}
  //! The spans.
  norm_scratch<T> spans() { return {w_, stats_, part_, grad_}; }

 private:
  std::vector<T> w_, stats_, part_, grad_;
};

//! The host form of `grid_layer_norm`'s local steps: each step's items (`loom::norm_items`) in
//! order, and `acc += x`. `loom::cuda::norm_kernel` is the same on a stream.
struct norm_kernel {
  //! Every item of `step`.
  template <class T>
  void run(const norm_items<T>& m, norm_step step) const {
    const std::size_t count = m.count(step);
    for (std::size_t i = 0; i < count; ++i) m(step, i);
  }
  //! `acc[i] += x[i]`.
  template <class T>
  void accumulate(std::span<T> acc, std::span<const T> x) const {
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
  }
};

//! A layer norm `y = (x - mean) / sqrt(var + eps) g + b` over `h` features split into `q` blocks
//! over the `features` group (Optimus' and Tesseract's layer norm on the grid; ColossalAI's
//! `layernorm_3d` for the 3D one): each member sums its block of every token's row, the group
//! all-reduces the sums (the mean first, then the variance around it: two passes, as the
//! single-rank norm), and each member normalises its block. The backward all-reduces the two
//! row sums of `dxhat = dy g`. The weights `g` and `b` are split like `summa_linear`'s biases:
//! each member holds piece `p` (its index in `pieces`) of its feature block, `h / q^2` values,
//! all-gathered over `pieces` in the forward; their gradients are each member's sums over its
//! tokens, reduce-scattered over `pieces` and all-reduced over `replicas`.
//!
//! Every sum is blocked: a row's statistic is `((S_0 + S_1) + ...)` over the feature blocks, each
//! from zero; a weight's gradient sums its token blocks as `summa_reference::blocked_weight`.
//! `grid_norm_reference` computes the same sums on one rank.
//!
//! `Kernel` runs the local steps (`norm_step`, the items of `loom::norm_items`) and the final
//! accumulation: `norm_kernel` on the host; `loom::cuda::norm_kernel` enqueues them on a stream,
//! so with the groups bound to that stream (`loom::on_stream`) the norm runs on device memory
//! without synchronising the host. Copies go through the group's `copy` where it has one.
template <class Kernel = norm_kernel>
struct grid_layer_norm {
  std::size_t h = 0;   //!< features (whole)
  double eps = 1e-5;   //!< added to the variance
  Kernel kernel{};     //!< the local steps

  //! `y`, `xhat` (`[n][h / q]`) and `rstd` (`[n]`, `1 / sigma` per token) from `x` and the
  //! member's pieces `g`, `b` (`[h / q^2]`).
  template <class C, class T>
  void forward(norm_groups<C>& ng, std::span<const T> x, std::span<const T> g, std::span<const T> b, std::span<T> y,
               std::span<T> xhat, std::span<T> rstd, norm_scratch<T> s) const {
    const std::size_t hq = block(ng), n = rstd.size();
    check(x.size(), n * hq, "input");
    check(y.size(), n * hq, "output");
    check(xhat.size(), n * hq, "normalised input");
    check(g.size() + b.size(), 2 * (hq / size(ng.pieces)), "weight and bias pieces");
    scratch(s, n, hq);
    const std::span<T> gw = s.w.first(hq), bw = s.w.subspan(hq, hq);
    gather(*ng.pieces, g, gw);
    gather(*ng.pieces, b, bw);
    const norm_items<T> m{.x = x.data(), .g = gw.data(), .b = bw.data(), .y = y.data(), .xhat = xhat.data(), .rstd = rstd.data(),
                          .stats = s.stats.data(), .n = n, .hq = hq, .h = h, .eps = eps};
    kernel.run(m, norm_step::row_sums);
    all_sum(ng, s.stats.first(n));
    kernel.run(m, norm_step::centre);
    all_sum(ng, s.stats.subspan(n, n));
    kernel.run(m, norm_step::normalise);
  }

  //! `dx = res + rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))`, `dxhat = dy g` (`res`
  //! empty: none), the means over the whole row.
  template <class C, class T>
  void backward_input(norm_groups<C>& ng, std::span<const T> dy, std::span<const T> xhat, std::span<const T> rstd,
                      std::span<const T> g, std::span<const T> res, std::span<T> dx, norm_scratch<T> s) const {
    const std::size_t hq = block(ng), n = rstd.size();
    check(dy.size(), n * hq, "output gradient");
    check(xhat.size(), n * hq, "normalised input");
    check(dx.size(), n * hq, "input gradient");
    if (!res.empty()) check(res.size(), n * hq, "residual gradient");
    check(g.size(), hq / size(ng.pieces), "weight piece");
    scratch(s, n, hq);
    const std::span<T> gw = s.w.first(hq);
    gather(*ng.pieces, g, gw);
    // The backward steps only read xhat and rstd (norm_items holds them writable for `normalise`).
    const norm_items<T> m{.g = gw.data(), .dy = dy.data(), .res = res.empty() ? nullptr : res.data(), .y = dx.data(),
                          .xhat = const_cast<T*>(xhat.data()), .rstd = const_cast<T*>(rstd.data()), .stats = s.stats.data(), .n = n,
                          .hq = hq, .h = h, .eps = eps};
    kernel.run(m, norm_step::grad_sums);
    all_sum(ng, s.stats.first(2 * n));
    kernel.run(m, norm_step::grad_apply);
  }

  //! Adds the member's pieces of the weight and bias gradients to `gg`, `gb` (`[h / q^2]`).
  template <class C, class T>
  void backward_weight(norm_groups<C>& ng, std::span<const T> dy, std::span<const T> xhat, std::span<T> gg, std::span<T> gb,
                       norm_scratch<T> s) const {
    const std::size_t hq = block(ng), n = dy.size() / hq, pq = hq / size(ng.pieces);
    check(dy.size(), n * hq, "output gradient");
    check(xhat.size(), n * hq, "normalised input");
    check(gg.size() + gb.size(), 2 * pq, "weight and bias gradient pieces");
    check_room(s.part.size(), 2 * hq, "scratch for the partial gradients");
    check_room(s.grad.size(), 2 * pq, "scratch for the gradient pieces");
    const std::span<T> pg = s.part.first(hq), pb = s.part.subspan(hq, hq);
    const norm_items<T> m{.dy = dy.data(), .xhat = const_cast<T*>(xhat.data()), .pg = pg.data(), .pb = pb.data(), .n = n, .hq = hq,
                          .h = h, .eps = eps};
    kernel.run(m, norm_step::weight_sums);
    const std::span<T> mine = s.grad.first(2 * pq);
    scatter(ng, std::span<const T>(pg), mine.first(pq));
    scatter(ng, std::span<const T>(pb), mine.subspan(pq, pq));
    detail::grid_all_sum(ng.ordered, *ng.replicas, mine);
    kernel.accumulate(gg, std::span<const T>(mine.first(pq)));
    kernel.accumulate(gb, std::span<const T>(mine.subspan(pq, pq)));
  }

 private:
  template <class C>
  static std::size_t size(C* c) { return c == nullptr ? 1 : static_cast<std::size_t>(c->size()); }
  template <class C>
  std::size_t block(const norm_groups<C>& ng) const {
    const std::size_t q = size(ng.features), p = size(ng.pieces);
    if (h % (q * p) != 0)
      throw config_error("tensor parallel layer norm: " + std::to_string(h) + " features are not divisible by " +
                         std::to_string(q) + " blocks x " + std::to_string(p) + " pieces");
    return h / q;
  }
  static void check(std::size_t got, std::size_t want, const char* what) {
    if (got != want)
      throw std::length_error(std::string("loom grid_layer_norm: the ") + what + " has " + std::to_string(got) +
                              " elements; the norm needs " + std::to_string(want));
  }
  //! A scratch buffer holds at least `want` elements.
  static void check_room(std::size_t got, std::size_t want, const char* what) {
    if (got < want)
      throw std::length_error(std::string("loom grid_layer_norm: the ") + what + " has " + std::to_string(got) +
                              " elements; the norm needs at least " + std::to_string(want));
  }
  //! The forward's and the input gradient's scratch: the gathered weights and two statistics per token.
  template <class T>
  static void scratch(const norm_scratch<T>& s, std::size_t n, std::size_t hq) {
    check_room(s.w.size(), 2 * hq, "scratch for the gathered weights");
    check_room(s.stats.size(), 2 * n, "scratch for the statistics");
  }
  template <class C, class T>
  static void gather(C& c, std::span<const T> in, std::span<T> out) {
    if (c.size() > 1) c.all_gather(in, out);
    else detail::grid_copy(c, in, out);
  }
  template <class C, class T>
  static void all_sum(norm_groups<C>& ng, std::span<T> data) {
    detail::grid_all_sum(ng.ordered, *ng.features, data);
  }
  template <class C, class T>
  static void scatter(norm_groups<C>& ng, std::span<const T> in, std::span<T> out) {
    detail::grid_scatter_sum(ng.ordered, *ng.pieces, in, out);
  }
};

//! `grid_layer_norm`'s sums on one rank over whole matrices `[N][h]`: row statistics blocked
//! over `q` feature blocks, the weights' gradients over `rows x layers` token blocks (see
//! `summa_reference::blocked_weight`).
struct grid_norm_reference {
  std::size_t h = 0;        //!< features
  std::size_t q = 1;        //!< feature blocks
  double eps = 1e-5;        //!< added to the variance

  //! Forward over `n` tokens.
  template <class T>
  void forward(std::span<const T> x, std::span<const T> g, std::span<const T> b, std::span<T> y, std::span<T> xhat,
               std::span<T> rstd, std::size_t n) const {
    for (std::size_t t = 0; t < n; ++t) {
      const T* row = x.data() + t * h;
      const T mu = blocked(row, [](T v) { return v; }) / static_cast<T>(h);
      const T var = blocked(row, [mu](T v) { return (v - mu) * (v - mu); }) / static_cast<T>(h);
      const T r = T(1) / device_math::sqrt(var + static_cast<T>(eps));
      rstd[t] = r;
      for (std::size_t f = 0; f < h; ++f) {
        xhat[t * h + f] = (row[f] - mu) * r;
        y[t * h + f] = xhat[t * h + f] * g[f] + b[f];
      }
    }
  }
  //! Input gradient over `n` tokens (`res` may be empty).
  template <class T>
  void backward_input(std::span<const T> dy, std::span<const T> xhat, std::span<const T> rstd, std::span<const T> g,
                      std::span<const T> res, std::span<T> dx, std::size_t n) const {
    const std::size_t hq = h / q;
    for (std::size_t t = 0; t < n; ++t) {
      T m1{}, m2{};
      for (std::size_t j = 0; j < q; ++j) {
        T a{}, c{};
        for (std::size_t f = j * hq; f < (j + 1) * hq; ++f) {
          const T d = dy[t * h + f] * g[f];
          a += d;
          c += d * xhat[t * h + f];
        }
        m1 = j == 0 ? a : m1 + a;
        m2 = j == 0 ? c : m2 + c;
      }
      m1 /= static_cast<T>(h);
      m2 /= static_cast<T>(h);
      for (std::size_t f = 0; f < h; ++f) {
        const std::size_t e = t * h + f;
        const T v = rstd[t] * (dy[e] * g[f] - m1 - xhat[e] * m2);
        dx[e] = res.empty() ? v : res[e] + v;
      }
    }
  }
  //! Adds the weight and bias gradients over `n` tokens in `rows x layers` blocks.
  template <class T>
  void backward_weight(std::span<const T> dy, std::span<const T> xhat, std::span<T> gg, std::span<T> gb, std::size_t n,
                       std::size_t rows, std::size_t layers) const {
    // dg = sum dy xhat and db = sum dy: a linear layer's weight and bias gradients with
    // "input" xhat, one feature at a time.
    for (std::size_t f = 0; f < h; ++f) {
      std::vector<T> x1(n), d1(n);
      for (std::size_t t = 0; t < n; ++t) {
        x1[t] = xhat[t * h + f];
        d1[t] = dy[t * h + f];
      }
      summa_reference::blocked_weight(std::span<const T>(x1), std::span<const T>(d1), gg.subspan(f, 1), gb.subspan(f, 1), n, 1, 1,
                                      rows, layers);
    }
  }

 private:
  template <class T, class F>
  T blocked(const T* row, F term) const {
    const std::size_t hq = h / q;
    T acc{};
    for (std::size_t j = 0; j < q; ++j) {
      T p{};
      for (std::size_t f = j * hq; f < (j + 1) * hq; ++f) p += term(row[f]);
      acc = j == 0 ? p : acc + p;
    }
    return acc;
  }
};

}  // namespace loom
