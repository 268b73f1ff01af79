// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A mixture-of-experts layer (loom/exec/moe.hpp) on device groups bound to a stream
// (loom/cuda/moe.hpp): routing, dispatch, the expert-parallel exchange (flat and hierarchical),
// linear experts with loom's device linear kernel, combine and the backward of all of it, on
// cuda_local and nccl, against the same layer on the threads backend: outputs, the auxiliary loss,
// the router, input and expert gradients, the routing (slots, hence the dropped pairs) and the
// per-group counters equal bit for bit under the simulator (within 1e-5 on a GPU), top-1 and
// top-2, capacity factors that drop and 0, under several seeds of the simulator's order and delays
// with the race detector failing the run. Pipeline MoE's combine (experts over the group, one
// all-reduce) likewise.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/comm/counting.hpp>
#include <loom/comm/threads.hpp>
#include <loom/cuda/moe.hpp>
#include <loom/cuda/patterns.hpp>
#include <loom/exec/moe.hpp>
#include <loom/exec/tensor_parallel.hpp>

#include "device_support.hpp"

namespace {

using loom_device_test::backend;
using loom_device_test::download;
using loom_device_test::upload;

constexpr std::size_t tokens = 6, width = 3;

//! Element i of tensor `which` of rank (or expert) r: values whose sums round.
float value(int which, int r, std::size_t i) {
  return static_cast<float>(std::sin(0.4 + 1.3 * which + 0.77 * r + 0.157 * static_cast<double>(i)));
}
std::vector<float> init(int which, int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(which, r, i);
  return v;
}

//! One case: E experts over a group of `ranks`, hierarchical with `node` ranks per node (0: flat),
//! or Pipeline MoE's layout (experts over the group, every rank the same tokens).
struct moe_case {
  int ranks, experts, top_k;
  double capacity_factor;
  int node = 0;
  bool pipeline = false;
  int chunks = 0;  //!< > 0: the exchange overlapped with the experts in this many pieces (ep_overlapped)
};

//! What one rank ends with.
struct moe_result {
  std::vector<float> y, dx, dlogits, gw, gb, aux;
  std::vector<long long> slot;
  std::vector<int> expert;
  long long capacity = 0;
  std::vector<loom::comm_counters> counts;  //!< the group's, then the node and cross groups'
};

//! The host operations (threads).
struct host_ops {
  using routing = loom::moe_routing<float>;
  loom::linear_kernel kernel{};
  void route(const loom::moe_options& o, std::span<const float> l, routing& r) const { r = loom::moe_route(o, l); }
  void aux(const routing& r, std::span<float> out) const { out[0] = loom::moe_aux_loss(r); }
  void dispatch(const routing& r, std::span<const float> x, std::span<float> s, loom::moe_experts held = {}) const {
    loom::moe_dispatch(r, x, s, width, held);
  }
  void combine(const routing& r, std::span<const float> s, std::span<float> y) const { loom::moe_combine(r, s, y, width); }
  void combine_backward(const routing& r, std::span<const float> out, std::span<const float> dy, std::span<float> ds, std::span<float> dg,
                        loom::moe_experts held = {}) const {
    loom::moe_combine_backward(r, out, dy, ds, dg, width, held);
  }
  void dispatch_backward(const routing& r, std::span<const float> ds, std::span<float> dx, loom::moe_experts held = {}) const {
    loom::moe_dispatch_backward(r, ds, dx, width, held);
  }
  void route_backward(const routing& r, const loom::moe_options& o, std::span<const float> dg, std::span<float> dl) const {
    loom::moe_route_backward(r, o, dg, 0.5f, dl);
  }
  routing host(const routing& r) const { return r; }
};

//! The device operations on `stream`.
struct device_ops {
  using routing = loom::cuda::moe_routing<float>;
  cudaStream_t stream;
  loom::cuda::linear_kernel kernel{stream};
  void route(const loom::moe_options& o, std::span<const float> l, routing& r) const { loom::cuda::moe_route(o, l, r, stream); }
  void aux(const routing& r, std::span<float> out) const { loom::cuda::moe_aux_loss(r, out, stream); }
  void dispatch(const routing& r, std::span<const float> x, std::span<float> s, loom::moe_experts held = {}) const {
    loom::cuda::moe_dispatch(r, x, s, width, stream, held);
  }
  void combine(const routing& r, std::span<const float> s, std::span<float> y) const { loom::cuda::moe_combine(r, s, y, width, stream); }
  void combine_backward(const routing& r, std::span<const float> out, std::span<const float> dy, std::span<float> ds, std::span<float> dg,
                        loom::moe_experts held = {}) const {
    loom::cuda::moe_combine_backward(r, out, dy, ds, dg, width, stream, held);
  }
  void dispatch_backward(const routing& r, std::span<const float> ds, std::span<float> dx, loom::moe_experts held = {}) const {
    loom::cuda::moe_dispatch_backward(r, ds, dx, width, stream, held);
  }
  void route_backward(const routing& r, const loom::moe_options& o, std::span<const float> dg, std::span<float> dl) const {
    loom::cuda::moe_route_backward(r, o, dg, 0.5f, dl, stream);
  }
  loom::moe_routing<float> host(const routing& r) const { return r.to_host(stream); }
};

std::span<float> whole(std::vector<float>& v) { return {v.data(), v.size()}; }
std::span<float> whole(loom::cuda::device_buffer<float>& b) { return b.span(); }
template <class B>
std::span<const float> c(B& b) {
  return whole(b);
}

//! The layer's forward and backward on group `g` (see the file comment); `make(host vector)`
//! gives a buffer of the group's memory, `fetch(buffer)` a host copy.
template <class G, class Ops, class Make, class Fetch>
moe_result moe_layer(loom::ep_group<G>& g, const moe_case& k, const Ops& ops, Make&& make, Fetch&& fetch) {
  const loom::moe_options o{.experts = k.experts, .top_k = k.top_k, .capacity_factor = k.capacity_factor};
  const int ep = g.size(), me = g.rank(), El = k.experts / ep;
  const int src = k.pipeline ? 0 : me;  // Pipeline MoE: every rank routes the same tokens
  const auto E = static_cast<std::size_t>(k.experts), K = static_cast<std::size_t>(k.top_k);
  auto logits = make(init(0, src, tokens * E)), x = make(init(1, src, tokens * width)), dy = make(init(2, src, tokens * width));
  typename Ops::routing r;
  ops.route(o, c(logits), r);
  loom::set_capacity(g, r, o);
  auto aux = make(std::vector<float>(1));
  ops.aux(r, whole(aux));
  const auto C = static_cast<std::size_t>(r.capacity), all = E * C * width, rows_per = static_cast<std::size_t>(ep) * C;
  auto zeros = [&](std::size_t n) { return make(std::vector<float>(n)); };
  std::vector<float> wh, bh;  // the local experts' weights [El][h][h] and biases [El][h]
  for (int e = 0; e < El; ++e) {
    const int global = me * El + e;  // the experts this rank holds (of the group's E)
    auto w = init(10, global, width * width), b = init(11, global, width);
    wh.insert(wh.end(), w.begin(), w.end());
    bh.insert(bh.end(), b.begin(), b.end());
  }
  auto w = make(wh), b = make(bh);
  auto gw = zeros(wh.size()), gb = zeros(bh.size()), y = zeros(tokens * width), dx = zeros(tokens * width);
  auto dgate = zeros(tokens * K), dlogits = zeros(tokens * E);
  auto sub = [](auto& buf, std::size_t at, std::size_t n) { return whole(buf).subspan(at, n); };
  const auto hh = width * width;
  if (k.pipeline) {
    // Experts over the group: dispatch by index slicing, combine by one all-reduce.
    const loom::moe_experts held = loom::tp_experts(k.experts, g);
    const std::size_t local = static_cast<std::size_t>(El) * C * width;
    auto slots = zeros(local), out = zeros(local), dslots = zeros(local), dback = zeros(local);
    ops.dispatch(r, c(x), whole(slots), held);
    for (std::size_t e = 0; e < static_cast<std::size_t>(El); ++e)
      ops.kernel.forward(std::span<const float>(sub(slots, e * C * width, C * width)), std::span<const float>(sub(w, e * hh, hh)),
                         std::span<const float>(sub(b, e * width, width)), sub(out, e * C * width, C * width), C, width, width);
    loom::tp_moe_combine(g, r, c(out), whole(y), width);
    ops.combine_backward(r, c(out), c(dy), whole(dslots), whole(dgate), held);
    for (std::size_t e = 0; e < static_cast<std::size_t>(El); ++e) {
      ops.kernel.backward_input(std::span<const float>(sub(dslots, e * C * width, C * width)), std::span<const float>(sub(w, e * hh, hh)),
                                sub(dback, e * C * width, C * width), C, width, width);
      ops.kernel.backward_weight(std::span<const float>(sub(slots, e * C * width, C * width)),
                                 std::span<const float>(sub(dslots, e * C * width, C * width)), sub(gw, e * hh, hh), sub(gb, e * width, width), C,
                                 width, width);
    }
    ops.dispatch_backward(r, c(dback), whole(dx), held);
    loom::tp_moe_backward_sum(g, whole(dx), whole(dgate));
  } else if (k.chunks > 0) {
    // FSMoE's overlap: the experts run piece by piece while the other pieces' all-to-alls fly.
    auto slots = zeros(all), scratch = zeros(4 * all), rows = zeros(all), outrows = zeros(all), back = zeros(all);
    auto dslots = zeros(all), drows = zeros(all), dxrows = zeros(all), dback = zeros(all);
    ops.dispatch(r, c(x), whole(slots));
    auto forward = [&](int e, std::span<const float> in, std::span<float> out, std::size_t n) {
      const auto u = static_cast<std::size_t>(e);
      ops.kernel.forward(in, std::span<const float>(sub(w, u * hh, hh)), std::span<const float>(sub(b, u * width, width)), out, n, width, width);
    };
    loom::ep_overlapped(g, k.experts, C, width, k.chunks, c(slots), whole(back), whole(rows), whole(outrows), whole(scratch), forward);
    ops.combine(r, c(back), whole(y));
    ops.combine_backward(r, c(back), c(dy), whole(dslots), whole(dgate));
    auto backward = [&](int e, std::span<const float> in, std::span<float> out, std::size_t n) {
      ops.kernel.backward_input(in, std::span<const float>(sub(w, static_cast<std::size_t>(e) * hh, hh)), out, n, width, width);
    };
    loom::ep_overlapped(g, k.experts, C, width, k.chunks, c(dslots), whole(dback), whole(drows), whole(dxrows), whole(scratch), backward);
    const std::size_t block = rows_per * width;
    for (std::size_t e = 0; e < static_cast<std::size_t>(El); ++e)
      ops.kernel.backward_weight(std::span<const float>(sub(rows, e * block, block)), std::span<const float>(sub(drows, e * block, block)),
                                 sub(gw, e * hh, hh), sub(gb, e * width, width), rows_per, width, width);
    ops.dispatch_backward(r, c(dback), whole(dx));
  } else {
    auto slots = zeros(all), scratch = zeros(all), rows = zeros(all), outrows = zeros(all), back = zeros(all);
    auto dslots = zeros(all), drows = zeros(all), dxrows = zeros(all), dback = zeros(all);
    ops.dispatch(r, c(x), whole(slots));
    loom::ep_to_experts(g, k.experts, c(slots), whole(scratch), whole(rows));
    const std::size_t block = rows_per * width;  // one local expert's rows
    for (std::size_t e = 0; e < static_cast<std::size_t>(El); ++e)
      ops.kernel.forward(std::span<const float>(sub(rows, e * block, block)), std::span<const float>(sub(w, e * hh, hh)),
                         std::span<const float>(sub(b, e * width, width)), sub(outrows, e * block, block), rows_per, width, width);
    loom::ep_from_experts(g, k.experts, c(outrows), whole(scratch), whole(back));
    ops.combine(r, c(back), whole(y));
    ops.combine_backward(r, c(back), c(dy), whole(dslots), whole(dgate));
    loom::ep_to_experts(g, k.experts, c(dslots), whole(scratch), whole(drows));
    for (std::size_t e = 0; e < static_cast<std::size_t>(El); ++e) {
      ops.kernel.backward_input(std::span<const float>(sub(drows, e * block, block)), std::span<const float>(sub(w, e * hh, hh)),
                                sub(dxrows, e * block, block), rows_per, width, width);
      ops.kernel.backward_weight(std::span<const float>(sub(rows, e * block, block)), std::span<const float>(sub(drows, e * block, block)),
                                 sub(gw, e * hh, hh), sub(gb, e * width, width), rows_per, width, width);
    }
    loom::ep_from_experts(g, k.experts, c(dxrows), whole(scratch), whole(dback));
    ops.dispatch_backward(r, c(dback), whole(dx));
  }
  ops.route_backward(r, o, c(dgate), whole(dlogits));
  const loom::moe_routing<float> hr = ops.host(r);
  return {fetch(y), fetch(dx), fetch(dlogits), fetch(gw), fetch(gb), fetch(aux), hr.slot, hr.expert, r.capacity, {}};
}

//! The groups of a case on world `w`: the expert-parallel group, and for a hierarchical case its
//! node and cross groups.
template <class W>
struct groups {
  using counted = loom::counted<W>;
  counted all, node, cross;
  groups(W& w, const moe_case& k)
      : all(w.split(0, w.rank())), node(w.split(k.node > 0 ? w.rank() / k.node : 0, w.rank())),
        cross(w.split(k.node > 0 ? w.rank() % k.node : 0, w.rank())) {}
  std::vector<loom::comm_counters> counters() { return {all.counters(), node.counters(), cross.counters()}; }
};

std::vector<moe_result> on_threads(const moe_case& k) {
  std::vector<moe_result> out(static_cast<std::size_t>(k.ranks));
  loom::run_threads(k.ranks, [&](loom::threads::comm& w) {
    groups<loom::threads::comm> gs(w, k);
    loom::ep_group<loom::counted<loom::threads::comm>> g{&gs.all, k.node > 0 ? &gs.node : nullptr, k.node > 0 ? &gs.cross : nullptr};
    auto r = moe_layer(
        g, k, host_ops{}, [](std::vector<float> v) { return v; }, [](std::vector<float>& v) { return v; });
    r.counts = gs.counters();
    out[static_cast<std::size_t>(w.rank())] = r;
  });
  return out;
}

template <class W>
moe_result on_device_rank(W& w, const moe_case& k, const loom::moe_faults& faults = {}) {
  groups<W> gs(w, k);
  using counted = loom::counted<W>;
  loom::cuda::stream st, comm_st;
  loom::cuda::name_stream(st.get(), "r" + std::to_string(w.rank()) + " moe");
  loom::cuda::name_stream(comm_st.get(), "r" + std::to_string(w.rank()) + " moe exchange");
  loom::on_stream<counted> all(gs.all, st.get()), node(gs.node, st.get()), cross(gs.cross, st.get()), exchange(gs.all, comm_st.get());
  loom::ep_group<loom::on_stream<counted>> g{&all, k.node > 0 ? &node : nullptr, k.node > 0 ? &cross : nullptr, &exchange, faults};
  std::vector<std::vector<float>> sources;  // alive until the copies ran (fetch synchronises)
  sources.reserve(64);
  auto r = moe_layer(
      g, k, device_ops{st.get()},
      [&](std::vector<float> v) {
        sources.push_back(std::move(v));
        return upload(sources.back(), st.get());
      },
      [&](loom::cuda::device_buffer<float>& d) { return download(d, st.get()); });
  r.counts = gs.counters();
  w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank done before the buffers go
  return r;
}

[[maybe_unused]] double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, m = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(got[i]) - want[i]));
    m = std::max(m, std::abs(static_cast<double>(want[i])));
  }
  return d / m;
}

