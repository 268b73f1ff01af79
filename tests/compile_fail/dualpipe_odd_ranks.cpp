// expect: dualpipe needs an even number of ranks >= 2 \(got 3\)
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// DualPipe pairs rank r with rank P-1-r: a static DualPipe schedule on an odd rank count must not
// compile, and the diagnostic must carry the rule.
#include <loom/schedule.hpp>

int main() {
  loom::static_schedule<loom::dualpipe, loom::shape{.ranks = 3, .microbatches = 8}> s;
  (void)s;
}
