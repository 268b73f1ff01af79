// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! CUDA streams and events as RAII types: `loom::cuda::stream` (owning) and `stream_ref`
//! (non-owning), `loom::cuda::event` (owning; timing disabled by default, the cheap kind used
//! for dependencies). Constructors from `int` and `nullptr` are deleted: the legacy default
//! stream is named explicitly (`stream_ref::legacy()`), never by accident.

#include <cstddef>
#include <string_view>
#include <utility>

#include "loom/cuda/error.hpp"

namespace loom::cuda {

class event;

//! A non-owning handle on a CUDA stream.
class stream_ref {
 public:
  //! Refers to `s` (must not be null: use `legacy()` for the legacy default stream).
  constexpr explicit stream_ref(cudaStream_t s) noexcept : s_(s) {}
  stream_ref(int) = delete;
  stream_ref(std::nullptr_t) = delete;
  //! The legacy default stream.
  static stream_ref legacy() noexcept { return stream_ref(cudaStreamLegacy); }
  //! The CUDA handle.
  constexpr cudaStream_t get() const noexcept { return s_; }
  //! Blocks the host until the work enqueued so far has finished.
  void synchronize() const { LOOM_CUDA_TRY(cudaStreamSynchronize(s_)); }
  //! Whether the work enqueued so far has finished (throws on a failure).
  bool ready() const {
    const cudaError_t e = cudaStreamQuery(s_);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) detail::throw_cuda(e, "cudaStreamQuery(stream)", __FILE__, __LINE__);
    return true;
  }
  //! Makes later work on this stream wait for the last record of `e`.
  inline void wait(const event& e) const;
  friend constexpr bool operator==(stream_ref a, stream_ref b) noexcept { return a.s_ == b.s_; }

 private:
  cudaStream_t s_;
};

//! An owning CUDA stream (non-blocking by default: no implicit synchronisation with the legacy
//! default stream), destroyed with its owner.
class stream {
 public:
  //! Creates a stream with `flags` (`cudaStreamNonBlocking` by default).
  explicit stream(unsigned flags = cudaStreamNonBlocking) { LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&s_, flags)); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  //! Takes `o`'s stream.
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  //! Takes `o`'s stream, destroying this one's.
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~stream() { reset(); }
  //! The CUDA handle.
  cudaStream_t get() const noexcept { return s_; }
  //! A non-owning handle.
  stream_ref ref() const noexcept { return stream_ref(s_); }
  operator stream_ref() const noexcept { return ref(); }
  //! Blocks the host until the work enqueued so far has finished.
  void synchronize() const { ref().synchronize(); }

 private:
  void reset() noexcept {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

//! An owning CUDA event. Timing is disabled unless asked for (`event(true)`): such events are
//! the cheapest dependency CUDA has.
class event {
 public:
  //! Creates an event; `timing` enables `elapsed_ms`.
  explicit event(bool timing = false) {
    LOOM_CUDA_TRY(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  //! Takes `o`'s event.
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  //! Takes `o`'s event, destroying this one's.
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~event() { reset(); }
  //! The CUDA handle.
  cudaEvent_t get() const noexcept { return e_; }
  //! Records the event at the current end of `s`.
  void record(stream_ref s) const { LOOM_CUDA_TRY(cudaEventRecord(e_, s.get())); }
  //! Blocks the host until the last record has completed.
  void synchronize() const { LOOM_CUDA_TRY(cudaEventSynchronize(e_)); }
  //! Whether the last record has completed (throws on a failure).
  bool ready() const {
    const cudaError_t e = cudaEventQuery(e_);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) detail::throw_cuda(e, "cudaEventQuery(event)", __FILE__, __LINE__);
    return true;
  }
  //! Milliseconds between the last records of two timing events.
  static float elapsed_ms(const event& start, const event& end) {
    float ms = 0;
    LOOM_CUDA_TRY(cudaEventElapsedTime(&ms, start.e_, end.e_));
    return ms;
  }

 private:
  void reset() noexcept {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

inline void stream_ref::wait(const event& e) const { LOOM_CUDA_TRY(cudaStreamWaitEvent(s_, e.get(), 0)); }

}  // namespace loom::cuda
