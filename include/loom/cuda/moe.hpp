// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The device form of a mixture-of-experts layer (`loom/exec/moe.hpp`): the routing, dispatch,
//! combine and all their backward as loom's kernels on a stream (one thread per item of
//! `loom::moe_items`, `loom/exec/moe_math.hpp`, so the host and the simulated device compute the
//! same sums in the same order and agree bit for bit), and the expert-parallel exchange
//! (`loom::ep_to_experts`, `loom::ep_from_experts`, flat or hierarchical, and Pipeline MoE's
//! `loom::tp_moe_combine`) over an `ep_group` of device groups bound to a stream
//! (`loom::on_stream<G>`, `G` a `cuda_local` or `nccl` communicator or a mesh's `counted` one):
//! the same functions as on threads and MPI, written once; this header supplies their copies and
//! layout changes as kernels and the routing as `loom::cuda::moe_routing`, which keeps its
//! decisions in device memory.
//!
//! - Every kernel is enqueued inside a `loom::cuda::region` naming the bytes it reads and writes,
//!   so loom's simulator checks it against the group's transfers (the race detector).
//! - Nothing waits on the host, except the capacity with a capacity factor of 0: it is the largest
//!   load over the expert-parallel group, an all-reduce (max) of one value on the stream, and the
//!   host reads it to size the slot buffers (`set_capacity`: one synchronisation per MoE layer and
//!   microbatch, as Tutel's f = 0 mode has). With a capacity factor above 0 the capacity depends
//!   only on the token count and nothing waits. Inside a stage of a device `loom::pipeline` use
//!   f > 0: the pipeline enqueues a step ahead of the device, and the host read inside a stage call
//!   waits for work that can depend on transfers the peers post later (on nccl it deadlocks).
//! - FSMoE's overlap (`loom::ep_overlapped`) packs and unpacks pieces with kernels on the group's
//!   (compute) stream and runs their all-to-alls on a communication stream, `ep_group::exchange`
//!   (the same group bound to a second stream), ordered by events both ways.
//! - Tutel's adaptive degree (`loom::ep_adaptive_to_experts`, `loom::ep_adaptive_from_experts`):
//!   the r copies and their ordered sum are strided block kernels; the gathers of the weight
//!   slices are the user's, with the group's `all_gather` on the stream.

#include <cstddef>
#include <limits>
#include <span>
#include <string>

#include <cuda_runtime_api.h>

#include "loom/comm/device.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/buffer.hpp"
#include "loom/cuda/error.hpp"
#include "loom/cuda/kernels.hpp"
#include "loom/exec/moe.hpp"

namespace loom::detail {

//! The device form of `moe_space` (see the file comment): copies on the group's stream, layout
//! changes as kernels inside regions.
template <class C>
  requires device_group<C>
struct moe_space<C> {
  static C& group(C* c) {
    if (c == nullptr) throw config_error("moe: a device exchange needs its group (a group of one rank for ep = 1), not null");
    return *c;
  }
  template <class T>
  static void copy(C* c, std::span<const T> from, std::span<T> to) {
    group(c).copy(from, to);
  }
  template <class T>
  static void transpose(C* c, const block_transpose<T>& b) {
    const cuda::byte_access acc[] = {cuda::reads(std::span<const T>(b.in, b.in_extent())), cuda::writes(std::span<T>(b.out, b.out_extent()))};
    cuda::region reg(group(c).stream(), "loom moe layout", acc);
    cuda::detail::block_transpose_async(b, c->stream());
  }
  // The overlap's collectives: all-to-alls on the exchange group's communication stream, each
  // after an event recorded on the compute stream when it is posted (its piece is packed); the
  // compute stream waits for the event recorded after it.
  using request = cudaEvent_t;
  struct overlap_state {
    event_pool events;
  };
  template <class G, class T>
  static request post(G& g, overlap_state& st, std::span<const T> in, std::span<T> out) {
    if (g.exchange == nullptr)
      throw config_error("moe: the overlapped exchange on a device group needs ep_group::exchange, the group bound to a communication stream");
    C& compute = group(g.comm);
    C& comm = *g.exchange;
    cudaEvent_t packed = st.events.next();
    LOOM_CUDA_TRY(cudaEventRecord(packed, compute.stream()));
    if (!g.faults.skip_pack_wait) LOOM_CUDA_TRY(cudaStreamWaitEvent(comm.stream(), packed, 0));
    comm.all_to_all(in, out);
    cudaEvent_t done = st.events.next();
    LOOM_CUDA_TRY(cudaEventRecord(done, comm.stream()));
    return done;
  }
  template <class G>
  static void wait(G& g, overlap_state&, request& r) {
    LOOM_CUDA_TRY(cudaStreamWaitEvent(group(g.comm).stream(), r, 0));
  }
};

}  // namespace loom::detail

