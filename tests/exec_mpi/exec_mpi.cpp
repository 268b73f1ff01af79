// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The executor under MPI (run by ctest under mpiexec, see CMakeLists.txt). Modes:
//   train    - every registered family, several shapes, deterministic (bitwise) and default
//              (1e-12) against the single-rank reference, and on an even number of processes
//              PipeOffload's offload plans as programs (loom::with_offload); rank 0 prints
//              EXEC-MPI-TRAIN-OK.
//   calibrate - every family's measured steps: timings calibrate a cost model, and each rank's
//              measured timeline runs its program in order; gathered, it renders as a trace (checked
//              against the Trace Event Format's fields, one event per executed action per rank)
//              beside the calibrated prediction; rank 0 prints EXEC-MPI-CALIBRATE-OK.
//   async    - every asynchronous family (pipedream, pipedream-vs, pipedream-2bw,
//              pipelined-backprop), T = 4 steps in one run, against the single-process reference
//              of its rule (bitwise / 1e-12), and the versions each rank holds against the
//              simulator; rank 0 prints EXEC-MPI-ASYNC-OK.
//   vocab    - the vocabulary-parallel families (1f1b-vocab-1/2; v-half-vocab-1/2 on an even
//              number of processes) with loom::vocab_layers, two shapes, both modes: bitwise the
//              single-process reference on the same shards, within 1e-12 of the unsplit layers;
//              rank 0 prints EXEC-MPI-VOCAB-OK.
//   throw    - rank 1's stage throws: every rank must get the pipeline_error naming rank 1, and the
//              retried step must match the reference.
//   mismatch - the last rank holds another schedule: every rank must get the mismatch error.
//   exit     - rank 1 exits inside a stage: every other rank must end with an error within seconds
//              and print EXEC-FAULT-OK.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <loom/comm/mpi.hpp>
#include <loom/exec/calibrate.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/exec/timeline.hpp>
#include <loom/render/measured.hpp>
#include <loom/schedule.hpp>
#include <loom/schedule/offload.hpp>

#include <nlohmann/json.hpp>

#include "../../examples/01_quickstart/mlp.hpp"
#include "../exec/vocab_support.hpp"

