// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mesh example's transformer over MPI processes (run by ctest under mpiexec, see
// CMakeLists.txt). Modes:
//   train8 - 8 processes: dp2 x pp2 x tp2 over every registered schedule family (deterministic
//            bitwise, ZeRO on and off) and 8-rank meshes with every sequence-parallel kind (causal,
//            and TokenRing and USP with full attention);
//            rank 0 prints MESH-MPI-OK when every run equals the reference.
//   train4 - 4 processes: dimensions in pairs (dp x tp, dp x pp, pp x sp, dp x sp, tp x sp).
//   fault  - 4 processes (pp2 x tp2): one rank's stage throws while its tensor-parallel peer
//            waits in a collective; every process must end with the same error naming it.
//   moe    - 4 processes: expert parallelism (loom/exec/moe.hpp) over E in {4, 8}, top-1 and
//            top-2, capacity factors 0, 0.5 and 1.25, each process with its own tokens and
//            experts (flat and hierarchical all-to-all, 2 nodes of 2, and overlapped in 3 pieces),
//            and Pipeline MoE's layout, and Tutel's adaptive degree r (E in {1, 2} FFN experts,
//            every valid r, within 1e-12, flat and hierarchical: tests/mesh/moe_adaptive_support.hpp),
//            against the single-process reference (examples/03_mesh/moe_layer.hpp), bit for bit.
//   moe-mesh - 4 processes: ep as a mesh dimension, linear stages and an MoE layer trained by
//            loom::data_parallel over dp2 x ep2, pp2 x ep2 and ep2 x tp2 (1f1b, zb-h1, dualpipe,
//            ZeRO-2, local SGD), and Pipeline MoE's layout over pp2 x tp2 (zb-h1), against the
//            reference of examples/03_mesh/moe_model.hpp.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <loom/comm/mpi.hpp>

#include "../mesh/mesh_support.hpp"
#include "../mesh/moe_adaptive_support.hpp"
#include "../../examples/03_mesh/moe_model.hpp"
#include "../../examples/03_mesh/moe_layer.hpp"

namespace {

using namespace mesh_example;

using mesh_test::layout;

int runs = 0, failures = 0;

void check(loom::mpi::comm& c, const sharding& s, const std::string& family, bool det, bool zero, int zero_stage = 0,
           bool adam = false, int local_steps = 0, bool causal = true) {
  const loom::schedule sched = loom::default_registry().at(family).make({s.pp, 2 * s.pp + 1, 0});
  model_spec m;
  m.blocks = std::max(m.blocks, sched.stages);
  m.causal = causal;
  run_options o{.layout = s, .microbatches = 2 * s.pp + 1, .steps = local_steps > 0 ? 4 : 2, .deterministic = det, .zero = zero,
                .zero_stage = zero_stage, .adam = adam, .local_steps = local_steps, .bucket_bytes = zero || zero_stage > 0 ? 512 : std::size_t{25} << 20};
  if (std::getenv("LOOM_MESH_MPI_TRACE") != nullptr && c.rank() == 0) {
    std::printf("run %s %s%s ZeRO stage %d%s local steps %d%s\n", s.describe().c_str(), family.c_str(), det ? " deterministic" : "",
                zero ? 2 : zero_stage, adam ? " adam" : "", local_steps, causal ? "" : " full attention");
    std::fflush(stdout);
  }
  auto r = train(c, o, m, sched);
  ++runs;
  if (r.differing != 0 || r.values == 0) {
    ++failures;
    if (c.rank() == 0)
      std::printf("MISMATCH %s %s%s%s ZeRO stage %d%s%s: %lld of %lld differ\n", s.describe().c_str(), family.c_str(),
                  det ? " deterministic" : "", zero ? " zero" : "", zero_stage, adam ? " adam" : "", causal ? "" : " full attention",
                  r.differing, r.values);
  }
}

int finish(loom::mpi::comm& c) {
  if (c.rank() == 0) {
    std::printf("%d runs, %d mismatches\n", runs, failures);
    if (failures == 0 && runs > 0) std::printf("MESH-MPI-OK\n");
  }
  return failures == 0 ? 0 : 1;
}

int mode_train8(loom::mpi::comm& c) {
  int i = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    if (!e.check(e.resolve({2, 5, 0})).empty()) continue;
    check(c, layout(2, 2, 2, 1), e.name, true, i % 2 == 0);
    if (i % 3 == 0) check(c, layout(2, 2, 2, 1), e.name, false, i % 2 == 1);
    ++i;
  }
  check(c, layout(1, 1, 2, 4, seq_kind::usp), "zb-h1", true, true);
  check(c, layout(2, 1, 1, 4, seq_kind::ring), "1f1b", true, false);
  check(c, layout(2, 2, 1, 2, seq_kind::tokenring), "zb-h1", true, false);
  check(c, layout(1, 1, 2, 4, seq_kind::tokenring), "1f1b", false, false);
  // Full attention (no causal mask): TokenRing with dp, tp and pp; Ulysses inside USP.
  check(c, layout(2, 2, 1, 2, seq_kind::tokenring), "1f1b", true, false, 0, false, 0, false);
  check(c, layout(1, 1, 2, 4, seq_kind::tokenring), "zb-h1", false, false, 0, false, 0, false);
  check(c, layout(1, 2, 1, 4, seq_kind::usp), "1f1b", true, false, 0, false, 0, false);
  check(c, layout(2, 2, 1, 2, seq_kind::ulysses), "1f1b", true, true);
  check(c, layout(2, 4, 1, 4, seq_kind::megatron), "1f1b", true, false);
  check(c, layout(1, 1, 1, 8, seq_kind::usp, 4), "1f1b", false, false);
  // ZeRO-1 and ZeRO-3 with Adam and SGD on the 8-rank mesh.
  check(c, layout(2, 2, 2, 1), "zb-h1", true, false, 3, true);
  check(c, layout(2, 2, 2, 1), "1f1b", true, false, 1, true);
  check(c, layout(2, 2, 2, 1), "interleaved-1f1b", false, false, 3, false);
  check(c, layout(2, 2, 2, 1), "dualpipe-v", false, false, 1, true);
  return finish(c);
}

