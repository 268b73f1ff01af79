#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Installs what loom's build, tests, tools and benchmarks need from Debian packages, when missing.
set -euo pipefail
pkgs=(cmake ninja-build g++ doctest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev
      libopenmpi-dev openmpi-bin
      # clang presets (clang, clang-libcxx, asan, fuzz): the compiler, libc++ and libc++abi, and
      # the sanitizer and libFuzzer runtimes
      clang-19 libc++-19-dev libc++abi-19-dev libclang-rt-19-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "loom: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
