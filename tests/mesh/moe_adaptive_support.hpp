// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Tutel's adaptive parallelism, test support (tests/mesh/moe_adaptive_test.cpp on threads, the
// `moe` mode of tests/mesh_mpi on MPI): E FFN experts over W > E expert-parallel ranks, each rank
// holding one hidden slice of one expert; the single-process reference holding every expert
// whole, and one rank's run under a degree r over any counted communicator.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/exec/moe.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "../../examples/03_mesh/moe_layer.hpp"

namespace moe_adaptive_test {

using mesh_example::moe::val;
using vec = std::vector<double>;

struct ffn_problem {
  int W = 4, E = 2;
  std::size_t n = 12, h = 4, H = 12;  // tokens per rank, model width, hidden width
  loom::moe_options o;
  double lambda = 0.01;
  std::vector<vec> x, c;  // per rank: tokens, loss weights
  vec wg;                 // router [E][h]
  vec w1, w2;             // per expert [H][h] each: fc1's rows, fc2's columns (hidden-major)
  int S() const { return W / E; }
  std::size_t params_per_expert() const { return 2 * H * h; }
};

inline ffn_problem make_ffn(int W, int E, int k, double f, std::uint64_t seed) {
  ffn_problem p;
  p.W = W;
  p.E = E;
  p.o = {.experts = E, .top_k = k, .capacity_factor = f, .alignment = W / E};
  for (int r = 0; r < W; ++r) {
    vec x(p.n * p.h), c(p.n * p.h);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = val(seed + 1 + static_cast<std::uint64_t>(r), i);
      c[i] = val(seed + 201 + static_cast<std::uint64_t>(r), i);
    }
    p.x.push_back(x);
    p.c.push_back(c);
  }
  p.wg.resize(static_cast<std::size_t>(E) * p.h);
  p.w1.resize(static_cast<std::size_t>(E) * p.H * p.h);
  p.w2.resize(p.w1.size());
  for (std::size_t i = 0; i < p.wg.size(); ++i) p.wg[i] = 2.5 * val(seed + 7, i);
  for (std::size_t i = 0; i < p.w1.size(); ++i) {
    p.w1[i] = 0.5 * val(seed + 9, i);
    p.w2[i] = 0.5 * val(seed + 11, i);
  }
  return p;
}

//! The FFN over `rows` rows of `in` (`[rows][h]`) with `hid` hidden rows of `w1`, `w2`
//! (`[hid][h]`): `out = tanh(in w1^T) w2`, the hidden sum in hidden order; `z` keeps the
//! activations for the backward.
inline void ffn(std::size_t rows, std::size_t h, std::size_t hid, const double* in, const double* w1, const double* w2, double* out, double* z) {
  for (std::size_t t = 0; t < rows; ++t) {
    for (std::size_t i = 0; i < hid; ++i) {
      double a = 0;
      for (std::size_t k = 0; k < h; ++k) a += in[t * h + k] * w1[i * h + k];
      z[t * hid + i] = std::tanh(a);
    }
    for (std::size_t o = 0; o < h; ++o) {
      double y = 0;
      for (std::size_t i = 0; i < hid; ++i) y += z[t * hid + i] * w2[i * h + o];
      out[t * h + o] = y;
    }
  }
}

//! Its backward: `din` written, `dw1`, `dw2` added to.
inline void ffn_backward(std::size_t rows, std::size_t h, std::size_t hid, const double* in, const double* w1, const double* w2, const double* z,
                  const double* dout, double* din, double* dw1, double* dw2) {
  vec dpre(hid);
  for (std::size_t t = 0; t < rows; ++t) {
    for (std::size_t i = 0; i < hid; ++i) {
      double dz = 0;
      for (std::size_t o = 0; o < h; ++o) dz += dout[t * h + o] * w2[i * h + o];
      const double zi = z[t * hid + i];
      dpre[i] = dz * (1 - zi * zi);
      for (std::size_t o = 0; o < h; ++o) dw2[i * h + o] += zi * dout[t * h + o];
      for (std::size_t k = 0; k < h; ++k) dw1[i * h + k] += dpre[i] * in[t * h + k];
    }
    for (std::size_t k = 0; k < h; ++k) {
      double a = 0;
      for (std::size_t i = 0; i < hid; ++i) a += dpre[i] * w1[i * h + k];
      din[t * h + k] = a;
    }
  }
}

struct result {
  vec y, dx, dwg, dw1, dw2;  // dw1, dw2: the rank's slice (the reference: every expert whole)
  std::vector<std::pair<int, int>> dropped;
  long long capacity = 0;
  double volume = 0;  // counted bus bytes / 8 of the all-to-alls, gathers and reduce-scatters
  std::uint64_t all_to_alls = 0;
};

