// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom CUDA MLP: the quickstart's MLP in fp32 with CUDA stage kernels, pipelined with any
// registered schedule over loom::cuda_local (every rank a set of streams on one GPU) or
// loom::nccl (one GPU per rank), eagerly or replayed from a CUDA graph, and checked against a
// single-rank CPU reference that performs the same fp32 arithmetic. Built twice: against a GPU
// (cuda_mlp_gpu) and against loom's CUDA simulator (cuda_mlp), where it runs on any machine.
// Exit status: 0 when it matches the reference (bitwise in deterministic mode, else within 1e-5
// relative), 1 when it differs, 2 on a bad option or schedule.
//
//   cuda_mlp --schedule zb-h1 --ranks 4 --microbatches 8 --backend cuda_local --deterministic
//   cuda_mlp --schedule dualpipe-v --ranks 4 --microbatches 8 --backend nccl --graph
//   mpirun -np 4 cuda_mlp_gpu --backend nccl --launch mpi --schedule 1f1b
//   cuda_mlp --schedule zb-h1 --ranks 4 --trace step.json --svg step.svg   (the last step, measured)

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include <loom/comm/cuda_local.hpp>
#include <loom/comm/nccl.hpp>
#include <loom/cuda/device.hpp>
#include <loom/exec/data_parallel.hpp>
#include <loom/exec/memory.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/exec/timeline.hpp>
#include <loom/mesh/mesh_comm.hpp>
#include <loom/render/measured.hpp>
#include <loom/schedule.hpp>
#if defined(LOOM_HAS_MPI)
#include <loom/comm/mpi.hpp>
#include <loom/comm/nccl_mpi.hpp>
#endif
#if defined(LOOM_CUDA_SIM)
#include <loom/cudasim/sim.hpp>
#endif

#include "reference.hpp"
#include "stage.hpp"

