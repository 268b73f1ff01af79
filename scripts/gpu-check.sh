#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The GPU checks recorded in docs/cuda.md, for a machine with an NVIDIA GPU: builds loom's
# real-runtime flavour (LOOM_CUDA_RUNTIME=real), then runs the gpu-labelled tests, every
# registered family of examples/02_cuda_mlp on the GPU(s), the busy-fraction runs and the
# device benchmarks. Logs go to $OUT (default ./gpu-out); a summary is printed last.
# Packages missing on a machine without a package registry may be given as Debian packages in
# .devdeps/*.deb (extracted, not installed). Phases (default: all of them, in order):
#   bash scripts/gpu-check.sh [build] [test] [sweep] [busy] [bench] [mesh]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
prefix=""
if compgen -G ".devdeps/*.deb" >/dev/null; then
  mkdir -p /tmp/loom-deps
  for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/loom-deps; done
  prefix=/tmp/loom-deps/usr
fi
# NCCL: next to the toolkit, else the one a Python wheel (nvidia-nccl-cu*) brings, which ships
# libnccl.so.2 without the unversioned name CMake's find_library wants.
if [ -z "${NCCL_HOME:-}" ] && [ ! -e "$(dirname "$(command -v nvcc)")/../include/nccl.h" ]; then
  wheel=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
  if [ -n "$wheel" ] && [ -e "$wheel/include/nccl.h" ]; then
    mkdir -p /tmp/loom-nccl/lib
    ln -sf "$wheel/include" /tmp/loom-nccl/include
    ln -sf "$wheel"/lib/libnccl.so.2 /tmp/loom-nccl/lib/libnccl.so
    ln -sf "$wheel"/lib/libnccl.so.2 /tmp/loom-nccl/lib/libnccl.so.2
    export NCCL_HOME=/tmp/loom-nccl LD_LIBRARY_PATH=/tmp/loom-nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
jobs=$(nproc)
{ nvidia-smi -L; nvcc --version | tail -2; g++ --version | head -1; cmake --version | head -1; echo "NCCL_HOME=${NCCL_HOME:-(toolkit)}"; } 2>&1 | tee "$out/machine.txt"

t0=$(date +%s)
# The build's log stays in build-gpu (a lent machine returns at most 8 files from $OUT: the eight
# logs below); it is copied to $OUT only when the build fails.
build() {
mkdir -p build-gpu
blog=build-gpu/gpu-check-build.log
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA_RUNTIME=real -DLOOM_GPU_PROGRAMS=ON -DLOOM_ENABLE_MPI=OFF \
  ${prefix:+-DCMAKE_PREFIX_PATH=$prefix} >"$blog" 2>&1 || { tail -30 "$blog"; cp "$blog" "$out/build.log"; exit 1; }
# -k 0: a target that fails to build (a new compiler's warning, say) leaves the others to run.
cmake --build build-gpu -j"$jobs" --target loom cuda_mlp_gpu mesh_gpu test_cuda_layer_gpu nvcc_all_headers device_overhead_gpu p2p_perf_gpu moe_overlap_gpu \
  -- -k 0 >>"$blog" 2>&1 || { grep -B2 -A8 "error:" "$blog" | head -60; cp "$blog" "$out/build.log"; echo "build: FAILED (see build.log)" | tee -a "$out/summary.txt"; }
echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
}

# 1. The gpu-labelled tests (the same sources as the simulated ones, on the real runtime), each
#    bounded at 120 s so that a hang costs a lent GPU two minutes, not its lease.
test() {
(cd build-gpu && ctest -L gpu -R "cuda" --output-on-failure -j1 --timeout 120) >"$out/ctest-gpu.log" 2>&1
grep -E "tests passed|Skipped|Failed|\*\*\*" "$out/ctest-gpu.log" | tee -a "$out/summary.txt"
./build-gpu/tests/cuda_layer/nvcc_all_headers && echo "nvcc_all_headers: ran" | tee -a "$out/summary.txt"
}

