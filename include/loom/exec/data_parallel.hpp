// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::data_parallel`: gradient synchronisation of a pipeline's stages across the data-parallel
//! replicas of a mesh (and across the tensor- or sequence-parallel ranks that hold partial sums of
//! a gradient), in buckets launched as soon as their gradients are final, and the optimizer step
//! after every rank agreed the step succeeded. It is a `loom::step_observer`: pass it in
//! `pipeline_options::observer`, then `attach` the pipeline.
//!
//! Buckets (PyTorch DDP, Li et al., VLDB 2020, §3.2.3). The parameters of this rank's stages are
//! packed into buckets of at most `bucket_bytes` (default 25 MB, DDP's `bucket_cap_mb`), in the
//! order in which the stages' gradients become final in the rank's program (the position of each
//! stage's last `W` or `BW` action). A bucket's reduction is launched, non-blocking, as soon as
//! every stage with parameters in it has run its last weight-gradient action of the step
//! (`step_observer::gradients_ready`) and the sends that directly follow that action in the
//! program were posted (the input gradient it produced is on the pipeline's critical path; a
//! bucket posted before it would delay it), so it overlaps the rest of the pipeline's tail: the eager
//! gradient synchronisation of BitPipe (Wu et al., 2024, §3.3) and of the Zero Bubble paper's
//! pipelines (Qi et al., ICLR 2024), where stages whose last `W` comes early (later virtual
//! stages on interleaved and V placements, later pipeline ranks) synchronise while the others
//! still compute. Buckets of one group launch in order, so every rank of the group posts the
//! same collectives in the same order. With `eager = false` every bucket is launched after the
//! step instead (for comparison). Between the pipeline's actions the in-flight reductions are
//! tested, which is what progresses them on MPI.
//!
//! Groups. A gradient element is reduced over the data-parallel group, and over the ranks of
//! the extra dimensions its stage declares partial (`grad_range::partial_over`): with the sequence
//! split over `sp` (Ulysses, ring attention, USP) every rank computes the gradient of its tokens
//! only, so the sum runs over `dp x sp`; with Megatron-SP the replicated parameters (layer norms,
//! biases after the row-parallel layers) are partial over `tp`. Stages that do not say anything
//! are reduced over `dp`. The groups `dp`, `dp x tp`, `dp x sp`, `dp x tp x sp` are created (with
//! `split`) on every rank in that order when the reducer is built.
//!
//! Expert parallelism (`loom::ep`, the expert-data layout of Megatron-core and DeepSpeed-MoE).
//! Ranks that differ in `ep` hold different tokens, so a dense parameter's gradient is a partial
//! sum over `ep` as over `dp`: it is reduced over `dp x ep` (times its partial dimensions). A range
//! marked `grad_range::expert` belongs to experts this rank holds alone in its `ep` group: it is
//! reduced over `dp` (times its partial dimensions) and never over `ep`. On a mesh with more than
//! one `ep` rank the reducer adds the four expert groups `dp`, `dp x tp`, `dp x sp`,
//! `dp x tp x sp` after `dp x ep`, `dp x ep x tp`, `dp x ep x sp`, `dp x ep x tp x sp` (eight
//! groups, in that order); with one `ep` rank both kinds of ranges share the first four groups,
//! the `expert` mark changes nothing and no group is added. Under local SGD the replica is
//! `ep x tp x sp x pp`: dense gradients are still reduced over `ep` every step, expert gradients
//! are not reduced, and both are averaged over `dp` every `H` steps.
//!
//! ZeRO (Rajbhandari et al., SC 2020, §5), `zero_stage = 1, 2, 3` (`sharded = true` is stage 2).
//! Every bucket is padded to a multiple of the group size `n`; rank `r` owns elements
//! `[r k, (r + 1) k)` of it (`k = padded / n`), updates only those with the optimizer (so a
//! stateful optimizer's moments cover 1/n of the parameters) and all-gathers the updated shards.
//! - **Stage 1** (optimizer state sharded, as PyTorch's `ZeroRedundancyOptimizer`,
//!   `torch/distributed/optim/zero_redundancy_optimizer.py`): the bucket is all-reduced as without
//!   ZeRO, every rank keeps the whole reduced gradient and updates its shard from its slice; the
//!   parameters' all-gather comes on top: 1.5 times the bytes of plain data parallelism.
//! - **Stage 2** (gradients sharded too): the bucket is reduce-scattered, each rank holds the
//!   reduced gradient of its shard only. A reduce-scatter plus an all-gather move exactly the bytes
//!   of one all-reduce (tests check it with the counters).
//!
//! In stages 1 and 2 the all-gathers are launched at the end of the step and waited for just
//! before the first action of a stage in the next step (`before_first_use`): prefetched, they
//! overlap the start of the next step. Call `finish()` before reading the parameters outside a step.
//!
//! - **Stage 3** (parameters sharded, ZeRO-3 / FSDP, Zhao et al., VLDB 2023): between steps a rank
//!   holds only its shards of the parameters (`parameters_held()` counts them); the stages give
//!   up their own storage (`releasable_stage`: `release_params()` / `acquire_params()`). Before the
//!   first action of a local stage in a step its buckets are all-gathered into a transient full
//!   buffer, the stage's storage is acquired and filled, and the gather of the next local stage (in
//!   first-use order) is started (prefetched one ahead); the full buffer is freed once every stage
//!   in it is filled. After the stage's last weight-gradient action (`gradients_ready`) its
//!   storage is released again; the step's end releases any stage still holding (a failed step).
//!   Gradients are reduce-scattered as in stage 2 and the optimizer updates the shard in place; no
//!   gather at the step's end. Per step the parameters are gathered once per stage (its forwards
//!   and backwards interleave under 1F1B-like schedules, so a gather before every forward and again
//!   before every backward, FSDP's per-layer rule, would gather once per microbatch); `finish()`
//!   gathers every stage's parameters so they can be read.
//!
//! Agreement. `step_end` first completes every reduction (launching the ones a failed step left
//! unlaunched, so every rank posts the same collectives), then all ranks of the mesh agree, with
//! one all-reduce over the world, whether every pipeline succeeded. If not, every rank throws the
//! same `pipeline_error` naming the world rank that failed first (in world-rank order) and no
//! parameter changes. Otherwise the reduced gradients (times `grad_scale`) are written back into
//! the stages' accumulators (non-sharded mode) and the optimizer runs: on each stage's
//! parameters, or on the shards (sharded mode). The stages' own `update()` (if any) then runs too.
//!
//! Deterministic mode (`deterministic = true`) makes every reduction a rank-ordered sum
//! (`loom/comm/ordered.hpp`): the result for a bucket element is
//! `((c_0 + c_1) + c_2) + ...`, where `c_i` is the accumulated gradient (the pipeline's
//! microbatch-ordered fold) of the group's member with index `i` (row-major over the group's
//! dimensions in mesh order), identical on every backend and rank; the optimizer then applies the
//! same operations as a single-rank reference that sums in this order.
//!
//! Local SGD (`local_steps = H >= 1`; Stich, ICLR 2019, "Local SGD converges fast and communicates
//! little", Algorithm 1; Zhang, De Sa, Mitliagkas and Ré 2016, "Parallel SGD: when does averaging
//! help?"). The replicas do not reduce gradients: after the agreement each replica's optimizer
//! updates its parameters with its own gradient (times `grad_scale`), and after every `H`-th step
//! the parameters are averaged over `dp`, one all-reduce of all of them (rank-ordered in
//! deterministic mode) followed by `p = sum * (1/dp)` (the product rounded once):
//! `x_i <- x_i - lr g_i(x_i)` on every replica `i`, and every `H` steps `x_i <- (1/dp) sum_j x_j`.
//! `H = 1` is synchronous data parallelism up to rounding (the average of `x - lr g_i` is
//! `x - lr mean(g_i)`). With `one_shot = true` the parameters are averaged once, in `finish()`
//! (one-shot averaging, Zhang et al. 2016, §2). A stateful optimizer's moments stay local to each
//! replica (never averaged). Gradients partial over tp or sp (a sequence split inside the
//! replica) are still reduced every step, over the replica's own ranks (`tp`, `sp`, `tp x sp`
//! without `dp`), in the same buckets. ZeRO is refused (replicas that update independently cannot
//! share shards). Works with every pipeline family, on host and device worlds.
//!
//! Memory: every bucket keeps a flat gradient buffer (in stages 1 and 2 also a flat parameter
//! buffer, in stages 2 and 3 a gradient shard, in stage 3 a parameter shard), i.e. about one extra
//! copy of the gradients (two in stages 1 and 2). Optimizers:
//! `sgd` (stateless, `opt(params, grads)`) and `adam` (stateful, `opt.step(key, params, grads)`,
//! one key per stage, or per bucket in sharded mode), whose moments then cover the rank's shard
//! only: ZeRO-1/2's saving of optimizer state (tested: half the moments at dp 2).
//!
//! On a device world (the mesh bound to `cuda_local` or `nccl`, the pipeline on its device
//! space), the same buckets, order, groups and agreement, with device memory and streams. The
//! buckets are device buffers. A bucket's launch makes the reducer's own communication stream
//! (`"rN dp"`) wait for the compute stream's position after the stage's last weight-gradient
//! action (one event), packs the stages' gradients into it there and enqueues its all-reduce (or
//! reduce-scatter) on that stream: it overlaps the rest of the pipeline with no host wait. The
//! step's end makes the compute stream wait for the communication stream, agrees on the host as
//! above, then writes the gradients back (scaled on the device) and runs the optimizer on the
//! compute stream (`sgd` has a device form: `p -= lr * g` with the product rounded before the
//! subtraction, as on the host, so results are bitwise the host's). Sharded mode updates the
//! shard on the compute stream and all-gathers it on the communication stream after it; the next
//! step's first use of a stage makes the compute stream wait for that gather and copies the
//! parameters back. Every copy, pack and update is a simulator region, so the race detector
//! checks them against the stages' kernels. Deterministic mode sums in rank order on the device
//! (`loom::ordered_all_reduce` / `ordered_reduce_scatter` of `loom/comm/device.hpp`: the group's
//! own sums on `cuda_local`, an all-to-all and loom's kernel on `nccl`). Graph mode is refused
//! (the reducer's host calls would not be replayed).
//!
//! Measuring the overlap on a device (`measure = true`): timing events around each bucket's pack
//! and reduction on the communication stream, one on the compute stream where the step's pipeline
//! work ends (the start of `step_end`) and one at the end of the communication stream's work of the
//! step. `overlap()` gives the reductions' summed device time and how long the communication
//! stream ran on after the pipeline's work; `hidden()` is the fraction the pipeline hid (0 with
//! `eager = false`, where every reduction starts after the pipeline's work: tested).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/ordered.hpp"
#include "loom/exec/optimizer_math.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/exec/step_observer.hpp"
#include "loom/mesh/mesh.hpp"
#include "loom/schedule/error.hpp"
#include "loom/stage/stage.hpp"