namespace {

quickstart::mlp_spec spec_for(int stages) {
  quickstart::mlp_spec m;
  const int L = stages > 6 ? stages : 6;
  m.widths.clear();
  m.widths.push_back(4);
  for (int l = 1; l < L; ++l) m.widths.push_back(3 + (l * 5) % 4);
  m.widths.push_back(3);
  return m;
}

struct trainer {
  loom::mpi::comm& c;
  const loom::schedule& s;
  quickstart::mlp_spec m = spec_for(s.stages);
  std::vector<double> targets;
  loom::pipeline<loom::schedule, quickstart::mlp_stage, loom::mpi::comm> p;
  trainer(loom::mpi::comm& comm, const loom::schedule& sched, loom::pipeline_options o)
      : c(comm), s(sched), p(sched, comm, [this](loom::stage_id id) {
          auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
          return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
        }, o) {}
};

//! Trains `steps` steps; returns the number of values that differ from the reference (bitwise
//! when `bitwise`, else beyond 1e-12 relative), summed over all ranks.
long long train_and_compare(loom::mpi::comm& c, const loom::schedule& s, bool deterministic, int steps) {
  trainer t(c, s, {.deterministic = deterministic});
  std::vector<std::vector<double>> ref_params, ref_grads;
  for (int l = 0; l < t.m.layers(); ++l) ref_params.push_back(quickstart::initial_params(t.m, l));
  const bool bitwise = deterministic;
  long long bad = 0;
  auto differs = [&](double a, double b, double norm) {
    return bitwise ? std::memcmp(&a, &b, sizeof(double)) != 0 : std::abs(a - b) > 1e-12 * norm;
  };
  for (int st = 0; st < steps; ++st) {
    auto data = quickstart::make_batch(t.m, s.microbatches, st);
    t.targets = data.targets;
    double got = t.p.step(data.inputs).loss;
    double want = quickstart::reference_step(t.m, s.microbatches, data, 1.0 / s.microbatches, ref_params, ref_grads);
    if (c.rank() == 0 && differs(got, want, std::abs(want))) ++bad;
  }
  for (auto& stg : t.p.stages())
    for (int l = stg.first_layer(); l < stg.last_layer(); ++l) {
      auto w = stg.layer_params(l);
      auto const& ref = ref_params[static_cast<std::size_t>(l)];
      double norm = 0;
      for (double v : ref) norm = std::max(norm, std::abs(v));
      for (std::size_t i = 0; i < w.size(); ++i) bad += differs(w[i], ref[i], norm) ? 1 : 0;
    }
  std::vector<std::int64_t> total{bad};
  c.all_reduce(std::span<std::int64_t>(total), loom::reduce_op::sum);
  return total[0];
}

int mode_train(loom::mpi::comm& c) {
  const int P = c.size();
  int runs = 0, failures = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    for (int m : {P, 2 * P + 1})
      for (int v : {0, 2}) {
        loom::shape sh = e.resolve({P, m, v});
        if (!e.check(sh).empty()) continue;
        loom::schedule s = e.make(sh);
        for (bool det : {true, false}) {
          long long bad = train_and_compare(c, s, det, 2);
          ++runs;
          if (bad != 0) {
            ++failures;
            if (c.rank() == 0)
              std::printf("MISMATCH %s P=%d m=%d chunks=%d %s: %lld values differ\n", e.name.c_str(), sh.ranks,
                          sh.microbatches, sh.chunks, det ? "deterministic" : "default", bad);
          }
        }
      }
  }
  // PipeOffload's plans as programs (offload and reload actions, host copies on MPI), even P:
  // the reference in both modes means offload on equals offload off.
  int offloaded = 0;
  if (P % 2 == 0)
    for (int m : {2 * P, 3 * P + 1})
      for (int g = (P + 1) / 2; g <= P; ++g) {
        const loom::schedule s = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = P, .microbatches = m, .chunks = 2, .group = g});
        for (int k : {1, 2}) {
          const auto plan = loom::plan_offload(s, {.f = 2, .b = 2, .w = 2}, {.chunks = k, .time = 0.2});
          if (!plan.ok) continue;
          const loom::schedule o = loom::with_offload(s, plan);
          for (bool det : {true, false}) {
            long long bad = train_and_compare(c, o, det, 2);
            ++runs;
            ++offloaded;
            if (bad != 0) {
              ++failures;
              if (c.rank() == 0)
                std::printf("MISMATCH %s offloading %d chunk(s) P=%d m=%d g=%d %s: %lld values differ\n", s.name.c_str(), k, P, m, g,
                            det ? "deterministic" : "default", bad);
            }
          }
        }
      }
  if (c.rank() == 0) {
    std::printf("%d runs (%d with offload), %d mismatches\n", runs, offloaded, failures);
    if (failures == 0 && runs > 10 && (P % 2 != 0 || offloaded >= 4)) std::printf("EXEC-MPI-TRAIN-OK\n");
  }
  return failures == 0 ? 0 : 1;
}

