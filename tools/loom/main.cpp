// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The loom command-line program (placeholder: `loom list`).
#include <cstdio>
#include <string_view>
#include <loom/schedule.hpp>

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "list") {
    for (auto const& e : loom::default_registry().entries()) std::printf("%s\n", e.name.c_str());
    return 0;
  }
  std::fprintf(stderr, "usage: loom list\n");
  return 2;
}