#if defined(LOOM_HAS_CUDA)
#include "loom/comm/device.hpp"
#include "loom/cuda/annotate.hpp"
#include "loom/cuda/buffer.hpp"
#include "loom/cuda/kernels.hpp"
#include "loom/cuda/stream.hpp"
#endif

namespace loom {

namespace detail {
//! Whether `data_parallel` over groups of type `C` works on device memory.
template <class C>
inline constexpr bool dp_on_device = false;
#if defined(LOOM_HAS_CUDA)
template <class C>
  requires device_collective_communicator<C>
inline constexpr bool dp_on_device<C> = true;
#endif
}  // namespace detail

//! A part of a stage's parameters (offsets into `params()` and `weight_grad()`) whose gradient
//! is a partial sum over the ranks of the dimensions `partial_over` (besides `dp`, and `ep` unless
//! the range is `expert`), e.g. the tokens of one sequence-parallel rank.
struct grad_range {
  std::size_t offset = 0;    //!< first element
  std::size_t size = 0;      //!< number of elements
  dim_set partial_over{};    //!< extra dimensions whose ranks hold partial sums (subset of tp, sp)
  //! Expert parameters, held by this rank alone in its `ep` group: reduced over `dp` (times
  //! `partial_over`) instead of `dp x ep` (see the file comment).
  bool expert = false;
};

//! A stage whose parameters `params()` are laid out as its `weight_grad()`.
template <class S>
concept parameterized_stage = stage<S> && requires(S& s) {
  { s.params() } -> std::convertible_to<std::span<typename S::value_type>>;
};

//! A stage whose parameter storage can be given up between uses, for ZeRO-3: after
//! `release_params()` it holds none (`params()` is empty) and must not run until
//! `acquire_params()` gave it storage again (contents unspecified: `data_parallel` fills it
//! before the stage's next action). On a device, the release must be ordered after the stage's
//! work so far (e.g. `cudaFreeAsync` on its stream).
template <class S>
concept releasable_stage = parameterized_stage<S> && requires(S& s) {
  s.release_params();
  s.acquire_params();
};

//! A stage that says which parts of its gradient are partial over which dimensions (ranges
//! covering `weight_grad()` exactly once). A stage without `grad_ranges()` is one range over `dp`.
template <class S>
concept partial_gradient_stage = parameterized_stage<S> && requires(const S& s) {
  { s.grad_ranges() } -> std::convertible_to<std::span<const grad_range>>;
};

//! Stochastic gradient descent, `p -= lr * g`, element by element.
struct sgd {
  double lr = 0.01;  //!< learning rate
  //! One step on `params` with `grads` (equal sizes).
  template <class T>
  void operator()(std::span<T> params, std::span<const T> grads) const {
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= static_cast<T>(lr) * grads[i];
  }
#if defined(LOOM_HAS_CUDA)
  //! The same step on device memory, enqueued on `stream` (bitwise the host's: the product is
  //! rounded before the subtraction).
  template <class T>
  void operator()(std::span<T> params, std::span<const T> grads, cudaStream_t stream) const {
    cuda::detail::sub_scaled_async(params.data(), static_cast<T>(lr), grads.data(), params.size(), stream);
  }
#endif
};

//! Adam (Kingma and Ba, ICLR 2015, Algorithm 1, in the efficient form of §2): per element
//! `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`, `p -= lr_t m / (sqrt(v) + eps_t)` with
//! `lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)` and `eps_t = eps sqrt(1 - b2^t)` at step `t` (from 1),
//! each operation rounded on its own (`loom::detail::adam_element`), so the host loop and the
//! device kernel give the same bits. A stateful optimizer: `data_parallel` calls
//! `step(key, params, grads)` with one key per stage (or, sharded, per bucket shard), and the
//! moments of a key have the size of what it updates: under ZeRO they cover the rank's shard only,
//! 1/dp of them. On a device (`step(key, params, grads, stream)`) the moments are device memory.
//! `T` is the parameters' element type. `state_bytes()` is the moments' memory.
namespace detail {
//! The moments of one key of `loom::adam` (host vectors, or device memory owned by `owner`).
template <class T>
struct adam_state {
  std::size_t key = 0, n = 0;  //!< the key and its element count
  long t = 0;                  //!< steps taken
  std::vector<T> m, v;         //!< host moments
  T* dm = nullptr;             //!< device first moment
  T* dv = nullptr;             //!< device second moment
  std::shared_ptr<void> owner;  //!< owns the device moments
};
}  // namespace detail

template <class T>
struct adam {
  double lr = 1e-3;      //!< learning rate
  double beta1 = 0.9;    //!< first-moment decay
  double beta2 = 0.999;  //!< second-moment decay
  double eps = 1e-8;     //!< added to the root of the second moment

  //! One step on `params` with `grads` (equal sizes) under `key`, on the host.
  void step(std::size_t key, std::span<T> params, std::span<const T> grads) {
    auto& st = state_for(key, params.size(), false);
    const auto [lr_t, eps_t] = corrected(++st.t);
    for (std::size_t i = 0; i < params.size(); ++i)
      detail::adam_element(params[i], grads[i], st.m[i], st.v[i], static_cast<T>(beta1), static_cast<T>(beta2), lr_t, eps_t);
  }
#if defined(LOOM_HAS_CUDA)
  //! One step on device memory under `key`, enqueued on `stream` (the moments are device memory).
  void step(std::size_t key, std::span<T> params, std::span<const T> grads, cudaStream_t stream) {
    auto& st = state_for(key, params.size(), true);
    const auto [lr_t, eps_t] = corrected(++st.t);
    cuda::detail::adam_async(params.data(), grads.data(), st.dm, st.dv, static_cast<T>(beta1), static_cast<T>(beta2), lr_t, eps_t,
                             params.size(), stream);
  }
#endif
  //! Bytes of the moments of a key of `n` elements: `2 n` elements, plus one byte on a device
  //! (the allocation is never empty).
  static constexpr std::size_t state_bytes_for(std::size_t n, bool device) { return 2 * n * sizeof(T) + (device ? 1 : 0); }
  //! Bytes of moments held (host and device), over every key.
  std::size_t state_bytes() const {
    std::size_t b = 0;
    for (auto const& s : moments) b += 2 * s.n * sizeof(T);
    return b;
  }

  std::vector<detail::adam_state<T>> moments{};  //!< the state, one entry per key (starts empty)

