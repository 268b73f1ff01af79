// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! A small multilayer perceptron in double precision, cut into pipeline stages: the model of the
//! quickstart example and of loom's executor tests. Layer `l` maps `widths[l]` features to
//! `widths[l+1]` (`tanh` on hidden layers, linear on the last); the loss of a microbatch is
//! `0.5 * sum (y - t)^2` over its samples. Every kernel below fixes its order of floating-point
//! operations, so the pipelined run and the single-rank reference (`reference_step`) perform the
//! same operations and can be compared bitwise.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <loom/stage/stage.hpp>

namespace quickstart {

//! The model's shape and the data per microbatch.
struct mlp_spec {
  std::vector<int> widths{4, 8, 8, 8, 8, 8, 8, 8, 8, 3};  //!< features at each layer boundary
  int samples = 2;                                         //!< samples per microbatch
  double lr = 0.05;                                        //!< SGD learning rate
  int layers() const { return static_cast<int>(widths.size()) - 1; }
  //! Parameters of layer `l`: weights (out x in, row-major) then biases.
  std::size_t params(int l) const {
    auto i = static_cast<std::size_t>(widths[static_cast<std::size_t>(l)]), o = static_cast<std::size_t>(widths[static_cast<std::size_t>(l) + 1]);
    return o * i + o;
  }
  std::size_t width(int l) const { return static_cast<std::size_t>(widths[static_cast<std::size_t>(l)]); }
};

//! A reproducible value in [-1, 1) from integer coordinates (a hash, not a random stream).
inline double hashed(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ (c + 7) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

//! Initial parameters of layer `l` (scaled by 1/sqrt(fan-in)).
inline std::vector<double> initial_params(const mlp_spec& m, int l) {
  std::vector<double> p(m.params(l));
  const double scale = 1.0 / std::sqrt(static_cast<double>(m.width(l)));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = scale * hashed(1000 + static_cast<std::uint64_t>(l), i, 0);
  return p;
}

//! The batch of step `step`: `microbatches * samples * widths[0]` inputs and
//! `microbatches * samples * widths.back()` targets, microbatch-major.
struct batch {
  std::vector<double> inputs, targets;
};
inline batch make_batch(const mlp_spec& m, int microbatches, int step) {
  batch b;
  const auto n = static_cast<std::size_t>(microbatches * m.samples);
  b.inputs.resize(n * m.width(0));
  b.targets.resize(n * m.width(m.layers()));
  for (std::size_t i = 0; i < b.inputs.size(); ++i) b.inputs[i] = hashed(static_cast<std::uint64_t>(step), i, 1);
  for (std::size_t i = 0; i < b.targets.size(); ++i) b.targets[i] = 0.5 * hashed(static_cast<std::uint64_t>(step), i, 2);
  return b;
}

//! The batches of an asynchronous run of `T` steps, one after another: microbatch t m + i is the
//! i-th of `make_batch(m, microbatches, t)`.
inline batch make_run_batch(const mlp_spec& m, int microbatches, int T) {
  batch all;
  for (int t = 0; t < T; ++t) {
    batch b = make_batch(m, microbatches, t);
    all.inputs.insert(all.inputs.end(), b.inputs.begin(), b.inputs.end());
    all.targets.insert(all.targets.end(), b.targets.begin(), b.targets.end());
  }
  return all;
}

namespace kernels {

//! y = act(W x + b) for one layer and `n` samples; sums run over inputs in index order.
inline void layer_forward(std::span<const double> p, std::size_t in, std::size_t out, bool tanh_act, std::size_t n,
                          const double* x, double* y) {
  // Four outputs at a time: four independent sums keep the adder busy (one sum waits for its
  // previous addition); each output still adds its inputs in index order.
  for (std::size_t k = 0; k < n; ++k) {
    const double* xk = x + k * in;
    std::size_t o = 0;
    for (; o + 4 <= out; o += 4) {
      const double *p0 = p.data() + o * in, *p1 = p0 + in, *p2 = p1 + in, *p3 = p2 + in;
      double z0 = p[out * in + o], z1 = p[out * in + o + 1], z2 = p[out * in + o + 2], z3 = p[out * in + o + 3];
      for (std::size_t i = 0; i < in; ++i) {
        z0 += p0[i] * xk[i];
        z1 += p1[i] * xk[i];
        z2 += p2[i] * xk[i];
        z3 += p3[i] * xk[i];
      }
      const double z[4] = {z0, z1, z2, z3};
      for (std::size_t j = 0; j < 4; ++j) y[k * out + o + j] = tanh_act ? std::tanh(z[j]) : z[j];
    }
    for (; o < out; ++o) {
      double z = p[out * in + o];
      for (std::size_t i = 0; i < in; ++i) z += p[o * in + i] * xk[i];
      y[k * out + o] = tanh_act ? std::tanh(z) : z;
    }
  }
}
//! dz = g * act'(y) in place of g; then gx = W^T dz (sums over outputs in index order).
//! Each gx[i] starts at 0 and adds the terms of outputs 0, 1, ... in order, as a dot product over a
//! column of W would, but the loop walks W row by row (a column walk strides by `in` doubles and
//! made this call 30 times slower than the weight gradient at width 512); same operations, same bits.
inline void layer_backward_input(std::span<const double> p, std::size_t in, std::size_t out, bool tanh_act,
                                 std::size_t n, const double* y, double* g_dz, double* gx) {
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t o = 0; o < out; ++o)
      if (tanh_act) g_dz[k * out + o] *= 1.0 - y[k * out + o] * y[k * out + o];
    double* gxk = gx + k * in;
    for (std::size_t i = 0; i < in; ++i) gxk[i] = 0;
    for (std::size_t o = 0; o < out; ++o) {
      const double d = g_dz[k * out + o];
      const double* row = p.data() + o * in;
      for (std::size_t i = 0; i < in; ++i) gxk[i] += row[i] * d;
    }
  }
}
//! gW += dz x^T, gb += dz, sample by sample in order.
inline void layer_backward_weight(std::size_t in, std::size_t out, std::size_t n, const double* x, const double* dz,
                                  double* gp) {
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t i = 0; i < in; ++i) gp[o * in + i] += dz[k * out + o] * x[k * in + i];
      gp[out * in + o] += dz[k * out + o];
    }
}

}  // namespace kernels

