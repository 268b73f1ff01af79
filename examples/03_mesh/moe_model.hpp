// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// ep as a mesh dimension: a pipeline of linear stages ending in an MoE layer with its loss,
// trained by loom::data_parallel over dp x pp x ep x tp (tp innermost), the single-process
// reference holding every expert, and one rank's training run checked against it. The example's
// --experts mode (moe_train.hpp) and the tests (tests/mesh/moe_mesh_test.cpp on threads,
// tests/mesh_mpi on MPI) run it.
#pragma once

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/exec/data_parallel.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/mesh.hpp"
#include "loom/plan/formulas.hpp"
#include "loom/schedule.hpp"
#include "moe_layer.hpp"

namespace mesh_example::moe {

inline constexpr double mesh_lr = 0.1;  //!< SGD's learning rate

//! Stage `l`'s initial weights (h x h) before the MoE stage.
template <class T = double>
std::vector<T> linear_init(std::size_t h, int l) {
  std::vector<T> w(h * h);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<T>(0.5 * val(900 + static_cast<std::uint64_t>(l), i));
  return w;
}

//! Virtual stage `index` of `stages`: a linear layer h -> h (dense), or on the last stage the MoE
//! layer with the loss (`moe_stage`). Over a tensor-parallel group `tp` of T ranks (rank t):
//! the linear layer is column-parallel (rank t holds output rows [t h/T, (t+1) h/T); the forward
//! all-gathers the outputs, the backward all-reduces the input gradient), and the MoE layer takes
//! the token rows [t n/T, (t+1) n/T) (Megatron-core's sequence split before the router: its
//! router and expert gradients are then partial over tp) and all-gathers the input gradient. A
//! split stage: the linear `B` leaves its output gradient's columns in the stash for `W`. Written
//! once over the executor `X` (`host_exec`: double on the host; `device_exec`: fp32 kernels on
//! the stage call's stream).
template <class C, class X = host_exec>
class model_stage {
 public:
  using value_type = typename X::value_type;
  using T = value_type;
  using prob = basic_problem<T>;
  model_stage(const prob& p, C* ep, C* tp, const T* c, int index, int stages, bool pipeline_moe = false, int chunks = 1, C* node = nullptr,
              C* cross = nullptr, const moe_adaptive_groups<C>* adaptive = nullptr)
      : n_(p.n), h_(p.h), index_(index), tp_(tp), T_(tp == nullptr ? 1 : tp->size()), t_(tp == nullptr ? 0 : tp->rank()), pmoe_(pipeline_moe) {
    if (index == stages - 1) {
      auto part = std::make_shared<prob>(p);
      part->n = n_ / static_cast<std::size_t>(parts());
      part_ = part;
      if (pmoe_) moe_.emplace(*part_, ep, c, loom::dim_set{}, tp);
      else moe_.emplace(*part_, ep, c, T_ > 1 ? loom::dim_set{loom::dim::tp} : loom::dim_set{}, nullptr, chunks, node, cross, adaptive);
    } else {
      const std::vector<T> all = linear_init<T>(p.h, index);
      const std::size_t rows = h_ / static_cast<std::size_t>(T_);
      w_ = X::upload(std::vector<T>(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t_) * rows * h_),
                                    all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t_ + 1) * rows * h_)));
      grad_ = X::template zeros<T>(rows * h_);
      dense_.size = rows * h_;
    }
  }
  int index() const { return index_; }
  const moe_stage<C, X>* moe() const { return moe_ ? &*moe_ : nullptr; }
  moe_stage<C, X>* moe_mut() { return moe_ ? &*moe_ : nullptr; }
  //! This rank's rows of the linear layer (`[h/T][h]`, in the executor's memory).
  std::span<const T> linear() const { return std::span<const T>(w_.data(), w_.size()); }

  std::size_t input_size() const { return n_ * h_; }
  std::size_t output_size() const { return moe_ ? moe_->output_size() : n_ * h_; }
  std::size_t stash_size() const { return moe_ ? 0 : n_ * cols(); }
  std::span<T> params() { return moe_ ? moe_->params() : X::whole(w_); }
  std::span<T> weight_grad() { return moe_ ? moe_->weight_grad() : X::whole(grad_); }
  std::span<const loom::grad_range> grad_ranges() const { return moe_ ? moe_->grad_ranges() : std::span<const loom::grad_range>(&dense_, 1); }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<T> fb) {
    if (moe_) return moe_->forward(ctx, {mine(fb.input), fb.output, fb.stash});
    sp_.begin(ctx);
    const std::size_t k = cols();
    const std::span<T> part = sp_.tmp(0, n_ * k, false);
    sp_.x.linear().forward(fb.input, linear(), std::span<const T>{}, part, n_, h_, k);
    if (T_ == 1) {
      sp_.x.copy(cs(part), fb.output);
      return;
    }
    const std::span<T> all = sp_.tmp(1, n_ * h_, false);
    sp_.on(tp_)->all_gather(cs(part), all);  // [T][n][h/T]
    sp_.transpose({all.data(), fb.output.data(), static_cast<std::size_t>(T_), n_, k});  // to [n][T][h/T]
  }
  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<T> bb) {
    sp_.begin(ctx);
    if (moe_) {
      const std::span<T> dx = bb.input_grad.empty() ? std::span<T>{} : sp_.tmp(2, moe_->input_size());
      moe_->backward_input(ctx, {mine(bb.input), bb.stash, bb.output_grad, dx, {}});
      if (bb.input_grad.empty()) return;
      if (parts() == 1) sp_.x.copy(cs(dx), bb.input_grad);
      else sp_.on(tp_)->all_gather(cs(dx), bb.input_grad);  // row blocks in tp order
      return;
    }
    const std::size_t k = cols();
    sp_.transpose({bb.output_grad.data() + static_cast<std::size_t>(t_) * k, bb.stash.data(), 1, n_, k, h_, k});  // this rank's columns
    if (bb.input_grad.empty()) return;
    sp_.x.linear().backward_input(cs(bb.stash), linear(), bb.input_grad, n_, h_, k);
    if (T_ > 1) sp_.on(tp_)->all_reduce(bb.input_grad, loom::reduce_op::sum);  // the column blocks' partial sums, rank order
  }
  void backward_weight(const loom::stage_context& ctx, loom::weight_buffers<T> wb) {
    if (moe_) return moe_->backward_weight(ctx, {mine(wb.input), wb.stash, wb.weight_grad});
    sp_.begin(ctx);
    sp_.x.linear().backward_weight(wb.input, cs(wb.stash), wb.weight_grad, std::span<T>{}, n_, h_, cols());
  }
  void backward(const loom::stage_context& ctx, loom::backward_buffers<T> bb) {
    backward_input(ctx, {bb.input, bb.stash, bb.output_grad, bb.input_grad, {}});
    backward_weight(ctx, {bb.input, bb.stash, bb.weight_grad});
  }

 private:
  std::size_t cols() const { return h_ / static_cast<std::size_t>(T_); }
  //! How many parts the MoE layer's tokens split into (1 under Pipeline MoE).
  int parts() const { return pmoe_ ? 1 : T_; }
  //! This tp rank's token rows of a full activation.
  std::span<const T> mine(std::span<const T> x) const {
    const std::size_t part = n_ / static_cast<std::size_t>(parts()) * h_;
    return x.subspan(pmoe_ ? 0 : static_cast<std::size_t>(t_) * part, part);
  }

  std::size_t n_, h_;
  int index_;
  C* tp_;
  int T_, t_;
  bool pmoe_;
  std::shared_ptr<const prob> part_;  // the MoE layer's problem over this rank's tokens (a stable address)
  std::optional<moe_stage<C, X>> moe_;
  typename X::template buffer<T> w_, grad_;
  loom::grad_range dense_{0, 0, {}};
  call_space<C, X> sp_;
};

