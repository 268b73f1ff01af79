// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The device form of loom's tensor- and sequence-parallel patterns: `loom::cuda::linear_kernel`,
//! the local product of Megatron's column- and row-parallel layers
//! (`loom/exec/tensor_parallel.hpp`) and of the tensor grids' layers (`loom/exec/tensor_grid.hpp`)
//! as kernels on a stream, `loom::cuda::norm_kernel` the grids' layer norm's local steps, and the device form of the
//! sequence-parallel patterns (`loom::ring_attention`, `loom::token_ring_attention`,
//! `loom::ulysses`, `loom::usp_attention`, `loom::dsp_switch` of `loom/exec/sequence_parallel.hpp`): include this
//! header and instantiate them over a device group bound to a stream, `loom::on_stream<G>` with
//! `G` a `cuda_local` or `nccl` communicator (or a mesh's `counted` group of one). The patterns'
//! code is the host one; this header supplies how it allocates (device memory), computes (loom's
//! kernels of `loom/cuda/kernels.hpp`, one thread per item of `loom/exec/pattern_math.hpp`)
//! and communicates (stream-ordered sends and receives ordered by events, the group's
//! collectives) on the group's stream, with no host synchronisation:
//!
//! - every kernel is enqueued inside a `loom::cuda::region` naming the bytes it reads and writes,
//!   so loom's simulator checks it against the transfers (a receive into a K/V buffer that a
//!   block's kernel may still read is reported naming both);
//! - a send waits for an event recorded on the stream when it is posted (the buffer is complete in
//!   stream order); a receive waits for an event recorded when it is posted (the kernels and sends
//!   that used its buffer before are done), unless `sp_faults::skip_kv_free_wait` asks it not to;
//! - each `forward` or `backward` call brackets its transfers with the group's `begin_step` and
//!   `end_step` on the stream, and construction opens the ring's channels (collective; TokenRing
//!   opens one from every position to every other, its partial outputs going to their owner).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#include "loom/comm/device.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/buffer.hpp"
#include "loom/cuda/error.hpp"
#include "loom/cuda/kernels.hpp"
#include "loom/exec/sequence_parallel.hpp"
#include "loom/exec/vocab_parallel.hpp"

namespace loom::detail {

//! The device form of `sp_space` (see the file comment).
template <class C>
  requires device_group<C>
struct sp_space<C> {
  template <class T>
  using buffer = cuda::device_buffer<T>;
  using request = typename C::request;
  //! The events of one call's transfers, reused call after call.
  struct state {
    event_pool events;
  };

