#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Renders docs/cuda.md's tables of a GPU run from the logs scripts/gpu-check.sh wrote, kept under
# docs/gpu/<date>-<card>/ (ctest checks that the document shows this output for the recorded runs).
#   bash docs/gpu/render.sh docs/gpu/2026-11-26-h100
set -euo pipefail
dir=${1:?usage: render.sh DIR (the logs of one GPU run)}

# Host cost per action: bench/device_overhead_gpu's rows (the counter host_us_per_action).
if [ -f "$dir/device_overhead.txt" ]; then
  echo "| communicator | ranks | eager µs/action | graph replay µs/action |"
  echo "|---|---|---|---|"
  awk '
    /^BM_/ && $0 !~ /ERROR OCCURRED/ {
      split($1, p, "/"); name = p[1]; ranks = p[2]; us = $8
      sub(/^BM_/, "", name)
      mode = name ~ /_graph$/ ? "graph" : "eager"
      mesh = name ~ /_mesh_/
      sub(/_(mesh_)?(eager|graph)$/, "", name)
      key = (mesh ? name ", dp2 x pp" ranks " with data_parallel" : name) SUBSEP (mesh ? 2 * ranks : ranks)
      if (!(key in seen)) { seen[key] = 1; order[++n] = key }
      val[key, mode] = sprintf("%.3g", us)
    }
    END {
      for (i = 1; i <= n; ++i) {
        split(order[i], k, SUBSEP)
        e = (order[i] SUBSEP "eager") in val ? val[order[i], "eager"] : "–"
        g = (order[i] SUBSEP "graph") in val ? val[order[i], "graph"] : "–"
        printf "| %s | %s | %s | %s |\n", k[1], k[2], e, g
      }
    }' "$dir/device_overhead.txt"
  echo
fi

# The p2p pattern: bench/p2p_perf_gpu's bandwidth (GB/s sent per rank) per message size.
if [ -f "$dir/p2p.txt" ]; then
  awk '
    function label(b) { return b >= 1048576 ? b / 1048576 " MiB" : b / 1024 " KiB" }
    /^# loom p2p_perf:/ {
      sched = $4; sub(/,$/, "", sched)
      mode = $0 ~ /graph replay/ ? "replayed" : "eager"
      row = sched " | " mode; rows[++n] = row; next
    }
    /^ +[0-9]+ / {
      if (!($1 in col)) { col[$1] = 1; sizes[++m] = $1 }
      bw[row, $1] = sprintf("%.3g", $6)
    }
    END {
      printf "| schedule | steps |"; for (j = 1; j <= m; ++j) printf " %s |", label(sizes[j]); printf "\n"
      printf "|---|---|"; for (j = 1; j <= m; ++j) printf "---|"; printf "\n"
      for (i = 1; i <= n; ++i) {
        printf "| %s |", rows[i]
        for (j = 1; j <= m; ++j) printf " %s |", (rows[i] SUBSEP sizes[j]) in bw ? bw[rows[i], sizes[j]] : "–"
        printf "\n"
      }
    }' "$dir/p2p.txt"
  echo
fi

# The measured steps of one run in mesh.txt (for the awk programs below, which set `run` while
# inside a run and print medians): step time (ms), reductions, the part after the pipeline, hidden.
steps_awk='
  function median(a, n,   i, j, t) {
    for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j - 1] > a[j]; --j) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  run && /^ +step [0-9.]+ s,/ { st[n + 1] = 1e3 * $2 }
  run && /dp gradient reductions/ {
    ++n; red[n] = $4; ex[n] = $9
    h = $0; sub(/% hidden.*/, "", h); sub(/.*-> /, "", h); hid[n] = h
  }'

