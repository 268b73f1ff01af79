// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::plan`: searches data x tensor x pipeline parallel degrees, Megatron sequence
//! parallelism, activation recomputation, pipeline schedule family, chunks per rank and the
//! microbatch count for a model on a cluster, and ranks the configurations that fit in memory by
//! predicted step time, as the configuration studies of Narayanan et al. (SC'21, §3 and §5.4),
//! Pipette (Yoon et al., 2023) and Hagemann et al., "Efficient Parallelization Layouts for
//! Large-Scale Distributed Model Training" (2023) do by measurement.
//!
//! How one configuration is predicted:
//! 1. The model is cut into `S = pp x chunks` virtual stages of `layers / S` layers; the first
//!    stage holds the embeddings, the last the logit layer and the loss. Each stage gets
//!    `f`, `b`, `w` in seconds: its FLOPs (`plan_formulas`) over
//!    `tp x peak_flops x achievable_fraction`, plus its tensor-parallel collectives (2 per layer
//!    in the forward, 2 in the backward, 2 more when the backward recomputes the forward) on the
//!    intra-node link, not overlapped with compute; its `activation` in bytes per microbatch
//!    (Korthikanti et al. 2022); its `message_bytes`; its parameter bytes.
//! 2. That `loom::cost_model` (pipeline ranks on one node share the intra-node link, the others
//!    the inter-node link) replays the family's schedule from the registry through
//!    `loom::simulate`: the makespan is the pipeline time; the bubble is its `bubble_ratio`; the
//!    peak live activation of each rank, in bytes, comes from the schedule's own order.
//! 3. Step time = pipeline time + one ring all-reduce of the rank's gradients over the `dp`
//!    replicas, after the pipeline drains (no overlap, as Megatron-LM 2021 did).
//! 4. Memory per GPU (checked against `cluster_desc::usable_bytes`) = model state (`state_bytes_per_param`, 16 for mixed-precision Adam, no
//!    ZeRO) of the rank's stages / `tp` + the rank's peak activation + with full recomputation
//!    the working set of one layer being recomputed.
//!
//! Rank order on the cluster is Megatron-LM's: tensor-parallel ranks innermost (on one node),
//! then data-parallel, then pipeline; so a data-parallel group leaves the node when
//! `tp x dp > gpus_per_node`, and adjacent pipeline ranks share a node only when
//! `tp x dp < gpus_per_node`.
//!
//! Vocabulary parallelism (Yeung et al., MLSys 2025; `loom/schedule/vocab.hpp`): the families
//! `1f1b-vocab-1/2` and `v-half-vocab-1/2`, named in `plan_options::families`, spread the
//! embedding and the output layer over every pipeline rank (`plan_config::vocab`; the cost model's
//! `vocab_s`, `vocab_t`, `vocab_e` and the tables' parameters on every rank; docs/plan.md).
//!
//! Activation offload (PipeOffload, Wan et al., ICML 2025; `loom/schedule/offload.hpp`): with
//! `plan_options::offload` and a host link in the cluster (`cluster_desc::host`), the family
//! `group-interleaved-1f1b` is tried with every group size g in ceil(pp/2)..pp (`plan_config::group`)
//! and, on an even number of pipeline ranks, with the first 0..chunks chunks of every rank offloaded
//! (`plan_config::offload_chunks`). The copies are planned by `plan_offload` on the average stage
//! (one copy's time: a stage's activation over the host link, relative to the largest f + b + w of
//! a stage) and become actions of the program (`with_offload`); the simulation times them on each
//! rank's host link and frees their activations while they are away, so the predicted peak and the
//! step time include both. A plan the authors' rules refuse (a copy back that cannot fit before its
//! backward) is left out and counted in `plan_report::refused`.
//!
//! Mixture of experts (`model_desc::experts` > 0): the search adds the expert-parallel degree
//! `ep` (a divisor of E; `plan_config::ep`), the world being `dp x ep x tp x pp` with loom's mesh
//! semantics (docs/moe.md): ranks that differ in `ep` hold different experts and different tokens,
//! so the microbatches per step are `global_batch / (dp ep micro_batch)`, the dense parameters are
//! reduced over `dp x ep` and the experts over `dp`. Rank order: tp innermost, then ep, dp, pp.
//! Each GPU holds `E / ep` experts of every MoE layer of its stages, whole (the tokens, not the
//! experts, split over tp), and its MoE layers add four all-to-alls per microbatch
//! (`plan_formulas::moe_all_to_all_bytes`; six with full recomputation) on the ep group's link,
//! not overlapped, and the experts' FLOPs on the `E C` slots it receives, padding included.
//!
//! "SP" here is Megatron-LM sequence parallelism (Korthikanti et al. 2022, §4.2.2): it reuses the
//! tensor-parallel group, so it adds no degree to the mesh; it divides activations (and the
//! pipeline message) by `tp`.
//!
//! Context parallelism (`plan_options::context`, `plan_config::cp`, `cp_kind`): the sequence of
//! every microbatch over `cp` ranks (rank order tp, cp, ep, dp, pp), its attention by Ulysses,
//! ring attention, USP or TokenRing (`detail::context_choices`, `detail::context_times`): the
//! FLOPs over `tp x cp`, the activations, the logits and the pipeline message over `cp`, the
//! attention's exchanges added per layer (ring attention's and TokenRing's hidden under the
//! attention core where it is longer), the gradients reduced over `dp x cp`; dense models on the
//! 1D split. DSP needs two sequence dimensions, which `model_desc` does not describe.
//!
//! Tensor-parallel grids (`plan_config::tp_grid`, `plan_options::grids`; Optimus, Xu et al. 2021;
//! Tesseract, Wang et al. 2022; Bian et al. 2021; `loom/exec/tensor_grid.hpp`): beside the 1D split
//! inside a node, the search tries every 2D (`q x q`), 2.5D (`q x q x d`) and 3D (`q x q x q`) grid
//! of `tp` ranks that divides the cluster and is aligned to its nodes (`tp` a multiple or a divisor
//! of `gpus_per_node`), for a dense model whose layers it splits (`detail::plan_grid_rule`: whole
//! heads per column and whole sequences per member, as the mesh example's grid model runs them). A
//! grid splits the FLOPs and every activation over its `tp` ranks and the weights over `tp` (2.5D:
//! over `q^2`, replicated over its depth). Its collectives per layer, microbatch and call are
//! `grid_block_volume` (the example's block: Q, K, V, the output projection, an MLP of `4h`, two
//! norms; the example's counters equal it every step), each grid group on the intra-node link when
//! it stays in a node, else the inter-node one, priced `calls x (n - 1) alpha + bus bytes x beta`;
//! the weight-gradient call's collectives go into `w`. The embeddings and the output layer are
//! split like the weights, their collectives left out (as the 1D model leaves the embedding's).

#include <algorithm>
#include <cmath>
#include <compare>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "loom/mesh/grid_volume.hpp"
#include "loom/plan/formulas.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/offload.hpp"
#include "loom/schedule/registry.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/vocab.hpp"

