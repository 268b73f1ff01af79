// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The vocabulary-parallel input and output layers (Yeung, Qi, Lin, Wan, "Balancing Pipeline
//! Parallelism with Vocabulary Parallelism", MLSys 2025) as patterns over users' kernels: every
//! rank holds the same contiguous rows of both tables (`vocab_shard`, from
//! `loom::split_vocabulary`), runs the passes of `loom/schedule/vocab.hpp` on them, and the
//! ranks exchange small per-token statistics instead of logits.
//!
//! Tokens are `n` per microbatch, hidden width `h`, the shard `rows` wide; the output table `W`
//! and the input table `E` are `[rows][h]` row-major on each rank; activations token-major.
//!
//! **Input layer.** `IF`: the shard's rows of the tokens it holds, zeros for the others
//! (`vocab_input_layer::forward`); the first stage's input is the sum of every rank's part, which
//! is exact (each token has one non-zero term), so it equals the unsplit lookup bit for bit.
//! `IB`: the shard's rows receive the tokens' gradients, in token order (`backward`), as the
//! unsplit scatter-add does to the same rows.
//!
//! **Output layer** (`vocab_output_layer`), with the online softmax of Milakov and Gimelshein
//! (2018) across shards; for token t with logits l over the whole vocabulary and target y:
//! - `S`: the shard's logits `l_r = X W_r^T` (the kernel's product), their maximum
//!   `m_r = max_v l_rv`, `s_r = sum_v exp(l_rv - m_r)` (in row order) and `z_r` = the target's
//!   logit if the shard holds it, else 0 (`statistics`); `e_rv = exp(l_rv - m_r)` stays in the
//!   pass's stash until `T`. The three per-token numbers are what a rank sends.
//! - combination (`combine`, every rank's statistics in rank order): `M = max_r m_r`,
//!   `sigma = sum_r s_r exp(m_r - M)` in rank order, `z = sum_r z_r`; the token's loss is
//!   `log(sigma) + M - z`, i.e. `-log softmax(l)_y`.
//! - `T`: with the per-token loss gradient `dl` (the loss scale), the logits' gradient
//!   `g_rv = (e_rv exp(m_r - M) / sigma - [v = y]) dl`, the shard's weight gradient
//!   `dW_r += g_r^T X` (the kernel) and, in Algorithm 1, the partial input gradient
//!   `dX_r = g_r W_r` (the kernel), summed over the ranks in rank order.
//! - Algorithm 2 (backward fusion) forms the input gradient in `S` instead, before the global
//!   statistics exist: `G_r = (e_r / s_r) W_r` and `Y_r = W_r[y]` (0 where the shard does not hold
//!   y); then `dX = dl (sum_r a_r G_r - sum_r Y_r)` with `a_r = s_r exp(m_r - M) / sigma`
//!   (`fused_input_gradient`), which is `g W` regrouped.
//!
//! Split sums are grouped by shard, so the results equal the unsplit layer up to rounding
//! (tests: 1e-12 relative in double), and are the same bits on every rank and every run. The
//! math is loom's own; the authors' implementation (`vocab_output.py` and `cross_entropy.py` in
//! sail-sg/VocabularyParallelism at 6191c3bf) was read for the pass split, not copied.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/exec/pattern_math.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "loom/exec/vocab_math.hpp"
#include "loom/stage/stage.hpp"
#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"