//! The trace of a gathered measured step beside its prediction: valid Trace Event Format (every
//! complete event has a name, a category, numeric pid, tid, ts and dur >= 0), and on process 0
//! ("measured") each rank's events are its program's actions in order.
template <class Fail>
void check_trace(const loom::schedule& s, const std::vector<loom::measured_action>& timeline, const loom::simulation& predicted,
                 const loom::schedule& lowered, Fail&& fail) {
  const auto j = nlohmann::json::parse(loom::render_trace(s, {.actions = timeline, .predicted = &predicted}), nullptr, false);
  if (j.is_discarded() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) return fail(s.name + ": the trace is not JSON");
  std::vector<std::vector<std::string>> names(static_cast<std::size_t>(s.ranks));
  std::size_t predicted_events = 0;
  for (auto const& ev : j["traceEvents"]) {
    if (!ev.contains("ph") || !ev.contains("pid") || !ev.contains("tid") || !ev.contains("name")) return fail(s.name + ": an event lacks a field");
    if (ev["ph"] != "X") continue;
    if (!ev.contains("ts") || !ev["ts"].is_number() || !ev.contains("dur") || !ev["dur"].is_number() ||
        ev["dur"].get<double>() < 0 || !ev.contains("cat"))
      return fail(s.name + ": a complete event lacks ts, dur or cat");
    const int tid = ev["tid"].get<int>();
    if (tid < 0 || tid >= s.ranks) return fail(s.name + ": an event on thread " + std::to_string(tid));
    if (ev["pid"] == 0) names[static_cast<std::size_t>(tid)].push_back(ev["args"]["op"].get<std::string>() + " " +
                                                                      std::to_string(ev["args"]["mb"].get<int>()));
    else ++predicted_events;
  }
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<std::string> want;
    for (auto const& a : loom::expected_timeline(lowered, r)) want.push_back(std::string(loom::to_string(a.kind)) + " " + std::to_string(a.microbatch));
    if (names[static_cast<std::size_t>(r)] != want) fail(s.name + ": rank " + std::to_string(r) + "'s trace events are not its program");
  }
  std::size_t compute = 0;
  for (auto const& prog : s.programs)
    for (auto const& a : prog) compute += loom::is_compute(a.kind);
  if (predicted_events != compute) fail(s.name + ": the predicted process has " + std::to_string(predicted_events) + " events");
}

//! Calibration over MPI, every family that runs on P processes: a measured step records one timing
//! per compute half on every rank, gather_timings hands every rank all of them, calibrate and
//! simulate accept the result, and measure_link gives every rank the same link.
int mode_calibrate(loom::mpi::comm& c) {
  const int P = c.size();
  int runs = 0, failures = 0;
  auto fail = [&](const std::string& what) {
    ++failures;
    std::printf("CALIBRATE-MISMATCH rank %d: %s\n", c.rank(), what.c_str());
  };
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    loom::shape sh = e.resolve({P, 2 * P, 0});
    if (!e.check(sh).empty()) continue;
    const loom::schedule s = e.make(sh);
    trainer t(c, s, {.measure = true});
    std::vector<loom::action_timing> all;
    std::vector<loom::measured_action> timeline;
    for (int st = 0; st < 2; ++st) {
      auto data = quickstart::make_batch(t.m, s.microbatches, st);
      t.targets = data.targets;
      t.p.step(data.inputs);
      std::size_t halves = 0;
      for (const loom::action& a : t.p.lowered().programs[static_cast<std::size_t>(c.rank())])
        halves += a.kind == loom::op::FB ? 2 : loom::is_compute(a.kind) ? 1 : 0;
      if (t.p.last_timings().size() != halves) fail(e.name + ": " + std::to_string(t.p.last_timings().size()) + " timings");
      auto g = loom::gather_timings(c, t.p.last_timings());
      all.insert(all.end(), g.begin(), g.end());
      if (!loom::same_actions(t.p.last_timeline(), loom::expected_timeline(t.p.lowered(), c.rank())))
        fail(e.name + ": the measured timeline is not the rank's program");
      timeline = loom::gather_timeline(c, t.p.last_timeline());
    }
    std::size_t total = 0;
    for (auto const& prog : s.programs)
      for (const loom::action& a : prog) total += a.kind == loom::op::FB ? 2 : loom::is_compute(a.kind) ? 1 : 0;
    if (all.size() != 2 * total) fail(e.name + ": gathered " + std::to_string(all.size()) + " of " + std::to_string(2 * total));
    const std::vector<std::size_t> sizes{8, 1024};
    const loom::link_cost l = loom::measure_link(c, sizes);
    std::vector<double> lo{l.alpha, l.beta}, hi{l.alpha, l.beta};
    c.all_reduce(std::span<double>(lo), loom::reduce_op::min);
    c.all_reduce(std::span<double>(hi), loom::reduce_op::max);
    if (lo != hi) fail(e.name + ": the ranks measured different links");
    const auto model = loom::calibrate(s, all, loom::gather_stage_sizes(t.p, c), {.intra = l});
    const auto predicted = loom::simulate(s, model);
    if (!predicted.ok) fail(e.name + ": the calibrated model does not simulate");
    else check_trace(s, timeline, predicted, t.p.lowered(), fail);
    ++runs;
  }
  std::vector<std::int64_t> tally{failures};
  c.all_reduce(std::span<std::int64_t>(tally), loom::reduce_op::sum);
  if (c.rank() == 0) {
    std::printf("%d families calibrated, %lld failures\n", runs, static_cast<long long>(tally[0]));
    if (tally[0] == 0 && runs > 5) std::printf("EXEC-MPI-CALIBRATE-OK\n");
  }
  return tally[0] == 0 ? 0 : 1;
}

