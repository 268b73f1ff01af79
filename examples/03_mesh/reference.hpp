// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The single-rank reference of the mesh example: the whole transformer of `transformer.hpp` on
//! one rank, no communicator, whole tensors, trained by SGD on the global batch.
//!
//! Floating-point addition is not associative, so "equal bit for bit to a run on a mesh" needs
//! the reference to add in the order the mesh adds. `reduction_order` says that order; with its
//! defaults (`plain()`) the reference is the textbook computation, and every run on every mesh
//! must come within 1e-12 of it. With `of(sharding)` it follows the mesh's documented order:
//! - row-parallel outputs (attention projection, second MLP layer) and column-parallel input
//!   gradients are sums of `tp` partial sums (one per tensor-parallel rank's slice of the
//!   contraction, each from zero in index order), added in rank order; the bias after;
//! - attention over `2R` zig-zag chunks (ring degree `R > 1`) merges its key blocks per query
//!   chunk in ring order (`loom::ring_attention`), and the key/value gradients in the ring's
//!   travel order; TokenRing (`--sp-kind tokenring`) merges each later step's key chunks into a
//!   fresh partial first, then the partial into the output (its backward is ring attention's);
//! - the gradient of a parameter is, for each member of its reduction group (data-parallel
//!   replica, and, for parameters that only see some tokens, the rank holding them), the fold of
//!   that member's per-microbatch gradients in microbatch order (each over the member's tokens in
//!   its local order), and then the members' folds added in group order (replica-major); the
//!   step's loss likewise;
//! - an MoE block routes each sequence alone (every expert here), and each expert's weight
//!   gradient of a microbatch is one sum from zero over the rows of the `ep` replicas' sequences,
//!   source-major (the all-to-all's layout), folded over microbatches and then over dp;
//! - the vocabulary-parallel head (`model_spec::vocab_parallel`) runs `loom::vocab_output_layer`
//!   on `vocab_shards` row shards of the output table, their statistics combined in shard order
//!   (one shard: the whole softmax), and its two tables' gradients are added into one accumulator
//!   microbatch after microbatch (the vocabulary layers' `T` and `IB` add in microbatch order, not
//!   by folds).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <loom/exec/vocab_parallel.hpp>

#include "transformer.hpp"

namespace mesh_example {

//! The order of additions the reference follows (see the file comment).
struct reduction_order {
  int tp = 1;                 //!< partial sums of the tensor-parallel contractions
  int ring = 1;               //!< ring degree of the attention blocking
  bool token_ring = false;    //!< TokenRing's forward order (a step's key chunks merged apart, then into the output)
  int replicas = 1;           //!< data-parallel replicas (each folds its own microbatches; with ep, dp x ep of them)
  int ep = 1;                 //!< consecutive replicas whose sequences' rows meet at the experts (MoE blocks)
  std::vector<std::vector<int>> groups{};  //!< token groups of the sequence split, each in local order (empty: one group, all tokens)
  sharding layout{};          //!< which parameters are partial over the token groups
  int vocab_shards = 1;       //!< the vocabulary-parallel head's shards (the pipeline ranks; 1: the unsplit softmax)

  //! The textbook order: one replica, all tokens, no partial sums.
  static reduction_order plain() { return {}; }
  //! The order of a run on `s`.
  static reduction_order of(const model_spec& m, const sharding& s) {
    reduction_order r;
    r.tp = s.tp;
    r.ring = s.ring();
    r.token_ring = s.token_ring();
    r.replicas = s.dp * s.ep;
    r.ep = s.ep;
    r.layout = s;
    r.vocab_shards = m.vocab_parallel != 0 ? s.pp : 1;
    const int n = s.megatron() ? s.tp : s.sp_ranks();
    for (int g = 0; g < n; ++g) {
      std::vector<int> toks;
      for (int i = 0; i < s.tokens(m); ++i) toks.push_back(s.megatron() ? s.token(m, g, 0, i) : s.token(m, 0, g, i));
      r.groups.push_back(toks);
    }
    return r;
  }
};

//! The whole model on one rank, in precision `T` (double: the host stage's; float: the device
//! stage's, whose kernels are the same per-item functions).
template <class T>
class basic_reference_model {
 public:
  using key = std::pair<tensor, int>;  //!< (tensor, block or -1)

  explicit basic_reference_model(const model_spec& m) : m_(m) {
    auto add = [&](tensor t, int b) {
      auto [r, c] = full_shape(m, t);
      auto& v = params_[{t, b}];
      v.resize(static_cast<std::size_t>(r * c));
      for (int i = 0; i < r; ++i)
        for (int j = 0; j < c; ++j) v[static_cast<std::size_t>(i * c + j)] = static_cast<T>(initial(m, t, b, i, j));
    };
    add(tensor::E, -1), add(tensor::P, -1);
    for (int b = 0; b < m.blocks; ++b)
      for (tensor t : m.moe.is_moe(b) ? std::span<const tensor>(moe_block_tensors) : std::span<const tensor>(block_tensors)) add(t, b);
    add(tensor::LNFG, -1), add(tensor::LNFB, -1), add(tensor::WOUT, -1);
    if (m.vocab_parallel == 0) add(tensor::BOUT, -1);  // the vocabulary-parallel head has no output bias
  }

  //! The parameters.
  const std::map<key, std::vector<T>>& params() const { return params_; }

  //! What one MoE block did to one sequence in the last step: its auxiliary loss, dropped
  //! (token, choice) pairs and drops per expert.
  struct moe_record {
    int block = 0;                              //!< the MoE block
    T aux = 0;                                  //!< its auxiliary loss on the sequence
    std::vector<std::pair<int, int>> dropped;   //!< (token, choice) pairs dropped
    std::vector<long long> dropped_per_expert;  //!< [E]
  };
  //! The last step's MoE records, per sequence of the batch (its index in `make_batch`), MoE blocks
  //! in order.
  const std::vector<std::vector<moe_record>>& last_moe() const { return last_moe_; }

  //! The last step's loss folds, one per (replica, token group), replica-major: what the mesh's
  //! loss reduction adds, in its order.
  const std::vector<double>& last_losses() const { return last_losses_; }