 private:
  using state = detail::adam_state<T>;
  std::pair<T, T> corrected(long t) const {
    const double c1 = 1 - std::pow(beta1, static_cast<double>(t)), c2 = std::sqrt(1 - std::pow(beta2, static_cast<double>(t)));
    return {static_cast<T>(lr * c2 / c1), static_cast<T>(eps * c2)};
  }
  state& state_for(std::size_t key, std::size_t n, [[maybe_unused]] bool device) {
    for (auto& s : moments)
      if (s.key == key) {
        if (s.n != n) throw config_error("adam: key " + std::to_string(key) + " was " + std::to_string(s.n) + " elements, now " + std::to_string(n));
        return s;
      }
    state s;
    s.key = key;
    s.n = n;
#if defined(LOOM_HAS_CUDA)
    if (device) {
      void* p = nullptr;
      LOOM_CUDA_TRY(cudaMalloc(&p, state_bytes_for(n, true)));
      LOOM_CUDA_TRY(cudaMemset(p, 0, state_bytes_for(n, true)));
      cuda::name_memory(p, "adam moments");
      s.owner = std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
      s.dm = static_cast<T*>(p);
      s.dv = s.dm + n;
    } else
#endif
    {
      s.m.assign(n, T{});
      s.v.assign(n, T{});
    }
    moments.push_back(std::move(s));
    return moments.back();
  }
};

//! Deliberate bugs of the reducer on a device, for loom's tests: the race detector must catch and
//! name each (`tests/cuda_layer/device_data_parallel_test.cpp`).
//! The memory a `data_parallel` reducer holds beside the stages, in bytes (device memory on a
//! device communicator), by formula from its buckets (`data_parallel::memory()`; each bucket has
//! `padded` elements, its group `n` ranks):
//! - every bucket's flat gradient, `padded`;
//! - ZeRO-1 and 2: the bucket's flat parameters, `padded`; ZeRO-2 and 3: the gradient shard,
//!   `padded / n`; ZeRO-3: the parameter shard, `padded / n`;
//! - local SGD: the average's flat buffer, the buckets' elements one after another;
//! - the optimizer's state once every key has stepped (`state_bytes_for`: Adam's two moments per
//!   stage's parameters, or under ZeRO per bucket shard, plus one byte per key on a device);
//! - on `cuda_local` groups, the reductions' scratch the reducer reserves at `attach`: per group,
//!   its largest all-reduce's slice plus one element (`padded x e / n + e` over the buckets that
//!   are all-reduced, ZeRO 0 and 1, and local SGD's average over `dp`), on fresh groups; NCCL's
//!   own buffers are NCCL's (the simulator does not model them);
//! - ZeRO-3: between steps the stages hold no parameters (`released`); during a step a stage's
//!   parameters are back and its buckets' full buffers exist from their all-gather until they are
//!   unpacked (`transient`: the largest stage's, the exact extra peak on a rank of one stage; a
//!   rank of several stages has the next stage's gather in flight too, so up to two stages').
struct dp_memory {
  std::size_t buckets = 0;           //!< the buckets' flat gradients
  std::size_t parameters = 0;        //!< ZeRO-1 and 2: the buckets' flat parameters
  std::size_t shards = 0;            //!< ZeRO-2 and 3: the gradient shards
  std::size_t parameter_shards = 0;  //!< ZeRO-3: the parameter shards
  std::size_t average = 0;           //!< local SGD: the average's buffer
  std::size_t optimizer = 0;         //!< the optimizer's state (allocated in the first step)
  std::size_t released = 0;          //!< ZeRO-3: the stages' parameters, given up between steps
  std::size_t transient = 0;         //!< ZeRO-3: one stage's parameters and full buffers during a step (the largest stage)
  std::size_t communication = 0;     //!< the groups' reduction scratch the reducer reserved (`cuda_local`)
  //! What the reducer holds between steps, after the first.
  constexpr std::size_t between_steps() const {
    return buckets + parameters + shards + parameter_shards + average + optimizer + communication;
  }
};

//! Faults `data_parallel` can be asked to commit (the broken-variant tests).
struct data_parallel_faults {
  bool skip_bucket_wait = false;  //!< a bucket is packed without waiting for the compute stream (its stages' last `W`)
  bool skip_update_wait = false;  //!< the write-back and update do not wait for the reducer's stream (the reduction)
  bool skip_gather_wait = false;  //!< ZeRO-3: a stage's parameters are unpacked without waiting for their all-gather
};

//! Knobs of `data_parallel` (designated initialisers).
struct data_parallel_options {
  std::size_t bucket_bytes = std::size_t{25} << 20;  //!< bucket capacity (DDP's default 25 MB)
  bool sharded = false;        //!< ZeRO stage 2 (when `zero_stage` is 0)
  //! ZeRO stage (see the file comment): 0 none, 1 optimizer state, 2 and gradients, 3 and
  //! parameters (the stage must be a `releasable_stage`). 0 with `sharded` is 2.
  int zero_stage = 0;
  //! Local SGD: average the parameters over `dp` after every `local_steps`-th step instead of
  //! reducing gradients every step (0: synchronous data parallelism; see the file comment).
  int local_steps = 0;
  //! With `local_steps`: average once, in `finish()`, instead of every `local_steps` steps.
  bool one_shot = false;
  bool deterministic = false;  //!< rank-ordered sums (bitwise reproducible)
  bool eager = true;           //!< launch buckets when ready (false: all after the step)
  double grad_scale = 1.0;     //!< factor applied to the reduced gradients (1/dp: average)
  //! When positive, a helper thread tests the reductions in flight at this interval, so that
  //! they progress while the stages compute (MPI progresses non-blocking collectives only inside
  //! MPI calls; PyTorch's ProcessGroupMPI runs its collectives on a worker thread for the same
  //! reason). Needs a backend that allows calls from two threads (MPI_THREAD_MULTIPLE).
  std::chrono::microseconds progress_interval{0};
  //! On a device: time every bucket's pack and reduction on the reducer's stream, and how far
  //! that stream runs past the pipeline's work at the step's end (`data_parallel::overlap()`).
  //! Adds two event records per bucket and two per step; off by default.
  bool measure = false;
  data_parallel_faults faults{};  //!< device: deliberate bugs, for loom's tests
};

//! What `data_parallel::overlap()` measured of the last step on a device.
struct reduction_overlap {
  double reduce_seconds = 0;   //!< device time of the buckets' packs and reductions, summed (reducer's stream)
  double exposed_seconds = 0;  //!< how long the reducer's stream ran on after the compute stream's last work of the step
  int buckets = 0;             //!< buckets reduced (those of groups of more than one rank)
  //! The fraction of the reductions' time the pipeline hid: `1 - exposed / reduce`, in [0, 1]
  //! (1 when nothing was reduced).
  double hidden() const { return reduce_seconds > 0 ? std::clamp(1.0 - exposed_seconds / reduce_seconds, 0.0, 1.0) : 1.0; }
};

//! What `data_parallel` recorded about one bucket (for tests and reports).
struct bucket_report {
  dim_set group;                //!< the dimensions it is reduced over
  std::size_t elements = 0;     //!< gradient elements (before padding)
  std::vector<std::size_t> stages;  //!< local stages with parameters in it
  long launched_at = -1;        //!< program position of the action after which it was launched, -1 after the step
};

//! Gradient synchronisation and optimizer step over a mesh (see the file comment). `MeshComm` is
//! a `loom::mesh_comm`, `Stage` a `parameterized_stage`, `Opt` an optimizer like `loom::sgd`.
template <class MeshComm, parameterized_stage Stage, class Opt = sgd>
class data_parallel final : public step_observer {
 public:
  using value_type = typename Stage::value_type;     //!< element type
  using comm_type = typename MeshComm::comm_type;    //!< the group communicators' type
  //! Whether the buckets live on a device (a `cuda_local` or `nccl` mesh; see the file comment).
  static constexpr bool on_device = detail::dp_on_device<comm_type>;
  static_assert(on_device || nonblocking_communicator<comm_type>,
                "loom::data_parallel needs a backend with non-blocking collectives or a device communicator with collectives");

