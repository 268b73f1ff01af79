// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// An MoE layer inside a device pipeline stage on a dp x ep x pp mesh (loom::mesh_comm on a
// cuda_local or nccl world, simulated): stage 0 a dense linear layer, stage 1 the MoE layer
// (router, E/ep linear experts per rank, the exchange over the mesh's ep group bound to the stage
// call's stream), trained by loom::pipeline with loom::data_parallel reducing the router over
// dp x ep and the experts over dp alone (grad_range::expert). The stage is written once over an
// "ops" policy: host loops on the threads backend, loom's kernels on a device world. Under the
// simulator (random order and delays, race detector failing the run) the losses and every rank's
// final parameters equal the threads run bit for bit, with a split-backward family and fused ones,
// top-1 and top-2, capacity factors that drop and one that does not. A capacity factor of 0 is not
// run here: its capacity is read by the host inside the stage call (loom/cuda/moe.hpp), which a
// device pipeline, enqueued ahead of the device, cannot wait for (on nccl it deadlocks).

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/cuda/moe.hpp>
#include <loom/cuda/patterns.hpp>
#include <loom/exec/data_parallel.hpp>
#include <loom/exec/moe.hpp>
#include <loom/exec/tensor_parallel.hpp>
#include <loom/mesh/mesh_comm.hpp>

#include "device_support.hpp"

