// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom mesh example: a small transformer trained on a dp x pp x sp x tp mesh (layers sharded over
// tp and sp, blocks pipelined over pp by any registered schedule, replicated over dp), over
// threads or MPI processes, checked against the single-rank reference; prints what each mesh
// dimension communicated in each step. Exit status: 0 when the result equals the reference
// (bitwise with --deterministic, within 1e-12 relative otherwise), 1 when it differs, 2 on a bad
// option.
//
//   mesh --dp 2 --pp 2 --tp 2 --schedule zb-h1 --microbatches 4 --deterministic
//   mpiexec -n 8 mesh --backend mpi --dp 2 --pp 2 --tp 2 --zero
//   mesh --sp 4 --sp-kind usp --ulysses 2 --schedule 1f1b

#include <CLI/CLI.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <loom/comm/counting.hpp>
#include <loom/comm/ordered.hpp>
#include <loom/comm/threads.hpp>
#include <loom/exec/data_parallel.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/mesh.hpp>
#include <loom/schedule.hpp>
#if defined(LOOM_HAS_MPI)
#include <loom/comm/mpi.hpp>
#endif

#include "reference.hpp"
#include "transformer.hpp"

namespace {

using namespace mesh_example;

struct options {
  sharding layout;
  std::string sp_kind = "none";
  int ulysses = 0;
  std::string schedule = "1f1b";
  int microbatches = 4;
  int chunks = 0;
  int steps = 3;
  std::string backend = "threads";
  bool deterministic = false;
  bool zero = false;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  bool lazy = false;
  model_spec model;
};

using mesh_t = loom::mesh<loom::pp<>, loom::dp<>, loom::sp<>, loom::tp<>>;

mesh_t make_mesh(const sharding& s) {
  return mesh_t{loom::pp<>{s.pp}, loom::dp<>{s.dp}, loom::sp<>{s.sp_ranks()}, loom::tp<>{s.tp}};
}

//! The rows of the communication table of one step (rank 0's communicators).
template <class C>
void print_counters(int step, const std::vector<std::pair<std::string, const loom::comm_counters*>>& now,
                    const std::vector<loom::comm_counters>& before) {
  std::printf("communication of step %d on rank 0, per dimension:\n", step);
  std::printf("| dimension | operation | calls | bytes | bus bytes |\n|---|---|---|---|---|\n");
  for (std::size_t i = 0; i < now.size(); ++i) {
    auto d = now[i].second->since(before[i]);
    for (auto op : loom::all_comm_ops) {
      const auto& c = d[op];
      if (c.calls == 0) continue;
      std::printf("| %s | %s | %llu | %llu | %.0f |\n", now[i].first.c_str(), std::string(loom::to_string(op)).c_str(),
                  static_cast<unsigned long long>(c.calls), static_cast<unsigned long long>(c.bytes), c.bus_bytes);
    }
  }
}

//! One rank's training run on any communicator. Returns 0 if the result equals the reference.
template <class Comm>
int train(Comm& world, const options& o, const model_spec& m, const loom::schedule& sched) {
  const sharding& s = o.layout;
  const bool det = o.deterministic;
  using C = loom::counted<Comm>;
  loom::mesh_comm g(make_mesh(s), world);
  const bool root = g.rank() == 0;
  const int tpr = g.coord(loom::dim::tp), spr = g.coord(loom::dim::sp), d = g.coord(loom::dim::dp);
  // Ulysses groups (adjacent sp ranks) and rings across them, split from the sp group.
  std::optional<C> uly, ring;
  if (s.sp_ranks() > 1) {
    uly.emplace(g.sp().split(spr / s.u(), spr % s.u()));
    ring.emplace(g.sp().split(spr % s.u(), spr / s.u()));
  }
  stage_comms<C> sc{s.tp > 1 ? &g.tp() : nullptr, uly && s.u() > 1 ? &*uly : nullptr,
                    ring && s.ring() > 1 ? &*ring : nullptr};
  using stage_t = transformer_stage<C>;
  loom::data_parallel<decltype(g), stage_t> sync(
      g, {.bucket_bytes = o.bucket_bytes, .sharded = o.zero, .deterministic = det, .eager = !o.lazy}, loom::sgd{.lr = m.lr});
  std::vector<double> targets;
  const int S = sched.stages, M = o.microbatches, T = s.tokens(m);
  const double scale = 1.0 / (static_cast<double>(s.dp) * M * m.seq);
  loom::pipeline p(sched, g.pp(), [&](loom::stage_id id) {
    auto [b0, b1] = stage_blocks(m.blocks, id.stage, S);
    return stage_t(m, s, tpr, spr, b0, b1, id.stage == 0, id.stage == S - 1, sc, det, scale, &targets);
  }, {.deterministic = det, .scaling = loom::loss_scaling::sum, .observer = &sync});
  sync.attach(p);

  // The communicators whose counts are printed, and the loss group (ranks holding other tokens).
  std::vector<std::pair<std::string, const loom::comm_counters*>> comms{{"pp", &g.pp().counters()}};
  if (s.tp > 1) comms.push_back({"tp", &g.tp().counters()});
  if (sc.ulysses) comms.push_back({"sp (ulysses)", &sc.ulysses->counters()});
  if (sc.ring) comms.push_back({"sp (ring)", &sc.ring->counters()});
  for (loom::dim_set x : {loom::dim_set{loom::dim::dp}, loom::dim::dp | loom::dim::tp, loom::dim::dp | loom::dim::sp,
                          loom::dim::dp | loom::dim::tp | loom::dim::sp})
    comms.push_back({to_string(x), &g.group(x).counters()});
  comms.push_back({"world", &g.world().counters()});
  auto& loss_group = g.group(loom::dim_set{loom::dim::dp} | s.seq_dims());

  model_spec rm = m;
  reference_model ref(rm);
  const reduction_order order = det ? reduction_order::of(m, s) : reduction_order::plain();
  long long bad = 0;
  for (int step = 0; step < o.steps; ++step) {
    const batch data = make_batch(m, s.dp * M, step);
    std::vector<double> inputs;
    targets.clear();
    for (int j = 0; j < M; ++j)
      for (int i = 0; i < T; ++i) {
        const auto at = static_cast<std::size_t>((d * M + j) * m.seq + s.token(m, tpr, spr, i));
        inputs.push_back(data.tokens[at]);
        targets.push_back(data.targets[at]);
      }
    std::vector<loom::comm_counters> before;
    for (auto& c : comms) before.push_back(*c.second);
    auto r = p.step(inputs);
    std::vector<double> loss{r.loss};
    if (det) loom::ordered_all_reduce(loss_group, std::span<double>(loss));
    else if (loss_group.size() > 1) loss_group.all_reduce(std::span<double>(loss), loom::reduce_op::sum);
    const double want = ref.step(data, det ? M : s.dp * M, order);
    bad += det ? std::bit_cast<std::uint64_t>(loss[0]) != std::bit_cast<std::uint64_t>(want)
               : std::abs(loss[0] - want) > 1e-12 * std::abs(want);
    if (root) {
      std::printf("step %d: loss %.17g, reference %.17g\n", step, loss[0], want);
      print_counters<C>(step, comms, before);
    }
  }
  sync.finish();
  // Every parameter this rank holds against the reference's.
  long long values = 0;
  for (auto& st : p.stages()) {
    auto w = st.params();
    for (auto const& ts : st.tensors()) {
      const auto& full = ref.params().at({ts.t, ts.block});
      const int cols = full_shape(m, ts.t).second;
      double norm = 0;
      for (double v : full) norm = std::max(norm, std::abs(v));
      for (int r = 0; r < ts.rows; ++r)
        for (int c = 0; c < ts.cols; ++c) {
          const double got = w[ts.offset + static_cast<std::size_t>(r * ts.cols + c)];
          const double exp = full[static_cast<std::size_t>(ts.row_of(r) * cols + ts.col_of(c))];
          ++values;
          bad += det ? std::bit_cast<std::uint64_t>(got) != std::bit_cast<std::uint64_t>(exp) : std::abs(got - exp) > 1e-12 * norm;
        }
    }
  }
  std::vector<std::int64_t> tally{bad, values};
  g.world().all_reduce(std::span<std::int64_t>(tally), loom::reduce_op::sum);
  const bool ok = tally[0] == 0;
  if (root)
    std::printf("reference check (%s): %lld of %lld parameter values (summed over ranks) and losses differ -> %s\n",
                det ? "bitwise" : "1e-12 relative", static_cast<long long>(tally[0]), static_cast<long long>(tally[1]),
                ok ? "MATCH" : "DIFFERENT");
  return ok ? 0 : 1;
}

//! Parses and checks the options; returns the sentence of the first error, or "".
std::string configure(options& o) {
  auto& s = o.layout;
  if (o.sp_kind == "none") s.kind = seq_kind::none;
  else if (o.sp_kind == "megatron") s.kind = seq_kind::megatron;
  else if (o.sp_kind == "ulysses") s.kind = seq_kind::ulysses;
  else if (o.sp_kind == "ring") s.kind = seq_kind::ring;
  else if (o.sp_kind == "usp") s.kind = seq_kind::usp;
  else return "--sp-kind " + o.sp_kind + " is not one of megatron, ulysses, ring, usp";
  if (s.kind == seq_kind::megatron && s.sp == 1) s.sp = s.tp;
  if (o.ulysses < 0) return "--ulysses " + std::to_string(o.ulysses) + " is negative";
  if (o.ulysses != 0 && s.kind != seq_kind::usp) return "--ulysses is USP's Ulysses degree: it needs --sp-kind usp";
  s.ulysses = o.ulysses != 0 ? o.ulysses : loom::default_ulysses_degree(s.sp);
  if (o.microbatches < 1) return "--microbatches " + std::to_string(o.microbatches) + " must be at least 1";
  if (o.steps < 1) return "--steps " + std::to_string(o.steps) + " must be at least 1";
  if (o.bucket_bytes < sizeof(double)) return "--bucket-bytes " + std::to_string(o.bucket_bytes) + " is smaller than one value";
  for (auto [name, v] : {std::pair<const char*, int>{"--vocab", o.model.vocab}, {"--seq", o.model.seq},
                         {"--hidden", o.model.hidden}, {"--heads", o.model.heads}, {"--ffn", o.model.ffn}, {"--blocks", o.model.blocks}})
    if (v < 1) return std::string(name) + " " + std::to_string(v) + " must be at least 1";
  return s.rule(o.model);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"loom mesh example: a transformer on a dp x pp x sp x tp mesh, checked against a single-rank reference"};
  app.add_option("--dp", o.layout.dp, "data-parallel replicas");
  app.add_option("--tp", o.layout.tp, "tensor-parallel ranks");
  app.add_option("--pp", o.layout.pp, "pipeline ranks");
  app.add_option("--sp", o.layout.sp, "sequence-parallel ranks");
  app.add_option("--sp-kind", o.sp_kind, "megatron, ulysses, ring or usp");
  app.add_option("--ulysses", o.ulysses, "USP's Ulysses degree (default: the largest divisor of sp not above sqrt(sp))");
  app.add_option("--schedule", o.schedule, "pipeline schedule family (loom list)");
  app.add_option("--microbatches", o.microbatches, "microbatches per replica and step");
  app.add_option("--chunks", o.chunks, "model chunks per pipeline rank (0: the family's default)");
  app.add_option("--steps", o.steps, "training steps");
  app.add_option("--backend", o.backend, "threads or mpi")->check(CLI::IsMember({"threads", "mpi"}));
  app.add_flag("--deterministic", o.deterministic, "rank-ordered reductions: bitwise equal to the reference");
  app.add_flag("--zero", o.zero, "shard gradients and the update over the data-parallel group (ZeRO-2 style)");
  app.add_option("--bucket-bytes", o.bucket_bytes, "gradient bucket size in bytes (default 25 MB)");
  app.add_flag("--sync-after-step", o.lazy, "launch the gradient reductions after the step instead of as soon as ready");
  app.add_option("--vocab", o.model.vocab, "vocabulary size");
  app.add_option("--seq", o.model.seq, "tokens per sequence");
  app.add_option("--hidden", o.model.hidden, "model width");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--ffn", o.model.ffn, "MLP hidden features");
  app.add_option("--blocks", o.model.blocks, "transformer blocks (at least one per virtual stage)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "mesh: " << e.what() << "\n";
    return 2;
  }
  if (std::string why = configure(o); !why.empty()) {
    std::cerr << "mesh: " << why << "\n";
    return 2;
  }
  const sharding& s = o.layout;
  try {
    loom::schedule sched = loom::default_registry().at(o.schedule).make({s.pp, o.microbatches, o.chunks});
    model_spec m = o.model;
    m.blocks = std::max(m.blocks, sched.stages);
    auto banner = [&](const char* backend) {
      std::printf("loom mesh: %s (%d ranks, %s), schedule %s, %d microbatches per replica, %d virtual stages%s%s\n",
                  s.describe().c_str(), s.world(), backend, sched.name.c_str(), o.microbatches, sched.stages,
                  o.deterministic ? ", deterministic" : "", o.zero ? ", zero" : "");
      std::printf("model: vocab %d, sequence %d, hidden %d, heads %d, ffn %d, blocks %d; buckets of %zu bytes%s\n", m.vocab,
                  m.seq, m.hidden, m.heads, m.ffn, m.blocks, o.bucket_bytes, o.lazy ? ", synchronised after the step" : "");
      std::fflush(stdout);
    };
    if (o.backend == "threads") {
      banner("threads");
      int rc = 0;
      loom::run_threads(s.world(), [&](loom::threads::comm& c) {
        int r = train(c, o, m, sched);
        if (c.rank() == 0) rc = r;
      });
      return rc;
    }
#if defined(LOOM_HAS_MPI)
    loom::mpi::environment env(argc, argv);
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // Every rank checks the mesh against the world before any communication.
    if (std::string rule = make_mesh(s).world_rule(size); !rule.empty()) {
      if (rank == 0) std::cerr << "mesh: " << rule << "\n";
      return 2;
    }
    if (rank == 0) banner("MPI processes");
    int rc = 0;
    loom::run_mpi([&](loom::mpi::comm& c) { rc = train(c, o, m, sched); });
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
