// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! What the profiler and the simulator are told about loom's work on a stream.
//!
//! `loom::cuda::region` brackets the enqueueing of one action (`F mb3 s2`): an NVTX range on the
//! host thread (Nsight Systems shows it above the kernels it launched) and, built against loom's
//! simulator, a region whose accesses (the device byte ranges the action reads and writes) feed
//! the race detector. Names of streams, memory and threads go to NVTX (and to the simulator's
//! reports). Define `LOOM_NO_NVTX` to compile the NVTX calls out.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#if !defined(LOOM_NO_NVTX)
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>
#endif
#if defined(LOOM_CUDA_SIM)
#include "loom/cudasim/sim.hpp"
#endif

namespace loom::cuda {

//! A device byte range an action reads or writes.
struct byte_access {
  const void* ptr = nullptr;  //!< first byte
  std::size_t bytes = 0;      //!< length in bytes
  bool write = false;         //!< written (else only read)
};

//! `s` read.
template <class T>
constexpr byte_access reads(std::span<T> s) noexcept {
  return {s.data(), s.size_bytes(), false};
}
//! `s` written (and possibly read).
template <class T>
constexpr byte_access writes(std::span<T> s) noexcept {
  return {s.data(), s.size_bytes(), true};
}

//! The enqueueing of one action on `stream` (see the file comment). Not copyable; ends at scope
//! exit. `label` must outlive the region.
class region {
 public:
  //! Opens the region named `label` touching `accesses`.
  region(cudaStream_t stream, const char* label, std::span<const byte_access> accesses) : stream_(stream) {
#if !defined(LOOM_NO_NVTX)
    nvtxRangePushA(label);
#endif
#if defined(LOOM_CUDA_SIM)
    cudasim::access acc[16];
    std::size_t n = 0;
    for (auto const& a : accesses)
      if (a.bytes != 0 && n < 16) acc[n++] = {a.ptr, a.bytes, a.write};
    cudasim::begin_region(stream, label, std::span<const cudasim::access>(acc, n));
#else
    (void)accesses;
#endif
  }
  region(const region&) = delete;
  region& operator=(const region&) = delete;
  ~region() {
#if defined(LOOM_CUDA_SIM)
    cudasim::end_region(stream_);
#endif
#if !defined(LOOM_NO_NVTX)
    nvtxRangePop();
#endif
  }

 private:
  cudaStream_t stream_;
};

//! Names `stream` in Nsight Systems (and in the simulator's reports).
inline void name_stream(cudaStream_t stream, const std::string& name) {
#if !defined(LOOM_NO_NVTX)
  nvtxNameCudaStreamA(stream, name.c_str());
#endif
#if defined(LOOM_CUDA_SIM)
  cudasim::name_stream(stream, name);
#else
  (void)stream;
  (void)name;
#endif
}

//! Names the device memory at `ptr` in the simulator's reports (no effect on a GPU).
inline void name_memory([[maybe_unused]] const void* ptr, [[maybe_unused]] const std::string& name) {
#if defined(LOOM_CUDA_SIM)
  cudasim::name_memory(ptr, name);
#endif
}

//! A host-level hand-off through `key`, release side: work that another thread enqueues after
//! `host_acquire(key)` is ordered after what this thread has synchronised with. On a GPU the
//! hand-off itself (an atomic) orders them and this does nothing; the simulator's race detector
//! cannot see host synchronisation between threads, so it is told (see `cudasim::host_release`).
inline void host_release([[maybe_unused]] const void* key) {
#if defined(LOOM_CUDA_SIM)
  cudasim::host_release(key);
#endif
}
//! The acquire side of `host_release`.
inline void host_acquire([[maybe_unused]] const void* key) {
#if defined(LOOM_CUDA_SIM)
  cudasim::host_acquire(key);
#endif
}

//! Names the calling thread in Nsight Systems (and the simulator's memory accounting).
inline void name_thread(const std::string& name) {
#if !defined(LOOM_NO_NVTX)
  nvtxNameOsThreadA(0, name.c_str());
#endif
#if defined(LOOM_CUDA_SIM)
  cudasim::name_thread(name);
#else
  (void)name;
#endif
}

}  // namespace loom::cuda
