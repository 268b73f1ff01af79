// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Device and pinned host memory as RAII buffers: `loom::cuda::device_buffer<T>` (`cudaMalloc`)
//! and `loom::cuda::pinned_buffer<T>` (`cudaMallocHost`, for asynchronous copies to the host).
//! Elements are not initialised. Freeing device memory synchronises the device (as `cudaFree`
//! does), so a buffer outlives the work that uses it.

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "loom/cuda/error.hpp"

namespace loom::cuda {

namespace detail {

//! Owns `n` elements of `T` from `Alloc`/`Free` (device or pinned memory).
template <class T, bool Pinned>
class raw_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "loom::cuda buffers hold trivially copyable elements");

 public:
  //! No memory.
  raw_buffer() noexcept = default;
  //! `n` uninitialised elements.
  explicit raw_buffer(std::size_t n) : n_(n) {
    if (n == 0) return;
    void* p = nullptr;
    if constexpr (Pinned) LOOM_CUDA_TRY(cudaMallocHost(&p, n * sizeof(T)));
    else LOOM_CUDA_TRY(cudaMalloc(&p, n * sizeof(T)));
    p_ = static_cast<T*>(p);
  }
  raw_buffer(const raw_buffer&) = delete;
  raw_buffer& operator=(const raw_buffer&) = delete;
  //! Takes `o`'s memory.
  raw_buffer(raw_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  //! Takes `o`'s memory, freeing this one's.
  raw_buffer& operator=(raw_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~raw_buffer() { reset(); }
  //! First element.
  T* data() const noexcept { return p_; }
  //! Number of elements.
  std::size_t size() const noexcept { return n_; }
  //! Bytes.
  std::size_t bytes() const noexcept { return n_ * sizeof(T); }
  //! All elements as a span.
  std::span<T> span() const noexcept { return {p_, n_}; }
  //! Gives the memory up without freeing it (the caller frees it, e.g. stream-ordered with
  //! `cudaFreeAsync`); the buffer is empty afterwards.
  T* release() noexcept {
    n_ = 0;
    return std::exchange(p_, nullptr);
  }

 private:
  void reset() noexcept {
    if (p_ == nullptr) return;
    if constexpr (Pinned) (void)cudaFreeHost(p_);
    else (void)cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace detail

//! `n` elements of device memory (see the file comment).
template <class T>
using device_buffer = detail::raw_buffer<T, false>;
//! `n` elements of pinned host memory (see the file comment).
template <class T>
using pinned_buffer = detail::raw_buffer<T, true>;

//! Copies `src` (host) into `dst` (device) and waits.
template <class T>
void copy_to_device(std::span<T> dst, std::span<const T> src) {
  if (dst.size() != src.size()) throw std::length_error("loom::cuda::copy_to_device: sizes differ");
  LOOM_CUDA_TRY(cudaMemcpy(dst.data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice));
}

//! Copies `src` (device) into `dst` (host) and waits.
template <class T>
void copy_to_host(std::span<T> dst, std::span<const T> src) {
  if (dst.size() != src.size()) throw std::length_error("loom::cuda::copy_to_host: sizes differ");
  LOOM_CUDA_TRY(cudaMemcpy(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToHost));
}

}  // namespace loom::cuda
