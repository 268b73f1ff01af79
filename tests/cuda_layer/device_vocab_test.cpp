// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Vocabulary parallelism on the device path: loom::vocab_layers<double, loom::cuda::vocab_kernel>
// with linear stages on cuda_local and nccl, eagerly and replayed from CUDA graphs, trains like
// the single-rank reference on the same shards (tests/exec/vocab_support.hpp): bitwise in
// deterministic mode against the simulator (on a GPU `exp` and `log` may differ from the host's in
// the last bits: within 1e-12 there), within 1e-12 relative otherwise, with the simulator's race
// detector silent; the layers' kernels, messages and memory all on the device.
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <loom/cuda/patterns.hpp>

#include "../exec/vocab_support.hpp"
#include "../sweep.hpp"
#include "device_support.hpp"

using namespace loom_device_test;
using vocab_test::tok_t;
using vocab_test::vec;

namespace {

// vocab_test::linear_stage on a device: parameters and gradient in device memory, the products
// loom::cuda::linear_kernel's on the call's stream.
struct device_linear_stage {
  using value_type = double;
  using math = vocab_test::linear_math<loom::cuda::linear_kernel, std::span<const double>>;
  std::size_t n = 0, h = 0;
  loom::cuda::device_buffer<double> params, grad;
  device_linear_stage(const vocab_test::model& md, int s) : n(md.n), h(md.h), params(md.h * md.h + md.h), grad(md.h * md.h + md.h) {
    const vec p = md.stage_params(s);
    loom::cuda::copy_to_device(params.span(), std::span<const double>(p));
  }
  std::size_t input_size() const { return n * h; }
  std::size_t output_size() const { return n * h; }
  std::size_t stash_size() const { return n * h; }
  std::span<double> weight_grad() { return grad.span(); }
  void forward(const loom::stage_context& c, loom::forward_buffers<double> f) const { math::forward({c.stream}, n, h, params.span(), f); }
  void backward_input(const loom::stage_context& c, loom::backward_buffers<double> f) const { math::backward_input({c.stream}, n, h, params.span(), f); }
  void backward_weight(const loom::stage_context& c, loom::weight_buffers<double> f) const {
    math::backward_weight({c.stream}, n, h, f.input, f.stash, f.weight_grad);
  }
  void backward(const loom::stage_context& c, loom::backward_buffers<double> f) const {
    backward_input(c, f);
    math::backward_weight({c.stream}, n, h, f.input, f.stash, f.weight_grad);
  }
};
static_assert(loom::split_stage<device_linear_stage>);

using device_layers = loom::vocab_layers<double, loom::cuda::vocab_kernel>;

std::vector<double> to_host(std::span<const double> d) {
  std::vector<double> v(d.size());
  loom::cuda::copy_to_host(std::span<double>(v), d);
  return v;
}

// One rank's part of the model trained on the device (as vocab_test::run_rank on the host).
template <class Comm>
vocab_test::result device_rank(Comm& c, const vocab_test::model& md, const loom::schedule& s, const std::vector<tok_t>& ids,
                               const std::vector<tok_t>& targets, loom::pipeline_options opt, int steps) {
  const vec W = md.table(7), E = md.table(8);
  vocab_test::result r;
  r.stage_grads.assign(static_cast<std::size_t>(s.stages), vec(md.h * md.h + md.h, 0.0));
  r.out_grad.assign(md.vocab * md.h, 0.0);
  r.in_grad.assign(md.vocab * md.h, 0.0);
  const auto sh = loom::shard_of(static_cast<std::int64_t>(md.vocab), s.ranks, c.rank(), md.h);
  const std::size_t rh = sh.rows * md.h, at = static_cast<std::size_t>(c.rank()) * rh;
  loom::cuda::device_buffer<double> w(rh), e(rh), gw(rh), ge(rh);
  loom::cuda::copy_to_device(w.span(), std::span<const double>(W).subspan(at, rh));
  loom::cuda::copy_to_device(e.span(), std::span<const double>(E).subspan(at, rh));
  device_layers layers(sh, md.n, w.span(), e.span(), gw.span(), ge.span());
  loom::pipeline<loom::schedule, device_linear_stage, Comm, device_layers> pipe(s, c, [&](loom::stage_id id) { return device_linear_stage(md, id.stage); },
                                                                               layers, opt);
  layers.set_batch(ids, targets);
  for (int k = 0; k < steps; ++k) r.loss = pipe.step({}).loss;
  const vec g = to_host(gw.span()), gi = to_host(ge.span());
  std::copy(g.begin(), g.end(), r.out_grad.begin() + static_cast<std::ptrdiff_t>(at));
  std::copy(gi.begin(), gi.end(), r.in_grad.begin() + static_cast<std::ptrdiff_t>(at));
  for (std::size_t i = 0; i < pipe.stages().size(); ++i) r.stage_grads[static_cast<std::size_t>(pipe.ids()[i].stage)] = to_host(pipe.stages()[i].grad.span());
  return r;
}

struct device_run {
  vocab_test::result model;  // the ranks' parts summed
  std::string errors;
};

device_run run(backend b, const vocab_test::model& md, const loom::schedule& s, const std::vector<tok_t>& ids, const std::vector<tok_t>& targets,
               loom::pipeline_options opt, int steps) {
  std::vector<vocab_test::result> parts(static_cast<std::size_t>(s.ranks));
  std::mutex mu;
  device_run out;
  run_on(b, s.ranks, [&](auto& c) {
    try {
      parts[static_cast<std::size_t>(c.rank())] = device_rank(c, md, s, ids, targets, opt, steps);
    } catch (const std::exception& e) {
      std::lock_guard lk(mu);
      out.errors += "[rank " + std::to_string(c.rank()) + "] " + e.what() + "\n";
    }
  });
  if (!out.errors.empty()) return out;
  out.model = parts[0];
  for (std::size_t k = 1; k < parts.size(); ++k) {
    auto add = [](vec& to, const vec& v) {
      for (std::size_t i = 0; i < to.size(); ++i) to[i] += v[i];
    };
    add(out.model.out_grad, parts[k].out_grad);
    add(out.model.in_grad, parts[k].in_grad);
    for (std::size_t st = 0; st < out.model.stage_grads.size(); ++st) add(out.model.stage_grads[st], parts[k].stage_grads[st]);
  }
  // The loss is the last stage's rank's; every rank returns the agreed one.
  out.model.loss = parts[static_cast<std::size_t>(s.rank_of(0, s.stages - 1))].loss;
  return out;
}

vocab_test::result linear_reference(const vocab_test::model& md, int p, int algorithm, int m, const std::vector<tok_t>& ids, const std::vector<tok_t>& targets) {
  return vocab_test::reference_with(md, p, algorithm, m, ids, targets, [&](int s) {
    return vocab_test::linear_stage{md.n, md.h, md.stage_params(s), vec(md.h * md.h + md.h, 0.0)};
  });
}

}  // namespace