void expect(bool ok, int rank, const std::string& what) {
  std::printf("%s rank %d: %s\n", ok ? "EXEC-FAULT-OK" : "EXEC-FAULT-MISSED", rank, what.c_str());
  std::fflush(stdout);
}

int mode_throw(loom::mpi::comm& c) {
  loom::schedule s = loom::generate(loom::zb_h1{}, {c.size(), 2 * c.size()});
  trainer t(c, s, {.deterministic = true});
  for (auto& st : t.p.stages()) st.fail_on = c.rank() == 1 ? 1 : -1;
  auto data = quickstart::make_batch(t.m, s.microbatches, 0);
  t.targets = data.targets;
  auto t0 = std::chrono::steady_clock::now();
  try {
    t.p.step(data.inputs);
    expect(false, c.rank(), "no error");
  } catch (const loom::pipeline_error& e) {
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect(e.rank() == 1 && std::string(e.what()).find("injected failure") != std::string::npos && sec < 5, c.rank(), e.what());
  }
  for (auto& st : t.p.stages()) st.fail_on = -1;
  double got = t.p.step(data.inputs).loss;
  std::vector<std::vector<double>> rp, rg;
  for (int l = 0; l < t.m.layers(); ++l) rp.push_back(quickstart::initial_params(t.m, l));
  double want = quickstart::reference_step(t.m, s.microbatches, data, 1.0 / s.microbatches, rp, rg);
  expect(std::memcmp(&got, &want, sizeof(double)) == 0, c.rank(), "retried step matches the reference bitwise");
  return 0;
}

int mode_mismatch(loom::mpi::comm& c) {
  const int P = c.size();
  loom::schedule a = loom::generate(loom::gpipe{}, {P, 4}), b = loom::generate(loom::one_f_one_b{}, {P, 4});
  const loom::schedule& mine = c.rank() == P - 1 ? b : a;
  trainer t(c, mine, {});
  auto data = quickstart::make_batch(t.m, 4, 0);
  t.targets = data.targets;
  try {
    t.p.step(data.inputs);
    expect(false, c.rank(), "no error");
  } catch (const loom::pipeline_error& e) {
    expect(e.rank() == P - 1 && std::string(e.what()).find("schedule mismatch") != std::string::npos, c.rank(), e.what());
  }
  return 0;
}


