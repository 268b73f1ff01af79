// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The training loop of the mesh example on one rank of any communicator: binds the mesh, builds
//! the pipeline of `transformer_stage`s with `loom::data_parallel` as its observer, trains, and
//! compares every parameter and loss with the single-rank reference. Shared by `main.cpp`, the
//! tests (tests/mesh, tests/mesh_mpi) and the overlap benchmark.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/comm/counting.hpp>
#include <loom/comm/ordered.hpp>
#include <loom/exec/calibrate.hpp>
#include <loom/exec/data_parallel.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/exec/vocab_parallel.hpp>
#include <loom/mesh.hpp>
#include <loom/schedule.hpp>

#if defined(LOOM_CUDA_SIM)
#include <loom/cuda/error.hpp>
#include <loom/cudasim/sim.hpp>
#endif

#include "../01_quickstart/mlp.hpp"  // quickstart::async_rule: the asynchronous families' version rules
#include "reference.hpp"
#include "transformer.hpp"

namespace mesh_example {

//! What a run does.
struct run_options {
  sharding layout;                                     //!< degrees and sequence split
  int microbatches = 4;                                //!< per replica and step
  int steps = 3;                                       //!< training steps
  bool deterministic = false;                          //!< rank-ordered reductions, bitwise check
  bool zero = false;                                   //!< ZeRO stage 2 (when `zero_stage` is 0)
  int zero_stage = 0;                                  //!< ZeRO stage 0..3 (`loom::data_parallel_options`)
  bool adam = false;                                   //!< Adam instead of SGD (learning rate `adam_lr`)
  double adam_lr = 0.01;                               //!< Adam's learning rate
  int local_steps = 0;                                 //!< local SGD: average over dp every H steps (0: synchronous)
  bool one_shot = false;                               //!< local SGD: average once, after the last step
  std::size_t bucket_bytes = std::size_t{25} << 20;    //!< gradient bucket size
  bool sync_after_step = false;                        //!< launch reductions after the step
  bool print = false;                                  //!< rank 0 prints losses and counters
  bool check = true;                                   //!< compare with the reference
  //! Calibration steps after the warm-up step 0 (0: none): their stage calls are timed and turned
  //! into a cost model (`loom::calibrate`) whose simulated step rank 0 prints beside the measured
  //! mean of the later steps (the pipeline's step; the data-parallel reductions it overlaps are
  //! not in the model).
  int calibrate = 0;
  std::string costs_out{};                             //!< with `calibrate`: the cost file to write
};

//! What one rank saw: the counts of each of its communicators in each step, and the check.
struct run_report {
  std::vector<std::vector<std::pair<std::string, loom::comm_counters>>> steps;  //!< [step] -> (name, counts)
  long long differing = 0;  //!< values (parameters and losses) that differ from the reference, all ranks
  long long values = 0;     //!< parameter values compared, all ranks
  double seconds = 0;       //!< wall time of the steps on this rank
  std::size_t held = 0;     //!< parameter elements rank 0's reducer held after the last step (`parameters_held`)
  std::size_t stage_params = 0;  //!< parameter elements of rank 0's stages
  double fp32_diff = 0;          //!< fp32 runs: largest parameter difference from the double-precision reference (`fp32_bound`)
  bool fp32_within = true;       //!< fp32 runs: `fp32_diff` within `fp32_bound`
  std::size_t predicted_bytes = 0;  //!< device runs: this rank's device memory between steps, predicted
  std::size_t measured_bytes = 0;   //!< device runs under the simulator: the same, accounted
  std::size_t predicted_peak = 0;   //!< device runs: the peak within the steps, predicted (see `train_with`)
  bool peak_temporaries = false;    //!< device runs: ordered reductions' temporaries come on top of `predicted_peak`
  std::size_t measured_peak = 0;    //!< device runs under the simulator: the peak within the steps, accounted
  int memory_differs = 0;           //!< device runs under the simulator: ranks whose accounting differs from the prediction
  //! The counts of communicator `name` in step `step` (zero if it has none).
  loom::comm_counters counts(int step, const std::string& name) const {
    for (auto const& [n, c] : steps[static_cast<std::size_t>(step)])
      if (n == name) return c;
    return {};
  }
};

//! The mesh of the example: pipeline outermost, then data, expert, sequence, and tensor
//! parallelism innermost (adjacent ranks), as Megatron-LM orders its groups (Megatron-core puts
//! its expert-parallel ranks inside the data-parallel ones too).
using mesh_type = loom::mesh<loom::pp<>, loom::dp<>, loom::ep<>, loom::sp<>, loom::tp<>>;

inline mesh_type make_mesh(const sharding& s) {
  return mesh_type{loom::pp<>{s.pp}, loom::dp<>{s.dp}, loom::ep<>{s.ep}, loom::sp<>{s.sp_ranks()}, loom::tp<>{s.tp}};
}

//! Rows of the communication table of one step.
inline void print_counters(int step, const std::vector<std::pair<std::string, loom::comm_counters>>& counts) {
  std::printf("communication of step %d on rank 0, per dimension:\n", step);
  std::printf("| dimension | operation | calls | bytes | bus bytes |\n|---|---|---|---|---|\n");
  for (auto const& [name, k] : counts)
    for (auto op : loom::all_comm_ops) {
      const auto& c = k[op];
      if (c.calls == 0) continue;
      std::printf("| %s | %s | %llu | %llu | %.0f |\n", name.c_str(), std::string(loom::to_string(op)).c_str(),
                  static_cast<unsigned long long>(c.calls), static_cast<unsigned long long>(c.bytes), c.bus_bytes);
    }
}

//! The ZeRO stage of `o` (0..3).
inline int zero_stage(const run_options& o) { return o.zero_stage != 0 ? o.zero_stage : o.zero ? 2 : 0; }

template <class X, class Comm, class Opt>
run_report train_with(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched, Opt optimizer);

template <class X, class Comm>
run_report train_async(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched);

template <class X, class Comm>
run_report train_vocab(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched);

//! What a vocabulary-parallel family (`1f1b-vocab-1`, `-2`, `v-half-vocab-1`, `-2`) cannot run
//! with in this example, as one line, or "": the layout must be pp alone (the tables split over the
//! pipeline ranks; a tp split of the shards, as `loom::split_vocabulary` describes, is not built),
//! SGD, no data parallelism (loom's pipeline takes no step observer over vocabulary layers yet, so
//! the tables' gradients would have no reduction), no MoE blocks; any backend.
inline std::string vocab_rule_of(const run_options& o, const model_spec& m) {
  const sharding& s = o.layout;
  if (s.dp > 1) return "--dp " + std::to_string(s.dp) + ": loom's pipeline takes no step observer (data parallelism) over vocabulary layers yet";
  if (s.tp > 1 || s.sp_ranks() > 1 || s.megatron() || s.ep > 1)
    return "the vocabulary is split over the pipeline ranks only here: --tp, --sp and --ep must be 1";
  if (m.moe.every > 0) return "--moe-every: the MoE blocks run with the output layer on the last stage here";
  if (o.adam || zero_stage(o) > 0 || o.local_steps > 0) return "the tables are updated by SGD on their own ranks here (no --optimizer adam, ZeRO or local SGD)";
  if (o.calibrate > 0) return "--calibrate times the transformer stages' calls, not the vocabulary passes";
  return {};
}

//! What an asynchronous family (weight versions, `loom::schedule::versioned()`) cannot run with
//! in this example, as one line, or "": the layout must be pp x tp (Megatron's tensor parallelism
//! without its sequence split), SGD, no data parallelism and no ZeRO or local SGD (each update
//! would need its own gradient reduction), on the host.
inline std::string async_rule_of(const run_options& o, bool device) {
  const sharding& s = o.layout;
  const std::string why = " needs a gradient reduction per update, which loom's data_parallel does not run inside an "
                          "asynchronous pipeline yet";
  if (device) return "the device backends run synchronous schedules here (the quickstart and 02_cuda_mlp run the asynchronous ones)";
  if (s.dp > 1) return "--dp " + std::to_string(s.dp) + why;
  if (s.sp_ranks() > 1 || s.megatron()) return "a sequence split (--sp, --sp-kind megatron)" + why;
  if (o.adam) return "--optimizer adam: the asynchronous rules here are SGD's";
  if (o.local_steps > 0 || zero_stage(o) > 0) return "--local-steps and ZeRO need data parallelism";
  if (o.calibrate > 0) return "--calibrate times the steps of a synchronous schedule (the quickstart calibrates asynchronous runs)";
  return {};
}

//! A transformer stage with weight versions (`loom::versioned_stage`): its parameters are the
//! weights loom keeps versions of, and `update` is SGD, `w -= lr g` element by element, as the
//! reference's update.
template <class Base>
class versioned_transformer : public Base {
 public:
  using value_type = typename Base::value_type;
  //! The stage, updating with learning rate `lr`.
  versioned_transformer(Base&& b, double lr) : Base(std::move(b)), lr_(static_cast<value_type>(lr)) {}
  //! The parameters (the version loom loaded).
  std::span<value_type> weights() { return this->params(); }
  //! One SGD step of the accumulated weight gradient.
  void update(const loom::update_context&) {
    std::span<value_type> w = this->params();
    std::span<value_type> g = this->weight_grad();
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr_ * g[i];
  }