namespace loom {

//! One rank's rows of the vocabulary: ids `[first, first + rows)` of both tables, `hidden` wide.
struct vocab_shard {
  std::int64_t first = 0;   //!< the first vocabulary id the shard holds
  std::size_t rows = 0;     //!< ids held (padding rows included)
  std::size_t hidden = 0;   //!< h, the width of a row
  //! True when the shard holds id `v`.
  constexpr bool holds(std::int64_t v) const { return v >= first && v < first + static_cast<std::int64_t>(rows); }
  //! `m` over this shard: `n` tokens with ids (or targets) `ids`, the shard's width, rows and first id.
  template <class T, class I>
  constexpr vocab_items<T, I> items(const I* ids, std::size_t n, vocab_items<T, I> m) const {
    m.ids = ids;
    m.n = n;
    m.h = hidden;
    m.rows = rows;
    m.first = first;
    return m;
  }
};

//! The shard of rank `r` of `p` over a padded vocabulary of `padded` ids (`split_vocabulary`'s
//! `padded`), `hidden` wide; throws `config_error` when `padded` does not split into p equal shards.
inline vocab_shard shard_of(std::int64_t padded, int p, int r, std::size_t hidden) {
  if (p < 1 || r < 0 || r >= p || padded < p || padded % p != 0)
    throw config_error("vocabulary parallelism: a vocabulary of " + std::to_string(padded) + " ids does not split into " + std::to_string(p) +
                       " equal shards for rank " + std::to_string(r) + " (pad it with loom::split_vocabulary)");
  const std::int64_t rows = padded / p;
  return {.first = rows * r, .rows = static_cast<std::size_t>(rows), .hidden = hidden};
}

//! The per-token statistics of one shard (what `S` sends), `[3][n]`: the maxima `m`, the sums
//! `s` of `exp(l - m)`, the target logits `z` (0 where the shard does not hold the target).
template <class T>
struct vocab_statistics {
  std::span<T> data;  //!< `3 n` values: m, then s, then z
  std::size_t n = 0;  //!< tokens
  //! The maxima.
  std::span<T> m() const { return data.subspan(0, n); }
  //! The sums of exponentials.
  std::span<T> s() const { return data.subspan(n, n); }
  //! The target logits.
  std::span<T> z() const { return data.subspan(2 * n, n); }
  //! The same statistics, read-only.
  operator vocab_statistics<const T>() const
    requires(!std::is_const_v<T>)
  {
    return {data, n};
  }
};

namespace detail {

template <class I>
void check_targets(std::span<const I> targets, std::size_t n, const char* what) {
  if (targets.size() != n)
    throw config_error(std::string("vocabulary parallelism: ") + what + " got " + std::to_string(targets.size()) + " token ids for " +
                       std::to_string(n) + " tokens");
}

//! Runs every item of `step` with kernel `k`: its own `run` (a device kernel enqueues them), or a
//! host loop.
template <class K, class T, class I>
void vocab_run(const K& k, const vocab_items<T, I>& m, vocab_step step) {
  if constexpr (requires { k.run(m, step); }) k.run(m, step);
  else
    for (std::size_t i = 0, c = m.count(step); i < c; ++i) m(step, i);
}

//! True when kernel `K` declares `on_device = true`.
template <class K>
constexpr bool vocab_kernel_on_device() {
  if constexpr (requires { K::on_device; }) return K::on_device;
  else return false;
}
//! True when kernel `K` runs on a device (`loom::cuda::vocab_kernel`): the layers then keep their
//! buffers in device memory (`K::buffer`) and the token ids are copied there each step.
template <class K>
inline constexpr bool vocab_on_device = vocab_kernel_on_device<K>();

//! The owning buffer of `U` the layers use with kernel `K`: `K::buffer<U>` on a device, a vector on the host.
template <class K, class U>
struct vocab_store {
  using type = std::vector<U>;  //!< host memory, zeroed
};
//! A device kernel's buffers.
template <class K, class U>
  requires vocab_on_device<K>
struct vocab_store<K, U> {
  using type = typename K::template buffer<U>;  //!< device memory
};

}  // namespace detail

//! The vocabulary-parallel input layer on one shard (see the file comment).
struct vocab_input_layer {
  vocab_shard shard;  //!< the rows this rank holds

  //! `IF`: `part[t] = E[ids[t] - first]` for the tokens the shard holds, 0 for the others
  //! (`part` `[n][h]`, `table` `[rows][h]`).
  template <class T, class I>
  void forward(std::span<const I> ids, std::span<const T> table, std::span<T> part) const {
    detail::check_targets(ids, part.size() / shard.hidden, "the input layer");
    detail::vocab_run(linear_kernel{}, shard.items<T, I>(ids.data(), ids.size(), {.table = table.data(), .out = part.data()}), vocab_step::embed);
  }
  //! `IB`: `grad[ids[t] - first] += d[t]` for the tokens the shard holds, in token order.
  template <class T, class I>
  void backward(std::span<const I> ids, std::span<const T> d, std::span<T> grad) const {
    detail::check_targets(ids, d.size() / shard.hidden, "the input layer's backward");
    detail::vocab_run(linear_kernel{}, shard.items<T, I>(ids.data(), ids.size(), {.x = d.data(), .out = grad.data()}), vocab_step::embed_grad);
  }
};

//! The vocabulary-parallel output layer with the cross-entropy loss on one shard (see the file
//! comment). `Kernel` computes the three products (`linear_kernel`'s signatures) and, when it
//! has a `run` (`loom::cuda::vocab_kernel`), the per-token and per-logit steps (`vocab_items`);
//! otherwise they run in host loops. Either way the same items in the same order.
template <class Kernel = linear_kernel>
struct vocab_output_layer {
  vocab_shard shard;  //!< the rows this rank holds
  Kernel kernel{};    //!< the shard's products (a device kernel carries its stream)

  //! Elements of `S`'s stash per microbatch of `n` tokens: the exponentials `e`, `[n][rows]`.
  std::size_t stash_size(std::size_t n) const { return n * shard.rows; }