void check_same(const moe_result& got, const moe_result& want) {
#if defined(LOOM_CUDA_SIM)
  CHECK(got.y == want.y);
  CHECK(got.dx == want.dx);
  CHECK(got.dlogits == want.dlogits);
  CHECK(got.gw == want.gw);
  CHECK(got.gb == want.gb);
  CHECK(got.aux == want.aux);
#else
  CHECK(max_rel(got.y, want.y) <= 1e-5);
  CHECK(max_rel(got.dx, want.dx) <= 1e-5);
  CHECK(max_rel(got.dlogits, want.dlogits) <= 1e-5);
  CHECK(max_rel(got.gw, want.gw) <= 1e-5);
  CHECK(max_rel(got.aux, want.aux) <= 1e-5);
#endif
  CHECK(got.slot == want.slot);
  CHECK(got.expert == want.expert);
  CHECK(got.capacity == want.capacity);
  CHECK(got.counts == want.counts);
}

}  // namespace

TEST_CASE("an MoE layer runs on device groups with the threads backend's results, routing and counters") {
  const moe_case cases[] = {
      {.ranks = 2, .experts = 4, .top_k = 1, .capacity_factor = 0},          // ep alone, nothing dropped
      {.ranks = 2, .experts = 4, .top_k = 2, .capacity_factor = 0.5},        // top-2, pairs dropped
      {.ranks = 4, .experts = 4, .top_k = 2, .capacity_factor = 1.0},        // one expert per rank
      {.ranks = 4, .experts = 8, .top_k = 2, .capacity_factor = 0, .node = 2},    // hierarchical, f = 0
      {.ranks = 4, .experts = 4, .top_k = 1, .capacity_factor = 0.5, .node = 2},  // hierarchical, dropping
      {.ranks = 2, .experts = 4, .top_k = 2, .capacity_factor = 1.0, .pipeline = true},  // Pipeline MoE
      {.ranks = 2, .experts = 4, .top_k = 2, .capacity_factor = 0, .chunks = 2},        // the overlap, two streams
      {.ranks = 4, .experts = 8, .top_k = 1, .capacity_factor = 1.0, .chunks = 3},      // the overlap, dropping
  };
  for (const moe_case& k : cases) {
    CAPTURE(k.ranks);
    CAPTURE(k.experts);
    CAPTURE(k.top_k);
    CAPTURE(k.capacity_factor);
    CAPTURE(k.node);
    CAPTURE(k.pipeline);
    CAPTURE(k.chunks);
    const auto want = on_threads(k);
    std::size_t dropped = 0;
    for (auto& r : want)
      for (long long s : r.slot) dropped += s >= r.capacity ? 1 : 0;
    if (k.capacity_factor == 0) CHECK(dropped == 0);
    if (k.capacity_factor == 0.5) CHECK(dropped > 0);  // the case drops, so the dropped set is compared
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(loom_device_test::name(b));
      if (loom_device_test::skip_unless_devices(b, k.ranks)) continue;
      for (std::uint64_t seed = 1; seed <= 6; ++seed) {
        CAPTURE(seed);
        loom_device_test::simulate_with(seed);
        std::vector<moe_result> got(static_cast<std::size_t>(k.ranks));
        auto body = [&](auto& w) { got[static_cast<std::size_t>(w.rank())] = on_device_rank(w, k); };
        loom_device_test::run_on(b, k.ranks, body);
        for (std::size_t r = 0; r < got.size(); ++r) {
          CAPTURE(r);
          check_same(got[r], want[r]);
        }
        CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
        break;  // a GPU has no seeds to vary
#endif
      }
    }
  }
}

