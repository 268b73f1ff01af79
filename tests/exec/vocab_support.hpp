// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the vocabulary-parallel executor tests (threads: tests/exec/vocab_pipeline_test.cpp;
// MPI: tests/exec_mpi): a model of token-wise tanh layers between a sharded embedding and a
// sharded output layer, its single-rank reference, and one rank's part of a pipelined step.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/exec/pipeline.hpp>
#include <loom/exec/vocab_parallel.hpp>
#include <loom/schedule.hpp>
#include <loom/schedule/vocab.hpp>

namespace vocab_test {


using vec = std::vector<double>;
using tok_t = std::int64_t;

// One virtual stage: `layers` token-wise layers y = tanh(W x + b) on [n][h].
struct tanh_stage {
  using value_type = double;
  std::size_t n = 0, h = 0;
  int layers = 1;
  vec params, grad;  // per layer: W [h][h], then b [h]

  std::size_t per_layer() const { return h * h + h; }
  std::size_t input_size() const { return n * h; }
  std::size_t output_size() const { return n * h; }
  std::size_t stash_size() const { return static_cast<std::size_t>(layers) * n * h; }  // every layer's output
  std::span<double> weight_grad() { return grad; }

  // Layer l: y = tanh(W x + b), token by token.
  void layer_forward(int l, std::span<const double> x, std::span<double> y) const {
    const double* W = params.data() + static_cast<std::size_t>(l) * per_layer();
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < h; ++i) {
        double z = W[h * h + i];
        for (std::size_t k = 0; k < h; ++k) z += W[i * h + k] * x[t * h + k];
        y[t * h + i] = std::tanh(z);
      }
  }
  void forward(const loom::stage_context&, loom::forward_buffers<double> b) const {
    for (int l = 0; l < layers; ++l) {
      std::span<const double> x = l == 0 ? b.input : std::span<const double>(b.stash.subspan(static_cast<std::size_t>(l - 1) * n * h, n * h));
      std::span<double> y = b.stash.subspan(static_cast<std::size_t>(l) * n * h, n * h);
      layer_forward(l, x, y);
    }
    std::copy_n(b.stash.end() - static_cast<std::ptrdiff_t>(n * h), n * h, b.output.begin());
  }
  // The input gradient; leaves each layer's pre-activation gradient in the stash for `weights`.
  void input_gradient(std::span<const double> og, std::span<double> stash, std::span<double> ig) const {
    vec d(og.begin(), og.end()), next(n * h);
    for (int l = layers - 1; l >= 0; --l) {
      std::span<double> y = stash.subspan(static_cast<std::size_t>(l) * n * h, n * h);
      const double* W = params.data() + static_cast<std::size_t>(l) * per_layer();
      for (std::size_t k = 0; k < n * h; ++k) y[k] = d[k] * (1 - y[k] * y[k]);  // dz, in place of y
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t k = 0; k < h; ++k) {
          double s = 0;
          for (std::size_t i = 0; i < h; ++i) s += y[t * h + i] * W[i * h + k];
          next[t * h + k] = s;
        }
      d.swap(next);
    }
    std::copy(d.begin(), d.end(), ig.begin());
  }
  // Weight gradients from the dz the input gradient left, one sum per weight added once.
  void weights(std::span<const double> in, std::span<double> stash, std::span<double> wg) const {
    for (int l = 0; l < layers; ++l) {
      std::span<const double> dz = stash.subspan(static_cast<std::size_t>(l) * n * h, n * h);
      // The layer's input: the stage input, or the previous layer's output, which the backward
      // turned into its dz: recomputed from the forward instead.
      vec x(in.begin(), in.end());
      for (int j = 0; j < l; ++j) {
        vec y(n * h);
        layer_forward(j, x, y);
        x.swap(y);
      }
      double* g = wg.data() + static_cast<std::size_t>(l) * per_layer();
      for (std::size_t i = 0; i < h; ++i) {
        for (std::size_t k = 0; k < h; ++k) {
          double s = 0;
          for (std::size_t t = 0; t < n; ++t) s += dz[t * h + i] * x[t * h + k];
          g[i * h + k] += s;
        }
        double s = 0;
        for (std::size_t t = 0; t < n; ++t) s += dz[t * h + i];
        g[h * h + i] += s;
      }
    }
  }
  void backward(const loom::stage_context&, loom::backward_buffers<double> b) const {
    input_gradient(b.output_grad, b.stash, b.input_grad);
    weights(b.input, b.stash, b.weight_grad);
  }
  void backward_input(const loom::stage_context&, loom::backward_buffers<double> b) const { input_gradient(b.output_grad, b.stash, b.input_grad); }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) const { weights(b.input, b.stash, b.weight_grad); }
};
static_assert(loom::split_stage<tanh_stage>);