  //! Local SGD's average: every parameter of every replica becomes `(sum in replica order) *
  //! (1/replicas)`, as `loom::data_parallel` averages.
  static void average(std::vector<basic_reference_model>& replicas) {
    const auto inv = static_cast<T>(1.0 / static_cast<double>(replicas.size()));
    for (auto& [k, w] : replicas[0].params_)
      for (std::size_t i = 0; i < w.size(); ++i) {
        T sum = w[i];
        for (std::size_t r = 1; r < replicas.size(); ++r) sum += replicas[r].params_.at(k)[i];
        for (auto& rep : replicas) rep.params_.at(k)[i] = sum * inv;
      }
  }

  //! Updates with Adam (`a`'s hyper-parameters, the operations of `loom::detail::adam_element`)
  //! instead of SGD.
  void use_adam(const loom::adam<T>& a) {
    adam_ = a;
    use_adam_ = true;
  }

  //! One SGD step over the microbatches of `data` (`replicas x per_replica` sequences), loss of
  //! each token scaled by 1 / (all tokens of the batch). Returns the step's loss.
  double step(const batch& data, int per_replica, const reduction_order& ord) {
    const int groups = ord.groups.empty() ? 1 : static_cast<int>(ord.groups.size());
    std::vector<int> all(static_cast<std::size_t>(m_.seq));
    for (int i = 0; i < m_.seq; ++i) all[static_cast<std::size_t>(i)] = i;
    auto group_tokens = [&](int g) -> const std::vector<int>& { return ord.groups.empty() ? all : ord.groups[static_cast<std::size_t>(g)]; };
    const double scale = 1.0 / (static_cast<double>(ord.replicas) * per_replica * m_.seq);
    // Folds per (replica, group) for partial parameters, per replica for the others.
    std::vector<std::map<key, std::vector<T>>> fold_part(static_cast<std::size_t>(ord.replicas * groups)),
        fold_full(static_cast<std::size_t>(ord.replicas));
    std::vector<double> loss_fold(static_cast<std::size_t>(ord.replicas * groups), 0.0);
    std::vector<pass> passes;  // kept for the experts' sums (MoE blocks only)
    vocab_grad_.clear();
    if (m_.vocab_parallel != 0)
      for (tensor t : {tensor::E, tensor::WOUT}) vocab_grad_[{t, -1}].assign(params_.at({t, -1}).size(), T(0));
    last_moe_.assign(static_cast<std::size_t>(ord.replicas * per_replica), {});
    for (int d = 0; d < ord.replicas; ++d)
      for (int j = 0; j < per_replica; ++j) {
        const int mb = d * per_replica + j;
        pass p = run(data, mb, scale, ord);
        for (int b = 0; b < m_.blocks; ++b)
          if (m_.moe.is_moe(b)) {
            auto const& A = p.blocks[static_cast<std::size_t>(b)];
            last_moe_[static_cast<std::size_t>(mb)].push_back({b, A.aux, moe::dropped_of(A.R), A.R.dropped_per_expert()});
          }
        for (int g = 0; g < groups; ++g) {
          const auto gi = static_cast<std::size_t>(d * groups + g);
          double l = 0;
          if (m_.vocab_parallel != 0) l = p.vocab_loss;  // one group: the layers' loss of the microbatch
          else
            for (int t : group_tokens(g)) l += static_cast<double>(p.loss[static_cast<std::size_t>(t)]);
          loss_fold[gi] += l;
          fold(fold_part[gi], weight_grads(p, group_tokens(g)), ord, true);
        }
        fold(fold_full[static_cast<std::size_t>(d)], weight_grads(p, all), ord, false);
        if (m_.moe.every > 0) passes.push_back(std::move(p));
      }
    // The experts (MoE blocks): each microbatch's rows of the ep replicas that share the experts
    // meet at each expert, source-major, one from-zero sum per microbatch (as the all-to-all
    // lays them out), folded in microbatch order per data-parallel replica.
    const int ep = std::max(ord.ep, 1), members = ord.replicas / ep;
    std::vector<std::map<key, std::vector<T>>> fold_expert(static_cast<std::size_t>(members));
    if (m_.moe.every > 0)
      for (int q = 0; q < members; ++q)
        for (int j = 0; j < per_replica; ++j) {
          std::vector<const pass*> sources;
          for (int e = 0; e < ep; ++e) sources.push_back(&passes[static_cast<std::size_t>((q * ep + e) * per_replica + j)]);
          auto g = expert_grads(sources);
          auto& acc = fold_expert[static_cast<std::size_t>(q)];
          for (auto const& [k, v] : g) {
            auto& a = acc[k];
            if (a.empty()) a.assign(v.size(), 0.0);
            for (std::size_t i = 0; i < v.size(); ++i) a[i] += v[i];
          }
        }
    // Members added in group order (replica-major), then SGD.
    for (auto& [k, w] : params_) {
      const bool partial = is_partial(ord, k.first);
      const bool expert = is_expert(k.first);
      std::vector<T> total;
      if (auto v = vocab_grad_.find(k); v != vocab_grad_.end()) total = v->second;  // the vocabulary layers' accumulators
      else
      for (int d = 0; d < (expert ? members : ord.replicas); ++d)
        for (int g = 0; g < (partial ? groups : 1); ++g) {
          const auto& c = expert    ? fold_expert[static_cast<std::size_t>(d)].at(k)
                          : partial ? fold_part[static_cast<std::size_t>(d * groups + g)].at(k)
                                    : fold_full[static_cast<std::size_t>(d)].at(k);
          if (total.empty()) total = c;
          else
            for (std::size_t i = 0; i < c.size(); ++i) total[i] += c[i];
        }
      if (use_adam_) {
        auto& [m1, m2] = moments_[k];
        if (m1.empty()) m1.assign(w.size(), 0.0), m2.assign(w.size(), 0.0);
        const double t = static_cast<double>(adam_t_ + 1);
        const double c1 = 1 - std::pow(adam_.beta1, t), c2 = std::sqrt(1 - std::pow(adam_.beta2, t));
        for (std::size_t i = 0; i < w.size(); ++i)
          loom::detail::adam_element(w[i], total[i], m1[i], m2[i], static_cast<T>(adam_.beta1), static_cast<T>(adam_.beta2),
                                     static_cast<T>(adam_.lr * c2 / c1), static_cast<T>(adam_.eps * c2));
        continue;
      }
      const auto lr = static_cast<T>(m_.lr);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * total[i];
    }
    ++adam_t_;
    last_losses_ = loss_fold;
    double loss = loss_fold[0];
    for (std::size_t i = 1; i < loss_fold.size(); ++i) loss += loss_fold[i];
    return loss;
  }

