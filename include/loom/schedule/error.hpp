// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Errors raised by the schedule layer, and the constexpr message helpers that let the same
//! sentence appear in a compile-time diagnostic and in a run-time exception.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "loom/schedule/text.hpp"

namespace loom {

//! A schedule cannot be generated, is malformed, or would deadlock. The message names the rule
//! (and, for validation failures, the rank, the position and the action).
struct schedule_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! A configuration value (a cost, a size, a command-line option) is out of its domain.
struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

//! Decimal text of an integer; constexpr so messages can be built during constant evaluation.
constexpr text to_text(long long v) {
  if (v == 0) return "0";
  bool neg = v < 0;
  unsigned long long u = neg ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  char buf[24]{};
  int n = 0;
  while (u != 0) {
    buf[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  }
  text s;
  if (neg) s.push_back('-');
  while (n > 0) s.push_back(buf[--n]);
  return s;
}

//! True for a finite `v` (neither NaN nor an infinity); constexpr, unlike `std::isfinite` in C++20.
constexpr bool finite(double v) { return v - v == 0; }

//! Text of a real number for messages: `nan`, `inf`, `-inf`, up to 6 decimals without trailing
//! zeros below 1e12 (`0.5`, `3`, `-2.25`), else `d.dddddde+N`; small non-zero values as `d.dddddde-N`.
constexpr text real_text(double v) {
  if (v != v) return "nan";
  if (!finite(v)) return v < 0 ? "-inf" : "inf";
  text out;
  if (v < 0) {
    out.push_back('-');
    v = -v;
  }
  int exp10 = 0;
  if (v >= 1e12) {
    while (v >= 10) {
      v /= 10;
      ++exp10;
    }
  } else if (v != 0 && v < 1e-6) {
    while (v < 1) {
      v *= 10;
      --exp10;
    }
  }
  // v < 1e12 here, so v * 1e6 < 1e18 fits in a long long.
  auto scaled = static_cast<long long>(v * 1e6 + 0.5);
  long long whole = scaled / 1000000, frac = scaled % 1000000;
  out += to_text(whole);
  if (frac != 0) {
    char digits[6]{};
    for (int i = 5; i >= 0; --i, frac /= 10) digits[i] = static_cast<char>('0' + frac % 10);
    int n = 6;
    while (digits[n - 1] == '0') --n;
    out.push_back('.');
    out += std::string_view(digits, static_cast<std::size_t>(n));
  }
  if (exp10 != 0) out += (exp10 > 0 ? "e+" : "e-") + to_text(exp10 > 0 ? exp10 : -exp10);
  return out;
}

//! Fixed-capacity, structural copy of a message: usable as a template argument, so that a
//! rule violated by a static shape is printed verbatim by the compiler.
struct fixed_message {
  static constexpr std::size_t capacity = 192;
  char text[capacity]{};

  constexpr fixed_message() = default;
  constexpr explicit fixed_message(std::string_view s) {
    std::size_t n = s.size() < capacity - 1 ? s.size() : capacity - 1;
    for (std::size_t i = 0; i < n; ++i) text[i] = s[i];
  }
  constexpr bool empty() const { return text[0] == '\0'; }
  constexpr std::string_view view() const {
    std::size_t n = 0;
    while (n < capacity && text[n] != '\0') ++n;
    return {text, n};
  }
};

//! A message in an array of exactly its length plus the terminating NUL. As a template argument
//! every compiler prints it whole where a conversion fails (clang elides a `fixed_message`'s
//! text after 32 characters in most diagnostics, and prints its trailing NULs as numbers).
template <std::size_t N>
struct exact_message {
  char text[N]{};
  constexpr exact_message() = default;
  constexpr explicit exact_message(std::string_view s) {
    for (std::size_t i = 0; i < s.size() && i + 1 < N; ++i) text[i] = s[i];
  }
};

//! `Message` as an `exact_message`.
template <fixed_message Message>
inline constexpr exact_message<Message.view().size() + 1> exact_of{Message.view()};

//! A type that carries a message.
template <auto Message>
struct message_text {};

//! Callable only with the empty message: a call with another one fails to compile with the
//! whole message in the diagnostic, under GCC ("could not convert 'message_text<exact_message<N>
//! {"..."}>'") and clang ("no known conversion from 'message_text<exact_message<N>{"..."}>'").
constexpr bool no_message(message_text<exact_message<1>{}>) { return true; }

//! Instantiated with a non-empty message, fails with that message visible in the diagnostic
//! ("In instantiation of 'schedule_rule_violated<fixed_message{"..."}>'", and whole in
//! 'message_text<exact_message<N>{"..."}>').
template <fixed_message Rule>
struct schedule_rule_violated {
  static_assert(no_message(message_text<exact_of<Rule>>{}),
                "loom: this static schedule shape breaks a rule of its family; the rule is the "
                "text in 'message_text<exact_message<N>{\"...\"}>' above");
};

}  // namespace detail
}  // namespace loom
