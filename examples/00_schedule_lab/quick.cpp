// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The README's opening example (tests/readme_example.cmake checks that the README shows this
// program's real output).
#include <cstdio>
#include <loom/render.hpp>
#include <loom/schedule.hpp>

// Checked while compiling: ZB-H1 on 4 ranks x 8 microbatches is valid and deadlock-free after
// lowering, its bubble is (p-1)(f+b-w) = 3, and it keeps 1F1B's memory (4 activations).
constexpr auto zb = loom::summarize(loom::zb_h1{}, {.ranks = 4, .microbatches = 8});
static_assert(zb.valid && zb.bubble_time == 3 && zb.peak_activation == 4);

int main() {
  // The same engine at run time, for a shape known only now.
  auto s = loom::generate(loom::zb_h1{}, {.ranks = 4, .microbatches = 8});
  loom::require_valid(loom::lower(s));  // sends/receives inserted, FIFO replay proves no deadlock
  auto sim = loom::simulate(s, {.f = 1, .b = 1, .w = 1});
  std::puts(loom::render_ascii(s, sim).c_str());
}