  //! The single-process reference of an asynchronous run (PipeDream, its vertical sync, PipeDream-2BW,
  //! pipelined backpropagation: `rule` is a `quickstart::async_rule`) on `stages` pipeline stages
  //! (the blocks as `stage_blocks` splits them; the embedding on the first stage, the final layers
  //! on the last): `steps` steps of `M` microbatches (the batches `make_batch(m, M, t)`), microbatch
  //! by microbatch in order. Every stage keeps the history of its versions; microbatch j's forward
  //! reads version `rule.forward_version(j, s)` of stage s, its backward
  //! `rule.backward_version(j, s)`; each stage adds the weight gradients of its microbatches in
  //! order from zero and, after every `j` with `rule.updates_after(j)`, writes its next version by
  //! SGD. Loss of each token scaled by 1 / (M tokens of a step). Returns each step's loss (the sum
  //! of its microbatches' losses, each the sum over its tokens, in order); the parameters end as
  //! every stage's latest version.
  template <class Rule>
  std::vector<double> asynchronous(const Rule& rule, int stages, int M, int steps, const reduction_order& ord) {
    auto stage_of = [&](const key& k) {
      if (k.second >= 0) {
        for (int st = 0; st < stages; ++st)
          if (k.second < stage_blocks(m_.blocks, st, stages).second) return st;
      }
      return k.first == tensor::E || k.first == tensor::P ? 0 : stages - 1;
    };
    using tensors = std::map<key, std::vector<T>>;
    const auto uS = static_cast<std::size_t>(stages);
    std::vector<std::vector<tensors>> history(uS, std::vector<tensors>(1));  // [stage][version]
    std::vector<tensors> acc(uS);
    for (auto const& [k, w] : params_) {
      const auto st = static_cast<std::size_t>(stage_of(k));
      history[st][0][k] = w;
      acc[st][k].assign(w.size(), T(0));
    }
    auto versions = [&](int j, bool backward) {
      tensors out;
      for (int st = 0; st < stages; ++st) {
        const int v = backward ? rule.backward_version(j, st) : rule.forward_version(j, st);
        auto const& h = history[static_cast<std::size_t>(st)];
        if (v < 0 || static_cast<std::size_t>(v) >= h.size())
          throw std::logic_error("reference asynchronous: version " + std::to_string(v) + " of stage " + std::to_string(st) +
                                 " read before it was written");
        for (auto const& [k, w] : h[static_cast<std::size_t>(v)]) out[k] = w;
      }
      return out;
    };
    std::vector<int> all(static_cast<std::size_t>(m_.seq));
    for (int i = 0; i < m_.seq; ++i) all[static_cast<std::size_t>(i)] = i;
    const double scale = 1.0 / (static_cast<double>(M) * m_.seq);
    const auto lr = static_cast<T>(m_.lr);
    std::vector<double> losses(static_cast<std::size_t>(steps), 0.0);
    for (int t = 0; t < steps; ++t) {
      const batch data = make_batch(m_, M, t);
      for (int i = 0; i < M; ++i) {
        const int j = t * M + i;
        const tensors fwd = versions(j, false), bwd = versions(j, true);
        const pass p = run(data, i, scale, ord, &fwd, &bwd);
        double l = 0;
        for (T v : p.loss) l += static_cast<double>(v);
        losses[static_cast<std::size_t>(t)] += l;
        for (auto const& [k, g] : weight_grads(p, all)) {
          auto& a = acc[static_cast<std::size_t>(stage_of(k))].at(k);
          for (std::size_t e = 0; e < g.size(); ++e) a[e] += g[e];
        }
        if (!rule.updates_after(j)) continue;
        for (std::size_t st = 0; st < uS; ++st) {
          tensors next = history[st].back();
          for (auto& [k, w] : next) {
            auto& a = acc[st].at(k);
            for (std::size_t e = 0; e < w.size(); ++e) w[e] -= lr * a[e];
            std::fill(a.begin(), a.end(), T(0));
          }
          history[st].push_back(std::move(next));
        }
      }
    }
    for (auto const& h : history)
      for (auto const& [k, w] : h.back()) params_[k] = w;
    return losses;
  }

 private:
  static constexpr tensor block_tensors[] = {tensor::LN1G, tensor::LN1B, tensor::WQKV, tensor::BQKV, tensor::WO, tensor::BO,
                                             tensor::LN2G, tensor::LN2B, tensor::W1,   tensor::B1,   tensor::W2, tensor::B2};
  static constexpr tensor moe_block_tensors[] = {tensor::LN1G, tensor::LN1B, tensor::WQKV,   tensor::BQKV, tensor::WO,  tensor::BO,  tensor::LN2G,
                                                 tensor::LN2B, tensor::ROUTER, tensor::EW1, tensor::EB1, tensor::EW2, tensor::EB2};
  static bool is_expert(tensor t) { return t == tensor::EW1 || t == tensor::EB1 || t == tensor::EW2 || t == tensor::EB2; }

  static bool is_partial(const reduction_order& ord, tensor t) {
    if (ord.groups.size() <= 1) return false;
    tensor_slot probe{t};
    probe.split = ord.layout.tp > 1 ? split_of(t) : split_kind::none;
    return seq_partial(ord.layout, probe);
  }

  //! Everything one microbatch's forward and backward leave for the weight gradients.
  struct block_acts {
    std::vector<T> xhat1, afull, o, xhat2, cfull, act, dqkv, dy, du, dz, da, dc;
    // An MoE block: its routing, the experts' rows ([E][C][h]) and hidden activations ([E][C][f]),
    // the outputs at the slots, and what the backward leaves; `act` and `du` are the experts'.
    loom::moe_routing<T> R;
    std::vector<T> xin, eo, drows, dl;
    T aux = 0;
  };
  struct pass {
    std::vector<T> tokens, x_grad, loss, xhatf, f, dlogits, df;
    double vocab_loss = 0;  // the vocabulary-parallel head: the microbatch's loss, weighted (`loss` is then empty)
    std::vector<block_acts> blocks;
  };

  std::span<const T> P(tensor t, int b) const { return (reading_ != nullptr ? *reading_ : params_).at({t, b}); }

