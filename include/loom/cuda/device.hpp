// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Devices: whether one is usable (and why not), the current device, a guard that restores it.

#include <string>

#include "loom/cuda/error.hpp"

namespace loom::cuda {

//! Whether CUDA devices can be used here, how many, and if not, why (the error CUDA gave).
struct availability {
  int devices = 0;     //!< usable devices
  std::string why;     //!< empty when `devices > 0`
  //! True when at least one device is usable.
  explicit operator bool() const noexcept { return devices > 0; }
};

//! Asks the runtime for its devices without throwing (on a machine without a driver the answer
//! is 0 devices and, e.g., "cudaGetDeviceCount: cudaErrorInsufficientDriver (...)").
inline availability available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return {0, std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
  }
  if (n == 0) return {0, "cudaGetDeviceCount: no CUDA device"};
  return {n, {}};
}

//! True when this build runs against loom's CUDA simulator instead of a GPU.
constexpr bool simulated() noexcept {
#if defined(LOOM_CUDA_SIM)
  return true;
#else
  return false;
#endif
}

//! The calling thread's current device.
inline int current_device() {
  int d = 0;
  LOOM_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

//! Makes `device` current for the guard's lifetime, then restores the previous one.
class device_guard {
 public:
  //! Switches to `device`.
  explicit device_guard(int device) : previous_(current_device()) { LOOM_CUDA_TRY(cudaSetDevice(device)); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_;
};

}  // namespace loom::cuda
