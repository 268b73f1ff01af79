// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Deterministic test values shared by the test suites that run on several backends: every rank
//! computes the same value for the same (seed, index) without communicating.

#include <cstdint>

namespace suite_values {

//! A value in [-1, 1) from a seed and an index (splitmix64), the same on every rank.
inline double value(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

}  // namespace suite_values