namespace {

using loom_device_test::backend;

constexpr std::size_t tokens = 4, width = 4;

float value(int which, int r, std::size_t i) {
  return static_cast<float>(std::sin(0.2 + 1.1 * which + 0.61 * r + 0.173 * static_cast<double>(i)));
}
std::vector<float> init(int which, int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(which, r, i);
  return v;
}

//! Host memory and loops (threads).
struct host_policy {
  template <class U>
  using buffer = std::vector<U>;
  using routing = loom::moe_routing<float>;
  template <class C>
  using group = C;
  struct call {  // one stage call
    explicit call(const loom::stage_context&) {}
    template <class C>
    C* bind(C* c) const {
      return c;
    }
    loom::linear_kernel kernel() const { return {}; }
    template <class U>
    buffer<U> make(std::size_t n) const {
      return buffer<U>(n);
    }
    void route(const loom::moe_options& o, std::span<const float> l, routing& r) const { r = loom::moe_route(o, l); }
    void dispatch(const routing& r, std::span<const float> x, std::span<float> s) const { loom::moe_dispatch(r, x, s, width); }
    void combine(const routing& r, std::span<const float> s, std::span<float> y) const { loom::moe_combine(r, s, y, width); }
    void combine_backward(const routing& r, std::span<const float> out, std::span<const float> dy, std::span<float> ds, std::span<float> dg) const {
      loom::moe_combine_backward(r, out, dy, ds, dg, width);
    }
    void dispatch_backward(const routing& r, std::span<const float> ds, std::span<float> dx) const { loom::moe_dispatch_backward(r, ds, dx, width); }
    void route_backward(const routing& r, const loom::moe_options& o, std::span<const float> dg, std::span<float> dl) const {
      loom::moe_route_backward(r, o, dg, 0.0f, dl);
    }
    void copy(std::span<const float> from, std::span<float> to) const { std::copy(from.begin(), from.end(), to.begin()); }
  };
  static std::vector<float> fetch(std::span<const float> s) { return {s.begin(), s.end()}; }
  static buffer<float> upload(const std::vector<float>& v) { return v; }
};

//! Device memory, loom's kernels on the stage call's stream.
struct device_policy {
  template <class U>
  using buffer = loom::cuda::device_buffer<U>;
  using routing = loom::cuda::moe_routing<float>;
  template <class C>
  using group = loom::on_stream<C>;
  struct call {
    explicit call(const loom::stage_context& c) : s(c.stream) {}
    cudaStream_t s;
    template <class C>
    std::unique_ptr<loom::on_stream<C>> bind(C* c) const {
      return c == nullptr ? nullptr : std::make_unique<loom::on_stream<C>>(*c, s);
    }
    loom::cuda::linear_kernel kernel() const { return {s}; }
    template <class U>
    buffer<U> make(std::size_t n) const {
      return buffer<U>(n);
    }
    void route(const loom::moe_options& o, std::span<const float> l, routing& r) const { loom::cuda::moe_route(o, l, r, s); }
    void dispatch(const routing& r, std::span<const float> x, std::span<float> sl) const { loom::cuda::moe_dispatch(r, x, sl, width, s); }
    void combine(const routing& r, std::span<const float> sl, std::span<float> y) const { loom::cuda::moe_combine(r, sl, y, width, s); }
    void combine_backward(const routing& r, std::span<const float> out, std::span<const float> dy, std::span<float> ds, std::span<float> dg) const {
      loom::cuda::moe_combine_backward(r, out, dy, ds, dg, width, s);
    }
    void dispatch_backward(const routing& r, std::span<const float> ds, std::span<float> dx) const {
      loom::cuda::moe_dispatch_backward(r, ds, dx, width, s);
    }
    void route_backward(const routing& r, const loom::moe_options& o, std::span<const float> dg, std::span<float> dl) const {
      loom::cuda::moe_route_backward(r, o, dg, 0.0f, dl, s);
    }
    void copy(std::span<const float> from, std::span<float> to) const {
      if (!from.empty()) LOOM_CUDA_TRY(cudaMemcpyAsync(to.data(), from.data(), from.size_bytes(), cudaMemcpyDeviceToDevice, s));
    }
  };
  static std::vector<float> fetch(std::span<const float> s) {
    LOOM_CUDA_TRY(cudaDeviceSynchronize());
    std::vector<float> v(s.size());
    loom::cuda::copy_to_host(std::span<float>(v), s);
    return v;
  }
  static buffer<float> upload(const std::vector<float>& v) {
    buffer<float> b(v.size());
    loom::cuda::copy_to_device(b.span(), std::span<const float>(v));
    return b;
  }
};

template <class B>
std::span<float> all(B& b) {
  return {b.data(), b.size()};
}
template <class B>
std::span<const float> call_in(const B& b) {
  return {b.data(), b.size()};
}

//! The two stages (see the file comment). Stage 0: `y = x W0^T`. Stage 1: the MoE layer, whose
//! output elements are the loss terms (the loss is the sum of the layer's outputs).
template <class P, class C>
class moe_mesh_stage {
 public:
  using value_type = float;
  moe_mesh_stage(int stage, C* ep, loom::moe_options o) : stage_(stage), ep_(ep), o_(o) {
    const int n_ep = ep_ == nullptr ? 1 : ep_->size(), me = ep_ == nullptr ? 0 : ep_->rank();
    el_ = o.experts / n_ep;
    std::vector<float> p;
    if (stage_ == 0) {
      p = init(30, 0, width * width);
      ranges_ = {loom::grad_range{0, p.size()}};
    } else {
      p = init(31, 0, static_cast<std::size_t>(o.experts) * width);  // the router, dense
      const std::size_t router = p.size();
      for (int e = 0; e < el_; ++e) {
        auto w = init(32, me * el_ + e, width * width);
        p.insert(p.end(), w.begin(), w.end());
      }
      ranges_ = {loom::grad_range{0, router}, loom::grad_range{router, p.size() - router, {}, true}};
    }
    params_ = P::upload(p);
    grad_ = P::upload(std::vector<float>(p.size()));
  }
  std::size_t input_size() const { return tokens * width; }
  std::size_t output_size() const { return tokens * width; }
  std::size_t stash_size() const { return 0; }
  std::span<float> params() { return all(params_); }
  std::span<float> weight_grad() { return all(grad_); }
  std::span<const loom::grad_range> grad_ranges() const { return ranges_; }
  std::vector<float> host_params() const { return P::fetch(call_in(params_)); }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<float> fb) {
    typename P::call k(ctx);
    state& st = state_of(ctx.microbatch, k);
    if (stage_ == 0) {
      k.kernel().forward(fb.input, weights(), std::span<const float>{}, fb.output, tokens, width, width);
      return;
    }
    const auto E = static_cast<std::size_t>(o_.experts);
    auto bound = k.bind(ep_);
    loom::ep_group<typename P::template group<C>> g{&*bound};
    k.kernel().forward(fb.input, router(), std::span<const float>{}, all(st.logits), tokens, width, E);
    k.route(o_, call_in(st.logits), st.r);
    loom::set_capacity(g, st.r, o_);
    const std::size_t cap = static_cast<std::size_t>(st.r.capacity), n = E * cap * width, rows = static_cast<std::size_t>(g.size()) * cap;
    resize(k, st, n);
    k.dispatch(st.r, fb.input, all(st.slots));
    loom::ep_to_experts(g, o_.experts, call_in(st.slots), all(st.scratch), all(st.rows));
    for (std::size_t e = 0; e < static_cast<std::size_t>(el_); ++e)
      k.kernel().forward(call_in(st.rows).subspan(e * rows * width, rows * width), expert(e), std::span<const float>{},
                         all(st.out).subspan(e * rows * width, rows * width), rows, width, width);
    loom::ep_from_experts(g, o_.experts, call_in(st.out), all(st.scratch), all(st.back));
    k.combine(st.r, call_in(st.back), fb.output);
  }
  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<float> bb) {
    typename P::call k(ctx);
    state& st = state_of(ctx.microbatch, k);
    k.copy(bb.output_grad, all(st.dy));
    if (stage_ == 0) {
      if (!bb.input_grad.empty()) k.kernel().backward_input(bb.output_grad, weights(), bb.input_grad, tokens, width, width);
      return;
    }
    const auto E = static_cast<std::size_t>(o_.experts);
    auto bound = k.bind(ep_);
    loom::ep_group<typename P::template group<C>> g{&*bound};
    const std::size_t rows = static_cast<std::size_t>(g.size()) * static_cast<std::size_t>(st.r.capacity);
    k.combine_backward(st.r, call_in(st.back), bb.output_grad, all(st.dslots), all(st.dgate));
    loom::ep_to_experts(g, o_.experts, call_in(st.dslots), all(st.scratch), all(st.drows));
    for (std::size_t e = 0; e < static_cast<std::size_t>(el_); ++e)
      k.kernel().backward_input(call_in(st.drows).subspan(e * rows * width, rows * width), expert(e), all(st.din).subspan(e * rows * width, rows * width),
                                rows, width, width);
    loom::ep_from_experts(g, o_.experts, call_in(st.din), all(st.scratch), all(st.dback));
    k.route_backward(st.r, o_, call_in(st.dgate), all(st.dlogits));
    if (bb.input_grad.empty()) return;
    k.kernel().backward_input(call_in(st.dlogits), router(), bb.input_grad, tokens, width, E);  // the router's part
    k.dispatch_backward(st.r, call_in(st.dback), bb.input_grad);                              // plus the experts'
  }
  void backward_weight(const loom::stage_context& ctx, loom::weight_buffers<float> wb) {
    typename P::call k(ctx);
    state& st = state_of(ctx.microbatch, k);
    if (stage_ == 0) {
      k.kernel().backward_weight(wb.input, call_in(st.dy), wb.weight_grad, std::span<float>{}, tokens, width, width);
      return;
    }
    const auto E = static_cast<std::size_t>(o_.experts);
    const std::size_t rows = static_cast<std::size_t>(ep_ == nullptr ? 1 : ep_->size()) * static_cast<std::size_t>(st.r.capacity);
    const std::size_t router_size = E * width;
    for (std::size_t e = 0; e < static_cast<std::size_t>(el_); ++e)
      k.kernel().backward_weight(call_in(st.rows).subspan(e * rows * width, rows * width), call_in(st.drows).subspan(e * rows * width, rows * width),
                                 wb.weight_grad.subspan(router_size + e * width * width, width * width), std::span<float>{}, rows, width, width);
    k.kernel().backward_weight(wb.input, call_in(st.dlogits), wb.weight_grad.first(router_size), std::span<float>{}, tokens, width, E);
  }
  void backward(const loom::stage_context& ctx, loom::backward_buffers<float> bb) {
    backward_input(ctx, bb);
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  struct state {
    typename P::routing r;
    typename P::template buffer<float> logits, dy, slots, scratch, rows, out, back, dslots, drows, din, dback, dgate, dlogits;
  };
  state& state_of(int mb, const typename P::call& k) {
    while (states_.size() <= static_cast<std::size_t>(mb)) {
      states_.emplace_back();
      state& s = states_.back();
      const auto E = static_cast<std::size_t>(o_.experts), K = static_cast<std::size_t>(o_.top_k);
      s.logits = k.template make<float>(tokens * E);
      s.dy = k.template make<float>(tokens * width);
      s.dgate = k.template make<float>(tokens * K);
      s.dlogits = k.template make<float>(tokens * E);
    }
    return states_[static_cast<std::size_t>(mb)];
  }
  // The slot buffers for `n` elements (kept while the capacity stays).
  void resize(const typename P::call& k, state& st, std::size_t n) {
    if (st.slots.size() == n) return;
    for (auto* b : {&st.slots, &st.scratch, &st.rows, &st.out, &st.back, &st.dslots, &st.drows, &st.din, &st.dback}) *b = k.template make<float>(n);
  }
  std::span<const float> weights() const { return std::span<const float>(params_.data(), params_.size()); }
  std::span<const float> router() const { return weights().first(static_cast<std::size_t>(o_.experts) * width); }
  std::span<const float> expert(std::size_t e) const { return weights().subspan(router().size() + e * width * width, width * width); }

  int stage_;
  C* ep_;
  loom::moe_options o_;
  int el_ = 1;
  typename P::template buffer<float> params_, grad_;
  std::vector<loom::grad_range> ranges_;
  std::vector<state> states_;
};

