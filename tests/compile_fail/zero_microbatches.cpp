// expect: zb-h2 needs microbatches >= 1 \(got microbatches=0\)
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#include <loom/schedule.hpp>

constexpr auto metrics = loom::static_schedule<loom::zb_h2, loom::shape{.ranks = 4, .microbatches = 0}>::metrics<>;
int main() { return metrics.valid ? 0 : 1; }