//! One training run: the mesh dp x pp x ep, the routing, the reducer's options.
struct mesh_setup {
  int dp = 1, pp = 1, ep = 2, E = 4, k = 2, steps = 2;
  double f = 0.5;
  bool det = true;
  int zero = 0;         //!< ZeRO stage
  int local_steps = 0;  //!< local SGD's H (0: synchronous)
  int tp = 1;  //!< tensor-parallel ranks (innermost), 1 or 2 (two partial sums add the same in either order)
  //! Pipeline MoE's layout over tp (ep = 1): the MoE layer's experts over the tp ranks, which hold
  //! every token, instead of the tokens split over them.
  bool pipeline_moe = false;
  std::size_t bucket_bytes = 0;  //!< the reducer's buckets; 0: 96 bytes with ZeRO (several buckets), else 25 MB
  int chunks = 1;                //!< > 1: the MoE exchange overlapped with the experts in this many pieces (FSMoE)
  //! > 0: the MoE exchange hierarchical (Tutel's 2D) over nodes of this many ep ranks (a divisor of ep).
  int node_size = 0;
  //! Tutel's adaptive parallelism (E < ep, each expert over S = ep / E ranks, a slice of its input
  //! columns each): step `i` runs degree `adaptive[i % size]`; empty: E / ep experts per rank.
  std::vector<int> adaptive{};
};

