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
// the remaining steps are the measured ones, and the step time simulated from the calibrated
// model is printed beside their mean (see docs/calibration.md).

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/exec/calibrate.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/render/ascii.hpp>
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
  int calibrate = 0;      // calibration steps after the warm-up step (0: no calibration)
  std::string costs_out;  // where to write the calibrated cost file (JSON), if anywhere
};

//! What every rank computes about the run; rank 0 prints it.
struct verdict {
  double max_rel_params = 0;  // largest relative parameter difference to the reference
  std::int64_t differing_bits = 0;
  double max_rel_loss = 0;
};

//! The training loop of one rank, on any communicator. Returns 0 if the result matches.
template <class Comm>
int train(Comm& comm, const options& o, const loom::schedule& s) {
  const bool root = comm.rank() == 0;
  quickstart::mlp_spec m;
  m.widths.assign(static_cast<std::size_t>(std::max(o.layers, s.stages)) + 1, o.width);  // >= 1 layer per stage
  m.widths.front() = 4;
  m.widths.back() = 3;
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
    std::cout << "step  loss                      reference                 bubble(measured)\n";
  }
  verdict v;
  double predicted = loom::simulate(s).bubble_ratio, measured_sum = 0;
  // Calibration: steps 1..N are timed per stage call; the steps after them are the measured ones.
  const bool calibrating = o.calibrate > 0;
  std::vector<loom::action_timing> timings;
  double step_sum = 0;
  int step_count = 0;
  for (int st = 0; st < o.steps; ++st) {
    auto data = quickstart::make_batch(m, o.microbatches, st);
    targets = data.targets;
    if (calibrating) comm.barrier();  // the ranks start each step together, as the simulation does
    auto r = p.step(data.inputs);
    if (calibrating && st >= 1 && st <= o.calibrate) {
      auto all = loom::gather_timings(comm, p.last_timings());
      timings.insert(timings.end(), all.begin(), all.end());
    } else if (calibrating && st > o.calibrate) {
      step_sum += r.makespan;
      ++step_count;
    }
    double want = quickstart::reference_step(m, o.microbatches, data, scale, ref_params, ref_grads);
    double rel = std::abs(r.loss - want) / std::max(std::abs(want), 1e-300);
    v.max_rel_loss = std::max(v.max_rel_loss, rel);
    if (std::memcmp(&r.loss, &want, sizeof(double)) != 0) ++v.differing_bits;
    measured_sum += r.bubble_ratio;
    if (root) std::printf("%4d  %.17g  %.17g  %.3f\n", st, r.loss, want, r.bubble_ratio);
  }
  for (auto& stg : p.stages())
    for (int l = stg.first_layer(); l < stg.last_layer(); ++l) {
      auto w = stg.layer_params(l);
      auto const& ref = ref_params[static_cast<std::size_t>(l)];
      double d = 0, n = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        d = std::max(d, std::abs(w[i] - ref[i]));
        n = std::max(n, std::abs(ref[i]));
        if (std::memcmp(&w[i], &ref[i], sizeof(double)) != 0) ++v.differing_bits;
      }
      v.max_rel_params = std::max(v.max_rel_params, n > 0 ? d / n : d);
    }
  if (calibrating) {
    const auto sizes = loom::gather_stage_sizes(p, comm);
    double msg = 8;
    for (const auto& z : sizes) msg = std::max(msg, z.message_bytes);
    const auto mb = static_cast<std::size_t>(msg);
    const std::vector<std::size_t> link_sizes{8, mb, 2 * mb, 4 * mb};
    const loom::link_cost link = loom::measure_link(comm, link_sizes);
    const loom::cost_model model = loom::calibrate(s, timings, sizes, {.intra = link});
    const double want = loom::simulate(s, model).makespan;
    if (root) {
      std::printf("calibrated costs (median of %d steps, ms):", o.calibrate);
      for (std::size_t i = 0; i < model.stages.size(); ++i)
        std::printf(" s%zu f %.3f b %.3f w %.3f;", i, 1e3 * model.stages[i].f, 1e3 * model.stages[i].b, 1e3 * model.stages[i].w);
      std::printf(" link %.2f us + %.3f ns/B (ping-pong)\n", 1e6 * link.alpha, 1e9 * link.beta);
      if (step_count > 0) {
        const double got = step_sum / step_count;
        std::printf("step time: predicted %.3f ms (calibrated costs), measured %.3f ms (mean of %d steps), error %+.1f %%\n",
                    1e3 * want, 1e3 * got, step_count, 100 * (want - got) / got);
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
  std::vector<double> worst{v.max_rel_params, v.max_rel_loss};
  comm.all_reduce(std::span<double>(worst), loom::reduce_op::max);
  std::vector<std::int64_t> bits{v.differing_bits};
  comm.all_reduce(std::span<std::int64_t>(bits), loom::reduce_op::sum);
  // Deterministic mode folds weight gradients in microbatch order on every schedule (both
  // copies of a two-direction schedule too), so it must equal the reference bit for bit.
  const bool bitwise = o.deterministic;
  const bool ok = bitwise ? bits[0] == 0 : worst[0] <= 1e-12 && worst[1] <= 1e-12;
  if (root) {
    std::printf("bubble ratio: predicted %.3f (f = b = w, no comm), measured %.3f (mean over %d steps)\n",
                predicted, measured_sum / o.steps, o.steps);
    std::printf("reference check (%s): max relative difference params %.3g, loss %.3g; %lld values differ bitwise -> %s\n",
                bitwise ? "bitwise" : "1e-12 relative", worst[0], worst[1], static_cast<long long>(bits[0]),
                ok ? "MATCH" : "DIFFERENT");
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"loom quickstart: pipelined training of a small MLP, checked against a single-rank reference"};
  app.add_option("--schedule", o.schedule, "schedule family (loom list)");
  app.add_option("--ranks", o.ranks, "pipeline ranks (threads backend; MPI uses the process count)")->check(CLI::PositiveNumber);
  app.add_option("--microbatches", o.microbatches, "microbatches per step")->check(CLI::PositiveNumber);
  app.add_option("--chunks", o.chunks, "model chunks per rank (0: the family's default)")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--backend", o.backend, "threads or mpi")->check(CLI::IsMember({"threads", "mpi"}));
  app.add_option("--width", o.width, "hidden features of the MLP")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "layers of the MLP")->check(CLI::PositiveNumber);
  app.add_option("--calibrate", o.calibrate,
                 "calibrate on steps 1..N, then print the step time predicted from the calibrated costs beside the "
                 "measured mean of the remaining steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--costs-out", o.costs_out, "with --calibrate: write the calibrated cost file (JSON) here");
  app.add_flag("--deterministic", o.deterministic, "fold weight gradients in microbatch order (bitwise reproducible)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (o.backend == "threads") {
      loom::schedule s = loom::default_registry().at(o.schedule).make({o.ranks, o.microbatches, o.chunks});
      std::cout << "loom quickstart: " << s.name << ", " << s.ranks << " ranks (threads), " << s.microbatches
                << " microbatches, " << s.stages << " virtual stages, " << o.steps << " steps"
                << (o.deterministic ? ", deterministic" : "") << "\n";
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
      loom::schedule s = loom::default_registry().at(o.schedule).make({c.size(), o.microbatches, o.chunks});
      if (c.rank() == 0)
        std::cout << "loom quickstart: " << s.name << ", " << s.ranks << " ranks (MPI processes), " << s.microbatches
                  << " microbatches, " << s.stages << " virtual stages, " << o.steps << " steps"
                  << (o.deterministic ? ", deterministic" : "") << std::endl;
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