struct model {
  std::size_t n = 3, h = 4, vocab = 24;
  int stages = 2, layers_per_stage = 1;
  vec stage_params(int s) const {
    std::mt19937_64 g(1000 + static_cast<unsigned>(s));
    std::uniform_real_distribution<double> u(-0.6, 0.6);
    vec p(static_cast<std::size_t>(layers_per_stage) * (h * h + h));
    for (double& v : p) v = u(g);
    return p;
  }
  vec table(unsigned seed) const {  // [vocab][h]
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    vec t(vocab * h);
    for (double& v : t) v = u(g);
    return t;
  }
  std::vector<tok_t> tokens(int m, unsigned seed) const {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<tok_t> u(0, static_cast<tok_t>(vocab) - 1);
    std::vector<tok_t> t(static_cast<std::size_t>(m) * n);
    for (auto& v : t) v = u(g);
    return t;
  }
  tanh_stage make(int s) const { return {n, h, layers_per_stage, stage_params(s), vec(static_cast<std::size_t>(layers_per_stage) * (h * h + h), 0.0)}; }
};

struct result {
  double loss = 0;
  std::vector<vec> stage_grads;  // per virtual stage
  vec out_grad, in_grad;         // [vocab][h], the shards in order
};

// The single-rank reference: every microbatch in order through the embedding (the p shards'
// parts summed in rank order), the stages, the output layer on p shards (statistics combined in
// rank order; the input gradient by `algorithm`), the stages' backward and the embedding's.
// With p = 1 it is the unsplit model.
// `make(s)` builds virtual stage s (host memory; `tanh_stage` unless told); every token's loss
// weighs `weight` (`vocab_layers::loss_weight`) on top of the mean over the microbatches.
template <class Make>
result reference_with(const model& md, int p, int algorithm, int m, const std::vector<tok_t>& ids, const std::vector<tok_t>& targets, Make make,
                      double weight = 1) {
  const std::size_t nh = md.n * md.h;
  const vec W = md.table(7), E = md.table(8);
  std::vector<decltype(make(0))> st;
  for (int s = 0; s < md.stages; ++s) st.push_back(make(s));
  result r;
  r.stage_grads.assign(static_cast<std::size_t>(md.stages), vec(st[0].weight_grad().size(), 0.0));
  r.out_grad.assign(md.vocab * md.h, 0.0);
  r.in_grad.assign(md.vocab * md.h, 0.0);
  std::vector<loom::vocab_shard> sh;
  for (int k = 0; k < p; ++k) sh.push_back(loom::shard_of(static_cast<std::int64_t>(md.vocab), p, k, md.h));
  const std::size_t rows = sh[0].rows, rh = rows * md.h;
  const double dl = (1.0 / m) * weight;
  double total = 0;
  for (int j = 0; j < m; ++j) {
    std::span<const tok_t> id(ids.data() + static_cast<std::size_t>(j) * md.n, md.n), y(targets.data() + static_cast<std::size_t>(j) * md.n, md.n);
    vec x(nh, 0.0), part(nh);
    for (int k = 0; k < p; ++k) {
      loom::vocab_input_layer{sh[static_cast<std::size_t>(k)]}.forward(id, std::span<const double>(E).subspan(static_cast<std::size_t>(k) * rh, rh), std::span<double>(part));
      for (std::size_t i = 0; i < nh; ++i) x[i] += part[i];
    }
    std::vector<vec> ins, stashes;
    for (auto& s : st) {
      ins.push_back(x);
      stashes.emplace_back(s.stash_size());
      vec out(nh);
      s.forward({}, {ins.back(), out, stashes.back()});
      x = out;
    }
    std::vector<vec> e(static_cast<std::size_t>(p), vec(md.n * rows)), stats(static_cast<std::size_t>(p), vec(3 * md.n)), g(static_cast<std::size_t>(p), vec(2 * nh, 0.0));
    std::vector<loom::vocab_statistics<double>> all;
    vec scratch(md.n * rows);
    for (int k = 0; k < p; ++k) {
      const auto uk = static_cast<std::size_t>(k);
      loom::vocab_output_layer<> o{sh[uk]};
      std::span<const double> w = std::span<const double>(W).subspan(uk * rh, rh);
      o.forward(std::span<const double>(x), w, y, e[uk], {stats[uk], md.n});
      all.push_back({stats[uk], md.n});
      if (algorithm == 2)
        o.input_gradient_parts(w, y, std::span<const double>(e[uk]), {stats[uk], md.n}, scratch, std::span<double>(g[uk]).subspan(0, nh),
                               std::span<double>(g[uk]).subspan(nh, nh));
    }
    vec global(3 * md.n);
    loom::vocab_output_layer<>::combine<double>(all, {global, md.n});
    total += loom::vocab_output_layer<>::loss<double>({global, md.n}) * weight;
    vec dx(nh);
    std::vector<std::span<const double>> gp, yp;
    for (int k = 0; k < p; ++k) {
      const auto uk = static_cast<std::size_t>(k);
      loom::vocab_output_layer<> o{sh[uk]};
      o.backward(std::span<const double>(x), std::span<const double>(W).subspan(uk * rh, rh), y, e[uk], {stats[uk], md.n}, {global, md.n}, dl,
                 std::span<double>(r.out_grad).subspan(uk * rh, rh), algorithm == 1 ? std::span<double>(g[uk]).subspan(0, nh) : std::span<double>{});
      gp.push_back(std::span<const double>(g[uk]).subspan(0, nh));
      yp.push_back(std::span<const double>(g[uk]).subspan(nh, nh));
    }
    if (algorithm == 1) loom::vocab_output_layer<>::sum_input_gradient<double>(gp, dx);
    else loom::vocab_output_layer<>::fused_input_gradient<double>(gp, yp, all, {global, md.n}, dl, dx);
    for (int s = md.stages - 1; s >= 0; --s) {
      const auto us = static_cast<std::size_t>(s);
      vec ig(nh), wg(st[us].weight_grad().size(), 0.0);
      st[us].backward({}, {ins[us], stashes[us], dx, ig, wg});
      for (std::size_t i = 0; i < wg.size(); ++i) r.stage_grads[us][i] += wg[i];
      dx = ig;
    }
    for (int k = 0; k < p; ++k)
      loom::vocab_input_layer{sh[static_cast<std::size_t>(k)]}.backward(id, std::span<const double>(dx),
                                                                         std::span<double>(r.in_grad).subspan(static_cast<std::size_t>(k) * rh, rh));
  }
  r.loss = total * (1.0 / m);
  return r;
}
inline result reference(const model& md, int p, int algorithm, int m, const std::vector<tok_t>& ids, const std::vector<tok_t>& targets) {
  return reference_with(md, p, algorithm, m, ids, targets, [&](int s) { return md.make(s); });
}