  static C& group(C* c) {
    if (c == nullptr)
      throw config_error("sequence parallel: a device pattern needs its group (a group of one rank for degree 1), not null");
    return *c;
  }
  template <class T>
  static buffer<T> make(C*, std::size_t n) {
    return buffer<T>(n);
  }
  template <class T>
  static void fill(C* c, state&, std::span<T> x, T value) {
    const cuda::byte_access acc[] = {cuda::writes(x)};
    cuda::region reg(group(c).stream(), "loom sp fill", acc);
    cuda::detail::fill_async(x.data(), value, x.size(), c->stream());
  }
  template <class T>
  static void copy(C* c, state&, std::span<const T> from, std::span<T> to) {
    group(c).copy(from, to);
  }
  //! The rows `[first, first + n)` of a tensor of `per_row` elements per row (none when `base`
  //! is null: a gradient not wanted).
  template <class P>
  static std::span<P> rows(P* base, int first, int n, std::size_t per_row) {
    if (base == nullptr) return {};
    return {base + static_cast<std::size_t>(first) * per_row, static_cast<std::size_t>(n) * per_row};
  }
  template <class T>
  static void forward(C* c, state&, const attention_block<T>& b) {
    const std::size_t row = static_cast<std::size_t>(b.heads) * static_cast<std::size_t>(b.head_dim),
                      hrow = static_cast<std::size_t>(b.heads);
    const cuda::byte_access acc[] = {cuda::reads(rows(b.q, b.q0, b.nq, row)), cuda::reads(rows(b.k, b.k0, b.nk, row)),
                                     cuda::reads(rows(b.v, b.k0, b.nk, row)), cuda::writes(rows(b.o, b.q0, b.nq, row)),
                                     cuda::writes(rows(b.lse, b.q0, b.nq, hrow))};
    cuda::region reg(group(c).stream(), "loom ring attention block (forward)", acc);
    cuda::detail::attention_forward_async(b, c->stream());
  }
  template <class T>
  static void backward(C* c, state&, const attention_block<T>& b) {
    const std::size_t row = static_cast<std::size_t>(b.heads) * static_cast<std::size_t>(b.head_dim),
                      hrow = static_cast<std::size_t>(b.heads);
    const cuda::byte_access acc[] = {
        cuda::reads(rows(b.q, b.q0, b.nq, row)),       cuda::reads(rows(b.k, b.k0, b.nk, row)),
        cuda::reads(rows(b.v, b.k0, b.nk, row)),       cuda::reads(rows(b.lse, b.q0, b.nq, hrow)),
        cuda::reads(rows(b.dout, b.q0, b.nq, row)),    cuda::reads(rows(b.delta, b.q0, b.nq, hrow)),
        cuda::writes(rows(b.dq, b.q0, b.nq, row)),      cuda::writes(rows(b.dk, b.k0, b.nk, row)),
        cuda::writes(rows(b.dv, b.k0, b.nk, row))};
    cuda::region reg(group(c).stream(), "loom ring attention block (backward)", acc);
    cuda::detail::attention_backward_async(b, c->stream());
  }
  template <class T>
  static void delta(C* c, state&, const attention_delta_rows<T>& f, std::size_t n) {
    const auto D = static_cast<std::size_t>(f.head_dim);
    const cuda::byte_access acc[] = {cuda::reads(std::span<const T>(f.o, n * D)), cuda::reads(std::span<const T>(f.dout, n * D)),
                                     cuda::writes(std::span<T>(f.delta, n))};
    cuda::region reg(group(c).stream(), "loom attention delta", acc);
    cuda::detail::attention_delta_async(f, n, c->stream());
  }
  template <class T>
  static void merge(C* c, state&, const attention_merge_rows<T>& f, std::size_t n) {
    const auto D = static_cast<std::size_t>(f.head_dim);
    const cuda::byte_access acc[] = {cuda::reads(std::span<const T>(f.y, n * D)), cuda::reads(std::span<const T>(f.lb, n)),
                                     cuda::writes(std::span<T>(f.o, n * D)), cuda::writes(std::span<T>(f.lse, n))};
    cuda::region reg(group(c).stream(), "loom attention merge", acc);
    cuda::detail::attention_merge_async(f, n, c->stream());
  }
  template <class T>
  static void dsp(C* c, state&, const dsp_move<T>& f, std::size_t ranks) {
    const std::size_t n = f.size(ranks);
    const cuda::byte_access acc[] = {cuda::reads(std::span<const T>(f.in, n)), cuda::writes(std::span<T>(f.out, n))};
    cuda::region reg(group(c).stream(), "loom dsp layout", acc);
    cuda::detail::dsp_move_async(f, ranks, c->stream());
  }
  template <class T>
  static void move(C* c, state&, const ulysses_move<T>& f) {
    const cuda::byte_access acc[] = {cuda::reads(std::span<const T>(f.in, f.l.size())), cuda::writes(std::span<T>(f.out, f.l.size()))};
    cuda::region reg(group(c).stream(), "loom ulysses layout", acc);
    cuda::detail::ulysses_move_async(f, c->stream());
  }
  template <class T>
  static void all_to_all(C* c, state&, std::span<const T> in, std::span<T> out) {
    group(c).all_to_all(in, out);
  }
  static void open(C* c, state&, std::span<const channel> chans) { group(c).group().open_channels(chans); }
  static void begin(C* c, state& st) {
    st.events.rewind();
    group(c).group().begin_step(c->stream());
  }
  static void end(C* c, state&) { group(c).group().end_step(c->stream()); }
  //! An event recorded on the group's stream now.
  static cudaEvent_t now(C* c, state& st) {
    cudaEvent_t e = st.events.next();
    LOOM_CUDA_TRY(cudaEventRecord(e, group(c).stream()));
    return e;
  }
  static request isend(C* c, state& st, int peer, std::span<const std::byte> b, const sp_faults&) {
    return group(c).group().isend(peer, b, now(c, st));
  }
  static request irecv(C* c, state& st, int peer, std::span<std::byte> b, const sp_faults& f) {
    return group(c).group().irecv(peer, b, f.skip_kv_free_wait ? nullptr : now(c, st));
  }
  static void wait(C* c, state&, request& r) { group(c).group().wait(r, c->stream()); }
};

}  // namespace loom::detail

