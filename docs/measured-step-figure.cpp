// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The README's picture of one measured step above its calibrated prediction.
//
//   measured-step-figure --record FILE [--ranks P] [--schedule NAME] [--note TEXT]
//     trains the quickstart MLP (width 256, 8 layers, 8 microbatches) on P rank threads (default:
//     the cores, at most 4): a warm-up step, 3 calibration steps (their stage calls and a link
//     ping-pong give loom::calibrate its cost model, each action timed with the host work before
//     it: loom::occupied_timings), then one measured step; writes the model
//     and every rank's measured timeline (loom::gather_timeline) to FILE.
//   measured-step-figure FILE
//     prints the SVG of FILE's step above the simulation of its model (loom::render_svg over a
//     measured_step). ctest checks that docs/img/measured-step.svg is this output for
//     docs/img/measured-step.tsv, so the picture always comes from the current renderer; the
//     recorded timeline is a real run's (its first line says where and when).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/exec/calibrate.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/exec/timeline.hpp>
#include <loom/render/measured.hpp>
#include <loom/schedule.hpp>

#include "../examples/01_quickstart/mlp.hpp"

namespace {

int record(const std::string& path, int P, const std::string& family, const std::string& note) {
  const loom::schedule s = loom::default_registry().at(family).make({P, 8, 0});
  quickstart::mlp_spec m;
  m.widths.assign(9, 256);
  const int calibration = 3;
  std::vector<loom::action_timing> timings;
  std::vector<loom::measured_action> timeline;
  loom::cost_model model;
  loom::run_threads(P, [&](loom::threads::comm& c) {
    std::vector<double> targets;
    loom::pipeline p(s, c, [&](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
      return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
    }, {.measure = true});
    std::vector<loom::action_timing> mine;
    for (int st = 0; st <= calibration + 1; ++st) {
      auto data = quickstart::make_batch(m, s.microbatches, st);
      targets = data.targets;
      c.barrier();
      p.step(data.inputs);
      if (st >= 1 && st <= calibration) {
        auto occupied = loom::occupied_timings(p.last_timeline());  // calls and the host work before each
        mine.insert(mine.end(), occupied.begin(), occupied.end());
      }
    }
    auto all_timeline = loom::gather_timeline(c, p.last_timeline());
    auto all_timings = loom::gather_timings(c, mine);
    const auto sizes = loom::gather_stage_sizes(p, c);
    double msg = 8;
    for (const auto& z : sizes) msg = std::max(msg, z.message_bytes);
    const std::vector<std::size_t> link_sizes{8, static_cast<std::size_t>(msg), 2 * static_cast<std::size_t>(msg)};
    const loom::link_cost link = loom::measure_link(c, link_sizes);
    if (c.rank() == 0) {
      timeline = std::move(all_timeline);
      timings = std::move(all_timings);
      model = loom::calibrate(s, timings, sizes, {.intra = link});
    }
  });
  std::ofstream f(path);
  const std::time_t now = std::time(nullptr);
  char day[32];
  std::strftime(day, sizeof day, "%Y-%m-%d", std::gmtime(&now));
  f.precision(17);
  f << "# recorded " << day << " by measured-step-figure --record (quickstart MLP width 256, 8 layers; " << P
    << " rank threads on " << std::thread::hardware_concurrency() << " cores; step " << calibration + 1
    << " after a warm-up and " << calibration << " calibration steps)" << (note.empty() ? "" : "; " + note) << "\n";
  f << "schedule " << family << " " << P << " " << s.microbatches << "\n";
  f << "link " << model.intra.alpha << " " << model.intra.beta << "\n";
  f << "mem_w_ratio " << model.mem_w_ratio << "\n";
  for (auto const& k : model.stages)
    f << "stage " << k.f << " " << k.b << " " << k.w << " " << k.fb << " " << k.activation << " " << k.message_bytes << " "
      << k.param_bytes << "\n";
  for (auto const& a : timeline)
    f << "action " << a.rank << " " << static_cast<int>(a.kind) << " " << a.microbatch << " " << a.stage << " " << a.peer << " "
      << (a.in_fb ? 1 : 0) << " " << a.start << " " << a.seconds << "\n";
  if (!f.flush()) {
    std::cerr << "cannot write " << path << "\n";
    return 1;
  }
  std::cerr << "wrote " << path << ": " << timeline.size() << " actions\n";
  return 0;
}

int render(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    std::cerr << "cannot read " << path << "\n";
    return 1;
  }
  std::string family, line, note;
  int P = 0, M = 0;
  loom::cost_model model;
  std::vector<loom::measured_action> timeline;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "#") std::getline(in, note);
    else if (key == "schedule") in >> family >> P >> M;
    else if (key == "link") in >> model.intra.alpha >> model.intra.beta;
    else if (key == "mem_w_ratio") in >> model.mem_w_ratio;
    else if (key == "stage") {
      loom::stage_cost k;
      in >> k.f >> k.b >> k.w >> k.fb >> k.activation >> k.message_bytes >> k.param_bytes;
      model.stages.push_back(k);
    } else if (key == "action") {
      loom::measured_action a;
      int kind = 0, fb = 0;
      in >> a.rank >> kind >> a.microbatch >> a.stage >> a.peer >> fb >> a.start >> a.seconds;
      a.kind = static_cast<loom::op>(kind);
      a.in_fb = fb != 0;
      timeline.push_back(a);
    } else if (!key.empty()) {
      std::cerr << path << ": unknown line: " << line << "\n";
      return 1;
    }
    if (in.fail()) {
      std::cerr << path << ": malformed line: " << line << "\n";
      return 1;
    }
  }
  if (family.empty() || P < 1 || M < 1) {
    std::cerr << path << ": no schedule line\n";
    return 1;
  }
  const loom::schedule s = loom::default_registry().at(family).make({P, M, 0});
  const loom::simulation sim = loom::simulate(s, model);
  loom::svg_options o;
  o.width = 900;
  o.row_height = 22;
  o.title = family + ", " + std::to_string(P) + " ranks \xC3\x97 " + std::to_string(M) +
            " microbatches: measured (top), predicted from calibrated costs (bottom)";
  std::cout << loom::render_svg(s, {.actions = timeline, .predicted = &sim, .seconds_per_unit = 1}, o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 2 && args[0] == "--record") {
    unsigned cores = std::thread::hardware_concurrency();
    int P = cores >= 4 ? 4 : cores >= 2 ? static_cast<int>(cores) : 2;
    std::string family = "zb-h1", note;
    for (std::size_t i = 2; i + 1 < args.size(); i += 2) {
      if (args[i] == "--ranks") P = std::atoi(args[i + 1].c_str());
      else if (args[i] == "--schedule") family = args[i + 1];
      else if (args[i] == "--note") note = args[i + 1];
    }
    return record(args[1], P, family, note);
  }
  if (args.size() == 1) return render(args[0]);
  std::cerr << "usage: measured-step-figure --record FILE [--ranks P] [--schedule NAME] [--note TEXT] | measured-step-figure FILE\n";
  return 2;
}
