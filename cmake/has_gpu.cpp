// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Configure-time probe (LOOM_CUDA_RUNTIME=auto): exits 0 when a CUDA device is usable.
#include <cstdio>
#include <cuda_runtime_api.h>
int main() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  std::printf("%s %d\n", cudaGetErrorName(e), n);
  return e == cudaSuccess && n > 0 ? 0 : 1;
}
