// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Name -> family lookup for run-time use (the CLI, tests that range over every family).
//! Built-in families are listed in `builtin_families`; users add their own with
//! `registry::add<MyFamily>()` (or `default_registry().add<...>()` to make them visible to
//! every consumer of the default registry, such as the `loom` CLI built with them).

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/schedule/bitpipe.hpp"
#include "loom/schedule/chimera.hpp"
#include "loom/schedule/gpipe_2bp.hpp"
#include "loom/schedule/hanayo.hpp"
#include "loom/schedule/looped_bfs.hpp"
#include "loom/schedule/one_f_one_b_2bp.hpp"
#include "loom/schedule/dualpipe.hpp"
#include "loom/schedule/dualpipe_v.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/gpipe.hpp"
#include "loom/schedule/interleaved_1f1b.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/zb_h1.hpp"
#include "loom/schedule/zb_auto.hpp"
#include "loom/schedule/zb_h2.hpp"
#include "loom/schedule/v_half.hpp"
#include "loom/schedule/v_min.hpp"
#include "loom/schedule/zb_v.hpp"

namespace loom {

//! The built-in schedule families, in the order `loom list` prints them.
using builtin_families = std::tuple<gpipe, one_f_one_b, interleaved_1f1b, zb_h1, zb_h2, dualpipe, dualpipe_v, chimera, bitpipe, hanayo, looped_bfs, gpipe_2bp, one_f_one_b_2bp, zb_auto, zb_v, v_half, v_min>;

//! A type-erased family: what the registry stores.
struct family_entry {
  text name;                                       //!< CLI name
  text summary;                                    //!< one line: what it is, paper
  int default_chunks = 1;                          //!< natural chunks per rank
  std::function<text(shape)> check;                //!< rule (size limits included) broken by a resolved shape, or ""
  bool cost_aware = false;                         //!< uses `generate_options` (auto-schedulers)
  std::function<schedule(shape, const generate_options&)> generate;  //!< schedule for a resolved shape

  //! `s` with chunks defaulted.
  shape resolve(shape s) const {
    if (s.chunks == 0) s.chunks = default_chunks;
    return s;
  }
  //! Checks then generates; throws `schedule_error` naming the rule.
  schedule make(shape s, const generate_options& o = {}) const {
    s = resolve(s);
    if (text rule = check(s); !rule.empty()) throw schedule_error(rule);
    return generate(s, o);
  }
};

//! Type-erases family `F`.
template <schedule_family F>
family_entry make_entry() {
  family_entry e;
  e.name = text(F::name);
  if constexpr (requires { F::summary; }) e.summary = text(F::summary);
  e.default_chunks = default_chunks_v<F>;
  e.check = [](shape s) { return detail::check_all(F{}, s); };
  e.cost_aware = cost_aware_family<F>;
  e.generate = [](shape s, const generate_options& o) { return loom::generate(F{}, s, o); };
  return e;
}

//! An ordered set of named families.
class registry {
 public:
  //! Adds (or replaces, by name) a type-erased family.
  registry& add(family_entry e) {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](auto const& x) { return x.name == e.name; });
    if (it != entries_.end()) *it = std::move(e);
    else entries_.push_back(std::move(e));
    return *this;
  }
  //! Adds family `F` under `F::name`.
  template <schedule_family F>
  registry& add() {
    return add(make_entry<F>());
  }
  //! The entry called `name`, or nullptr. Not on a temporary registry (it would dangle).
  const family_entry* find(std::string_view name) const& {
    for (auto const& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  //! The entry called `name`; throws `schedule_error` listing the known names otherwise.
  const family_entry& at(std::string_view name) const& {
    if (auto const* e = find(name)) return *e;
    text known;
    for (auto const& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
    throw schedule_error("unknown schedule '" + text(name) + "' (known: " + known + ")");
  }
  //! All entries in insertion order.
  const std::vector<family_entry>& entries() const& { return entries_; }
  //! All entries, moved out of a temporary registry (safe in range-for over a temporary).
  std::vector<family_entry> entries() && { return std::move(entries_); }
  const family_entry* find(std::string_view) && = delete;
  const family_entry& at(std::string_view) && = delete;

 private:
  std::vector<family_entry> entries_;
};

//! A registry holding every family of the tuple `Families`: by default every built-in family.
//! Templates, these two, so that a translation unit that never builds a registry does not
//! instantiate every family's type-erased entry (a third of what including loom cost with GCC;
//! docs/include-cost.md). They are called as before: `builtin_registry()`, `default_registry()`.
template <class Families = builtin_families>
registry builtin_registry() {
  registry r;
  std::apply([&](auto... f) { (r.add<decltype(f)>(), ...); }, Families{});
  return r;
}

//! The process-wide registry: the built-ins plus whatever the program added (one registry; the
//! template parameter only defers its instantiation to the first use, see above).
template <class = void>
registry& default_registry() {
  static registry r = builtin_registry();
  return r;
}

}  // namespace loom
