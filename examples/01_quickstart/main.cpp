// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom quickstart: train a small MLP (double precision) cut into pipeline stages with a schedule
// chosen on the command line, over in-process threads or MPI processes, and check the result
// against the single-rank reference. Exit status: 0 when it matches, 1 when it differs, 2 on a
// bad option or schedule.
//
//   quickstart --schedule zb-h1 --ranks 4 --microbatches 8 --steps 5 --backend threads
//   mpirun -np 4 quickstart --schedule 1f1b --microbatches 8 --backend mpi --deterministic
//   mpirun -np 2 quickstart --schedule zb-h1 --backend mpi --width 512 --steps 20 --calibrate 5 --costs-out zb-h1.json
//
// With --calibrate N, steps 1..N (step 0 is a warm-up: handshake, first touch) are timed per
// stage call, a ping-pong measures the link, and loom::calibrate turns both into a cost model;
// the remaining steps are the measured ones, and the step time and bubble simulated from the
// calibrated model are printed beside the measured ones, with a verdict that says whether the
// model explains the run and, if not, what it leaves out (see docs/calibration.md and
// docs/main-job.md). An asynchronous family (pipedream, pipedream-2bw, ...) runs its T steps as one
// run: a warm-up run, --calibrate N calibration runs (0: the warm-up run calibrates), then --runs R
// measured runs, each from the initial weights; the calibrated model includes each stage's update
// (docs/asynchronous.md).

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#endif

#include <loom/comm/threads.hpp>
#include <loom/exec/calibrate.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/exec/timeline.hpp>
#include <loom/render/ascii.hpp>
#include <loom/render/measured.hpp>
#include <loom/schedule.hpp>
#if defined(LOOM_HAS_MPI)
#include <loom/comm/mpi.hpp>
#endif

#include "mlp.hpp"

namespace {

struct options {
  std::string schedule = "1f1b";
  int ranks = 4;
  int microbatches = 8;
  int chunks = 0;
  int steps = 5;
  std::string backend = "threads";
  bool deterministic = false;
  int width = 8;   // hidden features
  int layers = 9;  // model layers (raised to the number of virtual stages if smaller)
  int samples = 2;  // samples per microbatch
  int cores = 1;    // cores the ranks share (set in main: this process's for threads, the host's for MPI)
  int calibrate = 0;      // calibration steps after the warm-up step (0: no calibration); asynchronous: calibration runs
  int runs = 1;           // asynchronous families: measured runs after the calibration (their mean is reported)
  std::string costs_out;  // where to write the calibrated cost file (JSON), if anywhere
  std::string trace, svg;  // where to write the last step's measured timeline (Perfetto trace, SVG)
};

//! Writes the last step's measured timeline (every rank's, gathered: collective) as a Perfetto trace
//! and as an SVG, above the prediction of the same step: from the calibrated costs when there are
//! some, else from unit costs scaled to the measured mean stage call. Rank 0 writes and says where.
template <class Comm>
void write_timeline(Comm& comm, const options& o, const loom::schedule& s, std::span<const loom::measured_action> mine,
                    const std::optional<loom::cost_model>& model) {
  const auto all = loom::gather_timeline(comm, mine);
  if (comm.rank() != 0) return;
  const loom::simulation sim = model ? loom::simulate(s, *model) : loom::simulate(s);
  const double scale = model ? 1 : loom::seconds_per_unit_matching(s, sim, all);
  const loom::measured_step step{.actions = all, .predicted = &sim, .seconds_per_unit = scale};
  const char* against = model ? "its prediction from the calibrated costs" : "its prediction at unit costs scaled to the measured mean stage call";
  auto write = [&](const std::string& path, const std::string& text, const char* what, const char* view) {
    std::ofstream f(path, std::ios::binary);
    if (!f || !(f << text) || !f.flush()) {  // said, not thrown: the other ranks are past the step
      std::fprintf(stderr, "quickstart: cannot write the %s to %s\n", what, path.c_str());
      return;
    }
    std::printf("%s: %s (the last step as measured on every rank, waits included, above %s; %s)\n", what, path.c_str(),
                against, view);
  };
  if (!o.trace.empty()) write(o.trace, loom::render_trace(s, step), "trace", "open it at ui.perfetto.dev");
  if (!o.svg.empty()) write(o.svg, loom::render_svg(s, step), "timeline picture", "open it in a browser");
}

//! What every rank computes about the run; rank 0 prints it.
struct verdict {
  double max_rel_params = 0;  // largest relative parameter difference to the reference
  std::int64_t differing_bits = 0;
  double max_rel_loss = 0;
  //! Every rank's worst relative differences `mine`, the largest over the ranks (collective).
  template <class Comm>
  static std::vector<double> gather(Comm& comm, std::vector<double> mine) {
    comm.all_reduce(std::span<double>(mine), loom::reduce_op::max);
    return mine;
  }
  //! The values that differ bitwise, summed over the ranks (collective).
  template <class Comm>
  std::int64_t gather_bits(Comm& comm) const {
    std::vector<std::int64_t> bits{differing_bits};
    comm.all_reduce(std::span<std::int64_t>(bits), loom::reduce_op::sum);
    return bits[0];
  }
};

//! The cores this process may run on (its affinity mask, as `nproc` counts them).
int usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

//! CPU seconds the calling thread has used (Linux; elsewhere 0, and the load line is left out).
double thread_cpu_seconds() {
#if defined(__linux__) && defined(RUSAGE_THREAD)
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) == 0)
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
#endif
  return 0;
}

