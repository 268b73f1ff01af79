// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The single-rank CPU reference of the CUDA MLP, in fp32 with the same `math.hpp` functors the
//! kernels use, called in loops on the host: microbatch by microbatch, forward, loss terms
//! (summed in double in order, as loom sums a last stage's output), backward into a zeroed
//! per-microbatch gradient, `acc += g` in microbatch order, then SGD. loom's deterministic mode
//! performs exactly these operations, so the two agree bit for bit; `data_parallel_step` is the
//! same for replicas under `loom::data_parallel` (their sums in replica order, loom's SGD).

#include <cmath>
#include <cstddef>
#include <vector>

#include <loom/exec/data_parallel.hpp>

#include "math.hpp"
#include "stage.hpp"

namespace cuda_mlp {

//! Parameters and the last step's gradients of every layer, and the losses of every step.
struct reference {
  std::vector<std::vector<float>> params, grads;
  std::vector<double> losses;  //!< scaled loss of each step

  //! The initial model.
  explicit reference(const quickstart::mlp_spec& m) {
    for (int l = 0; l < m.layers(); ++l) params.push_back(float_params(m, l));
  }

  //! One SGD step over `microbatches` microbatches with loss scale `scale` (1/m or 1).
  void step(const quickstart::mlp_spec& m, int microbatches, const batch& data, double scale) {
    losses.push_back(gradients(m, microbatches, data, scale, grads) * scale);
    for (int l = 0; l < m.layers(); ++l) {
      const auto ul = static_cast<std::size_t>(l);
      sgd u{params[ul].data(), grads[ul].data(), static_cast<float>(m.lr)};
      for (std::size_t e = 0; e < params[ul].size(); ++e) u(e);
    }
  }

  //! One step of `data.size()` data-parallel replicas as `loom::data_parallel` performs it in
  //! deterministic mode: replica d's gradient over its batch `data[d]` (loss scale `scale`), the
  //! replicas' gradients summed in replica order, `* grad_scale`, then `loom::sgd`'s update
  //! `p -= lr * g` (the product rounded before the subtraction), or with `adam` its update
  //! (`loom::detail::adam_element` in float, the device kernel's operations). The loss is replica 0's.
  void data_parallel_step(const quickstart::mlp_spec& m, int microbatches, const std::vector<batch>& data, double scale,
                          float grad_scale, const loom::adam<float>* adam = nullptr) {
    std::vector<std::vector<float>> mine;
    for (std::size_t d = 0; d < data.size(); ++d) {
      const double loss = gradients(m, microbatches, data[d], scale, d == 0 ? grads : mine);
      if (d == 0) {
        losses.push_back(loss * scale);
        continue;
      }
      for (std::size_t l = 0; l < grads.size(); ++l)
        for (std::size_t e = 0; e < grads[l].size(); ++e) grads[l][e] += mine[l][e];
    }
    const auto lr = static_cast<float>(m.lr);
    if (adam != nullptr && m1.empty())
      for (auto const& p : params) m1.emplace_back(p.size(), 0.0f), m2.emplace_back(p.size(), 0.0f);
    const double t = static_cast<double>(++adam_t);
    const double c1 = adam == nullptr ? 1 : 1 - std::pow(adam->beta1, t), c2 = adam == nullptr ? 1 : std::sqrt(1 - std::pow(adam->beta2, t));
    for (std::size_t l = 0; l < grads.size(); ++l)
      for (std::size_t e = 0; e < grads[l].size(); ++e) {
        if (grad_scale != 1.0f) grads[l][e] *= grad_scale;
        if (adam != nullptr) {
          loom::detail::adam_element(params[l][e], grads[l][e], m1[l][e], m2[l][e], static_cast<float>(adam->beta1),
                                     static_cast<float>(adam->beta2), static_cast<float>(adam->lr * c2 / c1),
                                     static_cast<float>(adam->eps * c2));
          continue;
        }
        const float step = lr * grads[l][e];
        params[l][e] -= step;
      }
  }
  //! Local SGD's average: every replica's parameters become `(sum in replica order) * (1/replicas)`
  //! (the product rounded once), as `loom::data_parallel` averages.
  static void average(std::vector<reference>& replicas) {
    const float inv = static_cast<float>(1.0 / static_cast<double>(replicas.size()));
    for (std::size_t l = 0; l < replicas[0].params.size(); ++l)
      for (std::size_t e = 0; e < replicas[0].params[l].size(); ++e) {
        float sum = replicas[0].params[l][e];
        for (std::size_t r = 1; r < replicas.size(); ++r) sum += replicas[r].params[l][e];
        for (auto& rep : replicas) rep.params[l][e] = sum * inv;
      }
  }
  std::vector<std::vector<float>> m1, m2;  //!< Adam's moments (with `data_parallel_step`'s `adam`)
  long adam_t = 0;                         //!< steps taken (Adam's bias correction)