namespace loom {

//! How the attention of a context-parallel configuration (`plan_config::cp` > 1) sees the whole
//! sequence (docs/mesh.md, `loom/exec/sequence_parallel.hpp`): Ulysses' all-to-alls over the
//! heads (Jacobs et al. 2023), ring attention's K/V passes (Liu et al. 2023, zig-zag), USP's
//! Ulysses inside ring groups (Fang and Zhao 2024), or TokenRing's queries and partial outputs
//! (Wang et al. 2024), or, for a spatial-temporal model (`model_desc::frames`), DSP's switch of
//! the sharded dimension between layers (Zhao et al., ICML 2025).
enum class context_kind : unsigned char { none, ulysses, ring, usp, tokenring, dsp };

//! The kind's name (`none`, `ulysses`, `ring`, `usp`, `tokenring`, `dsp`).
constexpr const char* to_string(context_kind k) {
  switch (k) {
    case context_kind::dsp: return "dsp";
    case context_kind::ulysses: return "ulysses";
    case context_kind::ring: return "ring";
    case context_kind::usp: return "usp";
    case context_kind::tokenring: return "tokenring";
    case context_kind::none: break;
  }
  return "none";
}

//! One point of the search space.
struct plan_config {
  long long dp = 1;                             //!< data-parallel degree
  long long tp = 1;                             //!< tensor-parallel degree (inside one node)
  long long pp = 1;                             //!< pipeline-parallel degree (ranks of the schedule)
  bool sp = false;                              //!< Megatron sequence parallelism over the TP group
  recompute_kind recompute = recompute_kind::none;  //!< which activations the backward recomputes
  std::string family = "1f1b";                  //!< schedule family (registry name)
  int chunks = 1;                               //!< model chunks per pipeline rank (virtual stages = pp x chunks)
  bool v_placement = false;                     //!< for cost-aware families: V placement (chunks = 2)
  long long microbatches = 1;                   //!< microbatches per step: global_batch / (dp x micro_batch)
  //! Vocabulary parallelism (`1f1b-vocab-*`, `v-half-vocab-*`): 0 none (the embedding on the first
  //! stage, the output layer on the last), 1 or 2 the algorithm (the layers split over every rank).
  int vocab = 0;
  long long ep = 1;  //!< expert-parallel degree (MoE models; see the file comment)
  //! The tensor-parallel group's kind: Megatron's 1D split (`d1`), or a grid of `tp` ranks (`d2`:
  //! q x q, `d2_5`: q x q x `tp_depth`, `d3`: q x q x q; see the file comment).
  tp_kind tp_grid = tp_kind::d1;
  int tp_depth = 1;  //!< 2.5D's layers (1 for the other kinds)
  long long cp = 1;  //!< context-parallel degree: every microbatch's sequence split over `cp` ranks (see the file comment)
  context_kind cp_kind = context_kind::none;  //!< how the attention sees the whole sequence (`none` when cp = 1)
  long long cp_ulysses = 1;                   //!< Ulysses' degree inside cp (ulysses: cp; ring, tokenring: 1; usp: a divisor)
  int group = 0;           //!< `group-interleaved-1f1b`: its microbatch group size g (0 for the other families)
  int offload_chunks = 0;  //!< PipeOffload: the first chunks of every rank whose activations go to host memory (see the file comment)
  friend bool operator==(const plan_config&, const plan_config&) = default;
};

//! The prediction for one configuration.
struct plan_result {
  plan_config config;
  double step_time = 0;         //!< seconds per optimizer step: pipeline_time + dp_time
  double pipeline_time = 0;     //!< makespan of the simulated schedule (compute, TP and p2p communication)
  double dp_time = 0;           //!< gradient all-reduce over the data-parallel group (not overlapped)
  double bubble = 0;            //!< `bubble_ratio` of the simulation: idle fraction of the pipeline time
  double memory_bytes = 0;      //!< largest per-GPU memory over the pipeline ranks
  double state_bytes = 0;       //!< model state (parameters, gradients, optimizer) on that GPU
  double activation_bytes = 0;  //!< peak live activations on that GPU (and the recompute working set)
  bool fits = false;            //!< memory_bytes <= the cluster's usable memory per GPU (`cluster_desc::usable_bytes`)
  //! FLOP/s per GPU by Narayanan et al.'s eq. (3) (the numbers their Table 1 reports); for an
  //! MoE model the FLOPs the stages run (recomputation and capacity padding included).
  double flops_per_gpu = 0;
  //! MoE: bytes of the all-to-alls on ep of the GPU with the most per step (whole buffers; `(ep - 1) / ep` leaves the GPU; 0 for ep = 1).
  double all_to_all_bytes = 0;
  double expert_bytes = 0;  //!< MoE: the experts' model state on the GPU of `memory_bytes`
};

//! What to search (defaults: everything `plan` knows).
struct plan_options {
  //! Families tried (registry names; the vocabulary-parallel `1f1b-vocab-1/2` and
  //! `v-half-vocab-1/2` are planned with their layers spread over the ranks). Cost-aware ones (zb-auto) run on the loop
  //! placement with one chunk and on the V placement; interleaved-1f1b with every chunk count in
  //! [2, max_chunks] that divides the layers per rank; V-placement families with 2 chunks.
  std::vector<std::string> families{"1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-auto", "zb-v", "v-half", "v-min"};
  std::vector<recompute_kind> recompute{recompute_kind::none, recompute_kind::selective, recompute_kind::full};
  bool sp_off = true;  //!< try tensor parallelism without sequence parallelism
  bool sp_on = true;   //!< try Megatron sequence parallelism (only where tp > 1)
  //! Try tensor-parallel grids (2D, 2.5D, 3D) beside Megatron's 1D split, dense models only.
  bool grids = true;
  //! Try context parallelism (a `cp` degree with each `context_kind`), dense models on the 1D split.
  bool context = false;
  //! Try PipeOffload (see the file comment): `group-interleaved-1f1b` with every group size and
  //! 0..chunks offloaded chunks; needs the cluster's host link (`cluster_desc::host`).
  bool offload = false;
  int max_chunks = 8;  //!< largest interleaving degree tried
  //! Shapes with more than this many ranks x microbatches are not given to cost-aware
  //! auto-schedulers (zb-auto, zb-v), whose search grows faster than linearly; 0: no limit.
  long long max_auto_cells = 4096;
  //! Called after each evaluated configuration with (done, total); may be empty.
  std::function<void(std::size_t, std::size_t)> progress;
};

//! The outcome of a search.
struct plan_report {
  std::vector<plan_result> ranked;  //!< configurations that fit, fastest first (dominated variants removed)
  std::size_t evaluated = 0;        //!< configurations simulated
  std::size_t over_memory = 0;      //!< configurations (simulated or pruned by model state alone) over the memory limit
  std::size_t layouts = 0;          //!< (dp, ep, tp, pp) layouts that divide the cluster and the model
  long long cells = 0;              //!< forward passes (ranks x microbatches x chunks) of the configurations simulated
  bool moe = false;                 //!< the model has experts (the table shows ep, the all-to-all volume and the expert memory)
  bool context = false;             //!< the search tried context parallelism (the table shows cp and its kind)
  std::size_t refused = 0;          //!< offload plans PipeOffload's rules refuse (left out)
};

namespace detail {

//! The rule a model breaks, or "" (field names as in the JSON file).
inline std::string check_model_desc(const model_desc& m) {
  auto pos = [](const char* f, long long v) -> std::string {
    return v > 0 ? std::string() : "field \"" + std::string(f) + "\" must be a positive integer (got " + std::to_string(v) + ")";
  };
  for (auto [f, v] : {std::pair<const char*, long long>{"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads},
                      {"seq", m.seq}, {"vocab", m.vocab}, {"bytes_per_element", m.bytes_per_element},
                      {"micro_batch", m.micro_batch}, {"global_batch", m.global_batch}})
    if (auto r = pos(f, v); !r.empty()) return r;
  if (m.layers > (1LL << 20)) return "field \"layers\" must be at most 1048576 (got " + std::to_string(m.layers) + ")";
  if (m.hidden % m.heads != 0)
    return "field \"heads\" must divide \"hidden\" (" + std::to_string(m.hidden) + " is not a multiple of " + std::to_string(m.heads) + ")";
  if (m.global_batch % m.micro_batch != 0)
    return "field \"global_batch\" must be a multiple of \"micro_batch\" (got " + std::to_string(m.global_batch) + " and " +
           std::to_string(m.micro_batch) + ")";
  if (!(std::isfinite(m.state_bytes_per_param) && m.state_bytes_per_param >= 0))
    return "field \"state_bytes_per_param\" must be a finite number >= 0";
  if (m.frames < 0) return "field \"frames\" must be >= 0 (got " + std::to_string(m.frames) + "; 0: a sequence model)";
  if (m.frames > 0 && m.seq % m.frames != 0)
    return "field \"frames\" must divide \"seq\" (" + std::to_string(m.seq) + " tokens are not " + std::to_string(m.frames) +
           " frames of equal size)";
  if (m.experts < 0) return "field \"experts\" must be >= 0 (got " + std::to_string(m.experts) + "; 0: a dense model)";
  if (m.experts > 0) {
    if (m.top_k < 1 || m.top_k > m.experts)
      return "field \"top_k\" must be between 1 and \"experts\" " + std::to_string(m.experts) + " (got " + std::to_string(m.top_k) + ")";
    if (m.moe_every < 1) return "field \"moe_every\" must be a positive integer (got " + std::to_string(m.moe_every) + ")";
    if (!(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0))
      return "field \"capacity_factor\" must be a finite number >= 0 (0: no dropping; got " + std::string(detail::real_text(m.capacity_factor)) + ")";
  }
  return {};
}

//! The rule a cluster breaks, or "" (field names as in the JSON file).
inline std::string check_cluster_desc(const cluster_desc& c) {
  // Caps keep a mistyped size from making the search loop for hours (a rule, never a clamp).
  if (c.gpus > (1LL << 24)) return "field \"gpus\" must be at most 16777216 (got " + std::to_string(c.gpus) + ")";
  if (c.gpus <= 0) return "field \"gpus\" must be a positive integer (got " + std::to_string(c.gpus) + ")";
  if (c.gpus_per_node <= 0) return "field \"gpus_per_node\" must be a positive integer (got " + std::to_string(c.gpus_per_node) + ")";
  if (c.gpus % c.gpus_per_node != 0 && c.gpus > c.gpus_per_node)
    return "field \"gpus\" must be a multiple of \"gpus_per_node\" (got " + std::to_string(c.gpus) + " and " +
           std::to_string(c.gpus_per_node) + ")";
  auto positive = [](const char* f, double v) -> std::string {
    return std::isfinite(v) && v > 0 ? std::string() : "field \"" + std::string(f) + "\" must be a finite number > 0 (got " + std::string(detail::real_text(v)) + ")";
  };
  if (auto r = positive("memory_bytes", c.memory_bytes); !r.empty()) return r;
  if (auto r = positive("peak_flops", c.peak_flops); !r.empty()) return r;
  if (auto r = positive("achievable_fraction", c.achievable_fraction); !r.empty()) return r;
  if (!(std::isfinite(c.reserved_bytes) && c.reserved_bytes >= 0 && c.reserved_bytes < c.memory_bytes))
    return "field \"reserved_gib\" must be a number >= 0 and below \"memory_gib\" (got " + std::string(detail::real_text(c.reserved_bytes / (1024.0 * 1024 * 1024))) + " GiB)";
  if (c.achievable_fraction > 1) return "field \"achievable_fraction\" must be <= 1 (got " + detail::real_text(c.achievable_fraction) + ")";
  for (auto [f, v] : {std::pair<const char*, double>{"intra.alpha", c.intra.alpha}, {"intra.beta", c.intra.beta},
                      {"inter.alpha", c.inter.alpha}, {"inter.beta", c.inter.beta}, {"host.alpha", c.host.alpha}, {"host.beta", c.host.beta}})
    if (!(std::isfinite(v) && v >= 0)) return "field \"" + std::string(f) + "\" must be a finite number >= 0 (got " + std::string(detail::real_text(v)) + ")";
  return {};
}

//! Fraction of a stage's activation that lives until its `W` (the Zero Bubble paper's
//! `M_W / M_B`, Qi et al. 2024, §2: `M_W = 32 s b h`, `M_B = 34 s b h + 5 a s^2 b`; the layer
//! input kept under full recomputation is needed by `W` as well).
constexpr double plan_mem_w_ratio(const model_desc& m, recompute_kind r) {
  if (r == recompute_kind::full) return 1;
  const double attn = r == recompute_kind::none ? 5.0 * m.heads * plan_formulas::attention_span(m) / m.hidden : 0;
  return 32 / (34 + attn);
}

//! MoE layers of virtual stage `st` of `S` (its `layers / S` consecutive layers).
constexpr long long stage_moe_layers(const model_desc& m, int st, int S) {
  const long long L = m.layers / S;
  return plan_formulas::moe_layers_in(m, st * L, L);
}

//! Parameters of virtual stage `st` of `S` (layers split evenly; embeddings on stage 0; the
//! tied output projection on stage S - 1: Megatron-LM keeps a copy there). With vocabulary
//! parallelism (`vocab` != 0) only the position embedding stays on stage 0: the word embedding and
//! the (untied) output projection are `vocab_params_per_rank` on every rank.
constexpr double stage_params(const model_desc& m, int st, int S, int vocab = 0) {
  const long long L = m.layers / S, q = stage_moe_layers(m, st, S);
  double p = static_cast<double>(L - q) * plan_formulas::layer_params(m) + static_cast<double>(q) * plan_formulas::moe_layer_dense_params(m);
  if (vocab != 0) return st == 0 ? p + static_cast<double>(m.seq) * m.hidden : p;
  if (st == 0) p += plan_formulas::embedding_params(m);
  if (st == S - 1) p += static_cast<double>(m.vocab) * m.hidden;
  return p;
}

//! The experts of virtual stage `st` of `S`, all `E` of each of its MoE layers (a GPU holds `1 / ep` of them).
constexpr double stage_expert_params(const model_desc& m, int st, int S) {
  return static_cast<double>(stage_moe_layers(m, st, S)) * static_cast<double>(m.experts) * plan_formulas::expert_params(m);
}

//! Vocabulary parallelism over `pp` pipeline ranks: the word embedding's and the output
//! projection's rows each rank holds, `2 V h / pp` (the vocabulary paper unties them).
constexpr double vocab_params_per_rank(const model_desc& m, long long pp) {
  return 2.0 * static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / static_cast<double>(pp);
}

//! Vocabulary parallelism: the activation bytes of the output layer's `S` pass on one GPU, alive
//! until its `T` (one microbatch at a time on every rank: `T(j)` runs before `S(j + 1)`): the fp32
//! exponentials of the shard's logits, `4 s b V / (tp pp)`, and the received input `s b h`.
constexpr double vocab_stash_bytes(const model_desc& m, long long tp, long long pp) {
  return plan_formulas::logit_activation_bytes(m, tp) / static_cast<double>(pp) +
         static_cast<double>(m.seq) * m.micro_batch * m.hidden * m.bytes_per_element;
}

//! Time of a broadcast of `bytes` from one of `n` GPUs on link `l`, pipelined: `(n - 1)` steps of
//! `alpha` and the bytes once through a link. 0 for `n = 1`.
constexpr double broadcast_time(double bytes, long long n, const link_cost& l) {
  return n <= 1 ? 0 : static_cast<double>(n - 1) * l.alpha + bytes * l.beta;
}

//! The vocabulary-parallel families `plan` knows (also in the registry, `family_entry::vocab`;
//! planned with the input and output layers spread over the ranks): name, algorithm, chunks per
//! rank (2: V placement).
struct plan_vocab_family {
  std::string_view name;
  int vocab;
  int chunks;
};
inline constexpr plan_vocab_family plan_vocab_families[] = {
    {"1f1b-vocab-1", 1, 1}, {"1f1b-vocab-2", 2, 1}, {"v-half-vocab-1", 1, 2}, {"v-half-vocab-2", 2, 2}};

//! The vocabulary-parallel family named `name`, or null.
inline const plan_vocab_family* find_plan_vocab_family(std::string_view name) {
  for (const plan_vocab_family& f : plan_vocab_families)
    if (f.name == name) return &f;
  return nullptr;
}

//! The shape rule of vocabulary-parallel family `f`, or "".
inline std::string check_plan_vocab_family(const plan_vocab_family& f, const shape& s) {
  if (f.chunks == 1) return std::string(f.vocab == 1 ? check(one_f_one_b_vocab_1{}, s) : check(one_f_one_b_vocab_2{}, s));
  return std::string(f.vocab == 1 ? check(v_half_vocab_1{}, s) : check(v_half_vocab_2{}, s));
}

//! Generates vocabulary-parallel family `f` (the 1F1B ones see the average stage costs `u`).
inline schedule make_plan_vocab_family(const plan_vocab_family& f, const shape& s, const costs& u) {
  if (f.chunks == 1) return f.vocab == 1 ? generate(one_f_one_b_vocab_1{}, s, {.cost = u}) : generate(one_f_one_b_vocab_2{}, s, {.cost = u});
  return f.vocab == 1 ? generate(v_half_vocab_1{}, s) : generate(v_half_vocab_2{}, s);
}

//! The tensor-parallel grid of `k` (`tp_kind::d1` for Megatron's 1D split).
constexpr loom::tp_grid plan_grid(const plan_config& k) {
  return make_tp_grid(k.tp_grid, static_cast<int>(k.tp), k.tp_grid == tp_kind::d2_5 ? k.tp_depth : 0);
}

//! The ranks each weight is split over: `tp`, except on a 2.5D grid, whose `tp_depth` layers hold
//! the same `q x q` blocks.
constexpr double weight_split(const plan_config& k) {
  return static_cast<double>(k.tp_grid == tp_kind::d2_5 ? k.tp / k.tp_depth : k.tp);
}

//! Whether every activation is split over the `tp` ranks: Megatron-SP, or a grid (the tokens over
//! its rows and layers, the features over its columns).
constexpr bool splits_activations(const plan_config& k) { return k.sp || k.tp_grid != tp_kind::d1; }

//! The token blocks a microbatch splits into on grid `g`: `q d` on a 2D or 2.5D grid, `q^2` on a
//! 3D one.
constexpr long long grid_token_blocks(const loom::tp_grid& g) {
  return static_cast<long long>(g.q) * (g.kind == tp_kind::d3 ? g.q : g.depth);
}

//! Tokens of one microbatch on one member of grid `g`.
constexpr long long grid_member_tokens(const model_desc& m, const loom::tp_grid& g) { return m.seq * m.micro_batch / grid_token_blocks(g); }

//! The rule model `m` breaks on grid `g`, or "": the block's layers split (`summa_rule`,
//! `cube_rule` for `h -> h`, `h -> 4h`, `4h -> h` over the microbatch's tokens), whole heads per
//! column (`heads % q`), and whole sequences per member (`micro_batch` a multiple of the token
//! blocks, `q d` or `q^2`: the attention is local, as the mesh example's grid model runs it).
inline std::string plan_grid_rule(const model_desc& m, const loom::tp_grid& g) {
  const auto h = static_cast<std::size_t>(m.hidden), n = static_cast<std::size_t>(m.seq * m.micro_batch);
  for (auto [in, out] : {std::pair{h, h}, std::pair{h, 4 * h}, std::pair{4 * h, h}}) {
    const text r = g.kind == tp_kind::d3 ? cube_rule(in, out, n, g) : summa_rule(in, out, n, g);
    if (!r.empty()) return std::string(r.view());
  }
  if (m.heads % g.q != 0) return "tensor parallel " + std::string(g.describe().view()) + ": " + std::to_string(m.heads) + " heads are not divisible by q";
  const long long blocks = grid_token_blocks(g);
  if (m.micro_batch % blocks != 0)
    return "tensor parallel " + std::string(g.describe().view()) + ": a microbatch of " + std::to_string(m.micro_batch) +
           " sequences does not split into " + std::to_string(blocks) + " token blocks of whole sequences";
  return {};
}

//! The link of grid group `x` on `c`: the intra-node link when every group of that kind of the
//! tp group's ranks (tp innermost, the group aligned to nodes) stays inside a node, else the
//! inter-node link. A row's members are `q` consecutive ranks, a column's lie in an aligned
//! block of `q^2`, the depth group's in the whole grid (`tp_grid::member`), so a kind stays in its
//! nodes when each such block does.
inline const link_cost& grid_group_link(const cluster_desc& c, const loom::tp_grid& g, grid_group x) {
  const long long w = x == grid_group::row ? g.q : x == grid_group::column ? static_cast<long long>(g.q) * g.q : g.ranks;
  for (long long b = 0; b < g.ranks; b += w)
    if (b / c.gpus_per_node != (b + w - 1) / c.gpus_per_node) return c.inter;
  return c.intra;
}

//! Seconds one grid member spends in the collectives of one layer's call `call` on one
//! microbatch (`grid_block_volume` with `f = 4h`): per group and operation, `calls x (n - 1)`
//! latencies and the bus bytes (`loom::bus_factor`) over its link.
inline double grid_layer_time(const model_desc& m, const cluster_desc& c, const loom::tp_grid& g, grid_block_volume::call call) {
  const auto h = static_cast<std::size_t>(m.hidden);
  const grid_block_volume v = grid_block_volume::of(g, static_cast<std::size_t>(grid_member_tokens(m, g)), h, 4 * h, call);
  double t = 0;
  for (const auto& [key, e] : v.elements) {
    const auto [x, op] = key;
    const int n = g.size(x);
    const link_cost& l = grid_group_link(c, g, x);
    t += static_cast<double>(v.calls.at(key)) * static_cast<double>(n - 1) * l.alpha +
         static_cast<double>(e) * m.bytes_per_element * bus_factor(op, n) * l.beta;
  }
  return t;
}

//! The context-parallel kinds `plan` tries for `cp` ranks under `tp`-way tensor parallelism, with
//! their Ulysses degree: none for cp = 1; else Ulysses when the `heads / tp` split over cp, ring
//! attention and TokenRing when the sharded dimension (the sequence; a spatial-temporal model's
//! patches per frame) splits into `2 cp` zig-zag chunks, USP with each Ulysses degree `u` strictly
//! between 1 and cp that divides cp and the heads (both rules), and DSP for a spatial-temporal
//! model whose frames and patches per frame both split over cp.
inline std::vector<std::pair<context_kind, long long>> context_choices(const model_desc& m, long long tp, long long cp) {
  if (cp == 1) return {{context_kind::none, 1}};
  std::vector<std::pair<context_kind, long long>> out;
  const long long heads = m.heads / tp, sharded = m.frames > 0 ? m.seq / m.frames : m.seq;
  const bool zigzag = sharded % (2 * cp) == 0;
  if (heads % cp == 0) out.push_back({context_kind::ulysses, cp});
  if (zigzag) {
    out.push_back({context_kind::ring, 1});
    out.push_back({context_kind::tokenring, 1});
    for (long long u = 2; u < cp; ++u)
      if (cp % u == 0 && heads % u == 0) out.push_back({context_kind::usp, u});
  }
  if (m.frames > 0 && m.frames % cp == 0 && sharded % cp == 0) out.push_back({context_kind::dsp, 1});
  return out;
}

//! Seconds of one layer's context-parallel communication per microbatch on one GPU that its
//! attention does not hide, forward (`f`) and input-gradient backward (`b`); `attn_f` and `attn_b`
//! are the compute seconds of the attention core along the sharded dimension, which the K/V passes
//! of ring attention and TokenRing's messages overlap (double-buffered: only what exceeds them
//! counts). With `n = s b h / (tp cp)` elements (a rank's Q, K, V or output) and `m = s b a / (tp
//! cp)` (its log-sum-exp): Ulysses (over `u` ranks) 4 all-to-alls of `n` forward and 4 backward,
//! not overlapped; ring attention over `R = cp / u` positions `R - 1` passes of K and V (`2n`)
//! forward and `2R - 1` (K, V again, then dK, dV) backward; TokenRing `R - 1` steps forward, each
//! the queries one way (`n`) and a partial output with its log-sum-exp (`n + m`) the other, so `n +
//! m` a step on a full-duplex link, and backward `R - 1` bundles of `2n + 2m` and `R` query
//! gradients of `n`, one way (docs/mesh.md). On a spatial-temporal model (`model_desc::frames`)
//! the tokens stay sharded along the patches, so only the spatial layers (half of them) exchange:
//! these kinds cost half of the above per layer on average. DSP switches the sharded dimension
//! after every layer instead: one all-to-all of the rank's hidden state `s b h / cp` (whole on
//! every tp rank) forward and one backward. The Ulysses group (adjacent cp ranks), the ring and
//! DSP's group run on the intra-node link while they stay in a node (tp innermost, then cp), else
//! on the inter-node one.
struct context_cost {
  double f = 0, b = 0;
};
inline context_cost context_times(const model_desc& m, const cluster_desc& c, const plan_config& k, double attn_f, double attn_b) {
  context_cost out;
  if (k.cp <= 1) return out;
  const double e = m.bytes_per_element, T = static_cast<double>(k.tp * k.cp);
  const double n = static_cast<double>(m.seq) * m.micro_batch * m.hidden / T * e, lse = static_cast<double>(m.seq) * m.micro_batch * m.heads / T * e;
  if (k.cp_kind == context_kind::dsp) {
    const link_cost& l = k.tp * k.cp > c.gpus_per_node ? c.inter : c.intra;
    const double sw = plan_formulas::all_to_all_time(n * static_cast<double>(k.tp), k.cp, l);
    return {sw, sw};
  }
  const long long u = k.cp_kind == context_kind::ulysses ? k.cp : k.cp_kind == context_kind::usp ? k.cp_ulysses : 1;
  const long long R = k.cp / u;
  if (u > 1) {
    const link_cost& l = k.tp * u > c.gpus_per_node ? c.inter : c.intra;
    const double a2a = plan_formulas::all_to_all_time(n, u, l);
    out.f += 4 * a2a;
    out.b += 4 * a2a;
  }
  if (R > 1) {
    const link_cost& l = k.tp * k.cp > c.gpus_per_node ? c.inter : c.intra;
    const double Rm1 = static_cast<double>(R - 1), Rd = static_cast<double>(R);
    double f = 0, b = 0;
    if (k.cp_kind == context_kind::tokenring) {
      f = Rm1 * l.time(n + lse);
      b = Rm1 * l.time(2 * n + 2 * lse) + Rd * l.time(n);
    } else {
      f = Rm1 * l.time(2 * n);
      b = (2 * Rd - 1) * l.time(2 * n);
    }
    out.f += std::max(0.0, f - attn_f);
    out.b += std::max(0.0, b - attn_b);
  }
  if (m.frames > 0) {  // only the spatial half of the layers exchanges
    out.f /= 2;
    out.b /= 2;
  }
  return out;
}

//! Pipeline ranks per node for `cost_model::ranks_per_node` (Megatron rank order: tp, ep, dp, pp).
constexpr int pipeline_ranks_per_node(const cluster_desc& c, const plan_config& k) {
  const long long inner = k.tp * k.cp * k.ep * k.dp;
  return inner >= c.gpus_per_node ? 1 : static_cast<int>(c.gpus_per_node / inner);
}

//! FLOPs one GPU runs for virtual stage `st` of `S` on one microbatch under `k`: the forward,
//! the input-gradient backward with what it recomputes, and the weight-gradient backward. The
//! dense part splits over tp; an MoE layer's MLP is replaced by its experts on the `E C` slots the
//! GPU receives (`plan_formulas::moe_expert_forward_flops`, once more in `b` under full recomputation).
struct stage_flops {
  double f = 0, b = 0, w = 0;
};
inline stage_flops stage_gpu_flops(const model_desc& m, const plan_config& k, int st, int S) {
  namespace pf = plan_formulas;
  const auto L = static_cast<double>(m.layers / S), q = static_cast<double>(stage_moe_layers(m, st, S));
  const double mlp = 16.0 * m.micro_batch * m.seq * m.hidden * m.hidden, T = static_cast<double>(k.tp * k.cp);
  const bool full = k.recompute == recompute_kind::full;
  stage_flops x;
  x.f = L * pf::layer_forward_flops(m) - q * mlp;
  x.b = L * (pf::layer_input_grad_flops(m) + pf::layer_recompute_flops(m, k.recompute)) - q * mlp * (full ? 2 : 1);
  x.w = L * pf::layer_weight_grad_flops(m) - q * mlp;
  if (st == S - 1 && k.vocab == 0) {
    x.f += pf::logit_forward_flops(m);
    x.b += pf::logit_forward_flops(m);
    x.w += pf::logit_forward_flops(m);
  }
  x.f /= T;
  x.b /= T;
  x.w /= T;
  if (q > 0) {
    const double e = q * pf::moe_expert_forward_flops(m, k.tp);
    x.f += e;
    x.b += full ? 2 * e : e;
    x.w += e;
  }
  return x;
}

// A configuration's layout (everything but the sequence-parallel and recomputation variants) and
// its full label: a total order over the configurations one search ranks.
struct plan_layout {
  long long dp, ep, tp;
  int grid, depth;
  long long cp;
  int cp_kind;
  long long cp_ulysses, pp;
  std::string family;
  int chunks;
  bool v_placement;
  auto operator<=>(const plan_layout&) const = default;
};
struct plan_label {
  plan_layout layout;
  bool sp;
  int recompute;
  int group, offload_chunks;  // variants of a layout, as sp and recompute: they trade time for memory
  auto operator<=>(const plan_label&) const = default;
};
inline plan_label label_of(const plan_config& k) {
  return {{k.dp, k.ep, k.tp, static_cast<int>(k.tp_grid), k.tp_depth, k.cp, static_cast<int>(k.cp_kind), k.cp_ulysses, k.pp, k.family, k.chunks,
           k.v_placement},
          k.sp,
          static_cast<int>(k.recompute),
          k.group,
          k.offload_chunks};
}
}  // namespace detail

//! The `loom::cost_model` of configuration `k` (`pp x chunks` stages; see the file comment):
//! times in seconds, `activation` in bytes per microbatch on one GPU, `param_bytes` the stage's
//! parameters on one GPU (`bytes_per_element` each). Requires `layers % (pp x chunks) == 0`.
inline cost_model plan_cost_model(const model_desc& m, const cluster_desc& c, const plan_config& k) {
  namespace pf = plan_formulas;
  const int S = static_cast<int>(k.pp * k.chunks);
  if (S < 1 || m.layers % S != 0)
    throw config_error("plan: " + std::to_string(m.layers) + " layers cannot be split into " + std::to_string(S) + " stages");
  if (k.ep < 1 || (k.ep > 1 && (m.experts <= 0 || m.experts % k.ep != 0)))
    throw config_error("plan: " + std::to_string(m.experts) + " experts do not split over " + std::to_string(k.ep) + " expert-parallel ranks");
  const double L = static_cast<double>(m.layers / S);
  // The all-to-alls of an MoE layer on the ep group's link (it leaves the node when tp x ep does).
  const double a2a = m.experts > 0 ? pf::all_to_all_time(pf::moe_all_to_all_bytes(m, k.tp), k.ep, k.tp * k.ep > c.gpus_per_node ? c.inter : c.intra) : 0;
  const double moe_act = m.experts > 0 && k.recompute != recompute_kind::full
                             ? pf::moe_expert_activation_bytes(m, k.tp) - pf::mlp_activation_bytes(m, k.tp, k.sp)
                             : 0;
  const double rate = c.peak_flops * c.achievable_fraction;  // one GPU's
  const bool grid = k.tp_grid != tp_kind::d1, full = k.recompute == recompute_kind::full;
  if (grid && (m.experts > 0 || k.vocab != 0))
    throw config_error("plan: tensor-parallel grids are modelled for dense models without vocabulary parallelism");
  // Per layer and microbatch: 1D, 2 all-reduces of s b h forward and 2 backward (2 more when the
  // backward recomputes the forward); a grid, its block's collectives in each call.
  double comm_f = 0, comm_b = 0, comm_w = 0;
  if (grid) {
    const loom::tp_grid g = detail::plan_grid(k);
    if (std::string rule = detail::plan_grid_rule(m, g); !rule.empty()) throw config_error("plan: " + rule);
    comm_f = detail::grid_layer_time(m, c, g, grid_block_volume::call::forward);
    comm_b = detail::grid_layer_time(m, c, g, grid_block_volume::call::input) + (full ? comm_f : 0);
    comm_w = detail::grid_layer_time(m, c, g, grid_block_volume::call::weight);
  } else {
    // (With context parallelism each rank's all-reduces carry its s b / cp tokens.)
    const double coll = pf::ring_allreduce_time(pf::tp_collective_bytes(m) / static_cast<double>(k.cp), k.tp, c.intra);
    comm_f = 2 * coll;
    comm_b = (full ? 4 : 2) * coll;
  }
  // Context parallelism: what the attention's exchanges add (the attention core's FLOPs along the
  // sharded dimension, 4 b s^2 h forward and 8 b s^2 h in B, hide ring attention's and TokenRing's messages).
  if (k.cp > 1 || k.cp_kind != context_kind::none) {
    const auto choices = detail::context_choices(m, k.tp, k.cp);
    if (grid || m.experts > 0 || k.vocab != 0 || k.cp < 1 ||
        std::find(choices.begin(), choices.end(), std::pair{k.cp_kind, k.cp_ulysses}) == choices.end())
      throw config_error("plan: context parallelism cp " + std::to_string(k.cp) + " (" + to_string(k.cp_kind) + ", Ulysses degree " +
                         std::to_string(k.cp_ulysses) + ") is not one plan models for this model (dense, on the 1D split, heads / tp " +
                         "divisible by the Ulysses degree, the sequence (a spatial-temporal model's patches per frame) into 2 cp chunks; DSP: a " +
                         "spatial-temporal model whose frames and patches per frame divide by cp)");
    // The attention core along the sharded dimension: the sequence, or a frame's patches.
    const double span = static_cast<double>(m.frames > 0 ? m.seq / m.frames : m.seq);
    const double T = static_cast<double>(k.tp * k.cp), core = 4.0 * m.micro_batch * m.seq * span * m.hidden / T / rate;
    const detail::context_cost cc = detail::context_times(m, c, k, core, 2 * core);
    comm_f += cc.f;
    comm_b += cc.b + (full ? cc.f : 0);
  }
  const bool split = detail::splits_activations(k);
  const double cpd = static_cast<double>(k.cp);  // the tokens split over cp
  const double act_layer = pf::layer_activation_bytes(m, k.tp, split, k.recompute) / cpd;
  cost_model out;
  out.stages.resize(static_cast<std::size_t>(S));
  for (int st = 0; st < S; ++st) {
    stage_cost& x = out.stages[static_cast<std::size_t>(st)];
    const detail::stage_flops fl = detail::stage_gpu_flops(m, k, st, S);
    const auto q = static_cast<double>(detail::stage_moe_layers(m, st, S));
    double act = L * act_layer + q * moe_act;
    if (st == S - 1 && k.vocab == 0) act += pf::logit_activation_bytes(m, k.tp) / cpd;
    x.f = fl.f / rate + L * comm_f + q * 2 * a2a;
    x.b = fl.b / rate + L * comm_b + q * (full ? 4 : 2) * a2a;
    x.w = fl.w / rate + L * comm_w;
    x.activation = act;
    x.activation_bytes = act;  // what an offload copies over the host link
    x.message_bytes = pf::p2p_message_bytes(m, k.tp, split) / cpd;
    x.param_bytes = (detail::stage_params(m, st, S, k.vocab) / detail::weight_split(k) +
                     detail::stage_expert_params(m, st, S) / static_cast<double>(k.ep)) *
                    m.bytes_per_element;
  }
  out.intra = c.intra;
  out.inter = c.inter;
  out.host = c.host;
  out.ranks_per_node = detail::pipeline_ranks_per_node(c, k);
  out.mem_w_ratio = detail::plan_mem_w_ratio(m, k.recompute);
  if (k.vocab != 0) {
    // Each rank's share of the output layer's three GEMMs (2 b s h V / pp each): S runs one
    // (Algorithm 1) or two (Algorithm 2, which forms the input gradient early), T the others.
    // The collectives run on the pipeline ranks' link, not overlapped: S receives the last
    // stage's output (a broadcast of s b h) and all-reduces 3 fp32 statistics per token
    // (Algorithm 2: and the s b h input gradient); T (Algorithm 1) all-reduces the s b h input
    // gradient; IF all-reduces and IB broadcasts the s b h embedding and its gradient (their
    // lookups are memory-bound and left out).
    const double P = static_cast<double>(k.pp);
    const link_cost& l = out.ranks_per_node >= k.pp ? c.intra : c.inter;
    const double gemm = pf::logit_forward_flops(m) / P / (static_cast<double>(k.tp) * rate), x = pf::tp_collective_bytes(m);
    const double stats = 3.0 * 4 * static_cast<double>(m.seq) * m.micro_batch;
    out.vocab_s = (k.vocab == 1 ? 1 : 2) * gemm + detail::broadcast_time(x, k.pp, l) + pf::ring_allreduce_time(stats, k.pp, l) +
                  (k.vocab == 2 ? pf::ring_allreduce_time(x, k.pp, l) : 0);
    out.vocab_t = (k.vocab == 1 ? 2 : 1) * gemm + (k.vocab == 1 ? pf::ring_allreduce_time(x, k.pp, l) : 0);
    out.vocab_e = (pf::ring_allreduce_time(x, k.pp, l) + detail::broadcast_time(x, k.pp, l)) / 2;
  }
  return out;
}

namespace detail {

//! The average stage of `cm` over `P` pipeline ranks, as uniform costs (a rank share's f, b, w).
inline costs average_costs(const cost_model& cm, double P) {
  costs u{.f = 0, .b = 0, .w = 0};
  for (auto const& x : cm.stages) {
    u.f += x.f / P;
    u.b += x.b / P;
    u.w += x.w / P;
  }
  return u;
}

//! PipeOffload's plan for configuration `k` (`k.offload_chunks` > 0) over its schedule `s` (see the
//! file comment): `plan_offload` on the average stage of `plan_cost_model` in units of its forward
//! (the authors' times are rounded to hundredths of a unit), one copy's time the largest stage
//! activation over the host link relative to the largest f + b + w of a stage.
inline offload_plan plan_offload_for(const model_desc& m, const cluster_desc& c, const plan_config& k, const schedule& s) {
  const cost_model cm = plan_cost_model(m, c, k);
  costs u = average_costs(cm, static_cast<double>(k.pp));
  double largest = 0, copy = 0;
  for (auto const& x : cm.stages) {
    largest = std::max(largest, x.f + x.b + x.w);
    copy = std::max(copy, c.host.time(x.activation_bytes));
  }
  const double unit = u.f > 0 ? u.f : 1;
  u.f /= unit;
  u.b /= unit;
  u.w /= unit;
  u.mem_w_ratio = cm.mem_w_ratio;
  return plan_offload(s, u, {.chunks = k.offload_chunks, .time = largest > 0 ? copy / largest : 0});
}

}  // namespace detail

//! Predicts configuration `k` with the schedule `s` (generated for `pp` ranks, `microbatches`
//! and `chunks`): simulates it under `plan_cost_model` and adds the data-parallel all-reduce and
//! the model state. Throws `schedule_error` when the simulation fails.
inline plan_result evaluate_plan(const model_desc& m, const cluster_desc& c, const plan_config& k, const schedule& s) {
  namespace pf = plan_formulas;
  const cost_model cm = plan_cost_model(m, c, k);
  const simulation sim = simulate(s, cm);
  if (!sim.ok) throw schedule_error("plan: " + k.family + " did not simulate: " + std::string(sim.error));
  plan_result r;
  r.config = k;
  r.pipeline_time = sim.makespan;
  r.bubble = sim.bubble_ratio;
  // Per rank: the parameters of its stages (direction 0 of the placement), dense and experts
  // (all E; a GPU holds 1 / ep of them), its MoE layers and the FLOPs of its stages.
  std::vector<double> params(static_cast<std::size_t>(s.ranks), 0.0), experts(params), moe_layers(params);
  double flops = 0;  // all stages, per GPU and microbatch
  for (int st = 0; st < s.stages; ++st) {
    const auto rk = static_cast<std::size_t>(s.stage_to_rank[static_cast<std::size_t>(st)]);
    params[rk] += detail::stage_params(m, st, s.stages, k.vocab);
    experts[rk] += detail::stage_expert_params(m, st, s.stages);
    moe_layers[rk] += static_cast<double>(detail::stage_moe_layers(m, st, s.stages));
    const detail::stage_flops fl = detail::stage_gpu_flops(m, k, st, s.stages);
    flops += fl.f + fl.b + fl.w;
  }
  if (k.vocab != 0)
    for (double& p : params) p += detail::vocab_params_per_rank(m, k.pp);
  const double transient = (k.recompute == recompute_kind::full
                                ? pf::layer_activation_bytes(m, k.tp, detail::splits_activations(k), recompute_kind::none) /
                                      static_cast<double>(k.cp)
                                : 0) +
                           (k.vocab != 0 ? detail::vocab_stash_bytes(m, k.tp, k.pp) : 0);
  double max_params = 0, max_experts = 0, max_moe = 0;
  for (int rk = 0; rk < s.ranks; ++rk) {
    const auto u = static_cast<std::size_t>(rk);
    const double p = params[u] * s.param_copies, e = experts[u] * s.param_copies / static_cast<double>(k.ep);
    max_params = std::max(max_params, p);
    max_experts = std::max(max_experts, e);
    max_moe = std::max(max_moe, moe_layers[u] * s.param_copies);
    const double expert_state = e * m.state_bytes_per_param;
    const double state = p * m.state_bytes_per_param / detail::weight_split(k) + expert_state;
    const double act = sim.peak_activation[u] + transient;
    if (state + act > r.memory_bytes) {
      r.memory_bytes = state + act;
      r.state_bytes = state;
      r.activation_bytes = act;
      r.expert_bytes = expert_state;
    }
  }
  // The dense gradients over dp x cp x ep, the experts' over dp (Megatron rank order: tp, cp, ep, dp, pp).
  const link_cost& dp_link = k.tp * k.cp * k.ep * k.dp > c.gpus_per_node ? c.inter : c.intra;
  r.dp_time = pf::ring_allreduce_time(max_params * m.bytes_per_element / detail::weight_split(k), k.dp * k.cp * k.ep, dp_link) +
              (max_experts > 0 ? pf::ring_allreduce_time(max_experts * m.bytes_per_element, k.dp, dp_link) : 0);
  r.step_time = r.pipeline_time + r.dp_time;
  r.fits = r.memory_bytes <= c.usable_bytes();
  if (m.experts > 0) {
    if (k.ep > 1)  // one ep rank exchanges nothing
      r.all_to_all_bytes = max_moe * static_cast<double>(k.microbatches) * (k.recompute == recompute_kind::full ? 6 : 4) * pf::moe_all_to_all_bytes(m, k.tp);
    r.flops_per_gpu = flops * static_cast<double>(k.microbatches) / static_cast<double>(k.pp) / r.step_time;
  } else {
    r.flops_per_gpu = pf::narayanan_step_flops(m) / (r.step_time * static_cast<double>(c.gpus));
  }
  return r;
}

//! The most forward passes (ranks x microbatches x chunks, summed over the configurations) one
//! `plan` call simulates: about ten seconds on one core (about 3 million a second were measured;
//! the three searches of docs/plan.md simulate 4 to 7 million). `plan` refuses a larger search
//! with a `config_error` before simulating anything.
inline constexpr long long max_search_cells = 1LL << 25;

//! Searches every configuration of `m` on `c` that `o` allows and ranks those that fit (see the
//! file comment). Layouts: `tp` divides `gpus_per_node`, `heads` and `hidden`; `pp` divides
//! `layers`; `ep` divides `experts` (1 for a dense model); `dp = gpus / (tp x pp x ep)` is an
//! integer and `dp x ep` divides `global_batch / micro_batch`.
//! Within one (dp, tp, pp, family, chunks), a variant (sp, recompute, group size, offloaded
//! chunks) that is no faster and uses no less memory than one ranked before it is left out. Throws `config_error` for a model or
//! cluster that breaks a rule (the message names the field).
//! A template (called as `plan(m, c)`) so that only a translation unit that calls it instantiates
//! the registry of every family it searches (docs/include-cost.md).
template <class = void>
plan_report plan(const model_desc& m, const cluster_desc& c, const plan_options& o = {}) {
  if (auto r = detail::check_model_desc(m); !r.empty()) throw config_error(r);
  if (auto r = detail::check_cluster_desc(c); !r.empty()) throw config_error(r);
  plan_report rep;
  rep.moe = m.experts > 0;
  rep.context = o.context && m.experts == 0;
  for (const std::string& name : o.families)
    if (const family_entry* e = default_registry().find(name); e != nullptr && e->multi_step)
      throw config_error("plan: '" + name +
                         "' is asynchronous (weight versions across steps, a different training rule); plan searches synchronous "
                         "training: compare asynchronous families with `loom best --steps T`");
  if (o.offload && !c.has_host_link())
    throw config_error("plan: offload needs the cluster's link to host memory (field \"host\": {\"alpha\": s, \"beta\": s/byte} of "
                       "the cluster file), over which the activations are copied");
  // The families tried: offload adds PipeOffload's group-interleaved 1F1B when it is not named.
  std::vector<std::string> families = o.families;
  if (o.offload && std::find(families.begin(), families.end(), "group-interleaved-1f1b") == families.end())
    families.push_back("group-interleaved-1f1b");
  struct candidate {
    plan_config k;
    const family_entry* e;                   // a registry family, or
    const detail::plan_vocab_family* v;      // a vocabulary-parallel one
  };
  std::vector<candidate> todo;
  const registry& reg = default_registry();
  // The tensor-parallel groups tried: Megatron's 1D split inside a node (tp divides the node, the
  // heads and the hidden size), and, with `o.grids` for a dense model, every 2D, 2.5D and 3D grid
  // that divides the cluster, is aligned to its nodes and fits the model (`plan_grid_rule`).
  struct tp_choice {
    long long tp;
    tp_kind kind;
    int depth;
  };
  std::vector<tp_choice> tps;
  for (long long tp = 1; tp <= c.gpus_per_node && tp <= c.gpus; ++tp)
    if (c.gpus_per_node % tp == 0 && m.heads % tp == 0 && m.hidden % tp == 0) tps.push_back({tp, tp_kind::d1, 1});
  if (o.grids && m.experts == 0) {
    auto add = [&](tp_kind kind, long long tp, long long depth) {
      if (c.gpus % tp != 0 || (tp % c.gpus_per_node != 0 && c.gpus_per_node % tp != 0)) return;
      const loom::tp_grid g = make_tp_grid(kind, static_cast<int>(tp), kind == tp_kind::d2_5 ? static_cast<int>(depth) : 0);
      if (detail::plan_grid_rule(m, g).empty()) tps.push_back({tp, kind, static_cast<int>(depth)});
    };
    for (long long q = 2; q * q <= c.gpus; ++q) {
      if (c.gpus % (q * q) != 0) continue;
      add(tp_kind::d2, q * q, 1);
      for (long long d = 2; q * q * d <= c.gpus; ++d) add(tp_kind::d2_5, q * q * d, d);
      if (q * q * q <= c.gpus) add(tp_kind::d3, q * q * q, q);
    }
  }
  for (const tp_choice& tc : tps) {
    const long long tp = tc.tp;
    const bool grid = tc.kind != tp_kind::d1;
    const double split = detail::weight_split({.tp = tp, .tp_grid = tc.kind, .tp_depth = tc.depth});
    for (long long pp = 1; pp <= m.layers && tp * pp <= c.gpus; ++pp) {
      if (m.layers % pp != 0 || c.gpus % (tp * pp) != 0) continue;
      // Expert parallelism (MoE models): ep divides the experts; ranks that differ in ep hold other tokens.
      for (long long ep = 1; ep <= std::max<long long>(1, m.experts) && tp * pp * ep <= c.gpus; ++ep) {
        // Context parallelism (`o.context`, dense models on the 1D split): the sequence over cp ranks.
        for (long long cp = 1; tp * pp * ep * cp <= c.gpus; ++cp) {
        if (cp > 1 && (!o.context || grid || m.experts > 0)) break;
        if ((ep > 1 && m.experts % ep != 0) || c.gpus % (tp * pp * ep * cp) != 0) continue;
        const std::vector<std::pair<context_kind, long long>> contexts = detail::context_choices(m, tp, cp);
        if (contexts.empty()) continue;
        const long long dp = c.gpus / (tp * pp * ep * cp);
        if ((m.global_batch / m.micro_batch) % (dp * ep) != 0) continue;
        if (pp > max_ranks) continue;
        const long long mb = m.global_batch / (dp * ep * m.micro_batch);
        if (pp * mb > max_shape_cells) continue;  // no family runs it (loom/schedule/shape.hpp's limit)
        ++rep.layouts;
        // Model state of the layers alone already over the limit: nothing of this layout fits. The
        // mean over the pipeline ranks bounds the largest from below, wherever the chunks put the
        // MoE layers (dense parts over tp, experts over ep).
        const auto Q = static_cast<double>(plan_formulas::moe_layers_in(m, 0, m.layers));
        const double layer_state = ((static_cast<double>(m.layers) - Q) * plan_formulas::layer_params(m) + Q * plan_formulas::moe_layer_dense_params(m)) /
                                       split +
                                   Q * static_cast<double>(m.experts) / static_cast<double>(ep) * plan_formulas::expert_params(m);
        const double min_state = layer_state * m.state_bytes_per_param / static_cast<double>(pp);
        const long long per_rank = m.layers / pp;
        for (bool sp : {false, true}) {
          if (sp && (tp == 1 || grid)) continue;  // a grid splits every activation already
          if (!grid && tp > 1 && !(sp ? o.sp_on : o.sp_off)) continue;
          for (recompute_kind rc : o.recompute)
            for (const auto& [ck, u] : contexts) {
            plan_config base{.dp = dp, .tp = tp, .pp = pp, .sp = sp, .recompute = rc, .microbatches = mb, .ep = ep,
                             .tp_grid = tc.kind, .tp_depth = tc.depth, .cp = cp, .cp_kind = ck, .cp_ulysses = u};
            for (const std::string& name : families) {
              if (const detail::plan_vocab_family* vf = detail::find_plan_vocab_family(name); vf != nullptr) {
                if (grid || cp > 1) continue;  // the vocabulary-parallel layers are modelled over a 1D group, whole sequences
                const shape sh{.ranks = static_cast<int>(pp), .microbatches = static_cast<int>(mb), .chunks = vf->chunks};
                if (per_rank % vf->chunks != 0 || !detail::check_plan_vocab_family(*vf, sh).empty()) continue;
                plan_config k = base;
                k.family = name;
                k.chunks = vf->chunks;
                k.v_placement = vf->chunks == 2;
                k.vocab = vf->vocab;
                if (min_state > c.usable_bytes()) {
                  ++rep.over_memory;
                  continue;
                }
                todo.push_back({k, nullptr, vf});
                continue;
              }
              const family_entry* e = reg.find(name);
              if (e == nullptr) throw config_error("plan: unknown schedule family '" + name + "'");
              std::vector<std::pair<int, bool>> variants;  // chunks, v placement
              if (e->cost_aware) {
                variants.push_back({1, false});
                variants.push_back({2, true});
              } else if (e->default_chunks == 1) {
                variants.push_back({1, false});
              } else if (name == "interleaved-1f1b" || e->grouped) {
                for (int v = 2; v <= o.max_chunks; ++v) variants.push_back({v, false});
              } else {
                variants.push_back({e->default_chunks, e->default_chunks == 2});
              }
              for (auto [v, vee] : variants) {
                if (per_rank % v != 0) continue;
                if (pp == 1 && v > 1 && !vee) continue;  // interleaving needs a pipeline
                if (e->cost_aware && o.max_auto_cells > 0 && pp * mb > o.max_auto_cells) continue;
                // (group, offloaded chunks): a grouped family with every group size and, with
                // offload on an even number of ranks, 0..v offloaded chunks; (0, 0) for the others.
                std::vector<std::pair<int, int>> groups{{0, 0}};
                if (e->grouped) {
                  groups.clear();
                  const int most = o.offload && pp % 2 == 0 ? v : 0;
                  for (int g = static_cast<int>((pp + 1) / 2); g <= pp; ++g)
                    for (int off = 0; off <= most; ++off) groups.push_back({g, off});
                }
                for (auto [g, off] : groups) {
                  if (!e->check({.ranks = static_cast<int>(pp), .microbatches = static_cast<int>(mb), .chunks = v, .group = g}).empty()) continue;
                  plan_config k = base;
                  k.family = name;
                  k.chunks = v;
                  k.v_placement = vee;
                  k.group = g;
                  k.offload_chunks = off;
                  if (min_state > c.usable_bytes()) {
                    ++rep.over_memory;
                    continue;
                  }
                  todo.push_back({k, e, nullptr});
                }
              }
            }
          }
        }
        }
      }
    }
  }
  // The search's work, bounded up front (a rule with a message, never a clamp or a hang): the
  // forward passes (ranks x microbatches x chunks) of every configuration it would simulate.
  long long cells = 0;
  for (const candidate& cd : todo) {
    cells += cd.k.pp * cd.k.microbatches * (cd.k.v_placement ? 2 : cd.k.chunks);
    if (cells > max_search_cells)
      throw config_error("plan: the search would simulate more than " + std::to_string(max_search_cells) +
                         " forward passes in all (" + std::to_string(todo.size()) +
                         " configurations); narrow it with fewer families, recomputation or SP choices, or a smaller cluster or batch");
  }
  rep.cells = cells;
  // Schedules that do not depend on costs are generated once per shape.
  std::map<std::tuple<std::string, long long, long long, int, int>, schedule> cache;
  std::vector<plan_result> all;
  std::size_t done = 0;
  for (const candidate& cd : todo) {
    const plan_config& k = cd.k;
    const shape sh{.ranks = static_cast<int>(k.pp), .microbatches = static_cast<int>(k.microbatches), .chunks = k.chunks, .group = k.group};
    schedule s;
    if (cd.v != nullptr) {
      // The 1F1B variants place the output layer by the average stage's f and b + w.
      s = detail::make_plan_vocab_family(*cd.v, sh, detail::average_costs(plan_cost_model(m, c, k), static_cast<double>(k.pp)));
    } else if (cd.e->cost_aware) {
      // Auto-schedulers see the average stage (uniform costs per rank share) and the memory left
      // after the model state, in units of one rank share's activation per microbatch.
      const cost_model cm = plan_cost_model(m, c, k);
      costs u{.f = 0, .b = 0, .w = 0};
      double act = 0, max_params = 0;
      for (auto const& x : cm.stages) {
        u.f += x.f;
        u.b += x.b;
        u.w += x.w;
        act += x.activation;
      }
      const double P = static_cast<double>(k.pp);
      u.f /= P;
      u.b /= P;
      u.w /= P;
      u.c = (cm.ranks_per_node == 1 ? c.inter : c.intra).time(cm.stages[0].message_bytes);
      u.mem_w_ratio = cm.mem_w_ratio;
      act /= P;
      // The parameters of the rank holding the most (loop: stages r, r + P, ...; V: r and 2P-1-r).
      const int S = static_cast<int>(cm.stages.size()), Pi = static_cast<int>(k.pp);
      // (Here: its model state, the dense part over tp and its share of the experts.)
      for (int rk = 0; rk < Pi; ++rk) {
        double here = 0;
        for (int j = 0; j < k.chunks; ++j) {
          const int st = k.v_placement ? (j == 0 ? rk : 2 * Pi - 1 - rk) : rk + j * Pi;
          here += (detail::stage_params(m, st, S) / detail::weight_split(k) + detail::stage_expert_params(m, st, S) / static_cast<double>(k.ep)) *
                  m.state_bytes_per_param;
        }
        max_params = std::max(max_params, here);
      }
      const double transient = k.recompute == recompute_kind::full
                                   ? plan_formulas::layer_activation_bytes(m, k.tp, detail::splits_activations(k), recompute_kind::none) /
                                         static_cast<double>(k.cp)
                                   : 0;
      const double room = c.usable_bytes() - max_params - transient;
      const double limit = act > 0 ? std::floor(room / act) : 0;
      if (limit < 1) {
        ++rep.over_memory;
        if (o.progress) o.progress(++done, todo.size());
        continue;
      }
      generate_options go{.cost = u, .mem_limit = std::min(limit, 2.0 * P), .placement = k.v_placement ? placement_kind::v : placement_kind::loop};
      try {
        s = cd.e->make(sh, go);
      } catch (const schedule_error&) {
        ++rep.over_memory;  // the family cannot schedule within the memory left (e.g. zb-v needs >= pp units)
        if (o.progress) o.progress(++done, todo.size());
        continue;
      }
    } else {
      auto key = std::make_tuple(k.family, k.pp, k.microbatches, k.chunks, k.group);
      auto it = cache.find(key);
      if (it == cache.end()) it = cache.emplace(key, cd.e->make(sh)).first;
      s = it->second;
      if (k.offload_chunks > 0) {
        const offload_plan op = detail::plan_offload_for(m, c, k, s);
        if (!op.ok) {
          ++rep.refused;
          if (o.progress) o.progress(++done, todo.size());
          continue;
        }
        s = with_offload(s, op);
      }
    }
    plan_result r = evaluate_plan(m, c, k, s);
    ++rep.evaluated;
    if (r.fits) all.push_back(r);
    else ++rep.over_memory;
    if (o.progress) o.progress(++done, todo.size());
  }
  // A total order (the label tells configurations apart), so std::sort is deterministic
  // (libstdc++ 12's std::stable_sort warns under clang: deprecated get_temporary_buffer).
  std::sort(all.begin(), all.end(), [](const plan_result& a, const plan_result& b) {
    if (a.step_time != b.step_time) return a.step_time < b.step_time;
    if (a.memory_bytes != b.memory_bytes) return a.memory_bytes < b.memory_bytes;
    return detail::label_of(a.config) < detail::label_of(b.config);
  });
  std::map<detail::plan_layout, double> least_memory;
  for (const plan_result& r : all) {
    const detail::plan_layout g = detail::label_of(r.config).layout;
    auto it = least_memory.find(g);
    if (it != least_memory.end() && it->second <= r.memory_bytes) continue;  // dominated by a faster variant
    least_memory[g] = r.memory_bytes;
    rep.ranked.push_back(r);
  }
  return rep;
}

}  // namespace loom
