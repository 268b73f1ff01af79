// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The example's --experts mode: the MoE model of moe_model.hpp (linear stages, then an MoE layer
// of E linear experts over ep, with Tutel's routing, capacity and auxiliary loss) trained over
// dp x pp x ep x tp on any communicator, checked against the single-process reference holding
// every expert; rank 0 prints, per step, the pairs dropped per expert and the auxiliary loss
// beside the reference's and the step's communication per dimension.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "moe_model.hpp"
#include "train.hpp"

namespace mesh_example {

//! The largest difference, relative to each tensor's largest value, allowed between the fp32 and
//! the double-precision references of the MoE model (the transformer's `fp32_bound` with SGD).
inline constexpr double moe_fp32_bound = 1e-4;

//! The mesh of the --experts mode: data outermost, then pipeline, expert and tensor parallelism.
using moe_mesh_type = loom::mesh<loom::dp<>, loom::pp<>, loom::ep<>, loom::tp<>>;

//! The rule a world of `size` ranks breaks for `s`, in one line, or "".
inline std::string moe_world_rule(const moe::mesh_setup& s, int size) {
  return moe_mesh_type{loom::dp<>{s.dp}, loom::pp<>{s.pp}, loom::ep<>{s.ep}, loom::tp<>{s.tp}}.world_rule(size);
}

//! The rule `s` breaks as the MoE model's layout (the routing options, the experts over their
//! group, the token and width splits over tp), in one line, or "".
inline std::string moe_setup_rule(const moe::mesh_setup& s) {
  if (std::string r = loom::moe_rule({.experts = s.E, .top_k = s.k, .capacity_factor = s.f}); !r.empty()) return r;
  for (auto [name, v] : {std::pair<const char*, int>{"--dp", s.dp}, {"--pp", s.pp}, {"--ep", s.ep}, {"--tp", s.tp}})
    if (v < 1) return std::string(name) + " " + std::to_string(v) + " must be at least 1";
  if (s.tp > 2) return "--experts: the MoE model's 10 tokens and width 4 split over --tp 1 or 2 (got " + std::to_string(s.tp) + ")";
  if (s.chunks < 1) return "--moe-chunks " + std::to_string(s.chunks) + " must be at least 1";
  if (s.chunks > 1 && s.pipeline_moe) return "--moe-chunks overlaps the all-to-alls on ep: Pipeline MoE (--moe-layout tp) has none";
  if (s.node_size < 0 || (s.node_size > 0 && s.ep % s.node_size != 0))
    return "--moe-node-size " + std::to_string(s.node_size) + " must divide --ep " + std::to_string(s.ep);
  if (s.node_size > 0 && s.chunks > 1) return "--moe-node-size and --moe-chunks: the overlapped exchange is flat";
  if (s.node_size > 0 && s.pipeline_moe) return "--moe-node-size: Pipeline MoE (--moe-layout tp) has no all-to-all";
  if (!s.adaptive.empty()) {  // Tutel's adaptive parallelism: E < ep, each expert over S = ep / E ranks
    if (s.pipeline_moe || s.chunks > 1 || s.node_size > 0 || s.tp > 1)
      return "--adaptive-r runs the flat exchange over ep alone: not with --moe-layout tp, --moe-chunks, --moe-node-size or --tp";
    for (int r : s.adaptive)
      if (std::string rule = loom::ep_adaptive_rule({s.ep, s.E, r}); !rule.empty()) return rule;
    if (4 % (s.ep / s.E) != 0)
      return "--adaptive-r: the MoE model's width 4 splits over " + std::to_string(s.ep / s.E) + " ranks per expert only if that divides 4";
    return {};
  }
  if (s.pipeline_moe) {
    if (s.ep != 1 || s.tp < 2) return "--moe-layout tp (Pipeline MoE) spreads the experts over tp: it needs --ep 1 and --tp 2";
    return loom::ep_rule(s.E, s.tp);
  }
  return loom::ep_rule(s.E, s.ep);
}

//! One rank of `world` trains the MoE model under `s` with `sched` and checks it against the
//! reference; rank 0 prints the steps when `print`. Returns the values (parameters, MoE forwards,
//! step volumes) that differ, summed over the world. Executor `X`: `host_exec` (double), or
//! `device_exec` (fp32 kernels on a device world), checked against the fp32 reference of the
//! same sums (bitwise in deterministic mode under loom's simulator; on a GPU, whose kernels add
//! in another order, and otherwise within 1e-5 of each tensor's largest value), and that
//! reference against the double one within `moe_fp32_bound`.
template <class X = host_exec, class World>
long long train_moe(World& world, const moe::mesh_setup& s, const loom::schedule& sched, bool print) {
  using real = typename X::value_type;
  constexpr bool fp32 = !std::is_same_v<real, double>;
#if defined(LOOM_CUDA_SIM)
  const bool bitwise_ok = true;
#else
  const bool bitwise_ok = !X::device;
#endif
  const double tol = fp32 ? 1e-5 : 1e-12;
  const int M = sched.microbatches;
  std::vector<std::vector<moe::basic_rank_result<real>>> last;
  std::vector<std::vector<std::vector<moe::basic_rank_result<real>>>> every;
  const auto want = moe::mesh_reference<real>(s, sched.stages, M, &last, &every);
  const moe::mesh_rank_result got = moe::mesh_train_rank<X>(world, s, sched, want, &last, bitwise_ok, tol);
  long long wide_bad = 0;  // fp32: the fp32 reference's weights beyond moe_fp32_bound of the double reference's
  double wide_diff = 0;
  if constexpr (fp32) {
    const auto wide = moe::mesh_reference<double>(s, sched.stages, M);
    auto check = [&](const std::vector<real>& a, const std::vector<double>& b) {
      double norm = 0, diff = 0;
      for (double v : b) norm = std::max(norm, std::abs(v));
      for (std::size_t i = 0; i < b.size(); ++i) diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
      const double rel = norm == 0 ? diff : diff / norm;
      wide_diff = std::max(wide_diff, rel);
      wide_bad += rel > moe_fp32_bound ? 1 : 0;
    };
    for (std::size_t d = 0; d < want.size(); ++d) {
      check(want[d].router, wide[d].router);
      check(want[d].experts, wide[d].experts);
      for (std::size_t l = 0; l < want[d].linear.size(); ++l) check(want[d].linear[l], wide[d].linear[l]);
    }
  }
  const bool root = world.rank() == 0;
  const auto E = static_cast<std::size_t>(s.E), T = static_cast<std::size_t>(s.tp), parts = s.pipeline_moe ? 1 : T;
  long long steps_differing = 0;  // steps whose drops per expert or mean auxiliary loss differ from the reference's
  for (std::size_t st = 0; st < got.steps.size(); ++st) {
    const moe::moe_step_report& r = got.steps[st];
    // Over the world: the drops per expert, the forwards, the all-to-all bytes on ep and the formula's.
    std::vector<std::int64_t> sums(E + 3, 0);  // int64_t: what every world reduces on the host
    for (std::size_t e = 0; e < r.dropped.size(); ++e) sums[e] = r.dropped[e];
    sums[E] = r.forwards;
    for (const auto& [name, c] : r.counts)  // the flat exchange, or the hierarchical one's node level (each level moves the whole buffer)
      if (name == "ep" || name == "ep (node)") sums[E + 1] += static_cast<std::int64_t>(c[loom::comm_op::all_to_all].bytes);
    sums[E + 2] = static_cast<std::int64_t>(r.formula_bytes);
    double aux = r.aux;
    world.all_reduce(std::span<std::int64_t>(sums), loom::reduce_op::sum);
    world.all_reduce(std::span<double>(&aux, 1), loom::reduce_op::sum);
    // The reference's, over the ranks holding distinct tokens.
    std::vector<long long> ref_dropped(E, 0);
    double ref_aux = 0;
    long long ref_forwards = 0;
    for (std::size_t rank = 0; rank < every[st].size(); ++rank) {
      if (rank % T >= parts) continue;
      for (const auto& f : every[st][rank]) {
        for (std::size_t e = 0; e < E; ++e) ref_dropped[e] += f.dropped_per_expert[e];
        ref_aux += f.aux;
        ++ref_forwards;
      }
    }
    // The world's sum adds the auxiliary losses in another order than the reference: 1e-12 relative.
    const double mean = sums[E] == 0 ? 0.0 : aux / static_cast<double>(sums[E]);
    const double ref_mean = ref_forwards == 0 ? 0.0 : ref_aux / static_cast<double>(ref_forwards);
    const bool same = sums[E] == ref_forwards && std::equal(ref_dropped.begin(), ref_dropped.end(), sums.begin()) &&
                      std::abs(mean - ref_mean) <= (fp32 ? 1e-6 : 1e-12) * std::abs(ref_mean);
    steps_differing += same ? 0 : 1;
    if (!root || !print) continue;
    auto list = [](const auto& v, std::size_t n) {
      std::string out;
      for (std::size_t i = 0; i < n; ++i) out += (i == 0 ? "" : " ") + std::to_string(v[i]);
      return out;
    };
    std::printf("the MoE layer in step %zu, all ranks:\n", st);
    std::printf("| step | MoE forwards | auxiliary loss (mean) | reference | pairs dropped per expert | reference | all-to-all bytes on ep | "
                "4 E h sum_j C_j x %zu | |\n|---|---|---|---|---|---|---|---|---|\n",
                sizeof(real));
    std::printf("| %zu | %lld | %.12f | %.12f | %s | %s | %lld | %lld | %s |\n", st, static_cast<long long>(sums[E]), mean, ref_mean,
                list(sums, E).c_str(), list(ref_dropped, E).c_str(), static_cast<long long>(sums[E + 1]), static_cast<long long>(sums[E + 2]),
                same ? "equal" : "DIFFERENT");
    print_counters(static_cast<int>(st), r.counts);
  }
  std::vector<std::int64_t> totals{got.differing, got.compared, got.forward_differing, got.forwards_compared, got.volume_mismatches};
  world.all_reduce(std::span<std::int64_t>(totals), loom::reduce_op::sum);
  const long long bad = totals[0] + totals[2] + totals[4] + steps_differing + wide_bad;
  if (root && print && fp32)
    std::printf("fp32 reference against the double-precision reference: largest parameter difference %.3g of its tensor's largest value "
                "(bound %.2g) -> %s\n",
                wide_diff, moe_fp32_bound, wide_bad == 0 ? "WITHIN" : "BEYOND");
  if (root && print)
    std::printf("reference check (%s): %lld of %lld parameter values, %lld of %lld MoE forward records of the last step (outputs, dropped pairs, "
                "auxiliary losses), %lld rank-steps' all-to-all volumes and %lld steps' drops and auxiliary losses differ -> %s\n",
                s.det && s.adaptive.empty() && bitwise_ok ? "bitwise" : fp32 ? "1e-5 relative" : "1e-12 relative", static_cast<long long>(totals[0]), static_cast<long long>(totals[1]), static_cast<long long>(totals[2]),
                static_cast<long long>(totals[3]), static_cast<long long>(totals[4]), steps_differing, bad == 0 ? "MATCH" : "DIFFERENT");
  return bad;
}

}  // namespace mesh_example