//! CPU seconds every process of the machine has used, and the machine's CPU count, from
//! /proc/stat (Linux; {-1, 0} where it cannot be read). Jiffies are 10 ms: over a window of a
//! second or more the share of a core this gives is good to a few per cent.
struct machine_cpu {
  double busy_seconds = -1;
  int cpus = 0;
};
machine_cpu read_machine_cpu() {
  machine_cpu m;
#if defined(__linux__)
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return m;
  char line[512];
  double busy = 0;
  bool first = true;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "cpu", 3) != 0) break;
    if (!first) {
      ++m.cpus;
      continue;
    }
    first = false;
    unsigned long long v[8] = {};
    if (std::sscanf(line + 3, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7]) < 5) {
      std::fclose(f);
      return m;
    }
    // user nice system idle iowait irq softirq steal: everything but idle and iowait is busy.
    busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
  }
  std::fclose(f);
  m.busy_seconds = busy / 100.0;  // USER_HZ, 100 on every Linux ABI
#endif
  return m;
}

//! Adds the differences between this rank's layers and the reference's to `v`.
template <class Stages>
void compare_params(Stages&& stages, const std::vector<std::vector<double>>& ref_params, verdict& v) {
  for (auto& stg : stages)
    for (int l = stg.first_layer(); l < stg.last_layer(); ++l) {
      auto w = stg.layer_params(l);
      auto const& want = ref_params[static_cast<std::size_t>(l)];
      double d = 0, n = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        d = std::max(d, std::abs(w[i] - want[i]));
        n = std::max(n, std::abs(want[i]));
        if (std::memcmp(&w[i], &want[i], sizeof(double)) != 0) ++v.differing_bits;
      }
      v.max_rel_params = std::max(v.max_rel_params, n > 0 ? d / n : d);
    }
}

