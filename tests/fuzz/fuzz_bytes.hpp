// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Reads typed values from a fuzzer's bytes, biased towards the values that break code: each
//! integer or real is either one of a list of edge cases (0, -1, limits, NaN, inf, ...) or taken
//! raw from the next bytes. Past the end every read gives 0.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

namespace loom_fuzz {

//! A cursor over the fuzzer's input.
class bytes {
 public:
  bytes(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

  //! The next byte (0 past the end).
  std::uint8_t byte() { return n_ ? (--n_, *p_++) : 0; }
  //! `size` raw bytes as an integral or floating type.
  template <class T>
  T raw() {
    unsigned char buf[sizeof(T)]{};
    for (auto& b : buf) b = byte();
    T v;
    std::memcpy(&v, buf, sizeof(T));
    return v;
  }
  //! An index in [0, n).
  std::size_t pick(std::size_t n) { return n ? byte() % n : 0; }
  //! A size-like integer: mostly small, else an edge case or raw.
  int size_like() {
    static constexpr int edges[] = {0, -1, 1, 2, 3, 7, 8, 64, 256, 1023, 1024, 1025, 4096, 16384, 65536, 1 << 20,
                                    (1 << 20) + 1, 1 << 24, 1 << 30, std::numeric_limits<int>::max(),
                                    std::numeric_limits<int>::min(), -65536};
    std::uint8_t mode = byte();
    if (mode < 160) return mode % 17;
    if (mode < 240) return edges[pick(std::size(edges))];
    return raw<int>();
  }
  //! A real: mostly a small value, else an edge case (0, -0, negatives, NaN, infinities, huge,
  //! denormal) or raw.
  double real() {
    static constexpr double edges[] = {0.0, -0.0, 0.5, 1.0, 2.0, 3.0, -1.0, -0.5,
                                       std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::max(),
                                       std::numeric_limits<double>::lowest(), std::numeric_limits<double>::denorm_min(),
                                       1e300, 1e-300, 1e12, 1e15};
    std::uint8_t mode = byte();
    if (mode < 128) return (mode % 16) * 0.25;
    if (mode < 240) return edges[pick(std::size(edges))];
    return raw<double>();
  }
  //! The remaining bytes as text.
  std::string_view rest() {
    std::string_view s(reinterpret_cast<const char*>(p_), n_);
    p_ += n_;
    n_ = 0;
    return s;
  }
  //! Up to `max` bytes, up to and excluding the next NUL (consumed), as text.
  std::string_view token(std::size_t max) {
    std::size_t k = 0;
    while (k < n_ && k < max && p_[k] != 0) ++k;
    std::string_view s(reinterpret_cast<const char*>(p_), k);
    std::size_t used = k < n_ && k < max ? k + 1 : k;
    p_ += used;
    n_ -= used;
    return s;
  }
  bool empty() const { return n_ == 0; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

}  // namespace loom_fuzz
