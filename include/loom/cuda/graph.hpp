// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! CUDA graphs as RAII types: `loom::cuda::graph` (a captured graph) and `graph_exec` (its
//! executable form, launched on a stream), and `capture(stream, fn)`, which captures what `fn`
//! enqueues on the stream (and on streams forked from it through events) into a graph. A
//! failure inside `fn` ends the capture before the exception leaves, so the stream is usable.

#include <utility>

#include "loom/cuda/stream.hpp"

namespace loom::cuda {

//! An owning captured CUDA graph.
class graph {
 public:
  //! No graph.
  graph() noexcept = default;
  //! Takes ownership of `g`.
  explicit graph(cudaGraph_t g) noexcept : g_(g) {}
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;
  //! Takes `o`'s graph.
  graph(graph&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
  //! Takes `o`'s graph, destroying this one's.
  graph& operator=(graph&& o) noexcept {
    if (this != &o) {
      reset();
      g_ = std::exchange(o.g_, nullptr);
    }
    return *this;
  }
  ~graph() { reset(); }
  //! The CUDA handle.
  cudaGraph_t get() const noexcept { return g_; }
  //! Number of nodes.
  std::size_t size() const {
    std::size_t n = 0;
    LOOM_CUDA_TRY(cudaGraphGetNodes(g_, nullptr, &n));
    return n;
  }

 private:
  void reset() noexcept {
    if (g_ != nullptr) (void)cudaGraphDestroy(g_);
    g_ = nullptr;
  }
  cudaGraph_t g_ = nullptr;
};

//! An owning executable graph.
class graph_exec {
 public:
  //! No executable graph.
  graph_exec() noexcept = default;
  //! Instantiates `g`.
  explicit graph_exec(const graph& g) { LOOM_CUDA_TRY(cudaGraphInstantiate(&x_, g.get(), 0)); }
  graph_exec(const graph_exec&) = delete;
  graph_exec& operator=(const graph_exec&) = delete;
  //! Takes `o`'s executable graph.
  graph_exec(graph_exec&& o) noexcept : x_(std::exchange(o.x_, nullptr)) {}
  //! Takes `o`'s executable graph, destroying this one's.
  graph_exec& operator=(graph_exec&& o) noexcept {
    if (this != &o) {
      reset();
      x_ = std::exchange(o.x_, nullptr);
    }
    return *this;
  }
  ~graph_exec() { reset(); }
  //! Whether it holds an executable graph.
  explicit operator bool() const noexcept { return x_ != nullptr; }
  //! Enqueues one replay on `s`.
  void launch(stream_ref s) const { LOOM_CUDA_TRY(cudaGraphLaunch(x_, s.get())); }

 private:
  void reset() noexcept {
    if (x_ != nullptr) (void)cudaGraphExecDestroy(x_);
    x_ = nullptr;
  }
  cudaGraphExec_t x_ = nullptr;
};

//! Captures what `fn()` enqueues on `s` into a graph (`mode`: CUDA's capture mode). If `fn`
//! throws, the capture is ended and discarded before the exception propagates.
template <class Fn>
graph capture(stream_ref s, Fn&& fn, cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
  LOOM_CUDA_TRY(cudaStreamBeginCapture(s.get(), mode));
  try {
    std::forward<Fn>(fn)();
  } catch (...) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(s.get(), &g) == cudaSuccess && g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t g = nullptr;
  LOOM_CUDA_TRY(cudaStreamEndCapture(s.get(), &g));
  return graph(g);
}

}  // namespace loom::cuda