namespace {

struct options {
  std::string schedule = "1f1b";
  int ranks = 4;
  int microbatches = 8;
  int chunks = 0;
  int steps = 3;
  std::string backend = "cuda_local";
  std::string launch = "threads";
  bool deterministic = false;
  bool graph = false;
  bool block_reductions = false;
  bool measure = false;
  bool no_reference = false;
  int width = 16;
  int layers = 9;
  int samples = 4;
  long long seed = 1;
  int dp = 1;              // data-parallel replicas (a dp x pp mesh with loom::data_parallel)
  bool dp_after = false;   // reduce every bucket after the step instead of during it (for comparison)
  int zero_stage = 0;      // with --dp: ZeRO stage 0..3 of loom::data_parallel
  std::string optimizer = "sgd";  // with --dp: sgd or adam
  double adam_lr = 0.01;   // Adam's learning rate
  int local_steps = 0;     // with --dp: local SGD, parameters averaged every H steps
  bool one_shot = false;   // with --local-steps: averaged once, after the last step
  std::string trace, svg;  // where to write the last step's measured timeline (implies measure)
};

//! Writes the last step's measured timeline (every rank's, gathered) as a Perfetto trace and an
//! SVG, above the schedule's prediction at unit costs scaled to the measured mean stage call (a
//! cost model calibrated on the device would replace the scale; calibration is host-only today).
template <class Comm>
void write_timeline(Comm& comm, const options& o, const loom::schedule& s, std::span<const loom::measured_action> mine, bool writer) {
  auto all = loom::gather_timeline(comm, mine);
  if (comm.rank() != 0 || !writer) return;
  if (all.empty()) {
    std::printf("timeline: none (the last step was a graph replay, one launch; run without --graph to draw it)\n");
    return;
  }
  const auto sim = loom::simulate(s);
  const loom::measured_step step{.actions = all, .predicted = &sim, .seconds_per_unit = loom::seconds_per_unit_matching(s, sim, all)};
  auto write = [](const std::string& path, const std::string& text, const char* what) {
    std::ofstream f(path, std::ios::binary);
    if (!f || !(f << text) || !f.flush()) {  // said, not thrown: the other ranks are in the step's collectives
      std::fprintf(stderr, "cuda_mlp: cannot write the %s to %s\n", what, path.c_str());
      return;
    }
    std::printf("%s of the last step (device time per rank, above the unit-cost prediction scaled to the measured mean "
                "stage call): %s\n", what, path.c_str());
  };
  if (!o.trace.empty()) write(o.trace, loom::render_trace(s, step), "Perfetto trace");
  if (!o.svg.empty()) write(o.svg, loom::render_svg(s, step), "SVG timeline");
}

//! What a rank found: the largest relative differences and the count of differing values.
struct verdict {
  double params = 0, loss = 0;
  std::int64_t differing = 0;
  std::size_t held = 0, stage_params = 0;  //!< with --dp: rank 0's parameters_held() after the last step, and its stages' parameters
  std::size_t predicted_bytes = 0;  //!< with --dp: rank 0's device memory after the last step by loom's formulas
  std::size_t measured_bytes = 0;   //!< the same by the simulator's accounting (0 on a GPU)
};

//! The CUDA MLP's stage without its own update, for `--dp`: the reducer's optimizer updates it.
struct dp_stage : cuda_mlp::stage {
  using cuda_mlp::stage::stage;
  void update() = delete;
};

//! The batch of data-parallel replica `replica` at step `step` (replica 0's is the plain run's).
cuda_mlp::batch batch_of(const options& o, const quickstart::mlp_spec& m, int step, int replica) {
  return cuda_mlp::float_batch(m, o.microbatches, step * o.dp + replica);
}

//! The training loop of one rank: the pipeline over `pp` (the world, or its mesh's pp group), with
//! `sync` (a `loom::data_parallel`, or null) as its observer; returns the world's verdict.
template <class Stage, class World, class PpComm, class Sync>
verdict train_on(World& world, PpComm& pp, Sync* sync, int replica, const options& o, const loom::schedule& s,
                 const quickstart::mlp_spec& m, const cuda_mlp::reference& ref) {
  const bool root = world.rank() == 0;
  const std::size_t in0 = static_cast<std::size_t>(m.samples) * m.width(0), fin = static_cast<std::size_t>(m.samples) * m.width(m.layers());
  loom::cuda::device_buffer<float> inputs(static_cast<std::size_t>(o.microbatches) * in0), targets(static_cast<std::size_t>(o.microbatches) * fin);
  loom::step_observer* observer = nullptr;
  if constexpr (!std::is_same_v<Sync, std::nullptr_t>) observer = sync;
#if defined(LOOM_CUDA_SIM)
  const std::size_t mem_before = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).current;
#endif
  loom::pipeline p(s, pp, [&](loom::stage_id id) {
    auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
    return Stage(m, a, b, id.stage == s.stages - 1, targets.data(), o.block_reductions && !o.deterministic);
  }, {.deterministic = o.deterministic, .measure = o.measure || !o.trace.empty() || !o.svg.empty(), .graph = o.graph, .observer = observer});
  if constexpr (!std::is_same_v<Sync, std::nullptr_t>) sync->attach(p);
  verdict v;
  for (int st = 0; st < o.steps; ++st) {
    auto data = batch_of(o, m, st, replica);
    loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
    loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
    auto r = p.step(std::span<const float>(inputs.span()));
    if (o.measure && root) {
      if (o.graph)  // the first step captures the graph, then replays it like the others
        std::printf("      step %.6f s, host issue %.6f s (a graph %s: stage calls are not timed)\n", r.seconds, r.host_seconds,
                    st == 0 ? "capture and replay" : "replay");
      else
        std::printf("      step %.6f s, host issue %.6f s, device busy %.6f s (rank 0), all ranks busy %.6f s -> %.1f%% busy\n",
                    r.seconds, r.host_seconds, r.busy_seconds, r.busy_sum, 100.0 * r.busy_sum / (s.ranks * r.makespan));
    }
    if constexpr (!std::is_same_v<Sync, std::nullptr_t>)
      if (o.measure) {  // summed over the world's ranks
        const auto ov = sync->overlap();
        std::vector<double> t{ov.reduce_seconds, ov.exposed_seconds};
        world.all_reduce(std::span<double>(t), loom::reduce_op::sum);
        const loom::reduction_overlap all{.reduce_seconds = t[0], .exposed_seconds = t[1], .buckets = ov.buckets};
        if (root)
          std::printf("      dp gradient reductions %.3f ms (all ranks' buckets), %.3f ms of it after the pipeline's work -> %.1f%% hidden%s\n",
                      1e3 * all.reduce_seconds, 1e3 * all.exposed_seconds, 100.0 * all.hidden(), o.dp_after ? " (--sync-after-step)" : "");
      }
    if (o.no_reference || replica != 0) continue;  // the reference's loss is replica 0's
    const double want = ref.losses[static_cast<std::size_t>(st)];
    v.loss = std::max(v.loss, std::abs(r.loss - want) / std::max(std::abs(want), 1e-300));
    if (std::memcmp(&r.loss, &want, sizeof(double)) != 0) ++v.differing;
    if (root) std::printf("%4d  %.17g  %.17g\n", st, r.loss, want);
  }
  std::size_t held = 0, stage_params = 0, predicted = 0, measured = 0;
  if constexpr (!std::is_same_v<Sync, std::nullptr_t>) {
    // Device memory between steps by loom's formulas: the pipeline's buffers and channels, the
    // stages' parameters and gradients (ZeRO-3: gradients only), the reducer's buffers.
    const auto dm = sync->memory();
    std::size_t channel_bytes = 0;
    if constexpr (requires { PpComm::channel_bytes; }) channel_bytes = PpComm::channel_bytes;
    else if constexpr (requires { World::channel_bytes; }) channel_bytes = World::channel_bytes;
    predicted = loom::pipeline_device_bytes(
                    s, pp.rank(),
                    [&](loom::stage_id id) {
                      auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
                      Stage probe(m, a, b, id.stage == s.stages - 1, nullptr);
                      return loom::stage_sizes{probe.input_size(), probe.output_size(), probe.stash_size(), probe.weight_grad().size()};
                    },
                    o.deterministic, sizeof(float), channel_bytes) +
                dm.between_steps() - dm.released;
    for (auto& stg : p.stages()) predicted += 2 * stg.weight_grad().size() * sizeof(float);
#if defined(LOOM_CUDA_SIM)
    LOOM_CUDA_TRY(cudaDeviceSynchronize());  // ZeRO-3 frees the stages' parameters in stream order
    measured = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).current - mem_before;
#endif
    held = sync->parameters_held();  // before finish(), which gathers ZeRO-3's parameters
    for (auto& stg : p.stages()) stage_params += stg.weight_grad().size();
    sync->finish();
  }
  if (!o.trace.empty() || !o.svg.empty()) write_timeline(pp, o, s, p.last_timeline(), replica == 0);  // replica 0's pipeline
  for (auto& stg : p.stages())
    for (int l = stg.first_layer(); l < stg.last_layer() && !o.no_reference; ++l) {
      auto w = stg.layer_params(l);
      auto const& want = ref.params[static_cast<std::size_t>(l)];
      double d = 0, n = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        d = std::max(d, static_cast<double>(std::abs(w[i] - want[i])));
        n = std::max(n, static_cast<double>(std::abs(want[i])));
        if (std::memcmp(&w[i], &want[i], sizeof(float)) != 0) ++v.differing;
      }
      v.params = std::max(v.params, n > 0 ? d / n : d);
    }
  std::vector<double> worst{v.params, v.loss};
  world.all_reduce(std::span<double>(worst), loom::reduce_op::max);
  std::vector<std::int64_t> diff{v.differing};
  world.all_reduce(std::span<std::int64_t>(diff), loom::reduce_op::sum);
  return {worst[0], worst[1], diff[0], held, stage_params, predicted, measured};
}

