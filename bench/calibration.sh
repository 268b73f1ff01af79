#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
#
# Prediction accuracy of calibrated costs (docs/calibration.md): runs the quickstart on 2 MPI
# processes (one per core) for every schedule family, calibrates on a few steps, and prints a
# markdown table of the step time simulated from the calibrated cost model against the measured
# mean of the steps after the calibration.
#
#   bench/calibration.sh [BUILD_DIR]        (default build-cal; needs its quickstart target)
#
# Settings (environment): WIDTH (512), MICROBATCHES (8), STEPS (20), CALIBRATE (5), RANKS (2),
# FAMILIES (every registered family), MPIRUN_ARGS (extra mpirun options).
# A family that cannot run on RANKS ranks with MICROBATCHES microbatches is listed with the
# quickstart's reason. Every setting is printed in '#' lines above the table.
set -uo pipefail

build=${1:-build-cal}
exe="$build/examples/01_quickstart/quickstart"
WIDTH=${WIDTH:-512}
MICROBATCHES=${MICROBATCHES:-8}
STEPS=${STEPS:-20}
CALIBRATE=${CALIBRATE:-5}
RANKS=${RANKS:-2}
FAMILIES=${FAMILIES:-"1f1b zb-h1 interleaved-1f1b zb-v v-half v-min gpipe zb-h2 zb-auto looped-bfs hanayo dualpipe dualpipe-v chimera bitpipe gpipe-2bp 1f1b-2bp"}
MPIRUN_ARGS=${MPIRUN_ARGS:-}

if [[ ! -x "$exe" ]]; then
  echo "calibration.sh: $exe not found; build it: cmake --build $build --target quickstart" >&2
  exit 2
fi

mpirun=(mpirun -np "$RANKS" --bind-to core --map-by core)
if [[ $(id -u) == 0 ]]; then mpirun+=(--allow-run-as-root); fi
mpirun+=(--oversubscribe)
# shellcheck disable=SC2206
mpirun+=($MPIRUN_ARGS)

echo "# loom calibration accuracy: quickstart MLP, $RANKS MPI processes"
echo "# date $(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# width $WIDTH, layers 9, samples 2 per microbatch, microbatches $MICROBATCHES, steps $STEPS (step 0 warm-up, steps 1..$CALIBRATE calibrate, $((STEPS - CALIBRATE - 1)) measured)"
echo "# command: ${mpirun[*]} $exe --backend mpi --schedule FAMILY --width $WIDTH --microbatches $MICROBATCHES --steps $STEPS --calibrate $CALIBRATE"
# What else used the CPU (top's second 1 s sample, processes above 5 %): the figures mean what
# they mean only on an otherwise idle machine.
busy() {
  top -bn2 -d1 | awk '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $9+0 > 5 {printf "%s%s %s%%", sep, $12, $9; sep=", "}
                      END {if (sep == "") printf "none above 5 %%"}'
}
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); other busy processes: $(busy)"
echo
echo "| family | virtual stages | predicted (ms) | measured (ms) | error | link (ping-pong) | reference check |"
echo "|---|---:|---:|---:|---:|---|---|"
for fam in $FAMILIES; do
  out=$("${mpirun[@]}" "$exe" --backend mpi --schedule "$fam" --width "$WIDTH" --microbatches "$MICROBATCHES" \
        --steps "$STEPS" --calibrate "$CALIBRATE" 2>&1)
  rc=$?
  line=$(grep -m1 '^step time:' <<<"$out")
  if [[ -z "$line" ]]; then
    why=$(grep -m1 'quickstart:' <<<"$out" | sed 's/^quickstart: //; s/|/\\|/g')
    echo "| $fam | | | | | | not run (exit $rc): ${why:-no output} |"
    continue
  fi
  stages=$(grep -m1 -o '[0-9]* virtual stages' <<<"$out" | cut -d' ' -f1)
  pred=$(sed -E 's/.*predicted ([0-9.]+) ms.*/\1/' <<<"$line")
  meas=$(sed -E 's/.*measured ([0-9.]+) ms.*/\1/' <<<"$line")
  err=$(sed -E 's/.*error ([-+0-9.]+) %.*/\1/' <<<"$line")
  link=$(grep -m1 -o 'link [0-9.]* us + [0-9.]* ns/B' <<<"$out" | sed 's/^link //')
  check=$(grep -m1 -o 'MATCH\|DIFFERENT' <<<"$out")
  echo "| $fam | $stages | $pred | $meas | $err % | $link | ${check:-?} |"
done
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); other busy processes: $(busy)"