inline std::string describe(const mesh_setup& s) {
  return "dp" + std::to_string(s.dp) + " x pp" + std::to_string(s.pp) + " x ep" + std::to_string(s.ep) + " x tp" + std::to_string(s.tp) +
         (s.chunks > 1 ? " chunks=" + std::to_string(s.chunks) : std::string()) +
         (s.node_size > 0 ? " nodes of " + std::to_string(s.node_size) : std::string()) +
         (s.adaptive.empty() ? std::string() : " adaptive r=" + [&] {
           std::string r;
           for (int d : s.adaptive) {
             if (!r.empty()) r += ',';
             r += std::to_string(d);
           }
           return r;
         }()) +
         " E=" + std::to_string(s.E) +
         " k=" + std::to_string(s.k) + " f=" + std::to_string(s.f) + (s.det ? " deterministic" : "") + " zero=" + std::to_string(s.zero) +
         " H=" + std::to_string(s.local_steps);
}

//! A replica's weights: the linear stages', the router, every expert.
template <class T = double>
struct basic_mesh_weights {
  std::vector<std::vector<T>> linear;
  std::vector<T> router, experts;
};
using mesh_weights = basic_mesh_weights<double>;

//! Step `st`'s data: token set `(d ep + e) M + j` is microbatch `j` of replica `d`'s ep rank `e`.
//! Step 0's router and experts are the initial ones.
template <class T = double>
basic_problem<T> mesh_data(const mesh_setup& s, int M, int st) {
  basic_problem<T> p = make<T>(s.E, s.dp * s.ep * M, s.k, s.f, 5151 + static_cast<std::uint64_t>(st) * 31);
  if (!s.adaptive.empty()) p.o.alignment = s.ep / s.E;  // the capacity splits over every gather group (Tutel's alignment = S)
  return p;
}

//! `acc = g` the first time, else `acc += g`: the rank-ordered fold of loom::ordered_all_reduce.
template <class T>
void fold(std::vector<T>& acc, const std::vector<T>& g, bool first) {
  if (first) acc = g;
  else
    for (std::size_t i = 0; i < g.size(); ++i) acc[i] += g[i];
}