namespace loom::cuda {

//! One rank's routing decisions for n tokens in device memory (the members of
//! `loom::moe_routing`, see `loom/exec/moe.hpp`), filled by `cuda::moe_route`; the capacity is a
//! host value, set by `set_capacity`. The buffers are kept from call to call while the sizes do
//! not change.
template <class T>
struct moe_routing {
  std::size_t tokens = 0;              //!< n
  int experts = 0;                     //!< E
  int top_k = 1;                       //!< k
  device_buffer<T> scores;             //!< `[n][E]`
  device_buffer<int> expert;           //!< `[n][k]`
  device_buffer<T> gate;               //!< `[n][k]`
  device_buffer<T> raw_gate;           //!< `[n][k]`
  device_buffer<long long> slot;       //!< `[n][k]`
  device_buffer<long long> load;       //!< `[E]`
  device_buffer<long long> first;      //!< `[E]`
  device_buffer<double> most;          //!< one element: the largest load (f = 0)
  pinned_buffer<double> most_host;     //!< its host copy
  long long capacity = 0;              //!< C, once `set_capacity` ran

  //! The routing as `moe_items` over these buffers, every expert held.
  moe_items<T> items() const { return loom::detail::routing_items<T>(*this); }
  //! A host copy (`loom::moe_routing`: the dropped pairs, the loads), after the stream's work so
  //! far (it synchronises `stream`).
  loom::moe_routing<T> to_host(cudaStream_t stream) const {
    loom::moe_routing<T> r;
    r.tokens = tokens;
    r.experts = experts;
    r.top_k = top_k;
    r.capacity = capacity;
    auto get = [&](auto& host, const auto& dev) {
      host.resize(dev.size());
      if (dev.size() > 0) LOOM_CUDA_TRY(cudaMemcpyAsync(host.data(), dev.data(), dev.bytes(), cudaMemcpyDeviceToHost, stream));
    };
    get(r.scores, scores);
    get(r.expert, expert);
    get(r.gate, gate);
    get(r.raw_gate, raw_gate);
    get(r.slot, slot);
    get(r.load, load);
    get(r.first, first);
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream));
    return r;
  }
};

namespace detail {

//! `b` resized to `n` elements (kept when it has them).
template <class T>
void ensure(device_buffer<T>& b, std::size_t n) {
  if (b.size() != n) b = device_buffer<T>(n);
}

}  // namespace detail

//! Routes the `n` tokens of `logits` (`[n][E]`, device memory) into `r` on `stream`: one kernel
//! per token (softmax, top-k, gates), one per expert (the slots in the contract's order, the
//! loads, the first choices). The capacity is left for `set_capacity`. Throws `config_error` for
//! options that break `moe_rule`.
template <class T>
void moe_route(const moe_options& o, std::span<const T> logits, moe_routing<T>& r, cudaStream_t stream) {
  if (std::string rule = moe_rule(o); !rule.empty()) throw config_error(rule);
  const auto E = static_cast<std::size_t>(o.experts), k = static_cast<std::size_t>(o.top_k);
  if (logits.size() % E != 0)
    throw config_error("moe: " + std::to_string(logits.size()) + " router logits are not a whole number of tokens of " + std::to_string(E) +
                       " experts");
  const std::size_t n = logits.size() / E;
  r.tokens = n;
  r.experts = o.experts;
  r.top_k = o.top_k;
  r.capacity = 0;
  detail::ensure(r.scores, n * E);
  detail::ensure(r.expert, n * k);
  detail::ensure(r.gate, n * k);
  detail::ensure(r.raw_gate, n * k);
  detail::ensure(r.slot, n * k);
  detail::ensure(r.load, E);
  detail::ensure(r.first, E);
  moe_items<T> m = r.items();
  m.normalize = o.normalize_gate;
  m.eps = std::numeric_limits<T>::epsilon();
  m.logits = logits.data();
  {
    const byte_access acc[] = {reads(logits), writes(r.scores.span()), writes(r.expert.span()), writes(r.gate.span()),
                               writes(r.raw_gate.span())};
    region reg(stream, "loom moe route", acc);
    cuda::detail::moe_async(m, moe_step::route, stream);
  }
  const byte_access acc[] = {reads(r.expert.span()), writes(r.slot.span()), writes(r.load.span()), writes(r.first.span())};
  region reg(stream, "loom moe slots", acc);
  cuda::detail::moe_async(m, moe_step::slots, stream);
}

