// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A family written by a user plugs into generate, validate, lower, simulate, static schedules
// and the registry exactly like a built-in one.
#include <doctest/doctest.h>

#include <loom/schedule.hpp>

#include <string>

namespace {

// "Eager 1F1B": every rank warms up with as many forwards as memory `cap` allows.
struct eager_1f1b {
  static constexpr std::string_view name = "eager-1f1b";
  static constexpr std::string_view summary = "1F1B with a fixed warm-up of `cap` forwards (test family)";
  int cap = 2;
  constexpr loom::text check(loom::shape s) const {
    if (auto e = loom::detail::check_basic(name, s, 1); !e.empty()) return e;
    if (cap < s.ranks - 1) return "eager-1f1b needs cap >= ranks-1";
    return {};
  }
  constexpr loom::schedule generate(loom::shape s) const {
    auto out = loom::make_schedule(name, s, s.ranks, loom::placement_kind::loop);
    for (int r = 0; r < s.ranks; ++r) {
      auto& p = out.programs[static_cast<std::size_t>(r)];
      int nf = 0;
      for (; nf < cap && nf < s.microbatches; ++nf) p.push_back(loom::forward(nf, r));
      for (int i = 0; i < s.microbatches; ++i) {
        if (nf < s.microbatches) p.push_back(loom::forward(nf++, r));
        p.push_back(loom::backward(i, r));
      }
    }
    return out;
  }
};
static_assert(loom::schedule_family<eager_1f1b>);
static_assert(loom::static_schedule<eager_1f1b, loom::shape{.ranks = 3, .microbatches = 6}>::metrics<>.valid);
static_assert(loom::static_schedule<eager_1f1b, loom::shape{.ranks = 3, .microbatches = 6}>::metrics<>.peak_activation == 3);

}  // namespace

TEST_CASE("a user family is generated, validated, lowered and simulated like a built-in one") {
  auto s = loom::generate(eager_1f1b{.cap = 4}, {.ranks = 4, .microbatches = 8});
  CHECK(loom::validate(loom::lower(s)).ok);
  auto sim = loom::simulate(s);
  CHECK(sim.ok);
  CHECK(sim.max_peak_activation() == 5);  // cap + 1 live forwards
  CHECK_THROWS_WITH_AS(loom::generate(eager_1f1b{.cap = 1}, {.ranks = 4, .microbatches = 8}), "eager-1f1b needs cap >= ranks-1", loom::schedule_error);
}

TEST_CASE("a user family can be registered under a name and found by it") {
  loom::registry reg = loom::builtin_registry();
  reg.add<eager_1f1b>();
  auto const& e = reg.at("eager-1f1b");
  CHECK(e.summary == eager_1f1b::summary);
  CHECK(loom::validate(e.make({.ranks = 3, .microbatches = 5})).ok);
  CHECK_THROWS_WITH_AS(reg.at("nope"), doctest::Contains("unknown schedule 'nope' (known: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2"), loom::schedule_error);
}

TEST_CASE("a broken user family is caught by the validator, not trusted") {
  struct broken : eager_1f1b {
    constexpr loom::schedule generate(loom::shape s) const {
      auto out = eager_1f1b::generate(s);
      out.programs[0].pop_back();  // forgets a backward
      return out;
    }
  };
  auto v = loom::validate(loom::generate(broken{}, {.ranks = 2, .microbatches = 2}));
  CHECK_FALSE(v.ok);
  CHECK(v.message.find("has no backward") != std::string::npos);
}