  //! `S`: the shard's logits of `x` (`[n][h]`) into `e` (`[n][rows]`, left holding
  //! `exp(l - m)`), and the statistics `st` against the targets.
  template <class T, class I>
  void forward(std::span<const T> x, std::type_identity_t<std::span<const T>> w, std::span<const I> targets, std::type_identity_t<std::span<T>> e,
               std::type_identity_t<vocab_statistics<T>> st) const {
    const std::size_t n = st.n, rows = shard.rows;
    detail::check_targets(targets, n, "the output layer");
    kernel.forward(x, w, std::span<const T>{}, e, n, shard.hidden, rows);
    detail::vocab_run(kernel, shard.items<T, I>(targets.data(), n, {.e = e.data(), .own = st.data.data()}), vocab_step::statistics);
  }

  //! Every rank's statistics (`all[r]`, rank order) into the global ones `out` (m: the maximum M,
  //! s: sigma, z: the target's logit); returns nothing, see `loss`.
  template <class T>
  static void combine(std::span<const vocab_statistics<T>> all, std::type_identity_t<vocab_statistics<T>> out) {
    const std::size_t n = out.n;
    for (std::size_t t = 0; t < n; ++t) {
      T big = all[0].m()[t];
      for (std::size_t r = 1; r < all.size(); ++r) big = device_math::max(big, all[r].m()[t]);
      T sigma{}, z{};
      for (std::size_t r = 0; r < all.size(); ++r) {
        sigma += all[r].s()[t] * device_math::exp(all[r].m()[t] - big);
        z += all[r].z()[t];
      }
      out.m()[t] = big;
      out.s()[t] = sigma;
      out.z()[t] = z;
    }
  }

  //! The sum over the tokens of `-log softmax(l)_y` from the global statistics, in token order.
  template <class T>
  static std::remove_const_t<T> loss(vocab_statistics<T> global) {
    std::remove_const_t<T> sum{};
    for (std::size_t t = 0; t < global.n; ++t) sum += device_math::log(global.s()[t]) + global.m()[t] - global.z()[t];
    return sum;
  }

  //! `T`: turns `e` (as `forward` left it) into the logits' gradient `g` scaled by `dl`, adds the
  //! shard's weight gradient `g^T x` into `gw` (`[rows][h]`) and, when `dx` is not empty
  //! (Algorithm 1), writes the shard's partial input gradient `g w` there (`[n][h]`).
  template <class T, class I>
  void backward(std::span<const T> x, std::type_identity_t<std::span<const T>> w, std::span<const I> targets, std::type_identity_t<std::span<T>> e,
                std::type_identity_t<vocab_statistics<const T>> own, std::type_identity_t<vocab_statistics<const T>> global, std::type_identity_t<T> dl,
                std::type_identity_t<std::span<T>> gw, std::type_identity_t<std::span<T>> dx) const {
    const std::size_t n = global.n, rows = shard.rows;
    detail::check_targets(targets, n, "the output layer's backward");
    detail::vocab_run(kernel,
                      shard.items<T, I>(targets.data(), n, {.global = global.data.data(), .e = e.data(), .own = const_cast<T*>(own.data.data()), .dl = dl}),
                      vocab_step::logit_grad);
    const std::span<const T> g(e.data(), e.size());
    kernel.backward_weight(x, g, gw, std::span<T>{}, n, shard.hidden, rows);
    if (!dx.empty()) kernel.backward_input(g, w, dx, n, shard.hidden, rows);
  }

  //! Algorithm 2's part of `S`: `gpart = (e / s) w` and `ypart = w[y]` (0 where the shard does not
  //! hold y), both `[n][h]`; `scratch` holds `[n][rows]` elements.
  template <class T, class I>
  void input_gradient_parts(std::span<const T> w, std::span<const I> targets, std::type_identity_t<std::span<const T>> e,
                            std::type_identity_t<vocab_statistics<const T>> own, std::type_identity_t<std::span<T>> scratch,
                            std::type_identity_t<std::span<T>> gpart, std::type_identity_t<std::span<T>> ypart) const {
    const std::size_t n = own.n, rows = shard.rows, h = shard.hidden;
    detail::vocab_run(kernel, shard.items<T, I>(targets.data(), n, {.e = const_cast<T*>(e.data()), .own = const_cast<T*>(own.data.data()), .out = scratch.data()}),
                      vocab_step::scale_rows);
    kernel.backward_input(std::span<const T>(scratch.data(), scratch.size()), w, gpart, n, h, rows);
    detail::vocab_run(kernel, shard.items<T, I>(targets.data(), n, {.table = w.data(), .out = ypart.data()}), vocab_step::embed);
  }