//! GShard's auxiliary loss of `r` into `out` (one element of device memory), on `stream`.
template <class T>
void moe_aux_loss(const moe_routing<T>& r, std::span<T> out, cudaStream_t stream) {
  if (out.size() != 1) throw config_error("moe: the auxiliary loss is one element (got a span of " + std::to_string(out.size()) + ")");
  moe_items<T> m = r.items();
  m.scalar = out.data();
  const byte_access acc[] = {reads(r.scores.span()), reads(r.first.span()), writes(out)};
  region reg(stream, "loom moe aux loss", acc);
  cuda::detail::moe_async(m, moe_step::aux, stream);
}

//! Dispatch on `stream` (`loom::moe_dispatch`): `slots` (`[count][C][h]` of the experts `held`)
//! zeroed, then each kept pair's input from `x` (`[n][h]`).
template <class T>
void moe_dispatch(const moe_routing<T>& r, std::span<const T> x, std::span<T> slots, std::size_t h, cudaStream_t stream,
                  moe_experts held = {}) {
  {
    const byte_access acc[] = {writes(slots)};
    region reg(stream, "loom moe dispatch (zero)", acc);
    cuda::detail::fill_async(slots.data(), T{}, slots.size(), stream);
  }
  moe_items<T> m = loom::detail::moe_held(r, held, h);
  m.x = x.data();
  m.slots_out = slots.data();
  const byte_access acc[] = {reads(r.expert.span()), reads(r.slot.span()), reads(x), writes(slots)};
  region reg(stream, "loom moe dispatch", acc);
  cuda::detail::moe_async(m, moe_step::dispatch, stream);
}

//! Combine on `stream` (`loom::moe_combine`): `y` (`[n][h]`) from the experts' slots `out`.
template <class T>
void moe_combine(const moe_routing<T>& r, std::span<const T> out, std::span<T> y, std::size_t h, cudaStream_t stream, moe_experts held = {}) {
  moe_items<T> m = loom::detail::moe_held(r, held, h);
  m.slots_in = out.data();
  m.y = y.data();
  const byte_access acc[] = {reads(r.expert.span()), reads(r.slot.span()), reads(r.gate.span()), reads(out), writes(y)};
  region reg(stream, "loom moe combine", acc);
  cuda::detail::moe_async(m, moe_step::combine, stream);
}

//! Combine's backward on `stream` (`loom::moe_combine_backward`): `dout` (the slots' gradient,
//! zeroed first) and `dgate` (`[n][k]`).
template <class T>
void moe_combine_backward(const moe_routing<T>& r, std::span<const T> out, std::span<const T> dy, std::span<T> dout, std::span<T> dgate,
                          std::size_t h, cudaStream_t stream, moe_experts held = {}) {
  {
    const byte_access acc[] = {writes(dout)};
    region reg(stream, "loom moe combine backward (zero)", acc);
    cuda::detail::fill_async(dout.data(), T{}, dout.size(), stream);
  }
  moe_items<T> m = loom::detail::moe_held(r, held, h);
  m.x = out.data();
  m.dy = dy.data();
  m.slots_out = dout.data();
  m.dgate = dgate.data();
  const byte_access acc[] = {reads(r.expert.span()), reads(r.slot.span()), reads(r.gate.span()), reads(out), reads(dy),
                             writes(dout),           writes(dgate)};
  region reg(stream, "loom moe combine backward", acc);
  cuda::detail::moe_async(m, moe_step::combine_backward, stream);
}