 private:
  value_type lr_;
};

//! One rank's training run over `world` (every rank of the mesh calls it), the stages computed by
//! executor `X` (`host_exec`: double on the host; `device_exec` of `device.hpp`: fp32 kernels on a
//! device world's streams). `m.blocks` must be at least the schedule's virtual stages.
template <class X = host_exec, class Comm>
run_report train(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched) {
  using real = typename X::value_type;
  if (sched.versioned()) return train_async<X>(world, o, m, sched);
  if (sched.vocab != 0)
    throw loom::config_error("--schedule " + sched.name + " is vocabulary-parallel: train_model runs it (train_vocab)");
  if (o.adam) return train_with<X>(world, o, m, sched, loom::adam<real>{.lr = o.adam_lr});
  return train_with<X>(world, o, m, sched, loom::sgd{.lr = m.lr});
}

//! `train`, or `train_vocab` for a vocabulary-parallel family (`schedule::vocab`): what the
//! program runs. Callers that never run those families call `train` and do not instantiate the
//! vocabulary path (a pipeline over `loom::vocab_layers` per communicator type).
template <class X = host_exec, class Comm>
run_report train_model(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched) {
  if (sched.vocab != 0) return train_vocab<X>(world, o, m, sched);
  return train<X>(world, o, m, sched);
}

//! Whether `a` and `b` have the same bits.
template <class U>
bool same_bits(U a, U b) {
  return std::memcmp(&a, &b, sizeof(U)) == 0;
}

//! The bound of an fp32 run against the double-precision reference (`train` on a device). With
//! SGD: 1e-4 of the largest magnitude of each tensor. With Adam, whose step divides by
//! sqrt(v) + eps, a gradient that cancels to rounding noise in one precision and not in the other
//! moves a parameter by a full step: the bound is absolute, two steps' worth per step, where a step
//! is at most lr (1 - beta1) / sqrt(1 - beta2) (Kingma & Ba 2015, section 2.1).
inline double fp32_bound(const run_options& o) {
  if (!o.adam) return 1e-4;
  const loom::adam<double> a{};
  return 2.0 * o.steps * o.adam_lr * (1 - a.beta1) / std::sqrt(1 - a.beta2);
}

//! The MoE blocks of a step against the reference's (`ref.last_moe()`): every forward record of
//! this rank's stages (the auxiliary loss, bitwise or within `tol`, and the dropped pairs, equal)
//! for its sequences `r_index M + j`, and the step's all-to-all bytes on `ep` (`a2a_bytes`, 0
//! without ep ranks) against the formula: per MoE block and microbatch four all-to-alls (dispatch
//! and combine, forward and backward) of E C h values, so 4 E h sum C x sizeof(value) over the
//! rank's forwards. With `print`, rank 0 prints the step's auxiliary loss (the mean over the
//! sequences and MoE blocks) and the pairs dropped per expert, summed over every rank, beside the
//! reference's, and its all-to-all bytes beside the formula, as a table. Every rank calls it (a world
//! reduction). Returns what differs on this rank: records, and the volume (1).
template <class Mesh, class Pipeline, class Ref>
long long check_moe(Mesh& g, Pipeline& p, const Ref& ref, const model_spec& m, int M, int r_index, bool bitwise, double tol, bool print, int step,
                    std::uint64_t a2a_bytes, std::size_t value_bytes, bool has_ep) {
  const auto E = static_cast<std::size_t>(m.moe.o.experts);
  long long bad = 0;
  std::uint64_t slots = 0;  // sum of the capacities of this rank's forwards
  std::vector<double> sums(1 + E, 0.0);  // the auxiliary losses, then the drops per expert
  for (auto& st : p.stages())
    for (int j = 0; j < M; ++j) {
      const auto& want = ref.last_moe().at(static_cast<std::size_t>(r_index * M + j));
      for (auto const& [blk, got] : st.moe_records(j)) {
        auto it = std::find_if(want.begin(), want.end(), [&](auto const& w) { return w.block == blk; });
        if (it == want.end()) {
          ++bad;
          continue;
        }
        const double a = static_cast<double>(got.aux), b = static_cast<double>(it->aux);
        bad += (bitwise ? !same_bits(got.aux, it->aux) : std::abs(a - b) > tol * std::max(std::abs(b), 1.0)) || got.dropped != it->dropped;
        sums[0] += a;
        slots += static_cast<std::uint64_t>(got.capacity);
        for (std::size_t x = 0; x < E && x < got.dropped_per_expert.size(); ++x) sums[1 + x] += static_cast<double>(got.dropped_per_expert[x]);
      }
    }
  const std::uint64_t formula = has_ep ? 4 * E * static_cast<std::uint64_t>(m.hidden) * slots * value_bytes : 0;
  bad += a2a_bytes != formula ? 1 : 0;
  g.world().all_reduce(std::span<double>(sums), loom::reduce_op::sum);
  if (print) {
    std::vector<double> want(1 + E, 0.0);
    int units = 0;
    for (auto const& seq : ref.last_moe())
      for (auto const& r : seq) {
        want[0] += static_cast<double>(r.aux);
        ++units;
        for (std::size_t x = 0; x < E; ++x) want[1 + x] += static_cast<double>(r.dropped_per_expert[x]);
      }
    auto drops = [&](const std::vector<double>& v) {
      std::string out;
      for (std::size_t x = 0; x < E; ++x) {
        if (x > 0) out += ' ';
        out += std::to_string(static_cast<long long>(v[1 + x]));
      }
      return out;
    };
    std::printf("the MoE blocks in step %d, all ranks:\n| step | MoE forwards | auxiliary loss (mean) | reference | pairs dropped per expert | "
                "reference | all-to-all bytes on ep (rank 0) | 4 E h sum C x %zu |\n|---|---|---|---|---|---|---|---|\n",
                step, value_bytes);
    std::printf("| %d | %d | %.12f | %.12f | %s | %s | %llu | %llu |\n", step, units, sums[0] / std::max(units, 1), want[0] / std::max(units, 1),
                drops(sums).c_str(), drops(want).c_str(), static_cast<unsigned long long>(a2a_bytes), static_cast<unsigned long long>(formula));
  }
  return bad;
}

//! `train` with optimizer `optimizer` (`loom::sgd` or `loom::adam<real>`).
template <class X, class Comm, class Opt>
run_report train_with(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched, Opt optimizer) {
  using real = typename X::value_type;
  constexpr bool device = X::device;
  const sharding& s = o.layout;
  const bool det = o.deterministic;
  // The check is bitwise in deterministic mode, except for device kernels on a GPU: its exp, log,
  // sqrt and tanh differ from the host's in the last bits, so the host float reference is then
  // matched within the default mode's tolerance.
#if defined(LOOM_CUDA_SIM)
  const bool bitwise = det;
#else
  const bool bitwise = det && !device;
#endif
  using C = loom::counted<Comm>;
  loom::mesh_comm g(make_mesh(s), world);
  const bool root = g.rank() == 0;
  const int tpr = g.coord(loom::dim::tp), spr = g.coord(loom::dim::sp), d = g.coord(loom::dim::dp), e = g.coord(loom::dim::ep);
  // The sequences of the step: dp x ep replicas of M each (ranks that differ in ep hold different
  // sequences as well as different experts); replica r = d ep + e.
  const int seq_replicas = s.dp * s.ep, r_index = d * s.ep + e;
  // Ulysses groups (adjacent sp ranks) and the rings across them, split from the sp group.
  // A device stage needs every group (a group of one rank for degree 1); the host passes null.
  std::optional<C> uly, ring;
  if (s.sp_ranks() > 1 || device) {
    uly.emplace(g.sp().split(spr / s.u(), spr % s.u()));
    ring.emplace(g.sp().split(spr % s.u(), spr / s.u()));
  }
  const bool has_uly = s.sp_ranks() > 1 && s.u() > 1, has_ring = s.sp_ranks() > 1 && s.ring() > 1;
  stage_comms<C> sc{s.tp > 1 || device ? &g.tp() : nullptr, s.ep > 1 || (device && m.moe.every > 0) ? &g.ep() : nullptr,
                    has_uly || device ? &*uly : nullptr, has_ring || device ? &*ring : nullptr};
  using stage_t = transformer_stage<C, X>;
  // The groups this rank reports and reduces over, made now (a mesh makes a group when first
  // asked): the device memory accounted below starts after the communicators.
  const loom::dim_set reported[] = {loom::dim_set{loom::dim::dp}, loom::dim::dp | loom::dim::tp, loom::dim::dp | loom::dim::sp,
                                    loom::dim::dp | loom::dim::tp | loom::dim::sp};
  for (loom::dim_set x : reported) (void)g.group(x);
  const loom::dim_set dp_ep = s.ep > 1 ? loom::dim::dp | loom::dim::ep : loom::dim_set{loom::dim::dp};
  if (s.ep > 1)  // the dense parameters' groups: the reducer adds ep to each (`grad_range::expert`)
    for (loom::dim_set x : reported) (void)g.group(x | loom::dim::ep);
  auto& loss_group = g.group(dp_ep | s.seq_dims());
#if defined(LOOM_CUDA_SIM)
  std::size_t mem_before = 0;  // this rank's device memory before its stages, reducer and batch buffers
  if constexpr (device) {
    // The peaks from here: every rank has its baseline before rank 0 resets them, and none goes on
    // before the reset.
    mem_before = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).current;
    std::vector<std::int64_t> sync_point{0};
    world.all_reduce(std::span<std::int64_t>(sync_point), loom::reduce_op::sum);
    if (world.rank() == 0) loom::cudasim::reset_peaks();
    world.all_reduce(std::span<std::int64_t>(sync_point), loom::reduce_op::sum);
  }
#endif
  loom::data_parallel<decltype(g), stage_t, Opt> sync(
      g, {.bucket_bytes = o.bucket_bytes, .zero_stage = zero_stage(o), .local_steps = o.local_steps, .one_shot = o.one_shot,
          .deterministic = det, .eager = !o.sync_after_step},
      optimizer);
  const int S = sched.stages, M = o.microbatches, T = s.tokens(m);
  // This rank's inputs and targets of a step, at fixed addresses (device memory on a device).
  const auto per_step = static_cast<std::size_t>(M) * static_cast<std::size_t>(T);
  auto inputs = X::template zeros<real>(per_step), targets = X::template zeros<real>(per_step);
  // The loss scale: the mean over the step's tokens; under local SGD each replica's own mean.
  const double scale = 1.0 / (static_cast<double>(o.local_steps > 0 ? 1 : seq_replicas) * M * m.seq);
  loom::pipeline p(sched, g.pp(), [&](loom::stage_id id) {
    auto [b0, b1] = stage_blocks(m.blocks, id.stage, S);
    return stage_t(m, s, tpr, spr, b0, b1, id.stage == 0, id.stage == S - 1, sc, det, scale, X::whole(targets).data());
  }, {.deterministic = det, .scaling = loom::loss_scaling::sum, .measure = o.calibrate > 0, .observer = &sync});
  sync.attach(p);

