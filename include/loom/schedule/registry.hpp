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
#include "loom/schedule/group_interleaved_1f1b.hpp"
#include "loom/schedule/interleaved_1f1b.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/pipedream.hpp"
#include "loom/schedule/zb_h1.hpp"
#include "loom/schedule/zb_auto.hpp"
#include "loom/schedule/zb_h2.hpp"
#include "loom/schedule/v_half.hpp"
#include "loom/schedule/v_min.hpp"
#include "loom/schedule/vocab.hpp"
#include "loom/schedule/zb_v.hpp"

namespace loom {

//! The built-in schedule families, in the order `loom list` prints them: the synchronous ones,
//! the vocabulary-parallel ones (`family_entry::vocab`), then the asynchronous ones
//! (`multi_step_family`, `family_entry::multi_step`).
using builtin_families = std::tuple<gpipe, one_f_one_b, interleaved_1f1b, zb_h1, zb_h2, dualpipe, dualpipe_v, chimera, bitpipe, hanayo, looped_bfs, gpipe_2bp, one_f_one_b_2bp, zb_auto, zb_v, v_half, v_min,
                                    group_interleaved_1f1b, one_f_one_b_vocab_1, one_f_one_b_vocab_2, v_half_vocab_1, v_half_vocab_2, pipedream,
                                    pipedream_vertical_sync, pipedream_2bw, pipelined_backprop>;

//! Other names of built-in families (`registry::alias`): `pipedream-flush` is 1F1B (the name the
//! PipeDream-2BW paper, ICML 2021 §3.2, gives it).
inline constexpr std::pair<std::string_view, std::string_view> builtin_aliases[] = {{"pipedream-flush", "1f1b"}};

//! A type-erased family: what the registry stores.
struct family_entry {
  text name;                                       //!< CLI name
  text summary;                                    //!< one line: what it is, paper
  int default_chunks = 1;                          //!< natural chunks per rank
  std::function<text(shape)> check;                //!< rule (size limits included) broken by a resolved shape, or ""
  bool cost_aware = false;                         //!< uses `generate_options` (auto-schedulers)
  //! An asynchronous family: one schedule spans `shape::steps` steps without a flush, with weight
  //! versions (`schedule::versioned`); its training rule differs from synchronous SGD.
  bool multi_step = false;
  //! A grouped family (`grouped_family`): it reads `shape::group`; the others refuse a nonzero one.
  bool grouped = false;
  //! A vocabulary-parallel family (`schedule::vocab` != 0; docs/vocab.md): its programs run the
  //! passes `S`, `T`, `IF`, `IB`, and `loom::pipeline` runs them with a rank's vocabulary layers
  //! (`loom::vocab_layers`) besides its stages.
  bool vocab = false;
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
  e.multi_step = multi_step_family<F>;
  e.grouped = grouped_family<F>;
  if constexpr (requires { F::vocab_algorithm; }) e.vocab = F::vocab_algorithm != 0;
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
  //! Makes `name` another name of the family `target` (already added): `find(name)` and
  //! `at(name)` return `target`'s entry, which `entries()` lists once. Throws `schedule_error`
  //! when `target` is unknown or `name` is already a family's name.
  registry& alias(std::string_view name, std::string_view target) {
    if (find(target) == nullptr) throw schedule_error("alias '" + text(name) + "' names unknown schedule '" + text(target) + "'");
    for (auto const& e : entries_)
      if (e.name == name) throw schedule_error("alias '" + text(name) + "' is already a schedule's name");
    for (auto& a : aliases_)
      if (a.first == name) {
        a.second = text(target);
        return *this;
      }
    aliases_.emplace_back(text(name), text(target));
    return *this;
  }
  //! The aliases, as (name, target) pairs in the order they were added.
  const std::vector<std::pair<text, text>>& aliases() const& { return aliases_; }
  //! The entry called `name` (or aliased `name`), or nullptr. Not on a temporary registry (it
  //! would dangle).
  const family_entry* find(std::string_view name) const& {
    for (auto const& e : entries_)
      if (e.name == name) return &e;
    for (auto const& a : aliases_)
      if (a.first == name) return find(a.second);
    return nullptr;
  }
  //! The entry called `name`; throws `schedule_error` listing the known names otherwise.
  const family_entry& at(std::string_view name) const& {
    if (auto const* e = find(name)) return *e;
    text known;
    for (auto const& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
    for (auto const& a : aliases_) known += ", " + a.first;
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
  std::vector<std::pair<text, text>> aliases_;
};

//! A registry holding every family of the tuple `Families`: by default every built-in family.
//! Templates, these two, so that a translation unit that never builds a registry does not
//! instantiate every family's type-erased entry (a third of what including loom cost with GCC;
//! docs/include-cost.md). They are called as before: `builtin_registry()`, `default_registry()`.
template <class Families = builtin_families>
registry builtin_registry() {
  registry r;
  std::apply([&](auto... f) { (r.add<decltype(f)>(), ...); }, Families{});
  for (auto const& [name, target] : builtin_aliases)
    if (r.find(target) != nullptr) r.alias(name, target);
  return r;
}

#if defined(LOOM_EXTERN_REGISTRY)
//! With `LOOM_EXTERN_REGISTRY` defined, a translation unit does not instantiate the built-in
//! registry (the bulk of a registry user's compile time: 7.6 s against 1.2 s of CPU at `-O2`
//! with g++ 12, docs/include-cost.md); exactly one translation unit of the program then defines it
//! with `template loom::registry loom::builtin_registry<loom::builtin_families>();` (loom's own
//! build: src/registry/builtin.cpp).
extern template registry builtin_registry<builtin_families>();
#endif

//! The process-wide registry: the built-ins plus whatever the program added (one registry; the
//! template parameter only defers its instantiation to the first use, see above).
template <class = void>
registry& default_registry() {
  static registry r = builtin_registry();
  return r;
}

}  // namespace loom
