// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom mesh example: a small transformer trained on a dp x pp x sp x tp mesh (layers sharded over
// tp and sp, blocks pipelined over pp by any registered schedule, replicated over dp), over
// threads or MPI processes, checked against the single-rank reference; prints what each mesh
// dimension communicated in each step. With --backend cuda_local or nccl the transformer runs in
// fp32 as device kernels on each rank's streams (under loom's CUDA simulator in `mesh`, on a GPU
// in `mesh_gpu`), checked against the float reference of the same kernels and against the double
// one within a bound. Exit status: 0 when the result equals the reference (bitwise with
// --deterministic; otherwise within 1e-12 relative, 1e-9 with Adam; fp32: 1e-5, Adam's step
// bound), 1 when it differs, 2 on a bad option. With --experts E it trains an MoE model (linear
// stages, then E experts over --ep ranks) on a dp x pp x ep x tp mesh instead (moe_train.hpp), on
// every backend (in fp32 on device kernels with cuda_local and nccl, as the transformer). With
// --tp-kind 2d|2.5d|3d it trains transformer blocks whose weights and activations split over a
// tensor-parallel grid (grid_model.hpp) on a dp x pp x grid mesh, on threads or MPI.
//
//   mesh --dp 2 --pp 2 --tp 2 --schedule zb-h1 --microbatches 4 --deterministic
//   mpiexec -n 8 mesh --backend mpi --dp 2 --pp 2 --tp 2 --zero
//   mesh --sp 4 --sp-kind usp --ulysses 2 --schedule 1f1b
//   mesh --tp-kind 2.5d --tp 8 --tp-depth 2 --dp 2 --pp 2 --schedule zb-h1 --deterministic
//   mesh --backend cuda_local --dp 2 --pp 2 --tp 2 --schedule zb-h1 --deterministic   (fp32 device kernels)
//   mpirun -np 8 mesh_gpu --backend nccl --launch mpi --dp 2 --pp 2 --tp 2             (one process per GPU)

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/schedule.hpp>
#include <loom/schedule/offload.hpp>
#include <loom/schedule/vocab.hpp>
#if defined(LOOM_HAS_MPI)
#include <loom/comm/mpi.hpp>
#endif
#if defined(LOOM_MESH_DEVICE)
#include <loom/comm/cuda_local.hpp>
#include <loom/comm/nccl.hpp>
#if defined(LOOM_HAS_MPI)
#include <loom/comm/nccl_mpi.hpp>
#endif
#include <loom/cuda/device.hpp>

#include "device.hpp"
#include "moe_device.hpp"
#endif
#if defined(LOOM_CUDA_SIM)
#include <loom/cudasim/sim.hpp>
#endif

#include "dsp_model.hpp"
#include "grid_model.hpp"
#include "moe_train.hpp"
#include "train.hpp"

