// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A small MoE layer with linear experts (h = 4, 10 tokens per rank), the single-process reference
// holding every expert, one rank's expert-parallel run over any counted communicator, and the
// layer as a pipeline stage (`moe_stage`). Used by the example's --experts mode (moe_model.hpp)
// and by the tests (tests/mesh/moe_ep_test.cpp on threads, tests/mesh_mpi on MPI).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/exec/data_parallel.hpp"
#include "loom/exec/moe.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/stage/stage.hpp"

#include "host_exec.hpp"
#include "kernels.hpp"

namespace mesh_example::moe {

using vec = std::vector<double>;

inline double val(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

// The layer's data in precision T (double on the host; float for the device kernels' reference).
template <class T = double>
struct basic_problem {
  using vec_t = std::vector<T>;
  int E = 0, ranks = 0;
  std::size_t n = 0, h = 0;
  loom::moe_options o;
  T lambda = T(0.01);
  std::vector<vec_t> x, c;  // per rank: tokens [n][h], loss weights [n][h]
  vec_t wg, we;             // router [E][h], experts [E][h][h]
};
using problem = basic_problem<double>;

template <class T = double>
basic_problem<T> make(int E, int ranks, int k, double f, std::uint64_t seed) {
  basic_problem<T> p{E, ranks, 10, 4, {.experts = E, .top_k = k, .capacity_factor = f}, T(0.01), {}, {}, {}, {}};
  for (int r = 0; r < ranks; ++r) {
    std::vector<T> x(p.n * p.h), c(p.n * p.h);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<T>(val(seed + 1 + static_cast<std::uint64_t>(r), i));
      c[i] = static_cast<T>(val(seed + 101 + static_cast<std::uint64_t>(r), i));
    }
    p.x.push_back(x);
    p.c.push_back(c);
  }
  p.wg.resize(static_cast<std::size_t>(E) * p.h);
  p.we.resize(static_cast<std::size_t>(E) * p.h * p.h);
  for (std::size_t i = 0; i < p.wg.size(); ++i) p.wg[i] = static_cast<T>(2.5 * val(seed + 7, i));
  for (std::size_t i = 0; i < p.we.size(); ++i) p.we[i] = static_cast<T>(val(seed + 9, i));
  return p;
}

// What one rank ends with.
template <class T = double>
struct basic_rank_result {
  std::vector<T> y, dx, dwg;
  std::vector<T> dwe;  // its experts' gradients ([E/ep][h][h] with ep; all E in the reference)
  std::vector<std::pair<int, int>> dropped;
  std::vector<long long> dropped_per_expert;  // [E] (the reference sets it)
  long long capacity = 0;
  T aux = 0;  // GShard's auxiliary loss of the rank's routing (the reference sets it)
};
using rank_result = basic_rank_result<double>;

template <class T>
std::vector<std::pair<int, int>> dropped_of(const loom::moe_routing<T>& r) {
  std::vector<std::pair<int, int>> out;
  for (std::size_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < r.top_k; ++j)
      if (!r.kept(t, j)) out.emplace_back(static_cast<int>(t), j);
  return out;
}

// Experts `first .. first + count` on `rows_per_expert` rows each: forward, or input and weight gradients.
template <class T>
void experts_forward(const basic_problem<T>& p, int first, int count, std::size_t rows_per_expert, std::span<const T> in, std::span<T> out) {
  const std::size_t h = p.h, b = rows_per_expert * h;
  for (int e = 0; e < count; ++e)
    loom::linear_kernel::forward(in.subspan(static_cast<std::size_t>(e) * b, b),
                                 std::span<const T>(p.we).subspan(static_cast<std::size_t>(first + e) * h * h, h * h), std::span<const T>{},
                                 out.subspan(static_cast<std::size_t>(e) * b, b), rows_per_expert, h, h);
}
template <class T>
void experts_backward(const basic_problem<T>& p, int first, int count, std::size_t rows_per_expert, std::span<const T> in, std::span<const T> dout,
                      std::span<T> din, std::span<T> dw) {
  const std::size_t h = p.h, b = rows_per_expert * h;
  for (int e = 0; e < count; ++e) {
    const auto w = std::span<const T>(p.we).subspan(static_cast<std::size_t>(first + e) * h * h, h * h);
    loom::linear_kernel::backward_input(dout.subspan(static_cast<std::size_t>(e) * b, b), w, din.subspan(static_cast<std::size_t>(e) * b, b),
                                        rows_per_expert, h, h);
    loom::linear_kernel::backward_weight(in.subspan(static_cast<std::size_t>(e) * b, b), dout.subspan(static_cast<std::size_t>(e) * b, b),
                                         dw.subspan(static_cast<std::size_t>(e) * h * h, h * h), std::span<T>{}, rows_per_expert, h, h);
  }
}

// Rank r's routing, and the layer's front and back around the experts.
template <class T>
loom::moe_routing<T> route(const basic_problem<T>& p, int r) {
  const auto E = static_cast<std::size_t>(p.E);
  std::vector<T> logits(p.n * E);
  loom::linear_kernel::forward(std::span<const T>(p.x[static_cast<std::size_t>(r)]), std::span<const T>(p.wg), std::span<const T>{},
                               std::span<T>(logits), p.n, p.h, E);
  return loom::moe_route(p.o, std::span<const T>(logits));
}

template <class T>
void router_backward(const basic_problem<T>& p, int r, const loom::moe_routing<T>& rt, std::span<const T> dgate, basic_rank_result<T>& out) {
  const auto E = static_cast<std::size_t>(p.E);
  std::vector<T> dlogits(p.n * E), dxr(p.n * p.h);
  loom::moe_route_backward(rt, p.o, dgate, p.lambda, std::span<T>(dlogits));
  loom::linear_kernel::backward_input(std::span<const T>(dlogits), std::span<const T>(p.wg), std::span<T>(dxr), p.n, p.h, E);
  for (std::size_t i = 0; i < out.dx.size(); ++i) out.dx[i] += dxr[i];
  out.dwg.assign(E * p.h, T{});
  loom::linear_kernel::backward_weight(std::span<const T>(p.x[static_cast<std::size_t>(r)]), std::span<const T>(dlogits), std::span<T>(out.dwg),
                                       std::span<T>{}, p.n, p.h, E);
}

// The reference: one process, every expert, each rank's tokens routed on their own; an expert's
// weight gradient accumulates over the ranks in rank order (what the expert-parallel rank's
// source-major rows give).
template <class T>
std::vector<basic_rank_result<T>> reference(const basic_problem<T>& p) {
  const auto E = static_cast<std::size_t>(p.E);
  std::vector<loom::moe_routing<T>> rt;
  long long most = 0;
  for (int r = 0; r < p.ranks; ++r) {
    rt.push_back(route(p, r));
    most = std::max(most, rt.back().max_load());
  }
  std::vector<basic_rank_result<T>> out(static_cast<std::size_t>(p.ranks));
  std::vector<T> dwe(E * p.h * p.h, T{});
  for (int r = 0; r < p.ranks; ++r) {
    auto& R = rt[static_cast<std::size_t>(r)];
    loom::set_capacity(R, p.o, most);
    const auto C = static_cast<std::size_t>(R.capacity);
    std::vector<T> slots(E * C * p.h), eo(E * C * p.h), dout(E * C * p.h), dslots(E * C * p.h), dgate(p.n * static_cast<std::size_t>(p.o.top_k));
    basic_rank_result<T>& o = out[static_cast<std::size_t>(r)];
    o.y.assign(p.n * p.h, T{});
    o.dx.assign(p.n * p.h, T{});
    loom::moe_dispatch(R, std::span<const T>(p.x[static_cast<std::size_t>(r)]), std::span<T>(slots), p.h);
    experts_forward(p, 0, p.E, C, std::span<const T>(slots), std::span<T>(eo));
    loom::moe_combine(R, std::span<const T>(eo), std::span<T>(o.y), p.h);
    loom::moe_combine_backward(R, std::span<const T>(eo), std::span<const T>(p.c[static_cast<std::size_t>(r)]), std::span<T>(dout),
                               std::span<T>(dgate), p.h);
    experts_backward(p, 0, p.E, C, std::span<const T>(slots), std::span<const T>(dout), std::span<T>(dslots), std::span<T>(dwe));
    loom::moe_dispatch_backward(R, std::span<const T>(dslots), std::span<T>(o.dx), p.h);
    router_backward(p, r, R, std::span<const T>(dgate), o);
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

//! The MoE layer's operations on the memory of executor `X` (see `moe_stage`): here the host's
//! (`loom/exec/moe.hpp` over `std::vector`); the device's, over `loom::cuda::moe_routing` and the
//! call's stream, are in `moe_device.hpp`.
template <class X, bool Device = X::device>
struct moe_ops {
  using T = typename X::value_type;   //!< the layer's precision
  using routing = loom::moe_routing<T>;  //!< one microbatch's routing
  //! Routes `logits` (`[n][E]`) into `r`.
  void route(const X&, const loom::moe_options& o, std::span<const T> logits, routing& r) const { r = loom::moe_route(o, logits); }
  //! The capacity over the expert-parallel group `g`.
  template <class G>
  void capacity(const X&, loom::ep_group<G>& g, routing& r, const loom::moe_options& o) const {
    loom::set_capacity(g, r, o);
  }
  //! The capacity of tokens no other rank routes (Pipeline MoE: every tp rank holds the same).
  void local_capacity(const X&, routing& r, const loom::moe_options& o) const { loom::set_capacity(r, o, r.max_load()); }
  //! `loom::moe_dispatch`.
  void dispatch(const X&, const routing& r, std::span<const T> in, std::span<T> slots, std::size_t h, loom::moe_experts held) const {
    loom::moe_dispatch(r, in, slots, h, held);
  }
  //! `loom::moe_combine`.
  void combine(const X&, const routing& r, std::span<const T> out, std::span<T> y, std::size_t h) const { loom::moe_combine(r, out, y, h); }
  //! `loom::moe_combine_backward`.
  void combine_backward(const X&, const routing& r, std::span<const T> out, std::span<const T> dy, std::span<T> dout, std::span<T> dgate,
                        std::size_t h, loom::moe_experts held) const {
    loom::moe_combine_backward(r, out, dy, dout, dgate, h, held);
  }
  //! `loom::moe_dispatch_backward`.
  void dispatch_backward(const X&, const routing& r, std::span<const T> ds, std::span<T> dx, std::size_t h, loom::moe_experts held) const {
    loom::moe_dispatch_backward(r, ds, dx, h, held);
  }
  //! `loom::moe_route_backward` with the auxiliary loss's weight `*scale * daux`.
  void route_backward(const X&, const routing& r, const loom::moe_options& o, std::span<const T> dgate, T daux, std::span<T> dl, const T* scale) const {
    loom::moe_route_backward(r, o, dgate, daux, dl, scale);
  }
  //! GShard's auxiliary loss into `out[0]`.
  void aux(const X&, const routing& r, std::span<T> out) const { out[0] = loom::moe_aux_loss(r); }
  //! A host copy of `r`.
  loom::moe_routing<T> host(const X&, const routing& r) const { return r; }
};

//! What a stage call of the MoE model runs on: the executor `X` bound to the call's stream, the
//! call's groups (on a device, `loom::on_stream` bindings of the stage's communicators to that
//! stream; on the host the communicators themselves), and scratch buffers kept from call to
//! call (every call of a stage is on the same stream, so a buffer's reuse is in stream order).
template <class C, class X>
class call_space {
 public:
  using T = typename X::value_type;         //!< the precision
  using G = typename X::template group<C>;  //!< a group of the call
  template <class U>
  using buffer = typename X::template buffer<U>;  //!< the stage's storage
  X x;                                            //!< the executor

  //! Starts a stage call: binds the executor, forgets the last call's groups.
  void begin(const loom::stage_context& ctx) {
    x.bind(ctx);
    bound_.clear();
  }
  //! `c` as a group of this call (null stays null).
  G* on(C* c) {
    if (c == nullptr) return nullptr;
    if constexpr (X::device) return on(c, x.stream);
    else return c;
  }
  //! `c` bound to `stream` (a device's second stream).
  template <class S>
  G* on(C* c, S stream) {
    bound_.push_back(std::make_unique<G>(*c, stream));
    return bound_.back().get();
  }
  //! Scratch `id`, `n` elements, zeroed unless `zero` is false.
  std::span<T> tmp(std::size_t id, std::size_t n, bool zero = true) {
    if (tmp_.size() <= id) tmp_.resize(id + 1);
    return keep(tmp_[id], n, zero);
  }
  //! The first `n` elements of `b`, grown when it has fewer (the old storage freed in stream order).
  std::span<T> keep(buffer<T>& b, std::size_t n, bool zero = true) {
    if (b.size() < n) {
      x.release(b);
      b = buffer<T>(n);
    }
    std::span<T> s(b.data(), n);
    if (zero) x.fill(s, T{});
    return s;
  }
  //! Runs block copy `b` (a layout change) on the call's stream.
  void transpose(const loom::block_transpose<T>& b) {
    x.each(b.size(), b, "layout");
  }

 private:
  std::vector<std::unique_ptr<G>> bound_;
  std::vector<buffer<T>> tmp_;
};

//! `s` read-only.
template <class T>
std::span<const T> cs(std::span<T> s) {
  return s;
}

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

//! A pipeline stage holding one MoE layer over the expert-parallel communicator `comm` (null: every
//! expert here): the router (dense: E x h, reduced over dp x ep) and this rank's E/ep experts
//! (`grad_range::expert`: reduced over dp alone). Its output is the loss terms c_i y_i and
//! lambda l_aux, so the backward seeded with 1 (`loss_scaling::sum`) gives exactly the reference's
//! dy = c, daux = lambda. `c` points to the step's loss weights of this rank's tokens, microbatch
//! after microbatch. `partial` names the dimensions whose ranks hold other tokens besides dp and ep
//! (tp when the tokens are split over it), for both ranges. With `experts_over` (Pipeline MoE's
//! layout) the experts spread over that group instead, whose ranks hold the same tokens: dispatch
//! by slicing, combine and the backward's sums by all-reduce (`comm` then has one rank). With
//! `chunks` > 1 the exchange overlaps with the experts FSMoE-style (`loom::ep_overlapped`, both
//! ways), with the unchunked exchange's results bit for bit. With `node` and `cross` (the ep
//! group's ranks on this rank's node and those with its index on every node) the exchange is
//! Tutel's 2D hierarchical one. A split stage: `backward_input` leaves what the weight gradients need.
//! Written once over the executor `X`: `host_exec` (double, host loops and loom's host MoE
//! functions) or `device_exec` (fp32, loom's MoE kernels and the groups bound to the stage call's
//! stream; the overlap's all-to-alls on a second stream of the stage).
template <class C, class X = host_exec>
class moe_stage {
 public:
  using value_type = typename X::value_type;
  using T = value_type;
  using prob = basic_problem<T>;
  template <class U>
  using buffer = typename X::template buffer<U>;
  using routing = typename moe_ops<X>::routing;

  moe_stage(const prob& p, C* comm, const T* c, loom::dim_set partial = {}, C* experts_over = nullptr, int chunks = 1, C* node = nullptr,
            C* cross = nullptr, const moe_adaptive_groups<C>* adaptive = nullptr)
      : p_(&p), comm_(comm), node_(node), cross_(cross), over_(experts_over), g0_{comm, node, cross}, tp0_{experts_over}, c_(c), chunks_(chunks),
        ad_(adaptive) {
    const int ep = g0_.size();
    std::vector<T> params;
    if (ad_ != nullptr) {  // Tutel's layout: rank w holds columns [j h/S, (j+1) h/S) of expert w / S, j = w % S
      if (std::string rule = loom::ep_adaptive_rule({ep, p.E, 0}); !rule.empty()) throw loom::config_error(rule);
      const auto S = static_cast<std::size_t>(ep / p.E), w = static_cast<std::size_t>(g0_.rank());
      if (p.h % S != 0) throw loom::config_error("moe: the width " + std::to_string(p.h) + " does not split over " + std::to_string(S) + " ranks per expert");
      const std::size_t hs = p.h / S, router = static_cast<std::size_t>(p.E) * p.h;
      params.assign(p.wg.begin(), p.wg.end());
      for (std::size_t o = 0; o < p.h; ++o)
        for (std::size_t i = 0; i < hs; ++i) params.push_back(p.we[(w / S) * p.h * p.h + o * p.h + (w % S) * hs + i]);
      ranges_ = {loom::grad_range{0, router, partial}, loom::grad_range{router, p.h * hs, partial, true}};
    } else {
      if (std::string rule = loom::ep_rule(p.E, ep); !rule.empty()) throw loom::config_error(rule);
      if (chunks < 1) throw loom::config_error("moe: the overlap needs >= 1 chunk (got " + std::to_string(chunks) + ")");
      if (chunks > 1 && experts_over != nullptr) throw loom::config_error("moe: Pipeline MoE has no all-to-all to overlap (chunks must be 1)");
      el_ = p.E / ep;
      int first = g0_.rank() * el_;
      if (experts_over != nullptr) {
        held_ = loom::tp_experts(p.E, tp0_);
        el_ = held_.count;
        first = held_.first;
      }
      const std::size_t hh = p.h * p.h, router = static_cast<std::size_t>(p.E) * p.h;
      params.assign(p.wg.begin(), p.wg.end());
      params.insert(params.end(), p.we.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * hh),
                    p.we.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first + el_) * hh));
      ranges_ = {loom::grad_range{0, router, partial}, loom::grad_range{router, static_cast<std::size_t>(el_) * hh, partial, true}};
    }
    params_ = X::upload(params);
    grad_ = X::template zeros<T>(params.size());
  }
  std::size_t input_size() const { return p_->n * p_->h; }
  std::size_t output_size() const { return p_->n * p_->h + 1; }
  std::size_t stash_size() const { return 0; }
  std::span<T> params() { return X::whole(params_); }
  std::span<T> weight_grad() { return X::whole(grad_); }
  std::span<const loom::grad_range> grad_ranges() const { return ranges_; }
  //! The router (`[E][h]`) and this rank's experts, in the executor's memory.
  std::span<const T> router() const { return std::span<const T>(params_.data(), static_cast<std::size_t>(p_->E) * p_->h); }
  std::span<const T> experts() const { return std::span<const T>(params_.data(), params_.size()).subspan(router().size()); }
  //! The capacity of every forward since the last `clear_capacities()`.
  const std::vector<long long>& capacities() const { return capacities_; }
  void clear_capacities() { capacities_.clear(); }
  //! What the forward of microbatch `mb` gave last: the layer's output y (before the loss
  //! weights), the dropped (token, choice) pairs, the auxiliary loss and the drops per expert.
  struct forward_record {
    std::vector<T> y;
    std::vector<std::pair<int, int>> dropped;
    T aux = 0;
    std::vector<long long> dropped_per_expert;  // [E]
  };
  //! The record of microbatch `mb` (on a device: read back, after the stream's work).
  forward_record record(int mb) const {
    const state& st = states_.at(static_cast<std::size_t>(mb));
    const loom::moe_routing<T> R = ops_.host(sp_.x, st.R);
    return {X::download(std::span<const T>(st.y.data(), p_->n * p_->h)), dropped_of(R), loom::moe_aux_loss(R), R.dropped_per_expert()};
  }
  //! The microbatches this stage ran a forward of (since it was built).
  std::vector<int> microbatches() const {
    std::vector<int> out;
    for (std::size_t i = 0; i < states_.size(); ++i)
      if (states_[i].ran) out.push_back(static_cast<int>(i));
    return out;
  }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<T> fb) {
    sp_.begin(ctx);
    const prob& p = *p_;
    const auto E = static_cast<std::size_t>(p.E);
    state& st = state_of(ctx.microbatch);
    const std::span<T> logits = sp_.tmp(t_logits, p.n * E, false);
    sp_.x.linear().forward(fb.input, router(), std::span<const T>{}, logits, p.n, p.h, E);
    ops_.route(sp_.x, p.o, cs(logits), st.R);
    loom::ep_group<G> g = group();
    if (pipeline_moe()) ops_.local_capacity(sp_.x, st.R, p.o);  // the same tokens on every rank: no communication
    else ops_.capacity(sp_.x, g, st.R, p.o);
    capacities_.push_back(st.R.capacity);
    if (ad_ != nullptr) return adaptive_forward(ctx, fb, st, g);
    const auto cap = static_cast<std::size_t>(st.R.capacity), all = (pipeline_moe() ? static_cast<std::size_t>(el_) : E) * cap * p.h;
    const std::span<T> slots = sp_.tmp(t_slots, all), scratch = sp_.tmp(t_scratch, all), eo = sp_.tmp(t_eo, all);
    st.rows = st.slots = all;
    const std::span<T> xin = sp_.keep(st.xin, all), back = sp_.keep(st.back, all), y = sp_.keep(st.y, p.n * p.h);
    ops_.dispatch(sp_.x, st.R, fb.input, pipeline_moe() ? xin : slots, p.h, held_);
    if (chunks_ > 1) {  // dispatch, the experts and combine overlapped; xin as ep_to_experts leaves it
      loom::ep_overlapped(g, p.E, cap, p.h, chunks_, cs(slots), back, xin, eo, sp_.tmp(t_pieces, 4 * all),
                          [&](int e, std::span<const T> in, std::span<T> out, std::size_t rows) {
                            sp_.x.linear().forward(in, weight(e), std::span<const T>{}, out, rows, p.h, p.h);
                          });
      ops_.combine(sp_.x, st.R, cs(back), y, p.h);
    } else {
      if (!pipeline_moe()) loom::ep_to_experts(g, p.E, cs(slots), scratch, xin);
      for_experts(cap, [&](int e, std::size_t at, std::size_t rows) {
        sp_.x.linear().forward(cs(xin).subspan(at, rows * p.h), weight(e), std::span<const T>{}, (pipeline_moe() ? back : eo).subspan(at, rows * p.h),
                               rows, p.h, p.h);
      });
      if (pipeline_moe()) {
        loom::ep_group<G> tg{sp_.on(over_)};
        loom::tp_moe_combine(tg, st.R, cs(back), y, p.h);
      } else {
        loom::ep_from_experts(g, p.E, cs(eo), scratch, back);
        ops_.combine(sp_.x, st.R, cs(back), y, p.h);
      }
    }
    finish_forward(ctx, fb, st);
  }

  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<T> bb) {
    sp_.begin(ctx);
    const prob& p = *p_;
    const auto E = static_cast<std::size_t>(p.E), k = static_cast<std::size_t>(p.o.top_k);
    state& st = state_of(ctx.microbatch);
    loom::ep_group<G> g = group();
    const auto cap = static_cast<std::size_t>(st.R.capacity), nh = p.n * p.h;
    const std::size_t all = st.slots;
    const std::span<T> dy = sp_.tmp(t_dy, nh, false), dout = sp_.tmp(t_dout, all), dslots = sp_.tmp(t_dslots, all), dgate = sp_.tmp(t_dgate, p.n * k),
                       dx = sp_.tmp(t_dx, nh), dxr = sp_.tmp(t_dxr, nh);
    const std::span<const T> c = weights(ctx.microbatch);
    sp_.x.each(nh, kernels::mul_elem<T>{bb.output_grad.data(), c.data(), dy.data()}, "moe loss terms backward");
    ops_.combine_backward(sp_.x, st.R, std::span<const T>(st.back.data(), all), cs(dy), dout, dgate, p.h, held_);
    if (ad_ != nullptr) {
      adaptive_backward_input(st, g, dout, dslots);
      ops_.dispatch_backward(sp_.x, st.R, cs(dslots), dx, p.h, held_);
    } else {
      const std::span<T> drows = sp_.keep(st.drows, all), din = sp_.tmp(t_din, all);
      if (chunks_ > 1) {  // the same overlap on the way back; drows as ep_to_experts leaves it
        loom::ep_overlapped(g, p.E, cap, p.h, chunks_, cs(dout), dslots, drows, din, sp_.tmp(t_pieces, 4 * all),
                            [&](int e, std::span<const T> in, std::span<T> out, std::size_t rows) {
                              sp_.x.linear().backward_input(in, weight(e), out, rows, p.h, p.h);
                            });
        ops_.dispatch_backward(sp_.x, st.R, cs(dslots), dx, p.h, held_);
      } else {
        const std::span<T> scratch = sp_.tmp(t_scratch, all);
        if (pipeline_moe()) sp_.x.copy(cs(dout), drows);
        else loom::ep_to_experts(g, p.E, cs(dout), scratch, drows);
        for_experts(cap, [&](int e, std::size_t at, std::size_t rows) {
          sp_.x.linear().backward_input(cs(drows).subspan(at, rows * p.h), weight(e), din.subspan(at, rows * p.h), rows, p.h, p.h);
        });
        if (pipeline_moe()) {
          ops_.dispatch_backward(sp_.x, st.R, cs(din), dx, p.h, held_);
          loom::ep_group<G> tg{sp_.on(over_)};
          loom::tp_moe_backward_sum(tg, dx, dgate);
        } else {
          loom::ep_from_experts(g, p.E, cs(din), scratch, dslots);
          ops_.dispatch_backward(sp_.x, st.R, cs(dslots), dx, p.h, held_);
        }
      }
    }
    const std::span<T> dl = sp_.keep(st.dlogits, p.n * E);
    ops_.route_backward(sp_.x, st.R, p.o, cs(dgate), p.lambda, dl, bb.output_grad.data() + nh);
    sp_.x.linear().backward_input(cs(dl), router(), dxr, p.n, p.h, E);
    if (!bb.input_grad.empty()) sp_.x.each(nh, kernels::add_elem<T>{dx.data(), dxr.data(), bb.input_grad.data()}, "moe input gradient");
  }
  void backward_weight(const loom::stage_context& ctx, loom::weight_buffers<T> wb) {
    sp_.begin(ctx);
    const prob& p = *p_;
    const auto E = static_cast<std::size_t>(p.E);
    state& st = state_of(ctx.microbatch);
    const std::size_t hh = p.h * p.h, router_size = router().size();
    if (ad_ != nullptr) adaptive_backward_weight(st, wb.weight_grad.subspan(router_size));
    else
      for_experts(static_cast<std::size_t>(st.R.capacity), [&](int e, std::size_t at, std::size_t rows) {
        sp_.x.linear().backward_weight(std::span<const T>(st.xin.data() + at, rows * p.h), std::span<const T>(st.drows.data() + at, rows * p.h),
                                       wb.weight_grad.subspan(router_size + static_cast<std::size_t>(e) * hh, hh), std::span<T>{}, rows, p.h, p.h);
      });
    sp_.x.linear().backward_weight(wb.input, std::span<const T>(st.dlogits.data(), p.n * E), wb.weight_grad.first(router_size), std::span<T>{}, p.n, p.h, E);
  }
  void backward(const loom::stage_context& ctx, loom::backward_buffers<T> bb) {
    backward_input(ctx, bb);
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  using G = typename X::template group<C>;
  // Scratch buffers of a call (call_space::tmp).
  enum : std::size_t { t_logits, t_slots, t_scratch, t_eo, t_pieces, t_dy, t_dout, t_din, t_dslots, t_dgate, t_dx, t_dxr, t_gather, t_xc, t_send, t_mine, t_gw };
  struct state {
    routing R;
    std::size_t rows = 0;   // elements of xin in use
    std::size_t slots = 0;  // elements of the forward's slots and of back: [E][C][h] (Pipeline MoE: [E/tp][C][h])
    buffer<T> xin, back;   // the rows at this rank's experts, the outputs back at their tokens
    buffer<T> drows, dlogits;  // what backward_input leaves for the weight gradients
    buffer<T> y;               // the layer's output (before the loss weights)
    int degree = 0;            // adaptive: the forward's r, and its gathered weights ([h][h/r], or r = 0: every expert [E][h][h])
    buffer<T> gathered;
    bool ran = false;
  };
  state& state_of(int mb) {
    if (states_.size() <= static_cast<std::size_t>(mb)) states_.resize(static_cast<std::size_t>(mb) + 1);
    return states_[static_cast<std::size_t>(mb)];
  }
  // The expert-parallel group of this call (on a device with the overlap: its exchange stream too).
  loom::ep_group<G> group() {
    loom::ep_group<G> g{sp_.on(comm_), sp_.on(node_), sp_.on(cross_)};
    if constexpr (X::device)
      if (chunks_ > 1 && comm_ != nullptr) g.exchange = sp_.on(comm_, ops_.exchange_stream());
    return g;
  }
  std::span<const T> weights(int mb) const { return std::span<const T>(c_ + static_cast<std::size_t>(mb) * input_size(), input_size()); }
  std::span<const T> weight(int e) const { return experts().subspan(static_cast<std::size_t>(e) * p_->h * p_->h, p_->h * p_->h); }
  // Each local expert's rows (ep x capacity of them, source-major) at their offset.
  template <class F>
  void for_experts(std::size_t cap, F f) const {
    const std::size_t rows = static_cast<std::size_t>(g0_.size()) * cap;
    for (int e = 0; e < el_; ++e) f(e, static_cast<std::size_t>(e) * rows * p_->h, rows);
  }

  bool pipeline_moe() const { return over_ != nullptr; }

  // The layer's output y into the loss terms c_i y_i and lambda l_aux.
  void finish_forward(const loom::stage_context& ctx, loom::forward_buffers<T> fb, state& st) {
    const std::size_t nh = p_->n * p_->h;
    sp_.x.each(nh, kernels::mul_elem<T>{weights(ctx.microbatch).data(), st.y.data(), fb.output.data()}, "moe loss terms");
    ops_.aux(sp_.x, st.R, fb.output.subspan(nh, 1));
    sp_.x.each(1, kernels::scale_elem<T>{fb.output.data() + nh, p_->lambda, fb.output.data() + nh}, "moe auxiliary loss term");
    st.ran = true;
  }

  // Adaptive mode (Tutel's degree r; see loom::ep_adaptive). The gather group's slices into this
  // rank's columns: [h][h/r] for r >= 1 (columns [q h/r, (q+1) h/r) of its expert, q = its group),
  // every expert whole ([E][h][h]) for r = 0.
  loom::ep_adaptive adaptive() const { return {g0_.size(), p_->E, ad_->degree}; }
  std::size_t slice_width() const { return p_->h / static_cast<std::size_t>(g0_.size() / p_->E); }
  void gather_weights(state& st) {
    const loom::ep_adaptive a = adaptive();
    const std::size_t h = p_->h, hs = slice_width(), gs = static_cast<std::size_t>(a.group());
    const std::span<T> all = sp_.tmp(t_gather, gs * h * hs, false);
    sp_.on(&ad_->of(a.degree))->all_gather(experts(), all);  // [gs][h][hs]
    st.degree = a.degree;
    if (a.degree == 0) {  // rank u = e S + j holds columns j of expert e
      const auto S = static_cast<std::size_t>(a.shards());
      const std::span<T> gat = sp_.keep(st.gathered, static_cast<std::size_t>(p_->E) * h * h);
      for (std::size_t u = 0; u < gs; ++u)
        sp_.transpose({all.data() + u * h * hs, gat.data() + (u / S) * h * h + (u % S) * hs, 1, h, hs, hs, h});
    } else {
      const std::span<T> gat = sp_.keep(st.gathered, h * hs * gs);
      for (std::size_t u = 0; u < gs; ++u) sp_.transpose({all.data() + u * h * hs, gat.data() + u * hs, 1, h, hs, hs, hs * gs});
    }
  }
  // Columns [c0, c0 + w) of the rows at this rank (`st.xin`), compact.
  std::span<T> my_columns(const state& st, std::size_t w, std::size_t c0) {
    const std::size_t h = p_->h, rows = st.rows / h;
    const std::span<T> xc = sp_.tmp(t_xc, rows * w, false);
    sp_.transpose({st.xin.data() + c0, xc.data(), 1, rows, w, h, w});
    return xc;
  }
  std::span<const T> gathered(const state& st, std::size_t at, std::size_t n) const { return std::span<const T>(st.gathered.data() + at, n); }
  // The first column this rank's gathered block covers (r >= 1).
  std::size_t first_column() const {
    const loom::ep_adaptive a = adaptive();
    return static_cast<std::size_t>(g0_.rank() % a.shards() / a.group() * a.group()) * slice_width();
  }
  void adaptive_forward(const loom::stage_context& ctx, loom::forward_buffers<T> fb, state& st, loom::ep_group<G>& g) {
    const prob& p = *p_;
    const loom::ep_adaptive a = adaptive();
    const auto cap = static_cast<std::size_t>(st.R.capacity), E = static_cast<std::size_t>(p.E), all = E * cap * p.h;
    gather_weights(st);
    const std::span<T> slots = sp_.tmp(t_slots, all), scratch = sp_.tmp(t_scratch, all * static_cast<std::size_t>(std::max(a.degree, 1)));
    const std::span<T> y = sp_.keep(st.y, p.n * p.h);
    ops_.dispatch(sp_.x, st.R, fb.input, slots, p.h, held_);
    const std::size_t rows = a.degree == 0 ? E * cap : static_cast<std::size_t>(a.ranks) * (cap / static_cast<std::size_t>(a.group()));
    st.rows = rows * p.h;
    st.slots = all;
    const std::span<T> xin = sp_.keep(st.xin, rows * p.h), out = sp_.tmp(t_eo, rows * p.h), back = sp_.keep(st.back, all);
    loom::ep_adaptive_to_experts(g, a, cap, p.h, cs(slots), scratch, xin);
    if (a.degree == 0) {
      for (std::size_t e = 0; e < E; ++e)
        sp_.x.linear().forward(cs(xin).subspan(e * cap * p.h, cap * p.h), gathered(st, e * p.h * p.h, p.h * p.h), std::span<const T>{},
                               out.subspan(e * cap * p.h, cap * p.h), cap, p.h, p.h);
    } else {  // the partial product over this rank's h/r columns
      const std::size_t w = p.h / static_cast<std::size_t>(a.degree), c0 = first_column();
      const std::span<T> xc = my_columns(st, w, c0);
      sp_.x.linear().forward(cs(xc), gathered(st, 0, p.h * w), std::span<const T>{}, out, rows, w, p.h);
    }
    loom::ep_adaptive_from_experts(g, a, cap, p.h, out, scratch, back);
    ops_.combine(sp_.x, st.R, cs(back), y, p.h);
    finish_forward(ctx, fb, st);
  }
  void adaptive_backward_input(state& st, loom::ep_group<G>& g, std::span<T> dout, std::span<T> dslots) {
    const prob& p = *p_;
    const loom::ep_adaptive a{g0_.size(), p.E, st.degree};
    const auto cap = static_cast<std::size_t>(st.R.capacity), E = static_cast<std::size_t>(p.E), rows = st.rows / p.h;
    const std::span<T> scratch = sp_.tmp(t_scratch, E * cap * p.h * static_cast<std::size_t>(std::max(a.degree, 1))), din = sp_.tmp(t_din, rows * p.h);
    const std::span<T> drows = sp_.keep(st.drows, rows * p.h);
    loom::ep_adaptive_to_experts(g, a, cap, p.h, cs(dout), scratch, drows);
    if (a.degree == 0) {
      for (std::size_t e = 0; e < E; ++e)
        sp_.x.linear().backward_input(cs(drows).subspan(e * cap * p.h, cap * p.h), gathered(st, e * p.h * p.h, p.h * p.h),
                                      din.subspan(e * cap * p.h, cap * p.h), cap, p.h, p.h);
    } else {  // this rank's columns of the input gradient; the other copies hold the rest
      const std::size_t w = p.h / static_cast<std::size_t>(a.degree), c0 = first_column();
      const std::span<T> dxc = sp_.tmp(t_xc, rows * w);
      sp_.x.linear().backward_input(cs(drows), gathered(st, 0, p.h * w), dxc, rows, w, p.h);
      sp_.transpose({dxc.data(), din.data() + c0, 1, rows, w, w, p.h});
    }
    loom::ep_adaptive_from_experts(g, a, cap, p.h, din, scratch, dslots);
  }
  // The gathered weights' gradient, reduce-scattered over the gather group into this rank's slice.
  void adaptive_backward_weight(state& st, std::span<T> slice_grad) {
    const prob& p = *p_;
    const loom::ep_adaptive a{g0_.size(), p.E, st.degree};
    const auto cap = static_cast<std::size_t>(st.R.capacity), E = static_cast<std::size_t>(p.E), rows = st.rows / p.h;
    const std::size_t hs = slice_width(), gs = static_cast<std::size_t>(a.group());
    const std::span<T> send = sp_.tmp(t_send, gs * p.h * hs), mine = sp_.tmp(t_mine, p.h * hs, false);
    const std::span<const T> xin(st.xin.data(), st.rows), drows(st.drows.data(), st.rows);
    if (a.degree == 0) {
      const std::span<T> gw = sp_.tmp(t_gw, E * p.h * p.h);
      for (std::size_t e = 0; e < E; ++e)
        sp_.x.linear().backward_weight(xin.subspan(e * cap * p.h, cap * p.h), drows.subspan(e * cap * p.h, cap * p.h), gw.subspan(e * p.h * p.h, p.h * p.h),
                                       std::span<T>{}, cap, p.h, p.h);
      const auto S = static_cast<std::size_t>(a.shards());
      for (std::size_t u = 0; u < gs; ++u)
        sp_.transpose({gw.data() + (u / S) * p.h * p.h + (u % S) * hs, send.data() + u * p.h * hs, 1, p.h, hs, p.h, hs});
    } else {
      const std::size_t w = p.h / static_cast<std::size_t>(a.degree), c0 = first_column();
      const std::span<T> xc = my_columns(st, w, c0), gw = sp_.tmp(t_gw, p.h * w);
      sp_.x.linear().backward_weight(cs(xc), drows, gw, std::span<T>{}, rows, w, p.h);
      for (std::size_t u = 0; u < gs; ++u) sp_.transpose({gw.data() + u * hs, send.data() + u * p.h * hs, 1, p.h, hs, w, hs});
    }
    sp_.on(&ad_->of(a.degree))->reduce_scatter(cs(send), mine, loom::reduce_op::sum);
    sp_.transpose({mine.data(), slice_grad.data(), 1, 1, mine.size(), 0, 0, true});
  }

  const prob* p_;
  C *comm_, *node_, *cross_, *over_;  // the ep group, its node and cross groups, Pipeline MoE's group (each may be null)
  loom::ep_group<C> g0_;       // the ep group's size and rank
  loom::ep_group<C> tp0_;      // Pipeline MoE: the group the experts spread over (null: expert parallel over comm_)
  loom::moe_experts held_{};   // the experts this rank holds (all of them by default: the slot functions' full range)
  const T* c_;
  int chunks_ = 1;  // > 1: the exchange overlapped with the experts (ep_overlapped)
  const moe_adaptive_groups<C>* ad_ = nullptr;  // Tutel's adaptive parallelism (null: E/ep experts per rank)
  int el_ = 0;
  buffer<T> params_, grad_;
  std::vector<loom::grad_range> ranges_;
  std::vector<state> states_;
  std::vector<long long> capacities_;
  call_space<C, X> sp_;
  moe_ops<X> ops_;
};
}  // namespace mesh_example::moe