namespace loom::cuda {

//! The linear blocks' local kernel on a stream (`loom::column_parallel_linear<cuda::linear_kernel>`
//! and the row-parallel one): the items of `loom::linear_items` as loom's kernels, each inside a
//! region naming what it reads and writes; the same sums in the same order as
//! `loom::linear_kernel` on the host. Spans are device memory.
struct linear_kernel {
  cudaStream_t stream = nullptr;  //!< where every product is enqueued

  //! `y[t][o] = b[o] + sum_i x[t][i] w[o][i]` (without `b` when it is empty).
  template <class T>
  void forward(std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> y, std::size_t n, std::size_t in,
               std::size_t out) const {
    const byte_access acc[] = {reads(x), reads(w), reads(b), writes(y)};
    region reg(stream, "loom linear forward", acc);
    detail::linear_forward_async(linear_items<T>{x.data(), w.data(), b.empty() ? nullptr : b.data(), nullptr, y.data(), nullptr,
                                                 nullptr, n, in, out},
                                 stream);
  }
  //! `dx[t][i] = sum_o dy[t][o] w[o][i]`.
  template <class T>
  void backward_input(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n, std::size_t in,
                      std::size_t out) const {
    const byte_access acc[] = {reads(dy), reads(w), writes(dx)};
    region reg(stream, "loom linear backward (input)", acc);
    detail::linear_backward_input_async(linear_items<T>{nullptr, w.data(), nullptr, dy.data(), dx.data(), nullptr, nullptr, n, in, out},
                                        stream);
  }
  //! `gw[o][i] += dy[t][o] x[t][i]` and `gb[o] += dy[t][o]` over the tokens in order.
  template <class T>
  void backward_weight(std::span<const T> x, std::span<const T> dy, std::span<T> gw, std::span<T> gb, std::size_t n,
                       std::size_t in, std::size_t out) const {
    const byte_access acc[] = {reads(x), reads(dy), writes(gw), writes(gb)};
    region reg(stream, "loom linear backward (weight)", acc);
    detail::linear_backward_weight_async(
        linear_items<T>{x.data(), nullptr, nullptr, dy.data(), nullptr, gw.data(), gb.empty() ? nullptr : gb.data(), n, in, out},
        stream);
  }
  //! `y[t][o] += b[o]` over `n` tokens.
  template <class T>
  void add_bias(std::span<T> y, std::span<const T> b, std::size_t n, std::size_t out) const {
    const byte_access acc[] = {reads(b), writes(y)};
    region reg(stream, "loom linear bias", acc);
    detail::linear_add_bias_async(linear_items<T>{nullptr, nullptr, b.data(), nullptr, y.data(), nullptr, nullptr, n, 0, out}, stream);
  }
  //! `y[t][o] += sum_i x[t][i] w[o][i]`, continuing each element's sum (the grids' rounds).
  template <class T>
  void forward_add(std::span<const T> x, std::span<const T> w, std::span<T> y, std::size_t n, std::size_t in,
                   std::size_t out) const {
    const byte_access acc[] = {reads(x), reads(w), writes(y)};
    region reg(stream, "loom linear forward (add)", acc);
    detail::linear_forward_add_async(linear_items<T>{x.data(), w.data(), nullptr, nullptr, y.data(), nullptr, nullptr, n, in, out},
                                     stream);
  }
  //! `y[t][o] = b[o]` over `n` tokens (zeros when `b` is empty).
  template <class T>
  void set_bias(std::span<T> y, std::span<const T> b, std::size_t n, std::size_t out) const {
    const byte_access acc[] = {reads(b), writes(y)};
    region reg(stream, "loom linear set bias", acc);
    detail::linear_set_bias_async(
        linear_items<T>{nullptr, nullptr, b.empty() ? nullptr : b.data(), nullptr, y.data(), nullptr, nullptr, n, 0, out}, stream);
  }
  //! `acc[i] += x[i]`.
  template <class T>
  void accumulate(std::span<T> acc, std::span<const T> x) const {
    if (acc.empty()) return;
    const byte_access a[] = {reads(x), writes(acc)};
    region reg(stream, "loom linear accumulate", a);
    detail::add_async(acc.data(), x.data(), acc.size(), stream);
  }
};

//! The vocabulary-parallel layers on a stream (`loom::vocab_layers<T, cuda::vocab_kernel>`,
//! `loom/exec/vocab_parallel.hpp`): the output layer's products as `linear_kernel`'s, each step of
//! `loom::vocab_items` as one of loom's kernels inside a region naming exactly what that step
//! reads and writes, its buffers device memory. `loom::pipeline` sets `stream` to the rank's
//! compute stream when it binds the layers. Token ids are `std::int64_t` on a GPU (the kernels
//! are compiled for them); the same items in the same order as the host loops.
struct vocab_kernel : linear_kernel {
  //! The layers run on a device.
  static constexpr bool on_device = true;
  //! The layers' buffers: device memory.
  template <class U>
  using buffer = device_buffer<U>;

