// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints the table of loom's size limits in docs/fuzzing.md (ctest checks that the document shows
// these rows verbatim): the library-wide limits, then each built-in family's own smaller ones.
#include <cstdio>
#include <tuple>

#include <loom/schedule.hpp>

int main() {
  std::printf("| limit | value | what it bounds |\n|---|---|---|\n");
  std::printf("| `loom::max_ranks` | %d | ranks, every family (lowering and validation keep P x P tables) |\n", loom::max_ranks);
  std::printf("| `loom::max_shape_cells` | %lld | ranks x microbatches x chunks, every family (the CLI's cap) |\n",
              loom::max_shape_cells);
  std::printf("| `loom::max_actions` | %lld | actions of a generated or lowered schedule, and so of one rank |\n",
              loom::max_actions);
  std::apply(
      [](auto... f) {
        auto row = [](auto fam) {
          using F = decltype(fam);
          if (loom::max_ranks_v<F> == loom::max_ranks && loom::max_cells_v<F> == loom::max_shape_cells) return;
          std::printf("| `%.*s` | ranks <= %d, ranks x microbatches x chunks <= %lld | its own (its header says why) |\n",
                      static_cast<int>(F::name.size()), F::name.data(), loom::max_ranks_v<F>, loom::max_cells_v<F>);
        };
        (row(f), ...);
      },
      loom::builtin_families{});
}