//! A run: the mesh, the family, the routing.
struct mesh_case {
  int dp, ep;
  const char* family;
  loom::moe_options o;
};

//! Losses per step (world rank 0's), then every rank's final parameters.
struct mesh_result {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  std::string error;
};

loom::schedule family(const char* name, int ranks, int microbatches) {
  for (auto const& e : loom::default_registry().entries())
    if (e.name == name) return e.make(e.resolve({.ranks = ranks, .microbatches = microbatches}));
  FAIL("no family " << name);
  return {};
}

template <class P, class W>
void train_rank(W& world, const mesh_case& mc, mesh_result& out, std::mutex& mu) {
  constexpr int steps = 2, microbatches = 4;
  using mesh_t = loom::mesh<loom::dp<>, loom::ep<>, loom::pp<>>;
  loom::mesh_comm g(mesh_t{loom::dp<>{mc.dp}, loom::ep<>{mc.ep}, loom::pp<>{2}}, world);
  using C = typename decltype(g)::comm_type;
  using stage_t = moe_mesh_stage<P, C>;
  const auto s = family(mc.family, 2, microbatches);
  const int d = g.coord(loom::dim::dp), e = g.coord(loom::dim::ep);
  loom::data_parallel<decltype(g), stage_t, loom::sgd> sync(g, {.deterministic = true}, loom::sgd{.lr = 0.05});
  loom::pipeline p(s, g.pp(), [&](loom::stage_id id) { return stage_t(id.stage, &g.ep(), mc.o); }, {.deterministic = true, .observer = &sync});
  sync.attach(p);
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    auto inputs = P::upload(init(40 + i, d * mc.ep + e, static_cast<std::size_t>(microbatches) * tokens * width));  // each (dp, ep) rank its own tokens
    losses.push_back(p.step(std::span<const float>(inputs.data(), inputs.size())).loss);
  }
  sync.finish();
  std::lock_guard lk(mu);
  if (world.rank() == 0) out.losses = losses;
  for (auto& st : p.stages()) out.params[static_cast<std::size_t>(world.rank())] = st.host_params();
}

