// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A small MoE layer with linear experts (h = 4, 10 tokens per rank), the single-process reference
// holding every expert, one rank's expert-parallel run over any counted communicator, and the
// layer as a pipeline stage (`moe_stage`). Used by the example's --experts mode (moe_model.hpp)
// and by the tests (tests/mesh/moe_ep_test.cpp on threads, tests/mesh_mpi on MPI).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/exec/data_parallel.hpp"
#include "loom/exec/moe.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/stage/stage.hpp"

namespace mesh_example::moe {

using vec = std::vector<double>;

inline double val(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

struct problem {
  int E = 0, ranks = 0;
  std::size_t n = 0, h = 0;
  loom::moe_options o;
  double lambda = 0.01;
  std::vector<vec> x, c;  // per rank: tokens [n][h], loss weights [n][h]
  vec wg, we;             // router [E][h], experts [E][h][h]
};

inline problem make(int E, int ranks, int k, double f, std::uint64_t seed) {
  problem p{E, ranks, 10, 4, {.experts = E, .top_k = k, .capacity_factor = f}, 0.01, {}, {}, {}, {}};
  for (int r = 0; r < ranks; ++r) {
    vec x(p.n * p.h), c(p.n * p.h);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = val(seed + 1 + static_cast<std::uint64_t>(r), i);
      c[i] = val(seed + 101 + static_cast<std::uint64_t>(r), i);
    }
    p.x.push_back(x);
    p.c.push_back(c);
  }
  p.wg.resize(static_cast<std::size_t>(E) * p.h);
  p.we.resize(static_cast<std::size_t>(E) * p.h * p.h);
  for (std::size_t i = 0; i < p.wg.size(); ++i) p.wg[i] = 2.5 * val(seed + 7, i);
  for (std::size_t i = 0; i < p.we.size(); ++i) p.we[i] = val(seed + 9, i);
  return p;
}

// What one rank ends with.
struct rank_result {
  vec y, dx, dwg;
  vec dwe;  // its experts' gradients ([E/ep][h][h] with ep; all E in the reference)
  std::vector<std::pair<int, int>> dropped;
  std::vector<long long> dropped_per_expert;  // [E] (the reference sets it)
  long long capacity = 0;
  double aux = 0;  // GShard's auxiliary loss of the rank's routing (the reference sets it)
};

inline std::vector<std::pair<int, int>> dropped_of(const loom::moe_routing<double>& r) {
  std::vector<std::pair<int, int>> out;
  for (std::size_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < r.top_k; ++j)
      if (!r.kept(t, j)) out.emplace_back(static_cast<int>(t), j);
  return out;
}

// Experts `first .. first + count` on `rows_per_expert` rows each: forward, or input and weight gradients.
inline void experts_forward(const problem& p, int first, int count, std::size_t rows_per_expert, std::span<const double> in, std::span<double> out) {
  const std::size_t h = p.h, b = rows_per_expert * h;
  for (int e = 0; e < count; ++e)
    loom::linear_kernel::forward(in.subspan(static_cast<std::size_t>(e) * b, b),
                                 std::span<const double>(p.we).subspan(static_cast<std::size_t>(first + e) * h * h, h * h), std::span<const double>{},
                                 out.subspan(static_cast<std::size_t>(e) * b, b), rows_per_expert, h, h);
}
inline void experts_backward(const problem& p, int first, int count, std::size_t rows_per_expert, std::span<const double> in, std::span<const double> dout,
                      std::span<double> din, std::span<double> dw) {
  const std::size_t h = p.h, b = rows_per_expert * h;
  for (int e = 0; e < count; ++e) {
    const auto w = std::span<const double>(p.we).subspan(static_cast<std::size_t>(first + e) * h * h, h * h);
    loom::linear_kernel::backward_input(dout.subspan(static_cast<std::size_t>(e) * b, b), w, din.subspan(static_cast<std::size_t>(e) * b, b),
                                        rows_per_expert, h, h);
    loom::linear_kernel::backward_weight(in.subspan(static_cast<std::size_t>(e) * b, b), dout.subspan(static_cast<std::size_t>(e) * b, b),
                                         dw.subspan(static_cast<std::size_t>(e) * h * h, h * h), std::span<double>{}, rows_per_expert, h, h);
  }
}

// Rank r's routing, and the layer's front and back around the experts.
inline loom::moe_routing<double> route(const problem& p, int r) {
  const auto E = static_cast<std::size_t>(p.E);
  vec logits(p.n * E);
  loom::linear_kernel::forward(std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<const double>(p.wg), std::span<const double>{},
                               std::span<double>(logits), p.n, p.h, E);
  return loom::moe_route(p.o, std::span<const double>(logits));
}

inline void router_backward(const problem& p, int r, const loom::moe_routing<double>& rt, std::span<const double> dgate, rank_result& out) {
  const auto E = static_cast<std::size_t>(p.E);
  vec dlogits(p.n * E), dxr(p.n * p.h);
  loom::moe_route_backward(rt, p.o, dgate, p.lambda, std::span<double>(dlogits));
  loom::linear_kernel::backward_input(std::span<const double>(dlogits), std::span<const double>(p.wg), std::span<double>(dxr), p.n, p.h, E);
  for (std::size_t i = 0; i < out.dx.size(); ++i) out.dx[i] += dxr[i];
  out.dwg.assign(E * p.h, 0.0);
  loom::linear_kernel::backward_weight(std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<const double>(dlogits), std::span<double>(out.dwg),
                                       std::span<double>{}, p.n, p.h, E);
}

// The reference: one process, every expert, each rank's tokens routed on their own; an expert's
// weight gradient accumulates over the ranks in rank order (what the expert-parallel rank's
// source-major rows give).
inline std::vector<rank_result> reference(const problem& p) {
  const auto E = static_cast<std::size_t>(p.E);
  std::vector<loom::moe_routing<double>> rt;
  long long most = 0;
  for (int r = 0; r < p.ranks; ++r) {
    rt.push_back(route(p, r));
    most = std::max(most, rt.back().max_load());
  }
  std::vector<rank_result> out(static_cast<std::size_t>(p.ranks));
  vec dwe(E * p.h * p.h, 0.0);
  for (int r = 0; r < p.ranks; ++r) {
    auto& R = rt[static_cast<std::size_t>(r)];
    loom::set_capacity(R, p.o, most);
    const auto C = static_cast<std::size_t>(R.capacity);
    vec slots(E * C * p.h), eo(E * C * p.h), dout(E * C * p.h), dslots(E * C * p.h), dgate(p.n * static_cast<std::size_t>(p.o.top_k));
    rank_result& o = out[static_cast<std::size_t>(r)];
    o.y.assign(p.n * p.h, 0.0);
    o.dx.assign(p.n * p.h, 0.0);
    loom::moe_dispatch(R, std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<double>(slots), p.h);
    experts_forward(p, 0, p.E, C, std::span<const double>(slots), std::span<double>(eo));
    loom::moe_combine(R, std::span<const double>(eo), std::span<double>(o.y), p.h);
    loom::moe_combine_backward(R, std::span<const double>(eo), std::span<const double>(p.c[static_cast<std::size_t>(r)]), std::span<double>(dout),
                               std::span<double>(dgate), p.h);
    experts_backward(p, 0, p.E, C, std::span<const double>(slots), std::span<const double>(dout), std::span<double>(dslots), std::span<double>(dwe));
    loom::moe_dispatch_backward(R, std::span<const double>(dslots), std::span<double>(o.dx), p.h);
    router_backward(p, r, R, std::span<const double>(dgate), o);
    o.dropped = dropped_of(R);
    o.capacity = R.capacity;
    o.aux = loom::moe_aux_loss(R);
    o.dropped_per_expert = R.dropped_per_expert();
  }
  for (auto& o : out) o.dwe = dwe;
  return out;
}

// One rank of an expert-parallel layer over `comm` (ep = its size): routing with the group's
// capacity, dispatch, the local experts, combine, and the backward; `counts` gets the counted
// communicator's operations from the routing on.
template <class C>
rank_result ep_run(const problem& p, C& comm, loom::comm_counters& counts, C* node = nullptr, C* cross = nullptr) {
  loom::ep_group<C> g{&comm, node, cross};
  const int r = g.rank(), ep = g.size(), E = p.E, El = E / ep, k = p.o.top_k;
  comm.reset_counters();
  auto R = route(p, r);
  loom::set_capacity(g, R, p.o);
  const auto C_ = static_cast<std::size_t>(R.capacity);
  const std::size_t all = static_cast<std::size_t>(E) * C_ * p.h;
  vec slots(all), scratch(all), xin(all), eo(all), back(all), dout(all), drows(all), din(all), dslots(all);
  vec dgate(p.n * static_cast<std::size_t>(k));
  rank_result o;
  o.y.assign(p.n * p.h, 0.0);
  o.dx.assign(p.n * p.h, 0.0);
  o.dwe.assign(static_cast<std::size_t>(El) * p.h * p.h, 0.0);
  const auto& x = p.x[static_cast<std::size_t>(r)];
  // Forward: dispatch, to the experts' ranks, the local experts, back, combine.
  loom::moe_dispatch(R, std::span<const double>(x), std::span<double>(slots), p.h);
  loom::ep_to_experts(g, E, std::span<const double>(slots), std::span<double>(scratch), std::span<double>(xin));
  experts_forward(p, r * El, El, static_cast<std::size_t>(ep) * C_, std::span<const double>(xin), std::span<double>(eo));
  loom::ep_from_experts(g, E, std::span<const double>(eo), std::span<double>(scratch), std::span<double>(back));
  loom::moe_combine(R, std::span<const double>(back), std::span<double>(o.y), p.h);
  // Backward: the same exchanges in reverse.
  loom::moe_combine_backward(R, std::span<const double>(back), std::span<const double>(p.c[static_cast<std::size_t>(r)]), std::span<double>(dout),
                             std::span<double>(dgate), p.h);
  loom::ep_to_experts(g, E, std::span<const double>(dout), std::span<double>(scratch), std::span<double>(drows));
  experts_backward(p, r * El, El, static_cast<std::size_t>(ep) * C_, std::span<const double>(xin), std::span<const double>(drows),
                   std::span<double>(din), std::span<double>(o.dwe));
  loom::ep_from_experts(g, E, std::span<const double>(din), std::span<double>(scratch), std::span<double>(dslots));
  loom::moe_dispatch_backward(R, std::span<const double>(dslots), std::span<double>(o.dx), p.h);
  router_backward(p, r, R, std::span<const double>(dgate), o);
  o.dropped = dropped_of(R);
  o.capacity = R.capacity;
  counts = comm.counters();
  return o;
}

// The results of rank `r` (of `ep`) that differ from the reference's, as words (empty: equal bit
// for bit); `b.dwe` holds every expert, `a.dwe` the rank's.
inline std::vector<std::string> result_differences(const problem& p, int r, int ep, const rank_result& a, const rank_result& b) {
  std::vector<std::string> out;
  if (a.capacity != b.capacity) out.push_back("capacity");
  if (a.dropped != b.dropped) out.push_back("dropped pairs");
  if (a.y != b.y) out.push_back("output");
  if (a.dx != b.dx) out.push_back("input gradient");
  if (a.dwg != b.dwg) out.push_back("router gradient");
  const std::size_t hh = p.h * p.h, El = static_cast<std::size_t>(p.E / ep);
  if (a.dwe != vec(b.dwe.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * El * hh),
                   b.dwe.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(r) + 1) * El * hh)))
    out.push_back("expert gradients");
  return out;
}

