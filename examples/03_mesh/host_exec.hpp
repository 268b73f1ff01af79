// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The host executor of the mesh example's stages (`host_exec`): the transformer's
//! (`transformer_stage<C, host_exec>`) and the MoE model's (`moe::moe_stage`, `moe::model_stage`).

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include <loom/exec/tensor_parallel.hpp>
#include <loom/stage/stage.hpp>

#include "kernels.hpp"

namespace mesh_example {

//! The host executor of the example's stages (their `X`): double precision, `std::vector` buffers,
//! the kernels as host loops, loom's host linear kernel, and the groups themselves. The device
//! executor (`device.hpp`) has the same members over device memory and a stream.
struct host_exec : kernels::host_loop {
  using value_type = double;                    //!< the stage's precision
  static constexpr bool device = false;         //!< buffers are host memory
  template <class U>
  using buffer = std::vector<U>;                //!< the stage's own storage
  template <class C>
  using group = C;                              //!< what the patterns run over
  //! `n` zeros.
  template <class U>
  static buffer<U> zeros(std::size_t n) {
    return buffer<U>(n, U{});
  }
  //! A buffer holding `v`.
  template <class U>
  static buffer<U> upload(const std::vector<U>& v) {
    return v;
  }
  //! `to = from` (equal sizes).
  template <class U>
  static void put(std::span<U> to, const std::vector<U>& from) {
    std::copy(from.begin(), from.end(), to.begin());
  }
  //! A host copy of `s`.
  template <class U>
  static std::vector<U> download(std::span<const U> s) {
    return {s.begin(), s.end()};
  }
  //! All of `b`.
  template <class U>
  static std::span<U> whole(buffer<U>& b) {
    return {b.data(), b.size()};
  }
  //! Gives up `b`'s storage.
  template <class U>
  void release(buffer<U>& b) const {
    b.clear();
    b.shrink_to_fit();
  }
  //! The executor of a call with context `c` (nothing to bind on the host).
  void bind(const loom::stage_context&) {}
  //! `to = from`.
  template <class U>
  void copy(std::span<const U> from, std::span<U> to) const {
    std::copy(from.begin(), from.end(), to.begin());
  }
  //! Every element of `x` to `v`.
  template <class U>
  void fill(std::span<U> x, U v) const {
    std::fill(x.begin(), x.end(), v);
  }
  //! The linear blocks' local kernel.
  loom::linear_kernel linear() const { return {}; }
  //! The vocabulary layers' kernel (`loom::vocab_layers`): host loops.
  using vocab_kernel = loom::linear_kernel;
};

}  // namespace mesh_example
