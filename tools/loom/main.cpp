// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The `loom` command-line program: installs every registered command (cli.hpp), parses, and
// turns every error into one line on stderr with exit status 2 (bad input) or 1.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "cli.hpp"

namespace {

int fail(int code, const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "loom: %s\n", loom::cli::one_line(msg).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = loom::cli;
  CLI::App app{"loom: generate, check, simulate and render pipeline-parallel training schedules", "loom"};
  app.require_subcommand(1);
  app.fallthrough(false);
  try {
    auto cmds = cli::commands();
    // Names are unique, so std::sort orders them fully (libstdc++ 12's std::stable_sort warns
    // under clang).
    std::sort(cmds.begin(), cmds.end(), [](auto const& a, auto const& b) {
      return a.order != b.order ? a.order < b.order : a.name < b.name;
    });
    for (auto const& c : cmds) c.install(app);
    for (auto const& x : cli::option_extensions()) {
      CLI::App* sub = nullptr;
      try {
        sub = app.get_subcommand(x.command);
      } catch (const CLI::OptionNotFound&) {
        return fail(cli::exit_failure, "internal error: an option extension names unknown subcommand '" + x.command + "'");
      }
      x.install(*sub);
    }
  } catch (const std::exception& e) {
    return fail(cli::exit_failure, std::string("internal error while setting up the commands: ") + e.what());
  }

  // CLI11 reports an unknown first word as "A subcommand is required"; name it instead.
  if (argc > 1 && argv[1][0] != '-' && app.get_subcommands([&](CLI::App* s) { return s->check_name(argv[1]); }).empty()) {
    std::string known;
    for (auto const* s : app.get_subcommands([](CLI::App*) { return true; })) {
      if (!known.empty()) known += ", ";
      known += s->get_name();
    }
    return fail(cli::exit_usage, std::string("unknown command '") + argv[1] + "' (known: " + known + ")");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(cli::exit_usage, e.what());
  } catch (const cli::usage_error& e) {
    return fail(cli::exit_usage, e.what());
  } catch (const loom::schedule_error& e) {
    return fail(cli::exit_usage, e.what());
  } catch (const loom::config_error& e) {
    return fail(cli::exit_usage, e.what());
  } catch (const cli::run_failure& e) {
    return fail(cli::exit_failure, e.what());
  } catch (const std::bad_alloc&) {
    return fail(cli::exit_failure, "out of memory");
  } catch (const std::exception& e) {
    return fail(cli::exit_failure, std::string("internal error: ") + e.what());
  }
  std::fflush(stdout);
  if (std::ferror(stdout)) return fail(cli::exit_failure, "cannot write to standard output");
  return cli::exit_ok;
}