mesh_result on_threads(const mesh_case& mc) {
  mesh_result out;
  const int n = mc.dp * mc.ep * 2;
  out.params.resize(static_cast<std::size_t>(n));
  std::mutex mu;
  loom::run_threads(n, [&](loom::threads::comm& w) { train_rank<host_policy>(w, mc, out, mu); });
  return out;
}

mesh_result on_device(backend b, const mesh_case& mc) {
  mesh_result out;
  const int n = mc.dp * mc.ep * 2;
  out.params.resize(static_cast<std::size_t>(n));
  std::mutex mu;
  auto body = [&](auto& w) {
    try {
      train_rank<device_policy>(w, mc, out, mu);
    } catch (const std::exception& ex) {
      std::lock_guard lk(mu);
      if (out.error.empty()) out.error = ex.what();
    }
  };
  if (b == backend::cuda_local) loom::cuda_local::run(n, body, 0, std::chrono::milliseconds(20000));
  else loom::nccl::run(n, body, std::chrono::milliseconds(20000));
  return out;
}

}  // namespace

TEST_CASE("an MoE layer in a device pipeline stage on a dp x ep x pp mesh trains as on threads, bit for bit") {
  const mesh_case cases[] = {
      {1, 2, "zb-h1", {.experts = 4, .top_k = 2, .capacity_factor = 1.0}},
      {2, 2, "1f1b", {.experts = 4, .top_k = 1, .capacity_factor = 2.0}},
      {1, 2, "gpipe", {.experts = 2, .top_k = 1, .capacity_factor = 0.5}},
  };
  for (const mesh_case& mc : cases) {
    CAPTURE(mc.dp);
    CAPTURE(mc.ep);
    CAPTURE(mc.family);
    CAPTURE(mc.o.top_k);
    CAPTURE(mc.o.capacity_factor);
    const mesh_result want = on_threads(mc);
    REQUIRE(want.losses.size() == 2);
    CHECK(want.losses[0] != 0.0);
    CHECK(want.losses[1] != want.losses[0]);  // the update changed the loss
    CHECK(want.params[0] != init(30, 0, width * width));  // training moved the parameters
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(loom_device_test::name(b));
      if (loom_device_test::skip_unless_devices(b, mc.dp * mc.ep * 2)) continue;
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        CAPTURE(seed);
        loom_device_test::simulate_with(seed);
        const mesh_result got = on_device(b, mc);
        CHECK(got.error == "");
#if defined(LOOM_CUDA_SIM)
        CHECK(got.losses == want.losses);
        CHECK(got.params == want.params);
#else
        for (std::size_t i = 0; i < want.losses.size(); ++i) CHECK(std::abs(got.losses[i] - want.losses[i]) <= 1e-4 * std::abs(want.losses[i]));
#endif
        CHECK(loom_device_test::findings() == "");
#if !defined(LOOM_CUDA_SIM)
        break;
#endif
      }
    }
  }
}