// One virtual stage of one linear layer y = W x + b on [n][h] through loom's linear kernel `K`
// (the device tests' model: loom::linear_kernel here, loom::cuda::linear_kernel on a device, the
// same items, so the simulated device gives the same bits); `params` W [h][h] then b [h], as
// tanh_stage's first layer. The backward keeps the output gradient in the stash for W (a zeroing
// then an addition: exact).
template <class K, class Params>
struct linear_math {
  static void forward(K k, std::size_t n, std::size_t h, Params p, loom::forward_buffers<double> f) {
    k.forward(f.input, p.subspan(0, h * h), p.subspan(h * h, h), f.output, n, h, h);
  }
  static void backward_input(K k, std::size_t n, std::size_t h, Params p, loom::backward_buffers<double> f) {
    k.set_bias(f.stash, std::span<const double>{}, n, h);
    k.accumulate(f.stash, f.output_grad);
    k.backward_input(f.output_grad, p.subspan(0, h * h), f.input_grad, n, h, h);
  }
  static void backward_weight(K k, std::size_t n, std::size_t h, std::span<const double> in, std::span<const double> dy, std::span<double> g) {
    k.backward_weight(in, dy, g.subspan(0, h * h), g.subspan(h * h, h), n, h, h);
  }
};
struct linear_stage {
  using value_type = double;
  using math = linear_math<loom::linear_kernel, std::span<const double>>;
  std::size_t n = 0, h = 0;
  vec params, grad;
  std::size_t input_size() const { return n * h; }
  std::size_t output_size() const { return n * h; }
  std::size_t stash_size() const { return n * h; }
  std::span<double> weight_grad() { return grad; }
  void forward(const loom::stage_context&, loom::forward_buffers<double> f) const { math::forward({}, n, h, params, f); }
  void backward_input(const loom::stage_context&, loom::backward_buffers<double> f) const { math::backward_input({}, n, h, params, f); }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> f) const { math::backward_weight({}, n, h, f.input, f.stash, f.weight_grad); }
  void backward(const loom::stage_context& c, loom::backward_buffers<double> f) const {
    backward_input(c, f);
    math::backward_weight({}, n, h, f.input, f.stash, f.weight_grad);
  }
};