  // The communicators whose counts are reported, and the loss group (ranks holding other tokens).
  std::vector<std::pair<std::string, const loom::comm_counters*>> comms{{"pp", &g.pp().counters()}};
  if (s.tp > 1) comms.push_back({"tp", &g.tp().counters()});
  if (s.ep > 1) comms.push_back({"ep", &g.ep().counters()});
  if (has_uly) comms.push_back({"sp (ulysses)", &sc.ulysses->counters()});
  if (has_ring) comms.push_back({s.token_ring() ? "sp (tokenring)" : "sp (ring)", &sc.ring->counters()});
  for (loom::dim_set x : reported) comms.push_back({to_string(x), &g.group(x).counters()});
  if (s.ep > 1) comms.push_back({to_string(dp_ep), &g.group(dp_ep).counters()});
  comms.push_back({"world", &g.world().counters()});

  // The default mode's tolerance: 1e-12 relative with SGD. Adam divides by sqrt(v) + eps, so a
  // rounding difference d of a gradient moves a parameter by up to lr d / eps (at 0.01, 1e-17
  // and 1e-8: 1e-11): 1e-9 relative with Adam. In fp32: 1e-5 relative with SGD; with Adam a
  // gradient that cancels to rounding noise in one order of additions and not in the other moves
  // its parameter by up to a step: the parameters within `fp32_bound` (absolute), the loss 1e-3.
  constexpr bool fp32 = !std::is_same_v<real, double>;
  const bool adam_abs = fp32 && o.adam;
  const double tol = fp32 ? (o.adam ? 1e-3 : 1e-5) : o.adam ? 1e-9 : 1e-12;
  using ref_model = basic_reference_model<real>;
  ref_model ref(m);
  if (o.adam) ref.use_adam(loom::adam<real>{.lr = o.adam_lr});
  // fp32: the double-precision reference too (the textbook order), for the bound `fp32_bound`.
  std::optional<reference_model> wide;
  if constexpr (!std::is_same_v<real, double>)
    if (o.check && o.local_steps == 0) {
      wide.emplace(m);
      if (o.adam) wide->use_adam(loom::adam<double>{.lr = o.adam_lr});
    }
  // Local SGD: the replicas one after another, each its own model, averaged in replica order.
  std::vector<ref_model> replicas;
  if (o.local_steps > 0) replicas.assign(static_cast<std::size_t>(s.dp), ref);
  reduction_order local_order = det ? reduction_order::of(m, s) : reduction_order::plain();
  local_order.replicas = 1;
  int since_average = 0;
  const reduction_order order = det ? reduction_order::of(m, s) : reduction_order::plain();
  run_report rep;
  long long bad = 0;
  std::vector<loom::action_timing> timings;  // calibration: every pipeline rank's stage calls, steps 1..calibrate
  double step_sum = 0;
  int step_count = 0;
  for (int step = 0; step < o.steps; ++step) {
    const batch data = make_batch(m, seq_replicas * M, step);
    std::vector<real> in_host, target_host;
    for (int j = 0; j < M; ++j)
      for (int i = 0; i < T; ++i) {
        const auto at = static_cast<std::size_t>((r_index * M + j) * m.seq + s.token(m, tpr, spr, i));
        in_host.push_back(static_cast<real>(data.tokens[at]));
        target_host.push_back(static_cast<real>(data.targets[at]));
      }
    X::put(X::whole(inputs), in_host);
    X::put(X::whole(targets), target_host);
    std::vector<loom::comm_counters> before;
    for (auto& c : comms) before.push_back(*c.second);
    if constexpr (!device)
      if (o.calibrate > 0) g.world().barrier();  // every rank starts the step together, as the simulation does
    const auto t0 = std::chrono::steady_clock::now();
    auto r = p.step(std::span<const real>(X::whole(inputs)));
    rep.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto& counts = rep.steps.emplace_back();
    for (std::size_t i = 0; i < comms.size(); ++i) counts.push_back({comms[i].first, comms[i].second->since(before[i])});
    if constexpr (!device) {  // calibration times host stage calls (main refuses it on a device)
      if (o.calibrate > 0 && step >= 1 && step <= o.calibrate) {
        auto all = loom::gather_timings(g.pp(), p.last_timings());
        timings.insert(timings.end(), all.begin(), all.end());
      } else if (o.calibrate > 0 && step > o.calibrate) {
        step_sum += r.makespan;
        ++step_count;
      }
    }
    std::vector<double> loss{r.loss};
    if constexpr (device) {
      // A device group reduces host values with a sum only: each rank's loss at its index, zeros
      // elsewhere (exact), then the sum in group order here, as loom::ordered_all_reduce adds.
      std::vector<double> each(static_cast<std::size_t>(loss_group.size()), 0.0);
      each[static_cast<std::size_t>(loss_group.rank())] = r.loss;
      if (loss_group.size() > 1) loss_group.all_reduce(std::span<double>(each), loom::reduce_op::sum);
      loss[0] = each[0];
      for (std::size_t i = 1; i < each.size(); ++i) loss[0] += each[i];
    } else if (det) {
      loom::ordered_all_reduce(loss_group, std::span<double>(loss));
    } else if (loss_group.size() > 1) {
      loss_group.all_reduce(std::span<double>(loss), loom::reduce_op::sum);
    }
    if (o.check && o.local_steps > 0) {
      // The loss group (dp x the sequence split) adds every (replica, token group) fold in order.
      double want = 0;
      bool first = true;
      for (int r = 0; r < s.dp; ++r) {
        auto& rm = replicas[static_cast<std::size_t>(r)];
        (void)rm.step(slice(m, data, r * M, M), M, local_order);
        for (double l : rm.last_losses()) {
          want = first ? l : want + l;
          first = false;
        }
      }
      if (++since_average == o.local_steps && !o.one_shot) {
        ref_model::average(replicas);
        since_average = 0;
      }
      if (step + 1 == o.steps && o.one_shot) ref_model::average(replicas);
      bad += bitwise ? !same_bits(loss[0], want) : std::abs(loss[0] - want) > tol * std::abs(want);
      if (root && o.print) std::printf("step %d: loss %.17g, reference %.17g\n", step, loss[0], want);
    } else if (o.check) {
      const double want = ref.step(data, det ? M : seq_replicas * M, order);
      if (wide) (void)wide->step(data, seq_replicas * M, reduction_order::plain());
      bad += bitwise ? !same_bits(loss[0], want) : std::abs(loss[0] - want) > tol * std::abs(want);
      if (root && o.print) std::printf("step %d: loss %.17g, reference %.17g\n", step, loss[0], want);
      if (m.moe.every > 0)
        bad += check_moe(g, p, ref, m, M, r_index, bitwise, tol, root && o.print, step, rep.counts(step, "ep")[loom::comm_op::all_to_all].bytes,
                         sizeof(real), s.ep > 1);
    } else if (root && o.print) {
      std::printf("step %d: loss %.17g\n", step, loss[0]);
    }
    if (root && o.print) print_counters(step, counts);
  }
  // Device memory between steps, predicted (see docs/mesh.md, "The transformer on device
  // kernels") and, under loom's simulator, accounted.
  if constexpr (device) {
    std::size_t channel_bytes = 0;
    if constexpr (requires { Comm::channel_bytes; }) channel_bytes = Comm::channel_bytes;
    const auto dm = sync.memory();
    std::size_t predicted = loom::pipeline_device_bytes(
                                sched, g.pp().rank(),
                                [&](loom::stage_id id) {
                                  auto [b0, b1] = stage_blocks(m.blocks, id.stage, S);
                                  return stage_t::sizes(m, s, b0, b1, id.stage == 0, id.stage == S - 1);
                                },
                                det, sizeof(real), channel_bytes) +
                            dm.between_steps() - dm.released;
    for (auto& st : p.stages()) predicted += st.own_bytes() + st.moe_bytes(M);
    predicted += 2 * per_step * sizeof(real);  // this program's inputs and targets of a step
    if constexpr (requires { g.tp().inner().template all_reduce_scratch<real>(std::size_t{1}); }) {
      // cuda_local: the tp group's all-reduce scratch (row-parallel outputs, column-parallel input
      // gradients: region tokens x hidden), and the ring's channel into this rank.
      if (s.tp > 1 && !s.megatron())
        predicted += g.tp().inner().template all_reduce_scratch<real>(static_cast<std::size_t>(s.region_tokens(m) * m.hidden) * sizeof(real));
      if (has_ring) predicted += channel_bytes;
    }
    rep.predicted_bytes = predicted;
#if defined(LOOM_CUDA_SIM)
    LOOM_CUDA_TRY(cudaDeviceSynchronize());
    rep.measured_bytes = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).current - mem_before;
    rep.measured_peak = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).peak - mem_before;