//! A stage that exits the process in the middle of its forward on rank 1.
int mode_exit(loom::mpi::comm& c) {
  c.set_timeout(std::chrono::milliseconds(10000));
  loom::schedule s = loom::generate(loom::one_f_one_b{}, {c.size(), 2 * c.size()});
  trainer t(c, s, {});
  auto data = quickstart::make_batch(t.m, s.microbatches, 0);
  t.targets = data.targets;
  auto t0 = std::chrono::steady_clock::now();
  try {
    // One good step (the handshake is behind us), then rank 1's forward of microbatch 2 ends
    // its process mid-step. A peer may still be completing the first step's final all-reduce
    // when rank 1 leaves, so the error may surface there: both steps are inside the try.
    t.p.step(data.inputs);
    if (c.rank() == 1)
      for (auto& st : t.p.stages()) {
        st.fail_on = 2;
        st.exit_on_fail = true;
      }
    t0 = std::chrono::steady_clock::now();
    t.p.step(data.inputs);
    expect(false, c.rank(), "no error");
  } catch (const loom::pipeline_error& e) {
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect(e.rank() == 1 && sec < 8, c.rank(), std::string(e.what()) + " after " + std::to_string(sec) + " s");
  }
  return 0;
}

}  // namespace

//! Every asynchronous family on this many processes: one run of T steps against the reference
//! of its rule (see the file comment).
int mode_async(loom::mpi::comm& c) {
  const int P = c.size(), T = 4;
  int runs = 0;
  long long bad = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (!e.multi_step) continue;
    for (int mb : {P, P + 1})
      for (bool det : {true, false}) {
        const loom::shape sh{.ranks = P, .microbatches = mb, .chunks = 0, .steps = T};
        if (!e.check(e.resolve(sh)).empty()) continue;
        const loom::schedule s = e.make(sh);
        const auto m = spec_for(s.stages);
        const quickstart::batch data = quickstart::make_run_batch(m, mb, T);
        const std::vector<double>& inputs = data.inputs;
        const std::vector<double>& targets = data.targets;
        loom::pipeline p(s, c, [&](loom::stage_id id) {
          auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
          return quickstart::mlp_stage(m, a, b, id.stage == s.stages - 1, &targets);
        }, {.deterministic = det});
        p.step(inputs);
        std::vector<std::vector<double>> ref_params;
        const quickstart::async_rule rule{.family = s.name, .p = P, .m = mb, .N = s.microbatches};
        const auto ref_losses = quickstart::reference_asynchronous(m, rule, mb, T, 1.0 / mb, ref_params);
        auto differs = [&](double a, double b, double norm) {
          return det ? std::memcmp(&a, &b, sizeof(double)) != 0 : std::abs(a - b) > 1e-12 * norm;
        };
        long long here = 0;
        if (c.rank() == 0)
          for (int t = 0; t < T; ++t) {
            double sum = 0;
            for (int i = 0; i < mb; ++i) sum += p.microbatch_losses()[static_cast<std::size_t>(t * mb + i)];
            here += differs(sum * (1.0 / mb), ref_losses[static_cast<std::size_t>(t)], std::abs(ref_losses[static_cast<std::size_t>(t)]));
          }
        for (auto& stg : p.stages())
          for (int l = stg.first_layer(); l < stg.last_layer(); ++l) {
            auto w = stg.layer_params(l);
            auto const& ref = ref_params[static_cast<std::size_t>(l)];
            double norm = 0;
            for (double v : ref) norm = std::max(norm, std::abs(v));
            for (std::size_t i = 0; i < w.size(); ++i) here += differs(w[i], ref[i], norm) ? 1 : 0;
          }
        const auto sim = loom::simulate(s);
        if (p.versions_held(0) != static_cast<int>(sim.weight_copies[static_cast<std::size_t>(c.rank())])) {
          std::printf("ASYNC-MISMATCH %s rank %d holds %d versions, the simulator says %g\n", s.name.c_str(), c.rank(),
                      p.versions_held(0), sim.weight_copies[static_cast<std::size_t>(c.rank())]);
          ++here;
        }
        if (here != 0) std::printf("ASYNC-MISMATCH %s m=%d %s: %lld values differ on rank %d\n", s.name.c_str(), mb,
                                   det ? "deterministic" : "default", here, c.rank());
        bad += here;
        ++runs;
      }
  }
  std::vector<std::int64_t> total{bad};
  c.all_reduce(std::span<std::int64_t>(total), loom::reduce_op::sum);
  if (c.rank() == 0) {
    std::printf("%d asynchronous runs, %lld mismatches\n", runs, static_cast<long long>(total[0]));
    if (total[0] == 0 && runs >= 12) std::printf("EXEC-MPI-ASYNC-OK\n");
  }
  return total[0] == 0 ? 0 : 1;
}

