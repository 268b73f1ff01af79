#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# What the simulator's actual-access tracking costs (docs/cuda.md, "The simulator's own cost"):
# the same binaries of a clang build (the CUDA MLP's stage traced by loom_cuda_stage) with
# LOOM_CUDASIM_ACTUAL=1 and =0: the simulated device suite (the test cases that do not need
# tracking, one process) and the CUDA MLP with 128-wide layers, three runs each. Run it on an
# otherwise idle machine.
#   bash bench/actual_access_cost.sh [BUILD_DIR]   (default: build-clang, `cmake --preset clang`)
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build-clang}
for exe in "$b/tests/cuda_layer/test_cuda_layer" "$b/examples/02_cuda_mlp/cuda_mlp"; do
  [ -x "$exe" ] || { echo "actual_access_cost: no $exe (build the clang preset's test_cuda_layer and cuda_mlp)" >&2; exit 2; }
done
seconds() {  # the wall time of "$@", output discarded; fails with it
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || { echo "actual_access_cost: failed: $*" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}
not_tracking='actual accesses*,with the declared*,a stage that runs*,a kernel that writes*,an update on another*'
for a in 1 0; do
  echo "device suite, LOOM_CUDASIM_ACTUAL=$a: $(LOOM_CUDASIM_ACTUAL=$a seconds "$b/tests/cuda_layer/test_cuda_layer" -tce="$not_tracking") s"
done
for a in 1 0; do
  runs=""
  for i in 1 2 3; do
    runs+=" $(LOOM_CUDASIM_ACTUAL=$a LOOM_CUDASIM_DELAYS=0 seconds "$b/examples/02_cuda_mlp/cuda_mlp" --schedule 1f1b --ranks 2 \
      --microbatches 8 --width 128 --samples 32 --steps 3 --no-reference)"
  done
  echo "cuda_mlp width 128, LOOM_CUDASIM_ACTUAL=$a:$runs s"
done