  //! `sum_k partial_k + bias` over `k` tensor-parallel slices of the contraction (`in` columns
  //! of `w`, `[out][in]`), partial sums from zero in index order, added in slice order.
  void row_parallel(const T* x, std::span<const T> w, std::span<const T> b, T* y, int n, int in, int out,
                    int tp) const {
    const int il = in / tp;
    for (int t = 0; t < n; ++t)
      for (int o = 0; o < out; ++o) {
        T acc = 0;
        for (int k = 0; k < tp; ++k) {
          T s = 0;
          for (int i = k * il; i < (k + 1) * il; ++i)
            s += x[static_cast<std::size_t>(t * in + i)] * w[static_cast<std::size_t>(o * in + i)];
          acc = k == 0 ? s : acc + s;
        }
        y[static_cast<std::size_t>(t * out + o)] = acc + b[static_cast<std::size_t>(o)];
      }
  }
  //! `dx = sum_k sum_{o in slice k} dy[o] w[o][i]`: the column-parallel input gradient; `rows(k)`
  //! lists slice `k`'s output rows in the slice's own order.
  template <class Rows>
  void column_backward(const T* dy, std::span<const T> w, T* dx, int n, int in, int out, int tp, Rows rows) const {
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < in; ++i) {
        T acc = 0;
        for (int k = 0; k < tp; ++k) {
          T s = 0;
          for (int o : rows(k)) s += dy[static_cast<std::size_t>(t * out + o)] * w[static_cast<std::size_t>(o * in + i)];
          acc = k == 0 ? s : acc + s;
        }
        dx[static_cast<std::size_t>(t * in + i)] = acc;
      }
  }
  std::vector<int> qkv_rows(int k, int tp) const {
    const int hl = m_.hidden / tp;
    std::vector<int> r;
    for (int p = 0; p < 3; ++p)
      for (int i = 0; i < hl; ++i) r.push_back(p * m_.hidden + k * hl + i);
    return r;
  }
  std::vector<int> ffn_rows(int k, int tp) const {
    const int fl = m_.ffn / tp;
    std::vector<int> r;
    for (int i = 0; i < fl; ++i) r.push_back(k * fl + i);
    return r;
  }

  //! Attention over all heads (causal or full, as the model), blocked by `ring` (see the file comment).
  void attention_forward(const loom::attention_dims& a, const std::vector<T>& q, const std::vector<T>& k,
                         const std::vector<T>& v, std::vector<T>& o, std::vector<T>& lse, int ring, bool token_ring = false) const {
    const int N = m_.seq;
    o.assign(q.size(), 0.0);
    lse.assign(static_cast<std::size_t>(N * a.heads), -INFINITY);
    if (ring == 1) {
      loom::attention_block_forward<T>(a, q, k, v, o, lse, 0, N, 0, N, m_.causal ? loom::block_mask::causal : loom::block_mask::full);
      return;
    }
    const int C = N / (2 * ring);
    // TokenRing (loom::token_ring_attention): a later step's blocks go into a fresh partial, merged
    // into the output afterwards; ring attention merges every block straight into the output.
    std::vector<T> y, lb;
    for (int p = 0; p < ring; ++p)
      for (int s = 0; s < ring; ++s) {
        const int src = (p - s + ring) % ring;
        const int qch[2] = {p, 2 * ring - 1 - p}, kch[2] = {src, 2 * ring - 1 - src};
        const bool apart = token_ring && s > 0;
        if (apart) {
          y.assign(o.size(), T(0));
          lb.assign(lse.size(), -INFINITY);
        }
        for (int qa : qch)
          for (int kb : kch) {
            const auto msk = loom::chunk_mask(qa, kb, m_.causal);
            if (msk != loom::block_mask::none)
              loom::attention_block_forward<T>(a, q, k, v, apart ? y : o, apart ? lb : lse, qa * C, C, kb * C, C, msk);
          }
        if (!apart) continue;
        const loom::attention_merge_rows<T> merge{o.data(), lse.data(), y.data(), lb.data(), a.head_dim};
        for (int qa : qch)
          for (std::size_t r = static_cast<std::size_t>(qa * C * a.heads); r < static_cast<std::size_t>((qa + 1) * C * a.heads); ++r)
            merge(r);
      }
  }
  void attention_backward(const loom::attention_dims& a, const std::vector<T>& q, const std::vector<T>& k,
                          const std::vector<T>& v, const std::vector<T>& o, const std::vector<T>& lse,
                          const std::vector<T>& dout, std::vector<T>& dq, std::vector<T>& dk,
                          std::vector<T>& dv, int ring) const {
    const int N = m_.seq;
    std::vector<T> delta(lse.size());
    loom::attention_delta<T>(a, o, dout, delta);
    dq.assign(q.size(), 0.0);
    dk.assign(q.size(), 0.0);
    dv.assign(q.size(), 0.0);
    if (ring == 1) {
      loom::attention_block_backward<T>(a, q, k, v, lse, dout, delta, dq, dk, dv, 0, N, 0, N, m_.causal ? loom::block_mask::causal : loom::block_mask::full);
      return;
    }
    const int C = N / (2 * ring);
    auto block = [&](int qa, int kb, std::span<T> gq, std::span<T> gk, std::span<T> gv) {
      const auto msk = loom::chunk_mask(qa, kb, m_.causal);
      if (msk != loom::block_mask::none)
        loom::attention_block_backward<T>(a, q, k, v, lse, dout, delta, gq, gk, gv, qa * C, C, kb * C, C, msk);
    };
    // dQ: per query position, key positions in ring order (as the forward merges).
    for (int p = 0; p < ring; ++p)
      for (int s = 0; s < ring; ++s) {
        const int src = (p - s + ring) % ring;
        for (int qa : {p, 2 * ring - 1 - p})
          for (int kb : {src, 2 * ring - 1 - src}) block(qa, kb, dq, {}, {});
      }
    // dK, dV: per key position, query positions in the ring's travel order.
    for (int src = 0; src < ring; ++src)
      for (int s = 0; s < ring; ++s) {
        const int p = (src + s) % ring;
        for (int qa : {p, 2 * ring - 1 - p})
          for (int kb : {src, 2 * ring - 1 - src}) block(qa, kb, {}, dk, dv);
      }
  }