int mode_train4(loom::mpi::comm& c) {
  for (bool det : {true, false}) {
    check(c, layout(2, 2, 1, 1), "1f1b", det, !det);
    check(c, layout(2, 1, 2, 1), "dualpipe", det, det);
    check(c, layout(2, 1, 2, 1), "zb-h1", det, !det);
    check(c, layout(1, 2, 2, 1), "interleaved-1f1b", det, false);
    check(c, layout(1, 1, 2, 2, seq_kind::ring), "zb-v", det, false);
    check(c, layout(2, 1, 1, 2, seq_kind::tokenring), "gpipe", det, det);
    check(c, layout(1, 1, 2, 2, seq_kind::ulysses), "1f1b", det, false);
    check(c, layout(2, 1, 1, 2, seq_kind::ring), "gpipe", det, det);
    check(c, layout(1, 2, 1, 2, seq_kind::ulysses), "1f1b", det, false);
    check(c, layout(2, 2, 1, 2, seq_kind::megatron), "1f1b", det, det);
    check(c, layout(1, 1, 1, 4, seq_kind::usp), "1f1b", det, det);
    check(c, layout(2, 1, 2, 1), "zb-h1", det, false, 3, true);  // ZeRO-3, Adam
    check(c, layout(2, 1, 1, 2, seq_kind::ring), "1f1b", det, false, 1, true);  // ZeRO-1, Adam, over dp x sp
    check(c, layout(2, 1, 2, 1), "interleaved-1f1b", det, false, 0, false, 2);   // local SGD, H = 2
    check(c, layout(2, 2, 1, 1), "1f1b", det, false, 0, true, 3);                // local SGD with Adam, H = 3
    check(c, layout(2, 1, 1, 2, seq_kind::ring), "gpipe", det, false, 0, false, 2);  // local SGD, ring inside the replica
  }
  return finish(c);
}