inline loom::moe_routing<double> route(const ffn_problem& p, int r) {
  const auto E = static_cast<std::size_t>(p.E);
  vec logits(p.n * E);
  loom::linear_kernel::forward(std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<const double>(p.wg), std::span<const double>{},
                               std::span<double>(logits), p.n, p.h, E);
  return loom::moe_route(p.o, std::span<const double>(logits));
}

//! The router's backward and the input gradient's second part (as mesh_example::moe::router_backward).
inline void router_backward(const ffn_problem& p, int r, const loom::moe_routing<double>& R, const vec& dgate, result& out) {
  const auto E = static_cast<std::size_t>(p.E);
  vec dlogits(p.n * E), dxr(p.n * p.h);
  loom::moe_route_backward(R, p.o, std::span<const double>(dgate), p.lambda, std::span<double>(dlogits));
  loom::linear_kernel::backward_input(std::span<const double>(dlogits), std::span<const double>(p.wg), std::span<double>(dxr), p.n, p.h, E);
  for (std::size_t i = 0; i < out.dx.size(); ++i) out.dx[i] += dxr[i];
  out.dwg.assign(E * p.h, 0.0);
  loom::linear_kernel::backward_weight(std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<const double>(dlogits),
                                       std::span<double>(out.dwg), std::span<double>{}, p.n, p.h, E);
}

//! One process holding every expert whole; rank 0's result holds the whole weight gradients.
inline std::vector<result> reference(const ffn_problem& p) {
  const auto E = static_cast<std::size_t>(p.E), k = static_cast<std::size_t>(p.o.top_k), h = p.h, H = p.H;
  std::vector<loom::moe_routing<double>> rt;
  long long most = 0;
  for (int r = 0; r < p.W; ++r) {
    rt.push_back(route(p, r));
    most = std::max(most, rt.back().max_load());
  }
  std::vector<result> out(static_cast<std::size_t>(p.W));
  vec dw1(p.w1.size(), 0.0), dw2(p.w2.size(), 0.0);
  for (int r = 0; r < p.W; ++r) {
    auto& R = rt[static_cast<std::size_t>(r)];
    loom::set_capacity(R, p.o, most);
    const auto C = static_cast<std::size_t>(R.capacity);
    vec slots(E * C * h), eo(slots.size()), dout(slots.size()), dslots(slots.size()), z(E * C * H), dgate(p.n * k);
    result& o = out[static_cast<std::size_t>(r)];
    o.y.assign(p.n * h, 0.0);
    o.dx.assign(p.n * h, 0.0);
    loom::moe_dispatch(R, std::span<const double>(p.x[static_cast<std::size_t>(r)]), std::span<double>(slots), h);
    for (std::size_t e = 0; e < E; ++e)
      ffn(C, h, H, slots.data() + e * C * h, p.w1.data() + e * H * h, p.w2.data() + e * H * h, eo.data() + e * C * h, z.data() + e * C * H);
    loom::moe_combine(R, std::span<const double>(eo), std::span<double>(o.y), h);
    loom::moe_combine_backward(R, std::span<const double>(eo), std::span<const double>(p.c[static_cast<std::size_t>(r)]), std::span<double>(dout),
                               std::span<double>(dgate), h);
    for (std::size_t e = 0; e < E; ++e)
      ffn_backward(C, h, H, slots.data() + e * C * h, p.w1.data() + e * H * h, p.w2.data() + e * H * h, z.data() + e * C * H, dout.data() + e * C * h,
                   dslots.data() + e * C * h, dw1.data() + e * H * h, dw2.data() + e * H * h);
    loom::moe_dispatch_backward(R, std::span<const double>(dslots), std::span<double>(o.dx), h);
    router_backward(p, r, R, dgate, o);
    o.dropped = mesh_example::moe::dropped_of(R);
    o.capacity = R.capacity;
  }
  out[0].dw1 = dw1;
  out[0].dw2 = dw2;
  return out;
}