  //! An asynchronous run (`quickstart::async_rule`: PipeDream, PipeDream-2BW, pipelined
  //! backpropagation) over the `rule.N` microbatches of `data`, in order: microbatch j's forward
  //! through stage s reads version `rule.forward_version(j, s)`, its backward
  //! `rule.backward_version(j, s)`; per-microbatch gradients are added in order into each layer's
  //! accumulator, and after the backward of every j with `rule.updates_after(j)` SGD writes the
  //! next version (`p -= lr * g`, as `update`). `params` ends at the latest versions; `losses`
  //! gets the run's scaled loss (every microbatch's, in order, times `scale`), as one step.
  void asynchronous(const quickstart::mlp_spec& m, const quickstart::async_rule& rule, const batch& data, double scale) {
    const int L = m.layers();
    std::vector<int> stage_of(static_cast<std::size_t>(L));
    for (int s = 0; s < rule.p; ++s) {
      auto [a, b] = quickstart::stage_layers(m, s, rule.p);
      for (int l = a; l < b; ++l) stage_of[static_cast<std::size_t>(l)] = s;
    }
    std::vector<std::vector<std::vector<float>>> history(static_cast<std::size_t>(L));
    for (int l = 0; l < L; ++l) history[static_cast<std::size_t>(l)].push_back(params[static_cast<std::size_t>(l)]);
    work w(m);
    std::vector<std::vector<float>> acc(static_cast<std::size_t>(L));
    for (int l = 0; l < L; ++l) acc[static_cast<std::size_t>(l)].assign(m.params(l), 0.0f);
    double total = 0;
    for (int j = 0; j < rule.N; ++j) {
      auto version = [&](int l, bool backward) -> const float* {
        const int s = stage_of[static_cast<std::size_t>(l)];
        const int v = backward ? rule.backward_version(j, s) : rule.forward_version(j, s);
        return history[static_cast<std::size_t>(l)].at(static_cast<std::size_t>(v)).data();
      };
      total += w.microbatch(m, data, j, scale, [&](int l) { return version(l, false); }, [&](int l) { return version(l, true); });
      for (int l = 0; l < L; ++l)
        for (std::size_t e = 0; e < acc[static_cast<std::size_t>(l)].size(); ++e) acc[static_cast<std::size_t>(l)][e] += w.g[static_cast<std::size_t>(l)][e];
      if (!rule.updates_after(j)) continue;
      for (int l = 0; l < L; ++l) {
        const auto ul = static_cast<std::size_t>(l);
        std::vector<float> next = history[ul].back();
        sgd u{next.data(), acc[ul].data(), static_cast<float>(m.lr)};
        for (std::size_t e = 0; e < next.size(); ++e) u(e);
        history[ul].push_back(std::move(next));
        std::fill(acc[ul].begin(), acc[ul].end(), 0.0f);
      }
    }
    for (int l = 0; l < L; ++l) params[static_cast<std::size_t>(l)] = history[static_cast<std::size_t>(l)].back();
    losses.push_back(total * scale);
  }

