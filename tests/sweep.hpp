// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

// Rotating samples of the long sweeps (every family x every seed). The default ctest run takes
// `sample` consecutive seeds of the sweep's range, starting at an offset that changes every day,
// and prints them with the base seed, so that a failure reproduces with LOOM_SWEEP_SEED=<base>.
// LOOM_SWEEP=full runs every seed: the ctest label `full` runs the sweeps that way (before an
// issue is resolved; `ctest --test-dir build -L full`).

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace loom_test {

//! Whether LOOM_SWEEP=full asks for every case of every sweep.
inline bool full_sweep() {
  const char* v = std::getenv("LOOM_SWEEP");
  return v != nullptr && std::string_view(v) == "full";
}

//! The base of the rotation: LOOM_SWEEP_SEED if set (a non-negative integer), else the day.
inline std::uint64_t sweep_base() {
  if (const char* v = std::getenv("LOOM_SWEEP_SEED"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long b = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0') return b;
    std::cerr << "LOOM_SWEEP_SEED=" << v << " is not a non-negative integer; using the day\n";
  }
  return static_cast<std::uint64_t>(std::time(nullptr) / 86400);
}

//! The seeds `first..last` of the sweep `what` to run: all of them under LOOM_SWEEP=full, else
//! `sample` consecutive ones (cyclically) from an offset given by the base. Prints the choice.
inline std::vector<int> sweep_seeds(std::string_view what, int first, int last, int sample) {
  const int n = last - first + 1;
  std::vector<int> seeds;
  if (n <= 0) return seeds;
  const bool full = full_sweep() || sample >= n;
  const std::uint64_t base = sweep_base();
  const int k = full ? n : (sample < 1 ? 1 : sample);
  const int start = full ? 0 : static_cast<int>(base % static_cast<std::uint64_t>(n));
  for (int i = 0; i < k; ++i) seeds.push_back(first + (start + i) % n);
  std::string list;
  for (int s : seeds) list += (list.empty() ? "" : " ") + std::to_string(s);
  if (full)
    std::cout << "sweep '" << what << "': every seed " << first << ".." << last << "\n";
  else
    std::cout << "sweep '" << what << "': seeds " << list << " of " << first << ".." << last << " (LOOM_SWEEP_SEED=" << base
              << " reproduces; LOOM_SWEEP=full runs every seed)\n";
  return seeds;
}

}  // namespace loom_test