// The same, and the flat exchange's volume: 4 E C h doubles, one all-reduce exactly when f = 0.
inline std::vector<std::string> differences(const problem& p, int r, int ep, const rank_result& a, const rank_result& b,
                                            const loom::comm_counters& counts) {
  std::vector<std::string> out = result_differences(p, r, ep, a, b);
  if (ep > 1) {
    const auto& a2a = counts[loom::comm_op::all_to_all];
    if (a2a.calls != 4) out.push_back("all-to-all calls " + std::to_string(a2a.calls));
    if (a2a.bytes != 4 * static_cast<std::uint64_t>(p.E) * static_cast<std::uint64_t>(a.capacity) * p.h * sizeof(double))
      out.push_back("all-to-all bytes " + std::to_string(a2a.bytes));
    if (counts[loom::comm_op::all_reduce].calls != (p.o.capacity_factor == 0.0 ? 1u : 0u)) out.push_back("all-reduce calls");
  }
  return out;
}

// One rank of Pipeline MoE's layout over `comm` (tp = its size): every rank holds the same tokens
// (`p.x[0]`) and E/tp experts; dispatch by slicing, a partial combine and one all-reduce; the
// backward's two all-reduces.
template <class C>
rank_result tp_run(const problem& p, C& comm, loom::comm_counters& counts) {
  loom::ep_group<C> g{&comm};
  const int tp = g.size(), E = p.E, El = E / tp, k = p.o.top_k;
  const loom::moe_experts held = loom::tp_experts(E, g);
  comm.reset_counters();
  auto R = route(p, 0);
  loom::set_capacity(R, p.o, R.max_load());  // the same tokens everywhere: the same capacity, no communication
  const auto C_ = static_cast<std::size_t>(R.capacity);
  const std::size_t local = static_cast<std::size_t>(El) * C_ * p.h;
  vec slots(local), eo(local), dout(local), dslots(local), dgate(p.n * static_cast<std::size_t>(k));
  rank_result o;
  o.y.assign(p.n * p.h, 0.0);
  o.dx.assign(p.n * p.h, 0.0);
  o.dwe.assign(static_cast<std::size_t>(El) * p.h * p.h, 0.0);
  loom::moe_dispatch(R, std::span<const double>(p.x[0]), std::span<double>(slots), p.h, held);
  experts_forward(p, held.first, El, C_, std::span<const double>(slots), std::span<double>(eo));
  loom::tp_moe_combine(g, R, std::span<const double>(eo), std::span<double>(o.y), p.h);
  loom::moe_combine_backward(R, std::span<const double>(eo), std::span<const double>(p.c[0]), std::span<double>(dout), std::span<double>(dgate), p.h,
                             held);
  experts_backward(p, held.first, El, C_, std::span<const double>(slots), std::span<const double>(dout), std::span<double>(dslots),
                   std::span<double>(o.dwe));
  loom::moe_dispatch_backward(R, std::span<const double>(dslots), std::span<double>(o.dx), p.h, held);
  loom::tp_moe_backward_sum(g, std::span<double>(o.dx), std::span<double>(dgate));
  router_backward(p, 0, R, std::span<const double>(dgate), o);
  o.dropped = dropped_of(R);
  o.capacity = R.capacity;
  counts = comm.counters();
  return o;
}