# The mesh: scripts/gpu-check.sh's mesh phase (cuda_mlp_gpu --dp 2 --measure), the median over a
# run's steps of the step time, the data-parallel reductions' time (all ranks' buckets summed),
# the part of it after the pipeline's work, and the fraction hidden.
if [ -f "$dir/mesh.txt" ]; then
  echo "| schedule | samples per microbatch | reductions | step ms | reductions ms | after the pipeline ms | hidden |"
  echo "|---|---|---|---|---|---|---|"
  awk '
    function flush() {
      if (!run) return
      printf "| %s | %s | %s | %.1f | %.2f | %.2f | %.0f %% |\n", sched, samples, mode, median(st, n), median(red, n), median(ex, n), median(hid, n)
      run = 0
    }
    /^# (zero-stage|--local-steps)/ { flush(); next }
    /^# .* dp2 x pp2/ {
      flush(); run = 1; n = 0; sched = $2
      for (i = 1; i <= NF; ++i) if ($i == "samples") samples = $(i - 1)
      mode = $0 ~ /--sync-after-step/ ? "after the step" : "eager"
      next
    }
    END { flush() }'"$steps_awk" "$dir/mesh.txt"
  echo
  # ZeRO and Local SGD against the CPU reference (the mesh phase's correctness runs), if recorded.
  if grep -qE "^# (zero-stage [0-9] adam|--local-steps)" "$dir/mesh.txt"; then
    echo "| run (cuda_mlp_gpu, dp2 x pp2, cuda_local) | mode | parameter elements rank 0 holds (its stages have) | against the reference |"
    echo "|---|---|---|---|"
    awk '
      /^# / { run = 0 }
      /^# (zero-stage [0-9] adam|--local-steps)/ {
        run = 1; held = "–"; mode = $0 ~ /--deterministic/ ? "deterministic" : "default"
        what = $0; sub(/^# /, "", what); sub(/ dp2 x pp2.*/, "", what); sub(/ --deterministic/, "", what)
        next
      }
      run && /^ZeRO stage/ { held = $7 " (" $17 ")" }
      run && /^reference check/ {
        v = $0; sub(/.*max relative difference params /, "", v); sub(/,.*/, "", v)
        printf "| %s | %s | %s | params within %s, %s |\n", what, mode, held, v, $NF
      }' "$dir/mesh.txt"
    echo
  fi
  # What ZeRO costs in a measured step (eager reductions), if recorded.
  if grep -qE "^# zero-stage [0-9] [a-z0-9-]+ dp2 x pp2, width" "$dir/mesh.txt"; then
    echo "| ZeRO stage | step ms | reductions ms | after the pipeline ms | hidden | rank 0 holds (elements) |"
    echo "|---|---|---|---|---|---|"
    awk '
      function flush() {
        if (!run) return
        printf "| %s | %.1f | %.2f | %.2f | %.0f %% | %s |\n", z, median(st, n), median(red, n), median(ex, n), median(hid, n), held
        run = 0
      }
      /^# / { flush() }
      /^# zero-stage [0-9] [a-z0-9-]+ dp2 x pp2, width/ { run = 1; n = 0; z = $3; held = "–"; next }
      run && /^ZeRO stage/ { held = $7 }
      END { flush() }'"$steps_awk" "$dir/mesh.txt"
    echo
  fi

  # The transformer and the MoE model of examples/03_mesh on device kernels (mesh_gpu), if recorded:
  # rank 0's predicted device memory (between steps, and the peak within them), the fp32 run
  # against the double reference, and against the host fp32 reference.
  if grep -q "^# mesh_gpu " "$dir/mesh.txt"; then
    echo "| mesh_gpu run (cuda_local, 3 steps) | rank 0 device bytes predicted (between steps, peak) | fp32 against double (bound) | against the fp32 reference |"
    echo "|---|---|---|---|"
    awk '
      function flush() { if (run) printf "| %s | %s | %s | %s |\n", what, mem, dbl, ref; run = 0 }
      /^# / { flush() }
      /^# mesh_gpu / { run = 1; what = $0; sub(/^# mesh_gpu --backend cuda_local /, "", what); mem = "–"; dbl = "–"; ref = "–"; next }
      run && /^device memory between steps:/ { mem = $7 ", " $NF }
      run && /against the double-precision reference:/ {
        v = $0; sub(/.*largest parameter difference /, "", v); sub(/ .*/, "", v)
        b = $0; sub(/.*\(bound /, "", b); sub(/\).*/, "", b)
        dbl = v " (" b ") " $NF
      }
      run && /^reference check/ { t = $0; sub(/^reference check \(/, "", t); sub(/\).*/, "", t); ref = t ": " $NF }
      END { flush() }' "$dir/mesh.txt"
    echo
  fi
fi
