// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The device executor of the mesh example's transformer (`transformer_stage<C, device_exec>`):
//! fp32, the stage's storage in device memory, every kernel of `kernels.hpp` launched on the
//! stream of the stage call (`stage_context::stream`), loom's device linear kernel
//! (`loom::cuda::linear_kernel`), and the tensor- and sequence-parallel patterns over the groups
//! bound to that stream (`loom::on_stream`, `loom/cuda/patterns.hpp`). Nothing in a stage call
//! synchronises the host.
//!
//! The kernels are launched through `launch`, defined once in `device_kernels.cuh`: compiled by
//! nvcc for a GPU (`device_kernels.cu`, one thread per item) and by the host compiler against
//! loom's CUDA simulator (`device_kernels_sim.cpp`, a host loop the simulator runs in stream
//! order). This header needs only the CUDA runtime's declarations.

#include <cstddef>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include <loom/comm/device.hpp>
#include <loom/cuda/buffer.hpp>
#include <loom/cuda/error.hpp>
#include <loom/cuda/kernels.hpp>
#include <loom/cuda/patterns.hpp>
#include <loom/stage/stage.hpp>

#include "kernels.hpp"

namespace mesh_example {

//! Runs `f` over items `[0, n)` on `stream` (`label` names the launch in the simulator's
//! reports). Defined for the kernels of `kernels.hpp` over float in `device_kernels.cuh`.
template <class F>
void launch(cudaStream_t stream, std::size_t n, const F& f, const char* label);

//! The device executor (see the file comment): `host_exec`'s members over device memory.
struct device_exec {
  using value_type = float;             //!< fp32 throughout
  static constexpr bool device = true;  //!< buffers are device memory
  template <class U>
  using buffer = loom::cuda::device_buffer<U>;  //!< the stage's own storage
  template <class C>
  using group = loom::on_stream<C>;  //!< the groups, bound to the call's stream

  cudaStream_t stream = nullptr;  //!< the stream of the current (or last) stage call

  //! `n` zeros (synchronous).
  template <class U>
  static buffer<U> zeros(std::size_t n) {
    buffer<U> b(n);
    if (n != 0) LOOM_CUDA_TRY(cudaMemset(b.data(), 0, b.bytes()));
    return b;
  }
  //! A device copy of `v` (synchronous).
  template <class U>
  static buffer<U> upload(const std::vector<U>& v) {
    buffer<U> b(v.size());
    loom::cuda::copy_to_device(b.span(), std::span<const U>(v));
    return b;
  }
  //! `to = from` (equal sizes; synchronous).
  template <class U>
  static void put(std::span<U> to, const std::vector<U>& from) {
    loom::cuda::copy_to_device(to, std::span<const U>(from));
  }
  //! A host copy of `s` after all work on the device (the reducer's streams included).
  template <class U>
  static std::vector<U> download(std::span<const U> s) {
    LOOM_CUDA_TRY(cudaDeviceSynchronize());
    std::vector<U> v(s.size());
    loom::cuda::copy_to_host(std::span<U>(v), s);
    return v;
  }
  //! All of `b`.
  template <class U>
  static std::span<U> whole(buffer<U>& b) {
    return b.span();
  }
  //! Frees `b`'s memory in the order of the last call's stream.
  template <class U>
  void release(buffer<U>& b) const {
    U* p = b.release();
    if (p == nullptr) return;
    if (stream != nullptr) LOOM_CUDA_TRY(cudaFreeAsync(p, stream));
    else LOOM_CUDA_TRY(cudaFree(p));
  }
  //! Binds the executor to the call's stream.
  void bind(const loom::stage_context& c) { stream = c.stream; }
  //! Enqueues `f` over `[0, n)`.
  template <class F>
  void each(std::size_t n, const F& f, const char* label) const {
    launch(stream, n, f, label);
  }
  //! `to = from`, device to device, on the stream.
  template <class U>
  void copy(std::span<const U> from, std::span<U> to) const {
    if (from.empty() || from.data() == to.data()) return;
    LOOM_CUDA_TRY(cudaMemcpyAsync(to.data(), from.data(), from.size_bytes(), cudaMemcpyDeviceToDevice, stream));
  }
  //! Every element of `x` to `v`, on the stream.
  template <class U>
  void fill(std::span<U> x, U v) const {
    loom::cuda::detail::fill_async(x.data(), v, x.size(), stream);
  }
  //! The linear blocks' local kernel on the stream.
  loom::cuda::linear_kernel linear() const { return {stream}; }
  //! The vocabulary layers' kernel (`loom::vocab_layers`): loom's kernels on the pipeline's compute stream.
  using vocab_kernel = loom::cuda::vocab_kernel;
};

}  // namespace mesh_example