//! An asynchronous family (pipedream, pipedream-2bw, ...): the T steps run as one pipeline run
//! without a flush, checked against the single-process reference of the family's rule
//! (`quickstart::reference_asynchronous`), step by step. Returns 0 if the result matches.
template <class Comm>
int train_async(Comm& comm, const options& o, const loom::schedule& s, const quickstart::mlp_spec& m) {
  const bool root = comm.rank() == 0;
  const int T = s.steps, mb = s.step_microbatches();
  const quickstart::batch data = quickstart::make_run_batch(m, mb, T);
  const std::vector<double>& inputs = data.inputs;
  const std::vector<double>& targets = data.targets;
  loom::pipeline p(s, comm, [&](loom::stage_id id) {
    auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
    return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
  }, {.deterministic = o.deterministic, .measure = true});
  const auto sim = loom::simulate(s);
  if (root) {
    std::cout << loom::render_ascii(s, sim) << "\n";
    std::printf("%d steps of %d microbatches in one run, never flushed; weight versions per rank (simulator):", T, mb);
    for (double c : sim.weight_copies) std::printf(" %g", c);
    std::printf("\n");
  }
  // Every run starts from the initial weights: run 0 is a warm-up (the ranks' handshake, first
  // touch of every buffer), runs 1..N calibrate (--calibrate N; with 0 the warm-up run does), and
  // the --runs R after them are measured; the reference check is the last one's.
  auto reset_weights = [&] {
    for (auto& st : p.stages()) {
      std::size_t at = 0;
      for (int l = st.first_layer(); l < st.last_layer(); ++l) {
        const auto init = quickstart::initial_params(m, l);
        std::copy(init.begin(), init.end(), st.weights().begin() + static_cast<std::ptrdiff_t>(at));
        at += init.size();
      }
    }
  };
  // The costs calibrated on those runs: stage calls with the host work around them (the version
  // loads before a call count in it), the calls alone, each stage's updates with their version
  // copies (loom::stage_cost::update), and a ping-pong for the link.
  // As for a synchronous step, the run's work outside its program's actions (before the first:
  // the copies of version 0 and of the weights kept for a failure; after the last: the latest
  // version loaded, the sends' completion) is not in the schedule's simulation: its mean over the
  // calibration runs on the slowest rank is added to the simulated makespan.
  std::vector<loom::action_timing> occupied, calls;
  double outside_actions = 0;
  auto collect = [&](const loom::step_result& cr) {
    auto a = loom::gather_timings(comm, loom::occupied_timings(p.last_timeline()));
    auto b = loom::gather_timings(comm, p.last_timings());
    occupied.insert(occupied.end(), a.begin(), a.end());
    calls.insert(calls.end(), b.begin(), b.end());
    auto t = p.last_timeline();
    if (!t.empty()) outside_actions += t.front().start + std::max(0.0, cr.seconds - (t.back().start + t.back().seconds));
  };
  {
    comm.barrier();
    const auto warm = p.step(inputs);
    if (o.calibrate == 0) collect(warm);
  }
  for (int i = 0; i < o.calibrate; ++i) {
    reset_weights();
    comm.barrier();
    collect(p.step(inputs));
  }
  std::vector<double> outside{outside_actions / std::max(o.calibrate, 1)};
  comm.all_reduce(std::span<double>(outside), loom::reduce_op::max);
  const auto sizes = loom::gather_stage_sizes(p, comm);
  double msg = 8;
  for (const auto& z : sizes) msg = std::max(msg, z.message_bytes);
  const auto bytes = static_cast<std::size_t>(msg);
  const loom::link_cost link = loom::measure_link(comm, std::vector<std::size_t>{8, bytes, 2 * bytes, 4 * bytes});
  const loom::cost_model model = loom::calibrate(s, occupied, sizes, {.intra = link});
  const loom::simulation calibrated = loom::simulate(s, model);
  double call_busy = 0;
  for (double b : loom::simulate(s, loom::calibrate(s, calls, sizes, {.intra = link})).busy) call_busy += b;
  const double predicted_time = calibrated.makespan + outside[0];
  const double calibrated_bubble = 1 - call_busy / (s.ranks * predicted_time);
  std::vector<double> run_bubbles;
  double run_time = 0;
  loom::step_result r;
  for (int i = 0; i < o.runs; ++i) {
    reset_weights();
    comm.barrier();
    r = p.step(inputs);
    run_bubbles.push_back(r.bubble_ratio);
    run_time += r.makespan / o.runs;
  }
  double measured_bubble = 0;
  for (double b : run_bubbles) measured_bubble += b / o.runs;
  std::vector<std::vector<double>> ref_params;
  const quickstart::async_rule rule{.family = s.name, .p = s.ranks, .m = mb, .N = s.microbatches};
  const auto ref = quickstart::reference_asynchronous(m, rule, mb, T, 1.0 / mb, ref_params);
  verdict v;
  if (root) std::printf("step  loss (pipeline)           loss (reference of the rule)\n");
  for (int t = 0; t < T; ++t) {
    double sum = 0;
    for (int i = 0; i < mb; ++i) sum += p.microbatch_losses()[static_cast<std::size_t>(t * mb + i)];
    const double got = sum * (1.0 / mb), want = ref[static_cast<std::size_t>(t)];
    v.max_rel_loss = std::max(v.max_rel_loss, std::abs(got - want) / std::max(std::abs(want), 1e-300));
    if (std::memcmp(&got, &want, sizeof(double)) != 0) ++v.differing_bits;
    if (root) std::printf("%4d  %-24.17g  %-24.17g\n", t, got, want);
  }
  compare_params(p.stages(), ref_params, v);
  std::vector<std::int64_t> all_held(static_cast<std::size_t>(s.ranks), 0);
  all_held[static_cast<std::size_t>(comm.rank())] = p.versions_held(0);
  comm.all_reduce(std::span<std::int64_t>(all_held), loom::reduce_op::sum);
  if (!o.trace.empty() || !o.svg.empty()) write_timeline(comm, o, s, p.last_timeline(), model);
  const std::vector<double> worst = v.gather(comm, {v.max_rel_params, v.max_rel_loss});
  const std::int64_t differing = v.gather_bits(comm);
  const bool bitwise = o.deterministic;
  const bool ok = bitwise ? differing == 0 : worst[0] <= 1e-12 && worst[1] <= 1e-12;
  if (root) {
    const double flushed = loom::simulate(loom::default_registry().at("1f1b").make({s.ranks, mb, 0})).bubble_ratio;
    std::printf("weight versions held per rank (counted by the executor):");
    for (auto h : all_held) std::printf(" %lld", static_cast<long long>(h));
    std::printf("\n");
    const std::string on = o.calibrate == 0 ? "a warm-up run" : "runs 1.." + std::to_string(o.calibrate) + " after a warm-up";
    std::printf("calibrated costs (ms; per stage the median F, B, W, BW and update of %s, each with the host work since the "
                "rank's previous action; an update with its version copies):",
                on.c_str());
    const auto fitted = model.fit(s.stages);
    for (std::size_t i = 0; i < fitted.stages.size(); ++i)
      std::printf(" s%zu f %.3f b+w %.3f update %.3f;", i, 1e3 * fitted.stages[i].f, 1e3 * (fitted.stages[i].b + fitted.stages[i].w),
                  1e3 * fitted.stages[i].update);
    std::printf("\n");
    std::string each;
    if (o.runs > 1)
      for (double b : run_bubbles) each += (each.empty() ? ": " : ", ") + std::to_string(b).substr(0, 5);
    std::printf("bubble ratio over the %d steps: predicted %.3f at unit costs (f = b = w, no comm; 1F1B flushing every step: "
                "%.3f), %.3f at the costs calibrated on %s; measured %.3f (%s%s)  [1 - time in stage calls and updates / "
                "(%d ranks x run time)]\n",
                T, sim.bubble_ratio, flushed, calibrated_bubble, on.c_str(), measured_bubble,
                o.runs == 1 ? "the run after it" : ("mean of the " + std::to_string(o.runs) + " runs after it").c_str(), each.c_str(),
                s.ranks);
    const double err_t = (predicted_time - run_time) / run_time;
    const double err_b = measured_bubble > 0 ? (calibrated_bubble - measured_bubble) / measured_bubble : 0;
    std::printf("run time: predicted %.3f ms (calibrated costs: the simulated makespan %.3f ms + %.3f ms outside the actions), "
                "measured %.3f ms%s, error %+.1f %%\n",
                1e3 * predicted_time, 1e3 * calibrated.makespan, 1e3 * outside[0], 1e3 * run_time, o.runs > 1 ? " (mean)" : "",
                100 * err_t);
    // The verdict, as for the synchronous families: within 15 % on both (the bubble also within
    // 0.02 absolute, as a small bubble's relative error is large).
    if (std::abs(err_t) <= 0.15 && (std::abs(err_b) <= 0.15 || std::abs(calibrated_bubble - measured_bubble) <= 0.02))
      std::printf("verdict: the calibrated cost model explains this run: predicted run time within %.1f %% and bubble within "
                  "%.1f %% (%.3f) of the measured ones\n",
                  100 * std::abs(err_t), 100 * std::abs(err_b), std::abs(calibrated_bubble - measured_bubble));
    else if (s.ranks > o.cores)
      std::printf("verdict: the prediction misses (run time %+.1f %%, bubble %+.3f): %d busy ranks share %d cores, so a rank "
                  "also waits for a core, which the model does not count (--ranks %d gives each rank its own core)\n",
                  100 * err_t, calibrated_bubble - measured_bubble, s.ranks, o.cores, o.cores);
    else
      std::printf("verdict: the prediction misses (run time %+.1f %%, bubble %+.3f): the calibration and the measured runs "
                  "differ (a disturbed host, or host work outside the stage calls that varies from run to run); "
                  "--calibrate N and --runs R average over more runs\n",
                  100 * err_t, calibrated_bubble - measured_bubble);
    if (!o.costs_out.empty()) {
      loom::write_cost_file(o.costs_out, model);
      std::printf("cost file: %s\n", o.costs_out.c_str());
    }
    std::printf("reference check (%s): max relative difference params %.3g, loss %.3g; %lld values differ bitwise -> %s\n",
                bitwise ? "bitwise" : "1e-12 relative", worst[0], worst[1], static_cast<long long>(differing),
                ok ? "MATCH" : "DIFFERENT");
  }
  return ok ? 0 : 1;
}