  //! Builds the groups (collective over the mesh: `dp`, `dp x tp`, `dp x sp`, `dp x tp x sp`).
  explicit data_parallel(MeshComm& mesh, data_parallel_options opt = {}, Opt optimizer = {})
      : mesh_(&mesh), opt_(opt), optimizer_(std::move(optimizer)) {
    if (opt_.bucket_bytes < sizeof(value_type))
      throw config_error("data_parallel: bucket_bytes " + std::to_string(opt_.bucket_bytes) +
                         " is smaller than one gradient element (" + std::to_string(sizeof(value_type)) + " bytes)");
    if (opt_.zero_stage < 0 || opt_.zero_stage > 3)
      throw config_error("data_parallel: zero_stage " + std::to_string(opt_.zero_stage) + " is not 0, 1, 2 or 3");
    zero_ = opt_.zero_stage != 0 ? opt_.zero_stage : opt_.sharded ? 2 : 0;
    if (zero_ == 3 && !releasable_stage<Stage>)
      throw config_error("data_parallel: ZeRO stage 3 needs stages that can give up their parameters (release_params(), "
                         "acquire_params(): loom::releasable_stage)");
    if (opt_.local_steps < 0)
      throw config_error("data_parallel: local_steps " + std::to_string(opt_.local_steps) + " is negative");
    if (opt_.one_shot && opt_.local_steps == 0)
      throw config_error("data_parallel: one_shot averaging is a form of local SGD: it needs local_steps >= 1");
    if (opt_.local_steps > 0 && zero_ > 0)
      throw config_error("data_parallel: local SGD (local_steps " + std::to_string(opt_.local_steps) + ") with ZeRO stage " +
                         std::to_string(zero_) + ": replicas that update on their own gradients cannot share parameter or state shards");
    // Local SGD: gradients partial over tp/sp are reduced inside the replica (the group without
    // dp); group 0 (dp alone) is not reduced at all.
    groups_used_ = mesh.size(dim::ep) > 1 ? max_groups : max_groups / 2;
    for (unsigned x = 0; x < groups_used_; ++x) groups_[x] = &mesh.group(dims_of(x));
  }

  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;
  //! Stops the progress thread, if any (reductions in flight are left to the communicator).
  ~data_parallel() {
    if (helper_.joinable()) {
      {
        std::lock_guard lk(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      helper_.join();
    }
  }

  //! Binds the stages of pipeline `p` (built with `observer = this`) and lays out the buckets.
  //! Collective over the mesh: checks that the ranks of each group hold the same layout.
  template <class Pipeline>
  void attach(Pipeline& p) {
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) {
      if (p.options().graph)
        throw config_error("data_parallel: graph mode is not supported on a device (the reducer's host calls are not replayed)");
      compute_ = p.space().stream();
      cuda::name_stream(dp_stream_.get(), "r" + std::to_string(mesh_->rank()) + " dp");
    }
#endif
    stages_ = p.stages();
    const auto L = stages_.size();
    // Readiness order: the position of each local stage's last weight-gradient action.
    const schedule& s = p.lowered();
    const auto& prog = s.programs[static_cast<std::size_t>(p.rank())];
    // Per local stage: its last weight-gradient action and (ZeRO-3's prefetch order) its first action.
    std::vector<long> last(L, -1), first(L, -1);
    auto ids = p.ids();
    auto touch = [&](int st, int mb, long at, bool weight) {
      for (std::size_t li = 0; li < L; ++li)
        if (ids[li].stage == st && ids[li].direction == s.direction_of(mb)) {
          if (first[li] < 0) first[li] = at;
          if (weight) last[li] = at;
        }
    };
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!is_compute(a.kind)) continue;
      const auto at = static_cast<long>(i);
      touch(a.stage, a.mb, at, a.kind == op::W || a.kind == op::BW);
      if (a.kind == op::FB) touch(a.bstage, a.bmb, at, a.bkind == op::BW);
    }
    use_order_.resize(L);
    for (std::size_t i = 0; i < L; ++i) use_order_[i] = i;
    std::sort(use_order_.begin(), use_order_.end(),
              [&](std::size_t a, std::size_t b) { return first[a] != first[b] ? first[a] < first[b] : a < b; });
    // A stage's buckets go out after its last weight-gradient action and after the sends that
    // directly follow it (the input gradient it produced, on the pipeline's critical path).
    launch_after_.assign(L, -1);
    for (std::size_t li = 0; li < L; ++li) {
      long at = last[li];
      while (at >= 0 && static_cast<std::size_t>(at) + 1 < prog.size() && prog[static_cast<std::size_t>(at) + 1].kind == op::send) ++at;
      launch_after_[li] = at;
    }
    std::vector<std::size_t> order(L);
    for (std::size_t i = 0; i < L; ++i) order[i] = i;
    // By last weight-gradient action, ties in stage order (std::sort with the index as tie-break:
    // libstdc++ 12's std::stable_sort warns under clang).
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return last[a] != last[b] ? last[a] < last[b] : a < b; });

    buckets_.clear();
    const std::size_t cap = std::max<std::size_t>(1, opt_.bucket_bytes / sizeof(value_type));
    for (unsigned x = 0; x < groups_used_; ++x) {
      std::size_t open = buckets_.size();
      bool have_open = false;
      for (std::size_t li : order)
        for (const grad_range& r : ranges_of(li)) {
          if (group_index(r) != x) continue;
          std::size_t off = r.offset, left = r.size;
          while (left > 0) {
            if (!have_open || buckets_[open].elements == cap) {
              buckets_.emplace_back();
              open = buckets_.size() - 1;
              buckets_[open].group = x;
              have_open = true;
            }
            bucket& b = buckets_[open];
            const std::size_t take = std::min(left, cap - b.elements);
            b.pieces.push_back({li, off, take, b.elements});
            b.elements += take;
            if (std::find(b.stages.begin(), b.stages.end(), li) == b.stages.end()) b.stages.push_back(li);
            off += take;
            left -= take;
          }
        }
    }
    for (bucket& b : buckets_) {
      for (std::size_t li : b.stages) b.launch_after = std::max(b.launch_after, launch_after_[li]);
      const auto n = static_cast<std::size_t>(groups_[b.group]->size());
      const std::size_t padded = zero_ > 0 ? (b.elements + n - 1) / n * n : b.elements;
      b.padded = padded;
#if defined(LOOM_HAS_CUDA)
      if constexpr (on_device) {
        b.dgrad = device_zeros(padded, "dp bucket gradient");
        if (zero_ == 1 || zero_ == 2) b.dparam = device_zeros(padded, "dp bucket parameters");
        if (zero_ >= 2) b.dshard = device_zeros(padded / n, "dp bucket shard");
        if (zero_ == 3) b.dpshard = device_zeros(padded / n, "dp bucket parameter shard");
        continue;
      }
#endif
      b.grad.assign(padded, value_type{});
      if (zero_ == 1 || zero_ == 2) b.param.assign(padded, value_type{});
      if (zero_ >= 2) b.shard.assign(padded / n, value_type{});
      if (zero_ == 3) b.pshard.assign(padded / n, value_type{});
    }
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device)
      if (opt_.measure) timing_ = std::vector<bucket_timing>(buckets_.size());
#endif
    for (std::size_t li = 0; li < L; ++li) {
      std::size_t covered = 0;
      for (const grad_range& r : ranges_of(li)) covered += r.size;
      const std::size_t want = std::span<value_type>(stages_[li].weight_grad()).size();
      if (covered != want || std::span<value_type>(stages_[li].params()).size() != want)
        throw config_error("data_parallel: local stage " + std::to_string(li) + " has " + std::to_string(want) +
                           " gradient elements but its parameters and grad_ranges() cover " +
                           std::to_string(std::span<value_type>(stages_[li].params()).size()) + " and " +
                           std::to_string(covered));
    }
    if (opt_.local_steps > 0) {  // the average's flat buffer: the buckets one after another
      std::size_t total = 0;
      for (const bucket& b : buckets_) total += b.elements;
#if defined(LOOM_HAS_CUDA)
      if constexpr (on_device) davg_ = device_zeros(total, "local SGD parameter average");
#endif
      if constexpr (!on_device) avg_.assign(total, value_type{});
    }
    reserve_scratch();
    check_layout();
    if constexpr (releasable_stage<Stage>)
      if (zero_ == 3) shard_parameters();
    attached_ = true;
    if (opt_.progress_interval.count() > 0 && !helper_.joinable()) helper_ = std::thread([this] { progress_loop(); });
  }

  //! Completes the parameter all-gathers still in flight (sharded mode). Call before reading
  //! parameters outside a step; harmless otherwise. On a device it waits for the compute and the
  //! communication stream (so an error or a race report of either reaches the caller).
  void finish() {
    std::lock_guard lk(mu_);
    if constexpr (releasable_stage<Stage>)
      if (zero_ == 3)
        for (std::size_t li : use_order_) materialise(li, false);
    for (bucket& b : buckets_) finish_gather(b);
    if (opt_.one_shot && local_since_ > 0) average();
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device)
      if (compute_ != nullptr) {
        LOOM_CUDA_TRY(cudaStreamSynchronize(compute_));
        LOOM_CUDA_TRY(cudaStreamSynchronize(dp_stream_.get()));
      }
#endif
  }

  //! The buckets, with where each was launched in the last step.
  std::vector<bucket_report> report() const {
    std::vector<bucket_report> out;
    for (const bucket& b : buckets_) out.push_back({dims_of(b.group), b.elements, b.stages, b.launched_at});
    return out;
  }
  //! The options in use.
  const data_parallel_options& options() const { return opt_; }
  //! On a device with `measure`: the last step's reduction time and the part of it that ran after
  //! the pipeline's own work (waits for the step's device work). Zeros on the host, without
  //! `measure`, or before the first step.
  reduction_overlap overlap() const {
    reduction_overlap r;
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) {
      if (measured_ < 0) return r;
      compute_done_.synchronize();
      dp_done_.synchronize();
      for (const bucket_timing& t : timing_) {
        if (t.step != measured_) continue;
        r.reduce_seconds += 1e-3 * cuda::event::elapsed_ms(t.start, t.end);
        ++r.buckets;
      }
      if (r.buckets > 0) r.exposed_seconds = std::max(0.0, 1e-3 * cuda::event::elapsed_ms(compute_done_, dp_done_));
    }