 private:
  //! One microbatch's forward, loss and backward: the scratch and the zeroed gradient `g` it
  //! leaves (per layer).
  struct work {
    std::vector<std::vector<float>> y, dz, g;
    std::vector<float> seed, gx0;
    explicit work(const quickstart::mlp_spec& m) {
      const int L = m.layers();
      const auto n = static_cast<std::size_t>(m.samples);
      y.resize(static_cast<std::size_t>(L));
      dz.resize(static_cast<std::size_t>(L));
      g.resize(static_cast<std::size_t>(L));
      for (int l = 0; l < L; ++l) {
        y[static_cast<std::size_t>(l)].resize(n * m.width(l + 1));
        dz[static_cast<std::size_t>(l)].resize(n * m.width(l + 1));
      }
      gx0.resize(n * m.width(0));
    }
    //! Microbatch `j` of `data` through parameters `fwd(l)` (forward) and `bwd(l)` (backward);
    //! returns its unscaled loss and leaves its gradient in `g`.
    template <class Fwd, class Bwd>
    double microbatch(const quickstart::mlp_spec& m, const batch& data, int j, double scale, const Fwd& fwd, const Bwd& bwd) {
      const int L = m.layers();
      const auto n = static_cast<unsigned>(m.samples);
      const std::size_t fin = n * m.width(static_cast<std::size_t>(L));
      if (seed.size() != fin) seed.assign(fin, static_cast<float>(scale));
      const float* x0 = data.inputs.data() + static_cast<std::size_t>(j) * n * m.width(0);
      const float* t = data.targets.data() + static_cast<std::size_t>(j) * fin;
      const float* x = x0;
      for (int l = 0; l < L; ++l) {
        const auto ul = static_cast<std::size_t>(l);
        layer_forward f{fwd(l), x, y[ul].data(), static_cast<unsigned>(m.width(l)), static_cast<unsigned>(m.width(l + 1)), l + 1 < L};
        for (std::size_t e = 0; e < y[ul].size(); ++e) f(e);
        x = y[ul].data();
      }
      double loss = 0;
      for (std::size_t e = 0; e < fin; ++e) loss += static_cast<double>(loss_term{}(x[e], t[e]));
      loss_grad lg{seed.data(), x, t, dz[static_cast<std::size_t>(L - 1)].data()};
      for (std::size_t e = 0; e < fin; ++e) lg(e);
      for (int l = L - 1; l >= 0; --l) {
        const auto ul = static_cast<std::size_t>(l);
        const auto in = static_cast<unsigned>(m.width(l)), out = static_cast<unsigned>(m.width(l + 1));
        if (l + 1 < L) {
          activation_backward a{y[ul].data(), dz[ul].data()};
          for (std::size_t e = 0; e < dz[ul].size(); ++e) a(e);
        }
        input_grad ig{bwd(l), dz[ul].data(), l > 0 ? dz[ul - 1].data() : gx0.data(), in, out};
        for (std::size_t e = 0; e < std::size_t{n} * in; ++e) ig(e);
      }
      for (int l = 0; l < L; ++l) {
        const auto ul = static_cast<std::size_t>(l);
        g[ul].assign(m.params(l), 0.0f);
        weight_grad_add w{l == 0 ? x0 : y[ul - 1].data(), dz[ul].data(), g[ul].data(), static_cast<unsigned>(m.width(l)),
                          static_cast<unsigned>(m.width(l + 1)), n};
        for (std::size_t e = 0; e < g[ul].size(); ++e) w(e);
      }
      return loss;
    }
  };

  //! Every layer's gradient over the microbatches of `data` into `into` (zeroed first, summed in
  //! microbatch order); returns the unscaled loss.
  double gradients(const quickstart::mlp_spec& m, int microbatches, const batch& data, double scale,
                   std::vector<std::vector<float>>& into) const {
    const int L = m.layers();
    into.assign(static_cast<std::size_t>(L), {});
    for (int l = 0; l < L; ++l) into[static_cast<std::size_t>(l)].assign(m.params(l), 0.0f);
    work w(m);
    auto current = [&](int l) { return params[static_cast<std::size_t>(l)].data(); };
    double total = 0;
    for (int j = 0; j < microbatches; ++j) {
      total += w.microbatch(m, data, j, scale, current, current);
      for (int l = 0; l < L; ++l)
        for (std::size_t e = 0; e < into[static_cast<std::size_t>(l)].size(); ++e) into[static_cast<std::size_t>(l)][e] += w.g[static_cast<std::size_t>(l)][e];
    }
    return total;
  }
};

}  // namespace cuda_mlp