// One rank of the expert-parallel layer with FSMoE-style overlap: `chunks` pieces of the slots,
// each piece's all-to-alls non-blocking around the experts' work on the previous one; the experts'
// weight gradients over the whole rows afterwards.
template <class C>
rank_result ep_run_overlapped(const problem& p, C& comm, loom::comm_counters& counts, int chunks) {
  loom::ep_group<C> g{&comm};
  const int r = g.rank(), ep = g.size(), E = p.E, El = E / ep, k = p.o.top_k;
  comm.reset_counters();
  auto R = route(p, r);
  loom::set_capacity(g, R, p.o);
  const auto C_ = static_cast<std::size_t>(R.capacity);
  const std::size_t all = static_cast<std::size_t>(E) * C_ * p.h, h = p.h;
  vec slots(all), xin(all), eo(all), back(all), dout(all), drows(all), din(all), dslots(all), scratch(4 * all);
  vec dgate(p.n * static_cast<std::size_t>(k));
  rank_result o;
  o.y.assign(p.n * h, 0.0);
  o.dx.assign(p.n * h, 0.0);
  o.dwe.assign(static_cast<std::size_t>(El) * h * h, 0.0);
  auto weight = [&](int e) { return std::span<const double>(p.we).subspan(static_cast<std::size_t>(r * El + e) * h * h, h * h); };
  loom::moe_dispatch(R, std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<double>(slots), h);
  loom::ep_overlapped(g, E, C_, h, chunks, std::span<const double>(slots), std::span<double>(back), std::span<double>(xin), std::span<double>(eo),
                      std::span<double>(scratch), [&](int e, std::span<const double> in, std::span<double> out, std::size_t rows) {
                        loom::linear_kernel::forward(in, weight(e), std::span<const double>{}, out, rows, h, h);
                      });
  loom::moe_combine(R, std::span<const double>(back), std::span<double>(o.y), h);
  loom::moe_combine_backward(R, std::span<const double>(back), std::span<const double>(p.c[static_cast<std::size_t>(r)]), std::span<double>(dout),
                             std::span<double>(dgate), h);
  loom::ep_overlapped(g, E, C_, h, chunks, std::span<const double>(dout), std::span<double>(dslots), std::span<double>(drows), std::span<double>(din),
                      std::span<double>(scratch), [&](int e, std::span<const double> in, std::span<double> out, std::size_t rows) {
                        loom::linear_kernel::backward_input(in, weight(e), out, rows, h, h);
                      });
  const std::size_t b = static_cast<std::size_t>(ep) * C_ * h;
  for (int e = 0; e < El; ++e)
    loom::linear_kernel::backward_weight(std::span<const double>(xin).subspan(static_cast<std::size_t>(e) * b, b),
                                         std::span<const double>(drows).subspan(static_cast<std::size_t>(e) * b, b),
                                         std::span<double>(o.dwe).subspan(static_cast<std::size_t>(e) * h * h, h * h), std::span<double>{},
                                         static_cast<std::size_t>(ep) * C_, h, h);
  loom::moe_dispatch_backward(R, std::span<const double>(dslots), std::span<double>(o.dx), h);
  router_backward(p, r, R, std::span<const double>(dgate), o);
  o.dropped = dropped_of(R);
  o.capacity = R.capacity;
  counts = comm.counters();
  return o;
}

