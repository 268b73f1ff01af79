#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The test command: installs what is missing, then builds and runs the suite through ctest in
# the configurations of the README's table (CMakePresets.json): GCC (default: the whole suite,
# long sweeps as a rotating sample whose seed each prints), clang 19 with libstdc++ (clang: the
# whole build under clang's warnings and constant evaluation, then the compile-time tests),
# clang 19 with libc++ (clang-libcxx: the compile-time tests, examples and packaging) and a short
# run of each libFuzzer target under ASan+UBSan (fuzz). The whole suite under ASan+UBSan is
# LOOM_TEST_PRESETS=asan; the sweeps whole are `ctest --test-dir build -L full`. Arguments go to
# every ctest. Each preset's time is printed as it ends and all of them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
start_all=$SECONDS
bash scripts/bootstrap.sh
echo "loom: bootstrap took $((SECONDS - start_all)) s"
presets=${LOOM_TEST_PRESETS:-default clang clang-libcxx fuzz}
times=()
for p in $presets; do
  start=$SECONDS
  echo "loom: preset $p"
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p"
  built=$((SECONDS - start))
  ctest --preset "$p" "$@"
  times+=("$p: $((SECONDS - start)) s (build $built s, tests $((SECONDS - start - built)) s)")
  echo "loom: preset ${times[-1]}"
done
echo "loom: times"
for t in "${times[@]}"; do echo "  $t"; done
echo "  total: $((SECONDS - start_all)) s"