//! The reference, per replica. Each (d, e, j) goes through the linear stages; replica d's
//! microbatch j through `mesh_example::moe::reference` once per tp rank t (its ep ranks together, every
//! expert held, on the token rows t of each), then back through the linear stages, whose input
//! gradient adds the tp ranks' column blocks' partial sums in tp order. Per rank the microbatches'
//! gradients fold from zero in microbatch order (the pipeline's deterministic fold). Synchronous:
//! the ranks' folds in world order over their reduction groups (the router over dp x ep x tp, the
//! experts over dp x tp, the linear stages over dp x ep), every replica the same step. Local SGD:
//! the same inside each replica (dp left out), and every H steps the replicas' weights averaged
//! (summed in replica order, times 1/dp). Scaled by 1/(dp ep), then SGD.
//! With `last`, also the MoE layer's forward in the last step, per rank `(d ep + e) tp + t` and
//! microbatch: its output, dropped pairs and auxiliary loss (`t` = 0 alone under Pipeline MoE);
//! with `every`, the same for every step (`[step][rank][microbatch]`).
template <class real = double>
std::vector<basic_mesh_weights<real>> mesh_reference(const mesh_setup& s, int S, int M, std::vector<std::vector<basic_rank_result<real>>>* last = nullptr,
                                                  std::vector<std::vector<std::vector<basic_rank_result<real>>>>* every = nullptr) {
  using vec = std::vector<real>;
  using mesh_weights = basic_mesh_weights<real>;
  using rank_result = basic_rank_result<real>;
  using problem = basic_problem<real>;
  const problem p0 = mesh_data<real>(s, M, 0);
  const std::size_t h = p0.h, n = p0.n, D = static_cast<std::size_t>(s.dp), EP = static_cast<std::size_t>(s.ep), L = static_cast<std::size_t>(S - 1);
  const std::size_t T = static_cast<std::size_t>(s.tp), k = h / T;
  const std::size_t parts = s.pipeline_moe ? 1 : T, part = n / parts;  // the MoE layer's token parts
  mesh_weights init{{}, p0.wg, p0.we};
  for (int l = 0; l + 1 < S; ++l) init.linear.push_back(linear_init<real>(h, l));
  std::vector<mesh_weights> w(D, init);
  if (last != nullptr) last->assign(D * EP * T, std::vector<rank_result>(static_cast<std::size_t>(M)));
  if (every != nullptr)
    every->assign(static_cast<std::size_t>(s.steps), std::vector<std::vector<rank_result>>(D * EP * T, std::vector<rank_result>(static_cast<std::size_t>(M))));
  const real scale = static_cast<real>(1.0 / (s.dp * s.ep)), lr = static_cast<real>(mesh_lr);
  auto sgd = [&](vec& x, const vec& g) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] -= lr * (g[i] * scale);
  };
  for (int st = 0; st < s.steps; ++st) {
    const problem all = mesh_data<real>(s, M, st);
    // Per rank (d, e, t): the router and (for e = 0: the replica's tp rank t) the experts; per (d, e): the linear stages.
    std::vector<mesh_weights> acc(D * EP * T, mesh_weights{std::vector<vec>(L, vec(h * h, real{})), vec(p0.wg.size(), real{}), vec(p0.we.size(), real{})});
    for (std::size_t d = 0; d < D; ++d)
      for (int j = 0; j < M; ++j) {
        std::vector<std::vector<vec>> acts(EP);  // per ep rank: the input of every linear stage
        std::vector<vec> moe_in(EP), dmoe(EP, vec(n * h));
        for (std::size_t e = 0; e < EP; ++e) {
          vec a = all.x[(d * EP + e) * static_cast<std::size_t>(M) + static_cast<std::size_t>(j)];
          for (std::size_t l = 0; l < L; ++l) {
            acts[e].push_back(a);
            vec next(n * h);
            loom::linear_kernel::forward(std::span<const real>(a), std::span<const real>(w[d].linear[l]), std::span<const real>{},
                                         std::span<real>(next), n, h, h);
            a = next;
          }
          moe_in[e] = a;
        }
        for (std::size_t t = 0; t < parts; ++t) {  // the MoE layer on token rows t of every ep rank
          problem pd = all;
          pd.ranks = s.ep;
          pd.n = part;
          pd.x.clear();
          pd.c.clear();
          pd.wg = w[d].router;
          pd.we = w[d].experts;
          for (std::size_t e = 0; e < EP; ++e) {
            const vec& c = all.c[(d * EP + e) * static_cast<std::size_t>(M) + static_cast<std::size_t>(j)];
            pd.x.emplace_back(moe_in[e].begin() + static_cast<std::ptrdiff_t>(t * part * h), moe_in[e].begin() + static_cast<std::ptrdiff_t>((t + 1) * part * h));
            pd.c.emplace_back(c.begin() + static_cast<std::ptrdiff_t>(t * part * h), c.begin() + static_cast<std::ptrdiff_t>((t + 1) * part * h));
          }
          const auto want = reference(pd);
          if (last != nullptr && st + 1 == s.steps)
            for (std::size_t e = 0; e < EP; ++e) (*last)[(d * EP + e) * T + t][static_cast<std::size_t>(j)] = want[e];
          if (every != nullptr)
            for (std::size_t e = 0; e < EP; ++e) (*every)[static_cast<std::size_t>(st)][(d * EP + e) * T + t][static_cast<std::size_t>(j)] = want[e];
          for (std::size_t e = 0; e < EP; ++e) {
            mesh_weights& a = acc[(d * EP + e) * T + t];
            for (std::size_t i = 0; i < a.router.size(); ++i) a.router[i] += want[e].dwg[i];
            if (e == 0)  // the experts' gradient sums the ep ranks' rows already
              for (std::size_t i = 0; i < a.experts.size(); ++i) a.experts[i] += want[0].dwe[i];
            std::copy(want[e].dx.begin(), want[e].dx.end(), dmoe[e].begin() + static_cast<std::ptrdiff_t>(t * part * h));
          }
        }
        for (std::size_t e = 0; e < EP; ++e) {
          mesh_weights& a = acc[(d * EP + e) * T];
          vec da = dmoe[e];
          for (std::size_t l = L; l-- > 0;) {
            vec g(h * h, real{}), dprev(n * h, real{});
            loom::linear_kernel::backward_weight(std::span<const real>(acts[e][l]), std::span<const real>(da), std::span<real>(g),
                                                 std::span<real>{}, n, h, h);
            for (std::size_t i = 0; i < g.size(); ++i) a.linear[l][i] += g[i];
            for (std::size_t t = 0; t < T; ++t) {  // rank t's column block of da against its rows of the weight
              vec dy(n * k), pt(n * h);
              for (std::size_t r = 0; r < n; ++r)
                for (std::size_t o = 0; o < k; ++o) dy[r * k + o] = da[r * h + t * k + o];
              loom::linear_kernel::backward_input(std::span<const real>(dy), std::span<const real>(w[d].linear[l]).subspan(t * k * h, k * h),
                                                  std::span<real>(pt), n, h, k);
              for (std::size_t i = 0; i < pt.size(); ++i) dprev[i] = t == 0 ? pt[i] : dprev[i] + pt[i];
            }
            da = dprev;
          }
        }
      }
    // The reduced gradients: over the whole world (synchronous) or each replica (local SGD).
    const bool local = s.local_steps > 0;
    for (std::size_t d = 0; d < D; ++d) {
      if (!local && d > 0) {
        w[d] = w[0];
        continue;
      }
      mesh_weights g;
      g.linear.resize(L);
      const std::size_t first = local ? d * EP * T : 0, last = local ? (d + 1) * EP * T : D * EP * T;
      for (std::size_t r = first; r < last; ++r) {  // r = (d ep + e) tp + t, world order
        if (r % T < parts) fold(g.router, acc[r].router, r == first);  // over dp x ep x tp (Pipeline MoE: dp x ep)
        if (r % T == 0)  // the linear stages over dp x ep: each (d, e) once
          for (std::size_t l = 0; l < L; ++l) fold(g.linear[l], acc[r].linear[l], r == first);
      }
      // Experts over dp x tp: (d, t) in world order, the ep rank 0 of each holding the replica's sum.
      bool first_expert = true;
      for (std::size_t dd = local ? d : 0; dd < (local ? d + 1 : D); ++dd)
        for (std::size_t t = 0; t < parts; ++t) {
          fold(g.experts, acc[dd * EP * T + t].experts, first_expert);
          first_expert = false;
        }
      sgd(w[d].router, g.router);
      sgd(w[d].experts, g.experts);
      for (std::size_t l = 0; l < L; ++l) sgd(w[d].linear[l], g.linear[l]);
    }
    if (local && (st + 1) % s.local_steps == 0) {
      const real inv = static_cast<real>(1.0 / s.dp);
      auto average = [&](auto member) {
        vec sum;
        for (std::size_t d = 0; d < D; ++d) fold(sum, member(w[d]), d == 0);
        for (real& v : sum) v *= inv;
        for (std::size_t d = 0; d < D; ++d) member(w[d]) = sum;
      };
      average([](mesh_weights& x) -> vec& { return x.router; });
      average([](mesh_weights& x) -> vec& { return x.experts; });
      for (std::size_t l = 0; l < L; ++l) average([l](mesh_weights& x) -> vec& { return x.linear[l]; });
    }
  }
  return w;
}

