// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A project that uses loom as a package: generates, validates and simulates a schedule.
#include <cstdio>
#include <loom/schedule.hpp>

int main() {
  auto s = loom::generate(loom::zb_h1{}, {.ranks = 4, .microbatches = 8});
  auto v = loom::validate(loom::lower(s));
  auto sim = loom::simulate(s);
  std::printf("consumer: zb-h1 on 4 ranks x 8 microbatches: %s, bubble time %g\n", v.ok ? "valid" : "INVALID",
              sim.bubble_time(0));
  return v.ok ? 0 : 1;
}
