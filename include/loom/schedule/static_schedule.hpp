// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Compile-time schedules: `summarize` condenses a simulation into scalars a `static_assert` can
//! test, and `static_schedule<Family, shape>` generates a schedule during constant evaluation,
//! rejects a shape its family cannot run with the rule in the diagnostic, and exposes each
//! rank's program as a `std::array` constant for a loop specialised at compile time.

#include <array>
#include <concepts>
#include <cstddef>
#include <string>

#include "loom/schedule/family.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/validate.hpp"

namespace loom {

//! Scalar metrics of a schedule under given costs (literal type: returnable from a constant
//! expression). `valid` covers the schedule and its lowering; `bubble_time` and `span_bubble`
//! are the maxima over ranks; `peak_activation` the maximum per-rank peak and
//! `peak_activation_rank0` rank 0's.
struct summary {
  bool valid = false;
  double makespan = 0;
  double bubble_ratio = 0;
  double bubble_rate = 0;
  double bubble_time = 0;
  double span_bubble = 0;
  double peak_activation = 0;
  double peak_activation_rank0 = 0;
  std::size_t actions = 0;
};

//! Validates `s` and its lowering and simulates `s` under `k`.
constexpr summary summarize(const schedule& s, const costs& k = {}) {
  summary out;
  out.valid = validate(s).ok && validate(lower(s)).ok;
  if (!out.valid) return out;
  simulation sim = simulate(s, k);
  out.makespan = sim.makespan;
  out.bubble_ratio = sim.bubble_ratio;
  out.bubble_rate = sim.bubble_rate;
  for (int r = 0; r < s.ranks; ++r) {
    out.bubble_time = sim.bubble_time(r) > out.bubble_time ? sim.bubble_time(r) : out.bubble_time;
    out.span_bubble = sim.span_bubble(r) > out.span_bubble ? sim.span_bubble(r) : out.span_bubble;
  }
  out.peak_activation = sim.max_peak_activation();
  out.peak_activation_rank0 = sim.peak_activation[0];
  out.actions = s.size();
  return out;
}

//! `summarize(generate(f, s), k)`: one call for a `static_assert`.
template <schedule_family F>
constexpr summary summarize(const F& f, shape s, const costs& k = {}) {
  return summarize(generate(f, s), k);
}

//! A schedule whose family and shape are known at compile time. Instantiating it with a shape
//! the family cannot run fails to compile with the family's rule in the diagnostic. Members:
//! `shape_v` (chunks resolved), `ranks`, `stages`, `program<Rank>` (the rank's generated
//! program as `std::array<action, N>`), `lowered_program<Rank>` (with send/recv),
//! `stage_to_rank`, `runtime()` (the same schedule as a `loom::schedule`), and
//! `metrics<costs{...}>` (a `summary`).
template <schedule_family F, shape Shape>
struct static_schedule {
  static_assert(!std::same_as<decltype(F{}.check(Shape)), std::string>,
                "loom: a static_schedule's family must return loom::text from check(), not std::string: "
                "std::string cannot be built during constant evaluation by every compiler (clang with "
                "libstdc++ 12 rejects it)");
  using family = F;  //!< the family type
  static constexpr shape shape_v = resolve<F>(Shape);  //!< the resolved shape
  //! The rule the shape breaks, or empty.
  static constexpr detail::fixed_message rule{detail::check_all(F{}, shape_v)};
  //! True when the family can run the shape.
  static constexpr bool ok = rule.empty();

 private:
  [[no_unique_address]] detail::schedule_rule_violated<rule> check_{};
  static constexpr schedule make() {
    if constexpr (ok) return F{}.generate(shape_v);
    else return schedule{};
  }
  template <bool Lowered, int Rank>
  static constexpr std::size_t count() {
    if constexpr (ok) {
      auto s = make();
      if constexpr (Lowered) s = lower(s);
      return s.programs[static_cast<std::size_t>(Rank)].size();
    } else {
      return 0;
    }
  }
  template <bool Lowered, int Rank>
  static constexpr auto materialise() {
    std::array<action, count<Lowered, Rank>()> out{};
    if constexpr (ok) {
      auto s = make();
      if constexpr (Lowered) s = lower(s);
      auto const& p = s.programs[static_cast<std::size_t>(Rank)];
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
    }
    return out;
  }
  static constexpr int stage_count() { return ok ? make().stages : 0; }

 public:
  static constexpr int ranks = shape_v.ranks;        //!< P
  static constexpr int stages = stage_count();       //!< S
  //! Rank `Rank`'s program as generated (compute actions only).
  template <int Rank>
    requires(Rank >= 0 && Rank < shape_v.ranks)
  static constexpr auto program = materialise<false, Rank>();
  //! Rank `Rank`'s lowered program (compute plus send/recv).
  template <int Rank>
    requires(Rank >= 0 && Rank < shape_v.ranks)
  static constexpr auto lowered_program = materialise<true, Rank>();
  //! The same schedule, generated at run time.
  static schedule runtime() { return make(); }
  //! Metrics under costs `K`.
  template <costs K = costs{}>
  static constexpr summary metrics = ok ? summarize(make(), K) : summary{};
};

}  // namespace loom