TEST_CASE("vocab on the device: every vocabulary-parallel family trains like the single-rank reference, eager and graph, both communicators") {
  vocab_test::model md;
  md.n = 3;
  md.h = 4;
  md.vocab = 24;
  md.layers_per_stage = 1;
  int ran = 0, shapes = 0;
  for (backend b : {backend::cuda_local, backend::nccl})
    for (int p : {2, 4}) {
      if (skip_unless_devices(b, p)) continue;
      ++shapes;
      for (const auto& f : vocab_test::families)
        for (bool graph : {false, true})
          for (bool det : {true, false}) {
            const int m = p + 2;
            const loom::schedule s = f.make(p, m);
            md.stages = s.stages;
            const auto ids = md.tokens(m, 11), targets = md.tokens(m, 12);
            const vocab_test::result ref = linear_reference(md, p, f.algorithm, m, ids, targets);
            CAPTURE(name(b));
            CAPTURE(f.name);
            CAPTURE(p);
            CAPTURE(graph);
            CAPTURE(det);
            simulate_with(static_cast<std::uint64_t>(det ? 3 : 4));
            const device_run o = run(b, md, s, ids, targets, {.deterministic = det, .graph = graph}, 2);
            INFO(o.errors << findings());
            REQUIRE(o.errors.empty());
            CHECK(findings().empty());
#if defined(LOOM_CUDA_SIM)
            const bool bitwise = det;
#else
            const bool bitwise = false;
#endif
            if (bitwise) {
              CHECK(o.model.loss == ref.loss);
              CHECK(vocab_test::same_bits(o.model.out_grad, ref.out_grad));
              CHECK(vocab_test::same_bits(o.model.in_grad, ref.in_grad));
              for (std::size_t st = 0; st < ref.stage_grads.size(); ++st) CHECK(vocab_test::same_bits(o.model.stage_grads[st], ref.stage_grads[st]));
            } else {
              CHECK(std::abs(o.model.loss - ref.loss) <= 1e-12 * std::abs(ref.loss));
              CHECK(vocab_test::rel(o.model.out_grad, ref.out_grad) <= 1e-12);
              CHECK(vocab_test::rel(o.model.in_grad, ref.in_grad) <= 1e-12);
              for (std::size_t st = 0; st < ref.stage_grads.size(); ++st) CHECK(vocab_test::rel(o.model.stage_grads[st], ref.stage_grads[st]) <= 1e-12);
            }
            ++ran;
          }
    }
  CHECK(ran == shapes * 4 * 2 * 2);  // every family, eager and graph, both modes, on every shape that ran
}

TEST_CASE("vocab on the simulated device: a layer message sent before its pass's kernel ran is a race naming both") {
#if !defined(LOOM_CUDA_SIM)
  MESSAGE("SKIPPED: the race detector is the simulator's");
  parts().missing.push_back("the race detector is the simulator's (a GPU runs the same sends without it)");
  return;
#else
  // With the deliberate bug `skip_send_wait`, a send does not wait for the event of the action
  // that produced its buffer. Every send races then, the stages' activations too; with the race
  // policy `record` the simulator collects every finding, and among them must be a vocabulary
  // message: a send racing the layers' kernel that wrote it (the IF pass's embedding rows on ranks
  // 1..p-1, the S pass's statistics), each named.
  vocab_test::model md;
  md.layers_per_stage = 1;
  for (backend b : {backend::cuda_local, backend::nccl})
    for (const auto& f : vocab_test::families) {
      const int p = 2, m = 4;
      if (skip_unless_devices(b, p)) continue;
      const loom::schedule s = f.make(p, m);
      md.stages = s.stages;
      const auto ids = md.tokens(m, 11), targets = md.tokens(m, 12);
      CAPTURE(name(b));
      CAPTURE(f.name);
      loom::cudasim::config c;
      c.seed = 1;
      c.races = loom::cudasim::race_policy::record;
      loom::cudasim::configure(c);
      loom::pipeline_options o;
      o.faults.skip_send_wait = true;
      (void)run(b, md, s, ids, targets, o, 1);
      const std::string all = findings();
      CAPTURE(all);
      bool named = false;
      for (auto const& r : loom::cudasim::reports())
        named = named || (r.text.find("race: loom vocabulary") != std::string::npos &&
                          r.text.find(b == backend::nccl ? "ncclSend" : "copy r") != std::string::npos &&
                          r.text.find("neither is ordered before the other") != std::string::npos);
      CHECK(named);
    }
#endif
}
