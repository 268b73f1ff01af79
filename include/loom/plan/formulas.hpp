// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The analytic pieces of `loom::plan`: a GPT-style model and a GPU cluster described by a few
//! numbers, and the closed forms for FLOPs, activation memory, parameter/optimizer memory and
//! communication that the planner turns into a `loom::cost_model`.
//!
//! Model: a decoder-only transformer of `layers` identical layers (attention + a 4h MLP), as in
//! Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
//! Megatron-LM" (SC'21), §5.1 and appendix: `12 h^2 + 13 h` parameters per layer, a `V x h`
//! word embedding tied with the output projection, an `s x h` position embedding. Optionally a
//! mixture of experts in every `moe_every`-th layer (`model_desc::experts`). Everything is
//! constexpr: a model's numbers can be checked in a `static_assert`.
//!
//! Units: FLOPs, bytes, seconds.

#include <cstdint>

#include "loom/schedule/cost_model.hpp"

namespace loom {

//! A GPT-style model and its batch (see the file comment for the architecture assumed).
struct model_desc {
  long long layers = 0;          //!< `l`: transformer layers
  long long hidden = 0;          //!< `h`: hidden size
  long long heads = 0;           //!< `a`: attention heads
  long long seq = 0;             //!< `s`: sequence length
  long long vocab = 0;           //!< `V`: vocabulary size
  int bytes_per_element = 2;     //!< bytes of an activation, a parameter and a gradient (2: fp16/bf16)
  long long micro_batch = 1;     //!< `b`: sequences per microbatch
  long long global_batch = 0;    //!< `B`: sequences per optimizer step (all data-parallel replicas)
  //! Bytes of model state per parameter: 16 for mixed-precision Adam without ZeRO (fp16 weight
  //! and gradient, fp32 master weight, momentum and variance; Rajbhandari et al., "ZeRO", SC'20, §3.1).
  double state_bytes_per_param = 16;
  //! Mixture of experts (`E`, 0: a dense model): every `moe_every`-th layer (layers
  //! `moe_every - 1, 2 moe_every - 1, ...`) replaces its MLP by a router and `E` experts, each an
  //! MLP of the dense one's shape (`8 h^2 + 5 h` parameters), as Switch and GShard do (Fedus et
  //! al., JMLR 2022, §2; Lepikhin et al., ICLR 2021, §2).
  long long experts = 0;
  int top_k = 1;                 //!< `k`: experts per token, 1..E
  long long moe_every = 1;       //!< see `experts`: 1 every layer, 2 every other layer
  double capacity_factor = 1.0;  //!< Tutel's `f` (docs/moe.md): the capacity `k floor(f ceil(n / E))`; 0: no dropping
  //! `F`: a spatial-temporal model (DSP's, Zhao et al., ICML 2025): each sequence of `seq` tokens
  //! is `F` frames of `seq / F` patches; even layers attend within a frame (spatial), odd layers
  //! across the frames at one patch position (temporal). 0: a sequence model (every layer
  //! attends over the whole sequence).
  long long frames = 0;
  friend constexpr bool operator==(const model_desc&, const model_desc&) = default;
};

//! A homogeneous GPU cluster: `gpus` devices in nodes of `gpus_per_node`, two link classes.
struct cluster_desc {
  long long gpus = 0;              //!< GPUs in all
  long long gpus_per_node = 0;     //!< GPUs per node (TP and SP groups stay inside one node)
  double memory_bytes = 0;         //!< memory per GPU
  //! Memory per GPU the model cannot use (CUDA context, NCCL buffers, allocator fragmentation):
  //! a configuration fits when its model state and activations need at most `usable_bytes()`.
  double reserved_bytes = 0;
  double peak_flops = 0;           //!< peak FLOP/s per GPU for the element type (A100 bf16: 312e12)
  double achievable_fraction = 1;  //!< fraction of the peak that a transformer layer's kernels reach
  link_cost intra{};               //!< between GPUs of one node: alpha (s) + beta (s/byte) * bytes
  link_cost inter{};               //!< between GPUs of different nodes
  //! Each GPU's link to host memory (PCIe, C2C), one copy per direction at a time: PipeOffload's
  //! copies (`plan_options::offload`). All zero: not given, and `plan` does not offload.
  link_cost host{};
  //! True when the cluster gives a host link.
  constexpr bool has_host_link() const { return host.alpha > 0 || host.beta > 0; }
  //! The memory a configuration may fill: `memory_bytes - reserved_bytes`.
  constexpr double usable_bytes() const { return memory_bytes - reserved_bytes; }
  friend constexpr bool operator==(const cluster_desc&, const cluster_desc&) = default;
};

//! Which activations are kept for the backward pass (Korthikanti et al., "Reducing Activation
//! Recomputation in Large Transformer Models", MLSys 2023 (arXiv 2205.05198), §4–5).
enum class recompute_kind {
  none,       //!< keep everything: `s b h (34 + 5 a s / h)` bytes per layer (16-bit)
  selective,  //!< recompute the attention core (softmax, dropout, scores x V): `34 s b h` kept
  full,       //!< keep only each layer's input (`2 s b h`) and recompute the whole layer in the backward
};

//! The name of a recomputation mode as the CLI prints it.
constexpr const char* to_string(recompute_kind r) {
  return r == recompute_kind::none ? "none" : r == recompute_kind::selective ? "selective" : "full";
}

namespace plan_formulas {

//! Parameters of one transformer layer: `12 h^2 + 13 h` (Narayanan et al. 2021, §5.1).
constexpr double layer_params(const model_desc& m) {
  const double h = static_cast<double>(m.hidden);
  return 12 * h * h + 13 * h;
}

//! Parameters of the word (`V h`) and position (`s h`) embeddings; the output projection shares
//! the word embedding (Narayanan et al. 2021, §5.1).
constexpr double embedding_params(const model_desc& m) {
  return static_cast<double>(m.vocab) * m.hidden + static_cast<double>(m.seq) * m.hidden;
}

//! The mean length of the attention's span per layer, the second `s` of the `s^2` terms below:
//! `s` for a sequence model; for a spatial-temporal one (`model_desc::frames` F > 0) layers
//! alternate a frame's `s / F` patches and the `F` frames, `(s / F + F) / 2` (exact for a stage of
//! whole layer pairs).
constexpr double attention_span(const model_desc& m) {
  if (m.frames <= 0) return static_cast<double>(m.seq);
  return (static_cast<double>(m.seq / m.frames) + static_cast<double>(m.frames)) / 2;
}

//! True when layer `i` (0-based) is an MoE layer (see `model_desc::experts`).
constexpr bool is_moe_layer(const model_desc& m, long long i) { return m.experts > 0 && (i + 1) % m.moe_every == 0; }

//! MoE layers among layers `[first, first + count)`.
constexpr long long moe_layers_in(const model_desc& m, long long first, long long count) {
  if (m.experts <= 0) return 0;
  return (first + count) / m.moe_every - first / m.moe_every;
}

//! Parameters of one expert: the dense MLP's `8 h^2 + 5 h` (two `h x 4h` matrices and their biases).
constexpr double expert_params(const model_desc& m) {
  const double h = static_cast<double>(m.hidden);
  return 8 * h * h + 5 * h;
}

//! Parameters of an MoE layer outside its experts: the dense layer's without its MLP, plus the
//! router's `h E`: `4 h^2 + 8 h + h E`.
constexpr double moe_layer_dense_params(const model_desc& m) {
  return layer_params(m) - expert_params(m) + static_cast<double>(m.hidden) * static_cast<double>(m.experts);
}

//! All parameters: `l (12 h^2 + 13 h) + V h + s h` (the final layer norm's `2h` left out); an MoE
//! layer counts `moe_layer_dense_params + E expert_params` instead of `12 h^2 + 13 h`.
constexpr double total_params(const model_desc& m) {
  const double moe = static_cast<double>(moe_layers_in(m, 0, m.layers));
  return (static_cast<double>(m.layers) - moe) * layer_params(m) +
         moe * (moe_layer_dense_params(m) + static_cast<double>(m.experts) * expert_params(m)) + embedding_params(m);
}

//! Tokens an MoE layer routes per microbatch on one GPU: `s b / t`. With tensor parallelism the
//! tokens are split over the `t` ranks before the router (Megatron-core with sequence
//! parallelism; loom's `ep` with `tp`, docs/moe.md), and every tp rank holds its `ep` rank's experts whole.
constexpr double moe_tokens(const model_desc& m, long long t) {
  return static_cast<double>(m.seq) * static_cast<double>(m.micro_batch) / static_cast<double>(t);
}

//! Slots per expert of one MoE layer and microbatch on one GPU (loom's routing contract,
//! docs/moe.md, as `loom::moe_capacity`): `k floor(f ceil(n / E))` for `n = moe_tokens(m, t)`.
//! With `f = 0` (no dropping) the capacity is the largest load, which a plan cannot know: it is
//! taken as the balanced load `k ceil(n / E)`.
constexpr double moe_capacity(const model_desc& m, long long t) {
  const auto n = static_cast<long long>(moe_tokens(m, t));
  const long long per_expert = (n + m.experts - 1) / m.experts;
  if (m.capacity_factor == 0) return static_cast<double>(m.top_k) * static_cast<double>(per_expert);
  return static_cast<double>(m.top_k) * static_cast<double>(static_cast<long long>(m.capacity_factor * static_cast<double>(per_expert)));
}

//! Bytes of one of the MoE layer's all-to-alls on one GPU: its whole dispatch buffer `E C h`
//! (`(ep - 1) / ep` of it leaves the GPU). Four per layer and microbatch: dispatch and combine,
//! forward and backward, as loom's counters show (docs/moe.md).
constexpr double moe_all_to_all_bytes(const model_desc& m, long long t) {
  return static_cast<double>(m.experts) * moe_capacity(m, t) * static_cast<double>(m.hidden) * m.bytes_per_element;
}

//! Forward FLOPs of the experts of one MoE layer on one GPU and microbatch: every slot of the
//! `E C` the GPU receives runs through its expert's MLP, padding included (`16 h^2` per row),
//! plus the router's `2 n h E`. The input- and the weight-gradient backward each take the
//! experts' part again.
constexpr double moe_expert_forward_flops(const model_desc& m, long long t) {
  const double h = static_cast<double>(m.hidden), E = static_cast<double>(m.experts);
  return 16 * h * h * E * moe_capacity(m, t) + 2 * moe_tokens(m, t) * h * E;
}

//! Activation bytes the experts of one MoE layer keep per microbatch on one GPU: the dense MLP's
//! `19` values per row and feature (Korthikanti et al. 2022, §4.1: the input, both `4h` activations
//! and the dropout mask) on the `E C` rows, plus the router's fp32 probabilities `4 n E`.
constexpr double moe_expert_activation_bytes(const model_desc& m, long long t) {
  return 19.0 * static_cast<double>(m.experts) * moe_capacity(m, t) * static_cast<double>(m.hidden) * (m.bytes_per_element / 2.0) +
         4.0 * moe_tokens(m, t) * static_cast<double>(m.experts);
}

//! The dense MLP's share of `layer_activation_bytes` (no recomputation or selective):
//! `19 s b h / t` with sequence parallelism, `s b h (3 + 16 / t)` with tensor parallelism alone
//! (its input and dropout mask replicated; Korthikanti et al. 2022, §4.2). An MoE layer keeps
//! `moe_expert_activation_bytes` instead.
constexpr double mlp_activation_bytes(const model_desc& m, long long t, bool sp) {
  const double sbh = static_cast<double>(m.seq) * static_cast<double>(m.micro_batch) * static_cast<double>(m.hidden) * (m.bytes_per_element / 2.0);
  const double T = static_cast<double>(t);
  return sp ? 19 * sbh / T : sbh * (3 + 16 / T);
}

//! Time of an all-to-all of `bytes` per GPU (its whole buffer) over `n` GPUs on link `l`, as
//! pairwise exchanges: `(n - 1)` steps of `alpha` and `(n - 1) / n x bytes` through each GPU's
//! link. 0 for `n = 1`.
constexpr double all_to_all_time(double bytes, long long n, const link_cost& l) {
  if (n <= 1) return 0;
  const double N = static_cast<double>(n);
  return (N - 1) * l.alpha + (N - 1) / N * bytes * l.beta;
}

//! FLOPs of one optimizer step as Narayanan et al. 2021 count them (§5.1, eq. (3)):
//! `96 B s l h^2 (1 + s / (6h) + V / (16 l h))`. It includes one recomputed forward of every
//! layer (full activation recomputation) and the logit layer; their achieved teraFLOP/s use it.
constexpr double narayanan_step_flops(const model_desc& m) {
  const double B = static_cast<double>(m.global_batch), s = static_cast<double>(m.seq), l = static_cast<double>(m.layers),
               h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  return 96 * B * s * l * h * h * (1 + attention_span(m) / (6 * h) + V / (16 * l * h));
}

//! Forward FLOPs of one layer on one microbatch: `24 b s h^2 + 4 b s^2 h` (the GEMMs, and the
//! attention scores and their product with V; Narayanan et al. 2021, §5.1: one layer's forward
//! is a third of its `72 b s h^2 (1 + s/6h)` forward + backward).
constexpr double layer_forward_flops(const model_desc& m) {
  const double b = static_cast<double>(m.micro_batch), s = static_cast<double>(m.seq), h = static_cast<double>(m.hidden);
  return 24 * b * s * h * h + 4 * b * s * attention_span(m) * h;
}
//! FLOPs of a layer's input-gradient backward (`B`): the GEMMs' `24 b s h^2` and twice the
//! attention core's `4 b s^2 h` (the score and value products each have two operand gradients).
constexpr double layer_input_grad_flops(const model_desc& m) {
  const double b = static_cast<double>(m.micro_batch), s = static_cast<double>(m.seq), h = static_cast<double>(m.hidden);
  return 24 * b * s * h * h + 8 * b * s * attention_span(m) * h;
}
//! FLOPs of a layer's weight-gradient backward (`W`): `24 b s h^2` (the attention core has no
//! weights). `B + W = 2 F`, as in Narayanan et al. and the Zero Bubble paper (Qi et al., ICLR 2024, §2).
constexpr double layer_weight_grad_flops(const model_desc& m) {
  const double b = static_cast<double>(m.micro_batch), s = static_cast<double>(m.seq), h = static_cast<double>(m.hidden);
  return 24 * b * s * h * h;
}
//! FLOPs the backward recomputes per layer: a whole forward (`full`), the attention core's
//! `4 b s^2 h` (`selective`, Korthikanti et al. 2022, §5), or nothing.
constexpr double layer_recompute_flops(const model_desc& m, recompute_kind r) {
  const double b = static_cast<double>(m.micro_batch), s = static_cast<double>(m.seq), h = static_cast<double>(m.hidden);
  return r == recompute_kind::full ? layer_forward_flops(m) : r == recompute_kind::selective ? 4 * b * s * attention_span(m) * h : 0;
}
//! Forward FLOPs of the logit layer on one microbatch: `2 b s h V` (its backward: the same again
//! for `B` and for `W`); the `V / (16 l h)` term of Narayanan et al.'s eq. (3).
constexpr double logit_forward_flops(const model_desc& m) {
  return 2.0 * m.micro_batch * m.seq * m.hidden * m.vocab;
}

//! Activation bytes one layer keeps per microbatch, on one GPU of a tensor-parallel group of `t`
//! (Korthikanti et al. 2022, §4.2, Table 2), for 16-bit activations and scaled by
//! `bytes_per_element / 2` otherwise (the attention's `5 a s / h` with `attention_span` for the
//! second `s`):
//! - no recomputation: `s b h (34 + 5 a s / h) / t` with sequence parallelism, and
//!   `s b h (10 + 24 / t + 5 a s / (h t))` with tensor parallelism alone;
//! - selective: the `5 a s / h` term gone: `34 s b h / t`, or `s b h (10 + 24 / t)`;
//! - full: the layer input, `2 s b h` (divided by `t` with sequence parallelism).
constexpr double layer_activation_bytes(const model_desc& m, long long t, bool sp, recompute_kind r) {
  const double s = static_cast<double>(m.seq), b = static_cast<double>(m.micro_batch), h = static_cast<double>(m.hidden),
               a = static_cast<double>(m.heads), T = static_cast<double>(t);
  const double sbh = s * b * h * (m.bytes_per_element / 2.0);
  const double attn = r == recompute_kind::none ? 5 * a * attention_span(m) / h : 0;
  if (r == recompute_kind::full) return sp ? 2 * sbh / T : 2 * sbh;
  return sp ? sbh * (34 + attn) / T : sbh * (10 + 24 / T + attn / T);
}

//! Activation bytes of the logit layer and the cross-entropy per microbatch on one GPU: the
//! fp32 logits, `4 s b V / t` (Korthikanti et al. 2022, §4.3).
constexpr double logit_activation_bytes(const model_desc& m, long long t) {
  return 4.0 * m.seq * m.micro_batch * m.vocab / static_cast<double>(t);
}

//! Time of a ring all-reduce of `bytes` over `n` GPUs on link `l`: `2 (n - 1)` steps of
//! `alpha`, and `2 (n - 1) / n x bytes` through each GPU's link (Patarasuk and Yuan, "Bandwidth
//! optimal all-reduce algorithms for clusters of workstations", JPDC 2009). 0 for `n = 1`. A
//! reduce-scatter plus an all-gather (Megatron sequence parallelism) moves the same volume.
constexpr double ring_allreduce_time(double bytes, long long n, const link_cost& l) {
  if (n <= 1) return 0;
  const double N = static_cast<double>(n);
  return 2 * (N - 1) * l.alpha + 2 * (N - 1) / N * bytes * l.beta;
}

//! Bytes of one tensor-parallel collective: the layer's activation `s b h x bytes` (Narayanan
//! et al. 2021, §3.3: two all-reduces in the forward and two in the backward of every layer;
//! Korthikanti et al. 2022, §4.2.2: with sequence parallelism each becomes a reduce-scatter and
//! an all-gather of the same total volume).
constexpr double tp_collective_bytes(const model_desc& m) {
  return static_cast<double>(m.seq) * m.micro_batch * m.hidden * m.bytes_per_element;
}

//! Bytes of the activation a pipeline stage sends to the next (and of the gradient sent back):
//! `s b h x bytes`, divided by `t` with sequence parallelism (the activation is already
//! scattered along the sequence; Narayanan et al. 2021, §4.1 scatter/gather does the same).
constexpr double p2p_message_bytes(const model_desc& m, long long t, bool sp) {
  return tp_collective_bytes(m) / static_cast<double>(sp ? t : 1);
}

}  // namespace plan_formulas
}  // namespace loom
