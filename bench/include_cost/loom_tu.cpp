// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A translation unit that includes all of loom (bench/include_cost/measure.sh).
#include <loom/loom.hpp>

int main() { return 0; }
