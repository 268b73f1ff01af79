// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::text`: the owning string of the constexpr engine (names, rules, validation and
//! simulation messages). It keeps its characters in a `std::vector<char>`, which every supported
//! compiler and standard library evaluates during constant evaluation; `std::string` is not one
//! of those (clang with libstdc++ 12 rejects its small-string buffer in a constant expression),
//! so nothing that a `static_assert` may evaluate builds a `std::string`. It has the part of
//! `std::string`'s interface that loom uses and converts to and from `std::string` and
//! `std::string_view`, so code outside constant evaluation uses it as a string.

#include <compare>
#include <concepts>
#include <cstddef>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

//! An owning, growable, constexpr string (see the file comment). Its characters are followed
//! by a '\0' whenever it is non-empty, so `c_str()` is free.
class text {
 public:
  using value_type = char;
  using size_type = std::size_t;
  using const_iterator = const char*;
  using iterator = const char*;
  //! As `std::string::npos`.
  static constexpr size_type npos = std::string_view::npos;

  //! Empty.
  constexpr text() = default;
  //! A copy of `s`.
  constexpr text(std::string_view s) { append(s); }
  //! A copy of the NUL-terminated `s`.
  constexpr text(const char* s) : text(std::string_view(s)) {}
  //! A copy of `s`.
  constexpr text(const std::string& s) : text(std::string_view(s)) {}
  //! `n` copies of `c`.
  constexpr text(size_type n, char c) { resize(n, c); }

  //! Number of characters.
  constexpr size_type size() const { return chars_.empty() ? 0 : chars_.size() - 1; }
  //! As `size()`.
  constexpr size_type length() const { return size(); }
  //! True when it holds no character.
  constexpr bool empty() const { return size() == 0; }
  //! The characters, NUL-terminated.
  constexpr const char* c_str() const { return chars_.empty() ? "" : chars_.data(); }
  //! As `c_str()`.
  constexpr const char* data() const { return c_str(); }
  constexpr const char* begin() const { return c_str(); }
  constexpr const char* end() const { return c_str() + size(); }
  //! Character `i` (`i < size()`).
  constexpr char operator[](size_type i) const { return chars_[i]; }
  //! Last character (non-empty only).
  constexpr char back() const { return chars_[size() - 1]; }
  //! The characters as a view (valid until the text changes).
  constexpr std::string_view view() const { return {c_str(), size()}; }
  constexpr operator std::string_view() const { return view(); }
  //! A `std::string` copy, for code outside constant evaluation.
  operator std::string() const { return std::string(view()); }

  //! Removes every character.
  constexpr void clear() { chars_.clear(); }
  //! Room for `n` characters without reallocation.
  constexpr void reserve(size_type n) { chars_.reserve(n + 1); }
  //! Shortens to, or pads with `c` up to, `n` characters.
  constexpr void resize(size_type n, char c = '\0') {
    if (n == 0) return clear();
    if (!chars_.empty()) chars_.pop_back();
    chars_.resize(n, c);
    chars_.push_back('\0');
  }
  //! Removes the last character (non-empty only).
  constexpr void pop_back() {
    // In place (no resize): GCC 13 misreads resize's push_back here as an overflow.
    chars_.pop_back();
    if (chars_.size() == 1) chars_.clear();
    else chars_.back() = '\0';
  }
  //! Appends `c`.
  constexpr void push_back(char c) {
    if (chars_.empty()) chars_.push_back(c);
    else chars_.back() = c;
    chars_.push_back('\0');
  }
  //! Appends `s` (which may view this text itself).
  constexpr text& append(std::string_view s) {
    if (s.empty()) return *this;
    const size_type old = size(), n = old + s.size();
    if (n + 1 > chars_.capacity()) {
      // Build the longer buffer while `s` (possibly a view of the old one) is still alive.
      std::vector<char> grown;
      grown.reserve(n + 1 > 2 * chars_.capacity() ? n + 1 : 2 * chars_.capacity());
      grown.insert(grown.end(), chars_.begin(), chars_.begin() + static_cast<std::ptrdiff_t>(old));
      grown.insert(grown.end(), s.begin(), s.end());
      grown.push_back('\0');
      chars_ = static_cast<std::vector<char>&&>(grown);
      return *this;
    }
    // No reallocation: `s` stays valid while characters are pushed after it.
    if (!chars_.empty()) chars_.pop_back();
    for (size_type i = 0; i < s.size(); ++i) chars_.push_back(s[i]);
    chars_.push_back('\0');
    return *this;
  }
  constexpr text& operator+=(std::string_view s) { return append(s); }
  constexpr text& operator+=(char c) {
    push_back(c);
    return *this;
  }

  //! Position of the first `s` at or after `pos`, or `npos`.
  constexpr size_type find(std::string_view s, size_type pos = 0) const { return view().find(s, pos); }
  //! Position of the first `c` at or after `pos`, or `npos`.
  constexpr size_type find(char c, size_type pos = 0) const { return view().find(c, pos); }
  //! Position of the first character at or after `pos` that is in `chars`, or `npos`.
  constexpr size_type find_first_of(std::string_view chars, size_type pos = 0) const {
    return view().find_first_of(chars, pos);
  }
  //! True when it begins with `s`.
  constexpr bool starts_with(std::string_view s) const { return view().starts_with(s); }
  //! True when it ends with `s`.
  constexpr bool ends_with(std::string_view s) const { return view().ends_with(s); }
  //! The characters `[pos, pos + n)` (clipped to the end).
  constexpr text substr(size_type pos, size_type n = npos) const { return text(view().substr(pos, n)); }

  friend constexpr text operator+(text a, const text& b) { return static_cast<text&&>(a.append(b)); }
  friend constexpr text operator+(text a, std::string_view b) { return static_cast<text&&>(a.append(b)); }
  friend constexpr text operator+(text a, const char* b) { return static_cast<text&&>(a.append(b)); }
  friend constexpr text operator+(text a, char b) { return static_cast<text&&>(a += b); }
  friend constexpr text operator+(std::string_view a, const text& b) { return text(a).append(b); }
  friend constexpr text operator+(const char* a, const text& b) { return text(a).append(b); }
  friend text operator+(const std::string& a, const text& b) { return text(a).append(b); }
  friend text operator+(text a, const std::string& b) { return static_cast<text&&>(a.append(b)); }

  friend constexpr bool operator==(const text& a, const text& b) { return a.view() == b.view(); }
  friend constexpr bool operator==(const text& a, std::string_view b) { return a.view() == b; }
  friend constexpr bool operator==(const text& a, const char* b) { return a.view() == b; }
  friend bool operator==(const text& a, const std::string& b) { return a.view() == b; }
  friend constexpr std::strong_ordering operator<=>(const text& a, const text& b) { return a.view() <=> b.view(); }
  friend constexpr std::strong_ordering operator<=>(const text& a, std::string_view b) { return a.view() <=> b; }
  friend constexpr std::strong_ordering operator<=>(const text& a, const char* b) { return a.view() <=> std::string_view(b); }

  //! Writes the characters to a stream.
  template <class Char, class Traits>
  friend std::basic_ostream<Char, Traits>& operator<<(std::basic_ostream<Char, Traits>& os, const text& t) {
    return os << t.view();
  }

 private:
  std::vector<char> chars_;  // empty, or the characters followed by one '\0'
};

}  // namespace loom