#if defined(LOOM_CUDA_SIM)
TEST_CASE("the overlapped MoE exchange sending a piece without waiting for the kernel that packed it is a race naming both") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    for (std::uint64_t seed : {3, 8}) {
      CAPTURE(seed);
      loom::cudasim::config cfg;
      cfg.seed = seed;
      cfg.races = loom::cudasim::race_policy::record;
      loom::cudasim::configure(cfg);
      const moe_case k{.ranks = 2, .experts = 4, .top_k = 2, .capacity_factor = 1.0, .chunks = 2};
      auto body = [&](auto& w) { (void)on_device_rank(w, k, {.skip_pack_wait = true}); };
      loom_device_test::run_on(b, 2, body);
      const auto all = loom_device_test::findings();
      CAPTURE(all);
      CHECK(all.find("race: ") != std::string::npos);
      CHECK(all.find("loom moe layout") != std::string::npos);
    }
  }
  loom_device_test::simulate_with(1);
}
#endif

namespace {

//! Tutel's adaptive exchange on one rank: `slots` out to the experts' ranks under degree r and the
//! rows straight back (each slot then the sum of its r copies); the rows, the slots and the counters.
struct adaptive_result {
  std::vector<float> rows, back;
  std::vector<loom::comm_counters> counts;
};

template <class G, class Make, class Fetch>
adaptive_result adaptive_round(loom::ep_group<G>& g, const loom::ep_adaptive& a, Make&& make, Fetch&& fetch) {
  constexpr std::size_t C = 4, h = 2;
  const auto E = static_cast<std::size_t>(a.experts), all = E * C * h;
  const std::size_t r = a.degree == 0 ? 1 : static_cast<std::size_t>(a.degree);
  auto slots = make(init(20, g.rank(), all)), scratch = make(std::vector<float>(r * all)), rows = make(std::vector<float>(r * all)),
       back = make(std::vector<float>(all));
  loom::ep_adaptive_to_experts(g, a, C, h, c(slots), whole(scratch), whole(rows));
  auto sent = fetch(rows);
  loom::ep_adaptive_from_experts(g, a, C, h, whole(rows), whole(scratch), whole(back));
  return {sent, fetch(back), {}};
}

}  // namespace