#endif
    return r;
  }
  //! Elements of parameter storage this rank holds now: its stages' parameters plus the reducer's
  //! copies (the buckets' flat parameters in ZeRO stages 1 and 2, the shards in stage 3). Under
  //! ZeRO-3, between steps, only the shards: 1/dp of the stages' parameters (plus padding).
  std::size_t parameters_held() {
    std::size_t n = 0;
    for (auto& st : stages_) n += std::span<value_type>(st.params()).size();
    for (const bucket& b : buckets_) n += b.param.size() + b.pshard.size() + b.dparam.size() + b.dpshard.size();
    return n;
  }
  //! The memory this reducer holds beside the stages, by the formula of `dp_memory` from its
  //! buckets (after `attach`); the simulator's device-memory accounting equals it.
  dp_memory memory() {
    dp_memory m;
    constexpr std::size_t e = sizeof(value_type);
    auto state = [&](std::size_t n) -> std::size_t {
      if constexpr (requires { Opt::state_bytes_for(n, on_device); }) return Opt::state_bytes_for(n, on_device);
      else return 0;
    };
    for (const bucket& b : buckets_) {
      const auto n = static_cast<std::size_t>(groups_[b.group]->size());
      m.buckets += b.padded * e;
      if (zero_ == 1 || zero_ == 2) m.parameters += b.padded * e;
      if (zero_ >= 2) m.shards += b.padded / n * e;
      if (zero_ == 3) m.parameter_shards += b.padded / n * e;
      if (opt_.local_steps > 0) m.average += b.elements * e;
      if (zero_ > 0) m.optimizer += state(b.padded / n);
    }
    for (std::size_t need : scratch_) m.communication += need;
    for (std::size_t li = 0; li < stages_.size(); ++li) {
      const std::size_t w = std::span<value_type>(stages_[li].weight_grad()).size();
      if (zero_ == 0) m.optimizer += state(w);
      if (zero_ != 3) continue;
      m.released += w * e;
      std::size_t full = 0;
      for (const bucket& b : buckets_)
        if (in_bucket(b, li)) full += b.padded * e;
      m.transient = std::max(m.transient, w * e + full);
    }
    return m;
  }
  //! The optimizer (its state: `adam::state_bytes()`).
  const Opt& optimizer() const { return optimizer_; }

  // ---- step_observer ------------------------------------------------------------------------
  //! Waits for the prefetched parameters of local stage `local` (sharded mode).
  void before_first_use(std::size_t local) override {
    if (zero_ == 0) return;
    std::lock_guard lk(mu_);
    if constexpr (releasable_stage<Stage>)
      if (zero_ == 3) return materialise(local, true);
    for (bucket& b : buckets_)
      if (b.gathering && in_bucket(b, local)) finish_gather(b);
  }
  //! Counts the stage ready (its buckets go out after the sends that follow, see `progress`).
  void gradients_ready(std::size_t local) override {
    if (!attached_) return;
    std::lock_guard lk(mu_);
    for (bucket& b : buckets_)
      if (in_bucket(b, local)) --b.waiting;
    if constexpr (releasable_stage<Stage>)
      if (zero_ == 3) release(local);
  }
  //! After each action: launches the buckets whose stages are ready and whose launch point has
  //! passed (in order, per group), and tests the reductions in flight.
  void progress() override {
    ++actions_;
    bool launched = false;
    {
      std::lock_guard lk(mu_);
      if (opt_.eager)
        for (unsigned x = 0; x < groups_used_; ++x) {
          if (!unreduced(x)) launched = launch_ready(x, false) || launched;
        }
      test_all();
    }
    if (launched) cv_.notify_all();
  }
  //! Completes the reductions, agrees over the world, then writes back and updates.
  void step_end(int failed_rank, const std::string& cause) override {
    if (!attached_) throw config_error("data_parallel: attach(pipeline) was not called before the step");
    std::lock_guard lk(mu_);
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device)
      if (opt_.measure) compute_done_.record(cuda::stream_ref(compute_));  // the pipeline's work ends here
#endif
    for (unsigned x = 0; x < groups_used_; ++x) {
      if (!unreduced(x)) launch_ready(x, true);
    }
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) device_step_end(failed_rank, cause);
    else
#endif
      host_step_end(failed_rank, cause);
    if (local()) {  // after the update (a failed step threw in the agreement)
      ++local_since_;
      if (!opt_.one_shot && local_since_ == opt_.local_steps) average();
    }
  }

 private:
  // ---- local SGD (see the file comment) ------------------------------------------------------
  bool local() const { return opt_.local_steps > 0; }
  //! The dimensions group `x` reduces over (an unreduced group of local SGD: `group_dims`).
  dim_set dims_of(unsigned x) const { return local() && !unreduced(x) ? replica_dims(x) : group_dims(x); }
  //! The dimensions a partial gradient is reduced over inside a replica (local SGD): its partial
  //! dimensions, and `ep` for a dense one.
  dim_set replica_dims(unsigned x) const {
    dim_set s{};
    if (x & 1u) s = s | dim::tp;
    if (x & 2u) s = s | dim::sp;
    if (!(x & expert_bit) && mesh_->size(dim::ep) > 1) s = s | dim::ep;
    return s;
  }
  //! Whether group `x` is not reduced at all: under local SGD, when the replica holds its
  //! gradients whole (no partial dimension, and an expert range or no `ep`).
  bool unreduced(unsigned x) const { return local() && replica_dims(x).empty(); }
  //! The group reduced over `dp` alone in every mode (local SGD's average uses its scratch).
  unsigned dp_alone() const { return groups_used_ == max_groups ? expert_bit : 0u; }
  //! Every replica's parameters become their mean over `dp`: one all-reduce of all of them
  //! (rank-ordered in deterministic mode), then `* (1/dp)`.
  void average() {
    local_since_ = 0;
    auto& dp = mesh_->dp();
    if (dp.size() == 1) return;
    const auto inv = static_cast<value_type>(1.0 / dp.size());
    auto params = [&](const piece& pc) { return params_of(pc); };
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) {
      std::size_t off = 0;
      for (const bucket& b : buckets_) {
        move_pieces(b, davg_.subspan(off, b.elements), true, compute_, "local SGD parameters pack", params);
        off += b.elements;
      }
      if (opt_.deterministic) ordered_all_reduce(dp, davg_, compute_);
      else dp.all_reduce(davg_, reduce_op::sum, compute_);
      {
        const cuda::byte_access acc[] = {cuda::writes(davg_)};
        cuda::region reg(compute_, "local SGD average scale", acc);
        cuda::detail::scale_async(davg_.data(), inv, davg_.size(), compute_);
      }
      off = 0;
      for (const bucket& b : buckets_) {
        move_pieces(b, davg_.subspan(off, b.elements), false, compute_, "local SGD parameters unpack", params);
        off += b.elements;
      }
      return;
    }
