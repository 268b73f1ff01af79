// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom list`: the schedule names of the default registry, one per line.
#include <fmt/core.h>

#include "cli.hpp"

namespace {

loom::cli::register_command list_command{{.name = "list", .order = 10, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("list", "print the schedule names, one per line");
  auto verbose = std::make_shared<bool>(false);
  auto sync_only = std::make_shared<bool>(false);
  sub->add_flag("--long,-l", *verbose, "also print each family's natural chunk count and summary");
  sub->add_flag("--synchronous", *sync_only,
                "only the synchronous families that run with stages alone (one step per schedule, flushed; not the vocabulary-parallel "
                "ones, which also need loom::vocab_layers), no aliases");
  sub->callback([verbose, sync_only] {
    auto const& entries = loom::default_registry().entries();
    std::size_t width = 0;
    for (auto const& e : entries) width = std::max(width, e.name.size());
    for (auto const& a : loom::default_registry().aliases()) width = std::max(width, a.first.size());
    for (auto const& e : entries) {
      if (*sync_only && (e.multi_step || e.vocab)) continue;
      if (*verbose)
        fmt::print("{:<{}}  chunks={}  {}{}\n", e.name, width, e.default_chunks,
                   e.multi_step ? "[asynchronous, --steps T] " : e.vocab ? "[vocabulary-parallel, loom::vocab_layers] " : "", e.summary);
      else
        fmt::print("{}\n", e.name);
    }
    for (auto const& [name, target] : loom::default_registry().aliases()) {
      if (*sync_only) break;
      if (*verbose)
        fmt::print("{:<{}}  another name of {}\n", name, width, target);
      else
        fmt::print("{}\n", name);
    }
  });
}}};

}  // namespace
