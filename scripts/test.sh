#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The test command: installs what is missing, then builds and runs the suite through ctest in
# the configurations of the README's table (CMakePresets.json): GCC (default), clang 19 with
# libstdc++ (clang), clang 19 with libc++ (clang-libcxx: the compile-time tests, examples and
# packaging) and a short run of each libFuzzer target under ASan+UBSan (fuzz). The whole suite
# under ASan+UBSan is LOOM_TEST_PRESETS=asan. Arguments go to every ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
presets=${LOOM_TEST_PRESETS:-default clang clang-libcxx fuzz}
for p in $presets; do
  start=$SECONDS
  echo "loom: preset $p"
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p"
  ctest --preset "$p" "$@"
  echo "loom: preset $p took $((SECONDS - start)) s"
done
