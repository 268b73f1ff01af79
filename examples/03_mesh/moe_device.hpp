// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The MoE model's operations on a device (`moe::moe_ops` for `device_exec`): the routing as a
//! `loom::cuda::moe_routing` in device memory, loom's MoE kernels on the stage call's stream
//! (`loom/cuda/moe.hpp`), and the overlap's communication stream, one per MoE stage, made on
//! first use. With these `moe::moe_stage` and `moe::model_stage` run unchanged on `cuda_local` and
//! `nccl` worlds. A capacity factor of 0 is refused: its capacity is the group's largest load,
//! which the host would have to read inside a stage call that a device pipeline enqueues ahead of
//! the device (docs/moe.md, "On devices").

#include <memory>
#include <span>
#include <string>

#include <loom/cuda/moe.hpp>
#include <loom/cuda/stream.hpp>

#include "device.hpp"
#include "moe_layer.hpp"

namespace mesh_example::moe {

//! The device's MoE operations (see the file comment).
template <class X>
struct moe_ops<X, true> {
  using T = typename X::value_type;            //!< fp32
  using routing = loom::cuda::moe_routing<T>;  //!< one microbatch's routing, in device memory
  //! The overlap's communication stream (made on first use).
  cudaStream_t exchange_stream() {
    if (!exchange_) {
      exchange_ = std::make_unique<loom::cuda::stream>();
      loom::cuda::name_stream(exchange_->get(), "moe exchange");
    }
    return exchange_->get();
  }
  //! `loom::cuda::moe_route`.
  void route(const X& x, const loom::moe_options& o, std::span<const T> logits, routing& r) const { loom::cuda::moe_route(o, logits, r, x.stream); }
  //! The capacity over the group: the capacity factor's (f > 0; no synchronisation).
  template <class G>
  void capacity(const X& x, loom::ep_group<G>& g, routing& r, const loom::moe_options& o) const {
    local_capacity(x, r, o);
    (void)g;
  }
  //! The capacity factor's capacity (f > 0).
  void local_capacity(const X&, routing& r, const loom::moe_options& o) const {
    if (o.capacity_factor == 0)
      throw loom::config_error("moe: a capacity factor of 0 inside a device pipeline stage would read the group's largest load on the host "
                               "while the pipeline enqueues ahead of the device: give a factor above 0");
    r.capacity = loom::moe_capacity(o, r.tokens, 0);
  }
  //! `loom::cuda::moe_dispatch`.
  void dispatch(const X& x, const routing& r, std::span<const T> in, std::span<T> slots, std::size_t h, loom::moe_experts held) const {
    loom::cuda::moe_dispatch(r, in, slots, h, x.stream, held);
  }
  //! `loom::cuda::moe_combine`.
  void combine(const X& x, const routing& r, std::span<const T> out, std::span<T> y, std::size_t h) const {
    loom::cuda::moe_combine(r, out, y, h, x.stream);
  }
  //! `loom::cuda::moe_combine_backward`.
  void combine_backward(const X& x, const routing& r, std::span<const T> out, std::span<const T> dy, std::span<T> dout, std::span<T> dgate,
                        std::size_t h, loom::moe_experts held) const {
    loom::cuda::moe_combine_backward(r, out, dy, dout, dgate, h, x.stream, held);
  }
  //! `loom::cuda::moe_dispatch_backward`.
  void dispatch_backward(const X& x, const routing& r, std::span<const T> ds, std::span<T> dx, std::size_t h, loom::moe_experts held) const {
    loom::cuda::moe_dispatch_backward(r, ds, dx, h, x.stream, held);
  }
  //! `loom::cuda::moe_route_backward` with the auxiliary loss's weight `*scale * daux` (`scale` in device memory).
  void route_backward(const X& x, const routing& r, const loom::moe_options& o, std::span<const T> dgate, T daux, std::span<T> dl,
                      const T* scale) const {
    loom::cuda::moe_route_backward(r, o, dgate, daux, dl, x.stream, scale);
  }
  //! GShard's auxiliary loss into `out[0]` (device memory).
  void aux(const X& x, const routing& r, std::span<T> out) const { loom::cuda::moe_aux_loss(r, out, x.stream); }
  //! A host copy of `r` (synchronises the stage's stream).
  loom::moe_routing<T> host(const X& x, const routing& r) const { return r.to_host(x.stream); }

 private:
  std::unique_ptr<loom::cuda::stream> exchange_;
};

}  // namespace mesh_example::moe
