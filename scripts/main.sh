#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The main job: installs what is missing, builds examples/01_quickstart, and trains a small MLP
# with a pipeline schedule over in-process threads, checking it against a single-rank reference
# (exit status non-zero if it differs). Extra arguments go to the example, e.g.
#   bash scripts/main.sh --schedule dualpipe-v --ranks 4 --microbatches 8
#   bash scripts/main.sh --backend mpi      (runs it under mpiexec with --ranks processes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --preset default >/dev/null
cmake --build --preset default --target quickstart loom >/dev/null
# With no arguments: ZB-H1 on 4 ranks x 8 microbatches, deterministic (bitwise check).
if (($#)); then args=("$@"); else args=(--schedule zb-h1 --ranks 4 --microbatches 8 --steps 5 --deterministic); fi
ranks=4
for ((i = 0; i < ${#args[@]}; ++i)); do [ "${args[i]}" = --ranks ] && ranks=${args[i + 1]}; done
if printf '%s\n' "${args[@]}" | grep -qx mpi; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  exec mpiexec --oversubscribe -n "$ranks" ./build/examples/01_quickstart/quickstart "${args[@]}"
fi
exec ./build/examples/01_quickstart/quickstart "${args[@]}"