//! Layers [first, last) of `m` as one pipeline stage (a `loom::split_stage`). The stage computing
//! the model's last layer (or, if `last` = layers, the stage placed last) also computes the loss
//! against `*targets` (set before each step). `fail_on` makes forward throw for that microbatch
//! (fault tests).
class mlp_stage {
 public:
  using value_type = double;

  mlp_stage(const mlp_spec& m, int first, int last, bool is_last, const std::vector<double>* targets)
      : m_(&m), first_(first), last_(last), is_last_(is_last), targets_(targets) {
    if (first < 0 || last > m.layers() || first >= last)
      throw std::invalid_argument("mlp_stage: a stage needs at least one layer of the model (layers " +
                                  std::to_string(first) + ".." + std::to_string(last) + " of " +
                                  std::to_string(m.layers()) + ")");
    std::size_t off = 0, act = 0;
    for (int l = first; l < last; ++l) {
      offsets_.push_back(off);
      auto p = initial_params(m, l);
      params_.insert(params_.end(), p.begin(), p.end());
      off += p.size();
      act_offsets_.push_back(act);
      act += static_cast<std::size_t>(m.samples) * m.width(l + 1);
    }
    act_total_ = act;
    grad_.assign(params_.size(), 0.0);
  }

  std::size_t input_size() const { return static_cast<std::size_t>(m_->samples) * m_->width(first_); }
  std::size_t output_size() const { return is_last_ ? 1 : static_cast<std::size_t>(m_->samples) * m_->width(last_); }
  //! Layer outputs (forward) then the per-layer dz (written by backward_input, read by backward_weight).
  std::size_t stash_size() const { return 2 * act_total_; }
  std::span<double> weight_grad() { return grad_; }
  //! All parameters of the stage, laid out as `weight_grad()` (for `loom::data_parallel`).
  std::span<double> params() { return params_; }
  //! Gives up the parameters' storage (ZeRO-3, `loom::releasable_stage`): `params()` is empty
  //! until `acquire_params()`.
  void release_params() {
    params_.clear();
    params_.shrink_to_fit();
  }
  //! Storage for the parameters again (contents unspecified: the reducer fills them).
  void acquire_params() { params_.resize(grad_.size()); }