TEST_CASE("Tutel's adaptive exchange runs on device groups with the threads backend's rows, sums and counters, every degree") {
  struct adaptive_case {
    int ranks, experts, node;
  };
  for (adaptive_case ac : {adaptive_case{4, 2, 0}, adaptive_case{4, 1, 0}, adaptive_case{4, 1, 2}}) {
    for (int degree : loom::ep_adaptive_degrees(ac.experts, ac.ranks)) {
      CAPTURE(ac.ranks);
      CAPTURE(ac.experts);
      CAPTURE(ac.node);
      CAPTURE(degree);
      const loom::ep_adaptive a{ac.ranks, ac.experts, degree};
      const moe_case k{.ranks = ac.ranks, .experts = ac.experts, .top_k = 1, .capacity_factor = 0, .node = ac.node};
      std::vector<adaptive_result> want(static_cast<std::size_t>(ac.ranks)), got(want.size());
      loom::run_threads(ac.ranks, [&](loom::threads::comm& w) {
        groups<loom::threads::comm> gs(w, k);
        loom::ep_group<loom::counted<loom::threads::comm>> g{&gs.all, ac.node > 0 ? &gs.node : nullptr, ac.node > 0 ? &gs.cross : nullptr};
        auto r = adaptive_round(
            g, a, [](std::vector<float> v) { return v; }, [](std::vector<float>& v) { return v; });
        r.counts = gs.counters();
        want[static_cast<std::size_t>(w.rank())] = r;
      });
      for (backend b : {backend::cuda_local, backend::nccl}) {
        CAPTURE(loom_device_test::name(b));
        if (loom_device_test::skip_unless_devices(b, ac.ranks)) continue;
        for (std::uint64_t seed = 1; seed <= 3; ++seed) {
          CAPTURE(seed);
          loom_device_test::simulate_with(seed);
          auto body = [&](auto& w) {
            using W = std::remove_cvref_t<decltype(w)>;
            groups<W> gs(w, k);
            loom::cuda::stream st;
            loom::on_stream<loom::counted<W>> all(gs.all, st.get()), node(gs.node, st.get()), cross(gs.cross, st.get());
            loom::ep_group<loom::on_stream<loom::counted<W>>> g{&all, ac.node > 0 ? &node : nullptr, ac.node > 0 ? &cross : nullptr};
            std::vector<std::vector<float>> sources;
            sources.reserve(8);
            auto r = adaptive_round(
                g, a,
                [&](std::vector<float> v) {
                  sources.push_back(std::move(v));
                  return upload(sources.back(), st.get());
                },
                [&](loom::cuda::device_buffer<float>& d) { return download(d, st.get()); });
            r.counts = gs.counters();
            got[static_cast<std::size_t>(w.rank())] = r;
            w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank done before the buffers go
          };
          loom_device_test::run_on(b, ac.ranks, body);
          for (std::size_t r = 0; r < got.size(); ++r) {
            CAPTURE(r);
            CHECK(got[r].rows == want[r].rows);  // copies only: equal on a GPU too
            CHECK(got[r].back == want[r].back);  // sums of r copies in copy order, the same additions
            CHECK(got[r].counts == want[r].counts);
          }
          CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
          break;
#endif
        }
      }
    }
  }
}