#endif
    if constexpr (!on_device) {
      std::span<value_type> flat(avg_);
      std::size_t off = 0;
      for (const bucket& b : buckets_) {
        host_move_pieces(b, flat.subspan(off, b.elements), true, params);
        off += b.elements;
      }
      if (opt_.deterministic) ordered_all_reduce(dp, flat);
      else dp.all_reduce(flat, reduce_op::sum);
      for (auto& v : avg_) v *= inv;
      off = 0;
      for (const bucket& b : buckets_) {
        host_move_pieces(b, flat.subspan(off, b.elements), false, params);
        off += b.elements;
      }
    }
  }

  //! The step's end on the host (see the file comment).
  void host_step_end(int failed_rank, const std::string& cause) {
    for (bucket& b : buckets_)
      if (b.reducing) {
        b.red.wait();
        b.reducing = false;
      }
    release_all();
    agree(failed_rank, cause);
    const auto scale = static_cast<value_type>(opt_.grad_scale);
    for (bucket& b : buckets_) {
      if (zero_ == 0) {
        for (const piece& pc : b.pieces) {
          std::span<value_type> g = grad_of(pc);
          if (unreduced(b)) {  // local SGD: the stage's own gradient, scaled in place
            if (opt_.grad_scale != 1.0)
              for (auto& v : g) v *= scale;
            continue;
          }
          for (std::size_t i = 0; i < pc.size; ++i) g[i] = opt_.grad_scale == 1.0 ? b.grad[pc.at + i] : b.grad[pc.at + i] * scale;
        }
        continue;
      }
      auto& c = *groups_[b.group];
      const std::size_t k = b.padded / static_cast<std::size_t>(c.size()), at = static_cast<std::size_t>(c.rank()) * k;
      // The reduced gradient of this rank's shard: its slice of the all-reduced bucket (stage 1) or the reduce-scatter's output.
      std::span<value_type> g = zero_ == 1 ? std::span<value_type>(b.grad).subspan(at, k) : std::span<value_type>(b.shard);
      if (opt_.grad_scale != 1.0)
        for (auto& v : g) v *= scale;
      const auto key = static_cast<std::size_t>(&b - buckets_.data());
      if (zero_ == 3) {  // the shard is the parameters: updated in place, gathered at the next first use
        host_update(key, std::span<value_type>(b.pshard), std::span<const value_type>(g));
        continue;
      }
      // The shard of the parameters, from the stages (padding stays zero), updated in place.
      host_move_pieces(b, std::span<value_type>(b.param), true, [&](const piece& pc) { return params_of(pc); });
      std::span<value_type> mine = std::span<value_type>(b.param).subspan(at, k);
      host_update(key, mine, std::span<const value_type>(g));
      if (c.size() == 1) {
        b.gathering = true;  // nothing to gather: written back at first use
        continue;
      }
      b.gather = c.iall_gather(std::span<const value_type>(mine), std::span<value_type>(b.param));  // reductions all waited above
      b.gathering = true;
      b.gather_in_flight = true;
    }
    if (zero_ == 0)
      for (std::size_t li = 0; li < stages_.size(); ++li)
        host_update(li, std::span<value_type>(stages_[li].params()), std::span<const value_type>(stages_[li].weight_grad()));
  }
  //! The optimizer on the host: `step(key, ...)` for a stateful one (key: the stage, or sharded
  //! the bucket), else the call.
  void host_update(std::size_t key, std::span<value_type> params, std::span<const value_type> grads) {
    if constexpr (requires { optimizer_.step(key, params, grads); }) optimizer_.step(key, params, grads);
    else optimizer_(params, grads);
  }

  struct piece {
    std::size_t local, offset, size, at;  // stage, range in its parameters, position in the bucket
  };
  //! The part of its stage's gradient that piece `pc` covers.
  std::span<value_type> grad_of(const piece& pc) {
    return std::span<value_type>(stages_[pc.local].weight_grad()).subspan(pc.offset, pc.size);
  }
  //! The part of its stage's parameters that piece `pc` covers.
  std::span<value_type> params_of(const piece& pc) {
    return std::span<value_type>(stages_[pc.local].params()).subspan(pc.offset, pc.size);
  }
  struct bucket {
    unsigned group = 0;
    std::size_t elements = 0;
    std::vector<piece> pieces;
    std::vector<std::size_t> stages;
    std::size_t padded = 0;  // elements, padded to a multiple of the group size under ZeRO
    std::vector<value_type> grad, param, shard, pshard;  // pshard: ZeRO-3's parameter shard (param: its transient full buffer)
    std::span<value_type> dgrad, dparam, dshard, dpshard;  // on a device: grad, param, shard, pshard
    bool full_live = false;   // ZeRO-3: the full parameter buffer exists (gathering or gathered)
    std::size_t need = 0;     // ZeRO-3: stages still to fill from it
    reduction<comm_type, value_type> red;
    typename comm_type::request gather{};
    int waiting = 0;
    bool launched = false, reducing = false, gathering = false, gather_in_flight = false;
    long launched_at = -1;
    long launch_after = -1;  // the latest launch point of its stages (a program position)
  };

  //! On the host: copies each piece between the bucket buffer `flat` and the stages (`to_flat`:
  //! `of(piece)` into `flat`; else back), only local stage `only`'s pieces when it is set (the
  //! device form is `move_pieces`).
  template <class Of>
  void host_move_pieces(const bucket& b, std::span<value_type> flat, bool to_flat, Of&& of,
                        std::size_t only = static_cast<std::size_t>(-1)) {
    for (const piece& pc : b.pieces) {
      if (only != static_cast<std::size_t>(-1) && pc.local != only) continue;
      std::span<value_type> st = of(pc), fl = flat.subspan(pc.at, pc.size);
      if (to_flat) std::copy(st.begin(), st.end(), fl.begin());
      else std::copy(fl.begin(), fl.end(), st.begin());
    }
  }
  //! Before a collective is posted on group `x`: every reduction in flight on it posts the
  //! collectives it still needs, so every rank posts the group's collectives in the same order
  //! (`reduction::post_remaining`; found by the ZeRO-1 tests on MPI, where a rank-ordered
  //! all-reduce's second collective crossed the next bucket's first).
  void settle(unsigned x) {
    if constexpr (!on_device)
      for (bucket& b : buckets_)
        if (b.group == x && b.reducing) b.red.post_remaining();
  }
  //! Under local SGD a bucket of an unreduced group keeps the stages' own gradients.
  bool unreduced(const bucket& b) const { return unreduced(b.group); }
  //! Tests every reduction in flight (with `mu_` held).
  void test_all() {
    if constexpr (!on_device)  // on a device everything is enqueued: nothing to progress
      for (bucket& b : buckets_) {
        if (b.reducing && b.red.test()) b.reducing = false;
        if (b.gather_in_flight && groups_[b.group]->test(b.gather)) b.gather_in_flight = false;
      }
  }
  //! The helper thread: while reductions are in flight, tests them every `progress_interval`.
  void progress_loop() {
    std::unique_lock lk(mu_);
    while (!stop_) {
      bool busy = false;
      for (const bucket& b : buckets_) busy = busy || b.reducing || b.gather_in_flight;
      if (!busy) {
        cv_.wait(lk);
        continue;
      }
      test_all();
      lk.unlock();
      std::this_thread::sleep_for(opt_.progress_interval);
      lk.lock();
    }
  }

  //! Group `x`: bit 0 `tp` partial, bit 1 `sp` partial, bit 2 (`expert_bit`) expert parameters.
  dim_set group_dims(unsigned x) const {
    dim_set s{dim::dp};
    if (!(x & expert_bit) && mesh_->size(dim::ep) > 1) s = s | dim::ep;
    if (x & 1u) s = s | dim::tp;
    if (x & 2u) s = s | dim::sp;
    return s;
  }
  //! The group of range `r` (the expert bit only where the mesh has `ep` ranks to tell apart).
  unsigned group_index(const grad_range& r) const {
    const dim_set partial = r.partial_over;
    return (partial.contains(dim::tp) ? 1u : 0u) | (partial.contains(dim::sp) ? 2u : 0u) |
           (r.expert && groups_used_ == max_groups ? expert_bit : 0u);
  }

  std::vector<grad_range> ranges_of(std::size_t li) {
    if constexpr (partial_gradient_stage<Stage>) {
      std::span<const grad_range> r = stages_[li].grad_ranges();
      return {r.begin(), r.end()};
    } else {
      return {grad_range{0, std::span<value_type>(stages_[li].weight_grad()).size(), {}}};
    }
  }

  //! Every rank of a group must lay out the same buckets: compare counts and sizes.
  void check_layout() {
    for (unsigned x = 0; x < groups_used_; ++x) {
      std::vector<std::int64_t> sig{0, 0, 0};
      std::uint64_t sizes = 0;  // a hash of the bucket sizes in order, wrapping (unsigned: defined)
      for (const bucket& b : buckets_)
        if (b.group == x) {
          ++sig[0];
          sig[1] += static_cast<std::int64_t>(b.elements);
          sizes = sizes * 1000003u + static_cast<std::uint64_t>(b.elements);
        }
      sig[2] = static_cast<std::int64_t>(sizes);  // modular since C++20
      std::vector<std::int64_t> lo = sig, hi = sig;
      groups_[x]->all_reduce(std::span<std::int64_t>(lo), reduce_op::min);
      groups_[x]->all_reduce(std::span<std::int64_t>(hi), reduce_op::max);
      if (lo != hi)
        throw config_error("data_parallel: the ranks of group " + to_string(dims_of(x)) +
                           " hold different gradient layouts (between " + std::to_string(lo[1]) + " and " +
                           std::to_string(hi[1]) + " elements in between " + std::to_string(lo[0]) + " and " +
                           std::to_string(hi[0]) + " buckets); their stages must be replicas");
    }
    reset_step();
  }

  //! Readies the per-step state for the next step.
  void reset_step() {
    actions_ = 0;
    for (bucket& b : buckets_) {
      b.waiting = static_cast<int>(b.stages.size());
      b.launched = false;
    }
  }

  //! Launches the ready buckets of group `x` in order (all of them when `all`); whether any was.
  bool launch_ready(unsigned x, bool all) {
    bool any = false;
    for (bucket& b : buckets_) {
      if (b.group != x || b.launched) continue;
      if (!all && (b.waiting > 0 || actions_ <= b.launch_after)) return any;  // keep the group's order
      launch(b, all);
      any = true;
    }
    return any;
  }

  void launch(bucket& b, bool after_step) {
    b.launched = true;
    b.launched_at = after_step ? -1 : actions_ - 1;
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) device_launch(b);
    else
#endif
      host_launch(b);
  }

  void host_launch(bucket& b) {
    std::fill(b.grad.begin(), b.grad.end(), value_type{});
    host_move_pieces(b, std::span<value_type>(b.grad), true, [&](const piece& pc) { return grad_of(pc); });
    auto& c = *groups_[b.group];
    if (c.size() == 1) {
      if (zero_ >= 2) std::copy(b.grad.begin(), b.grad.end(), b.shard.begin());
      return;
    }
    settle(b.group);
    if (zero_ >= 2) b.red.start_reduce_scatter(c, std::span<const value_type>(b.grad), std::span<value_type>(b.shard), opt_.deterministic);
    else b.red.start_all_reduce(c, std::span<value_type>(b.grad), opt_.deterministic);
    b.reducing = true;
  }

  void finish_gather(bucket& b) {
    if (!b.gathering) return;
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) device_finish_gather(b);
    else