  //! Every item of `step`.
  template <class T, class I>
  void run(const vocab_items<T, I>& m, vocab_step step) const {
#if !defined(LOOM_CUDA_SIM)
    static_assert(std::is_same_v<I, std::int64_t>, "loom::cuda::vocab_kernel: token ids are std::int64_t on a GPU");
#endif
    const std::size_t nh = m.n * m.h, logits = m.n * m.rows, st = 3 * m.n;
    auto in = [](const auto* p, std::size_t c) { return reads(std::span(p, p == nullptr ? 0 : c)); };
    auto out = [](T* p, std::size_t c) { return writes(std::span<T>(p, p == nullptr ? 0 : c)); };
    switch (step) {
      case vocab_step::embed: {
        const byte_access acc[] = {in(m.ids, m.n), in(m.table, m.rows * m.h), out(m.out, nh)};
        return enqueue(m, step, "loom vocabulary rows", acc);
      }
      case vocab_step::embed_grad: {
        const byte_access acc[] = {in(m.ids, m.n), in(m.x, nh), out(m.out, m.rows * m.h)};
        return enqueue(m, step, "loom vocabulary rows (gradient)", acc);
      }
      case vocab_step::statistics: {
        const byte_access acc[] = {in(m.ids, m.n), out(m.e, logits), out(m.own, st)};
        return enqueue(m, step, "loom vocabulary statistics", acc);
      }
      case vocab_step::combine: {
        const byte_access acc[] = {in(m.stats, m.ranks * st), out(m.out, st)};
        return enqueue(m, step, "loom vocabulary statistics (combine)", acc);
      }
      case vocab_step::logit_grad: {
        const byte_access acc[] = {in(m.ids, m.n), in(m.own, st), in(m.global, st), out(m.e, logits)};
        return enqueue(m, step, "loom vocabulary logits (gradient)", acc);
      }
      case vocab_step::scale_rows: {
        const byte_access acc[] = {in(m.e, logits), in(m.own, st), out(m.out, logits)};
        return enqueue(m, step, "loom vocabulary logits (scaled)", acc);
      }
      case vocab_step::fused_grad: {
        const byte_access acc[] = {in(m.stats, m.ranks * st), in(m.global, st), in(m.parts, (m.ranks - 1) * m.stride + 2 * nh), out(m.out, nh)};
        return enqueue(m, step, "loom vocabulary input gradient (fused)", acc);
      }
      case vocab_step::sum_parts: {
        const byte_access acc[] = {in(m.parts, (m.ranks - 1) * m.stride + nh), out(m.out, nh)};
        return enqueue(m, step, "loom vocabulary parts (sum)", acc);
      }
    }
  }
  //! Names the layers' buffer at `p` in the simulator's reports.
  static void name(const void* p, const std::string& what) { name_memory(p, what); }
  //! `x[i] = value` on the stream.
  template <class T>
  void fill(std::span<T> x, T value) const {
    if (x.empty()) return;
    const byte_access acc[] = {writes(x)};
    region reg(stream, "loom vocabulary fill", acc);
    detail::fill_async(x.data(), value, x.size(), stream);
  }
  //! Copies host `src` into device `dst` on the stream, before a step and outside any capture
  //! (the step's kernels follow it in stream order; `src` must stay valid during the step). Never
  //! the legacy default stream: another rank's thread may be capturing its step meanwhile.
  template <class U>
  void upload(std::span<U> dst, std::span<const U> src) const {
    const byte_access acc[] = {writes(dst)};
    region reg(stream, "loom vocabulary ids to the device", acc);
    LOOM_CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream));
  }
  //! Copies device `src` into host `dst` on the stream and waits for it (after a step).
  template <class U>
  void download(std::span<U> dst, std::span<const U> src) const {
    const byte_access acc[] = {reads(src)};
    region reg(stream, "loom vocabulary statistics to the host", acc);
    LOOM_CUDA_TRY(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream));
  }

 private:
  template <class T, class I>
  void enqueue(const vocab_items<T, I>& m, vocab_step step, const char* label, std::span<const byte_access> accesses) const {
    region reg(stream, label, accesses);
    detail::vocab_async(m, step, stream);
  }
};