# 2. Every family on the GPU: cuda_local (P 2 and 4 as streams on one GPU), and nccl when there
#    are enough GPUs; deterministic (bitwise) and default (1e-5), eager and graph.
sweep() {
ngpu=$(nvidia-smi -L | wc -l)
pass=0; fail=0
for sched in $(./build-gpu/tools/loom/loom list --synchronous); do
  for P in 2 4; do for m in $((2 * P)) $((2 * P + 1)); do
    backends="cuda_local"; [ "$ngpu" -ge "$P" ] && backends="cuda_local nccl"
    for be in $backends; do for g in "" "--graph"; do for d in "--deterministic" ""; do
      line=$(./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule "$sched" --ranks "$P" --microbatches "$m" --backend "$be" $g $d --steps 3 2>&1 | tail -1)
      rc=$?
      if echo "$line" | grep -q "MATCH$"; then pass=$((pass + 1));
      elif echo "$line" | grep -qE "needs|must|requires"; then :;
      else fail=$((fail + 1)); echo "FAIL $sched P=$P m=$m $be $g $d: $line" >>"$out/sweep.txt"; fi
    done; done; done
  done; done
done
echo "cuda_mlp_gpu sweep: $pass match, $fail differ or fail (GPUs: $ngpu)" | tee -a "$out/summary.txt"
}

# 3. Busy fraction at realistic kernel sizes (one rank: the simulator predicts no bubble).
busy() {
for g in "" "--graph"; do
  ./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule 1f1b --ranks 1 --microbatches 8 --width 2048 --layers 8 --samples 512 \
    --steps 4 --measure --no-reference $g 2>&1 | tee -a "$out/busy.txt" | grep -E "busy|MATCH|DIFFERENT" | tail -2 | tee -a "$out/summary.txt"
done
./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule zb-h1 --ranks 4 --microbatches 16 --width 1024 --layers 8 --samples 512 \
  --steps 4 --measure --no-reference 2>&1 | tee -a "$out/busy.txt" | tail -2 | tee -a "$out/summary.txt"
}

# 4. Host cost per action (eager and graph replay) and the p2p patterns.
bench() {
./build-gpu/bench/device_overhead_gpu --benchmark_counters_tabular=true >"$out/device_overhead.txt" 2>&1
grep -E "^BM_" "$out/device_overhead.txt" | tee -a "$out/summary.txt"
for sched in 1f1b zb-h1 interleaved-1f1b dualpipe-v; do
  ./build-gpu/bench/p2p_perf_gpu -s "$sched" -p 2 -m 8 -B cuda_local -b 64K -e 256M -f 16 -n 10 -w 3 >>"$out/p2p.txt" 2>&1
  ./build-gpu/bench/p2p_perf_gpu -s "$sched" -p 2 -m 8 -B cuda_local -b 64K -e 256M -f 16 -n 10 -w 3 -G 1 >>"$out/p2p.txt" 2>&1
done
grep -E "^# loom|Out of bounds|Avg bus" "$out/p2p.txt" | tee -a "$out/summary.txt"
# FSMoE's overlap: the MoE exchange unchunked against 2 and 4 pieces (docs/moe.md, "On devices").
./build-gpu/bench/moe_overlap_gpu --benchmark_counters_tabular=true >"$out/moe_overlap.txt" 2>&1
grep -E "^BM_" "$out/moe_overlap.txt" | tee -a "$out/summary.txt"
}