// A pipeline stage holding one MoE layer over the expert-parallel communicator `comm` (null: every
// expert here): the router (dense: E x h, reduced over dp x ep) and this rank's E/ep experts
// (`grad_range::expert`: reduced over dp alone). Its output is the loss terms c_i y_i and
// lambda l_aux, so the backward seeded with 1 (`loss_scaling::sum`) gives exactly the reference's
// dy = c, daux = lambda. `c` points to the step's loss weights of this rank's tokens, microbatch
// after microbatch. `partial` names the dimensions whose ranks hold other tokens besides dp and ep
// (tp when the tokens are split over it), for both ranges. With `experts_over` (Pipeline MoE's
// layout) the experts spread over that group instead, whose ranks hold the same tokens: dispatch
// by slicing, combine and the backward's sums by all-reduce (`comm` then has one rank). With
// `chunks` > 1 the exchange overlaps with the experts FSMoE-style (`loom::ep_overlapped`, both
// ways), with the unchunked exchange's results bit for bit. With `node` and `cross` (the ep
// group's ranks on this rank's node and those with its index on every node) the exchange is
// Tutel's 2D hierarchical one. A split stage: `backward_input` leaves what the weight gradients need.
//! Tutel's adaptive parallelism inside the stage (`moe_stage`'s adaptive mode): the gather group
//! of every valid degree r (`loom::ep_adaptive_split` of the ep group), and the degree the next
//! step runs, which may change from step to step without moving a parameter.
template <class C>
struct moe_adaptive_groups {
  std::vector<std::pair<int, C*>> gather;  //!< (r, the gather group of r)
  int degree = 0;                          //!< the current r
  //! The gather group of `r`.
  C& of(int r) const {
    for (auto [d, c] : gather)
      if (d == r) return *c;
    throw loom::config_error("moe: no gather group for the adaptive degree " + std::to_string(r));
  }
};