#else
    rep.measured_bytes = predicted;  // no accounting on a GPU
#endif
    // The peak within a step: ZeRO-3's gathered parameters and full buckets of a stage
    // (`transient`) on top; on a rank of several stages the next stage's gather may be in flight,
    // so the peak lies between that and two stages' worth.
    rep.predicted_peak = predicted + dm.transient;
    const bool one_stage = p.stages().size() == 1;
    // On a group that promises no order of additions (nccl), deterministic mode's rank-ordered
    // reductions over more than two ranks (loom::ordered_all_reduce) allocate stream-ordered
    // temporaries (2 n k + k elements and 3 bytes each while in flight): not in the prediction, the
    // peak is then only bounded below by it.
    const int seq_ranks = s.megatron() ? s.tp : s.sp_ranks();
    rep.peak_temporaries = !loom::reduces_in_rank_order<Comm> && det && std::max({s.dp * s.ep, s.tp, s.dp * s.ep * seq_ranks}) > 2;
#if !defined(LOOM_CUDA_SIM)
    rep.measured_peak = rep.predicted_peak;
#endif
    const bool peak_ok = rep.peak_temporaries ? rep.measured_peak >= rep.predicted_peak
                         : one_stage     ? rep.measured_peak == rep.predicted_peak
                                         : rep.measured_peak >= rep.predicted_peak && rep.measured_peak <= predicted + 2 * dm.transient;
    // Every rank's verdict: the ranks whose accounting differs from the prediction.
    std::vector<std::int64_t> off{rep.predicted_bytes == rep.measured_bytes && peak_ok ? 0 : 1};
    g.world().all_reduce(std::span<std::int64_t>(off), loom::reduce_op::sum);
    rep.memory_differs = static_cast<int>(off[0]);
    if (root && o.print) {
#if defined(LOOM_CUDA_SIM)
      std::printf("device memory between steps: rank 0 %zu bytes predicted, %zu in the simulator's accounting; peak within the steps "
                  "%zu predicted%s, %zu accounted; ranks where either differs: %d of %d -> %s\n",
                  rep.predicted_bytes, rep.measured_bytes, rep.predicted_peak,
                  rep.peak_temporaries ? " (at least: ordered reductions' temporaries)" : one_stage ? "" : " (to two stages' transient more)",
                  rep.measured_peak, rep.memory_differs, world.size(), rep.memory_differs == 0 ? "EQUAL" : "DIFFERENT");
#else
      std::printf("device memory between steps: rank 0 %zu bytes predicted, peak within the steps %zu\n", rep.predicted_bytes,
                  rep.predicted_peak);
#endif
    }
  }
  // What the rank holds between steps (ZeRO-3: only its shards), before finish() gathers them.
  rep.held = sync.parameters_held();
  for (auto& st : p.stages()) rep.stage_params += st.weight_grad().size();
  if (root && o.print)
    std::printf("parameters held by rank 0 between steps: %zu elements for its stages' %zu (ZeRO stage %d%s)\n", rep.held,
                rep.stage_params, zero_stage(o), zero_stage(o) == 3 ? ": its shards only" : zero_stage(o) > 0 ? ": the stages' and the buckets' copies" : "");
  sync.finish();
  if constexpr (!device)
  if (o.calibrate > 0) {
    const auto sizes = loom::gather_stage_sizes(p, g.pp());
    double msg = 8;
    for (const auto& z : sizes) msg = std::max(msg, z.message_bytes);
    const auto mb = static_cast<std::size_t>(msg);
    const std::vector<std::size_t> link_sizes{8, mb, 2 * mb, 4 * mb};
    const loom::link_cost link = loom::measure_link(g.pp(), link_sizes);
    const loom::cost_model model = loom::calibrate(sched, timings, sizes, {.intra = link});
    const double want = loom::simulate(sched, model).makespan;
    if (root && o.print) {
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
  // Every parameter this rank holds against the reference's.
  long long values = 0;
  double wide_diff = 0;  // fp32 against the double-precision reference (relative to each tensor's largest value)
  if (o.check)
    for (auto& st : p.stages()) {
      const std::vector<real> w = st.host_params();
      for (auto const& ts : st.tensors()) {
        const auto& full = (o.local_steps > 0 ? replicas[static_cast<std::size_t>(d)] : ref).params().at({ts.t, ts.block});
        const int cols = full_shape(m, ts.t).second;
        double norm = 0;
        for (real v : full) norm = std::max(norm, std::abs(static_cast<double>(v)));
        for (int r = 0; r < ts.rows; ++r)
          for (int c = 0; c < ts.cols; ++c) {
            const real got = w[ts.offset + static_cast<std::size_t>(r * ts.cols + c)];
            const auto at = static_cast<std::size_t>(ts.row_of(r) * cols + ts.col_of(c));
            const real exp = full[at];
            ++values;
            const double diff = std::abs(static_cast<double>(got) - static_cast<double>(exp));
            bad += bitwise ? !same_bits(got, exp) : diff > (adam_abs ? fp32_bound(o) : tol * norm);
            if (wide)
              wide_diff = std::max(wide_diff, std::abs(static_cast<double>(got) - wide->params().at({ts.t, ts.block})[at]) / (o.adam ? 1.0 : norm));
          }
      }
    }
  std::vector<std::int64_t> tally{bad, values};
  g.world().all_reduce(std::span<std::int64_t>(tally), loom::reduce_op::sum);
  rep.differing = tally[0];
  rep.values = tally[1];
  if (wide) {
    std::vector<double> worst{wide_diff};
    g.world().all_reduce(std::span<double>(worst), loom::reduce_op::max);
    rep.fp32_diff = worst[0];
    const double bound = fp32_bound(o);
    if (root && o.print)
      std::printf("fp32 against the double-precision reference: largest parameter difference %.3g%s (bound %.2g) -> %s\n",
                  rep.fp32_diff, o.adam ? "" : " of its tensor's largest value", bound, rep.fp32_diff <= bound ? "WITHIN" : "BEYOND");
    rep.fp32_within = rep.fp32_diff <= bound;
  }
  if (root && o.print && o.check) {
    char how[32];
    if (adam_abs) std::snprintf(how, sizeof how, "%.2g absolute", fp32_bound(o));
    else std::snprintf(how, sizeof how, "%.0e relative", tol);
    std::printf("reference check (%s): %lld of %lld parameter values (summed over ranks) and losses differ -> %s\n",
                bitwise ? "bitwise" : how, rep.differing, rep.values, rep.differing == 0 ? "MATCH" : "DIFFERENT");
  }
  return rep;
}

//! An asynchronous family's run on one rank (see `async_rule_of` for the layouts it takes): the
//! `--steps` T run as one pipeline run without a flush, every step's loss and every parameter
//! checked against the reference of the family's rule (`basic_reference_model::asynchronous`):
//! bitwise in deterministic mode, within 1e-12 relative otherwise.
template <class X, class Comm>
run_report train_async(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched) {
  if (std::string why = async_rule_of(o, X::device); !why.empty())
    throw loom::config_error("--schedule " + sched.name + ": " + why);
  if constexpr (X::device) {
    return {};
  } else {
    using real = typename X::value_type;
    const sharding& s = o.layout;
    const bool det = o.deterministic;
    using C = loom::counted<Comm>;
    loom::mesh_comm g(make_mesh(s), world);
    const bool root = g.rank() == 0;
    const int tpr = g.coord(loom::dim::tp), spr = g.coord(loom::dim::sp);
    stage_comms<C> sc{s.tp > 1 ? &g.tp() : nullptr, nullptr, nullptr};
    using stage_t = versioned_transformer<transformer_stage<C, X>>;
    const int S = sched.stages, M = sched.step_microbatches(), T = s.tokens(m), steps = sched.steps;
    // The run's inputs and targets: all T steps' microbatches, step after step.
    std::vector<real> in_host, target_host;
    for (int t = 0; t < steps; ++t) {
      const batch data = make_batch(m, M, t);
      for (int j = 0; j < M; ++j)
        for (int i = 0; i < T; ++i) {
          const auto at = static_cast<std::size_t>(j * m.seq + s.token(m, tpr, spr, i));
          in_host.push_back(static_cast<real>(data.tokens[at]));
          target_host.push_back(static_cast<real>(data.targets[at]));
        }
    }
    auto inputs = X::template zeros<real>(in_host.size()), targets = X::template zeros<real>(target_host.size());
    X::put(X::whole(inputs), in_host);
    X::put(X::whole(targets), target_host);
    const double scale = 1.0 / (static_cast<double>(M) * m.seq);  // the mean over a step's tokens
    loom::pipeline p(sched, g.pp(), [&](loom::stage_id id) {
      auto [b0, b1] = stage_blocks(m.blocks, id.stage, S);
      return stage_t(transformer_stage<C, X>(m, s, tpr, spr, b0, b1, id.stage == 0, id.stage == S - 1, sc, det, scale,
                                             X::whole(targets).data()),
                     m.lr);
    }, {.deterministic = det, .scaling = loom::loss_scaling::sum});
    const auto t0 = std::chrono::steady_clock::now();
    p.step(std::span<const real>(X::whole(inputs)));
    run_report rep;
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The reference of the rule, microbatch by microbatch.
    reference_model ref(m);
    const quickstart::async_rule rule{.family = sched.name, .p = S, .m = M, .N = sched.microbatches};
    const auto want = ref.asynchronous(rule, S, M, steps, det ? reduction_order::of(m, s) : reduction_order::plain());
    const bool bitwise = det;
    const double tol = 1e-12;
    long long bad = 0, values = 0;
    for (int t = 0; t < steps; ++t) {
      double got = 0;
      for (int i = 0; i < M; ++i) got += p.microbatch_losses()[static_cast<std::size_t>(t * M + i)];
      const double w = want[static_cast<std::size_t>(t)];
      bad += bitwise ? !same_bits(got, w) : std::abs(got - w) > tol * std::abs(w);
      if (root && o.print) std::printf("step %d: loss %.17g, reference of the rule %.17g\n", t, got, w);
    }
    for (auto& st : p.stages()) {
      const std::vector<real> wts = st.host_params();
      for (auto const& ts : st.tensors()) {
        const auto& full = ref.params().at({ts.t, ts.block});
        const int cols = full_shape(m, ts.t).second;
        double norm = 0;
        for (real v : full) norm = std::max(norm, std::abs(static_cast<double>(v)));
        for (int r = 0; r < ts.rows; ++r)
          for (int c = 0; c < ts.cols; ++c) {
            const real got = wts[ts.offset + static_cast<std::size_t>(r * ts.cols + c)];
            const real exp = full[static_cast<std::size_t>(ts.row_of(r) * cols + ts.col_of(c))];
            ++values;
            bad += bitwise ? !same_bits(got, exp) : std::abs(static_cast<double>(got) - static_cast<double>(exp)) > tol * norm;
          }
      }
    }
    // The versions each pipeline rank held, counted by the executor, beside the simulator's.
    std::vector<std::int64_t> held(static_cast<std::size_t>(world.size()), 0);
    if (g.coord(loom::dim::tp) == 0) held[static_cast<std::size_t>(g.pp().rank())] = p.versions_held(0);
    std::vector<std::int64_t> tally{bad, values};
    g.world().all_reduce(std::span<std::int64_t>(tally), loom::reduce_op::sum);
    g.world().all_reduce(std::span<std::int64_t>(held), loom::reduce_op::sum);
    rep.differing = tally[0];
    rep.values = tally[1];
    for (auto& st : p.stages()) rep.stage_params += st.weight_grad().size();
    if (root && o.print) {
      const auto sim = loom::simulate(sched);
      std::printf("%d steps of %d microbatches in one run, never flushed; weight versions per pipeline rank: simulator", steps, M);
      for (double c : sim.weight_copies) std::printf(" %g", c);
      std::printf(", held by the executor");
      for (int r = 0; r < s.pp; ++r) std::printf(" %lld", static_cast<long long>(held[static_cast<std::size_t>(r)]));
      std::printf("\nreference check (%s): %lld of %lld parameter values (summed over ranks) and losses differ -> %s\n",
                  bitwise ? "bitwise" : "1e-12 relative", rep.differing, rep.values, rep.differing == 0 ? "MATCH" : "DIFFERENT");
    }
    return rep;
  }
}

//! A vocabulary-parallel family's run on one rank (`vocab_rule_of` says which layouts): the
//! pipeline of `transformer_stage`s without the token embedding and the head, and this rank's
//! `loom::vocab_layers` holding rows [first, first + rows) of `E` and `WOUT`
//! (`loom::shard_of` over the padded vocabulary `m.vocab`) in `X`'s memory, with `X`'s kernel
//! (host loops, or loom's kernels on the pipeline's compute stream), their loss weight
//! `1 / (M seq)` (the mean over the step's tokens, the pipeline scaling by `sum`). After each step
//! SGD updates the stages and the two shards where they live (on the host: the model is small).
//! The loss of every step and every parameter, the shards' rows included, are compared with the
//! reference in `X`'s precision (`basic_reference_model` with `model_spec::vocab_parallel`):
//! bitwise in deterministic mode on the same shards (on a GPU, whose exp and log differ from the
//! host's, within the default tolerance), within 1e-12 relative (fp32: 1e-5) otherwise of the
//! unsplit softmax; fp32 runs also against the double-precision reference within `fp32_bound`.
template <class X, class Comm>
run_report train_vocab(Comm& world, const run_options& o, const model_spec& m, const loom::schedule& sched) {
  if (std::string why = vocab_rule_of(o, m); !why.empty()) throw loom::config_error("--schedule " + sched.name + ": " + why);
  if (m.vocab_parallel != sched.vocab)
    throw loom::config_error("--schedule " + sched.name + " runs Algorithm " + std::to_string(sched.vocab) + " of the vocabulary-parallel head, but the model's is " +
                             std::to_string(m.vocab_parallel) + " (--vocab-parallel)");
  using real = typename X::value_type;
  constexpr bool fp32 = !std::is_same_v<real, double>;
  const sharding& s = o.layout;
  const bool det = o.deterministic;
#if defined(LOOM_CUDA_SIM)
  const bool bitwise = det;
#else
  const bool bitwise = det && !X::device;
#endif
  using C = loom::counted<Comm>;
  loom::mesh_comm g(make_mesh(s), world);
  const bool root = g.rank() == 0;
  // A device stage needs every group (of one rank here); the host passes null.
  std::optional<C> uly, ring;
  if constexpr (X::device) {
    uly.emplace(g.sp().split(0, 0));
    ring.emplace(g.sp().split(0, 0));
  }
  stage_comms<C> sc{X::device ? &g.tp() : nullptr, nullptr, X::device ? &*uly : nullptr, X::device ? &*ring : nullptr};
  using stage_t = transformer_stage<C, X>;
  const int S = sched.stages, M = o.microbatches, P = s.pp, rank = g.pp().rank();
  const auto h = static_cast<std::size_t>(m.hidden), n = static_cast<std::size_t>(m.seq);
  const loom::vocab_shard shard = loom::shard_of(m.vocab, P, rank, h);
  const std::size_t rh = shard.rows * h, first = static_cast<std::size_t>(shard.first);
  // This rank's rows of the two tables (their initial values as the reference's) and their gradients.
  std::vector<real> w0(rh), e0(rh);
  for (std::size_t r = 0; r < shard.rows; ++r)
    for (std::size_t c = 0; c < h; ++c) {
      const int row = static_cast<int>(first + r), col = static_cast<int>(c);
      w0[r * h + c] = static_cast<real>(initial(m, tensor::WOUT, -1, row, col));
      e0[r * h + c] = static_cast<real>(initial(m, tensor::E, -1, row, col));
    }
  auto wout = X::upload(w0), emb = X::upload(e0), gwout = X::template zeros<real>(rh), gemb = X::template zeros<real>(rh);
  using layers_t = loom::vocab_layers<real, typename X::vocab_kernel>;
  layers_t layers(shard, n, X::whole(wout), X::whole(emb), X::whole(gwout), X::whole(gemb));
  const double scale = 1.0 / (static_cast<double>(M) * m.seq);  // the mean over the step's tokens
  layers.loss_weight(scale);
  auto no_targets = X::template zeros<real>(1);  // the stages compute no loss: the vocabulary layers do
  auto make = [&](loom::stage_id id) {
    auto [b0, b1] = stage_blocks(m.blocks, id.stage, S);
    return stage_t(m, s, 0, 0, b0, b1, id.stage == 0, id.stage == S - 1, sc, det, scale, X::whole(no_targets).data());
  };
  loom::pipeline<loom::schedule, stage_t, C, layers_t> p(sched, g.pp(), make, layers, {.deterministic = det, .scaling = loom::loss_scaling::sum});
  basic_reference_model<real> ref(m);
  std::optional<reference_model> wide;  // fp32: the double-precision reference too (the plain order)
  if constexpr (fp32)
    if (o.check) wide.emplace(m);
  const reduction_order order = det ? reduction_order::of(m, s) : reduction_order::plain();
  const double tol = fp32 ? 1e-5 : 1e-12;
  const auto lr = static_cast<real>(m.lr);
  // SGD, as the reference's update, on a host copy written back.
  auto sgd = [&](std::span<real> w, std::span<real> grad) {
    std::vector<real> wh = X::template download<real>(w);
    const std::vector<real> gh = X::template download<real>(grad);
    for (std::size_t i = 0; i < wh.size(); ++i) wh[i] -= lr * gh[i];
    X::put(w, wh);
  };
  run_report rep;
  long long bad = 0, values = 0;
  for (int step = 0; step < o.steps; ++step) {
    const batch data = make_batch(m, M, step);
    std::vector<std::int64_t> ids(data.tokens.size()), targets(data.targets.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int64_t>(data.tokens[i]);
      targets[i] = static_cast<std::int64_t>(data.targets[i]);
    }
    layers.set_batch(ids, targets);
    const loom::comm_counters before = g.pp().counters();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = p.step({});
    rep.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.steps.push_back({{"pp", g.pp().counters().since(before)}});
    for (auto& st : p.stages()) sgd(st.params(), st.weight_grad());
    sgd(X::whole(wout), X::whole(gwout));
    sgd(X::whole(emb), X::whole(gemb));
    if (o.check) {
      const double want = ref.step(data, M, order);
      if (wide) (void)wide->step(data, M, reduction_order::plain());
      bad += bitwise ? !same_bits(r.loss, want) : std::abs(r.loss - want) > tol * std::abs(want);
      if (root && o.print) std::printf("step %d: loss %.17g, reference %.17g\n", step, r.loss, want);
    } else if (root && o.print) {
      std::printf("step %d: loss %.17g\n", step, r.loss);
    }
    if (root && o.print) print_counters(step, rep.steps.back());
  }
  double wide_diff = 0;  // fp32 against the double-precision reference (relative to each tensor's largest value)
  auto compare = [&](const std::vector<real>& got, tensor t, int block, std::size_t at) {
    const auto& full = ref.params().at({t, block});
    double norm = 0;
    for (real v : full) norm = std::max(norm, std::abs(static_cast<double>(v)));
    for (std::size_t i = 0; i < got.size(); ++i) {
      ++values;
      const real want = full[at + i];
      bad += bitwise ? !same_bits(got[i], want) : std::abs(static_cast<double>(got[i]) - static_cast<double>(want)) > tol * norm;
      if (wide) wide_diff = std::max(wide_diff, std::abs(static_cast<double>(got[i]) - wide->params().at({t, block})[at + i]) / norm);
    }
  };
  if (o.check) {
    for (auto& st : p.stages()) {
      const std::vector<real> w = st.host_params();
      for (auto const& ts : st.tensors())  // pp alone: every tensor whole, row-major
        compare({w.begin() + static_cast<std::ptrdiff_t>(ts.offset), w.begin() + static_cast<std::ptrdiff_t>(ts.offset + ts.size())}, ts.t, ts.block, 0);
    }
    compare(X::template download<real>(X::whole(wout)), tensor::WOUT, -1, first * h);
    compare(X::template download<real>(X::whole(emb)), tensor::E, -1, first * h);
  }
  std::vector<std::int64_t> tally{bad, values};
  g.world().all_reduce(std::span<std::int64_t>(tally), loom::reduce_op::sum);
  rep.differing = tally[0];
  rep.values = tally[1];
  for (auto& st : p.stages()) rep.stage_params += st.weight_grad().size();
  if (wide) {
    std::vector<double> worst{wide_diff};
    g.world().all_reduce(std::span<double>(worst), loom::reduce_op::max);
    rep.fp32_diff = worst[0];
    rep.fp32_within = rep.fp32_diff <= fp32_bound(o);
    if (root && o.print)
      std::printf("fp32 against the double-precision reference: largest parameter difference %.3g of its tensor's largest value (bound %.2g) -> %s\n",
                  rep.fp32_diff, fp32_bound(o), rep.fp32_within ? "WITHIN" : "BEYOND");
  }
  if (root && o.print) {
    const auto sim = loom::simulate(sched);
    std::printf("vocabulary layers: rows [%zu, %zu) of E and WOUT on rank 0 (%zu of %d rows per rank); peak activation per pipeline rank "
                "(loom::simulate, units of a stage's activation):",
                first, first + shard.rows, shard.rows, m.vocab);
    for (double a : sim.peak_activation) std::printf(" %g", a);
    char how[64];
    if (bitwise) std::snprintf(how, sizeof how, "bitwise, the same shards");
    else std::snprintf(how, sizeof how, "%.0e relative, %s", tol, det ? "the same shards" : "the unsplit softmax");
    std::printf("\nreference check (%s): %lld of %lld parameter values (summed over ranks) and losses differ -> %s\n", how, rep.differing,
                rep.values, rep.differing == 0 ? "MATCH" : "DIFFERENT");
  }
  return rep;
}

}  // namespace mesh_example