//! The training loop of one rank, on any communicator. Returns 0 if the result matches.
template <class Comm>
int train(Comm& comm, const options& o, const loom::schedule& s) {
  const bool root = comm.rank() == 0;
  quickstart::mlp_spec m;
  m.widths.assign(static_cast<std::size_t>(std::max(o.layers, s.stages)) + 1, o.width);  // >= 1 layer per stage
  m.widths.front() = 4;
  m.samples = o.samples;
  m.widths.back() = 3;
  if (s.versioned()) return train_async(comm, o, s, m);
  std::vector<double> targets;
  loom::pipeline_options po{.deterministic = o.deterministic, .measure = true};
  loom::pipeline p(s, comm, [&](loom::stage_id id) {
    auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
    return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
  }, po);

  // The single-rank reference, computed by every rank (cheap here) to check its own layers.
  std::vector<std::vector<double>> ref_params, ref_grads;
  for (int l = 0; l < m.layers(); ++l) ref_params.push_back(quickstart::initial_params(m, l));
  const double scale = 1.0 / o.microbatches;

  if (root) {
    auto sim = loom::simulate(s);
    std::cout << loom::render_ascii(s, sim) << "\n";
    std::cout << "step  loss (pipeline)           loss (single-rank reference)  time(ms)  bubble  "
                 "(time: slowest rank's step; bubble: 1 - time in stage calls / (ranks x time))\n";
  }
  verdict v;
  double predicted = loom::simulate(s).bubble_ratio, measured_sum = 0;
  // Calibration: steps 1..N are timed per stage call; the steps after them are the measured ones.
  const bool calibrating = o.calibrate > 0;
  std::vector<loom::action_timing> timings;
  std::optional<loom::cost_model> calibrated;  // with --calibrate: the model the prediction uses
  std::vector<loom::action_timing> call_timings;  // the stage calls alone (what the measured bubble counts)
  // Per calibration step, this rank's time in the step outside every action of its program (before
  // the first: zeroing the weight gradients; after the last: folding them, the sends' completion).
  double outside_actions = 0;
  double step_sum = 0, busy_sum = 0;  // over the measured steps: makespans, every rank's time in stage calls
  int step_count = 0;
  // CPU time over the measured steps: this rank's thread, and the whole machine's (rank 0).
  double cpu_mine = 0, wall_measured = 0;
  machine_cpu machine_before;
  std::chrono::steady_clock::time_point measured_from;
  for (int st = 0; st < o.steps; ++st) {
    auto data = quickstart::make_batch(m, o.microbatches, st);
    targets = data.targets;
    if (calibrating) comm.barrier();  // the ranks start each step together, as the simulation does
    if (calibrating && st == o.calibrate + 1) {
      cpu_mine = -thread_cpu_seconds();
      if (root) machine_before = read_machine_cpu();
      measured_from = std::chrono::steady_clock::now();
    }
    auto r = p.step(data.inputs);
    if (calibrating && st >= 1 && st <= o.calibrate) {
      auto all = loom::gather_timings(comm, loom::occupied_timings(p.last_timeline()));
      timings.insert(timings.end(), all.begin(), all.end());
      auto calls = loom::gather_timings(comm, p.last_timings());
      call_timings.insert(call_timings.end(), calls.begin(), calls.end());
      auto t = p.last_timeline();
      if (!t.empty()) outside_actions += t.front().start + std::max(0.0, r.seconds - (t.back().start + t.back().seconds));
    } else if (calibrating && st > o.calibrate) {
      step_sum += r.makespan;
      busy_sum += r.busy_sum;
      ++step_count;
    }
    double want = quickstart::reference_step(m, o.microbatches, data, scale, ref_params, ref_grads);
    double rel = std::abs(r.loss - want) / std::max(std::abs(want), 1e-300);
    v.max_rel_loss = std::max(v.max_rel_loss, rel);
    if (std::memcmp(&r.loss, &want, sizeof(double)) != 0) ++v.differing_bits;
    measured_sum += r.bubble_ratio;
    if (root) {
      const char* phase = !calibrating ? "" : st == 0 ? "  warm-up" : st <= o.calibrate ? "  calibration" : "  measured";
      std::printf("%4d  %-24.17g  %-28.17g  %8.3f  %6.3f%s\n", st, r.loss, want, 1e3 * r.makespan, r.bubble_ratio, phase);
    }
  }
  if (calibrating && step_count > 0) {
    comm.barrier();  // the last measured step's reference check ends on every rank
    cpu_mine += thread_cpu_seconds();
    wall_measured = std::chrono::duration<double>(std::chrono::steady_clock::now() - measured_from).count();
  }
  compare_params(p.stages(), ref_params, v);
  if (calibrating) {
    const auto sizes = loom::gather_stage_sizes(p, comm);
    double msg = 8;
    for (const auto& z : sizes) msg = std::max(msg, z.message_bytes);
    const auto mb = static_cast<std::size_t>(msg);
    const std::vector<std::size_t> link_sizes{8, mb, 2 * mb, 4 * mb};
    const loom::link_cost link = loom::measure_link(comm, link_sizes);
    const loom::cost_model model = loom::calibrate(s, timings, sizes, {.intra = link});
    calibrated = model;
    const loom::simulation sim = loom::simulate(s, model);
    // The work of a step outside its program's actions, which the schedule's simulation does not
    // contain: the calibration steps' mean on the slowest rank, added to the simulated makespan.
    std::vector<double> outside{outside_actions / o.calibrate};
    comm.all_reduce(std::span<double>(outside), loom::reduce_op::max);
    const double want = sim.makespan + outside[0];
    std::vector<double> cpu{cpu_mine};
    comm.all_reduce(std::span<double>(cpu), loom::reduce_op::sum);  // every rank's CPU time over the measured steps
    if (root) {
      std::printf("calibrated costs (ms; per stage the median F, B, W of steps 1..%d, each a stage call and the host "
                  "work since the rank's previous action):", o.calibrate);
      for (std::size_t i = 0; i < model.stages.size(); ++i)
        std::printf(" s%zu f %.3f b %.3f w %.3f;", i, 1e3 * model.stages[i].f, 1e3 * model.stages[i].b, 1e3 * model.stages[i].w);
      std::printf(" link %.2f us + %.3f ns/B (ping-pong between ranks 0 and 1)\n", 1e6 * link.alpha, 1e9 * link.beta);
      if (step_count > 0) {
        const double got = step_sum / step_count;
        const double P = s.ranks;
        const double err_t = (want - got) / got;
        std::printf("step time: predicted %.3f ms (calibrated costs: the schedule's simulated makespan %.3f ms + %.3f ms "
                    "outside its actions, zeroing and folding gradients, measured in steps 1..%d), measured %.3f ms (mean of "
                    "%d steps), error %+.1f %%  [vs the slowest rank's step after a barrier, steps %d..%d]\n",
                    1e3 * want, 1e3 * sim.makespan, 1e3 * outside[0], o.calibrate, 1e3 * got, step_count, 100 * err_t,
                    o.calibrate + 1, o.steps - 1);
        // The bubble counts time in stage calls, measured and predicted alike: the predicted calls are
        // the schedule's actions at their calls' medians (a model of the calls alone).
        double sim_busy = 0;
        for (double b : loom::simulate(s, loom::calibrate(s, call_timings, sizes, {.intra = link})).busy) sim_busy += b;
        const double bubble_want = 1 - sim_busy / (P * want);
        const double got_bubble = 1 - busy_sum / (P * step_sum);
        const double err_b = got_bubble > 0 ? (bubble_want - got_bubble) / got_bubble : 0;
        std::printf("bubble ratio: predicted %.3f (calibrated costs), measured %.3f (steps %d..%d), difference %+.3f (%+.1f %%)"
                    "  [1 - time in stage calls / (%d ranks x step time)]\n",
                    bubble_want, got_bubble, o.calibrate + 1, o.steps - 1, bubble_want - got_bubble, 100 * err_b, s.ranks);
        const double busy_pred = sim_busy / P, busy_got = busy_sum / (P * step_count);
        std::printf("per rank and step: in stage calls predicted %.3f ms, measured %.3f ms (%+.1f %%); outside them "
                    "(waiting for other ranks, hand-offs) predicted %.3f ms, measured %.3f ms\n",
                    1e3 * busy_pred, 1e3 * busy_got, 100 * (busy_got - busy_pred) / busy_pred, 1e3 * (want - busy_pred),
                    1e3 * (got - busy_got));
        const int cores = o.cores;
        const machine_cpu machine_after = read_machine_cpu();
        double others = -1;  // cores other processes kept busy on average over the measured steps
        if (machine_before.busy_seconds >= 0 && machine_after.busy_seconds >= 0 && cpu[0] > 0 && wall_measured > 0.5) {
          others = std::max(0.0, (machine_after.busy_seconds - machine_before.busy_seconds - cpu[0]) / wall_measured);
          std::printf("other load: other processes kept %.2f of the machine's %d cores busy during the measured steps "
                      "(/proc/stat less this run's %.2f s of CPU over %.2f s)\n",
                      others, machine_after.cpus, cpu[0], wall_measured);
        }
        // The verdict: within 15 % on both (the bubble also within 0.02 absolute, as a small bubble's
        // relative error is large), or the first reason found for the difference.
        const bool time_ok = std::abs(err_t) <= 0.15;
        const bool bubble_ok = std::abs(err_b) <= 0.15 || std::abs(bubble_want - got_bubble) <= 0.02;
        if (time_ok && bubble_ok) {
          std::printf("verdict: the calibrated cost model explains this run: predicted step time within %.1f %% and "
                      "bubble within %.1f %% (%.3f) of the measured ones\n",
                      100 * std::abs(err_t), 100 * std::abs(err_b), std::abs(bubble_want - got_bubble));
        } else {
          std::printf("verdict: the measured step is %.1f %% %s than predicted; ", 100 * std::abs(err_t),
                      err_t < 0 ? "longer" : "shorter");
          if (s.ranks > cores)
            std::printf("%d busy ranks share %d cores, so a rank also waits for a core, which the model does not count "
                        "(--ranks %d gives each rank its own core)\n",
                        s.ranks, cores, cores);
          else if (others > 0.25)
            std::printf("other processes kept %.2f cores busy, so ranks waited for a core, which the model does not count "
                        "(run again on an idle machine)\n",
                        others);
          else if (busy_got > 1.15 * busy_pred)
            std::printf("stage calls took %.1f %% longer than their calibrated medians (a disturbed host, or calls "
                        "that vary from step to step)\n",
                        100 * (busy_got - busy_pred) / busy_pred);
          else
            std::printf("the time outside stage calls is %.3f ms per step more than predicted: hand-offs between ranks "
                        "(thread wake-ups, copies) beyond the ping-pong link cost, or work outside the actions (zeroing%s) "
                        "that varies from step to step; --trace/--svg draw the last step beside its prediction\n",
                        1e3 * ((got - busy_got) - (want - busy_pred)),
                        o.deterministic ? ", folding the weight gradients in order" : "");
        }
      } else {
        std::printf("step time: predicted %.3f ms (calibrated costs), measured: no step after the calibration steps (raise --steps)\n",
                    1e3 * want);
      }
      if (!o.costs_out.empty()) {
        loom::write_cost_file(o.costs_out, model);
        std::printf("cost file: %s\n", o.costs_out.c_str());
      }
    }
  }
  if (!o.trace.empty() || !o.svg.empty()) write_timeline(comm, o, s, p.last_timeline(), calibrated);
  // Deterministic mode folds weight gradients in microbatch order on every schedule (both
  // copies of a two-direction schedule too), so it must equal the reference bit for bit.
  const std::vector<double> worst = v.gather(comm, {v.max_rel_params, v.max_rel_loss});
  const std::int64_t differing = v.gather_bits(comm);
  const bool bitwise = o.deterministic;
  const bool ok = bitwise ? differing == 0 : worst[0] <= 1e-12 && worst[1] <= 1e-12;
  if (root) {
    if (!calibrating)
      std::printf("bubble ratio: predicted %.3f (unit costs: f = b = w, no comm), measured %.3f (mean over %d steps; "
                  "--calibrate N predicts from this machine's costs)\n",
                  predicted, measured_sum / o.steps, o.steps);
    std::printf("reference check (%s): max relative difference params %.3g, loss %.3g; %lld values differ bitwise -> %s\n",
                bitwise ? "bitwise" : "1e-12 relative", worst[0], worst[1], static_cast<long long>(differing),
                ok ? "MATCH" : "DIFFERENT");
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"loom quickstart: pipelined training of a small MLP, checked against a single-rank reference"};
  // An option given twice takes its last value, so a script's defaults can come first and the
  // user's options after them (scripts/main.sh).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--schedule", o.schedule, "schedule family (loom list)");
  app.add_option("--ranks", o.ranks, "pipeline ranks (threads backend; MPI uses the process count)")->check(CLI::PositiveNumber);
  app.add_option("--microbatches", o.microbatches, "microbatches per step")->check(CLI::PositiveNumber);
  app.add_option("--chunks", o.chunks, "model chunks per rank (0: the family's default)")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps,
                 "training steps (an asynchronous family, e.g. pipedream or pipedream-2bw, runs them in one run without a flush)")
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", o.backend, "threads or mpi")->check(CLI::IsMember({"threads", "mpi"}));
  app.add_option("--width", o.width, "hidden features of the MLP")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "layers of the MLP")->check(CLI::PositiveNumber);
  app.add_option("--samples", o.samples, "samples per microbatch")->check(CLI::PositiveNumber);
  app.add_option("--calibrate", o.calibrate,
                 "calibrate on steps 1..N, then print the step time predicted from the calibrated costs beside the "
                 "measured mean of the remaining steps (an asynchronous family: on N runs after a warm-up run; 0: on the warm-up run)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--runs", o.runs, "an asynchronous family: measured runs after the calibration, their mean bubble and run time reported")
      ->check(CLI::PositiveNumber);
  app.add_option("--costs-out", o.costs_out, "with --calibrate: write the calibrated cost file (JSON) here");
  app.add_option("--trace", o.trace, "write the last step's measured timeline beside its prediction as a Perfetto trace (JSON) here");
  app.add_option("--svg", o.svg, "write the last step's measured timeline above its prediction as an SVG picture here");
  app.add_flag("--deterministic,!--no-deterministic", o.deterministic, "fold weight gradients in microbatch order (bitwise reproducible)");
  CLI11_PARSE(app, argc, argv);

  try {
    auto const& family = loom::default_registry().at(o.schedule);
    if (!family.multi_step && o.runs != 1)
      throw loom::config_error("--runs counts the measured runs of an asynchronous family; " + family.name +
                               " is synchronous: its steps are measured one by one (--steps, --calibrate)");
    const int run_steps = family.multi_step ? o.steps : 1;
    if (o.backend == "threads") {
      loom::schedule s = family.make({o.ranks, o.microbatches, o.chunks, run_steps});
      std::cout << "loom quickstart: " << s.name << ", " << s.ranks << " ranks (threads), " << s.step_microbatches()
                << " microbatches, " << s.stages << " virtual stages, " << o.steps << " steps"
                << (o.deterministic ? ", deterministic" : "") << "\n";
      const int cores = o.cores = usable_cores();
      if (o.ranks > cores)
        std::cout << "note: " << o.ranks << " rank threads on " << cores << " cores: the ranks take turns on the cores, "
                  << "so measured times include waiting for a core (no cost model predicts that; --ranks " << cores
                  << " gives each rank its own core)\n";
      else
        std::cout << "cores: " << cores << " available, " << o.ranks << " rank threads: each rank has a core of its own\n";
      int rc = 0;
      loom::run_threads(o.ranks, [&](loom::threads::comm& c) {
        int r = train(c, o, s);
        if (c.rank() == 0) rc = r;
      });
      return rc;
    }
#if defined(LOOM_HAS_MPI)
    loom::mpi::environment env(argc, argv);
    int rc = 0;
    loom::run_mpi([&](loom::mpi::comm& c) {
      loom::schedule s = family.make({c.size(), o.microbatches, o.chunks, run_steps});
      if (c.rank() == 0)
        std::cout << "loom quickstart: " << s.name << ", " << s.ranks << " ranks (MPI processes), " << s.step_microbatches()
                  << " microbatches, " << s.stages << " virtual stages, " << o.steps << " steps"
                  << (o.deterministic ? ", deterministic" : "") << std::endl;
      // mpiexec may bind each process to one core, so count the host's cores, not this process's.
      o.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
      if (c.rank() == 0 && c.size() > o.cores)
        std::cout << "note: " << c.size() << " processes and " << o.cores << " cores on this host: if they all run "
                  << "here, they take turns on the cores and measured times include waiting for a core" << std::endl;
      rc = train(c, o, s);
    });
    return rc;
#else
    std::cerr << "quickstart: this build has no MPI (install libopenmpi-dev and reconfigure)\n";
    return 2;
#endif
  } catch (const loom::schedule_error& e) {
    std::cerr << "quickstart: " << e.what() << "\n";
    return 2;
  } catch (const loom::config_error& e) {
    std::cerr << "quickstart: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "quickstart: " << e.what() << "\n";
    return 1;
  }
}