  //! Algorithm 2's input gradient from every rank's parts and statistics (rank order):
  //! `dx = dl (sum_r a_r gpart_r - sum_r ypart_r)`, `a_r = s_r exp(m_r - M) / sigma`.
  template <class T>
  static void fused_input_gradient(std::span<const std::span<const T>> gparts, std::span<const std::span<const T>> yparts,
                                   std::span<const vocab_statistics<T>> all, std::type_identity_t<vocab_statistics<const T>> global,
                                   std::type_identity_t<T> dl, std::type_identity_t<std::span<T>> dx) {
    const std::size_t n = global.n, h = dx.size() / n;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < h; ++i) {
        T a{}, y{};
        for (std::size_t r = 0; r < all.size(); ++r) {
          const T alpha = all[r].s()[t] * device_math::exp(all[r].m()[t] - global.m()[t]) / global.s()[t];
          a += alpha * gparts[r][t * h + i];
          y += yparts[r][t * h + i];
        }
        dx[t * h + i] = (a - y) * dl;
      }
  }

  //! Algorithm 1's input gradient: the ranks' partial gradients summed in rank order, into `dx`.
  template <class T>
  static void sum_input_gradient(std::span<const std::span<const T>> parts, std::type_identity_t<std::span<T>> dx) {
    for (std::size_t k = 0; k < dx.size(); ++k) {
      T s{};
      for (auto const& p : parts) s += p[k];
      dx[k] = s;
    }
  }
};

//! Where a rank's vocabulary layers sit in a vocabulary-parallel pipeline: what `loom::pipeline`
//! tells `vocab_layers::bind` once, when it is built.
struct vocab_binding {
  int rank = 0;             //!< this rank (= its shard)
  int ranks = 1;            //!< p, the shards
  int microbatches = 1;     //!< m
  int last = 0;             //!< the rank of the last transformer stage (L)
  int first = 0;            //!< the rank of the first transformer stage (F)
  int algorithm = 1;        //!< 1 or 2 (`schedule::vocab`)
  double scale = 1;         //!< the loss scale `dl` (1/m for a mean)
  std::size_t last_output = 0;  //!< elements of the last stage's output on L (0 elsewhere)
  std::size_t first_input = 0;  //!< elements of the first stage's input on F (0 elsewhere)
  CUstream_st* stream = nullptr;  //!< device pipelines: the rank's compute stream, where the layers enqueue
  //! The most `S` stashes live at once on this rank (an `S` opens one, its `T` closes it; the
  //! pipeline counts them in the rank's program); 0: one per microbatch.
  int stash_slots = 0;
};

//! One rank's vocabulary layers in a vocabulary-parallel pipeline (`1f1b-vocab-1`, `-2`,
//! `v-half-vocab-1`, `-2`; docs/vocab.md): its shard of the output table and of the input
//! embedding, their gradient accumulators, and the step's token ids and targets. Build a
//! `loom::pipeline` with it (`pipeline(s, comm, make_stage, layers)`); the pipeline then runs the
//! passes where the program says and moves their messages (`lower`):
//! - `IF`: the shard's embedding rows of the microbatch's tokens (`vocab_input_layer`), sent to
//!   the first stage's rank, which sums the p parts in rank order into the first stage's input;
//! - `S`: the output layer's forward part on the last stage's output (`vocab_output_layer`), its
//!   statistics sent to every rank; Algorithm 2 also forms the parts of the input gradient;
//! - `T`: every rank's statistics combined in rank order, the shard's weight gradient added into
//!   `output_grad`; Algorithm 1 also forms the shard's part of the input gradient;
//! - the last stage's backward starts from the sum of the p parts (Algorithm 1) or from the fused
//!   form (Algorithm 2), in rank order; the microbatch's loss is the sum over its tokens of
//!   `-log softmax`;
//! - `IB`: the first stage's input gradient, received, scattered into `input_grad`.
//! Every sum runs in a fixed order (ranks, then microbatches: `T` and `IB` run in microbatch
//! order), so the gradients are the same bits on every run and both algorithms agree with each
//! other within rounding. The stages see an ordinary pipeline: the first stage's input is the
//! embedding `[n][h]`, the last stage's output is the hidden state `[n][h]` (not loss terms).
//!
//! Backends. With a host `Kernel` (`linear_kernel`, the default) the layers run in host loops on
//! threads and MPI. With `loom::cuda::vocab_kernel` (`loom/cuda/patterns.hpp`) they run on the
//! device path (`cuda_local`, `nccl`, eager or replayed from a CUDA graph): the tables, the
//! accumulators and every buffer are device memory, each step is one of loom's kernels enqueued
//! on the pipeline's compute stream inside a region naming what it reads and writes (the
//! simulator's race detector checks them against the messages' transfers), and the token ids are
//! copied to the device before each step (`set_batch` still takes host ids). The items are the
//! same (`vocab_items`), so host and simulated device give the same bits.
//! Memory: the messages are held per microbatch for the step (`m (p (3 n + 3 n h) + 3 n + 3 n h)`
//! elements at most); the `S` stash (`n rows` elements, the largest) only from `S` to its `T`, in
//! as many slots as the program keeps open at once (`vocab_binding::stash_slots`; one for the
//! four families at every p and m tried, as the paper's memory model says); the transformer stages' buffers follow the buffer plan as usual.
template <class T, class Kernel = linear_kernel, class Id = std::int64_t>
class vocab_layers {
  static constexpr bool device = detail::vocab_on_device<Kernel>;
  template <class U>
  using store = typename detail::vocab_store<Kernel, U>::type;