  void forward(const loom::stage_context& c, loom::forward_buffers<double> b) {
    if (c.microbatch == fail_on) {
      if (exit_on_fail) std::exit(3);
      throw std::runtime_error("injected failure");
    }
    check(b.input.size() == input_size() && b.output.size() == output_size(), "forward buffer sizes");
    const double* x = b.input.data();
    const auto n = static_cast<std::size_t>(m_->samples);
    for (int l = first_; l < last_; ++l) {
      double* y = b.stash.data() + act_offsets_[idx(l)];
      kernels::layer_forward(layer(l), m_->width(l), m_->width(l + 1), l + 1 < m_->layers(), n, x, y);
      x = y;
    }
    if (is_last_) {
      const double* t = targets_->data() + static_cast<std::size_t>(c.microbatch) * final_size();
      double loss = 0;
      for (std::size_t i = 0; i < final_size(); ++i) {
        double d = x[i] - t[i];
        loss += 0.5 * d * d;
      }
      b.output[0] = loss;
    } else {
      std::copy(x, x + output_size(), b.output.begin());
    }
  }

  void backward_input(const loom::stage_context& c, loom::backward_buffers<double> b) {
    const auto n = static_cast<std::size_t>(m_->samples);
    double* dz_base = b.stash.data() + act_total_;
    // Gradient with respect to the stage's output, in the dz slot of its last layer.
    double* g = dz_base + act_offsets_[idx(last_ - 1)];
    if (is_last_) {
      const double* y = b.stash.data() + act_offsets_[idx(last_ - 1)];
      const double* t = targets_->data() + static_cast<std::size_t>(c.microbatch) * final_size();
      for (std::size_t i = 0; i < final_size(); ++i) g[i] = b.output_grad[0] * (y[i] - t[i]);
    } else {
      std::copy(b.output_grad.begin(), b.output_grad.end(), g);
    }
    for (int l = last_ - 1; l >= first_; --l) {
      const double* y = b.stash.data() + act_offsets_[idx(l)];
      double* dz = dz_base + act_offsets_[idx(l)];
      double* gx = l > first_ ? dz_base + act_offsets_[idx(l - 1)] : b.input_grad.data();
      kernels::layer_backward_input(layer(l), m_->width(l), m_->width(l + 1), l + 1 < m_->layers(), n, y, dz, gx);
    }
  }

  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) {
    const auto n = static_cast<std::size_t>(m_->samples);
    const double* dz_base = b.stash.data() + act_total_;
    for (int l = first_; l < last_; ++l) {
      const double* x = l == first_ ? b.input.data() : b.stash.data() + act_offsets_[idx(l - 1)];
      kernels::layer_backward_weight(m_->width(l), m_->width(l + 1), n, x, dz_base + act_offsets_[idx(l)],
                                     b.weight_grad.data() + offsets_[idx(l)]);
    }
  }

  void backward(const loom::stage_context& c, loom::backward_buffers<double> b) {
    backward_input(c, b);
    backward_weight(c, {b.input, b.stash, b.weight_grad});
  }

  //! SGD: params -= lr * grad.
  void update() {
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i] -= m_->lr * grad_[i];
  }
  //! The parameters every call reads (`loom::versioned_stage`: loom loads the version an action
  //! of an asynchronous schedule reads into them).
  std::span<double> weights() { return params_; }
  //! Asynchronous schedules: the same SGD step, writing the version loom names.
  void update(const loom::update_context&) { update(); }

  //! Parameters of model layer `l` (must be in [first, last)).
  std::span<const double> layer_params(int l) const { return {params_.data() + offsets_[idx(l)], m_->params(l)}; }
  //! Accumulated gradient of model layer `l`.
  std::span<const double> layer_grad(int l) const { return {grad_.data() + offsets_[idx(l)], m_->params(l)}; }
  int first_layer() const { return first_; }
  int last_layer() const { return last_; }

  int fail_on = -1;  //!< microbatch whose forward throws (fault injection), or -1
  bool exit_on_fail = false;  //!< the injected failure ends the process instead (fault tests)

 private:
  std::size_t idx(int l) const { return static_cast<std::size_t>(l - first_); }
  std::span<const double> layer(int l) const { return {params_.data() + offsets_[idx(l)], m_->params(l)}; }
  std::size_t final_size() const { return static_cast<std::size_t>(m_->samples) * m_->width(m_->layers()); }
  static void check(bool ok, const char* what) {
    if (!ok) throw std::length_error(std::string("mlp_stage: wrong ") + what);
  }

  const mlp_spec* m_;
  int first_, last_;
  bool is_last_;
  const std::vector<double>* targets_;
  std::vector<std::size_t> offsets_, act_offsets_;
  std::size_t act_total_ = 0;
  std::vector<double> params_, grad_;
};
static_assert(loom::split_stage<mlp_stage>);
static_assert(loom::updatable_stage<mlp_stage>);
static_assert(loom::versioned_stage<mlp_stage>);