// One rank's part of the model trained by loom::pipeline over `s` (vocabulary-parallel) on
// communicator `c`: its shards' gradients and its stages' in a zeroed whole-model result (so the
// ranks' parts sum to the whole), and the loss.
// `Sched` is loom::schedule (then `sched` is `s`) or a static_schedule type (`sched` its instance,
// `s` its generated schedule).
template <class Comm, class Sched = loom::schedule>
result run_rank(Comm& c, const model& md, const loom::schedule& s, const std::vector<tok_t>& ids, const std::vector<tok_t>& targets,
                loom::pipeline_options opt, int steps = 1, const Sched* sched = nullptr, double weight = 1) {
  const int p = s.ranks;
  const vec W = md.table(7), E = md.table(8);
  result r;
  r.stage_grads.assign(static_cast<std::size_t>(s.stages), vec(static_cast<std::size_t>(md.layers_per_stage) * (md.h * md.h + md.h), 0.0));
  r.out_grad.assign(md.vocab * md.h, 0.0);
  r.in_grad.assign(md.vocab * md.h, 0.0);
  const auto sh = loom::shard_of(static_cast<std::int64_t>(md.vocab), p, c.rank(), md.h);
  const std::size_t rh = sh.rows * md.h, at = static_cast<std::size_t>(c.rank()) * rh;
  std::span<double> gw = std::span<double>(r.out_grad).subspan(at, rh), ge = std::span<double>(r.in_grad).subspan(at, rh);
  loom::vocab_layers<double> layers(sh, md.n, std::span<const double>(W).subspan(at, rh), std::span<const double>(E).subspan(at, rh), gw, ge);
  layers.loss_weight(weight);
  auto make = [&](loom::stage_id id) { return md.make(id.stage); };
  loom::pipeline<Sched, tanh_stage, Comm, loom::vocab_layers<double>> pipe([&]() -> const Sched& {
    if constexpr (std::is_same_v<Sched, loom::schedule>) return s;
    else return *sched;
  }(), c, make, layers, opt);
  layers.set_batch(ids, targets);
  for (int k = 0; k < steps; ++k) r.loss = pipe.step({}).loss;
  for (std::size_t i = 0; i < pipe.stages().size(); ++i) r.stage_grads[static_cast<std::size_t>(pipe.ids()[i].stage)] = pipe.stages()[i].grad;
  return r;
}

inline bool same_bits(const vec& a, const vec& b) { return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0); }
inline double rel(const vec& a, const vec& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    n = std::max(n, std::abs(b[i]));
  }
  return a.size() != b.size() ? 1e300 : n > 0 ? d / n : d;
}

struct family_case {
  const char* name;
  int algorithm;
  loom::schedule (*make)(int p, int m);
};
const family_case families[] = {
    {"1f1b-vocab-1", 1, [](int p, int m) { return loom::generate(loom::one_f_one_b_vocab_1{}, {.ranks = p, .microbatches = m}); }},
    {"1f1b-vocab-2", 2, [](int p, int m) { return loom::generate(loom::one_f_one_b_vocab_2{}, {.ranks = p, .microbatches = m}); }},
    {"v-half-vocab-1", 1, [](int p, int m) { return loom::generate(loom::v_half_vocab_1{}, {.ranks = p, .microbatches = m, .chunks = 2}); }},
    {"v-half-vocab-2", 2, [](int p, int m) { return loom::generate(loom::v_half_vocab_2{}, {.ranks = p, .microbatches = m, .chunks = 2}); }},
};

}  // namespace vocab_test
