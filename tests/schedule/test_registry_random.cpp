// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Seeded random sweep over every registered family: random shapes (p 1..24, m 1..80, any
// chunk count), random costs (w = 0, c = 0, an explicit fb, any M_W/M_B) and random memory
// limits. Every case either is rejected with a schedule_error/config_error that names the
// family, or yields a schedule that is valid after lowering, simulates without deadlock and,
// for cost-aware families given a limit, stays within it on every rank. Deterministic: the seed
// is fixed, so a failure names a case that reproduces.
#include <doctest/doctest.h>

#include <random>
#include <string>

#include <loom/schedule.hpp>
#include <loom/schedule/registry.hpp>

TEST_CASE("every registered family either rejects a random case naming itself or schedules it validly within its limit") {
  std::mt19937 rng(20261121);
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  int built = 0, rejected = 0;
  for (int round = 0; round < 100; ++round) {
    for (auto const& e : loom::default_registry().entries()) {
      const loom::shape s{integer(1, 24), integer(1, 80), integer(0, 1) ? 0 : integer(1, 4)};
      const loom::costs k{.f = real(0.1, 3),
                          .b = real(0.1, 3),
                          .w = integer(0, 3) ? real(0, 2) : 0,
                          .c = integer(0, 1) ? real(0, 1) : 0,
                          .fb = integer(0, 2) ? -1 : real(0.5, 6),
                          .mem_w_ratio = real(0, 1)};
      const loom::generate_options o{.cost = k, .mem_limit = integer(0, 2) ? 0 : real(1, 2.5 * s.ranks)};
      INFO(e.name, " p=", s.ranks, " m=", s.microbatches, " chunks=", s.chunks, " f=", k.f, " b=", k.b, " w=", k.w,
           " c=", k.c, " fb=", k.fb, " r=", k.mem_w_ratio, " limit=", o.mem_limit);
      loom::schedule sched;
      try {
        sched = e.make(s, o);
      } catch (const loom::schedule_error& x) {
        ++rejected;
        CHECK(std::string(x.what()).find(e.name) != std::string::npos);
        continue;
      } catch (const loom::config_error& x) {
        ++rejected;
        CHECK(std::string(x.what()).find(e.name) != std::string::npos);
        continue;
      }
      ++built;
      CHECK(loom::validate(loom::lower(sched)).ok);
      const auto sim = loom::simulate(sched, k);
      REQUIRE(sim.ok);
      if (e.cost_aware && o.mem_limit > 0) CHECK(sim.max_peak_activation() <= o.mem_limit + 1e-9);
    }
  }
  // Both outcomes occur, so neither branch is vacuous.
  CHECK(built > 1000);
  CHECK(rejected > 100);
}