//! One rank's training over a device world: the plain pipeline, or with `--dp` a dp x pp mesh
//! over it whose replicas' gradients `loom::data_parallel` reduces on the device.
template <class Comm>
verdict train(Comm& world, const options& o, const loom::schedule& s, const quickstart::mlp_spec& m,
              const std::vector<cuda_mlp::reference>& refs) {
  if (o.dp == 1) return train_on<cuda_mlp::stage>(world, world, static_cast<std::nullptr_t*>(nullptr), 0, o, s, m, refs[0]);
  loom::mesh_comm g(loom::mesh<loom::dp<>, loom::pp<>>{loom::dp<>{o.dp}, loom::pp<>{s.ranks}}, world);
  auto with = [&](auto optimizer) {
    loom::data_parallel<decltype(g), dp_stage, decltype(optimizer)> sync(
        g, {.zero_stage = o.zero_stage, .local_steps = o.local_steps, .one_shot = o.one_shot, .deterministic = o.deterministic,
            .eager = !o.dp_after, .grad_scale = o.local_steps > 0 ? 1.0 : 1.0 / o.dp, .measure = o.measure},
        optimizer);
    const int replica = g.coord(loom::dim::dp);
    auto v = train_on<dp_stage>(world, g.pp(), &sync, replica, o, s, m, refs[refs.size() == 1 ? 0 : static_cast<std::size_t>(replica)]);
    if (world.rank() == 0 && o.zero_stage > 0)
      std::printf("ZeRO stage %d: rank 0 held %zu parameter elements after the last step, for its stages' %zu\n", o.zero_stage,
                  v.held, v.stage_params);
    if (world.rank() == 0) {
      if (loom::cuda::simulated())
        std::printf("device memory of rank 0 between steps: %zu bytes predicted (loom::pipeline_device_bytes + stages + data_parallel::memory()), "
                    "%zu bytes in the simulator's accounting -> %s\n",
                    v.predicted_bytes, v.measured_bytes, v.predicted_bytes == v.measured_bytes ? "EQUAL" : "DIFFERENT");
      else
        std::printf("device memory of rank 0 between steps: %zu bytes predicted (loom::pipeline_device_bytes + stages + data_parallel::memory())\n",
                    v.predicted_bytes);
    }
    return v;
  };
  if (o.optimizer == "adam") return with(loom::adam<float>{.lr = o.adam_lr});
  return with(loom::sgd{.lr = m.lr});
}

