#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The cost of including <loom/loom.hpp> (docs/include-cost.md): compiles loom_tu.cpp (all of
# loom) and std_tu.cpp (only the standard headers loom includes) with each compiler at -O2 and
# prints, per compiler, the best of N runs of CPU time (user + sys) and the peak memory, and
# the size of the preprocessed TU. Usage: bash bench/include_cost/measure.sh [N]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-5}
here=bench/include_cost
# The standard headers of std_tu.cpp must be exactly those loom's headers include (less <mpi.h>).
want=$(grep -rhoE '#include <[a-z_]+>' include/loom | sort -u)
have=$(grep -hoE '#include <[a-z_]+>' $here/std_tu.cpp | sort -u)
if [ "$want" != "$have" ]; then
  echo "std_tu.cpp is out of date; loom includes:" >&2
  echo "$want" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| compiler | translation unit | CPU time (s, best of $n) | peak memory (MiB) | preprocessed lines |"
echo "|---|---|---|---|---|"
for cxx in "g++" "clang++-19" "clang++-19 -stdlib=libc++"; do
  for tu in std_tu loom_tu; do
    best="" mem=""
    for _ in $(seq "$n"); do
      /usr/bin/time -f "%U %S %M" -o "$out/t" $cxx -std=c++20 -O2 -Iinclude -c $here/$tu.cpp -o "$out/o.o"
      read -r u s m < "$out/t"
      t=$(awk "BEGIN { print $u + $s }")
      if [ -z "$best" ] || awk "BEGIN { exit !($t < $best) }"; then best=$t mem=$m; fi
    done
    lines=$($cxx -std=c++20 -Iinclude -E $here/$tu.cpp | wc -l)
    label=$([ $tu = loom_tu ] && echo '`#include <loom/loom.hpp>`' || echo 'the std headers loom uses')
    printf '| `%s -O2` | %s | %.2f | %d | %d |\n' "$cxx" "$label" "$best" $((mem / 1024)) "$lines"
  done
done