//! Layers of virtual stage `s` of `S`: [s*L/S, (s+1)*L/S).
inline std::pair<int, int> stage_layers(const mlp_spec& m, int s, int S) {
  const int L = m.layers();
  return {s * L / S, (s + 1) * L / S};
}

//! The single-rank reference: one SGD step over `microbatches` microbatches, microbatch by
//! microbatch (forward, loss, backward into a zeroed per-microbatch gradient, then `acc += g` in
//! microbatch order), loss and gradients scaled by `scale`. Updates `params` (one vector per
//! layer), leaves the accumulated gradients in `grads`, returns the scaled loss.
inline double reference_step(const mlp_spec& m, int microbatches, const batch& data, double scale,
                             std::vector<std::vector<double>>& params, std::vector<std::vector<double>>& grads) {
  const int L = m.layers();
  const auto n = static_cast<std::size_t>(m.samples);
  grads.assign(static_cast<std::size_t>(L), {});
  std::vector<std::vector<double>> g(static_cast<std::size_t>(L)), y(static_cast<std::size_t>(L)), dz(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) {
    auto ul = static_cast<std::size_t>(l);
    grads[ul].assign(m.params(l), 0.0);
    y[ul].resize(n * m.width(l + 1));
    dz[ul].resize(n * m.width(l + 1));
  }
  std::vector<double> scratch_in(n * m.width(0));
  std::vector<double> losses(static_cast<std::size_t>(microbatches));
  const std::size_t fin = n * m.width(L);
  for (int j = 0; j < microbatches; ++j) {
    const double* x0 = data.inputs.data() + static_cast<std::size_t>(j) * n * m.width(0);
    const double* x = x0;
    for (int l = 0; l < L; ++l) {
      kernels::layer_forward(params[static_cast<std::size_t>(l)], m.width(l), m.width(l + 1), l + 1 < L, n, x, y[static_cast<std::size_t>(l)].data());
      x = y[static_cast<std::size_t>(l)].data();
    }
    const double* t = data.targets.data() + static_cast<std::size_t>(j) * fin;
    double loss = 0;
    for (std::size_t i = 0; i < fin; ++i) {
      double d = x[i] - t[i];
      loss += 0.5 * d * d;
    }
    losses[static_cast<std::size_t>(j)] = loss;
    double* top = dz[static_cast<std::size_t>(L - 1)].data();
    for (std::size_t i = 0; i < fin; ++i) top[i] = scale * (x[i] - t[i]);
    for (int l = L - 1; l >= 0; --l) {
      double* gx = l > 0 ? dz[static_cast<std::size_t>(l - 1)].data() : scratch_in.data();
      kernels::layer_backward_input(params[static_cast<std::size_t>(l)], m.width(l), m.width(l + 1), l + 1 < L, n,
                                    y[static_cast<std::size_t>(l)].data(), dz[static_cast<std::size_t>(l)].data(), gx);
    }
    for (int l = 0; l < L; ++l) {
      auto ul = static_cast<std::size_t>(l);
      g[ul].assign(m.params(l), 0.0);
      kernels::layer_backward_weight(m.width(l), m.width(l + 1), n, l == 0 ? x0 : y[ul - 1].data(), dz[ul].data(), g[ul].data());
      for (std::size_t i = 0; i < g[ul].size(); ++i) grads[ul][i] += g[ul][i];
    }
  }
  double total = 0;
  for (double v : losses) total += v;
  for (int l = 0; l < L; ++l)
    for (std::size_t i = 0; i < params[static_cast<std::size_t>(l)].size(); ++i)
      params[static_cast<std::size_t>(l)][i] -= m.lr * grads[static_cast<std::size_t>(l)][i];
  return total * scale;
}