template <class C>
class moe_stage {
 public:
  using value_type = double;
  moe_stage(const problem& p, C* comm, const vec* c, loom::dim_set partial = {}, C* experts_over = nullptr, int chunks = 1, C* node = nullptr,
            C* cross = nullptr, const moe_adaptive_groups<C>* adaptive = nullptr)
      : p_(&p), g_{comm, node, cross}, tpg_{experts_over}, c_(c), chunks_(chunks), ad_(adaptive) {
    const int ep = g_.size();
    if (ad_ != nullptr) {  // Tutel's layout: rank w holds columns [j h/S, (j+1) h/S) of expert w / S, j = w % S
      if (std::string rule = loom::ep_adaptive_rule({ep, p.E, 0}); !rule.empty()) throw loom::config_error(rule);
      const auto S = static_cast<std::size_t>(ep / p.E), w = static_cast<std::size_t>(g_.rank());
      if (p.h % S != 0) throw loom::config_error("moe: the width " + std::to_string(p.h) + " does not split over " + std::to_string(S) + " ranks per expert");
      const std::size_t hs = p.h / S, router = static_cast<std::size_t>(p.E) * p.h;
      params_.assign(p.wg.begin(), p.wg.end());
      for (std::size_t o = 0; o < p.h; ++o)
        for (std::size_t i = 0; i < hs; ++i) params_.push_back(p.we[(w / S) * p.h * p.h + o * p.h + (w % S) * hs + i]);
      grad_.assign(params_.size(), 0.0);
      ranges_ = {loom::grad_range{0, router, partial}, loom::grad_range{router, p.h * hs, partial, true}};
      return;
    }
    if (std::string rule = loom::ep_rule(p.E, ep); !rule.empty()) throw loom::config_error(rule);
    if (chunks < 1) throw loom::config_error("moe: the overlap needs >= 1 chunk (got " + std::to_string(chunks) + ")");
    if (chunks > 1 && experts_over != nullptr) throw loom::config_error("moe: Pipeline MoE has no all-to-all to overlap (chunks must be 1)");
    el_ = p.E / ep;
    int first = g_.rank() * el_;
    if (experts_over != nullptr) {
      held_ = loom::tp_experts(p.E, tpg_);
      el_ = held_.count;
      first = held_.first;
    }
    const std::size_t hh = p.h * p.h, router = static_cast<std::size_t>(p.E) * p.h;
    params_.assign(p.wg.begin(), p.wg.end());
    params_.insert(params_.end(), p.we.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * hh),
                   p.we.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first + el_) * hh));
    grad_.assign(params_.size(), 0.0);
    ranges_ = {loom::grad_range{0, router, partial}, loom::grad_range{router, static_cast<std::size_t>(el_) * hh, partial, true}};
  }
  std::size_t input_size() const { return p_->n * p_->h; }
  std::size_t output_size() const { return p_->n * p_->h + 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> params() { return params_; }
  std::span<double> weight_grad() { return grad_; }
  std::span<const loom::grad_range> grad_ranges() const { return ranges_; }
  std::span<const double> router() const { return std::span<const double>(params_).first(static_cast<std::size_t>(p_->E) * p_->h); }
  std::span<const double> experts() const { return std::span<const double>(params_).subspan(router().size()); }
  //! The capacity of every forward since the last `clear_capacities()`.
  const std::vector<long long>& capacities() const { return capacities_; }
  void clear_capacities() { capacities_.clear(); }
  //! What the forward of microbatch `mb` gave last: the layer's output y (before the loss
  //! weights), the dropped (token, choice) pairs, the auxiliary loss and the drops per expert.
  struct forward_record {
    vec y;
    std::vector<std::pair<int, int>> dropped;
    double aux = 0;
    std::vector<long long> dropped_per_expert;  // [E]
  };
  const forward_record& record(int mb) const { return states_.at(static_cast<std::size_t>(mb)).rec; }
  //! The microbatches this stage ran a forward of (since it was built).
  std::vector<int> microbatches() const {
    std::vector<int> out;
    for (std::size_t i = 0; i < states_.size(); ++i)
      if (states_[i].ran) out.push_back(static_cast<int>(i));
    return out;
  }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<double> fb) {
    const problem& p = *p_;
    const auto E = static_cast<std::size_t>(p.E);
    state& st = state_of(ctx.microbatch);
    vec logits(p.n * E);
    loom::linear_kernel::forward(fb.input, router(), std::span<const double>{}, std::span<double>(logits), p.n, p.h, E);
    st.R = loom::moe_route(p.o, std::span<const double>(logits));
    if (pipeline_moe()) loom::set_capacity(st.R, p.o, st.R.max_load());  // the same tokens on every rank: no communication
    else loom::set_capacity(g_, st.R, p.o);
    capacities_.push_back(st.R.capacity);
    if (ad_ != nullptr) return adaptive_forward(ctx, fb, st);
    const auto cap = static_cast<std::size_t>(st.R.capacity), all = (pipeline_moe() ? static_cast<std::size_t>(el_) : E) * cap * p.h;
    vec slots(all), scratch(all);
    st.xin.assign(all, 0.0);
    st.back.assign(all, 0.0);
    vec eo(all), y(p.n * p.h, 0.0);
    loom::moe_dispatch(st.R, fb.input, std::span<double>(pipeline_moe() ? st.xin : slots), p.h, held_);
    if (chunks_ > 1) {  // dispatch, the experts and combine overlapped; st.xin as ep_to_experts leaves it
      vec pieces(4 * all);
      loom::ep_overlapped(g_, p.E, cap, p.h, chunks_, std::span<const double>(slots), std::span<double>(st.back), std::span<double>(st.xin),
                          std::span<double>(eo), std::span<double>(pieces), [&](int e, std::span<const double> in, std::span<double> out, std::size_t rows) {
                            loom::linear_kernel::forward(in, weight(e), std::span<const double>{}, out, rows, p.h, p.h);
                          });
      loom::moe_combine(st.R, std::span<const double>(st.back), std::span<double>(y), p.h);
    } else {
      if (!pipeline_moe()) loom::ep_to_experts(g_, p.E, std::span<const double>(slots), std::span<double>(scratch), std::span<double>(st.xin));
      for_experts(cap, [&](int e, std::size_t at, std::size_t rows) {
        loom::linear_kernel::forward(std::span<const double>(st.xin).subspan(at, rows * p.h), weight(e), std::span<const double>{},
                                     std::span<double>(pipeline_moe() ? st.back : eo).subspan(at, rows * p.h), rows, p.h, p.h);
      });
      if (pipeline_moe()) {
        loom::tp_moe_combine(tpg_, st.R, std::span<const double>(st.back), std::span<double>(y), p.h);
      } else {
        loom::ep_from_experts(g_, p.E, std::span<const double>(eo), std::span<double>(scratch), std::span<double>(st.back));
        loom::moe_combine(st.R, std::span<const double>(st.back), std::span<double>(y), p.h);
      }
    }
    finish_forward(ctx, fb, st, y);
  }

  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    const problem& p = *p_;
    const auto E = static_cast<std::size_t>(p.E), k = static_cast<std::size_t>(p.o.top_k);
    state& st = state_of(ctx.microbatch);
    const auto cap = static_cast<std::size_t>(st.R.capacity), nh = p.n * p.h;
    const std::size_t all = ad_ != nullptr ? E * cap * p.h : st.xin.size();  // [E][C][h] (adaptive: st.xin holds the rows at this rank)
    vec dy(nh), dout(all), din(all, 0.0), dslots(all), scratch(all), dgate(p.n * k), dx(nh, 0.0), dxr(nh);
    const std::span<const double> c = weights(ctx.microbatch);
    for (std::size_t i = 0; i < nh; ++i) dy[i] = bb.output_grad[i] * c[i];
    const double daux = bb.output_grad[nh] * p.lambda;
    loom::moe_combine_backward(st.R, std::span<const double>(st.back), std::span<const double>(dy), std::span<double>(dout),
                               std::span<double>(dgate), p.h, held_);
    st.drows.assign(all, 0.0);
    if (ad_ != nullptr) {
      adaptive_backward_input(st, dout, dslots);
      loom::moe_dispatch_backward(st.R, std::span<const double>(dslots), std::span<double>(dx), p.h);
    } else if (chunks_ > 1) {  // the same overlap on the way back; st.drows as ep_to_experts leaves it
      vec pieces(4 * all);
      loom::ep_overlapped(g_, p.E, cap, p.h, chunks_, std::span<const double>(dout), std::span<double>(dslots), std::span<double>(st.drows),
                          std::span<double>(din), std::span<double>(pieces), [&](int e, std::span<const double> in, std::span<double> out, std::size_t rows) {
                            loom::linear_kernel::backward_input(in, weight(e), out, rows, p.h, p.h);
                          });
      loom::moe_dispatch_backward(st.R, std::span<const double>(dslots), std::span<double>(dx), p.h);
    } else {
      if (pipeline_moe()) st.drows = dout;
      else loom::ep_to_experts(g_, p.E, std::span<const double>(dout), std::span<double>(scratch), std::span<double>(st.drows));
      for_experts(cap, [&](int e, std::size_t at, std::size_t rows) {
        loom::linear_kernel::backward_input(std::span<const double>(st.drows).subspan(at, rows * p.h), weight(e),
                                            std::span<double>(din).subspan(at, rows * p.h), rows, p.h, p.h);
      });
      if (pipeline_moe()) {
        loom::moe_dispatch_backward(st.R, std::span<const double>(din), std::span<double>(dx), p.h, held_);
        loom::tp_moe_backward_sum(tpg_, std::span<double>(dx), std::span<double>(dgate));
      } else {
        loom::ep_from_experts(g_, p.E, std::span<const double>(din), std::span<double>(scratch), std::span<double>(dslots));
        loom::moe_dispatch_backward(st.R, std::span<const double>(dslots), std::span<double>(dx), p.h);
      }
    }
    st.dlogits.assign(p.n * E, 0.0);
    loom::moe_route_backward(st.R, p.o, std::span<const double>(dgate), daux, std::span<double>(st.dlogits));
    loom::linear_kernel::backward_input(std::span<const double>(st.dlogits), router(), std::span<double>(dxr), p.n, p.h, E);
    if (!bb.input_grad.empty())
      for (std::size_t i = 0; i < nh; ++i) bb.input_grad[i] = dx[i] + dxr[i];
  }
  void backward_weight(const loom::stage_context& ctx, loom::weight_buffers<double> wb) {
    const problem& p = *p_;
    const auto E = static_cast<std::size_t>(p.E);
    state& st = state_of(ctx.microbatch);
    const std::size_t hh = p.h * p.h, router_size = router().size();
    if (ad_ != nullptr) adaptive_backward_weight(st, wb.weight_grad.subspan(router_size));
    else
      for_experts(static_cast<std::size_t>(st.R.capacity), [&](int e, std::size_t at, std::size_t rows) {
        loom::linear_kernel::backward_weight(std::span<const double>(st.xin).subspan(at, rows * p.h),
                                             std::span<const double>(st.drows).subspan(at, rows * p.h),
                                             wb.weight_grad.subspan(router_size + static_cast<std::size_t>(e) * hh, hh), std::span<double>{}, rows, p.h,
                                             p.h);
      });
    loom::linear_kernel::backward_weight(wb.input, std::span<const double>(st.dlogits), wb.weight_grad.first(router_size), std::span<double>{}, p.n,
                                         p.h, E);
  }
  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> bb) {
    backward_input(ctx, bb);
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  struct state {
    loom::moe_routing<double> R;
    vec xin, back;       // the rows at this rank's experts, the outputs back at their tokens
    vec drows, dlogits;  // what backward_input leaves for the weight gradients
    int degree = 0;      // adaptive: the forward's r, and its gathered weights ([h][h/r], or r = 0: every expert [E][h][h])
    vec gathered;
    forward_record rec;
    bool ran = false;
  };
  state& state_of(int mb) {
    if (states_.size() <= static_cast<std::size_t>(mb)) states_.resize(static_cast<std::size_t>(mb) + 1);
    return states_[static_cast<std::size_t>(mb)];
  }
  std::span<const double> weights(int mb) const { return std::span<const double>(*c_).subspan(static_cast<std::size_t>(mb) * input_size(), input_size()); }
  std::span<const double> weight(int e) const { return experts().subspan(static_cast<std::size_t>(e) * p_->h * p_->h, p_->h * p_->h); }
  // Each local expert's rows (ep x capacity of them, source-major) at their offset.
  template <class F>
  void for_experts(std::size_t cap, F f) const {
    const std::size_t rows = static_cast<std::size_t>(g_.size()) * cap;
    for (int e = 0; e < el_; ++e) f(e, static_cast<std::size_t>(e) * rows * p_->h, rows);
  }

  bool pipeline_moe() const { return tpg_.comm != nullptr; }

  // The layer's output y into the loss terms c_i y_i and lambda l_aux, and the forward's record.
  void finish_forward(const loom::stage_context& ctx, loom::forward_buffers<double> fb, state& st, const vec& y) {
    const std::span<const double> c = weights(ctx.microbatch);
    for (std::size_t i = 0; i < y.size(); ++i) fb.output[i] = c[i] * y[i];
    st.rec = {y, dropped_of(st.R), loom::moe_aux_loss(st.R), st.R.dropped_per_expert()};
    st.ran = true;
    fb.output[y.size()] = p_->lambda * st.rec.aux;
  }

  // Adaptive mode (Tutel's degree r; see loom::ep_adaptive). The gather group's slices into this
  // rank's columns: [h][h/r] for r >= 1 (columns [q h/r, (q+1) h/r) of its expert, q = its group),
  // every expert whole ([E][h][h]) for r = 0.
  loom::ep_adaptive adaptive() const { return {g_.size(), p_->E, ad_->degree}; }
  std::size_t slice_width() const { return p_->h / static_cast<std::size_t>(g_.size() / p_->E); }
  void gather_weights(state& st) {
    const loom::ep_adaptive a = adaptive();
    const std::size_t h = p_->h, hs = slice_width(), gs = static_cast<std::size_t>(a.group());
    vec all(gs * h * hs);
    ad_->of(a.degree).all_gather(experts(), std::span<double>(all));  // [gs][h][hs]
    st.degree = a.degree;
    if (a.degree == 0) {  // rank u = e S + j holds columns j of expert e
      const auto S = static_cast<std::size_t>(a.shards());
      st.gathered.assign(static_cast<std::size_t>(p_->E) * h * h, 0.0);
      for (std::size_t u = 0; u < gs; ++u)
        for (std::size_t o = 0; o < h; ++o)
          std::copy_n(all.data() + (u * h + o) * hs, hs, st.gathered.data() + (u / S) * h * h + o * h + (u % S) * hs);
    } else {
      st.gathered.assign(h * hs * gs, 0.0);
      for (std::size_t u = 0; u < gs; ++u)
        for (std::size_t o = 0; o < h; ++o) std::copy_n(all.data() + (u * h + o) * hs, hs, st.gathered.data() + o * hs * gs + u * hs);
    }
  }
  // Columns [c0, c0 + w) of the rows at this rank (`st.xin`), compact.
  vec my_columns(const state& st, std::size_t w, std::size_t c0) const {
    const std::size_t h = p_->h, rows = st.xin.size() / h;
    vec xc(rows * w);
    for (std::size_t t = 0; t < rows; ++t) std::copy_n(st.xin.data() + t * h + c0, w, xc.data() + t * w);
    return xc;
  }
  // The first column this rank's gathered block covers (r >= 1).
  std::size_t first_column() const {
    const loom::ep_adaptive a = adaptive();
    return static_cast<std::size_t>(g_.rank() % a.shards() / a.group() * a.group()) * slice_width();
  }
  void adaptive_forward(const loom::stage_context& ctx, loom::forward_buffers<double> fb, state& st) {
    const problem& p = *p_;
    const loom::ep_adaptive a = adaptive();
    const auto cap = static_cast<std::size_t>(st.R.capacity), E = static_cast<std::size_t>(p.E), all = E * cap * p.h;
    gather_weights(st);
    vec slots(all), scratch(all * static_cast<std::size_t>(std::max(a.degree, 1))), y(p.n * p.h, 0.0);
    loom::moe_dispatch(st.R, fb.input, std::span<double>(slots), p.h);
    const std::size_t rows = a.degree == 0 ? E * cap : static_cast<std::size_t>(a.ranks) * (cap / static_cast<std::size_t>(a.group()));
    st.xin.assign(rows * p.h, 0.0);
    vec out(rows * p.h, 0.0);
    st.back.assign(all, 0.0);
    loom::ep_adaptive_to_experts(g_, a, cap, p.h, std::span<const double>(slots), std::span<double>(scratch), std::span<double>(st.xin));
    if (a.degree == 0) {
      for (std::size_t e = 0; e < E; ++e)
        loom::linear_kernel::forward(std::span<const double>(st.xin).subspan(e * cap * p.h, cap * p.h),
                                     std::span<const double>(st.gathered).subspan(e * p.h * p.h, p.h * p.h), std::span<const double>{},
                                     std::span<double>(out).subspan(e * cap * p.h, cap * p.h), cap, p.h, p.h);
    } else {  // the partial product over this rank's h/r columns
      const std::size_t w = p.h / static_cast<std::size_t>(a.degree), c0 = first_column();
      const vec xc = my_columns(st, w, c0);
      loom::linear_kernel::forward(std::span<const double>(xc), std::span<const double>(st.gathered), std::span<const double>{}, std::span<double>(out),
                                   rows, w, p.h);
    }
    loom::ep_adaptive_from_experts(g_, a, cap, p.h, std::span<double>(out), std::span<double>(scratch), std::span<double>(st.back));
    loom::moe_combine(st.R, std::span<const double>(st.back), std::span<double>(y), p.h);
    finish_forward(ctx, fb, st, y);
  }
  void adaptive_backward_input(state& st, const vec& dout, vec& dslots) {
    const problem& p = *p_;
    const loom::ep_adaptive a{g_.size(), p.E, st.degree};
    const auto cap = static_cast<std::size_t>(st.R.capacity), E = static_cast<std::size_t>(p.E), rows = st.xin.size() / p.h;
    vec scratch(E * cap * p.h * static_cast<std::size_t>(std::max(a.degree, 1))), din(rows * p.h, 0.0);
    st.drows.assign(rows * p.h, 0.0);
    loom::ep_adaptive_to_experts(g_, a, cap, p.h, std::span<const double>(dout), std::span<double>(scratch), std::span<double>(st.drows));
    if (a.degree == 0) {
      for (std::size_t e = 0; e < E; ++e)
        loom::linear_kernel::backward_input(std::span<const double>(st.drows).subspan(e * cap * p.h, cap * p.h),
                                            std::span<const double>(st.gathered).subspan(e * p.h * p.h, p.h * p.h),
                                            std::span<double>(din).subspan(e * cap * p.h, cap * p.h), cap, p.h, p.h);
    } else {  // this rank's columns of the input gradient; the other copies hold the rest
      const std::size_t w = p.h / static_cast<std::size_t>(a.degree), c0 = first_column();
      vec dxc(rows * w);
      loom::linear_kernel::backward_input(std::span<const double>(st.drows), std::span<const double>(st.gathered), std::span<double>(dxc), rows, w, p.h);
      for (std::size_t t = 0; t < rows; ++t) std::copy_n(dxc.data() + t * w, w, din.data() + t * p.h + c0);
    }
    loom::ep_adaptive_from_experts(g_, a, cap, p.h, std::span<double>(din), std::span<double>(scratch), std::span<double>(dslots));
  }
  // The gathered weights' gradient, reduce-scattered over the gather group into this rank's slice.
  void adaptive_backward_weight(state& st, std::span<double> slice_grad) {
    const problem& p = *p_;
    const loom::ep_adaptive a{g_.size(), p.E, st.degree};
    const auto cap = static_cast<std::size_t>(st.R.capacity), E = static_cast<std::size_t>(p.E), rows = st.xin.size() / p.h;
    const std::size_t hs = slice_width(), gs = static_cast<std::size_t>(a.group());
    vec send(gs * p.h * hs, 0.0), mine(p.h * hs);
    if (a.degree == 0) {
      vec gw(E * p.h * p.h, 0.0);
      for (std::size_t e = 0; e < E; ++e)
        loom::linear_kernel::backward_weight(std::span<const double>(st.xin).subspan(e * cap * p.h, cap * p.h),
                                             std::span<const double>(st.drows).subspan(e * cap * p.h, cap * p.h),
                                             std::span<double>(gw).subspan(e * p.h * p.h, p.h * p.h), std::span<double>{}, cap, p.h, p.h);
      const auto S = static_cast<std::size_t>(a.shards());
      for (std::size_t u = 0; u < gs; ++u)
        for (std::size_t o = 0; o < p.h; ++o) std::copy_n(gw.data() + (u / S) * p.h * p.h + o * p.h + (u % S) * hs, hs, send.data() + (u * p.h + o) * hs);
    } else {
      const std::size_t w = p.h / static_cast<std::size_t>(a.degree), c0 = first_column();
      const vec xc = my_columns(st, w, c0);
      vec gw(p.h * w, 0.0);
      loom::linear_kernel::backward_weight(std::span<const double>(xc), std::span<const double>(st.drows), std::span<double>(gw), std::span<double>{}, rows, w,
                                           p.h);
      for (std::size_t u = 0; u < gs; ++u)
        for (std::size_t o = 0; o < p.h; ++o) std::copy_n(gw.data() + o * w + u * hs, hs, send.data() + (u * p.h + o) * hs);
    }
    ad_->of(a.degree).reduce_scatter(std::span<const double>(send), std::span<double>(mine), loom::reduce_op::sum);
    for (std::size_t i = 0; i < mine.size(); ++i) slice_grad[i] += mine[i];
  }

  const problem* p_;
  loom::ep_group<C> g_;
  loom::ep_group<C> tpg_;      // Pipeline MoE: the group the experts spread over (null: expert parallel over g_)
  loom::moe_experts held_{};   // the experts this rank holds (all of them by default: the slot functions' full range)
  const vec* c_;
  int chunks_ = 1;  // > 1: the exchange overlapped with the experts (ep_overlapped)
  const moe_adaptive_groups<C>* ad_ = nullptr;  // Tutel's adaptive parallelism (null: E/ep experts per rank)
  int el_ = 0;
  vec params_, grad_;
  std::vector<loom::grad_range> ranges_;
  std::vector<state> states_;
  std::vector<long long> capacities_;
};
}  // namespace mesh_example::moe
