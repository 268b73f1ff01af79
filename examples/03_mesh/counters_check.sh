#!/bin/sh
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The per-dimension counters of the mesh example on device kernels equal the threads backend's for
# the same configuration: every (dimension, operation) row has the same calls; its bytes are in
# proportion to the element size (fp32 on the device, double on threads: half), except the
# pipeline's own reductions of the step (losses, timings, agreement: host doubles on every
# backend), the all_reduce rows of pp and world, which are equal.
#   counters_check.sh MESH BACKEND ARGS...
set -e
mesh=$1
backend=$2
shift 2
"$mesh" "$@" > threads.$$ 2>&1 || { cat threads.$$; rm -f threads.$$; exit 1; }
"$mesh" --backend "$backend" "$@" > device.$$ 2>&1 || { cat device.$$; rm -f threads.$$ device.$$; exit 1; }
grep '^| [a-z]' threads.$$ | grep -v '^| dimension' > t.$$ || true
grep '^| [a-z]' device.$$ | grep -v '^| dimension' > d.$$ || true
rm -f threads.$$ device.$$
status=0
awk -F'|' -v dev=d.$$ '
  function trim(s) { gsub(/^ +| +$/, "", s); return s }
  BEGIN { while ((getline line < dev) > 0) { split(line, f, "|"); k = trim(f[2]) "/" trim(f[3]) "#" (++seen[trim(f[2]) "/" trim(f[3])]); calls[k] = trim(f[4]); bytes[k] = trim(f[5]); nd++ } }
  { k0 = trim($2) "/" trim($3); k = k0 "#" (++tseen[k0]); nt++
    if (!(k in calls)) { print "only on threads: " $0; bad = 1; next }
    host = trim($3) == "all_reduce" && (trim($2) == "pp" || trim($2) == "world")
    want = host ? trim($5) : trim($5) / 2
    if (calls[k] != trim($4) || bytes[k] != want) { print "differs: threads " $0 " device calls " calls[k] " bytes " bytes[k]; bad = 1 } }
  END { if (nt != nd) { print "threads has " nt " rows, the device " nd; bad = 1 }
        if (nt == 0) { print "no counters printed"; bad = 1 }
        if (!bad) print nt " rows equal (bytes in proportion to the element size)"; exit bad }' t.$$ || status=1
rm -f t.$$ d.$$
exit $status