//! The weight-version rule of an asynchronous family (`loom/schedule/pipedream.hpp`) as closed
//! forms over microbatch `j` (0 .. T m - 1) and stage `s` of `p` (one stage per rank): the version
//! a forward reads, the version the backward reads, and whether the stage updates after the
//! backward of `j`. Derived from the families' rules, not from their programs, so the reference
//! below checks the schedules too.
struct async_rule {
  std::string family;    //!< pipedream, pipedream-vs, pipedream-2bw, pipelined-backprop
  int p = 1;             //!< stages (ranks)
  int m = 1;             //!< microbatches per step
  int N = 1;             //!< microbatches of the run (T m)
  int update_every = 1;  //!< pipedream: microbatches per update
  //! Updates before the forward of j on stage s in 1F1B order: j - (p-1-s) backwards ran.
  int updates_before_forward(int j, int s) const {
    const int done = std::max(0, j - (p - 1 - s));
    if (family == "pipedream-2bw") return done / m;  // (not used: 2BW reads by step)
    return done / update_every;
  }
  int forward_version(int j, int s) const {
    if (family == "pipedream-2bw") return std::max(0, j / m - 1);
    if (family == "pipedream-vs") return updates_before_forward(j, 0);
    return updates_before_forward(j, s);
  }
  int backward_version(int j, int s) const {
    if (family == "pipelined-backprop") return j;  // the latest: every earlier backward updated
    return forward_version(j, s);
  }
  bool updates_after(int j) const {
    if (family == "pipedream-2bw") return (j + 1) % m == 0;
    return (j + 1) % update_every == 0 || j == N - 1;
  }
};