//! Dispatch's backward on `stream` (`loom::moe_dispatch_backward`): `dx[t] += ` its kept slots'
//! gradients in `dslots`.
template <class T>
void moe_dispatch_backward(const moe_routing<T>& r, std::span<const T> dslots, std::span<T> dx, std::size_t h, cudaStream_t stream,
                           moe_experts held = {}) {
  moe_items<T> m = loom::detail::moe_held(r, held, h);
  m.slots_in = dslots.data();
  m.y = dx.data();
  const byte_access acc[] = {reads(r.expert.span()), reads(r.slot.span()), reads(dslots), writes(dx)};
  region reg(stream, "loom moe dispatch backward", acc);
  cuda::detail::moe_async(m, moe_step::dispatch_backward, stream);
}

//! The router's backward on `stream` (`loom::moe_route_backward`): `dlogits` (`[n][E]`) from the
//! gates' gradient `dgate` and the auxiliary loss's weight `daux`, times `*daux_scale` when given
//! (one element of device memory, e.g. the stage's output gradient of its `daux l_aux` term).
template <class T>
void moe_route_backward(const moe_routing<T>& r, const moe_options& o, std::span<const T> dgate, T daux, std::span<T> dlogits,
                        cudaStream_t stream, const T* daux_scale = nullptr) {
  moe_items<T> m = r.items();
  m.normalize = o.normalize_gate;
  m.eps = std::numeric_limits<T>::epsilon();
  m.daux = daux;
  m.daux_scale = daux_scale;
  m.dgate = const_cast<T*>(dgate.data());  // read only by this step
  m.dlogits = dlogits.data();
  const std::span<const T> scale(daux_scale, daux_scale == nullptr ? 0 : 1);
  const byte_access acc[] = {reads(r.scores.span()), reads(r.expert.span()), reads(r.raw_gate.span()), reads(r.first.span()),
                             reads(dgate),           reads(scale),            writes(dlogits)};
  region reg(stream, "loom moe route backward", acc);
  cuda::detail::moe_async(m, moe_step::route_backward, stream);
}

}  // namespace loom::cuda

namespace loom {

//! The capacity of a device routing over the group (see `loom::set_capacity`): with a capacity
//! factor of 0 the largest load is all-reduced (max, as a double: the 8 bytes of the host's
//! integer) on the group's stream and read by the host (the one synchronisation of the device path); else it is computed on the host from `r.tokens`.
template <class C, class T>
  requires detail::device_group<C>
void set_capacity(ep_group<C>& g, cuda::moe_routing<T>& r, const moe_options& o) {
  if (o.capacity_factor > 0) {
    r.capacity = moe_capacity(o, r.tokens, 0);
    return;
  }
  C& c = detail::moe_space<C>::group(g.comm);
  cuda::detail::ensure(r.most, 1);
  if (r.most_host.size() != 1) r.most_host = cuda::pinned_buffer<double>(1);
  moe_items<T> m = r.items();
  m.largest = r.most.data();
  {
    const cuda::byte_access acc[] = {cuda::reads(r.load.span()), cuda::writes(r.most.span())};
    cuda::region reg(c.stream(), "loom moe largest load", acc);
    cuda::detail::moe_async(m, moe_step::max_load, c.stream());
  }
  if (g.size() > 1) c.all_reduce(r.most.span(), reduce_op::max);
  LOOM_CUDA_TRY(cudaMemcpyAsync(r.most_host.data(), r.most.data(), sizeof(double), cudaMemcpyDeviceToHost, c.stream()));
  c.group().synchronize(c.stream());
  r.capacity = moe_capacity(o, r.tokens, static_cast<long long>(r.most_host.data()[0]));
}

//! Pipeline MoE's combine with a device routing (see `loom::tp_moe_combine`): this rank's
//! experts' pairs into `y`, then one all-reduce over the group, on the group's stream.
template <class C, class T>
  requires detail::device_group<C>
void tp_moe_combine(ep_group<C>& g, const cuda::moe_routing<T>& r, std::span<const T> out, std::span<T> y, std::size_t h) {
  C& c = detail::moe_space<C>::group(g.comm);
  cuda::moe_combine(r, out, y, h, c.stream(), tp_experts(r.experts, g));
  if (g.size() > 1) c.all_reduce(y, reduce_op::sum);
}

}  // namespace loom