  //! Forward and backward of microbatch `mb` (loss scale `scale`, seed 1), keeping per token
  //! what the weight gradients need. The forward reads `forward_params` and the backward
  //! `backward_params` (an asynchronous rule's versions), both the model's parameters when null.
  pass run(const batch& data, int mb, double scale, const reduction_order& ord, const std::map<key, std::vector<T>>* forward_params = nullptr,
           const std::map<key, std::vector<T>>* backward_params = nullptr) const {
    reading_ = forward_params;
    struct restore {
      const std::map<key, std::vector<T>>*& r;
      ~restore() { r = nullptr; }
    } done{reading_};
    const int N = m_.seq, h = m_.hidden, H = m_.heads, D = m_.head_dim(), f = m_.ffn, V = m_.vocab, tp = ord.tp;
    const auto uN = static_cast<std::size_t>(N), uh = static_cast<std::size_t>(h);
    const loom::attention_dims a{H, D, 1.0 / std::sqrt(static_cast<double>(D))};
    pass p;
    p.tokens.assign(data.tokens.begin() + static_cast<std::ptrdiff_t>(mb * N), data.tokens.begin() + static_cast<std::ptrdiff_t>((mb + 1) * N));
    const std::vector<T> targets(data.targets.begin() + static_cast<std::ptrdiff_t>(mb * N),
                                 data.targets.begin() + static_cast<std::ptrdiff_t>((mb + 1) * N));
    const T* target = targets.data();
    const auto tscale = static_cast<T>(scale);
    std::vector<T> x(uN * uh), rstd(uN);
    for (int t = 0; t < N; ++t)
      for (int i = 0; i < h; ++i)
        x[static_cast<std::size_t>(t * h + i)] =
            P(tensor::E, -1)[static_cast<std::size_t>(p.tokens[static_cast<std::size_t>(t)]) * uh + static_cast<std::size_t>(i)] +
            P(tensor::P, -1)[static_cast<std::size_t>(t * h + i)];
    struct saved {
      std::vector<T> rstd1, rstd2, q, k, v, o, lse;
    };
    std::vector<saved> sv(static_cast<std::size_t>(m_.blocks));
    p.blocks.resize(static_cast<std::size_t>(m_.blocks));
    for (int b = 0; b < m_.blocks; ++b) {
      auto& A = p.blocks[static_cast<std::size_t>(b)];
      auto& S = sv[static_cast<std::size_t>(b)];
      std::vector<T> an(uN * uh), qkv(uN * 3 * uh), y(uN * uh), x1(uN * uh), c(uN * uh), u(uN * static_cast<std::size_t>(f)),
          z(uN * uh);
      A.xhat1.resize(uN * uh), S.rstd1.resize(uN);
      kernels::ln_forward(x.data(), P(tensor::LN1G, b).data(), P(tensor::LN1B, b).data(), an.data(), A.xhat1.data(), S.rstd1.data(), uN, uh);
      A.afull = an;
      loom::linear_kernel::forward<T>(an, P(tensor::WQKV, b), P(tensor::BQKV, b), qkv, uN, uh, 3 * uh);
      S.q.resize(uN * uh), S.k.resize(uN * uh), S.v.resize(uN * uh);
      for (std::size_t t = 0; t < uN; ++t)
        for (std::size_t i = 0; i < uh; ++i) {
          S.q[t * uh + i] = qkv[t * 3 * uh + i];
          S.k[t * uh + i] = qkv[t * 3 * uh + uh + i];
          S.v[t * uh + i] = qkv[t * 3 * uh + 2 * uh + i];
        }
      attention_forward(a, S.q, S.k, S.v, S.o, S.lse, ord.ring, ord.token_ring);
      A.o = S.o;
      row_parallel(S.o.data(), P(tensor::WO, b), P(tensor::BO, b), y.data(), N, h, h, tp);
      for (std::size_t i = 0; i < x1.size(); ++i) x1[i] = x[i] + y[i];
      A.xhat2.resize(uN * uh), S.rstd2.resize(uN);
      kernels::ln_forward(x1.data(), P(tensor::LN2G, b).data(), P(tensor::LN2B, b).data(), c.data(), A.xhat2.data(), S.rstd2.data(), uN, uh);
      A.cfull = c;
      if (m_.moe.is_moe(b)) {
        moe_forward(A, b, z);
      } else {
        loom::linear_kernel::forward<T>(c, P(tensor::W1, b), P(tensor::B1, b), u, uN, uh, static_cast<std::size_t>(f));
        A.act.resize(u.size());
        kernels::each(u.size(), kernels::tanh_elem<T>{u.data(), A.act.data()});
        row_parallel(A.act.data(), P(tensor::W2, b), P(tensor::B2, b), z.data(), N, f, h, tp);
      }
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = x1[i] + z[i];
    }
    // final layers and loss
    const auto uV = static_cast<std::size_t>(V);
    p.xhatf.resize(uN * uh), p.f.resize(uN * uh);
    kernels::ln_forward(x.data(), P(tensor::LNFG, -1).data(), P(tensor::LNFB, -1).data(), p.f.data(), p.xhatf.data(), rstd.data(), uN, uh);
    if (m_.vocab_parallel != 0) {
      vocab_head(p, targets, scale, ord.vocab_shards, backward_params);
    } else {
      std::vector<T> logits(uN * uV), probs(uN * uV);
      loom::linear_kernel::forward<T>(p.f, P(tensor::WOUT, -1), P(tensor::BOUT, -1), logits, uN, uh, uV);
      p.loss.resize(uN);
      for (std::size_t t = 0; t < uN; ++t)
        kernels::loss_row<T>{logits.data(), target, probs.data(), p.loss.data(), uV, tscale}(t);
      reading_ = backward_params;  // the backward's version from here
      p.dlogits.resize(uN * uV), p.df.resize(uN * uh);
      kernels::loss_backward(probs.data(), target, T(1), tscale, p.dlogits.data(), uN, uV);
      loom::linear_kernel::backward_input<T>(p.dlogits, P(tensor::WOUT, -1), p.df, uN, uh, uV);
    }
    std::vector<T> zero(uN * uh, 0.0), g(uN * uh), gx(uN * uh);
    kernels::ln_backward_input(p.df.data(), p.xhatf.data(), rstd.data(), P(tensor::LNFG, -1).data(), zero.data(), g.data(), uN, uh);
    for (int b = m_.blocks - 1; b >= 0; --b) {
      auto& A = p.blocks[static_cast<std::size_t>(b)];
      auto& S = sv[static_cast<std::size_t>(b)];
      A.dz = g;
      std::vector<T> dact(uN * static_cast<std::size_t>(f)), g1(uN * uh), dout(uN * uh);
      if (m_.moe.is_moe(b)) {
        moe_backward(A, b, g, scale);
      } else {
        loom::linear_kernel::backward_input<T>(g, P(tensor::W2, b), dact, uN, static_cast<std::size_t>(f), uh);
        A.du = dact;
        kernels::each(dact.size(), kernels::tanh_grad_elem<T>{A.act.data(), A.du.data()});
        A.dc.resize(uN * uh);
        column_backward(A.du.data(), P(tensor::W1, b), A.dc.data(), N, h, f, tp, [&](int k) { return ffn_rows(k, tp); });
      }
      kernels::ln_backward_input(A.dc.data(), A.xhat2.data(), S.rstd2.data(), P(tensor::LN2G, b).data(), g.data(), g1.data(), uN, uh);
      A.dy = g1;
      loom::linear_kernel::backward_input<T>(g1, P(tensor::WO, b), dout, uN, uh, uh);
      std::vector<T> dq, dk, dv;
      attention_backward(a, S.q, S.k, S.v, S.o, S.lse, dout, dq, dk, dv, ord.ring);
      A.dqkv.resize(uN * 3 * uh);
      for (std::size_t t = 0; t < uN; ++t)
        for (std::size_t i = 0; i < uh; ++i) {
          A.dqkv[t * 3 * uh + i] = dq[t * uh + i];
          A.dqkv[t * 3 * uh + uh + i] = dk[t * uh + i];
          A.dqkv[t * 3 * uh + 2 * uh + i] = dv[t * uh + i];
        }
      A.da.resize(uN * uh);
      column_backward(A.dqkv.data(), P(tensor::WQKV, b), A.da.data(), N, h, 3 * h, tp, [&](int k) { return qkv_rows(k, tp); });
      kernels::ln_backward_input(A.da.data(), A.xhat1.data(), S.rstd1.data(), P(tensor::LN1G, b).data(), g1.data(), gx.data(), uN, uh);
      std::swap(g, gx);
    }
    p.x_grad = g;
    if (m_.vocab_parallel != 0) {  // the input layer's IB: the rows of the tokens, in token order
      auto& dE = vocab_grad_.at({tensor::E, -1});
      for (std::size_t t = 0; t < uN; ++t)
        for (std::size_t j = 0; j < uh; ++j) dE[static_cast<std::size_t>(p.tokens[t]) * uh + j] += g[t * uh + j];
    }
    return p;
  }