 public:
  using value_type = T;  //!< element type of the tables and messages
  using id_type = Id;    //!< token id type
  //! True when the layers run on a device (`Kernel` is `loom::cuda::vocab_kernel`).
  static constexpr bool on_device = device;

  //! The layers of one rank: `shard` (from `shard_of`), `tokens` n per microbatch, the shard's
  //! tables `[rows][h]` and their gradient accumulators (zeroed by the pipeline at each step's
  //! start, then added to; device memory with a device `Kernel`); `kernel` computes the output
  //! layer's products (a device kernel gets the pipeline's stream in `bind`).
  vocab_layers(vocab_shard shard, std::size_t tokens, std::span<const T> output_table, std::span<const T> input_table,
               std::span<T> output_grad, std::span<T> input_grad, Kernel kernel = {})
      : out_{shard, kernel}, n_(tokens), w_(output_table), e_table_(input_table), gw_(output_grad), ge_(input_grad) {
    const std::size_t want = shard.rows * shard.hidden;
    auto check = [&](std::size_t got, const char* what) {
      if (got != want)
        throw config_error(std::string("vocabulary layers: the ") + what + " has " + std::to_string(got) + " elements, but the shard holds " +
                           std::to_string(shard.rows) + " rows x " + std::to_string(shard.hidden) + " = " + std::to_string(want));
    };
    if (tokens == 0 || shard.rows == 0 || shard.hidden == 0) throw config_error("vocabulary layers: tokens, rows and hidden must be positive");
    check(output_table.size(), "output table");
    check(input_table.size(), "input table");
    check(output_grad.size(), "output table's gradient");
    check(input_grad.size(), "input table's gradient");
  }

  //! The step's token ids and targets, `m n` each, microbatch-major, in host memory; set before
  //! every step (the spans must stay valid during it). Every rank passes the same.
  void set_batch(std::span<const Id> ids, std::span<const Id> targets) {
    ids_ = ids;
    targets_ = targets;
  }
  //! Weighs every token's loss term by `w` in the objective (default 1): the loss gradient `dl` of
  //! `T` and of the fused input gradient becomes the pipeline's loss scale times `w`, and
  //! `losses` reports each microbatch's sum times `w`. A model whose objective is the mean over
  //! the step's `m n` tokens builds its pipeline with `loss_scaling::sum` and sets `1 / (m n)`.
  //! Throws `config_error` unless `w` is finite and positive.
  void loss_weight(double w) {
    if (!(w > 0) || !std::isfinite(w)) throw config_error("vocabulary layers: the loss weight must be finite and positive (got " + std::to_string(w) + ")");
    weight_ = w;
  }
  //! The loss weight (`loss_weight`).
  double loss_weight() const { return weight_; }
  //! The shard.
  const vocab_shard& shard() const { return out_.shard; }
  //! Tokens per microbatch.
  std::size_t tokens() const { return n_; }
  //! The summed statistics of microbatch `mb` after the step (every rank holds them; device
  //! memory with a device `Kernel`).
  vocab_statistics<const T> global(int mb) const { return {std::span<const T>(global_.data(), global_.size()).subspan(uz(mb) * 3 * n_, 3 * n_), n_}; }

  // ---- what loom::pipeline calls --------------------------------------------------------------