//! `loom::grid_layer_norm`'s local steps on a stream (`loom::grid_layer_norm<cuda::norm_kernel>`):
//! each step of `loom::norm_items` as one of loom's kernels (a thread per token, per feature for
//! the weights' sums), inside a region naming exactly what that step reads and writes; the same
//! sums in the same order as `loom::norm_kernel` on the host. Pointers are device memory.
struct norm_kernel {
  cudaStream_t stream = nullptr;  //!< where every step is enqueued

  //! Every item of `step`.
  template <class T>
  void run(const norm_items<T>& m, norm_step step) const {
    const std::size_t a = m.n * m.hq, k = m.hq;
    auto in = [](const T* p, std::size_t c) { return reads(std::span<const T>(p, p == nullptr ? 0 : c)); };
    auto out = [](T* p, std::size_t c) { return writes(std::span<T>(p, p == nullptr ? 0 : c)); };
    switch (step) {
      case norm_step::row_sums: {
        const byte_access acc[] = {in(m.x, a), out(m.stats, m.n)};
        return enqueue(m, step, "loom layer norm (row sums)", acc);
      }
      case norm_step::centre: {
        const byte_access acc[] = {in(m.x, a), out(m.stats, 2 * m.n)};
        return enqueue(m, step, "loom layer norm (deviations)", acc);
      }
      case norm_step::normalise: {
        const byte_access acc[] = {in(m.x, a), in(m.g, k), in(m.b, k), in(m.stats, 2 * m.n), out(m.rstd, m.n), out(m.xhat, a), out(m.y, a)};
        return enqueue(m, step, "loom layer norm (normalise)", acc);
      }
      case norm_step::grad_sums: {
        const byte_access acc[] = {in(m.dy, a), in(m.g, k), in(m.xhat, a), out(m.stats, 2 * m.n)};
        return enqueue(m, step, "loom layer norm backward (row sums)", acc);
      }
      case norm_step::grad_apply: {
        const byte_access acc[] = {in(m.dy, a), in(m.g, k), in(m.xhat, a), in(m.rstd, m.n), in(m.stats, 2 * m.n), in(m.res, a), out(m.y, a)};
        return enqueue(m, step, "loom layer norm backward (input)", acc);
      }
      case norm_step::weight_sums: {
        const byte_access acc[] = {in(m.dy, a), in(m.xhat, a), out(m.pg, k), out(m.pb, k)};
        return enqueue(m, step, "loom layer norm backward (weight)", acc);
      }
    }
  }
  //! `acc[i] += x[i]`.
  template <class T>
  void accumulate(std::span<T> acc, std::span<const T> x) const {
    if (acc.empty()) return;
    const byte_access a[] = {reads(x), writes(acc)};
    region reg(stream, "loom layer norm accumulate", a);
    detail::add_async(acc.data(), x.data(), acc.size(), stream);
  }

 private:
  template <class T>
  void enqueue(const norm_items<T>& m, norm_step step, const char* label, std::span<const byte_access> accesses) const {
    region reg(stream, label, accesses);
    detail::norm_async(m, step, stream);
  }
};

}  // namespace loom::cuda