namespace {

using namespace mesh_example;

struct options {
  sharding layout;
  std::string sp_kind = "none";
  int ulysses = 0;
  std::string schedule = "1f1b";
  int microbatches = 4;
  int chunks = 0;
  int group = 0;           // grouped families (group-interleaved-1f1b): microbatch group size, 0 = the family's
  int offload_chunks = 0;  // PipeOffload: offload the activations of the first K chunks of every pipeline rank
  int vocab_parallel = 0;  // the vocabulary-parallel head's algorithm (1 or 2; 0 none)
  double offload_time = 0.2;
  int steps = 3;
  std::string backend = "threads";
  std::string launch = "threads";  // nccl: ranks as threads of this process, or MPI processes (one GPU each)
  bool deterministic = false;
  bool zero = false;
  int zero_stage = -1;
  std::string optimizer = "sgd";
  double adam_lr = 0.01;
  int local_steps = 0;
  bool one_shot = false;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  bool lazy = false;
  int calibrate = 0;
  std::string costs_out;
  long long seed = 1;  // the simulator's seed (device backends under loom's CUDA simulator)
  model_spec model;
  // --experts E: the MoE model (moe_model.hpp) instead of the transformer.
  int experts = 0;
  int top_k = 1;
  double capacity_factor = 1.0;
  int ep = 1;
  std::string moe_layout = "ep";
  int moe_chunks = 1;
  int moe_node_size = 0;
  std::vector<int> adaptive_r;
  // --experts E --moe-every K: the transformer with every K-th block's MLP an MoE branch instead.
  int moe_every = 0;
  double aux_weight = 0.01;
  // --tp-kind 2d|2.5d|3d: the grid model (grid_model.hpp) instead of the transformer.
  std::string tp_kind = "1d";
  int tp_depth = 0;
  int sequences = 12;
  // --sp-kind dsp: the spatial-temporal model (dsp_model.hpp) instead of the transformer.
  int frames = 8;
  int patches = 12;
  // --attention causal|full ("": the model's default: causal for the transformer and the grid
  // model, full for the spatial-temporal one).
  std::string attention;
};

#if defined(LOOM_MESH_DEVICE)
//! Runs `body(comm)` on every rank of a `ranks`-rank device world of `backend` (`cuda_local` or
//! `nccl`), after `banner(the world in words)`; `body` returns its rank's exit status. Returns
//! rank 0's, or 1 when loom's CUDA simulator found anything in the run (a race, an API misuse, an
//! access outside the bytes a kernel was handed: each printed), or 2 without a usable device.
//! Throws `config_error` when `nccl` has fewer devices than ranks.
template <class Banner, class Body>
int run_device_world(const std::string& backend, int ranks, Banner banner, Body body) {
  auto avail = loom::cuda::available();
  if (!avail) {
    std::cerr << "mesh: no usable CUDA device: " << avail.why << " (the mesh program runs device kernels under loom's simulator)\n";
    return 2;
  }
  if (backend == "nccl" && ranks > avail.devices)
    throw loom::config_error("--backend nccl needs a device per rank: " + std::to_string(ranks) + " ranks, " + std::to_string(avail.devices) +
                             " device(s)");
  banner(backend == "nccl" ? "NCCL, a device per rank, fp32 kernels" : "cuda_local, ranks as streams of one device, fp32 kernels");
  int rc = 0;
  auto each = [&](auto& c) {
    const int status = body(c);
    if (c.rank() == 0) rc = status;
  };
  if (backend == "cuda_local") loom::cuda_local::run(ranks, each);
  else loom::nccl::run(ranks, each);
#if defined(LOOM_CUDA_SIM)
  for (const auto& r : loom::cudasim::reports()) {
    std::cerr << "mesh: simulator: " << loom::cudasim::to_string(r.kind) << ": " << r.text << "\n";
    rc = 1;
  }
#endif
  return rc;
}
#endif

//! The MoE model's run of `o` (--experts).
moe::mesh_setup moe_setup(const options& o) {
  moe::mesh_setup s;
  s.dp = o.layout.dp;
  s.pp = o.layout.pp;
  s.ep = o.ep;
  s.tp = o.layout.tp;
  s.E = o.experts;
  s.k = o.top_k;
  s.f = o.capacity_factor;
  s.steps = o.steps;
  s.det = o.deterministic;
  s.zero = o.zero_stage > 0 ? o.zero_stage : o.zero ? 2 : 0;
  s.local_steps = o.local_steps;
  s.pipeline_moe = o.moe_layout == "tp";
  s.bucket_bytes = o.bucket_bytes;
  s.chunks = o.moe_chunks;
  s.node_size = o.moe_node_size;
  s.adaptive = o.adaptive_r;
  return s;
}

//! The --experts mode's refusals beyond `configure`'s: the transformer's options, in one line.
std::string moe_rule(const options& o, const CLI::App& app) {
  if (o.experts == 0) {
    for (const char* name : {"--top-k", "--capacity-factor", "--ep", "--moe-layout", "--moe-chunks", "--moe-node-size", "--adaptive-r",
                             "--moe-every", "--aux-weight"})
      if (app.count(name) > 0) return std::string(name) + " sets the MoE model: it needs --experts E";
    return {};
  }
  if (o.experts < 0) return "--experts " + std::to_string(o.experts) + " is negative";
  if (o.moe_every < 0) return "--moe-every " + std::to_string(o.moe_every) + " is negative";
  if (!std::isfinite(o.aux_weight) || o.aux_weight < 0) return "--aux-weight must be a finite number >= 0";
  if ((o.backend == "cuda_local" || o.backend == "nccl") && o.capacity_factor == 0)
    return "--experts on a device backend needs --capacity-factor above 0: with 0 the capacity is the group's largest load, which the host "
           "would read inside a stage call that a device pipeline enqueues ahead of the device";
  if (o.moe_every > 0) {  // the transformer with MoE blocks
    for (const char* name : {"--moe-layout", "--moe-chunks", "--moe-node-size", "--adaptive-r"})
      if (app.count(name) > 0)
        return std::string(name) + " applies to the MoE model: the transformer's MoE blocks (--moe-every) exchange flat over --ep so far";
    if (o.local_steps > 0) return "--local-steps: the transformer's MoE blocks reduce their experts' gradients every step";
    return {};
  }
  if (app.count("--aux-weight") > 0) return "--aux-weight weighs the transformer's MoE blocks' auxiliary loss: it needs --moe-every K";
  for (const char* name : {"--sp", "--sp-kind", "--ulysses", "--offload-chunks", "--offload-time", "--calibrate", "--costs-out", "--sync-after-step",
                           "--vocab", "--vocab-parallel", "--seq", "--hidden", "--heads", "--ffn", "--blocks", "--launch", "--adam-lr", "--attention"})
    if (app.count(name) > 0) return std::string(name) + " applies to the transformer: the MoE model (--experts) has linear stages of width 4";
  if (o.optimizer != "sgd") return "--experts trains with SGD (the reference's optimizer)";
  if (o.zero_stage == 3) return "--experts: ZeRO stage 3 needs stages that release their parameters between steps; the MoE model's do not";
  if (o.one_shot) return "--one-shot: the MoE model averages local SGD's replicas every --local-steps H";
  return {};
}

//! The --tp-kind grid mode's setup from `o` into `s`, or the first rule it breaks in one line;
//! `grid` says whether the mode is on (a kind other than 1d).
std::string grid_configure(const options& o, const CLI::App& app, grid::grid_setup& s, bool& grid) {
  loom::tp_kind k{};
  if (!loom::parse_tp_kind(o.tp_kind, k)) return "--tp-kind " + o.tp_kind + " is not one of 1d, 2d, 2.5d, 3d";
  grid = k != loom::tp_kind::d1;
  if (!grid) {
    if (app.count("--tp-depth") > 0) return "--tp-depth is 2.5D's number of layers: it needs --tp-kind 2.5d";
    if (app.count("--sequences") > 0) return "--sequences sets the grid model's batch: it needs --tp-kind 2d, 2.5d or 3d";
    return {};
  }
  for (const char* name : {"--sp", "--sp-kind", "--ulysses", "--experts", "--zero", "--zero-stage", "--optimizer", "--adam-lr", "--local-steps",
                           "--one-shot", "--offload-chunks", "--offload-time", "--calibrate", "--costs-out", "--vocab", "--vocab-parallel", "--launch",
                           "--sync-after-step", "--bucket-bytes", "--seed", "--group"})
    if (app.count(name) > 0)
      return std::string(name) + " applies to the transformer: the grid model (--tp-kind " + o.tp_kind +
             ") trains transformer blocks without embedding or vocabulary by synchronous SGD so far (docs/tensor-grids.md)";
  if (o.backend == "cuda_local" || o.backend == "nccl")
    return "--tp-kind " + o.tp_kind + " runs on the threads and mpi backends so far (the grid model's attention, activations and loss are host loops; "
           "the grid's layers and norm run on device groups)";
  if (k != loom::tp_kind::d2_5 && app.count("--tp-depth") > 0) return "--tp-depth is 2.5D's number of layers: it needs --tp-kind 2.5d";
  if (k == loom::tp_kind::d2_5 && app.count("--tp-depth") == 0) return "--tp-kind 2.5d needs its number of layers: --tp-depth d (tp = q x q x d)";
  s.kind = k;
  s.tp = o.layout.tp;
  s.depth = o.tp_depth;
  s.dp = o.layout.dp;
  s.pp = o.layout.pp;
  if (app.count("--hidden") > 0) s.hidden = o.model.hidden;
  if (app.count("--heads") > 0) s.heads = o.model.heads;
  if (app.count("--ffn") > 0) s.ffn = o.model.ffn;
  if (app.count("--seq") > 0) s.seq = o.model.seq;
  s.sequences = o.sequences;
  s.causal = o.attention != "full";
  if (app.count("--blocks") > 0) s.blocks = o.model.blocks;
  s.steps = o.steps;
  s.det = o.deterministic;
  if (o.microbatches < 1) return "--microbatches " + std::to_string(o.microbatches) + " must be at least 1";
  return grid::grid_rule(s);
}

//! The --sp-kind dsp mode's setup from `o` into `s`, or the first rule it breaks in one line; `dsp`
//! says whether the mode is on.
std::string dsp_configure(const options& o, const CLI::App& app, dsp::dsp_setup& s, bool& dsp) {
  dsp = o.sp_kind == "dsp";
  if (!dsp) {
    for (const char* name : {"--frames", "--patches"})
      if (app.count(name) > 0) return std::string(name) + " sets the spatial-temporal model: it needs --sp-kind dsp";
    return {};
  }
  for (const char* name : {"--tp-kind", "--tp-depth", "--sequences", "--ulysses", "--experts", "--zero", "--zero-stage", "--optimizer", "--adam-lr",
                           "--local-steps", "--one-shot", "--offload-chunks", "--offload-time", "--calibrate", "--costs-out", "--vocab", "--vocab-parallel", "--seq",
                           "--launch", "--sync-after-step", "--bucket-bytes", "--seed", "--group"})
    if (app.count(name) > 0)
      return std::string(name) + " applies to the transformer: --sp-kind dsp trains the spatial-temporal model (block pairs over frames "
                                 "and patches) by synchronous SGD so far (docs/mesh.md)";
  if (o.backend == "cuda_local" || o.backend == "nccl")
    return "--sp-kind dsp runs on the threads and mpi backends so far (the spatial-temporal model is host code; DSP's switch itself "
           "also runs on device groups)";
  s.dp = o.layout.dp;
  s.pp = o.layout.pp;
  s.sp = o.layout.sp;
  s.tp = o.layout.tp;
  s.frames = o.frames;
  s.patches = o.patches;
  if (app.count("--hidden") > 0) s.hidden = o.model.hidden;
  if (app.count("--heads") > 0) s.heads = o.model.heads;
  if (app.count("--ffn") > 0) s.ffn = o.model.ffn;
  if (app.count("--blocks") > 0) s.pairs = o.model.blocks;
  s.steps = o.steps;
  s.causal = o.attention == "causal";
  s.det = o.deterministic;
  if (o.microbatches < 1) return "--microbatches " + std::to_string(o.microbatches) + " must be at least 1";
  return dsp::dsp_rule(s);
}

//! Runs `train(comm)` (the values that differ from the reference, summed over the world) on
//! every rank of mesh `m`'s world of threads or MPI processes (`o.backend`), after
//! `banner(the backend in words)` on rank 0; the exit status (2: the MPI world does not match
//! `m`, said before any communication).
template <class Mesh, class Banner, class Train>
int run_host_world(const options& o, const Mesh& m, Banner banner, Train train, int argc, char** argv) {
  if (o.backend == "threads") {
    banner("threads");
    int rc = 0;
    loom::run_threads(m.size(), [&](loom::threads::comm& c) {
      const long long bad = train(c);
      if (c.rank() == 0) rc = bad == 0 ? 0 : 1;
    });
    return rc;
  }
#if defined(LOOM_HAS_MPI)
  loom::mpi::environment env(argc, argv);
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (std::string rule = m.world_rule(size); !rule.empty()) {
    if (rank == 0) std::cerr << "mesh: " << rule << "\n";
    return 2;
  }
  if (rank == 0) banner("MPI processes");
  int rc = 0;
  loom::run_mpi([&](loom::mpi::comm& c) { rc = train(c) == 0 ? 0 : 1; });
  return rc;
#else
  (void)argc;
  (void)argv;
  std::cerr << "mesh: this build has no MPI (install libopenmpi-dev and reconfigure)\n";
  return 2;
#endif
}

//! `--schedule`'s family over `pp` ranks for one of the example's other models (`what`), which
//! flush every step: an asynchronous family is refused with one line.
loom::schedule synchronous_schedule(const options& o, int pp, const std::string& what) {
  auto const& family = loom::default_registry().at(o.schedule);
  if (family.multi_step)
    throw loom::config_error("--schedule " + family.name + ": the asynchronous families run the dense transformer; " + what + " flushes every step");
  return family.make({pp, o.microbatches, o.chunks, 1, 0});
}

//! The --sp-kind dsp mode on threads or MPI processes; the exit status.
int run_dsp(const options& o, const dsp::dsp_setup& s, int argc, char** argv) {
  const loom::schedule sched = synchronous_schedule(o, s.pp, "the DSP model");
  const dsp::dsp_mesh m = dsp::make_dsp_mesh(s);
  const int world = m.size();
  auto banner = [&](const char* backend) {
    std::printf("loom mesh: spatial-temporal model, %s, sp dsp (%d ranks, %s), schedule %s, %d microbatches per replica, %d virtual stages%s\n",
                std::string(m.describe().view()).c_str(), world, backend, sched.name.c_str(), sched.microbatches, sched.stages,
                s.det ? ", deterministic" : "");
    std::printf("model: %d block pairs (temporal, then spatial attention; hidden %d, heads %d, ffn %d, %s), clips of %d frames x %d patches; "
                "squared-error loss, SGD\n",
                std::max(s.pairs, sched.stages), s.hidden, s.heads, s.ffn, s.causal ? "causal" : "full attention", s.frames, s.patches);
    std::fflush(stdout);
  };
  return run_host_world(o, m, banner, [&](auto& c) { return dsp::train_dsp(c, s, sched, true); }, argc, argv);
}

//! The --tp-kind grid mode on threads or MPI processes; the exit status.
int run_grid(const options& o, const grid::grid_setup& s, int argc, char** argv) {
  const loom::schedule sched = synchronous_schedule(o, s.pp, "the grid model");
  const grid::grid_mesh m = grid::make_grid_mesh(s);
  const int world = m.size();
  auto banner = [&](const char* backend) {
    const auto g = m.grid();
    const int blocks = std::max(s.blocks, sched.stages);
    std::printf("loom mesh: grid model, %s (%d ranks, %s), schedule %s, %d microbatches per replica, %d virtual stages%s\n",
                std::string(m.describe().view()).c_str(), world, backend, sched.name.c_str(), sched.microbatches, sched.stages,
                s.det ? ", deterministic" : "");
    std::printf("model: %d pre-LN transformer blocks (hidden %d, heads %d, ffn %d, %s attention), %d sequences of %d tokens per "
                "microbatch, %d per grid member; squared-error loss, SGD\n",
                blocks, s.hidden, s.heads, s.ffn, s.causal ? "causal" : "full", s.sequences, s.seq, s.sequences / (g.q * g.depth));
    std::fflush(stdout);
  };
  return run_host_world(o, m, banner, [&](auto& c) { return grid::train_grid(c, s, sched, true); }, argc, argv);
}

run_options run(const options& o) {
  return {.layout = o.layout, .microbatches = o.microbatches, .steps = o.steps, .deterministic = o.deterministic,
          .zero = o.zero, .zero_stage = o.zero_stage < 0 ? 0 : o.zero_stage, .adam = o.optimizer == "adam", .adam_lr = o.adam_lr,
          .local_steps = o.local_steps, .one_shot = o.one_shot,
          .bucket_bytes = o.bucket_bytes, .sync_after_step = o.lazy, .print = true,
          .calibrate = o.calibrate, .costs_out = o.costs_out};
}

//! Parses and checks the options; returns the sentence of the first error, or "".
std::string configure(options& o) {
  auto& s = o.layout;
  if (o.sp_kind == "none") s.kind = seq_kind::none;
  else if (o.sp_kind == "megatron") s.kind = seq_kind::megatron;
  else if (o.sp_kind == "ulysses") s.kind = seq_kind::ulysses;
  else if (o.sp_kind == "ring") s.kind = seq_kind::ring;
  else if (o.sp_kind == "usp") s.kind = seq_kind::usp;
  else if (o.sp_kind == "tokenring") s.kind = seq_kind::tokenring;
  else return "--sp-kind " + o.sp_kind + " is not one of megatron, ulysses, ring, usp, tokenring, dsp";
  if (s.kind == seq_kind::megatron && s.sp == 1) s.sp = s.tp;
  if (o.ulysses < 0) return "--ulysses " + std::to_string(o.ulysses) + " is negative";
  if (o.ulysses != 0 && s.kind != seq_kind::usp) return "--ulysses is USP's Ulysses degree: it needs --sp-kind usp";
  s.ulysses = o.ulysses != 0 ? o.ulysses : loom::default_ulysses_degree(s.sp);
  if (o.experts > 0 && o.moe_every > 0) {  // the transformer's MoE blocks
    o.model.moe = {o.moe_every, {.experts = o.experts, .top_k = o.top_k, .capacity_factor = o.capacity_factor}, o.aux_weight};
    s.ep = o.ep;
  }
  if (o.microbatches < 1) return "--microbatches " + std::to_string(o.microbatches) + " must be at least 1";
  if (o.steps < 1) return "--steps " + std::to_string(o.steps) + " must be at least 1";
  if (o.zero_stage > 3 || o.zero_stage < -1) return "--zero-stage " + std::to_string(o.zero_stage) + " is not 0, 1, 2 or 3";
  if (o.zero && o.zero_stage >= 0 && o.zero_stage != 2)
    return "--zero is ZeRO stage 2 but --zero-stage says " + std::to_string(o.zero_stage) + ": give one of them";
  if (!(o.adam_lr > 0)) return "--adam-lr must be positive";
  if (o.local_steps < 0) return "--local-steps " + std::to_string(o.local_steps) + " is negative";
  if (o.one_shot && o.local_steps == 0) return "--one-shot averages local SGD's replicas once: it needs --local-steps H";
  if (o.local_steps > 0 && (o.zero || o.zero_stage > 0))
    return "--local-steps and ZeRO: replicas that update on their own gradients cannot share shards";
  if (o.calibrate < 0) return "--calibrate " + std::to_string(o.calibrate) + " must be at least 0";
  if (o.bucket_bytes < sizeof(double)) return "--bucket-bytes " + std::to_string(o.bucket_bytes) + " is smaller than one value";
  for (auto [name, v] : {std::pair<const char*, int>{"--vocab", o.model.vocab}, {"--seq", o.model.seq},
                         {"--hidden", o.model.hidden}, {"--heads", o.model.heads}, {"--ffn", o.model.ffn}, {"--blocks", o.model.blocks}})
    if (v < 1) return std::string(name) + " " + std::to_string(v) + " must be at least 1";
  return s.rule(o.model);
}

//! `v` as "a, b, c".
std::string adaptive_list(const std::vector<int>& v) {
  std::string out;
  for (int r : v) {
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
  }
  return out;
}

//! The --experts mode on threads, MPI processes or a device world; the exit status.
int run_moe(const options& o, const loom::schedule& sched, int argc, char** argv) {
  const moe::mesh_setup s = moe_setup(o);
  if (std::string rule = moe_setup_rule(s); !rule.empty()) throw loom::config_error(rule);
  const int world = s.dp * s.pp * s.ep * s.tp;
  auto banner = [&](const char* backend) {
    const std::string local = s.local_steps == 0 ? "" : ", local SGD, averaged every " + std::to_string(s.local_steps) + " steps";
    std::printf("loom mesh: MoE model, dp %d x pp %d x ep %d x tp %d (%d ranks, %s), schedule %s, %d microbatches per replica, %d virtual stages%s%s%s\n",
                s.dp, s.pp, s.ep, s.tp, world, backend, sched.name.c_str(), sched.microbatches, sched.stages, s.det ? ", deterministic" : "",
                s.zero > 0 ? (", ZeRO-" + std::to_string(s.zero)).c_str() : "", local.c_str());
    std::printf("MoE layer: %d experts over %s, top-%d, capacity factor %g%s%s; %d linear stage(s) before it; 10 tokens of width 4 per "
                "microbatch and rank\n",
                s.E, s.pipeline_moe ? "tp (Pipeline MoE)" : "ep", s.k, s.f, s.f == 0 ? " (no dropping)" : "",
                s.chunks > 1       ? (", the exchange overlapped in " + std::to_string(s.chunks) + " pieces").c_str()
                : s.node_size > 0 ? (", the exchange hierarchical over nodes of " + std::to_string(s.node_size) + " ep ranks").c_str()
                : !s.adaptive.empty() ? (", Tutel's adaptive parallelism (" + std::to_string(s.ep / s.E) + " ranks per expert, r per step: " +
                                         adaptive_list(s.adaptive) + ")").c_str()
                                      : "",
                sched.stages - 1);
    std::fflush(stdout);
  };
  if (o.backend == "threads") {
    banner("threads");
    int rc = 0;
    loom::run_threads(world, [&](loom::threads::comm& c) {
      const long long bad = train_moe(c, s, sched, true);
      if (c.rank() == 0) rc = bad == 0 ? 0 : 1;
    });
    return rc;
  }
  if (o.backend == "cuda_local" || o.backend == "nccl") {
#if defined(LOOM_MESH_DEVICE)
    return run_device_world(o.backend, world, banner, [&](auto& c) { return train_moe<device_exec>(c, s, sched, true) == 0 ? 0 : 1; });
#else
    std::cerr << "mesh: this build has no CUDA (configure with the CUDA toolkit for --backend " << o.backend << ")\n";
    return 2;
#endif
  }
#if defined(LOOM_HAS_MPI)
  loom::mpi::environment env(argc, argv);
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (std::string rule = moe_world_rule(s, size); !rule.empty()) {
    if (rank == 0) std::cerr << "mesh: " << rule << "\n";
    return 2;
  }
  if (rank == 0) banner("MPI processes");
  int rc = 0;
  loom::run_mpi([&](loom::mpi::comm& c) { rc = train_moe(c, s, sched, true) == 0 ? 0 : 1; });
  return rc;
#else
  (void)argc;
  (void)argv;
  std::cerr << "mesh: this build has no MPI (install libopenmpi-dev and reconfigure)\n";
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"loom mesh example: a transformer on a dp x pp x sp x tp mesh, checked against a single-rank reference"};
  app.add_option("--dp", o.layout.dp, "data-parallel replicas");
  app.add_option("--tp", o.layout.tp, "tensor-parallel ranks (a grid's: q^2 for 2d, q^2 d for 2.5d, q^3 for 3d)");
  app.add_option("--tp-kind", o.tp_kind,
                 "1d (Megatron's split of the transformer), or 2d, 2.5d, 3d: train the grid model, transformer blocks whose weights and "
                 "activations split over a tensor-parallel grid (docs/tensor-grids.md)");
  app.add_option("--tp-depth", o.tp_depth, "with --tp-kind 2.5d: the grid's layers d");
  app.add_option("--sequences", o.sequences, "with --tp-kind 2d|2.5d|3d: sequences per microbatch, split over the grid (default 12)");
  app.add_option("--pp", o.layout.pp, "pipeline ranks");
  app.add_option("--sp", o.layout.sp, "sequence-parallel ranks");
  app.add_option("--sp-kind", o.sp_kind,
                 "megatron, ulysses, ring, usp or tokenring; or dsp: train the spatial-temporal model, its sequence dimension switched "
                 "between block halves (docs/mesh.md)");
  app.add_option("--frames", o.frames, "with --sp-kind dsp: frames per clip (the temporal sequence dimension, default 8)");
  app.add_option("--patches", o.patches, "with --sp-kind dsp: patches per frame (the spatial sequence dimension, default 12)");
  app.add_option("--attention", o.attention,
                 "causal or full: the attention's mask (default: causal for the transformer and the grid model, full for --sp-kind dsp, "
                 "whose causal mask runs along both dimensions)")
      ->check(CLI::IsMember({"causal", "full"}));
  app.add_option("--ulysses", o.ulysses, "USP's Ulysses degree (default: the largest divisor of sp not above sqrt(sp))");
  app.add_option("--schedule", o.schedule, "pipeline schedule family (loom list)");
  app.add_option("--microbatches", o.microbatches, "microbatches per replica and step");
  app.add_option("--chunks", o.chunks, "model chunks per pipeline rank (0: the family's default)");
  app.add_option("--group", o.group, "microbatch group size of a grouped family (group-interleaved-1f1b; 0: the family's default)");
  app.add_option("--offload-chunks", o.offload_chunks,
                 "offload the activations of the first K chunks of every pipeline rank to host memory and back (PipeOffload's plan; "
                 "docs/offload.md)");
  app.add_option("--offload-time", o.offload_time, "with --offload-chunks: one copy's time as a fraction of a stage's f + b + w (default 0.2)");
  app.add_option("--steps", o.steps, "training steps");
  app.add_option("--backend", o.backend,
                 "threads, mpi, or the transformer in fp32 on device kernels: cuda_local (ranks as streams of one device) or nccl "
                 "(a device per rank)")
      ->check(CLI::IsMember({"threads", "mpi", "cuda_local", "nccl"}));
  app.add_option("--launch", o.launch, "with --backend nccl: threads (ranks as threads of this process) or mpi (one process per GPU, under mpirun)")
      ->check(CLI::IsMember({"threads", "mpi"}));
  app.add_flag("--deterministic", o.deterministic, "rank-ordered reductions: bitwise equal to the reference");
  app.add_flag("--zero", o.zero, "ZeRO stage 2: shard gradients and the update over the data-parallel group");
  app.add_option("--zero-stage", o.zero_stage,
                 "ZeRO stage: 0 none, 1 optimizer state, 2 and gradients, 3 and parameters (sharded between steps)");
  app.add_option("--optimizer", o.optimizer, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--adam-lr", o.adam_lr, "Adam's learning rate (default 0.01)");
  app.add_option("--local-steps", o.local_steps,
                 "local SGD: replicas update on their own gradients and average their parameters every H steps (0: synchronous)");
  app.add_flag("--one-shot", o.one_shot, "with --local-steps: average once, after the last step (one-shot averaging)");
  app.add_option("--bucket-bytes", o.bucket_bytes, "gradient bucket size in bytes (default 25 MB)");
  app.add_option("--calibrate", o.calibrate,
                 "calibrate on steps 1..N, then print the pipeline step time predicted from the calibrated costs beside "
                 "the measured mean of the remaining steps");
  app.add_option("--costs-out", o.costs_out, "with --calibrate: write the calibrated cost file (JSON) here");
  app.add_option("--seed", o.seed, "device backends under loom's CUDA simulator: seed of the operation order and delays")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--sync-after-step", o.lazy, "launch the gradient reductions after the step instead of as soon as ready");
  app.add_option("--vocab", o.model.vocab, "vocabulary size");
  app.add_option("--vocab-parallel", o.vocab_parallel,
                 "split the token embedding and the output layer over the pipeline ranks (Yeung et al., MLSys 2025): Algorithm 1 (two "
                 "barriers) or 2 (backward fusion); runs 1f1b-vocab-N unless --schedule names v-half-vocab-N (docs/vocab.md)");
  app.add_option("--seq", o.model.seq, "tokens per sequence");
  app.add_option("--hidden", o.model.hidden, "model width");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--ffn", o.model.ffn, "MLP hidden features");
  app.add_option("--blocks", o.model.blocks, "transformer blocks (at least one per virtual stage)");
  app.add_option("--experts", o.experts,
                 "train the MoE model instead of the transformer: linear stages, then a layer of E experts (docs/moe.md; 0: the transformer)");
  app.add_option("--top-k", o.top_k, "with --experts: the experts each token goes to (1..E)");
  app.add_option("--capacity-factor", o.capacity_factor, "with --experts: Tutel's capacity factor f >= 0 (0: no dropping; default 1)");
  app.add_option("--ep", o.ep, "with --experts: expert-parallel ranks (the experts and the tokens split over them)");
  app.add_option("--moe-layout", o.moe_layout, "with --experts: ep (experts over the ep ranks) or tp (Pipeline MoE: experts over the tp ranks)")
      ->check(CLI::IsMember({"ep", "tp"}));
  app.add_option("--moe-chunks", o.moe_chunks,
                 "with --experts: overlap the all-to-alls with the experts in this many pieces of the capacity (FSMoE; 1: no overlap)");
  app.add_option("--moe-node-size", o.moe_node_size,
                 "with --experts: Tutel's hierarchical all-to-all over nodes of this many ep ranks (a divisor of --ep; 0: flat)");
  app.add_option("--moe-every", o.moe_every,
                 "with --experts: the transformer, every K-th block's MLP an MoE branch of E experts over --ep ranks (0: the MoE model)");
  app.add_option("--aux-weight", o.aux_weight, "with --moe-every: the auxiliary load-balancing loss's weight in the objective (default 0.01)");
  app.add_option("--adaptive-r", o.adaptive_r,
                 "with --experts E below --ep: Tutel's adaptive degree r of each step, cycled (0 or divisors of ep / E; e.g. 2,0,1)")
      ->delimiter(',');
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "mesh: " << e.what() << "\n";
    return 2;
  }
  if (std::string why = moe_rule(o, app); !why.empty()) {
    std::cerr << "mesh: " << why << "\n";
    return 2;
  }
  grid::grid_setup gs;
  bool grid_mode = false;
  if (std::string why = grid_configure(o, app, gs, grid_mode); !why.empty()) {
    std::cerr << "mesh: " << why << "\n";
    return 2;
  }
  dsp::dsp_setup ds;
  bool dsp_mode = false;
  if (std::string why = grid_mode ? std::string() : dsp_configure(o, app, ds, dsp_mode); !why.empty()) {
    std::cerr << "mesh: " << why << "\n";
    return 2;
  }
  if (std::string why = grid_mode || dsp_mode ? std::string() : configure(o); !why.empty()) {
    std::cerr << "mesh: " << why << "\n";
    return 2;
  }
  if (o.vocab_parallel != 0) {
    if (o.vocab_parallel != 1 && o.vocab_parallel != 2) {
      std::cerr << "mesh: --vocab-parallel " << o.vocab_parallel << " is not an algorithm of the vocabulary-parallel head: 1 (two barriers) or 2 "
                   "(backward fusion)\n";
      return 2;
    }
    if (app.count("--schedule") == 0) o.schedule = "1f1b-vocab-" + std::to_string(o.vocab_parallel);
  }
  const sharding& s = o.layout;
#if defined(LOOM_CUDA_SIM)
  loom::cudasim::reseed(static_cast<std::uint64_t>(o.seed));
#endif
  try {
    if (grid_mode) return run_grid(o, gs, argc, argv);
    if (dsp_mode) return run_dsp(o, ds, argc, argv);
    auto const& family = loom::default_registry().at(o.schedule);
    if (o.experts > 0 && family.multi_step)
      throw loom::config_error("--schedule " + family.name + ": the asynchronous families run the dense transformer; --experts (the MoE model, the MoE blocks) flushes every step");
    // An asynchronous family runs the --steps as one run without a flush (pp x tp, SGD, on the host).
    if (family.multi_step)
      if (std::string why = mesh_example::async_rule_of(run(o), o.backend == "cuda_local" || o.backend == "nccl"); !why.empty())
        throw loom::config_error("--schedule " + family.name + ": " + why);
    loom::schedule sched = family.make({s.pp, o.microbatches, o.chunks, family.multi_step ? o.steps : 1, o.group});
    if (o.offload_chunks != 0) {  // PipeOffload's plan under unit costs, its copies as actions of the program
      const auto plan = loom::plan_offload(sched, loom::costs{}, {.chunks = o.offload_chunks, .time = o.offload_time});
      if (!plan.ok) throw loom::config_error("--offload-chunks " + std::to_string(o.offload_chunks) + ": " + std::string(plan.error));
      sched = loom::with_offload(sched, plan);
    }
    // The vocabulary-parallel head: the family's algorithm, the vocabulary padded to split over pp.
    if (sched.vocab != 0 && o.vocab_parallel == 0) o.vocab_parallel = sched.vocab;  // a vocabulary family named alone
    if (o.vocab_parallel != sched.vocab)
      throw loom::config_error("--vocab-parallel " + std::to_string(o.vocab_parallel) + " runs on a vocabulary-parallel family of Algorithm " +
                               std::to_string(o.vocab_parallel) + " (1f1b-vocab-" + std::to_string(o.vocab_parallel) + ", v-half-vocab-" +
                               std::to_string(o.vocab_parallel) + "), not --schedule " + sched.name);
    if (o.vocab_parallel != 0 && o.experts > 0 && o.moe_every == 0)
      throw loom::config_error("--vocab-parallel splits the transformer's vocabulary: the MoE model (--experts without --moe-every) has none");
    if (o.experts > 0 && o.moe_every == 0) return run_moe(o, sched, argc, argv);
    model_spec m = o.model;
    int unpadded = m.vocab;
    if (o.vocab_parallel != 0) {  // Megatron's rule with the divisor pp: the padding rows are rows like any other (docs/vocab.md)
      const auto split = loom::split_vocabulary(m.vocab, s.pp, 1, s.pp);
      if (!split.ok) throw loom::config_error("--vocab-parallel: " + std::string(split.error));
      m.vocab = static_cast<int>(split.padded);
      m.vocab_parallel = o.vocab_parallel;
      if (std::string why = mesh_example::vocab_rule_of(run(o), m); !why.empty())
        throw loom::config_error("--vocab-parallel " + std::to_string(o.vocab_parallel) + ": " + why);
    }
    m.blocks = std::max(m.blocks, sched.stages);
    m.causal = o.attention != "full";
    auto banner = [&](const char* backend) {
      const int zs = o.zero_stage > 0 ? o.zero_stage : o.zero ? 2 : 0;
      const std::string local = o.local_steps == 0 ? ""
                                : o.one_shot ? ", local SGD, one-shot averaging"
                                             : ", local SGD, averaged every " + std::to_string(o.local_steps) + " steps";
      const std::string offload = o.offload_chunks == 0 ? "" : ", the first " + std::to_string(o.offload_chunks) + " chunk(s) offloaded";
      std::printf("loom mesh: %s (%d ranks, %s), schedule %s%s, %d microbatches per replica, %d virtual stages%s%s%s%s\n",
                  s.describe().c_str(), s.world(), backend, sched.name.c_str(), offload.c_str(), o.microbatches, sched.stages,
                  o.deterministic ? ", deterministic" : "", zs > 0 ? (", ZeRO-" + std::to_string(zs)).c_str() : "",
                  o.optimizer == "adam" ? ", adam" : "", local.c_str());
      std::printf("model: vocab %d, sequence %d%s, hidden %d, heads %d, ffn %d, blocks %d; buckets of %zu bytes%s\n", m.vocab,
                  m.seq, m.causal ? "" : " (full attention)", m.hidden, m.heads, m.ffn, m.blocks, o.bucket_bytes,
                  o.lazy ? ", synchronised after the step" : "");
      if (m.vocab_parallel != 0)
        std::printf("vocabulary-parallel head, Algorithm %d: E and WOUT (no output bias) split by rows over the %d pipeline ranks, %d rows each%s\n",
                    m.vocab_parallel, s.pp, m.vocab / s.pp,
                    m.vocab == unpadded ? "" : (" (the vocabulary of " + std::to_string(unpadded) + " padded to " + std::to_string(m.vocab) + ")").c_str());
      if (m.moe.every > 0)
        std::printf("MoE blocks: %d of %d (every %d), %d experts over ep %d, top-%d, capacity factor %g%s, auxiliary loss weight %g\n",
                    m.moe.count(0, m.blocks), m.blocks, m.moe.every, m.moe.o.experts, s.ep, m.moe.o.top_k, m.moe.o.capacity_factor,
                    m.moe.o.capacity_factor == 0 ? " (no dropping)" : "", m.moe.lambda);
      std::fflush(stdout);
    };
    if (o.backend == "threads") {
      banner("threads");
      int rc = 0;
      loom::run_threads(s.world(), [&](loom::threads::comm& c) {
        auto r = train_model(c, run(o), m, sched);
        if (c.rank() == 0) rc = r.differing == 0 ? 0 : 1;
      });
      return rc;
    }
    if (o.backend == "cuda_local" || o.backend == "nccl") {
#if defined(LOOM_MESH_DEVICE)
      if (o.calibrate > 0) throw loom::config_error("--calibrate times host stage calls: it runs on threads and mpi");
      if (o.launch == "mpi" && o.backend != "nccl") throw loom::config_error("--launch mpi needs --backend nccl");
      if (o.launch == "mpi") {
#if defined(LOOM_HAS_MPI)
        loom::mpi::environment env(argc, argv);
        int size = 0, rank = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        // Refusals: every rank exits, rank 0 alone says why (the processes share stderr, and their
        // lines would interleave).
        if (std::string rule = mesh_example::make_mesh(s).world_rule(size); !rule.empty()) {
          if (rank == 0) std::cerr << "mesh: " << rule << "\n";
          return 2;
        }
#if defined(LOOM_CUDA_SIM)
        if (size > 1) {  // the simulator's NCCL joins the threads of one process, not processes
          if (rank == 0)
            std::cerr << "mesh: --launch mpi with " << size
                      << " processes needs GPUs (mesh_gpu): under loom's simulator NCCL ranks are threads of one process "
                         "(--launch threads)\n";
          return 2;
        }
#endif
        auto c = loom::nccl::from_mpi(MPI_COMM_WORLD);
        if (c.rank() == 0) banner("NCCL, MPI processes, a device each, fp32 kernels");
        auto r = train_model<device_exec>(c, run(o), m, sched);
        return r.differing == 0 && r.fp32_within ? 0 : 1;
#else
        std::cerr << "mesh: this build has no MPI (install libopenmpi-dev and reconfigure)\n";
        return 2;
#endif
      }
      return run_device_world(o.backend, s.world(), banner, [&](auto& c) {
        const auto r = train_model<device_exec>(c, run(o), m, sched);
        return r.differing == 0 && r.fp32_within ? 0 : 1;
      });
#else
      std::cerr << "mesh: this build has no CUDA (configure with the CUDA toolkit for --backend " << o.backend << ")\n";
      return 2;
#endif
    }
#if defined(LOOM_HAS_MPI)
    loom::mpi::environment env(argc, argv);
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // Every rank checks the mesh against the world before any communication.
    if (std::string rule = mesh_example::make_mesh(s).world_rule(size); !rule.empty()) {
      if (rank == 0) std::cerr << "mesh: " << rule << "\n";
      return 2;
    }
    if (rank == 0) banner("MPI processes");
    int rc = 0;
    loom::run_mpi([&](loom::mpi::comm& c) { rc = train_model(c, run(o), m, sched).differing == 0 ? 0 : 1; });
    return rc;
#else
    std::cerr << "mesh: this build has no MPI (install libopenmpi-dev and reconfigure)\n";
    return 2;
#endif
  } catch (const loom::schedule_error& e) {
    std::cerr << "mesh: " << e.what() << "\n";
    return 2;
  } catch (const loom::config_error& e) {
    std::cerr << "mesh: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mesh: " << e.what() << "\n";
    return 1;
  }
}