  //! Called once by the pipeline: checks the stages' sizes against the layers' and allocates
  //! the per-microbatch buffers; throws `config_error` naming the mismatch.
  void bind(const vocab_binding& b) {
    const std::size_t nh = n_ * shard().hidden;
    if (static_cast<std::int64_t>(b.rank) * static_cast<std::int64_t>(shard().rows) != shard().first)
      throw config_error("vocabulary layers: rank " + std::to_string(b.rank) + " holds the shard starting at id " + std::to_string(shard().first) +
                         ", but shard " + std::to_string(b.rank) + " starts at " + std::to_string(b.rank * static_cast<std::int64_t>(shard().rows)) +
                         " (build it with loom::shard_of for this rank)");
    if (b.rank == b.last && b.last_output != nh)
      throw config_error("vocabulary layers: the last stage produces " + std::to_string(b.last_output) + " elements per microbatch, but the output layer takes " +
                         std::to_string(n_) + " tokens x " + std::to_string(shard().hidden) + " = " + std::to_string(nh));
    if (b.rank == b.first && b.first_input != nh)
      throw config_error("vocabulary layers: the first stage takes " + std::to_string(b.first_input) + " elements per microbatch, but the embedding gives " +
                         std::to_string(n_) + " tokens x " + std::to_string(shard().hidden) + " = " + std::to_string(nh));
    b_ = b;
    if constexpr (device) out_.kernel.stream = b.stream;
    const std::size_t M = uz(b.microbatches), P = uz(b.ranks), gw = b.algorithm == 2 ? 2 * nh : nh;
    x_ = store<T>(M * nh);
    stats_ = store<T>(M * P * 3 * n_);
    global_ = store<T>(M * 3 * n_);
    const std::size_t slots = b.stash_slots > 0 ? std::min(M, uz(b.stash_slots)) : M;
    e_ = store<T>(slots * n_ * shard().rows);
    free_slots_.clear();
    for (std::size_t k = slots; k-- > 0;) free_slots_.push_back(static_cast<int>(k));
    slot_of_.assign(M, -1);
    grad_ = store<T>(M * P * gw);
    embed_ = store<T>(M * P * nh);
    input_ = store<T>(b.rank == b.first ? M * nh : 0);
    dembed_ = store<T>(M * nh);
    dx_ = store<T>(b.rank == b.last ? nh : 0);
    scratch_ = store<T>(b.algorithm == 2 ? n_ * shard().rows : 0);
    if constexpr (device) {
      ids_dev_ = store<Id>(M * n_);
      targets_dev_ = store<Id>(M * n_);
      host_global_.assign(M * 3 * n_, T{});
      const std::string r = "r" + std::to_string(b.rank) + " vocabulary ";
      for (auto [p, what] : {std::pair<const void*, const char*>{x_.data(), "last stage's outputs (vx)"}, {stats_.data(), "statistics (vstat)"},
                             {global_.data(), "combined statistics"}, {e_.data(), "logits (S stash)"}, {grad_.data(), "input gradient parts (vgrad)"},
                             {embed_.data(), "embedding parts (vemb)"}, {input_.data(), "first stage's inputs"},
                             {dembed_.data(), "first stage's input gradients (vdemb)"}, {dx_.data(), "output gradient"},
                             {scratch_.data(), "scaled logits"}, {ids_dev_.data(), "token ids"}, {targets_dev_.data(), "targets"}})
        if (p != nullptr) Kernel::name(p, r + what);
    }
    combined_.assign(M, 0);
  }
  //! Before each step, outside any CUDA graph capture: checks the batch set by `set_batch` and,
  //! on a device, copies it to device memory (a blocking copy: the previous step has ended);
  //! returns why the batch cannot run, or "" (the ids are then not copied).
  std::string load_batch() {
    const std::size_t want = uz(b_.microbatches) * n_;
    if (ids_.size() != want || targets_.size() != want)
      return "vocabulary layers: the batch has " + std::to_string(ids_.size()) + " token ids and " + std::to_string(targets_.size()) +
             " targets, but the step needs " + std::to_string(b_.microbatches) + " microbatches x " + std::to_string(n_) + " tokens = " +
             std::to_string(want) + " of each (set_batch)";
    const std::int64_t V = static_cast<std::int64_t>(shard().rows) * b_.ranks;
    for (std::size_t i = 0; i < want; ++i)
      for (Id v : {ids_[i], targets_[i]})
        if (static_cast<std::int64_t>(v) < 0 || static_cast<std::int64_t>(v) >= V)
          return "vocabulary layers: token " + std::to_string(i % n_) + " of microbatch " + std::to_string(i / n_) + " names id " +
                 std::to_string(static_cast<std::int64_t>(v)) + ", outside the vocabulary of " + std::to_string(V) + " ids";
    if constexpr (device) {
      out_.kernel.upload(std::span<Id>(ids_dev_.data(), want), ids_);
      out_.kernel.upload(std::span<Id>(targets_dev_.data(), want), targets_);
    }
    return {};
  }
  //! At a step's start (on a device: enqueued, inside the capture in graph mode): zeroes the
  //! accumulators.
  void begin_step() {
    for (std::span<T> g : {gw_, ge_}) {
      if constexpr (device) out_.kernel.fill(g, T{});
      else std::fill(g.begin(), g.end(), T{});
    }
    std::fill(combined_.begin(), combined_.end(), 0);
    for (int& k : slot_of_)  // a failed step may have left stashes open
      if (k >= 0) {
        free_slots_.push_back(k);
        k = -1;
      }
    std::sort(free_slots_.begin(), free_slots_.end(), std::greater<>());  // slot 0 first, every step the same
  }
  //! `S` stashes the layers hold (each `n rows` elements): the most live at once on this rank.
  std::size_t stash_slots() const { return e_.size() / (n_ * shard().rows); }
  //! The buffer of message `w` of microbatch `mb` sent by rank `from` (`lower`'s items): what a
  //! send reads and a receive writes.
  std::span<T> message(payload w, int mb, int from) {
    const std::size_t nh = n_ * shard().hidden, P = uz(b_.ranks), m = uz(mb), r = uz(from);
    switch (w) {
      case payload::vocab_output: return span(x_).subspan(m * nh, nh);
      case payload::vocab_stats: return span(stats_).subspan((m * P + r) * 3 * n_, 3 * n_);
      case payload::vocab_grad: return span(grad_).subspan((m * P + r) * grad_width(), grad_width());
      case payload::vocab_embed: return span(embed_).subspan((m * P + r) * nh, nh);
      case payload::vocab_embed_grad: return span(dembed_).subspan(m * nh, nh);
      default: throw config_error("vocabulary layers: " + std::string(short_name(w)) + " is not a vocabulary message");
    }
  }
  //! `IF(mb)`: the shard's part of the embedding.
  void forward_input(int mb) {
    run(items(ids_of(mb), {.table = e_table_.data(), .out = message(payload::vocab_embed, mb, b_.rank).data()}), vocab_step::embed);
  }
  //! On the first stage's rank, before `F(0, mb)`: the p parts summed in rank order.
  void gather_input(int mb) {
    run(items(nullptr, {.parts = message(payload::vocab_embed, mb, 0).data(), .out = first_input(mb).data(), .ranks = uz(b_.ranks),
                        .stride = n_ * shard().hidden}),
        vocab_step::sum_parts);
  }
  //! The first stage's input of `mb` (after `gather_input`).
  std::span<T> first_input(int mb) {
    const std::size_t nh = n_ * shard().hidden;
    return span(input_).subspan(uz(mb) * nh, nh);
  }
  //! `S(mb)`: logits, exponentials and statistics of the shard; Algorithm 2 also the parts of the
  //! input gradient.
  void forward_output(int mb) {
    if (free_slots_.empty())
      throw config_error("vocabulary layers: S of microbatch " + std::to_string(mb) + " finds its " + std::to_string(stash_slots()) +
                         " stash slots taken (the program opens more S before their T than bind was told)");
    slot_of_[uz(mb)] = free_slots_.back();
    free_slots_.pop_back();
    std::span<T> own = message(payload::vocab_stats, mb, b_.rank), e = stash(mb);
    const std::size_t n = n_, h = shard().hidden, rows = shard().rows;
    out_.kernel.forward(std::span<const T>(message(payload::vocab_output, mb, b_.last)), w_, std::span<const T>{}, e, n, h, rows);
    run(items(targets_of(mb), {.e = e.data(), .own = own.data()}), vocab_step::statistics);
    if (b_.algorithm == 2) {
      std::span<T> parts = message(payload::vocab_grad, mb, b_.rank), sc = span(scratch_);
      run(items(targets_of(mb), {.e = e.data(), .own = own.data(), .out = sc.data()}), vocab_step::scale_rows);
      out_.kernel.backward_input(std::span<const T>(sc), w_, parts.subspan(0, n * h), n, h, rows);
      run(items(targets_of(mb), {.table = w_.data(), .out = parts.data() + n * h}), vocab_step::embed);
    }
  }
  //! `T(mb)`: the shard's weight gradient with the global statistics; Algorithm 1 also its part of
  //! the input gradient.
  void backward_output(int mb) {
    combine(mb);
    std::span<T> e = stash(mb);
    const std::size_t n = n_, h = shard().hidden, rows = shard().rows;
    run(items(targets_of(mb), {.global = global(mb).data.data(), .e = e.data(), .own = message(payload::vocab_stats, mb, b_.rank).data(),
                               .dl = dl()}),
        vocab_step::logit_grad);
    const std::span<const T> g(e), x(message(payload::vocab_output, mb, b_.last));
    out_.kernel.backward_weight(x, g, gw_, std::span<T>{}, n, h, rows);
    if (b_.algorithm == 1) out_.kernel.backward_input(g, w_, message(payload::vocab_grad, mb, b_.rank), n, h, rows);
    // The stash is free for a later S: on a device its kernels follow these in stream order.
    free_slots_.push_back(slot_of_[uz(mb)]);
    slot_of_[uz(mb)] = -1;
  }
  //! On the last stage's rank, before its backward of `mb`: the gradient of the scaled loss with
  //! respect to the last stage's output (valid until the next call).
  std::span<const T> output_gradient(int mb) {
    if (b_.algorithm == 1) {
      run(items(nullptr, {.parts = message(payload::vocab_grad, mb, 0).data(), .out = span(dx_).data(), .ranks = uz(b_.ranks), .stride = grad_width()}),
          vocab_step::sum_parts);
    } else {
      combine(mb);
      run(items(nullptr, {.stats = message(payload::vocab_stats, mb, 0).data(), .global = global(mb).data.data(),
                          .parts = message(payload::vocab_grad, mb, 0).data(), .out = span(dx_).data(), .ranks = uz(b_.ranks),
                          .stride = grad_width(), .dl = dl()}),
          vocab_step::fused_grad);
    }
    return span(dx_);
  }
  //! `IB(mb)`: the first stage's input gradient scattered into the shard's rows.
  void backward_input(int mb) {
    run(items(ids_of(mb), {.x = message(payload::vocab_embed_grad, mb, b_.first).data(), .out = ge_.data()}), vocab_step::embed_grad);
  }
  //! After a step on the last stage's rank: the loss of every microbatch (its sum over the tokens,
  //! times `loss_weight`) into `losses` (on a device, the combined statistics are copied to the
  //! host first: the step has ended).
  void losses(std::span<double> losses) {
    std::span<const T> g(global_.data(), global_.size());
    if constexpr (device) {
      out_.kernel.download(std::span<T>(host_global_), g);
      g = host_global_;
    }
    for (std::size_t mb = 0; mb < losses.size() && mb < uz(b_.microbatches); ++mb)
      losses[mb] = static_cast<double>(vocab_output_layer<Kernel>::loss(vocab_statistics<const T>{g.subspan(mb * 3 * n_, 3 * n_), n_})) * weight_;
  }

