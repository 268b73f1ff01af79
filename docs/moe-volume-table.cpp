// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/moe.md's volume table: one MoE layer's forward and backward on 4 threads, each
// layout run through loom's counted communicators (the example's MoE layer,
// examples/03_mesh/moe_layer.hpp, and the adaptive FFN layer of tests/mesh/moe_adaptive_support.hpp),
// rank 0's counted collectives beside the documented formula.
//   build/tests/docs/doc_moe-volume-table
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "../examples/03_mesh/moe_layer.hpp"
#include "../tests/mesh/moe_adaptive_support.hpp"
#include "loom/comm/counting.hpp"
#include "loom/comm/threads.hpp"

namespace {

namespace moe = mesh_example::moe;
using counted = loom::counted<loom::threads::comm>;

void row(const char* layout, const char* group, loom::comm_op op, const loom::comm_counters& c, const std::string& formula, double want) {
  const auto& x = c[op];
  std::printf("| %s | %s | %s | %llu | %llu | %s = %.0f | %s |\n", layout, group, std::string(loom::to_string(op)).c_str(),
              static_cast<unsigned long long>(x.calls), static_cast<unsigned long long>(x.bytes), formula.c_str(), want,
              static_cast<double>(x.bytes) == want ? "equal" : "DIFFERENT");
}

}  // namespace

int main() {
  // E = 8 linear experts, top-2, f = 1.25 over 4 ranks of 10 tokens of width 4: C = 2 floor(1.25 ceil(10 / 8)) = 4.
  const moe::problem p = moe::make(8, 4, 2, 1.25, 4242);
  const double E = 8, h = 4, n = 10, k = 2, b = 8;  // b: bytes per double
  std::printf("| layout | group | operation | calls | bytes | formula (bytes) | |\n|:--|:--|:--|---:|---:|:--|:-:|\n");
  loom::comm_counters flat, node_c, cross_c, over, tp;
  long long C = 0;
  loom::run_threads(4, [&](loom::threads::comm& world) {
    counted comm(world.split(0, world.rank()));
    const int r = world.rank();
    loom::comm_counters mine;
    const auto a = moe::ep_run(p, comm, mine);
    counted node(world.split(r / 2, r % 2)), cross(world.split(r % 2, r / 2));
    loom::comm_counters unused;
    (void)moe::ep_run(p, comm, unused, &node, &cross);
    loom::comm_counters chunked;
    (void)moe::ep_run_overlapped(p, comm, chunked, 3);
    counted tpc(world.split(0, world.rank()));
    loom::comm_counters pmoe;
    (void)moe::tp_run(p, tpc, pmoe);
    if (r == 0) {
      flat = mine;
      node_c = node.counters();
      cross_c = cross.counters();
      over = chunked;
      tp = pmoe;
      C = a.capacity;
    }
  });
  const double buffer = E * static_cast<double>(C) * h * b;
  const std::string ech = "4 E C h x 8 (C = " + std::to_string(C) + ")";
  row("expert parallel, flat", "ep (4)", loom::comm_op::all_to_all, flat, ech, 4 * buffer);
  row("hierarchical, 2 nodes x 2", "node (2)", loom::comm_op::all_to_all, node_c, ech, 4 * buffer);
  row("hierarchical, 2 nodes x 2", "cross (2)", loom::comm_op::all_to_all, cross_c, ech, 4 * buffer);
  row("overlapped, 3 pieces", "ep (4)", loom::comm_op::all_to_all, over, ech + " in 4 min(3, C) calls", 4 * buffer);
  row("Pipeline MoE", "tp (4)", loom::comm_op::all_reduce, tp, "(2 n h + n k) x 8", (2 * n * h + n * k) * b);
  // Tutel's adaptive degree r: E = 2 FFN experts over W = 4 ranks (S = 2), the gathers on each
  // degree's gather group, the all-to-alls on the ep group; bus volume in elements.
  namespace at = moe_adaptive_test;
  const at::ffn_problem fp = at::make_ffn(4, 2, 1, 1.0, 777);
  std::printf("\n| adaptive degree r | gather group | all-to-alls | counted volume (elements) | V(r) | |\n|---:|---:|---:|---:|---:|:-:|\n");
  for (int r : loom::ep_adaptive_degrees(2, 4)) {
    at::result got;
    loom::run_threads(4, [&](loom::threads::comm& world) {
      counted comm(world.split(0, world.rank()));
      auto o = at::adaptive_run(fp, comm, r);
      if (world.rank() == 0) got = o;
    });
    const loom::ep_adaptive a{4, 2, r};
    const double v = loom::ep_adaptive_volume(a, static_cast<std::size_t>(got.capacity), fp.h, fp.params_per_expert());
    std::printf("| %d | %d | %llu | %.0f | %.0f | %s |\n", r, a.group(), static_cast<unsigned long long>(got.all_to_alls), got.volume, v,
                std::abs(got.volume - v) <= 1e-9 * v ? "equal" : "DIFFERENT");
  }
}