#endif
      host_finish_gather(b);
  }

  void host_finish_gather(bucket& b) {
    if (b.gather_in_flight) groups_[b.group]->wait(b.gather);
    b.gather = typename comm_type::request{};
    b.gather_in_flight = false;
    b.gathering = false;
    host_move_pieces(b, std::span<value_type>(b.param), false, [&](const piece& pc) { return params_of(pc); });
  }

  // ---- ZeRO-3 (see the file comment) ----------------------------------------------------------
  bool in_bucket(const bucket& b, std::size_t li) const { return std::find(b.stages.begin(), b.stages.end(), li) != b.stages.end(); }

  //! At attach, on groups whose all-reduce needs scratch (`cuda_local`): reserves each group's
  //! largest need (the buckets it all-reduces, and local SGD's average on `dp`), so the scratch is
  //! that, by formula (`memory()`), and never grows inside a step.
  void reserve_scratch() {
    scratch_.assign(groups_used_, 0);
    if constexpr (on_device && requires(comm_type& c) { c.inner().reserve_scratch(std::size_t{}); }) {
      for (const bucket& b : buckets_) {
        if (zero_ > 1 || unreduced(b)) continue;
        auto& c = groups_[b.group]->inner();
        scratch_[b.group] = std::max(scratch_[b.group], c.template all_reduce_scratch<value_type>(b.padded * sizeof(value_type)));
      }
      if (opt_.local_steps > 0) {
        std::size_t total = 0;
        for (const bucket& b : buckets_) total += b.elements;
        const unsigned dp = dp_alone();
        scratch_[dp] = std::max(scratch_[dp], groups_[dp]->inner().template all_reduce_scratch<value_type>(total * sizeof(value_type)));
      }
      for (unsigned x = 0; x < groups_used_; ++x)
        if (scratch_[x] != 0) groups_[x]->inner().reserve_scratch(scratch_[x]);
    }
  }
  //! At attach: every rank keeps its shard of each bucket's parameters, the stages give theirs up.
  void shard_parameters() {
    held_.assign(stages_.size(), 1);
    for (bucket& b : buckets_) {
      auto& c = *groups_[b.group];
      const std::size_t k = b.padded / static_cast<std::size_t>(c.size()), at = static_cast<std::size_t>(c.rank()) * k;
#if defined(LOOM_HAS_CUDA)
      if constexpr (on_device) {
        cuda::device_buffer<value_type> full(b.padded);
        LOOM_CUDA_TRY(cudaMemsetAsync(full.data(), 0, full.bytes(), compute_));
        move_pieces(b, full.span(), true, compute_, "dp parameters pack", [&](const piece& pc) { return params_of(pc); });
        LOOM_CUDA_TRY(cudaMemcpyAsync(b.dpshard.data(), full.data() + at, k * sizeof(value_type), cudaMemcpyDeviceToDevice, compute_));
        LOOM_CUDA_TRY(cudaStreamSynchronize(compute_));
        continue;
      }
#endif
      std::vector<value_type> full(b.padded, value_type{});
      host_move_pieces(b, std::span<value_type>(full), true, [&](const piece& pc) { return params_of(pc); });
      std::copy(full.begin() + static_cast<std::ptrdiff_t>(at), full.begin() + static_cast<std::ptrdiff_t>(at + k), b.pshard.begin());
    }
    for (std::size_t li = 0; li < stages_.size(); ++li) release(li);
  }
  //! Local stage `li` gives up its parameters (after its work so far).
  void release(std::size_t li) {
    if constexpr (releasable_stage<Stage>) {
      if (held_.empty() || held_[li] == 0) return;
      stages_[li].release_params();
      held_[li] = 0;
    }
  }
  //! The step's end: every stage gives its parameters up, every full buffer left is freed.
  void release_all() {
    if (zero_ != 3) return;
    for (std::size_t li = 0; li < stages_.size(); ++li) release(li);
    for (bucket& b : buckets_)
      if (b.full_live) {
        wait_full(b);
        free_full(b);
      }
  }
  //! Starts the all-gather of bucket `b`'s shards into a new full buffer (nothing if it exists).
  void start_full(bucket& b) {
    if (b.full_live) return;
    auto& c = *groups_[b.group];
    b.need = 0;
    for (std::size_t li : b.stages) b.need += held_[li] == 0 ? 1 : 0;
    b.full_live = true;
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) {
      cudaStream_t s = dp_stream_.get();
      join(s, compute_);  // after the last update of the shard
      value_type* p = nullptr;
      LOOM_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&p), b.padded * sizeof(value_type), s));
      cuda::name_memory(p, "r" + std::to_string(mesh_->rank()) + " dp bucket parameters (ZeRO-3, transient)");
      b.dparam = {p, b.padded};
      if (c.size() == 1) {
        const cuda::byte_access acc[] = {cuda::reads(b.dpshard), cuda::writes(b.dparam)};
        cuda::region reg(s, "dp parameters gather", acc);
        LOOM_CUDA_TRY(cudaMemcpyAsync(p, b.dpshard.data(), b.dpshard.size_bytes(), cudaMemcpyDeviceToDevice, s));
      } else {
        c.all_gather(std::span<const value_type>(b.dpshard), b.dparam, s);
      }
      b.gather_in_flight = true;
      return;
    }
#endif
    if constexpr (!on_device) {
      settle(b.group);
      b.param.assign(b.padded, value_type{});
      if (c.size() == 1) {
        std::copy(b.pshard.begin(), b.pshard.end(), b.param.begin());
        return;
      }
      b.gather = c.iall_gather(std::span<const value_type>(b.pshard), std::span<value_type>(b.param));
      b.gather_in_flight = true;
    }
  }
  //! Completes the gather of `b` (on a device: the compute stream waits for it).
  void wait_full(bucket& b) {
    if (!b.gather_in_flight) return;
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) {
      if (!opt_.faults.skip_gather_wait) join(compute_, dp_stream_.get());
      b.gather_in_flight = false;
      return;
    }
#endif
    if constexpr (!on_device) {
      groups_[b.group]->wait(b.gather);
      b.gather = typename comm_type::request{};
      b.gather_in_flight = false;
    }
  }
  //! Frees the full buffer of `b` (on a device: after the compute stream's work so far).
  void free_full(bucket& b) {
    b.full_live = false;
#if defined(LOOM_HAS_CUDA)
    if constexpr (on_device) {
      LOOM_CUDA_TRY(cudaFreeAsync(b.dparam.data(), compute_));
      b.dparam = {};
      return;
    }
#endif
    b.param.clear();
    b.param.shrink_to_fit();
  }
  //! Local stage `li` gets its parameters back from its buckets' gathers; with `prefetch` the
  //! gathers of the next stage in first-use order start too.
  void materialise(std::size_t li, bool prefetch) {
    if constexpr (releasable_stage<Stage>) {
      if (held_[li] == 0) {
        for (bucket& b : buckets_)
          if (in_bucket(b, li)) start_full(b);
        stages_[li].acquire_params();
        held_[li] = 1;
        for (bucket& b : buckets_) {
          if (!in_bucket(b, li)) continue;
          wait_full(b);
          auto params = [&](const piece& pc) { return params_of(pc); };
#if defined(LOOM_HAS_CUDA)
          if constexpr (on_device) move_pieces(b, b.dparam, false, compute_, "dp parameters unpack", params, li);
#endif
          if constexpr (!on_device) host_move_pieces(b, std::span<value_type>(b.param), false, params, li);
          if (b.need > 0 && --b.need == 0) free_full(b);
        }
      }
      if (!prefetch) return;
      const auto at = std::find(use_order_.begin(), use_order_.end(), li);
      for (auto it = at == use_order_.end() ? at : at + 1; it != use_order_.end(); ++it) {
        if (held_[*it] != 0) continue;
        for (bucket& b : buckets_)
          if (in_bucket(b, *it)) start_full(b);
        break;
      }
    } else {
      (void)li;
      (void)prefetch;
    }
  }

  //! Every rank of the mesh learns whether every pipeline succeeded; on failure every rank throws
  //! the same error (the first failed world rank's).
  void agree(int failed_rank, const std::string& cause) {
    reset_step();
    auto& w = mesh_->world();
    const auto P = static_cast<std::size_t>(w.size());
    constexpr std::size_t words = 1 + 32;
    status_.assign(P * words, 0);
    if (failed_rank >= 0) {
      std::int64_t* me = status_.data() + static_cast<std::size_t>(w.rank()) * words;
      me[0] = 1 + mesh_->mesh().group_member(dim::pp, mesh_->rank(), failed_rank);
      const std::size_t n = std::min(cause.size(), (words - 1) * 8);
      for (std::size_t i = 0; i < n; ++i)
        me[1 + i / 8] = static_cast<std::int64_t>(static_cast<std::uint64_t>(me[1 + i / 8]) |
                                                  static_cast<std::uint64_t>(static_cast<unsigned char>(cause[i])) << (8 * (i % 8)));
    }
    w.all_reduce(std::span<std::int64_t>(status_), reduce_op::sum);
    for (std::size_t r = 0; r < P; ++r) {
      const std::int64_t* st = status_.data() + r * words;
      if (st[0] == 0) continue;
      std::string text;
      for (std::size_t i = 0; i < (words - 1) * 8; ++i) {
        auto ch = static_cast<char>((static_cast<std::uint64_t>(st[1 + i / 8]) >> (8 * (i % 8))) & 0xffu);
        if (ch == '\0') break;
        text.push_back(ch);
      }
      throw pipeline_error(static_cast<int>(st[0] - 1), text);
    }
  }