//! Values of `got` that differ from `want`: bitwise, or beyond `tol` of the largest value.
template <class T>
long long value_differences(std::span<const T> got, std::span<const T> want, bool bitwise, double tol = 1e-12) {
  if (got.size() != want.size()) return 1 << 30;
  double norm = 0;
  for (T v : want) norm = std::max(norm, static_cast<double>(std::abs(v)));
  long long bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    bad += bitwise ? std::memcmp(&got[i], &want[i], sizeof(T)) != 0 : std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])) > tol * norm;
  return bad;
}

//! One step on one rank: what its MoE forwards dropped and lost, and what it communicated.
struct moe_step_report {
  //! Dropped (token, choice) pairs per expert (`[E]`), summed over this rank's MoE forwards of the
  //! step; empty on a rank without the MoE stage, and on tp ranks > 0 under Pipeline MoE (their
  //! tokens are tp rank 0's), so that a sum over the world counts every token once.
  std::vector<long long> dropped;
  double aux = 0;          //!< the sum of those forwards' auxiliary losses (in double)
  long long forwards = 0;  //!< how many forwards that is
  std::uint64_t formula_bytes = 0;  //!< all-to-all bytes on ep by the formula `4 E h sum_j C_j x b` (b bytes per element)
  //! This rank's communicators in the step (pp, ep, tp, dp, with a hierarchical exchange its node
  //! and cross groups, with adaptive parallelism the gather group of each degree, the dense group
  //! dp x ep, world).
  std::vector<std::pair<std::string, loom::comm_counters>> counts;
};