int report(const options& o, const verdict& v) {
  if (o.no_reference) {
    std::printf("reference check: skipped (--no-reference)\n");
    return 0;
  }
  const bool ok = o.deterministic ? v.differing == 0 : v.params <= 1e-5 && v.loss <= 1e-5;
  std::printf("reference check (%s): max relative difference params %.3g, loss %.3g; %lld values differ bitwise -> %s\n",
              o.deterministic ? "bitwise" : "1e-5 relative", v.params, v.loss, static_cast<long long>(v.differing),
              ok ? "MATCH" : "DIFFERENT");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"loom CUDA MLP: pipelined fp32 training with CUDA stage kernels, checked against a CPU reference"};
  app.add_option("--schedule", o.schedule, "schedule family (loom list)");
  app.add_option("--ranks", o.ranks, "pipeline ranks (threads launch; env/mpi use the process count)")->check(CLI::Range(1, 64));
  app.add_option("--microbatches", o.microbatches, "microbatches per step")->check(CLI::Range(1, 4096));
  app.add_option("--chunks", o.chunks, "model chunks per rank (0: the family's default)")->check(CLI::Range(0, 64));
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 100000));
  app.add_option("--backend", o.backend, "cuda_local (one GPU) or nccl (a GPU per rank)")->check(CLI::IsMember({"cuda_local", "nccl"}));
  app.add_option("--launch", o.launch, "nccl ranks: threads of this process, or processes (env: RANK/WORLD_SIZE/LOCAL_RANK/LOOM_NCCL_ID_FILE; mpi: mpirun)")
      ->check(CLI::IsMember({"threads", "env", "mpi"}));
  app.add_flag("--deterministic", o.deterministic, "fold weight gradients in microbatch order (bitwise equal to the reference)");
  app.add_flag("--graph", o.graph, "capture the step once and replay it as a CUDA graph");
  app.add_flag("--block-reductions", o.block_reductions, "GPU, default mode: bias gradients by CUB block reductions");
  app.add_flag("--no-reference", o.no_reference, "skip the CPU reference (large models, timing runs)");
  app.add_flag("--measure", o.measure, "time every stage call on the device (events) and print the busy fraction per step");
  app.add_option("--width", o.width, "hidden features")->check(CLI::Range(1, 1 << 16));
  app.add_option("--layers", o.layers, "layers (raised to the number of virtual stages if smaller)")->check(CLI::Range(1, 4096));
  app.add_option("--samples", o.samples, "samples per microbatch")->check(CLI::Range(1, 1 << 16));
  app.add_option("--seed", o.seed, "simulator: seed of the operation order and delays")->check(CLI::NonNegativeNumber);
  app.add_option("--dp", o.dp, "data-parallel replicas: a dp x pp mesh of dp * ranks ranks, gradients reduced by loom::data_parallel")
      ->check(CLI::Range(1, 64));
  app.add_option("--zero-stage", o.zero_stage, "with --dp: ZeRO stage 0 none, 1 optimizer state, 2 and gradients, 3 and parameters")
      ->check(CLI::Range(0, 3));
  app.add_option("--optimizer", o.optimizer, "with --dp: sgd or adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--adam-lr", o.adam_lr, "Adam's learning rate (default 0.01)")->check(CLI::PositiveNumber);
  app.add_option("--local-steps", o.local_steps, "with --dp: local SGD, replicas average their parameters every H steps (0: synchronous)");
  app.add_flag("--one-shot", o.one_shot, "with --local-steps: average once, after the last step");
  app.add_flag("--sync-after-step", o.dp_after, "with --dp: reduce every bucket after the step instead of while the pipeline runs");
  app.add_option("--trace", o.trace, "write the last step's measured timeline as a Perfetto trace (JSON) here (implies --measure)");
  app.add_option("--svg", o.svg, "write the last step's measured timeline as an SVG here (implies --measure)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "cuda_mlp: " << e.what() << "\n";
    return 2;
  }