  //! The vocabulary-parallel head on `p.f` (see the file comment): `loom::vocab_output_layer` on
  //! `shards` row shards of the output table (statistics, combined in shard order, the loss), then
  //! from the parameters `backward_params` (null: the model's) the output table's gradient added
  //! into its accumulator and the input gradient `p.df` by the model's algorithm (1: the shards'
  //! parts summed in order; 2: the fused form from the parts `S` formed).
  void vocab_head(pass& p, const std::vector<T>& targets, double scale, int shards,
                  const std::map<key, std::vector<T>>* backward_params) const {
    const auto uN = static_cast<std::size_t>(m_.seq), uh = static_cast<std::size_t>(m_.hidden), nh = uN * uh;
    const int algorithm = m_.vocab_parallel;
    std::vector<std::int64_t> y(uN);
    for (std::size_t t = 0; t < uN; ++t) y[t] = static_cast<std::int64_t>(targets[t]);
    std::vector<loom::vocab_shard> sh;
    for (int k = 0; k < shards; ++k) sh.push_back(loom::shard_of(m_.vocab, shards, k, uh));
    const std::size_t rows = sh[0].rows, rh = rows * uh, us = static_cast<std::size_t>(shards);
    std::vector<std::vector<T>> e(us, std::vector<T>(uN * rows)), stats(us, std::vector<T>(3 * uN)), parts(us, std::vector<T>(2 * nh, T(0)));
    std::vector<loom::vocab_statistics<T>> all;
    std::vector<T> scratch(uN * rows), global(3 * uN);
    const std::span<const T> f(p.f);
    for (std::size_t k = 0; k < us; ++k) {
      const loom::vocab_output_layer<> o{sh[k]};
      const std::span<const T> w = P(tensor::WOUT, -1).subspan(k * rh, rh);
      o.forward(f, w, std::span<const std::int64_t>(y), std::span<T>(e[k]), {stats[k], uN});
      all.push_back({stats[k], uN});
      if (algorithm == 2)
        o.input_gradient_parts(w, std::span<const std::int64_t>(y), std::span<const T>(e[k]), {stats[k], uN}, std::span<T>(scratch),
                               std::span<T>(parts[k]).subspan(0, nh), std::span<T>(parts[k]).subspan(nh, nh));
    }
    loom::vocab_output_layer<>::combine<T>(all, {global, uN});
    p.vocab_loss = static_cast<double>(loom::vocab_output_layer<>::loss<T>({global, uN})) * scale;
    reading_ = backward_params;  // the backward's version from here
    const auto dl = static_cast<T>(scale);
    auto& dW = vocab_grad_.at({tensor::WOUT, -1});
    std::vector<std::span<const T>> gp, yp;
    for (std::size_t k = 0; k < us; ++k) {
      const loom::vocab_output_layer<> o{sh[k]};
      o.backward(f, P(tensor::WOUT, -1).subspan(k * rh, rh), std::span<const std::int64_t>(y), std::span<T>(e[k]), {stats[k], uN}, {global, uN}, dl,
                 std::span<T>(dW).subspan(k * rh, rh), algorithm == 1 ? std::span<T>(parts[k]).subspan(0, nh) : std::span<T>{});
      gp.push_back(std::span<const T>(parts[k]).subspan(0, nh));
      yp.push_back(std::span<const T>(parts[k]).subspan(nh, nh));
    }
    p.df.assign(nh, T(0));
    if (algorithm == 1) loom::vocab_output_layer<>::sum_input_gradient<T>(gp, p.df);
    else loom::vocab_output_layer<>::fused_input_gradient<T>(gp, yp, all, {global, uN}, dl, p.df);
  }

