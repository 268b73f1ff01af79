// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom list`: the schedule names of the default registry, one per line.
#include <fmt/core.h>

#include "cli.hpp"

namespace {

loom::cli::register_command list_command{{.name = "list", .order = 10, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("list", "print the schedule names, one per line");
  auto verbose = std::make_shared<bool>(false);
  sub->add_flag("--long,-l", *verbose, "also print each family's natural chunk count and summary");
  sub->callback([verbose] {
    auto const& entries = loom::default_registry().entries();
    std::size_t width = 0;
    for (auto const& e : entries) width = std::max(width, e.name.size());
    for (auto const& e : entries) {
      if (*verbose)
        fmt::print("{:<{}}  chunks={}  {}\n", e.name, width, e.default_chunks, e.summary);
      else
        fmt::print("{}\n", e.name);
    }
  });
}}};

}  // namespace
