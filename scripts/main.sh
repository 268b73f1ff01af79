#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The main job: installs what is missing, builds examples/01_quickstart, and trains an MLP with a
# pipeline schedule over in-process threads, checking it bit for bit against a single-rank
# reference (exit status non-zero if it differs). It sizes the run to the machine it finds (one
# rank thread per core, up to 4; an MLP big enough that a step is mostly computation), calibrates
# a cost model on the first steps, and prints the step time and bubble that model predicts beside
# the measured ones, with a verdict, and writes the last step's measured timeline above its
# prediction (build/main-step.json for Perfetto, build/main-step.svg) (docs/main-job.md). Extra
# arguments go to the example after the
# defaults and override them, e.g.
#   bash scripts/main.sh --schedule dualpipe-v --ranks 4 --microbatches 8
#   bash scripts/main.sh --width 8 --layers 9 --calibrate 0   (the tiny model, no calibration)
#   bash scripts/main.sh --backend mpi      (runs it under mpiexec with --ranks processes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --preset default >/dev/null
cmake --build --preset default --target quickstart loom >/dev/null
# One busy rank per core: more rank threads than cores measure waiting for a core, which no cost
# model predicts. At least 2 ranks (a pipeline), at most 4; 2 microbatches per rank.
cores=$(nproc)
ranks=$((cores < 4 ? cores : 4))
((ranks >= 2)) || ranks=2
# Width 512 x 8 layers, 16 samples per microbatch: a stage call takes about 3 ms on a 2-core VM,
# so hand-offs between ranks (tens of microseconds) and the per-step work outside stage calls
# (zeroing weight gradients, folding them in microbatch order) are a small share of the step.
# Steps: 0 warms up, 1..3 calibrate, 4..23 are measured (a step is about 50 ms at 2 ranks).
# The last step's measured timeline is written beside its prediction: a Perfetto trace and an SVG.
defaults=(--schedule zb-h1 --ranks "$ranks" --microbatches $((2 * ranks)) --width 512 --layers 8 --samples 16
          --steps 24 --calibrate 3 --deterministic --trace build/main-step.json --svg build/main-step.svg)
args=("${defaults[@]}" "$@")
echo "main.sh: $cores cores found; defaults: ${defaults[*]}${*:+; yours after them (the last value of an option wins): $*}"
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --ranks) ranks=${args[i + 1]:-$ranks} ;;
    --ranks=*) ranks=${args[i]#--ranks=} ;;
  esac
done
if printf '%s\n' "${args[@]}" | grep -qx -e mpi -e --backend=mpi; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  exec mpiexec --oversubscribe -n "$ranks" ./build/examples/01_quickstart/quickstart "${args[@]}"
fi
exec ./build/examples/01_quickstart/quickstart "${args[@]}"