#if defined(LOOM_HAS_CUDA)
  // ---- the device forms (see the file comment) ------------------------------------------------
  //! A zeroed device buffer of `n` elements, owned by the reducer.
  std::span<value_type> device_zeros(std::size_t n, const char* name) {
    dmem_.emplace_back(n);
    auto s = dmem_.back().span();
    if (n != 0) {
      cuda::name_memory(s.data(), "r" + std::to_string(mesh_->rank()) + " " + name);
      LOOM_CUDA_TRY(cudaMemset(s.data(), 0, s.size_bytes()));
    }
    return s;
  }
  //! Later work on `waiter` waits for the work enqueued on `s` so far (one reused event: each
  //! wait takes the record before it).
  void join(cudaStream_t waiter, cudaStream_t s) {
    LOOM_CUDA_TRY(cudaEventRecord(join_.get(), s));
    LOOM_CUDA_TRY(cudaStreamWaitEvent(waiter, join_.get(), 0));
  }
  //! Copies each piece between the bucket buffer `flat` and the stages (`to_flat`: gather the
  //! stages' `what` into it; else scatter it back), on `s`, as one region named `label`.
  //! With `only` set, the pieces of that local stage only.
  template <class Of>
  void move_pieces(const bucket& b, std::span<value_type> flat, bool to_flat, cudaStream_t s, const char* label, Of&& of,
                   std::size_t only = static_cast<std::size_t>(-1)) {
    std::vector<cuda::byte_access> acc;
    for (const piece& pc : b.pieces) {
      if (only != static_cast<std::size_t>(-1) && pc.local != only) continue;
      auto st = of(pc);
      auto fl = flat.subspan(pc.at, pc.size);
      acc.push_back(to_flat ? cuda::reads(st) : cuda::reads(fl));
      acc.push_back(to_flat ? cuda::writes(fl) : cuda::writes(st));
    }
    cuda::region reg(s, label, acc);
    for (const piece& pc : b.pieces) {
      if (only != static_cast<std::size_t>(-1) && pc.local != only) continue;
      auto st = of(pc);
      auto fl = flat.subspan(pc.at, pc.size);
      if (pc.size != 0)
        LOOM_CUDA_TRY(cudaMemcpyAsync(to_flat ? fl.data() : st.data(), to_flat ? st.data() : fl.data(), fl.size_bytes(),
                                      cudaMemcpyDeviceToDevice, s));
    }
  }
  //! Launches bucket `b` on the communication stream, after the compute stream's work so far.
  void device_launch(bucket& b) {
    auto& c = *groups_[b.group];
    cudaStream_t s = dp_stream_.get();
    if (!opt_.faults.skip_bucket_wait) join(s, compute_);  // after the stages' last weight-gradient actions (and their folds)
    bucket_timing* t = timing_.empty() || c.size() == 1 ? nullptr : &timing_[static_cast<std::size_t>(&b - buckets_.data())];
    if (t != nullptr) t->start.record(cuda::stream_ref(s));
    move_pieces(b, b.dgrad, true, s, "dp bucket pack", [&](const piece& pc) { return grad_of(pc); });
    if (c.size() == 1) {
      if (zero_ >= 2) {
        const cuda::byte_access acc[] = {cuda::reads(b.dgrad), cuda::writes(b.dshard)};
        cuda::region reg(s, "dp bucket shard", acc);
        LOOM_CUDA_TRY(cudaMemcpyAsync(b.dshard.data(), b.dgrad.data(), b.dshard.size_bytes(), cudaMemcpyDeviceToDevice, s));
      }
      return;
    }
    if (opt_.deterministic) {  // rank-ordered (the group's own sums where they already are)
      if (zero_ >= 2) ordered_reduce_scatter(c, std::span<const value_type>(b.dgrad), b.dshard, s);
      else ordered_all_reduce(c, b.dgrad, s);
    } else if (zero_ >= 2) {
      c.reduce_scatter(std::span<const value_type>(b.dgrad), b.dshard, reduce_op::sum, s);
    } else {
      c.all_reduce(b.dgrad, reduce_op::sum, s);
    }
    b.reducing = true;
    if (t != nullptr) {
      t->end.record(cuda::stream_ref(s));
      t->step = steps_;
    }
  }
  //! The step's end on a device (see the file comment).
  void device_step_end(int failed_rank, const std::string& cause) {
    if (opt_.measure) {
      dp_done_.record(cuda::stream_ref(dp_stream_.get()));
      measured_ = steps_;
    }
    ++steps_;
    if (!opt_.faults.skip_update_wait) join(compute_, dp_stream_.get());  // every bucket's reduction
    for (bucket& b : buckets_) b.reducing = false;
    release_all();
    agree(failed_rank, cause);
    for (bucket& b : buckets_) {
      if (zero_ == 0) {
        if (unreduced(b)) {  // local SGD: the stage's own gradient, scaled in place
          for (const piece& pc : b.pieces) device_scale(grad_of(pc));
          continue;
        }
        device_scale(b.dgrad.first(b.elements));
        move_pieces(b, b.dgrad, false, compute_, "dp gradient write-back", [&](const piece& pc) { return grad_of(pc); });
        continue;
      }
      auto& c = *groups_[b.group];
      const std::size_t k = b.padded / static_cast<std::size_t>(c.size()), at = static_cast<std::size_t>(c.rank()) * k;
      std::span<value_type> g = zero_ == 1 ? b.dgrad.subspan(at, k) : b.dshard;
      device_scale(g);
      const auto key = static_cast<std::size_t>(&b - buckets_.data());
      if (zero_ == 3) {
        device_update(key, b.dpshard, std::span<const value_type>(g));
        continue;
      }
      move_pieces(b, b.dparam, true, compute_, "dp parameters pack", [&](const piece& pc) { return params_of(pc); });
      std::span<value_type> mine = b.dparam.subspan(at, k);
      device_update(key, mine, std::span<const value_type>(g));
      b.gathering = true;
      if (c.size() == 1) continue;  // nothing to gather: written back at first use
      join(dp_stream_.get(), compute_);
      c.all_gather(std::span<const value_type>(mine), b.dparam, dp_stream_.get());
      b.gather_in_flight = true;
    }
    if (zero_ == 0)
      for (std::size_t li = 0; li < stages_.size(); ++li)
        device_update(li, std::span<value_type>(stages_[li].params()), std::span<const value_type>(stages_[li].weight_grad()));
  }
  //! `g *= grad_scale` on the compute stream (nothing when the scale is 1).
  void device_scale(std::span<value_type> g) {
    if (opt_.grad_scale == 1.0) return;
    const cuda::byte_access acc[] = {cuda::writes(g)};
    cuda::region reg(compute_, "dp gradient scale", acc);
    cuda::detail::scale_async(g.data(), static_cast<value_type>(opt_.grad_scale), g.size(), compute_);
  }
  //! The optimizer on device memory, on the compute stream.
  void device_update(std::size_t key, std::span<value_type> params, std::span<const value_type> grads) {
    const cuda::byte_access acc[] = {cuda::reads(grads), cuda::writes(params)};
    cuda::region reg(compute_, "dp optimizer", acc);
    if constexpr (requires { optimizer_.step(key, params, grads, compute_); }) optimizer_.step(key, params, grads, compute_);
    else optimizer_(params, grads, compute_);
  }
  //! The compute stream waits for the bucket's parameter all-gather, then copies them back.
  void device_finish_gather(bucket& b) {
    if (b.gather_in_flight) join(compute_, dp_stream_.get());
    b.gather_in_flight = false;
    b.gathering = false;
    move_pieces(b, b.dparam, false, compute_, "dp parameters unpack", [&](const piece& pc) { return params_of(pc); });
  }

  // Made only for a device mesh (a host reducer in a CUDA build makes no CUDA objects).
  cudaStream_t compute_ = nullptr;                                   // the pipeline's compute stream
  std::conditional_t<on_device, cuda::stream, char> dp_stream_{};    // the reducer's communication stream
  std::conditional_t<on_device, cuda::event, char> join_{};          // see join()
  std::vector<cuda::device_buffer<value_type>> dmem_;
  struct bucket_timing {  // measure: a bucket's pack and reduction on the reducer's stream
    cuda::event start{true}, end{true};
    long step = -1;  // the step whose reduction they timed
  };
  std::vector<bucket_timing> timing_;
  std::conditional_t<on_device, cuda::event, char> compute_done_{true}, dp_done_{true};  // measure: the step's ends
  long steps_ = 0, measured_ = -1;  // device steps ended; the last one measured
#endif

  MeshComm* mesh_;
  data_parallel_options opt_;
  int zero_ = 0;                        // the ZeRO stage
  std::vector<value_type> avg_;         // local SGD: every parameter, flat (host)
  std::span<value_type> davg_;          // local SGD: the same on a device
  int local_since_ = 0;                 // local SGD: steps since the last average
  std::vector<std::size_t> use_order_;  // local stages by first action (ZeRO-3 prefetch)
  std::vector<std::size_t> scratch_;    // per group: the reduction scratch reserved at attach (bytes; cuda_local)
  std::vector<char> held_;              // ZeRO-3: whether local stage li holds its parameters
  Opt optimizer_;
  static constexpr unsigned expert_bit = 4;   //!< the bit of expert ranges in a group's index
  static constexpr unsigned max_groups = 8;   //!< groups with `ep` ranks (half of them without)
  comm_type* groups_[max_groups] = {};
  unsigned groups_used_ = 4;  //!< 8 with more than one `ep` rank, else 4
  std::span<Stage> stages_;
  std::vector<bucket> buckets_;
  std::vector<std::int64_t> status_;
  std::vector<long> launch_after_;  // per local stage: launch point (see attach)
  long actions_ = 0;
  bool attached_ = false;
  std::mutex mu_;  // the buckets and the group communicators, shared with the helper thread
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread helper_;
};

}  // namespace loom