//! The single-process reference of an asynchronous rule: `T` steps of `microbatches` each (the
//! batches `make_batch(m, microbatches, t)`), microbatch by microbatch in order; every stage keeps
//! the history of its versions; microbatch j's forward on stage s uses version
//! `rule.forward_version(j, s)`, its backward `rule.backward_version(j, s)`; the weight gradients
//! of a stage are accumulated (a zeroed per-microbatch gradient added in microbatch order, as in
//! `reference_step`) and applied by SGD as its next version after the backward of every `j` with
//! `rule.updates_after(j)`. Returns each step's scaled loss; `params` ends as every layer's
//! latest version.
inline std::vector<double> reference_asynchronous(const mlp_spec& m, const async_rule& rule, int microbatches, int T,
                                                  double scale, std::vector<std::vector<double>>& params) {
  const int L = m.layers(), P = rule.p;
  const auto n = static_cast<std::size_t>(m.samples);
  // history[l][v]: layer l's parameters in version v of its stage
  std::vector<std::vector<std::vector<double>>> history(static_cast<std::size_t>(L));
  std::vector<std::vector<double>> acc(static_cast<std::size_t>(L)), g(static_cast<std::size_t>(L)), y(static_cast<std::size_t>(L)),
      dz(static_cast<std::size_t>(L));
  std::vector<int> stage_of(static_cast<std::size_t>(L));
  for (int s = 0; s < P; ++s) {
    auto [a, b] = stage_layers(m, s, P);
    for (int l = a; l < b; ++l) stage_of[static_cast<std::size_t>(l)] = s;
  }
  for (int l = 0; l < L; ++l) {
    auto ul = static_cast<std::size_t>(l);
    history[ul].push_back(initial_params(m, l));
    acc[ul].assign(m.params(l), 0.0);
    y[ul].resize(n * m.width(l + 1));
    dz[ul].resize(n * m.width(l + 1));
  }
  std::vector<double> scratch_in(n * m.width(0)), losses(static_cast<std::size_t>(T), 0.0);
  const std::size_t fin = n * m.width(L);
  for (int t = 0; t < T; ++t) {
    const batch data = make_batch(m, microbatches, t);
    for (int i = 0; i < microbatches; ++i) {
      const int j = t * microbatches + i;
      auto version = [&](int l, bool backward) -> const std::vector<double>& {
        const int s = stage_of[static_cast<std::size_t>(l)];
        const int v = backward ? rule.backward_version(j, s) : rule.forward_version(j, s);
        auto const& h = history[static_cast<std::size_t>(l)];
        if (v < 0 || static_cast<std::size_t>(v) >= h.size())
          throw std::logic_error("reference_asynchronous: version " + std::to_string(v) + " of stage " + std::to_string(s) +
                                 " read before it was written");
        return h[static_cast<std::size_t>(v)];
      };
      const double* x0 = data.inputs.data() + static_cast<std::size_t>(i) * n * m.width(0);
      const double* x = x0;
      for (int l = 0; l < L; ++l) {
        kernels::layer_forward(version(l, false), m.width(l), m.width(l + 1), l + 1 < L, n, x, y[static_cast<std::size_t>(l)].data());
        x = y[static_cast<std::size_t>(l)].data();
      }
      const double* tg = data.targets.data() + static_cast<std::size_t>(i) * fin;
      double loss = 0;
      for (std::size_t k = 0; k < fin; ++k) {
        double d = x[k] - tg[k];
        loss += 0.5 * d * d;
      }
      losses[static_cast<std::size_t>(t)] += loss;
      double* top = dz[static_cast<std::size_t>(L - 1)].data();
      for (std::size_t k = 0; k < fin; ++k) top[k] = scale * (x[k] - tg[k]);
      for (int l = L - 1; l >= 0; --l) {
        double* gx = l > 0 ? dz[static_cast<std::size_t>(l - 1)].data() : scratch_in.data();
        kernels::layer_backward_input(version(l, true), m.width(l), m.width(l + 1), l + 1 < L, n, y[static_cast<std::size_t>(l)].data(),
                                      dz[static_cast<std::size_t>(l)].data(), gx);
      }
      for (int l = 0; l < L; ++l) {
        auto ul = static_cast<std::size_t>(l);
        g[ul].assign(m.params(l), 0.0);
        kernels::layer_backward_weight(m.width(l), m.width(l + 1), n, l == 0 ? x0 : y[ul - 1].data(), dz[ul].data(), g[ul].data());
        for (std::size_t k = 0; k < g[ul].size(); ++k) acc[ul][k] += g[ul][k];
      }
      if (rule.updates_after(j))
        for (int l = 0; l < L; ++l) {
          auto ul = static_cast<std::size_t>(l);
          std::vector<double> next = history[ul].back();
          for (std::size_t k = 0; k < next.size(); ++k) next[k] -= m.lr * acc[ul][k];
          history[ul].push_back(std::move(next));
          std::fill(acc[ul].begin(), acc[ul].end(), 0.0);
        }
    }
    losses[static_cast<std::size_t>(t)] *= scale;
  }
  params.assign(static_cast<std::size_t>(L), {});
  for (int l = 0; l < L; ++l) params[static_cast<std::size_t>(l)] = history[static_cast<std::size_t>(l)].back();
  return losses;
}

}  // namespace quickstart