# 5. The mesh on the GPU: dp2 x pp2 of the CUDA MLP on cuda_local (four ranks as streams of the one
#    GPU), checked against the CPU reference (deterministic: bitwise), then the fraction of the
#    data-parallel reductions hidden behind the pipeline, eager against --sync-after-step.
mesh() {
for sched in 1f1b zb-h1; do
  for d in "--deterministic" ""; do
    ./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule "$sched" --ranks 2 --dp 2 --microbatches 8 --steps 3 $d 2>&1 | tee -a "$out/mesh.txt" | tail -1 | tee -a "$out/summary.txt"
  done
done
# ZeRO stages 1-3 with Adam, and Local SGD (every 2 steps, and one-shot), on the same dp2 x pp2:
# deterministic runs must be bitwise equal to the CPU reference, default ones within 1e-5.
for z in 1 2 3; do for d in "--deterministic" ""; do
  echo "# zero-stage $z adam 1f1b dp2 x pp2 $d" >>"$out/mesh.txt"
  ./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule 1f1b --ranks 2 --dp 2 --microbatches 8 --steps 3 --zero-stage "$z" \
    --optimizer adam $d 2>&1 | tee -a "$out/mesh.txt" | grep -E "ZeRO stage|MATCH|DIFFERENT" | tee -a "$out/summary.txt"
done; done
for ls in "--local-steps 2" "--local-steps 3 --one-shot"; do
  echo "# $ls adam zb-h1 dp2 x pp2 --deterministic" >>"$out/mesh.txt"
  ./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule zb-h1 --ranks 2 --dp 2 --microbatches 8 --steps 5 $ls --optimizer adam \
    --deterministic 2>&1 | tee -a "$out/mesh.txt" | tail -1 | tee -a "$out/summary.txt"
done
# The transformer of examples/03_mesh in fp32 on device kernels (mesh_gpu), 8 ranks as streams of
# the one GPU: dp2 x pp2 x tp2 (and with ZeRO-3 and Adam), two sp kinds and MoE blocks; each within 1e-5 of
# the host float reference (Adam: its step bound) and within the bound of the double one.
mesh_gpu_run() {  # $1: the summary lines' pattern; $2: the options
  echo "# mesh_gpu --backend cuda_local $2" | tee -a "$out/mesh.txt" >>"$out/summary.txt"
  timeout 120 ./build-gpu/examples/03_mesh/mesh_gpu --backend cuda_local --steps 3 $2 2>&1 | tee -a "$out/mesh.txt" \
    | grep -E "$1" | tee -a "$out/summary.txt"
}
for args in "--dp 2 --pp 2 --tp 2 --schedule zb-h1 --deterministic" "--dp 2 --pp 2 --tp 2 --schedule zb-h1" \
            "--dp 2 --pp 2 --tp 2 --schedule interleaved-1f1b --zero-stage 3 --optimizer adam" \
            "--sp 4 --sp-kind usp --pp 2 --schedule dualpipe-v" "--sp 2 --sp-kind ring --dp 2 --tp 2 --deterministic" \
            "--experts 4 --top-k 2 --capacity-factor 0.5 --moe-every 1 --ep 2 --dp 2 --pp 2 --schedule zb-h1"; do
  mesh_gpu_run "fp32 against|device memory|reference check|mesh:" "$args"
done
# The MoE model of examples/03_mesh (--experts) in fp32 on device kernels, 8 ranks as streams of the
# GPU: the flat exchange, the overlap on two streams, the hierarchical one and Pipeline MoE; each
# within 1e-5 of the fp32 reference, which is within 1e-4 of the double one.
for args in "--experts 4 --top-k 2 --capacity-factor 0.5 --ep 2 --dp 2 --pp 2 --schedule zb-h1" \
            "--experts 4 --top-k 2 --ep 2 --dp 2 --pp 2 --schedule zb-h1 --moe-chunks 3" \
            "--experts 4 --top-k 2 --ep 4 --pp 2 --schedule zb-v --moe-node-size 2" "--experts 4 --top-k 2 --moe-layout tp --tp 2 --dp 2"; do
  mesh_gpu_run "fp32 reference against|reference check|mesh:" "$args"
done
# What ZeRO-3's gathers cost at width 1024 (step time against stage 0 and 2, eager reductions).
for z in 0 2 3; do
  echo "# zero-stage $z 1f1b dp2 x pp2, width 1024, 8 layers, 512 samples per microbatch, 8 microbatches" | tee -a "$out/mesh.txt" >>"$out/summary.txt"
  ./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule 1f1b --ranks 2 --dp 2 --microbatches 8 --width 1024 --layers 8 \
    --samples 512 --steps 5 --measure --no-reference --zero-stage "$z" 2>&1 | tee -a "$out/mesh.txt" | grep -E "hidden|busy|ZeRO" | tail -3 | tee -a "$out/summary.txt"
done
for samples in 512 32; do for sched in 1f1b zb-h1; do for after in "" "--sync-after-step"; do
  echo "# $sched dp2 x pp2, width 1024, 8 layers, $samples samples per microbatch, 8 microbatches $after" | tee -a "$out/mesh.txt" >>"$out/summary.txt"
  ./build-gpu/examples/02_cuda_mlp/cuda_mlp_gpu --schedule "$sched" --ranks 2 --dp 2 --microbatches 8 --width 1024 --layers 8 \
    --samples "$samples" --steps 5 --measure --no-reference $after 2>&1 | tee -a "$out/mesh.txt" | grep -E "hidden|busy" | tail -2 | tee -a "$out/summary.txt"
done; done; done
}

phases=("$@")
((${#phases[@]})) || phases=(build test sweep busy bench mesh)
for p in "${phases[@]}"; do "$p"; done
echo "total: $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
