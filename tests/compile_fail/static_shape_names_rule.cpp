// expect: gpipe runs exactly 1 chunk\(s\) per rank \(got chunks=2\)
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static schedule whose shape its family cannot run must not compile, and the diagnostic
// must carry the family's rule.
#include <loom/schedule.hpp>

int main() {
  loom::static_schedule<loom::gpipe, loom::shape{.ranks = 4, .microbatches = 8, .chunks = 2}> s;
  (void)s;
}
