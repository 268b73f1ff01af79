// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom render`: draws a schedule as ASCII (default), an SVG timeline (--svg FILE) or a
// Chrome/Perfetto trace (--trace FILE), from the same simulation `loom simulate` reports.
#include <fmt/core.h>

#include <loom/render.hpp>

#include "cli.hpp"

namespace {

struct render_text {
  std::string svg, trace, step = "0", width = "120", us_per_unit = "1000";
  bool ascii = false, programs = false;
};

loom::cli::register_command render_command{{.name = "render", .order = 30, .install = [](CLI::App& app) {
  auto* sub = app.add_subcommand("render", "draw a schedule: ASCII (default), --svg FILE, --trace FILE");
  auto req = loom::cli::add_request_options(*sub);
  auto t = std::make_shared<render_text>();
  sub->add_option("--svg", t->svg, "write an SVG timeline to FILE")->type_name("FILE");
  sub->add_option("--trace", t->trace, "write a Chrome/Perfetto trace JSON to FILE")->type_name("FILE");
  sub->add_flag("--ascii", t->ascii, "print the ASCII timeline even when writing --svg/--trace");
  sub->add_flag("--programs", t->programs, "print each rank's program (action order) instead of the timeline");
  sub->add_option("--step", t->step, "ASCII: time units per column (0: the shortest action)")->capture_default_str()->type_name("NUMBER");
  sub->add_option("--width", t->width, "ASCII: wrap lines at this many characters (0: never)")->capture_default_str()->type_name("INT");
  sub->add_option("--us-per-unit", t->us_per_unit, "trace: microseconds per time unit")->capture_default_str()->type_name("NUMBER");
  sub->callback([req, t] {
    namespace cli = loom::cli;
    cli::request r = cli::parse_request(*req);
    loom::ascii_options ao;
    ao.step = cli::parse_real("--step", t->step, 0);
    ao.width = cli::parse_int("--width", t->width, 0, 1 << 20);
    loom::trace_options to;
    to.us_per_unit = cli::parse_real("--us-per-unit", t->us_per_unit, 0);
    if (to.us_per_unit <= 0) throw cli::usage_error("--us-per-unit '" + t->us_per_unit + "' must be > 0");
    auto e = cli::evaluate(cli::make_schedule(r), r.cost);
    if (!e.valid.ok || !e.sim.ok)
      throw cli::run_failure("schedule '" + e.sched.name + "' is not valid: " + (e.valid.ok ? e.sim.error : e.valid.message));
    // Render everything before writing anything, so a failure leaves no partial output.
    std::string svg = t->svg.empty() ? std::string() : loom::render_svg(e.sched, e.sim);
    std::string trace = t->trace.empty() ? std::string() : loom::render_trace(e.sched, e.sim, to);
    bool files = !t->svg.empty() || !t->trace.empty();
    std::string text;
    if (t->programs) text = loom::format_programs(e.sched, -1, 0, static_cast<std::size_t>(-1) / 4);
    else if (t->ascii || !files) text = loom::render_ascii(e.sched, e.sim, ao);
    if (!t->svg.empty()) cli::write_file("--svg", t->svg, svg);
    if (!t->trace.empty()) cli::write_file("--trace", t->trace, trace);
    fmt::print("{}", text);
    if (!t->svg.empty()) fmt::print("wrote {} (SVG timeline)\n", t->svg);
    if (!t->trace.empty()) fmt::print("wrote {} (Chrome/Perfetto trace)\n", t->trace);
  });
}}};

}  // namespace