int mode_fault(loom::mpi::comm& c) {
  auto [what, sec] = mesh_test::tp_stage_failure(c);
  const bool ok = what.find("loom pipeline: rank 1: ") == 0 && what.find("injected failure") != std::string::npos && sec < 10;
  std::printf("%s rank %d: %s\n", ok ? "MESH-FAULT-OK" : "MESH-FAULT-MISSED", c.rank(), what.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

int mode_moe(loom::mpi::comm& c) {
  loom::counted<loom::mpi::comm> comm(c.split(0, c.rank()));
  const int ep = comm.size();
  for (int E : {4, 8})
    for (int k : {1, 2})
      for (double f : {0.0, 0.5, 1.25}) {
        if (E % ep != 0) continue;
        const auto p = mesh_example::moe::make(E, ep, k, f, static_cast<std::uint64_t>(ep * 1000 + E * 100 + k * 10) + static_cast<std::uint64_t>(f * 4));
        const auto want = mesh_example::moe::reference(p);
        loom::comm_counters counts;
        const auto got = mesh_example::moe::ep_run(p, comm, counts);
        const auto d = mesh_example::moe::differences(p, comm.rank(), ep, got, want[static_cast<std::size_t>(comm.rank())], counts);
        ++runs;
        if (!d.empty()) {
          ++failures;
          std::printf("MISMATCH moe rank %d E=%d k=%d f=%g: %s\n", comm.rank(), E, k, f, d.front().c_str());
        }
        // The hierarchical all-to-all, as 2 nodes of 2: the same results.
        const int r = comm.rank();
        loom::counted<loom::mpi::comm> node(c.split(r / 2, r % 2)), cross(c.split(r % 2, r / 2));
        const auto hier = mesh_example::moe::ep_run(p, comm, counts, &node, &cross);
        ++runs;
        if (hier.y != got.y || hier.dx != got.dx || hier.dwe != got.dwe || hier.dwg != got.dwg) {
          ++failures;
          std::printf("MISMATCH moe hierarchical rank %d E=%d k=%d f=%g\n", r, E, k, f);
        }
        // FSMoE-style overlap, 3 pieces of non-blocking all-to-alls: the same results.
        const auto over = mesh_example::moe::ep_run_overlapped(p, comm, counts, 3);
        ++runs;
        if (over.y != got.y || over.dx != got.dx || over.dwe != got.dwe || over.dwg != got.dwg) {
          ++failures;
          std::printf("MISMATCH moe overlapped rank %d E=%d k=%d f=%g\n", r, E, k, f);
        }
        // Pipeline MoE: the same tokens on every rank, the experts over them, one all-reduce forward.
        const auto one = mesh_example::moe::make(E, 1, k, f, static_cast<std::uint64_t>(ep * 1000 + E * 100 + k * 10 + 5) + static_cast<std::uint64_t>(f * 4));
        const auto ref = mesh_example::moe::reference(one)[0];
        const auto tp = mesh_example::moe::tp_run(one, comm, counts);
        ++runs;
        if (!mesh_example::moe::result_differences(one, r, ep, tp, ref).empty() || counts[loom::comm_op::all_reduce].calls != 3) {
          ++failures;
          std::printf("MISMATCH pipeline moe rank %d E=%d k=%d f=%g\n", r, E, k, f);
        }
      }
  // Tutel's adaptive parallelism: E < 4 FFN experts over the 4 processes, every valid degree r.
  for (int E : {1, 2})
    for (double f : {0.0, 1.0}) {
      namespace at = moe_adaptive_test;
      const auto p = at::make_ffn(ep, E, 1, f, static_cast<std::uint64_t>(7000 + E * 10) + static_cast<std::uint64_t>(f * 3));
      const auto want = at::reference(p);
      const std::size_t slice = p.H / static_cast<std::size_t>(p.S()) * p.h;
      const int r0 = comm.rank();
      const std::size_t first = static_cast<std::size_t>(r0 / p.S()) * p.H * p.h + static_cast<std::size_t>(r0 % p.S()) * slice;
      const at::vec dw1(want[0].dw1.begin() + static_cast<std::ptrdiff_t>(first), want[0].dw1.begin() + static_cast<std::ptrdiff_t>(first + slice));
      const at::vec dw2(want[0].dw2.begin() + static_cast<std::ptrdiff_t>(first), want[0].dw2.begin() + static_cast<std::ptrdiff_t>(first + slice));
      for (int r : loom::ep_adaptive_degrees(E, ep)) {
        const auto got = at::adaptive_run(p, comm, r);
        const auto& ref = want[static_cast<std::size_t>(r0)];
        ++runs;
        if (got.dropped != ref.dropped || at::far(got.y, ref.y) != 0 || at::far(got.dx, ref.dx) != 0 || at::far(got.dwg, ref.dwg) != 0 ||
            at::far(got.dw1, dw1) != 0 || at::far(got.dw2, dw2) != 0) {
          ++failures;
          std::printf("MISMATCH moe adaptive rank %d E=%d f=%g r=%d\n", r0, E, f, r);
        }
        // The hierarchical all-to-all, as 2 nodes of 2: bit for bit the flat exchange's results.
        loom::counted<loom::mpi::comm> node(c.split(r0 / 2, r0 % 2)), cross(c.split(r0 % 2, r0 / 2));
        const auto hier = at::adaptive_run(p, comm, r, &node, &cross);
        ++runs;
        if (hier.y != got.y || hier.dx != got.dx || hier.dwg != got.dwg || hier.dw1 != got.dw1 || hier.dw2 != got.dw2 || hier.dropped != got.dropped) {
          ++failures;
          std::printf("MISMATCH moe adaptive hierarchical rank %d E=%d f=%g r=%d\n", r0, E, f, r);
        }
      }
    }
  int bad = failures;
  c.all_reduce(std::span<int>(&bad, 1), loom::reduce_op::sum);
  failures = bad;
  return finish(c);
}

// ep as a mesh dimension: linear stages and an MoE layer over dp x pp x ep on 4 processes,
// trained by loom::data_parallel, equal the single-process reference (examples/03_mesh/moe_model.hpp).
int mode_moe_mesh(loom::mpi::comm& c) {
  struct run_case {
    mesh_example::moe::mesh_setup s;
    const char* family;
  };
  std::vector<run_case> cases;
  for (bool det : {true, false}) {
    cases.push_back({{.dp = 2, .ep = 2, .k = 1, .f = 0.5, .det = det}, "1f1b"});
    cases.push_back({{.dp = 1, .pp = 2, .ep = 2, .det = det}, "zb-h1"});
    cases.push_back({{.dp = 1, .pp = 2, .ep = 2, .f = 0.0, .det = det}, "dualpipe"});
    cases.push_back({{.dp = 2, .ep = 2, .det = det, .zero = 2}, "1f1b"});
    cases.push_back({{.ep = 2, .det = det, .tp = 2}, "1f1b"});
    cases.push_back({{.pp = 2, .ep = 1, .det = det, .tp = 2, .pipeline_moe = true}, "zb-h1"});
  }
  cases.push_back({{.dp = 2, .ep = 2, .steps = 3, .local_steps = 2}, "1f1b"});
  cases.push_back({{.pp = 2, .ep = 2, .det = true, .chunks = 3}, "zb-h1"});  // the exchange overlapped (FSMoE)
  cases.push_back({{.ep = 4, .det = true, .node_size = 2}, "1f1b"});          // Tutel's 2D exchange, 2 nodes of 2
  cases.push_back({{.ep = 4, .E = 2, .steps = 3, .det = true, .adaptive = {2, 0, 1}}, "1f1b"});  // Tutel's degree r, switched per step
  for (const run_case& rc : cases) {
    const auto& entry = loom::default_registry().at(rc.family);
    const loom::schedule sched = entry.make(entry.resolve({rc.s.pp, rc.s.pp == 1 ? 1 : 2 * rc.s.pp, 0}));
    std::vector<std::vector<mesh_example::moe::rank_result>> last;
    const auto want = mesh_example::moe::mesh_reference(rc.s, sched.stages, sched.microbatches, &last);
    const auto got = mesh_example::moe::mesh_train_rank(c, rc.s, sched, want, &last);
    ++runs;
    if (got.differing != 0 || got.compared == 0 || got.moved == 0 || got.volume_mismatches != 0 || got.forward_differing != 0) {
      ++failures;
      std::printf("MISMATCH moe-mesh rank %d %s %s: %lld of %lld values differ, %lld moved, %d steps with other all-to-all bytes, %lld of %lld "
                  "forwards differ\n",
                  c.rank(), mesh_example::moe::describe(rc.s).c_str(), rc.family, got.differing, got.compared, got.moved, got.volume_mismatches,
                  got.forward_differing, got.forwards_compared);
    }
  }
  int bad = failures;
  c.all_reduce(std::span<int>(&bad, 1), loom::reduce_op::sum);
  failures = bad;
  return finish(c);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto c = loom::mpi::comm::world();
  c.set_timeout(std::chrono::seconds(60));
  try {
    if (mode == "train8") return mode_train8(c);
    if (mode == "train4") return mode_train4(c);
    if (mode == "fault") return mode_fault(c);
    if (mode == "moe") return mode_moe(c);
    if (mode == "moe-mesh") return mode_moe_mesh(c);
  } catch (const std::exception& e) {
    std::printf("rank %d: %s\n", c.rank(), e.what());
    c.abort_with_cause(std::string("threw: ") + e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: test_mesh_mpi train8|train4|fault|moe|moe-mesh\n");
  return 2;
}