//! What one rank's run gives: its weights' differences from the reference's, how many values it
//! compared, the reducer's buckets, and the steps whose all-to-all bytes on `ep` differed from
//! the formula `4 E h sum_j C_j x b` (the rank's MoE microbatches j; 0 with one ep rank) or, with
//! f > 0, from `loom plan`'s (`plan_formulas::moe_all_to_all_bytes`).
struct mesh_rank_result {
  std::vector<moe_step_report> steps;  //!< per step
  long long differing = 0, compared = 0, moved = 0;  // moved: values that differ from the initial weights
  std::vector<loom::bucket_report> buckets;
  int volume_mismatches = 0;
  long long moe_microbatches = 0;  // forwards of the rank's MoE stages, all steps
  //! The last step's MoE forwards against the reference's: outputs (bitwise in deterministic
  //! mode, else 1e-12), dropped pairs (equal) and auxiliary losses, per microbatch.
  long long forward_differing = 0, forwards_compared = 0;
};

//! This rank of `world` trains `sched` (pp = its ranks) over dp x pp x ep, `s.steps` steps, and
//! compares the weights of its stages with replica `d`'s of `want`.
//! Run by executor `X` (`host_exec`, or `device_exec` on a device world: fp32, compared with the
//! fp32 reference of the same sums, bitwise in deterministic mode under loom's simulator, else
//! within `tol` of each tensor's largest value).
template <class X = host_exec, class World>
mesh_rank_result mesh_train_rank(World& world, const mesh_setup& s, const loom::schedule& sched,
                                 const std::vector<basic_mesh_weights<typename X::value_type>>& want,
                                 const std::vector<std::vector<basic_rank_result<typename X::value_type>>>* last = nullptr, bool bitwise_ok = true,
                                 double tol = 1e-12) {
  using real = typename X::value_type;
  using vec = std::vector<real>;
  using mesh4 = loom::mesh<loom::dp<>, loom::pp<>, loom::ep<>, loom::tp<>>;
  const int M = sched.microbatches, S = sched.stages;
  loom::mesh_comm g(mesh4{loom::dp<>{s.dp}, loom::pp<>{s.pp}, loom::ep<>{s.ep}, loom::tp<>{s.tp}}, world);
  using C = typename decltype(g)::comm_type;
  const basic_problem<real> p0 = mesh_data<real>(s, M, 0);
  const std::size_t hh = p0.h * p0.h, El = static_cast<std::size_t>(s.E / s.ep), nh = p0.n * p0.h;
  const auto d = static_cast<std::size_t>(g.coord(loom::dim::dp)), e = static_cast<std::size_t>(g.coord(loom::dim::ep));
  const loom::data_parallel_options o{.bucket_bytes = s.bucket_bytes != 0 ? s.bucket_bytes : s.zero != 0 ? 96 : std::size_t{25} << 20, .zero_stage = s.zero, .local_steps = s.local_steps,
                                      .deterministic = s.det, .grad_scale = 1.0 / (s.dp * s.ep)};
  const auto T = static_cast<std::size_t>(s.tp), t = static_cast<std::size_t>(g.coord(loom::dim::tp)), rows = p0.h / T;
  const std::size_t parts = s.pipeline_moe ? 1 : T;  // the MoE layer's token parts
  const std::size_t mine = nh / parts;               // this tp rank's token rows of a microbatch
  auto weights = X::template zeros<real>(static_cast<std::size_t>(M) * mine);  // their loss weights, this step's microbatches (the executor's memory)
  auto inputs = X::template zeros<real>(static_cast<std::size_t>(M) * nh);
  vec weights_host(static_cast<std::size_t>(M) * mine);
  // Tutel's 2D exchange: the ep group's ranks on this rank's node, and those with its index on every node.
  std::unique_ptr<C> node, cross;
  if (s.node_size > 0) {
    const int L = s.node_size, ei = static_cast<int>(e);
    node = std::make_unique<C>(g.ep().split(ei / L, ei % L));
    cross = std::make_unique<C>(g.ep().split(ei % L, ei / L));
  }
  // Tutel's adaptive parallelism: the gather group of every valid degree, split once.
  std::vector<std::unique_ptr<C>> gathers;
  moe_adaptive_groups<C> adaptive;
  if (!s.adaptive.empty())
    for (int r : loom::ep_adaptive_degrees(s.E, s.ep)) {
      auto [colour, key] = loom::ep_adaptive_split({s.ep, s.E, r}, static_cast<int>(e));
      gathers.push_back(std::make_unique<C>(g.ep().split(colour, key)));
      adaptive.gather.emplace_back(r, gathers.back().get());
    }
  loom::data_parallel<decltype(g), model_stage<C, X>> sync(g, o, loom::sgd{.lr = mesh_lr});
  loom::pipeline pl(sched, g.pp(), [&](loom::stage_id id) {
                      return model_stage<C, X>(p0, &g.ep(), &g.tp(), X::whole(weights).data(), id.stage, S, s.pipeline_moe, s.chunks, node.get(),
                                               cross.get(), s.adaptive.empty() ? nullptr : &adaptive);
                    },
                    {.deterministic = s.det, .scaling = loom::loss_scaling::sum, .observer = &sync});
  sync.attach(pl);
  mesh_rank_result out;
  // The communicators whose counts each step reports (ep is reset each step; the others differenced).
  std::vector<std::pair<std::string, const loom::comm_counters*>> comms{
      {"pp", &g.pp().counters()}, {"ep", &g.ep().counters()}, {"tp", &g.tp().counters()}, {"dp", &g.dp().counters()}};
  if (node) {
    comms.push_back({"ep (node)", &node->counters()});
    comms.push_back({"ep (cross)", &cross->counters()});
  }
  std::vector<std::string> gather_names;  // stable storage for the names below
  for (auto [r, c] : adaptive.gather) gather_names.push_back("ep gather (r = " + std::to_string(r) + ")");
  for (std::size_t i = 0; i < adaptive.gather.size(); ++i) comms.push_back({gather_names[i], &adaptive.gather[i].second->counters()});
  if (s.ep > 1) comms.push_back({"dp x ep", &g.group(loom::dim::dp | loom::dim::ep).counters()});
  comms.push_back({"world", &g.world().counters()});
  for (int st = 0; st < s.steps; ++st) {
    g.ep().reset_counters();
    if (!s.adaptive.empty()) adaptive.degree = s.adaptive[static_cast<std::size_t>(st) % s.adaptive.size()];
    if (node) {
      node->reset_counters();
      cross->reset_counters();
    }
    std::vector<loom::comm_counters> before;
    for (auto& c : comms) before.push_back(*c.second);
    for (auto& stg : pl.stages())
      if (stg.moe() != nullptr) stg.moe_mut()->clear_capacities();
    const basic_problem<real> p = mesh_data<real>(s, M, st);
    vec inputs_host;
    for (int j = 0; j < M; ++j) {
      const std::size_t at = (d * static_cast<std::size_t>(s.ep) + e) * static_cast<std::size_t>(M) + static_cast<std::size_t>(j);
      inputs_host.insert(inputs_host.end(), p.x[at].begin(), p.x[at].end());
      std::copy_n(p.c[at].begin() + static_cast<std::ptrdiff_t>((parts == 1 ? 0 : t) * mine), mine,
                  weights_host.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j) * mine));
    }
    X::put(X::whole(weights), weights_host);
    X::put(X::whole(inputs), inputs_host);
    pl.step(std::span<const real>(X::whole(inputs)));
    // The step's all-to-alls on ep: dispatch and combine, forward and backward, E C_j h each.
    std::uint64_t want_bytes = 0, want_calls = 0;
    long long forwards = 0;
    for (const auto& stg : pl.stages())
      if (const auto* m = stg.moe())
        for (long long cap : m->capacities()) {
          ++out.moe_microbatches;
          ++forwards;
          if (s.ep == 1) continue;
          if (!s.adaptive.empty()) {  // four exchanges of r E C h elements, none for r = 0
            if (adaptive.degree == 0) continue;
            want_calls += 4;
            want_bytes += 4 * static_cast<std::uint64_t>(adaptive.degree) * static_cast<std::uint64_t>(s.E) * static_cast<std::uint64_t>(cap) * p0.h *
                          sizeof(real);
            continue;
          }
          // Overlapped: each of the four exchanges in min(chunks, C) pieces of the same bytes in all.
          want_calls += 4 * static_cast<std::uint64_t>(std::min<long long>(s.chunks, std::max<long long>(cap, 1)));
          want_bytes += 4 * static_cast<std::uint64_t>(s.E) * static_cast<std::uint64_t>(cap) * p0.h * sizeof(real);
        }
    // Hierarchical: no flat all-to-all; the same exchanges on the node and across nodes, each of the whole buffer.
    const auto a2a = (node ? node->counters() : g.ep().counters())[loom::comm_op::all_to_all];
    if (a2a.calls != want_calls || a2a.bytes != want_bytes) ++out.volume_mismatches;
    if (node && (g.ep().counters()[loom::comm_op::all_to_all].calls != 0 || cross->counters()[loom::comm_op::all_to_all].calls != want_calls ||
                 cross->counters()[loom::comm_op::all_to_all].bytes != want_bytes))
      ++out.volume_mismatches;
    // With f > 0 the capacity does not depend on the routing: the bytes are also `loom plan`'s,
    // four all-to-alls of plan_formulas::moe_all_to_all_bytes per MoE forward.
    if (s.f > 0 && !s.pipeline_moe && s.ep > 1 && s.adaptive.empty()) {
      const loom::model_desc md{.hidden = static_cast<long long>(p0.h), .seq = static_cast<long long>(p0.n),
                                .bytes_per_element = static_cast<int>(sizeof(real)), .micro_batch = 1, .experts = s.E, .top_k = s.k,
                                .capacity_factor = s.f};
      const double planned = 4.0 * static_cast<double>(forwards) * loom::plan_formulas::moe_all_to_all_bytes(md, s.tp);
      if (static_cast<double>(a2a.bytes) != planned) ++out.volume_mismatches;
    }
    moe_step_report& rep = out.steps.emplace_back();
    rep.formula_bytes = want_bytes;
    for (std::size_t i = 0; i < comms.size(); ++i) rep.counts.push_back({comms[i].first, comms[i].second->since(before[i])});
    if (parts == 1 && t > 0) continue;  // Pipeline MoE: tp rank 0 reports the tokens they share
    for (const auto& stg : pl.stages())
      if (const auto* m = stg.moe())
        for (int mb : m->microbatches()) {
          const auto& r = m->record(mb);
          if (rep.dropped.empty()) rep.dropped.assign(r.dropped_per_expert.size(), 0);
          for (std::size_t x = 0; x < rep.dropped.size(); ++x) rep.dropped[x] += r.dropped_per_expert[x];
          rep.aux += r.aux;
          ++rep.forwards;
        }
  }
  sync.finish();
  out.buckets = sync.report();
  // The adaptive degrees r >= 2 reassociate the experts' sums: `tol` then, even in deterministic mode.
  const bool bitwise = s.det && s.adaptive.empty() && bitwise_ok;
  auto compare = [&](std::span<const real> got_dev, std::span<const real> ref, std::span<const real> initial) {
    const vec got = X::download(got_dev);
    out.differing += value_differences(std::span<const real>(got), ref, bitwise, tol);
    out.compared += static_cast<long long>(ref.size());
    out.moved += value_differences(std::span<const real>(got), initial, true);
  };
  const basic_mesh_weights<real>& w = want[d];
  for (const auto& stg : pl.stages()) {
    if (const auto* m = stg.moe(); m != nullptr && last != nullptr) {
      const auto& ref = (*last)[(d * static_cast<std::size_t>(s.ep) + e) * T + (parts == 1 ? 0 : t)];
      for (int mb : m->microbatches()) {
        const auto got = m->record(mb);
        const basic_rank_result<real>& r = ref[static_cast<std::size_t>(mb)];
        ++out.forwards_compared;
        const bool same = value_differences(std::span<const real>(got.y), std::span<const real>(r.y), bitwise, tol) == 0 && got.dropped == r.dropped &&
                          value_differences(std::span<const real>(&got.aux, 1), std::span<const real>(&r.aux, 1), bitwise, tol) == 0;
        if (!same) ++out.forward_differing;
      }
    }
    if (const auto* m = stg.moe()) {
      compare(m->router(), w.router, p0.wg);
      if (!s.adaptive.empty()) {  // this rank's slice: columns [j h/S, (j+1) h/S) of expert e / S, j = e % S
        const std::size_t S = static_cast<std::size_t>(s.ep / s.E), h = p0.h, hs = h / S;
        vec ref, initial;
        for (std::size_t o = 0; o < h; ++o)
          for (std::size_t i = 0; i < hs; ++i) {
            const std::size_t at = (e / S) * hh + o * h + (e % S) * hs + i;
            ref.push_back(w.experts[at]);
            initial.push_back(p0.we[at]);
          }
        compare(m->experts(), ref, initial);
        continue;
      }
      // This rank's experts: E/ep by its ep index, or under Pipeline MoE E/tp by its tp index.
      const std::size_t held = s.pipeline_moe ? static_cast<std::size_t>(s.E / s.tp) : El, first = (s.pipeline_moe ? t : e) * held * hh;
      compare(m->experts(), std::span<const real>(w.experts).subspan(first, held * hh), std::span<const real>(p0.we).subspan(first, held * hh));
    } else {
      const auto l = static_cast<std::size_t>(stg.index());
      const vec initial = linear_init<real>(p0.h, stg.index());
      compare(stg.linear(), std::span<const real>(w.linear[l]).subspan(t * rows * p0.h, rows * p0.h),
              std::span<const real>(initial).subspan(t * rows * p0.h, rows * p0.h));
    }
  }
  return out;
}

}  // namespace mesh_example::moe