 private:
  static std::size_t uz(int v) { return static_cast<std::size_t>(v); }
  template <class B>
  static auto span(B& b) {
    return std::span(b.data(), b.size());
  }
  //! The loss gradient of one token: the pipeline's scale times the loss weight.
  T dl() const { return static_cast<T>(b_.scale * weight_); }
  std::size_t grad_width() const { return b_.algorithm == 2 ? 2 * n_ * shard().hidden : n_ * shard().hidden; }
  //! Token ids or targets of `mb` where the kernels read them (device memory on a device).
  const Id* ids_of(int mb) const {
    if constexpr (device) return ids_dev_.data() + uz(mb) * n_;
    else return ids_.data() + uz(mb) * n_;
  }
  const Id* targets_of(int mb) const {
    if constexpr (device) return targets_dev_.data() + uz(mb) * n_;
    else return targets_.data() + uz(mb) * n_;
  }
  vocab_items<T, Id> items(const Id* ids, vocab_items<T, Id> m) const { return shard().items(ids, n_, m); }
  void run(const vocab_items<T, Id>& m, vocab_step step) const { detail::vocab_run(out_.kernel, m, step); }
  //! The stash slot `S(mb)` took (`forward_output`), until `T(mb)` frees it.
  std::span<T> stash(int mb) {
    const int k = slot_of_[uz(mb)];
    if (k < 0) throw config_error("vocabulary layers: T of microbatch " + std::to_string(mb) + " before its S (no stash)");
    return span(e_).subspan(uz(k) * n_ * shard().rows, n_ * shard().rows);
  }
  //! Every rank's statistics of `mb`, combined in rank order, once.
  void combine(int mb) {
    if (combined_[uz(mb)]) return;
    run(items(nullptr, {.stats = message(payload::vocab_stats, mb, 0).data(), .out = span(global_).data() + uz(mb) * 3 * n_, .ranks = uz(b_.ranks)}),
        vocab_step::combine);
    combined_[uz(mb)] = 1;
  }

  vocab_output_layer<Kernel> out_;
  std::size_t n_ = 0;
  std::span<const T> w_, e_table_;
  std::span<T> gw_, ge_;
  std::span<const Id> ids_, targets_;
  vocab_binding b_{};
  double weight_ = 1;  // the loss weight of every token (`loss_weight`)
  store<T> x_, stats_, global_, e_, grad_, embed_, input_, dembed_, dx_, scratch_;
  store<Id> ids_dev_, targets_dev_;  // device: the batch's ids and targets (unused on the host)
  std::vector<T> host_global_;       // device: the combined statistics copied back for the losses
  std::vector<char> combined_;
  std::vector<int> free_slots_;  // stash slots no S holds, the next to take last
  std::vector<int> slot_of_;     // per microbatch: the stash slot its S took, or -1
};

}  // namespace loom