int mode_vocab(loom::mpi::comm& c) {
  using namespace vocab_test;
  const int p = c.size();
  long long bad = 0;
  int runs = 0;
  for (const auto& f : families) {
    if (f.name[0] == 'v' && p % 2 != 0) continue;  // V-Half with vocabulary parallelism needs an even p
    for (int m : {p + 2, 2 * p + 1}) {
      model md;
      const loom::schedule s = f.make(p, m);
      md.stages = s.stages;
      md.layers_per_stage = s.stages == p ? 2 : 1;
      const auto ids = md.tokens(m, 21 + static_cast<unsigned>(m)), targets = md.tokens(m, 22 + static_cast<unsigned>(m));
      const result same = reference(md, p, f.algorithm, m, ids, targets), unsplit = reference(md, 1, 1, m, ids, targets);
      for (bool det : {true, false}) {
        result got = run_rank(c, md, s, ids, targets, {.deterministic = det}, 2);
        auto sum = [&](vec& v) { c.all_reduce(std::span<double>(v), loom::reduce_op::sum); };  // the ranks' parts: zeros elsewhere
        sum(got.out_grad);
        sum(got.in_grad);
        for (auto& g : got.stage_grads) sum(g);
        long long here = 0;
        here += std::memcmp(&got.loss, &same.loss, sizeof(double)) != 0;
        here += !same_bits(got.out_grad, same.out_grad) + !same_bits(got.in_grad, same.in_grad);
        here += std::abs(got.loss - unsplit.loss) > 1e-12 * std::abs(unsplit.loss);
        here += (rel(got.out_grad, unsplit.out_grad) > 1e-12) + (rel(got.in_grad, unsplit.in_grad) > 1e-12);
        for (std::size_t k = 0; k < got.stage_grads.size(); ++k)
          here += !same_bits(got.stage_grads[k], same.stage_grads[k]) + (rel(got.stage_grads[k], unsplit.stage_grads[k]) > 1e-12);
        if (here != 0) std::printf("VOCAB-MISMATCH %s m=%d %s: %lld checks fail on rank %d\n", f.name, m, det ? "deterministic" : "default", here, c.rank());
        bad += here;
        ++runs;
      }
    }
  }
  std::vector<std::int64_t> total{bad};
  c.all_reduce(std::span<std::int64_t>(total), loom::reduce_op::sum);
  if (c.rank() == 0) {
    std::printf("%d vocabulary-parallel runs, %lld mismatches\n", runs, static_cast<long long>(total[0]));
    if (total[0] == 0 && runs >= 4) std::printf("EXEC-MPI-VOCAB-OK\n");
  }
  return total[0] == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  loom::mpi::environment env(argc, argv);
  auto c = loom::mpi::comm::world();
  c.set_timeout(std::chrono::milliseconds(20000));
  std::string mode = argc > 1 ? argv[1] : "train";
  if (mode == "train") return mode_train(c);
  if (mode == "async") return mode_async(c);
  if (mode == "vocab") return mode_vocab(c);
  if (mode == "throw") return mode_throw(c);
  if (mode == "calibrate") return mode_calibrate(c);
  if (mode == "mismatch") return mode_mismatch(c);
  if (mode == "exit") return mode_exit(c);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
