// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! CUDA and NCCL errors as exceptions. Every CUDA runtime call in loom goes through
//! `LOOM_CUDA_TRY`, every NCCL call through `LOOM_NCCL_TRY`; a failure throws `loom::cuda_error`
//! or `loom::nccl_error` carrying the call's text, the code, its name, the file and the line.
//! Built against loom's simulator (`LOOM_CUDA_SIM`), the message also carries the simulator's
//! explanation (a race report, a capture rule, a deadlock, ...).

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#if defined(LOOM_CUDA_SIM)
#include "loom/cudasim/sim.hpp"
#endif

namespace loom {

namespace cuda::detail {
//! `file` as messages name it: from the include root for loom's headers ("loom/comm/nccl.hpp"),
//! else from the last directory on ("src/train.cpp" stays "train.cpp"), so a message does not
//! depend on where the tree was checked out.
constexpr const char* short_file(const char* file) noexcept {
  const char* last = file;
  for (const char* p = file; *p != '\0'; ++p) {
    if (*p == '/') last = p + 1;
    if (p[0] == '/' && p[1] == 'l' && p[2] == 'o' && p[3] == 'o' && p[4] == 'm' && p[5] == '/') return p + 1;
  }
  return last;
}
}  // namespace cuda::detail

//! A CUDA runtime call failed.
class cuda_error : public std::runtime_error {
 public:
  //! The failure of `call` (its source text) with `code`, at `file`:`line`.
  cuda_error(cudaError_t code, std::string call, const char* file, int line, std::string extra = {})
      : std::runtime_error(compose(code, call, file, line, extra)), code_(code), call_(std::move(call)) {}
  //! The CUDA error code.
  cudaError_t code() const noexcept { return code_; }
  //! The error code's name, e.g. "cudaErrorLaunchFailure".
  const char* name() const noexcept { return cudaGetErrorName(code_); }
  //! The source text of the call that failed.
  const std::string& call() const noexcept { return call_; }

 private:
  static std::string compose(cudaError_t code, const std::string& call, const char* file, int line, const std::string& extra) {
    std::string s = "loom cuda: " + call + " failed: " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ") at " +
                    cuda::detail::short_file(file) + ":" + std::to_string(line);
    if (!extra.empty()) s += "; " + extra;
    return s;
  }
  cudaError_t code_;
  std::string call_;
};

//! An NCCL call failed.
class nccl_error : public std::runtime_error {
 public:
  //! The failure of `call` (its source text) with `code`, at `file`:`line`.
  nccl_error(ncclResult_t code, std::string call, const char* file, int line, std::string extra = {})
      : std::runtime_error(compose(code, call, file, line, extra)), code_(code), call_(std::move(call)) {}
  //! The NCCL result code.
  ncclResult_t code() const noexcept { return code_; }
  //! The source text of the call that failed.
  const std::string& call() const noexcept { return call_; }

 private:
  static std::string compose(ncclResult_t code, const std::string& call, const char* file, int line, const std::string& extra) {
    std::string s = "loom nccl: " + call + " failed: " + name_of(code) + " (" + ncclGetErrorString(code) + ") at " +
                    cuda::detail::short_file(file) + ":" + std::to_string(line);
    if (!extra.empty()) s += "; " + extra;
    return s;
  }
  static std::string name_of(ncclResult_t r) {
    switch (r) {
      case ncclSuccess: return "ncclSuccess";
      case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
      case ncclSystemError: return "ncclSystemError";
      case ncclInternalError: return "ncclInternalError";
      case ncclInvalidArgument: return "ncclInvalidArgument";
      case ncclInvalidUsage: return "ncclInvalidUsage";
      case ncclRemoteError: return "ncclRemoteError";
      case ncclInProgress: return "ncclInProgress";
      default: return "ncclResult " + std::to_string(static_cast<int>(r));
    }
  }
  ncclResult_t code_;
  std::string call_;
};

namespace cuda::detail {

//! Throws the `cuda_error` of `code` (clearing CUDA's last error).
[[noreturn]] inline void throw_cuda(cudaError_t code, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
#if defined(LOOM_CUDA_SIM)
  throw cuda_error(code, call, file, line, "loom cudasim: " + ::loom::cudasim::detail());
#else
  throw cuda_error(code, call, file, line);
#endif
}

//! Throws the `nccl_error` of `code` with NCCL's last error text.
[[noreturn]] inline void throw_nccl(ncclResult_t code, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw nccl_error(code, call, file, line, last != nullptr ? last : "");
}

}  // namespace cuda::detail
}  // namespace loom

//! Evaluates a CUDA runtime call and throws `loom::cuda_error` unless it returned `cudaSuccess`.
#define LOOM_CUDA_TRY(...)                                                                         \
  do {                                                                                             \
    const cudaError_t loom_cuda_status_ = (__VA_ARGS__);                                           \
    if (loom_cuda_status_ != cudaSuccess)                                                          \
      ::loom::cuda::detail::throw_cuda(loom_cuda_status_, #__VA_ARGS__, __FILE__, __LINE__);       \
  } while (0)

//! Evaluates an NCCL call and throws `loom::nccl_error` unless it returned `ncclSuccess` (or
//! `ncclInProgress`, the normal answer of a non-blocking communicator).
#define LOOM_NCCL_TRY(...)                                                                         \
  do {                                                                                             \
    const ncclResult_t loom_nccl_status_ = (__VA_ARGS__);                                          \
    if (loom_nccl_status_ != ncclSuccess && loom_nccl_status_ != ncclInProgress)                  \
      ::loom::cuda::detail::throw_nccl(loom_nccl_status_, #__VA_ARGS__, __FILE__, __LINE__);       \
  } while (0)