  //! The weight gradients of one microbatch over `tokens` (in that order), whole tensors.
  std::map<key, std::vector<T>> weight_grads(const pass& p, const std::vector<int>& tokens) const {
    const auto uh = static_cast<std::size_t>(m_.hidden), uf = static_cast<std::size_t>(m_.ffn), uV = static_cast<std::size_t>(m_.vocab);
    const std::size_t n = tokens.size();
    std::map<key, std::vector<T>> g;
    for (auto const& [k, w] : params_) g[k].assign(w.size(), 0.0);
    auto rows = [&](const std::vector<T>& src, std::size_t width) {
      std::vector<T> out;
      for (int t : tokens) out.insert(out.end(), src.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * width),
                                      src.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(t) + 1) * width));
      return out;
    };
    for (std::size_t i = 0; i < n; ++i) {
      const auto t = static_cast<std::size_t>(tokens[i]);
      const auto tok = static_cast<std::size_t>(p.tokens[t]);
      for (std::size_t j = 0; j < uh; ++j) {
        if (m_.vocab_parallel == 0) g[{tensor::E, -1}][tok * uh + j] += p.x_grad[t * uh + j];  // else the layers' accumulator
        g[{tensor::P, -1}][t * uh + j] += p.x_grad[t * uh + j];
      }
    }
    for (int b = 0; b < m_.blocks; ++b) {
      auto const& A = p.blocks[static_cast<std::size_t>(b)];
      auto G = [&](tensor t) { return std::span<T>(g[{t, b}]); };
      auto cfull = rows(A.cfull, uh), dc = rows(A.dc, uh), xhat2 = rows(A.xhat2, uh), o = rows(A.o, uh), dy = rows(A.dy, uh),
           afull = rows(A.afull, uh), dqkv = rows(A.dqkv, 3 * uh), da = rows(A.da, uh), xhat1 = rows(A.xhat1, uh);
      if (m_.moe.is_moe(b)) {  // the router (the experts: `expert_grads`)
        const auto E = static_cast<std::size_t>(m_.moe.o.experts);
        loom::linear_kernel::backward_weight<T>(cfull, rows(A.dl, E), G(tensor::ROUTER), {}, n, uh, E);
      } else {
        auto act = rows(A.act, uf), dz = rows(A.dz, uh), du = rows(A.du, uf);
        loom::linear_kernel::backward_weight<T>(act, dz, G(tensor::W2), {}, n, uf, uh);
        kernels::bias_backward(dz.data(), G(tensor::B2).data(), n, uh);
        loom::linear_kernel::backward_weight<T>(cfull, du, G(tensor::W1), G(tensor::B1), n, uh, uf);
      }
      kernels::ln_backward_weight(dc.data(), xhat2.data(), G(tensor::LN2G).data(), G(tensor::LN2B).data(), n, uh);
      loom::linear_kernel::backward_weight<T>(o, dy, G(tensor::WO), {}, n, uh, uh);
      kernels::bias_backward(dy.data(), G(tensor::BO).data(), n, uh);
      loom::linear_kernel::backward_weight<T>(afull, dqkv, G(tensor::WQKV), G(tensor::BQKV), n, uh, 3 * uh);
      kernels::ln_backward_weight(da.data(), xhat1.data(), G(tensor::LN1G).data(), G(tensor::LN1B).data(), n, uh);
    }
    auto f = rows(p.f, uh), df = rows(p.df, uh), xhatf = rows(p.xhatf, uh);
    if (m_.vocab_parallel == 0)  // else the output table's gradient is the layers' accumulator
      loom::linear_kernel::backward_weight<T>(f, rows(p.dlogits, uV), g[{tensor::WOUT, -1}], g[{tensor::BOUT, -1}], n, uh, uV);
    kernels::ln_backward_weight(df.data(), xhatf.data(), g[{tensor::LNFG, -1}].data(), g[{tensor::LNFB, -1}].data(), n, uh);
    return g;
  }

  //! An MoE block's branch on one sequence: routes the block's second layer norm `A.cfull` (every
  //! expert here, so the capacity is the sequence's own: with f > 0 the group's, with f = 0 its
  //! largest load, where the group's only pads), runs each expert on its slots and combines into `z`.
  void moe_forward(block_acts& A, int b, std::vector<T>& z) const {
    const loom::moe_options& o = m_.moe.o;
    const auto E = static_cast<std::size_t>(o.experts), uN = static_cast<std::size_t>(m_.seq), uh = static_cast<std::size_t>(m_.hidden),
               uf = static_cast<std::size_t>(m_.ffn);
    std::vector<T> logits(uN * E);
    loom::linear_kernel::forward<T>(A.cfull, P(tensor::ROUTER, b), {}, logits, uN, uh, E);
    A.R = loom::moe_route(o, std::span<const T>(logits));
    loom::set_capacity(A.R, o, A.R.max_load());
    const auto C = static_cast<std::size_t>(A.R.capacity);
    A.xin.assign(E * C * uh, T(0));
    A.eo.assign(E * C * uh, T(0));
    A.act.assign(E * C * uf, T(0));
    loom::moe_dispatch(A.R, std::span<const T>(A.cfull), std::span<T>(A.xin), uh, {});
    std::vector<T> u(C * uf);
    for (std::size_t e = 0; e < E; ++e) {
      const std::span<T> a(A.act.data() + e * C * uf, C * uf);
      loom::linear_kernel::forward<T>(std::span<const T>(A.xin).subspan(e * C * uh, C * uh), expert(tensor::EW1, b, e), expert(tensor::EB1, b, e), u,
                                      C, uh, uf);
      kernels::each(C * uf, kernels::tanh_elem<T>{u.data(), a.data()});
      loom::linear_kernel::forward<T>(std::span<const T>(a), expert(tensor::EW2, b, e), expert(tensor::EB2, b, e),
                                      std::span<T>(A.eo).subspan(e * C * uh, C * uh), C, uf, uh);
    }
    z.assign(uN * uh, T(0));
    loom::moe_combine(A.R, std::span<const T>(A.eo), std::span<T>(z), uh);
    A.aux = loom::moe_aux_loss(A.R);
  }
  //! The branch's backward for the gradient `g` of its output: `A.dc` the input's gradient (the
  //! experts' part plus the router's), `A.drows`, `A.du`, `A.dl` for the weight gradients. The
  //! auxiliary loss weighs `lambda / sequences`, `scale * seq` being 1 / sequences.
  void moe_backward(block_acts& A, int b, const std::vector<T>& g, double scale) const {
    const loom::moe_options& o = m_.moe.o;
    const auto E = static_cast<std::size_t>(o.experts), k = static_cast<std::size_t>(o.top_k), uN = static_cast<std::size_t>(m_.seq),
               uh = static_cast<std::size_t>(m_.hidden), uf = static_cast<std::size_t>(m_.ffn), C = static_cast<std::size_t>(A.R.capacity);
    std::vector<T> dgate(uN * k, T(0)), din(E * C * uh, T(0)), dx(uN * uh, T(0)), dxr(uN * uh, T(0));
    A.drows.assign(E * C * uh, T(0));
    A.du.assign(E * C * uf, T(0));
    loom::moe_combine_backward(A.R, std::span<const T>(A.eo), std::span<const T>(g), std::span<T>(A.drows), std::span<T>(dgate), uh, {});
    for (std::size_t e = 0; e < E; ++e) {
      const std::span<T> d(A.du.data() + e * C * uf, C * uf);
      loom::linear_kernel::backward_input<T>(std::span<const T>(A.drows).subspan(e * C * uh, C * uh), expert(tensor::EW2, b, e), d, C, uf, uh);
      kernels::each(C * uf, kernels::tanh_grad_elem<T>{A.act.data() + e * C * uf, d.data()});
      loom::linear_kernel::backward_input<T>(std::span<const T>(d), expert(tensor::EW1, b, e), std::span<T>(din).subspan(e * C * uh, C * uh), C, uh,
                                             uf);
    }
    loom::moe_dispatch_backward(A.R, std::span<const T>(din), std::span<T>(dx), uh, {});
    A.dl.assign(uN * E, T(0));
    const T aux_scale = static_cast<T>(scale * m_.seq);
    loom::moe_route_backward(A.R, o, std::span<const T>(dgate), static_cast<T>(m_.moe.lambda), std::span<T>(A.dl), &aux_scale);
    loom::linear_kernel::backward_input<T>(std::span<const T>(A.dl), P(tensor::ROUTER, b), std::span<T>(dxr), uN, uh, E);
    A.dc.resize(uN * uh);
    for (std::size_t i = 0; i < A.dc.size(); ++i) A.dc[i] = dx[i] + dxr[i];
  }
  //! Expert `e`'s part of expert tensor `t` of block `b` (its rows are consecutive).
  std::span<const T> expert(tensor t, int b, std::size_t e) const {
    const std::span<const T> all = P(t, b);
    const std::size_t part = all.size() / static_cast<std::size_t>(m_.moe.o.experts);
    return all.subspan(e * part, part);
  }
  //! The experts' weight gradients of one microbatch whose rows come from `sources` (the
  //! sequences of the ep replicas sharing the experts, in ep order): per expert one from-zero sum
  //! over the sources' slots, source-major, as the mesh's rows after the all-to-all.
  std::map<key, std::vector<T>> expert_grads(const std::vector<const pass*>& sources) const {
    const auto E = static_cast<std::size_t>(m_.moe.o.experts), uh = static_cast<std::size_t>(m_.hidden), uf = static_cast<std::size_t>(m_.ffn);
    std::map<key, std::vector<T>> g;
    for (int b = 0; b < m_.blocks; ++b) {
      if (!m_.moe.is_moe(b)) continue;
      for (tensor t : {tensor::EW1, tensor::EB1, tensor::EW2, tensor::EB2}) g[{t, b}].assign(params_.at({t, b}).size(), T(0));
      for (std::size_t e = 0; e < E; ++e) {
        std::vector<T> act, drows, xin, du;
        std::size_t n = 0;
        for (const pass* p : sources) {
          auto const& A = p->blocks[static_cast<std::size_t>(b)];
          const auto C = static_cast<std::size_t>(A.R.capacity);
          auto take = [&](std::vector<T>& to, const std::vector<T>& from, std::size_t width) {
            to.insert(to.end(), from.begin() + static_cast<std::ptrdiff_t>(e * C * width), from.begin() + static_cast<std::ptrdiff_t>((e + 1) * C * width));
          };
          take(act, A.act, uf), take(drows, A.drows, uh), take(xin, A.xin, uh), take(du, A.du, uf);
          n += C;
        }
        auto part = [&](tensor t, std::size_t size) { return std::span<T>(g[{t, b}]).subspan(e * size, size); };
        loom::linear_kernel::backward_weight<T>(act, drows, part(tensor::EW2, uh * uf), part(tensor::EB2, uh), n, uf, uh);
        loom::linear_kernel::backward_weight<T>(xin, du, part(tensor::EW1, uf * uh), part(tensor::EB1, uf), n, uh, uf);
      }
    }
    return g;
  }

  //! acc += g (from a zero accumulator: the pipeline's microbatch-ordered fold), for the tensors
  //! that are (partial) or are not (!partial) partial over the token groups.
  void fold(std::map<key, std::vector<T>>& acc, const std::map<key, std::vector<T>>& g, const reduction_order& ord,
            bool partial) const {
    for (auto const& [k, v] : g) {
      if (is_partial(ord, k.first) != partial) continue;
      auto& a = acc[k];
      if (a.empty()) a.assign(v.size(), 0.0);
      for (std::size_t i = 0; i < v.size(); ++i) a[i] += v[i];
    }
  }

  model_spec m_;
  std::map<key, std::vector<T>> params_;
  //! The vocabulary-parallel head: the step's accumulators of E and WOUT, added microbatch after
  //! microbatch by `run` (as the layers add), empty otherwise.
  mutable std::map<key, std::vector<T>> vocab_grad_;
  //! The parameters `run` reads instead of `params_` while it runs (an asynchronous rule's
  //! version), null otherwise: a copied model never points into another.
  mutable const std::map<key, std::vector<T>>* reading_ = nullptr;
  loom::adam<T> adam_{};
  bool use_adam_ = false;
  long adam_t_ = 0;  // steps taken (Adam's bias correction)
  std::vector<double> last_losses_;  // the last step's loss folds
  std::vector<std::vector<moe_record>> last_moe_;  // the last step's MoE records, per sequence
  std::map<key, std::pair<std::vector<T>, std::vector<T>>> moments_;  // Adam's m, v
};

//! The double-precision reference (the host stage's).
using reference_model = basic_reference_model<double>;

}  // namespace mesh_example