#if defined(LOOM_CUDA_SIM)
  loom::cudasim::reseed(static_cast<std::uint64_t>(o.seed));
#endif
  try {
    if (o.backend == "cuda_local" && o.launch != "threads") throw loom::config_error("--launch " + o.launch + " needs --backend nccl");
    if (o.dp > 1 && o.launch != "threads") throw loom::config_error("--dp needs --launch threads");
    if (o.dp > 1 && o.graph) throw loom::config_error("--dp and --graph: data_parallel does not run in graph mode");
    if (o.dp_after && o.dp == 1) throw loom::config_error("--sync-after-step needs --dp 2 or more");
    if (o.local_steps < 0) throw loom::config_error("--local-steps " + std::to_string(o.local_steps) + " is negative");
    if (o.one_shot && o.local_steps == 0) throw loom::config_error("--one-shot needs --local-steps H");
    if ((o.zero_stage > 0 || o.optimizer != "sgd" || o.local_steps > 0) && o.dp == 1)
      throw loom::config_error("--zero-stage and --optimizer are loom::data_parallel's: they need --dp 2 or more");
    auto avail = loom::cuda::available();
    if (!avail) {
      std::cerr << "cuda_mlp: no usable CUDA device: " << avail.why << " (build against loom's simulator to run without a GPU)\n";
      return 2;
    }
    if (loom::default_registry().at(o.schedule).multi_step)
      throw loom::config_error("--schedule " + o.schedule +
                               " is asynchronous (weight versions across steps): this example checks synchronous steps against "
                               "its reference; tests/cuda_layer/device_asynchronous_test.cpp runs the asynchronous families on devices");
    auto make = [&](int ranks) { return loom::default_registry().at(o.schedule).make({ranks, o.microbatches, o.chunks}); };
    auto describe = [&](const loom::schedule& s, const char* where) {
      std::printf("loom cuda_mlp: %s, %d ranks (%s), %d microbatches, %d virtual stages, %d steps%s%s%s\n", s.name.c_str(), s.ranks, where,
                  s.microbatches, s.stages, o.steps, o.deterministic ? ", deterministic" : "", o.graph ? ", CUDA graph" : "",
                  loom::cuda::simulated() ? ", loom CUDA simulator" : "");
      std::printf("step  loss                      reference\n");
    };
    auto spec_for = [&](const loom::schedule& s) {
      quickstart::mlp_spec m;
      m.widths.assign(static_cast<std::size_t>(std::max(o.layers, s.stages)) + 1, o.width);
      m.widths.front() = 4;
      m.widths.back() = 3;
      m.samples = o.samples;
      return m;
    };
    // The reference: one model (synchronous), or with --local-steps the replicas one after another,
    // each its own model, averaged in replica order as loom::data_parallel averages.
    auto reference_for = [&](const loom::schedule& s, const quickstart::mlp_spec& m) {
      std::vector<cuda_mlp::reference> refs(o.local_steps > 0 ? static_cast<std::size_t>(o.dp) : 1, cuda_mlp::reference(m));
      const double scale = 1.0 / o.microbatches;
      const loom::adam<float> adam{.lr = o.adam_lr};
      const loom::adam<float>* with = o.optimizer == "adam" ? &adam : nullptr;
      for (int st = 0; st < o.steps && !o.no_reference; ++st) {
        if (o.dp == 1) {
          refs[0].step(m, o.microbatches, batch_of(o, m, st, 0), scale);
          continue;
        }
        if (o.local_steps > 0) {
          for (int d = 0; d < o.dp; ++d)
            refs[static_cast<std::size_t>(d)].data_parallel_step(m, o.microbatches, {batch_of(o, m, st, d)}, scale, 1.0f, with);
          if ((!o.one_shot && (st + 1) % o.local_steps == 0) || (o.one_shot && st + 1 == o.steps)) cuda_mlp::reference::average(refs);
          continue;
        }
        std::vector<cuda_mlp::batch> replicas;
        for (int d = 0; d < o.dp; ++d) replicas.push_back(batch_of(o, m, st, d));
        refs[0].data_parallel_step(m, o.microbatches, replicas, scale, static_cast<float>(1.0 / o.dp), with);
      }
      (void)s;
      return refs;
    };
    if (o.launch == "threads") {
      loom::schedule s = make(o.ranks);
      auto m = spec_for(s);
      auto ref = reference_for(s, m);
      const int world = o.dp * o.ranks;
      if (o.backend == "nccl" && world > avail.devices)
        throw loom::config_error("--backend nccl needs a device per rank: " + std::to_string(world) + " ranks, " +
                                 std::to_string(avail.devices) + " device(s)");
      describe(s, o.backend == "nccl" ? "NCCL, threads" : "cuda_local");
      if (o.dp > 1)
        std::printf("mesh dp%d x pp%d: %d ranks, replica d trains on its own batch; loom::data_parallel reduces the gradients%s; %s%s\n", o.dp,
                    o.ranks, world, o.dp_after ? " after each step" : " while the pipeline runs", o.optimizer.c_str(),
                    o.zero_stage > 0 ? (", ZeRO stage " + std::to_string(o.zero_stage)).c_str() : "");
      verdict v;
      std::mutex mu;
      auto body = [&](auto& c) {
        auto r = train(c, o, s, m, ref);
        std::lock_guard lk(mu);
        if (c.rank() == 0) v = r;
      };
      if (o.backend == "cuda_local") loom::cuda_local::run(world, body);
      else loom::nccl::run(world, body);
      return report(o, v);
    }
    if (o.launch == "env") {
      auto c = loom::nccl::from_env();
      loom::schedule s = make(c.size());
      auto m = spec_for(s);
      auto ref = reference_for(s, m);
      if (c.rank() == 0) describe(s, "NCCL, processes from the environment");
      auto v = train(c, o, s, m, ref);
      return c.rank() == 0 ? report(o, v) : (o.deterministic ? v.differing == 0 : v.params <= 1e-5 && v.loss <= 1e-5) ? 0 : 1;
    }
#if defined(LOOM_HAS_MPI)
    loom::mpi::environment env(argc, argv);
    auto c = loom::nccl::from_mpi(MPI_COMM_WORLD);
    loom::schedule s = make(c.size());
    auto m = spec_for(s);
    auto ref = reference_for(s, m);
    if (c.rank() == 0) describe(s, "NCCL, MPI processes");
    auto v = train(c, o, s, m, ref);
    return c.rank() == 0 ? report(o, v) : (o.deterministic ? v.differing == 0 : v.params <= 1e-5 && v.loss <= 1e-5) ? 0 : 1;
#else
    std::cerr << "cuda_mlp: this build has no MPI (install libopenmpi-dev and reconfigure)\n";
    return 2;
#endif
  } catch (const loom::schedule_error& e) {
    std::cerr << "cuda_mlp: " << e.what() << "\n";
    return 2;
  } catch (const loom::config_error& e) {
    std::cerr << "cuda_mlp: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cuda_mlp: " << e.what() << "\n";
    return 1;
  }
}
