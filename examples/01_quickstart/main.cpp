// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom quickstart: train a small MLP (double precision) cut into pipeline stages with a schedule
// chosen on the command line, over in-process threads or MPI processes, and check the result
// against the single-rank reference. Exit status: 0 when it matches, 1 when it differs, 2 on a
// bad option or schedule.
//
//   quickstart --schedule zb-h1 --ranks 4 --microbatches 8 --steps 5 --backend threads
//   mpirun -np 4 quickstart --schedule 1f1b --microbatches 8 --backend mpi --deterministic

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <loom/comm/threads.hpp>
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
  for (int st = 0; st < o.steps; ++st) {
    auto data = quickstart::make_batch(m, o.microbatches, st);
    targets = data.targets;
    auto r = p.step(data.inputs);
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