//! One rank of the expert-parallel group `comm` (W ranks) under degree `r`: its slice of one expert,
//! gathered over its gather group, the adaptive exchange both ways, the reduce-scatter back.
template <class C>
result adaptive_run(const ffn_problem& p, C& comm, int r, C* node = nullptr, C* cross = nullptr) {
  const loom::ep_adaptive a{p.W, p.E, r};
  auto [colour, key] = loom::ep_adaptive_split(a, comm.rank());
  C gather(comm.split(colour, key));
  loom::ep_group<C> g{&comm, node, cross};
  const int w = comm.rank(), S = p.S(), gs = a.group();
  const std::size_t h = p.h, H = p.H, E = static_cast<std::size_t>(p.E), k = static_cast<std::size_t>(p.o.top_k);
  const std::size_t slice = H / static_cast<std::size_t>(S) * h, hid = r == 0 ? H : H / static_cast<std::size_t>(r);
  // This rank's slice of its expert (the layout every r shares), and the gathered weights.
  const std::size_t at = static_cast<std::size_t>(w / S) * H * h + static_cast<std::size_t>(w % S) * slice;
  const vec w1s(p.w1.begin() + static_cast<std::ptrdiff_t>(at), p.w1.begin() + static_cast<std::ptrdiff_t>(at + slice));
  const vec w2s(p.w2.begin() + static_cast<std::ptrdiff_t>(at), p.w2.begin() + static_cast<std::ptrdiff_t>(at + slice));
  vec w1g(slice * static_cast<std::size_t>(gs)), w2g(w1g.size());
  comm.reset_counters();
  gather.all_gather(std::span<const double>(w1s), std::span<double>(w1g));
  gather.all_gather(std::span<const double>(w2s), std::span<double>(w2g));
  auto R = route(p, w);
  loom::set_capacity(g, R, p.o);
  const auto C_ = static_cast<std::size_t>(R.capacity), all = E * C_ * h;
  const std::size_t rows = r == 0 ? E * C_ : static_cast<std::size_t>(p.W) * (C_ / static_cast<std::size_t>(gs));  // at this rank
  const std::size_t copies = static_cast<std::size_t>(std::max(r, 1));
  vec slots(all), scratch(copies * all), xin(rows * h), eo(rows * h), back(all), dout(all), drows(rows * h), din(rows * h), dslots(all), z(rows * hid);
  vec dgate(p.n * k), dw1g(w1g.size(), 0.0), dw2g(w2g.size(), 0.0);
  result o;
  o.y.assign(p.n * h, 0.0);
  o.dx.assign(p.n * h, 0.0);
  loom::moe_dispatch(R, std::span<const double>(p.x[static_cast<std::size_t>(w)]), std::span<double>(slots), h);
  loom::ep_adaptive_to_experts(g, a, C_, h, std::span<const double>(slots), std::span<double>(scratch), std::span<double>(xin));
  // r >= 1: every row through this rank's H/r hidden rows; r = 0: expert e on its own slots.
  const std::size_t blocks = r == 0 ? E : 1, per = rows / blocks;
  for (std::size_t b = 0; b < blocks; ++b)
    ffn(per, h, hid, xin.data() + b * per * h, w1g.data() + b * hid * h, w2g.data() + b * hid * h, eo.data() + b * per * h, z.data() + b * per * hid);
  loom::ep_adaptive_from_experts(g, a, C_, h, std::span<double>(eo), std::span<double>(scratch), std::span<double>(back));
  loom::moe_combine(R, std::span<const double>(back), std::span<double>(o.y), h);
  loom::moe_combine_backward(R, std::span<const double>(back), std::span<const double>(p.c[static_cast<std::size_t>(w)]), std::span<double>(dout),
                             std::span<double>(dgate), h);
  loom::ep_adaptive_to_experts(g, a, C_, h, std::span<const double>(dout), std::span<double>(scratch), std::span<double>(drows));
  for (std::size_t b = 0; b < blocks; ++b)
    ffn_backward(per, h, hid, xin.data() + b * per * h, w1g.data() + b * hid * h, w2g.data() + b * hid * h, z.data() + b * per * hid,
                 drows.data() + b * per * h, din.data() + b * per * h, dw1g.data() + b * hid * h, dw2g.data() + b * hid * h);
  loom::ep_adaptive_from_experts(g, a, C_, h, std::span<double>(din), std::span<double>(scratch), std::span<double>(dslots));
  loom::moe_dispatch_backward(R, std::span<const double>(dslots), std::span<double>(o.dx), h);
  router_backward(p, w, R, dgate, o);
  o.dw1.assign(slice, 0.0);
  o.dw2.assign(slice, 0.0);
  gather.reduce_scatter(std::span<const double>(dw1g), std::span<double>(o.dw1), loom::reduce_op::sum);
  gather.reduce_scatter(std::span<const double>(dw2g), std::span<double>(o.dw2), loom::reduce_op::sum);
  o.dropped = mesh_example::moe::dropped_of(R);
  o.capacity = R.capacity;
  const auto& cg = gather.counters();
  const auto& ce = comm.counters();
  o.volume = (ce[loom::comm_op::all_to_all].bus_bytes + cg[loom::comm_op::all_gather].bus_bytes + cg[loom::comm_op::reduce_scatter].bus_bytes) / 8;
  o.all_to_alls = ce[loom::comm_op::all_to_all].calls;
  return o;
}

//! Values of `got` beyond 1e-12 of `want`'s largest magnitude.
inline long long far(const vec& got, const vec& want) {
  if (got.size() != want.size()) return 1 << 30;
  double norm = 0;
  for (double v : want) norm = std::max(norm, std::abs(v));
  long long bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) bad += std::abs(got[i] - want[i]) > 1e-12 * norm;
  return bad;
}


}  // namespace moe_adaptive_test
