// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! A small decoder-only transformer in double precision on the CPU, written as a loom pipeline
//! stage whose layers shard over a mesh: token and position embedding, pre-LN blocks (layer norm,
//! multi-head attention, causal unless `model_spec::causal` is off, residual; layer norm, MLP with
//! tanh, residual), a final layer
//! norm, the output projection and a softmax cross-entropy loss per token.
//!
//! Sharding of a block (Megatron-LM, Shoeybi et al. 2019, §3): the Q/K/V projection and the first
//! MLP layer are column-parallel over `tp` (heads and MLP features split), the attention output
//! projection and the second MLP layer row-parallel; everything else is replicated. The sequence
//! of a microbatch is split in one of four ways (`loom/exec/sequence_parallel.hpp`,
//! `loom/exec/tensor_parallel.hpp`):
//! - `megatron`: over the tp group outside the tensor-parallel regions (Megatron-SP);
//! - `ulysses`, `ring`, `usp`, `tokenring`: over the `sp` dimension everywhere; the attention
//!   gathers the sequence by Ulysses all-to-alls, ring attention, both (USP), or TokenRing (the
//!   queries travel, K and V stay with their owner).
//! Blocks are cut into pipeline stages (stage 0 also embeds, the last stage also computes the
//! loss), the stages run by any loom schedule over `pp`, and the whole is replicated over `dp`.
//! With `model_spec::moe`, every K-th block's MLP is an MoE branch whose experts split over `ep`
//! (`moe_block.hpp`); ranks that differ in ep hold different sequences too.
//!
//! Every kernel fixes its order of additions. A deterministic run is bitwise equal to the
//! single-rank reference of `reference.hpp` computed with the same blocking (the reduction order
//! of the layout); any run is within 1e-12 of the plain reference.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <loom/exec/data_parallel.hpp>
#include <loom/exec/sequence_parallel.hpp>
#include <loom/exec/tensor_parallel.hpp>
#include <loom/exec/memory.hpp>
#include <loom/mesh/mesh.hpp>
#include <loom/stage/stage.hpp>

#include "host_exec.hpp"
#include "kernels.hpp"
#include "moe_block.hpp"

namespace mesh_example {

//! The model's shape and the optimizer's learning rate.
struct model_spec {
  int vocab = 11;     //!< tokens of the vocabulary
  int seq = 16;       //!< tokens per sequence (one sequence per microbatch)
  int hidden = 8;     //!< model width h
  int heads = 4;      //!< attention heads (head size h / heads)
  int ffn = 16;       //!< MLP hidden features
  int blocks = 4;     //!< transformer blocks (raised to the number of virtual stages)
  double lr = 0.1;    //!< SGD learning rate
  moe_spec moe{};     //!< MoE blocks (`moe_block.hpp`; none by default)
  bool causal = true; //!< causal attention (a decoder's); false: every token sees the whole sequence
  //! The vocabulary-parallel head (Yeung et al., MLSys 2025; `loom::vocab_layers`): 1 or 2, the
  //! algorithm (`1f1b-vocab-1`, `-2`), 0 none. With it the token embedding `E` and the output
  //! table `WOUT` (no bias `BOUT`) are split by rows over the pipeline ranks and live in the
  //! vocabulary layers; the first stage adds only the position embedding `P` to the summed
  //! embedding parts it receives, and the last stage ends at the final layer norm.
  int vocab_parallel = 0;
  int head_dim() const { return hidden / heads; }
};

//! How the sequence is split.
enum class seq_kind { none, megatron, ulysses, ring, usp, tokenring };

//! Name of a kind.
inline std::string to_string(seq_kind k) {
  switch (k) {
    case seq_kind::none: return "none";
    case seq_kind::megatron: return "megatron";
    case seq_kind::ulysses: return "ulysses";
    case seq_kind::ring: return "ring";
    case seq_kind::usp: return "usp";
    case seq_kind::tokenring: return "tokenring";
  }
  return "?";
}

//! The parallel layout: degrees of the mesh dimensions and the sequence split.
struct sharding {
  int dp = 1, tp = 1, pp = 1, sp = 1;
  seq_kind kind = seq_kind::none;
  int ulysses = 1;  //!< USP's Ulysses degree (ulysses: sp; ring: 1)
  int ep = 1;       //!< expert-parallel ranks (MoE blocks' experts, and the sequences, split over them)

  bool megatron() const { return kind == seq_kind::megatron && tp > 1; }
  //! Size of the mesh's sp dimension (Megatron-SP uses the tp group).
  int sp_ranks() const { return kind == seq_kind::megatron || kind == seq_kind::none ? 1 : sp; }
  int u() const { return kind == seq_kind::ulysses ? sp : kind == seq_kind::usp ? ulysses : 1; }
  int ring() const { return kind == seq_kind::ring || kind == seq_kind::tokenring ? sp : kind == seq_kind::usp ? sp / ulysses : 1; }
  //! Whether the ring part is TokenRing (`loom::token_ring_attention`: K and V stay home).
  bool token_ring() const { return kind == seq_kind::tokenring; }
  int world() const { return dp * ep * tp * pp * sp_ranks(); }
  loom::seq_split split(const model_spec& m) const { return {m.seq, u(), ring()}; }
  //! Tokens a rank holds outside the tensor-parallel regions.
  int tokens(const model_spec& m) const { return megatron() ? m.seq / tp : m.seq / sp_ranks(); }
  //! Tokens inside the tensor-parallel regions.
  int region_tokens(const model_spec& m) const { return megatron() ? m.seq : tokens(m); }
  //! Global position of local token `i` of the rank with tp index `t` and sp index `s`.
  int token(const model_spec& m, int t, int s, int i) const {
    if (megatron()) return t * tokens(m) + i;
    return split(m).token(s, i);
  }
  //! The dimension whose ranks hold different tokens (their gradients and losses are partial).
  loom::dim_set seq_dims() const {
    if (megatron()) return loom::dim::tp;
    if (sp_ranks() > 1) return loom::dim::sp;
    return {};
  }
  //! "pp2 x dp2 x tp2, sp ring 2" style description.
  std::string describe() const {
    std::string s = "pp" + std::to_string(pp) + " x dp" + std::to_string(dp) + (ep > 1 ? " x ep" + std::to_string(ep) : std::string()) +
                    " x sp" + std::to_string(sp_ranks()) + " x tp" + std::to_string(tp);
    if (kind == seq_kind::megatron) s += ", sequence over tp (megatron)";
    if (kind == seq_kind::usp) s += ", sp usp (ulysses " + std::to_string(u()) + " x ring " + std::to_string(ring()) + ")";
    else if (kind != seq_kind::none && kind != seq_kind::megatron) s += ", sp " + to_string(kind);
    return s;
  }
  //! The rule this layout breaks for model `m`, or "" (one sentence naming the values).
  std::string rule(const model_spec& m) const {
    for (auto [name, v] : {std::pair<const char*, int>{"dp", dp}, {"tp", tp}, {"pp", pp}, {"sp", sp}, {"ep", ep}})
      if (v < 1) return std::string("--") + name + " " + std::to_string(v) + ": every dimension needs at least 1 rank";
    if (m.moe.every > 0) {
      if (std::string r = loom::moe_rule(m.moe.o); !r.empty()) return r;
      if (std::string r = loom::ep_rule(m.moe.o.experts, ep); !r.empty()) return r;
      // Megatron-core splits the tokens over tp before the router; the sp kinds spread a
      // sequence's tokens their own ways: not built here yet.
      if (tp > 1 || sp > 1 || kind != seq_kind::none)
        return "the transformer's MoE blocks (--moe-every) run with --tp 1 and no sequence split so far";
    } else if (ep > 1) {
      return "--ep " + std::to_string(ep) + " splits MoE blocks' experts: it needs --experts E and --moe-every K";
    }
    if (m.hidden % m.heads != 0)
      return "--hidden " + std::to_string(m.hidden) + " is not divisible by --heads " + std::to_string(m.heads);
    if (kind == seq_kind::none) {
      if (sp != 1) return "--sp " + std::to_string(sp) + " needs a --sp-kind (megatron, ulysses, ring, usp or tokenring)";
      return loom::tp_rule(tp, m.heads, m.ffn);
    }
    if (kind == seq_kind::megatron && sp != 1 && sp != tp)
      return "--sp-kind megatron splits the sequence over the tp group: --sp " + std::to_string(sp) + " must equal --tp " +
             std::to_string(tp);
    if (kind == seq_kind::usp && (ulysses < 1 || sp % ulysses != 0))
      return "--ulysses " + std::to_string(ulysses) + " does not divide --sp " + std::to_string(sp);
    const loom::sp_kind k = kind == seq_kind::megatron ? loom::sp_kind::megatron
                            : kind == seq_kind::ulysses ? loom::sp_kind::ulysses
                            : kind == seq_kind::ring || kind == seq_kind::tokenring ? loom::sp_kind::ring  // the same layout
                                                                                    : loom::sp_kind::usp;
    return loom::sharding_rule({m.seq, m.heads, m.ffn}, tp, kind == seq_kind::megatron ? tp : sp, k, u());
  }
};

//! The tensors of the model (per block where it applies).
//! An MoE block has ROUTER (`[E][h]`) and its experts' MLPs EW1 (`[E f][h]`), EB1 (`[E f]`), EW2
//! (`[E h][f]`) and EB2 (`[E h]`), expert e's rows consecutive, in place of W1, B1, W2 and B2.
enum class tensor : int { E, P, LN1G, LN1B, WQKV, BQKV, WO, BO, LN2G, LN2B, W1, B1, W2, B2, LNFG, LNFB, WOUT, BOUT, ROUTER, EW1, EB1, EW2, EB2 };

//! A reproducible value in [-1, 1) from integer coordinates.
inline double hashed(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ (c + 7) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

//! Initial value of element (row, col) of tensor `t` of block `b` (-1 outside blocks).
inline double initial(const model_spec& m, tensor t, int b, int row, int col) {
  const double r = hashed(static_cast<std::uint64_t>(t) * 131 + static_cast<std::uint64_t>(b + 1), static_cast<std::uint64_t>(row),
                          static_cast<std::uint64_t>(col));
  switch (t) {
    case tensor::E:
    case tensor::P: return 0.5 * r;
    case tensor::LN1G:
    case tensor::LN2G:
    case tensor::LNFG: return 1.0 + 0.1 * r;
    case tensor::WQKV:
    case tensor::W1:
    case tensor::WOUT:
    case tensor::ROUTER:
    case tensor::EW1: return r / std::sqrt(static_cast<double>(m.hidden));
    case tensor::EW2: return r / std::sqrt(static_cast<double>(m.ffn));
    case tensor::WO: return r / std::sqrt(static_cast<double>(m.hidden));
    case tensor::W2: return r / std::sqrt(static_cast<double>(m.ffn));
    default: return 0.1 * r;
  }
}

//! Whole shape (rows x cols) of a tensor.
inline std::pair<int, int> full_shape(const model_spec& m, tensor t) {
  const int h = m.hidden;
  switch (t) {
    case tensor::E: return {m.vocab, h};
    case tensor::P: return {m.seq, h};
    case tensor::WQKV: return {3 * h, h};
    case tensor::BQKV: return {3 * h, 1};
    case tensor::WO: return {h, h};
    case tensor::W1: return {m.ffn, h};
    case tensor::B1: return {m.ffn, 1};
    case tensor::W2: return {h, m.ffn};
    case tensor::WOUT: return {m.vocab, h};
    case tensor::BOUT: return {m.vocab, 1};
    case tensor::ROUTER: return {m.moe.o.experts, h};
    case tensor::EW1: return {m.moe.o.experts * m.ffn, h};
    case tensor::EB1: return {m.moe.o.experts * m.ffn, 1};
    case tensor::EW2: return {m.moe.o.experts * h, m.ffn};
    case tensor::EB2: return {m.moe.o.experts * h, 1};
    default: return {h, 1};
  }
}

//! How a tensor is split over tp (`experts`: the MoE tensors' rows over ep).
enum class split_kind { none, qkv_rows, rows, cols, experts };

inline split_kind split_of(tensor t) {
  switch (t) {
    case tensor::EW1:
    case tensor::EB1:
    case tensor::EW2:
    case tensor::EB2: return split_kind::experts;
    case tensor::WQKV:
    case tensor::BQKV: return split_kind::qkv_rows;
    case tensor::W1:
    case tensor::B1: return split_kind::rows;
    case tensor::WO:
    case tensor::W2: return split_kind::cols;
    default: return split_kind::none;
  }
}

//! One tensor as a stage holds it: its place in the stage's parameters, its local shape, and
//! the map from local to whole rows and columns.
struct tensor_slot {
  tensor t;
  int block = -1;          //!< block index, -1 for embedding and final tensors
  std::size_t offset = 0;  //!< in the stage's parameter vector
  int rows = 0, cols = 0;  //!< local shape
  split_kind split = split_kind::none;
  int tp_rank = 0, tp = 1;
  int ep_rank = 0;         //!< expert tensors: rows [ep_rank rows, (ep_rank + 1) rows) of the whole
  int heads_local = 1, head_dim = 1, hidden = 1, ffn_local = 1;
  //! Whether the tensor holds experts (their gradients reduce over dp alone).
  bool expert() const { return t == tensor::EW1 || t == tensor::EB1 || t == tensor::EW2 || t == tensor::EB2; }
  std::size_t size() const { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }
  int row_of(int r) const {
    if (split == split_kind::qkv_rows) {
      const int hl = heads_local * head_dim, part = r / hl;
      return part * hidden + tp_rank * hl + r % hl;
    }
    if (split == split_kind::rows) return tp_rank * rows + r;
    if (split == split_kind::experts) return ep_rank * rows + r;
    return r;
  }
  int col_of(int c) const { return split == split_kind::cols ? tp_rank * cols + c : c; }
};

//! The tensors of a stage holding blocks [b0, b1), the embedding and/or the final layers, on tp
//! rank `t` and ep rank `e`, with their offsets.
inline std::vector<tensor_slot> stage_tensors(const model_spec& m, const sharding& s, int t, int b0, int b1, bool embed,
                                              bool final_layers, int e = 0) {
  std::vector<tensor_slot> out;
  std::size_t off = 0;
  auto add = [&](tensor x, int block) {
    tensor_slot ts{x, block};
    auto [r, c] = full_shape(m, x);
    ts.split = split_of(x) == split_kind::experts ? (s.ep > 1 ? split_kind::experts : split_kind::none)
               : s.tp > 1                         ? split_of(x)
                                                  : split_kind::none;
    ts.tp_rank = t;
    ts.ep_rank = e;
    ts.tp = s.tp;
    ts.heads_local = m.heads / s.tp;
    ts.head_dim = m.head_dim();
    ts.hidden = m.hidden;
    ts.ffn_local = m.ffn / s.tp;
    if (ts.split == split_kind::qkv_rows || ts.split == split_kind::rows) r /= s.tp;
    if (ts.split == split_kind::experts) r /= s.ep;
    if (ts.split == split_kind::cols) c /= s.tp;
    ts.rows = r;
    ts.cols = c;
    ts.offset = off;
    off += ts.size();
    out.push_back(ts);
  };
  if (embed) {
    if (m.vocab_parallel == 0) add(tensor::E, -1);
    add(tensor::P, -1);
  }
  for (int b = b0; b < b1; ++b) {
    for (tensor x : {tensor::LN1G, tensor::LN1B, tensor::WQKV, tensor::BQKV, tensor::WO, tensor::BO, tensor::LN2G, tensor::LN2B}) add(x, b);
    if (m.moe.is_moe(b))
      for (tensor x : {tensor::ROUTER, tensor::EW1, tensor::EB1, tensor::EW2, tensor::EB2}) add(x, b);
    else
      for (tensor x : {tensor::W1, tensor::B1, tensor::W2, tensor::B2}) add(x, b);
  }
  if (final_layers) {
    add(tensor::LNFG, -1), add(tensor::LNFB, -1);
    if (m.vocab_parallel == 0) add(tensor::WOUT, -1), add(tensor::BOUT, -1);
  }
  return out;
}

//! Whether the gradient of `slot` is a partial sum over the ranks holding other tokens.
inline bool seq_partial(const sharding& s, const tensor_slot& slot) {
  if (s.sp_ranks() > 1) return true;              // every parameter sees only this rank's tokens
  if (s.megatron()) return slot.split == split_kind::none;  // replicated ones see the local chunk
  return false;
}

//! Blocks of virtual stage `st` of `S` over `L` blocks: [st L / S, (st + 1) L / S).
inline std::pair<int, int> stage_blocks(int L, int st, int S) { return {st * L / S, (st + 1) * L / S}; }

//! The data of a step: token ids and targets of every global microbatch, and the loss scale.
struct batch {
  std::vector<double> tokens, targets;  // [microbatches][seq]
};
//! Microbatches `[first, first + count)` of `b`.
inline batch slice(const model_spec& m, const batch& b, int first, int count) {
  const auto at = static_cast<std::ptrdiff_t>(first) * m.seq, n = static_cast<std::ptrdiff_t>(count) * m.seq;
  return {{b.tokens.begin() + at, b.tokens.begin() + at + n}, {b.targets.begin() + at, b.targets.begin() + at + n}};
}

//! Tokens and next-token-like targets of `microbatches` sequences for step `step`.
inline batch make_batch(const model_spec& m, int microbatches, int step) {
  batch b;
  const auto n = static_cast<std::size_t>(microbatches) * static_cast<std::size_t>(m.seq);
  b.tokens.resize(n);
  b.targets.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    b.tokens[i] = std::floor((hashed(static_cast<std::uint64_t>(step), i, 11) + 1) * 0.5 * m.vocab);
    b.targets[i] = std::floor((hashed(static_cast<std::uint64_t>(step), i, 12) + 1) * 0.5 * m.vocab);
  }
  return b;
}

//! The communicators a stage uses inside its functions (any of them may be null on the host:
//! degree 1; a device stage needs every one, a group of one rank for degree 1).
template <class C>
struct stage_comms {
  C* tp = nullptr;       //!< tensor-parallel group
  C* ep = nullptr;       //!< expert-parallel group (MoE blocks)
  C* ulysses = nullptr;  //!< Ulysses group (inside the sp dimension)
  C* ring = nullptr;     //!< ring group (across the sp dimension)
};

//! Blocks [b0, b1) of the model (plus the embedding on the first stage and the loss on the last)
//! as a `loom::split_stage` sharded by `sharding` (see the file comment), computed by executor
//! `X`: `host_exec` (double, host loops) or `device_exec` (`device.hpp`: fp32 kernels on the
//! stage's stream, the groups bound to it). `targets` points at this rank's targets of the step
//! (`[microbatch][local token]`, host or device memory as `X`'s buffers), at a fixed address whose
//! contents are set before each step. The last stage's output is the scaled loss of each local
//! token, which the pipeline adds in order into the microbatch's loss.
template <class C, class X = host_exec>
class transformer_stage {
 public:
  using value_type = typename X::value_type;  //!< double on the host, float on a device
  using T = value_type;                       //!< shorthand
  using T_value = value_type;                 //!< the same, where `T` names a token count
  using G = typename X::template group<C>;    //!< the group type the patterns run over
  template <class U>
  using buffer = typename X::template buffer<U>;

  transformer_stage(const model_spec& m, const sharding& s, int tp_rank, int sp_rank, int b0, int b1, bool embed,
                    bool final_layers, stage_comms<C> comms, bool deterministic, double loss_scale, const T* targets)
      : m_(&m), s_(s), tpr_(tp_rank), spr_(sp_rank), b0_(b0), b1_(b1), embed_(embed), final_(final_layers), c_(comms),
        targets_(targets), scale_(static_cast<T>(loss_scale)),
        own_tp_(hold(comms.tp)), own_uly_(hold(comms.ulysses)), own_ring_(hold(comms.ring)),
        tp_{bound(comms.tp, own_tp_), s.megatron() ? loom::tp_mode::sequence_sharded : loom::tp_mode::replicated, deterministic},
        T_(static_cast<std::size_t>(s.tokens(m))),
        Tr_(static_cast<std::size_t>(s.region_tokens(m))),
        h_(static_cast<std::size_t>(m.hidden)),
        hl_(static_cast<std::size_t>(m.hidden / s.tp)),
        fl_(static_cast<std::size_t>(m.ffn / s.tp)),
        att_(bound(comms.ulysses, own_uly_), bound(comms.ring, own_ring_), s.region_tokens(m),
             loom::attention_dims{m.heads / s.tp, m.head_dim(), 1.0 / std::sqrt(static_cast<double>(m.head_dim()))}, m.causal,
             s.token_ring()) {
    const int ep_rank = comms.ep == nullptr ? 0 : comms.ep->rank();
    slots_ = stage_tensors(m, s, tp_rank, b0, b1, embed, final_layers, ep_rank);
    std::size_t n = 0;
    for (auto const& ts : slots_) n += ts.size();
    std::vector<T> init(n);
    for (auto const& ts : slots_)
      for (int r = 0; r < ts.rows; ++r)
        for (int c = 0; c < ts.cols; ++c)
          init[ts.offset + static_cast<std::size_t>(r * ts.cols + c)] = static_cast<T>(initial(m, ts.t, ts.block, ts.row_of(r), ts.col_of(c)));
    params_ = X::upload(init);
    grads_ = X::template zeros<T>(n);
    for (auto const& ts : slots_)
      ranges_.push_back({ts.offset, ts.size(), seq_partial(s, ts) ? s.seq_dims() : loom::dim_set{}, ts.expert()});
    layout_stash();
    std::vector<int> pos;
    for (std::size_t t = 0; t < T_; ++t) pos.push_back(s_.token(m, tpr_, spr_, static_cast<int>(t)));
    pos_ = X::upload(pos);
    work_ = X::template zeros<T>(work_slots * work_part(m, s));
    // MoE blocks: one branch each; the auxiliary loss of a routing unit (a rank's sequence)
    // weighs 1 / (sequences of the step) in the objective, as the loss terms weigh 1 / tokens.
    if (m.moe.count(b0, b1) > 0) aux_scale_ = X::upload(std::vector<T>{static_cast<T>(loss_scale * m.seq)});
    for (int blk = b0; blk < b1; ++blk) {
      auto& br = moe_.emplace_back();
      if (m.moe.is_moe(blk)) br.emplace(m.moe, T_, h_, static_cast<std::size_t>(m.ffn), comms.ep, X::whole(aux_scale_).data());
    }
  }

  //! The pipeline's sizes of a stage holding blocks [b0, b1) on any tp rank (without building one).
  static loom::stage_sizes sizes(const model_spec& m, const sharding& s, int b0, int b1, bool embed, bool final_layers) {
    const auto T = static_cast<std::size_t>(s.tokens(m)), h = static_cast<std::size_t>(m.hidden);
    std::size_t weights = 0;
    for (auto const& ts : stage_tensors(m, s, 0, b0, b1, embed, final_layers)) weights += ts.size();
    const bool vp = m.vocab_parallel != 0;  // the vocabulary layers embed and compute the loss
    return {embed && !vp ? T : T * h, T * (final_layers && !vp ? 1 : h), stash_plan_of(m, s, b1 - b0, embed, final_layers).total, weights};
  }
  //! Bytes of the storage such a stage allocates itself (`X`'s buffers, device memory on a
  //! device): parameters and gradients, the work space, the tokens' positions, and the buffers of
  //! its attention (`loom::usp_attention::buffer_elements`).
  static std::size_t own_bytes(const model_spec& m, const sharding& s, int b0, int b1, bool embed, bool final_layers) {
    const auto z = sizes(m, s, b0, b1, embed, final_layers);
    const auto T = static_cast<std::size_t>(s.tokens(m));
    const std::size_t work = work_slots * work_part(m, s);
    const std::size_t att = loom::usp_attention<G, T_value>::buffer_elements(
        s.u(), s.ring(), s.region_tokens(m), {m.heads / s.tp, m.head_dim(), 1.0 / std::sqrt(static_cast<double>(m.head_dim()))},
        s.token_ring());
    return (2 * z.weights + work + att) * sizeof(T_value) + T * sizeof(int);
  }

  std::size_t input_size() const { return embed_ && !vp() ? T_ : T_ * h_; }
  std::size_t output_size() const { return T_ * (final_ && !vp() ? 1 : h_); }
  std::size_t stash_size() const { return stash_total_; }
  std::span<T> weight_grad() { return X::whole(grads_); }
  std::span<T> params() { return X::whole(params_); }
  //! Gives up the parameters' storage (ZeRO-3, `loom::releasable_stage`; on a device freed in the
  //! order of the stream of the last call): `params()` is empty until `acquire_params()`.
  void release_params() { x_.release(params_); }
  //! Storage for the parameters again (contents unspecified: the reducer fills them).
  void acquire_params() {
    if (params_.size() == 0) params_ = X::template zeros<T>(grads_.size());
  }
  std::span<const loom::grad_range> grad_ranges() const { return ranges_; }
  //! The tensors this stage holds (to compare with the reference).
  const std::vector<tensor_slot>& tensors() const { return slots_; }
  //! `own_bytes` of this stage.
  std::size_t own_bytes() const { return own_bytes(*m_, s_, b0_, b1_, embed_, final_); }
  //! Bytes of the storage this stage's MoE blocks hold after `microbatches` microbatches
  //! (`moe_branch::bytes` each, and the auxiliary loss's weight); 0 without MoE blocks.
  std::size_t moe_bytes(int microbatches) const {
    const int blocks = m_->moe.count(b0_, b1_);
    if (blocks == 0) return 0;
    return sizeof(T) + static_cast<std::size_t>(blocks) * moe_branch<C, X>::bytes(m_->moe, T_, h_, static_cast<std::size_t>(m_->ffn), s_.ep, microbatches);
  }
  //! A host copy of the parameters (on a device after the work enqueued so far).
  std::vector<T> host_params() { return X::template download<T>(params()); }
  //! The records of microbatch `mb`'s last forward through this stage's MoE blocks: (block, record)
  //! in block order.
  std::vector<std::pair<int, typename moe_branch<C, X>::record>> moe_records(int mb) const {
    std::vector<std::pair<int, typename moe_branch<C, X>::record>> out;
    for (int blk = b0_; blk < b1_; ++blk)
      if (auto const& br = moe_[static_cast<std::size_t>(blk - b0_)]) out.emplace_back(blk, br->last(mb));
    return out;
  }

  void forward(const loom::stage_context& ctx, loom::forward_buffers<T> b) {
    guard(ctx, [&] {
      if (ctx.microbatch == fail_on) throw std::runtime_error("injected failure");
      std::span<T> cur(work(0), T_ * h_), next(work(1), T_ * h_);
      if (embed_ && vp()) position_forward(b.input, cur);
      else if (embed_) embed_forward(b.input, cur);
      else x_.copy(b.input, cur);
      for (int blk = b0_; blk < b1_; ++blk) {
        block_forward(ctx, blk, cur, next, b.stash);
        std::swap(cur, next);
      }
      if (final_ && vp()) final_norm_forward(cur, b.stash, b.output);
      else if (final_) final_forward(ctx.microbatch, cur, b.stash, b.output);
      else x_.copy(std::span<const T>(cur), b.output);
    });
  }

  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<T> b) {
    guard(ctx, [&] {
      std::span<T> g(work(0), T_ * h_), gn(work(1), T_ * h_);
      if (final_ && vp()) final_norm_backward(b.output_grad, b.stash, g);
      else if (final_) final_backward(ctx.microbatch, b.output_grad, b.stash, g);
      else x_.copy(b.output_grad, g);
      for (int blk = b1_ - 1; blk >= b0_; --blk) {
        block_backward_input(ctx, blk, g, gn, b.stash);
        std::swap(g, gn);
      }
      if (embed_) x_.copy(std::span<const T>(g), st(b.stash, emb_grad_, T_ * h_));
      // The embedding's input gradient goes on to the vocabulary layers' IB.
      if (!embed_ || vp()) x_.copy(std::span<const T>(g), b.input_grad);
    });
  }

  void backward_weight(const loom::stage_context& ctx, loom::weight_buffers<T> b) {
    guard(ctx, [&] {
      T* gw = b.weight_grad.data();
      if (embed_ && vp()) {
        x_.each(h_, kernels::position_backward_col<T>{st(b.stash, emb_grad_, T_ * h_).data(), pos_.data(), gw + slot(tensor::P, -1).offset, T_, h_},
                "position embedding backward");
      } else if (embed_) {
        const T* dx = st(b.stash, emb_grad_, T_ * h_).data();
        x_.each(h_, kernels::embed_backward_col<T>{b.input.data(), dx, pos_.data(), gw + slot(tensor::E, -1).offset,
                                                   gw + slot(tensor::P, -1).offset, T_, h_},
                "embedding backward");
      }
      for (int blk = b0_; blk < b1_; ++blk) block_backward_weight(ctx, blk, b.stash, gw);
      if (final_ && vp()) ln_backward_weight(st(b.stash, fin_df_, T_ * h_).data(), st(b.stash, fin_xhat_, T_ * h_).data(),
                                             gw + slot(tensor::LNFG, -1).offset, gw + slot(tensor::LNFB, -1).offset);
      else if (final_) final_backward_weight(b.stash, gw);
    });
  }

  void backward(const loom::stage_context& ctx, loom::backward_buffers<T> b) {
    backward_input(ctx, b);
    backward_weight(ctx, {b.input, b.stash, b.weight_grad});
  }

  int fail_on = -1;  //!< microbatch whose forward throws (fault tests), or -1

 private:
  // The device groups bound to the call's stream (none on the host: the patterns use the groups).
  static std::unique_ptr<G> hold(C* c) {
    if constexpr (X::device) {
      if (c != nullptr) return std::make_unique<G>(*c, nullptr);
    }
    (void)c;
    return nullptr;
  }
  static G* bound(C* c, const std::unique_ptr<G>& own) {
    if constexpr (X::device) return own.get();
    else return c;
  }

  // A stage function that throws while its tp/sp peers wait in a collective would leave them
  // waiting: abort the world first, so every rank stops and names this one.
  template <class F>
  void guard(const loom::stage_context& ctx, F&& f) {
    x_.bind(ctx);
    if constexpr (X::device)
      for (auto* own : {&own_tp_, &own_uly_, &own_ring_})
        if (*own) **own = G((*own)->group(), ctx.stream);
    try {
      f();
    } catch (const loom::comm_error&) {
      throw;
    } catch (const std::exception& e) {
      abort_peers(std::string("a stage function threw: ") + e.what());
      throw;
    }
  }
  void abort_peers(const std::string& why) {
    for (C* c : {c_.tp, c_.ep, c_.ulysses, c_.ring})
      if (c != nullptr && c->size() > 1) {
        c->abort(why);
        return;
      }
  }

  //! The work space: `work_slots` slots of `work_part` elements (the largest activation of a block,
  //! or the logits).
  static constexpr std::size_t work_slots = 8;
  static std::size_t work_part(const model_spec& m, const sharding& s) {
    const auto T = static_cast<std::size_t>(s.tokens(m)), Tr = static_cast<std::size_t>(s.region_tokens(m)),
               h = static_cast<std::size_t>(m.hidden), hl = h / static_cast<std::size_t>(s.tp),
               fl = static_cast<std::size_t>(m.ffn / s.tp);
    return std::max(Tr * std::max({h, 3 * hl, fl}), T * static_cast<std::size_t>(m.vocab));
  }
  T* work(int i) { return X::whole(work_).data() + static_cast<std::size_t>(i) * work_part(*m_, s_); }

  // ---- stash layout -------------------------------------------------------------------------
  struct block_stash {
    std::size_t xhat1, rstd1, afull, att, o, xhat2, rstd2, cfull, act;       // forward
    std::size_t dqkv, dyfull, dyin, du, dzfull, dzin, da, dc;               // backward_input, for W
  };
  //! Where each tensor of a stage's stash starts (see `stash_plan_of`).
  struct stash_plan {
    std::vector<block_stash> blocks;
    std::size_t xhat = 0, rstd = 0, f = 0, probs = 0, dlogits = 0, df = 0, emb = 0, total = 0;
  };
  //! The stash of a stage of `blocks` blocks: per block the forward's tensors and what the
  //! backward keeps for W, then the final layers', then the embedding's input gradient.
  static stash_plan stash_plan_of(const model_spec& m, const sharding& s, int blocks, bool embed, bool final_layers) {
    const auto T = static_cast<std::size_t>(s.tokens(m)), Tr = static_cast<std::size_t>(s.region_tokens(m)),
               h = static_cast<std::size_t>(m.hidden), hl = h / static_cast<std::size_t>(s.tp),
               fl = static_cast<std::size_t>(m.ffn / s.tp), V = static_cast<std::size_t>(m.vocab);
    const std::size_t att = 4 * Tr * hl + Tr * static_cast<std::size_t>(m.heads / s.tp);  // usp_attention::stash_size()
    stash_plan p;
    std::size_t off = 0;
    auto take = [&](std::size_t n) {
      std::size_t at = off;
      off += n;
      return at;
    };
    for (int blk = 0; blk < blocks; ++blk) {
      block_stash bs{};
      bs.xhat1 = take(T * h);
      bs.rstd1 = take(T);
      bs.afull = take(Tr * h);
      bs.att = take(att);
      bs.o = take(Tr * hl);
      bs.xhat2 = take(T * h);
      bs.rstd2 = take(T);
      bs.cfull = take(Tr * h);
      bs.act = take(Tr * fl);
      bs.dqkv = take(Tr * 3 * hl);
      bs.dyfull = take(Tr * h);
      bs.dyin = take(T * h);
      bs.du = take(Tr * fl);
      bs.dzfull = take(Tr * h);
      bs.dzin = take(T * h);
      bs.da = take(T * h);
      bs.dc = take(T * h);
      p.blocks.push_back(bs);
    }
    if (final_layers && m.vocab_parallel != 0) {  // the final layer norm alone (the head is the vocabulary layers')
      p.xhat = take(T * h);
      p.rstd = take(T);
      p.df = take(T * h);
    } else if (final_layers) {
      p.xhat = take(T * h);
      p.rstd = take(T);
      p.f = take(T * h);
      p.probs = take(T * V);
      p.dlogits = take(T * V);
      p.df = take(T * h);
    }
    if (embed) p.emb = take(T * h);
    p.total = off;
    return p;
  }
  void layout_stash() {
    stash_plan p = stash_plan_of(*m_, s_, b1_ - b0_, embed_, final_);
    bstash_ = std::move(p.blocks);
    fin_xhat_ = p.xhat, fin_rstd_ = p.rstd, fin_f_ = p.f, fin_probs_ = p.probs, fin_dlogits_ = p.dlogits, fin_df_ = p.df;
    emb_grad_ = p.emb;
    stash_total_ = p.total;
  }
  static std::span<T> st(std::span<T> stash, std::size_t at, std::size_t n) { return stash.subspan(at, n); }

  bool vp() const { return m_->vocab_parallel != 0; }
  const tensor_slot& slot(tensor t, int block) const {
    for (auto const& ts : slots_)
      if (ts.t == t && ts.block == block) return ts;
    throw std::logic_error("transformer_stage: no tensor");
  }
  std::span<const T> P(tensor t, int block) {
    auto const& ts = slot(t, block);
    return {params().data() + ts.offset, ts.size()};
  }

  // ---- kernels over this stage's rows -------------------------------------------------------
  void ln_forward(const T* x, const T* g, const T* bias, T* y, T* xhat, T* rstd) {
    x_.each(T_, kernels::ln_forward_row<T>{x, g, bias, y, xhat, rstd, h_}, "layer norm");
  }
  void ln_backward_input(const T* dy, const T* xhat, const T* rstd, const T* g, const T* res, T* dx) {
    x_.each(T_, kernels::ln_backward_input_row<T>{dy, xhat, rstd, g, res, dx, h_}, "layer norm backward (input)");
  }
  void ln_backward_weight(const T* dy, const T* xhat, T* dg, T* db) {
    x_.each(h_, kernels::ln_backward_weight_col<T>{dy, xhat, dg, db, T_, h_}, "layer norm backward (weight)");
  }
  void bias_backward(const T* dy, T* db) {
    x_.each(h_, kernels::ln_backward_weight_col<T>{dy, nullptr, nullptr, db, T_, h_}, "bias backward");
  }
  void add(const T* a, const T* b, T* y) { x_.each(T_ * h_, kernels::add_elem<T>{a, b, y}, "residual"); }

  // ---- embedding ----------------------------------------------------------------------------
  //! The vocabulary-parallel first stage: x = the summed embedding parts + P[position].
  void position_forward(std::span<const T> parts, std::span<T> x) {
    x_.each(T_ * h_, kernels::position_elem<T>{parts.data(), P(tensor::P, -1).data(), pos_.data(), x.data(), h_}, "position embedding");
  }
  void embed_forward(std::span<const T> ids, std::span<T> x) {
    x_.each(T_ * h_, kernels::embed_elem<T>{ids.data(), P(tensor::E, -1).data(), P(tensor::P, -1).data(), pos_.data(), x.data(), h_},
            "embedding");
  }

  // ---- one block ----------------------------------------------------------------------------
  void block_forward(const loom::stage_context& ctx, int blk, std::span<const T> x, std::span<T> y, std::span<T> stash) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    std::span<T> a(work(2), T_ * h_), qkv_tok(work(3), Tr_ * 3 * hl_), qkv(work(4), Tr_ * 3 * hl_), part(work(5), Tr_ * h_),
        out(work(6), T_ * h_);
    // attention branch
    ln_forward(x.data(), P(tensor::LN1G, blk).data(), P(tensor::LN1B, blk).data(), a.data(), st(stash, bs.xhat1, T_ * h_).data(),
               st(stash, bs.rstd1, T_).data());
    loom::column_parallel_linear<K> wqkv{h_, 3 * hl_, x_.linear()};
    wqkv.forward(tp_, std::span<const T>(a), st(stash, bs.afull, Tr_ * h_), P(tensor::WQKV, blk), P(tensor::BQKV, blk), qkv_tok);
    to_heads(qkv_tok, qkv);
    std::span<T> o = st(stash, bs.o, Tr_ * hl_);
    att_.forward(std::span<const T>(qkv), o, st(stash, bs.att, att_.stash_size()));
    loom::row_parallel_linear<K> wo{hl_, h_, x_.linear()};
    wo.forward(tp_, std::span<const T>(o), P(tensor::WO, blk), P(tensor::BO, blk), part, out);
    add(x.data(), out.data(), y.data());  // x1, kept in y
    // MLP branch (an MoE block: the MoE branch)
    std::span<T> c(work(2), T_ * h_), u(work(3), Tr_ * fl_);
    ln_forward(y.data(), P(tensor::LN2G, blk).data(), P(tensor::LN2B, blk).data(), c.data(), st(stash, bs.xhat2, T_ * h_).data(),
               st(stash, bs.rstd2, T_).data());
    if (auto& br = moe_[static_cast<std::size_t>(blk - b0_)]) {
      x_.copy(std::span<const T>(c), st(stash, bs.cfull, T_ * h_));
      br->forward(ctx, std::span<const T>(c), moe_weights(blk), out);
      add(y.data(), out.data(), y.data());
      return;
    }
    loom::column_parallel_linear<K> w1{h_, fl_, x_.linear()};
    w1.forward(tp_, std::span<const T>(c), st(stash, bs.cfull, Tr_ * h_), P(tensor::W1, blk), P(tensor::B1, blk), u);
    std::span<T> act = st(stash, bs.act, Tr_ * fl_);
    x_.each(act.size(), kernels::tanh_elem<T>{u.data(), act.data()}, "tanh");
    loom::row_parallel_linear<K> w2{fl_, h_, x_.linear()};
    w2.forward(tp_, std::span<const T>(act), P(tensor::W2, blk), P(tensor::B2, blk), part, out);
    add(y.data(), out.data(), y.data());
  }

  //! `g` is the gradient of the block's output; `gx` receives the gradient of its input.
  void block_backward_input(const loom::stage_context& ctx, int blk, std::span<const T> g, std::span<T> gx, std::span<T> stash) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    std::span<T> scratch(work(5), Tr_ * h_), g1 = st(stash, bs.dyin, T_ * h_);  // the gradient of x1 is dy of the attention branch
    if (auto& br = moe_[static_cast<std::size_t>(blk - b0_)]) {
      std::span<T> dc = st(stash, bs.dc, T_ * h_);
      br->backward_input(ctx, g, moe_weights(blk), dc);
      ln_backward_input(dc.data(), st(stash, bs.xhat2, T_ * h_).data(), st(stash, bs.rstd2, T_).data(), P(tensor::LN2G, blk).data(),
                        g.data(), g1.data());
    } else {
      mlp_backward_input(blk, g, g1, scratch, stash);
    }
    attention_backward_input(blk, g1, gx, scratch, stash);
  }

  //! The MLP branch's backward (`g`: also dz, the gradient of W2's output, this rank's tokens);
  //! `g1` receives the gradient of the block's x1.
  void mlp_backward_input(int blk, std::span<const T> g, std::span<T> g1, std::span<T> scratch, std::span<T> stash) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    std::span<T> dzin = st(stash, bs.dzin, T_ * h_);
    x_.copy(g, dzin);
    loom::row_parallel_linear<K> w2{fl_, h_, x_.linear()};
    std::span<T> du = st(stash, bs.du, Tr_ * fl_);
    w2.backward_input(tp_, std::span<const T>(dzin), st(stash, bs.dzfull, Tr_ * h_), P(tensor::W2, blk), du);
    std::span<const T> act = st(stash, bs.act, Tr_ * fl_);
    x_.each(du.size(), kernels::tanh_grad_elem<T>{act.data(), du.data()}, "tanh backward");
    loom::column_parallel_linear<K> w1{h_, fl_, x_.linear()};
    std::span<T> dc = st(stash, bs.dc, T_ * h_);
    w1.backward_input(tp_, std::span<const T>(du), P(tensor::W1, blk), scratch, dc);
    ln_backward_input(dc.data(), st(stash, bs.xhat2, T_ * h_).data(), st(stash, bs.rstd2, T_).data(), P(tensor::LN2G, blk).data(),
                      g.data(), g1.data());
  }

  //! The attention branch's backward: `g1` the gradient of x1, `gx` receives the block input's.
  void attention_backward_input(int blk, std::span<const T> g1, std::span<T> gx, std::span<T> scratch, std::span<T> stash) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    loom::row_parallel_linear<K> wo{hl_, h_, x_.linear()};
    std::span<T> dout(work(2), Tr_ * hl_);
    wo.backward_input(tp_, std::span<const T>(g1), st(stash, bs.dyfull, Tr_ * h_), P(tensor::WO, blk), dout);
    std::span<T> dqkv(work(3), Tr_ * 3 * hl_), dqkv_tok = st(stash, bs.dqkv, Tr_ * 3 * hl_);
    att_.backward(std::span<const T>(dout), dqkv, st(stash, bs.att, att_.stash_size()));
    from_heads(dqkv, dqkv_tok);
    loom::column_parallel_linear<K> wqkv{h_, 3 * hl_, x_.linear()};
    std::span<T> da = st(stash, bs.da, T_ * h_);
    wqkv.backward_input(tp_, std::span<const T>(dqkv_tok), P(tensor::WQKV, blk), scratch, da);
    ln_backward_input(da.data(), st(stash, bs.xhat1, T_ * h_).data(), st(stash, bs.rstd1, T_).data(), P(tensor::LN1G, blk).data(),
                      g1.data(), gx.data());
  }

  void block_backward_weight(const loom::stage_context& ctx, int blk, std::span<T> stash, T* gw) {
    auto const& bs = bstash_[static_cast<std::size_t>(blk - b0_)];
    auto G = [&](tensor t) {
      auto const& ts = slot(t, blk);
      return std::span<T>(gw + ts.offset, ts.size());
    };
    auto c = [&](std::size_t at, std::size_t n) { return std::span<const T>(st(stash, at, n)); };
    if (auto& br = moe_[static_cast<std::size_t>(blk - b0_)]) {
      br->backward_weight(ctx, c(bs.cfull, T_ * h_), {G(tensor::ROUTER), G(tensor::EW1), G(tensor::EB1), G(tensor::EW2), G(tensor::EB2)});
    } else {
      loom::row_parallel_linear<K> w2{fl_, h_, x_.linear()};
      w2.backward_weight(c(bs.act, Tr_ * fl_), c(bs.dzfull, Tr_ * h_), G(tensor::W2));
      bias_backward(c(bs.dzin, T_ * h_).data(), G(tensor::B2).data());
      loom::column_parallel_linear<K> w1{h_, fl_, x_.linear()};
      w1.backward_weight(c(bs.cfull, Tr_ * h_), c(bs.du, Tr_ * fl_), G(tensor::W1), G(tensor::B1));
    }
    ln_backward_weight(c(bs.dc, T_ * h_).data(), c(bs.xhat2, T_ * h_).data(), G(tensor::LN2G).data(), G(tensor::LN2B).data());
    loom::row_parallel_linear<K> wo{hl_, h_, x_.linear()};
    wo.backward_weight(c(bs.o, Tr_ * hl_), c(bs.dyfull, Tr_ * h_), G(tensor::WO));
    bias_backward(c(bs.dyin, T_ * h_).data(), G(tensor::BO).data());
    loom::column_parallel_linear<K> wqkv{h_, 3 * hl_, x_.linear()};
    wqkv.backward_weight(c(bs.afull, Tr_ * h_), c(bs.dqkv, Tr_ * 3 * hl_), G(tensor::WQKV), G(tensor::BQKV));
    ln_backward_weight(c(bs.da, T_ * h_).data(), c(bs.xhat1, T_ * h_).data(), G(tensor::LN1G).data(), G(tensor::LN1B).data());
  }

  //! This rank's weights of MoE block `blk`.
  typename moe_branch<C, X>::weights moe_weights(int blk) {
    return {P(tensor::ROUTER, blk), P(tensor::EW1, blk), P(tensor::EB1, blk), P(tensor::EW2, blk), P(tensor::EB2, blk)};
  }

  //! `[tokens][3][heads][d]` (the Q/K/V projection's rows) to `[3][tokens][heads][d]`.
  void to_heads(std::span<const T> tok, std::span<T> heads) {
    x_.each(tok.size(), kernels::qkv_layout_elem<T>{tok.data(), heads.data(), Tr_, hl_, true}, "q/k/v to heads");
  }
  //! The inverse of `to_heads`.
  void from_heads(std::span<const T> heads, std::span<T> tok) {
    x_.each(heads.size(), kernels::qkv_layout_elem<T>{heads.data(), tok.data(), Tr_, hl_, false}, "q/k/v from heads");
  }

  // ---- final layer norm, output projection, loss -------------------------------------------
  const T* targets_of(int mb) const { return targets_ + static_cast<std::size_t>(mb) * T_; }

  //! The scaled loss of each token into `terms`.
  void final_forward(int mb, std::span<const T> x, std::span<T> stash, std::span<T> terms) {
    const auto V = static_cast<std::size_t>(m_->vocab);
    std::span<T> f = st(stash, fin_f_, T_ * h_), logits(work(2), T_ * V);
    ln_forward(x.data(), P(tensor::LNFG, -1).data(), P(tensor::LNFB, -1).data(), f.data(), st(stash, fin_xhat_, T_ * h_).data(),
               st(stash, fin_rstd_, T_).data());
    x_.linear().forward(std::span<const T>(f), P(tensor::WOUT, -1), P(tensor::BOUT, -1), logits, T_, h_, V);
    x_.each(T_, kernels::loss_row<T>{logits.data(), targets_of(mb), st(stash, fin_probs_, T_ * V).data(), terms.data(), V, scale_},
            "loss");
  }
  //! The vocabulary-parallel last stage: the final layer norm into the stage's output.
  void final_norm_forward(std::span<const T> x, std::span<T> stash, std::span<T> out) {
    ln_forward(x.data(), P(tensor::LNFG, -1).data(), P(tensor::LNFB, -1).data(), out.data(), st(stash, fin_xhat_, T_ * h_).data(),
               st(stash, fin_rstd_, T_).data());
  }
  //! Its backward from the vocabulary layers' gradient `dy` of the output (kept for the weights).
  void final_norm_backward(std::span<const T> dy, std::span<T> stash, std::span<T> g) {
    std::span<T> df = st(stash, fin_df_, T_ * h_), zero(work(7), T_ * h_);
    x_.copy(dy, df);
    x_.fill(zero, T(0));
    ln_backward_input(df.data(), st(stash, fin_xhat_, T_ * h_).data(), st(stash, fin_rstd_, T_).data(), P(tensor::LNFG, -1).data(),
                      zero.data(), g.data());
  }
  //! `seed`: the gradient of every token's loss term (the same for all).
  void final_backward(int mb, std::span<const T> seed, std::span<T> stash, std::span<T> g) {
    const auto V = static_cast<std::size_t>(m_->vocab);
    std::span<T> dl = st(stash, fin_dlogits_, T_ * V), df = st(stash, fin_df_, T_ * h_), zero(work(7), T_ * h_);
    x_.each(T_ * V, kernels::loss_backward_elem<T>{st(stash, fin_probs_, T_ * V).data(), targets_of(mb), seed.data(), scale_, dl.data(), V},
            "loss backward");
    x_.linear().backward_input(std::span<const T>(dl), P(tensor::WOUT, -1), df, T_, h_, V);
    x_.fill(zero, T(0));
    ln_backward_input(df.data(), st(stash, fin_xhat_, T_ * h_).data(), st(stash, fin_rstd_, T_).data(), P(tensor::LNFG, -1).data(),
                      zero.data(), g.data());
  }
  void final_backward_weight(std::span<T> stash, T* gw) {
    const auto V = static_cast<std::size_t>(m_->vocab);
    auto G = [&](tensor t) {
      auto const& ts = slot(t, -1);
      return std::span<T>(gw + ts.offset, ts.size());
    };
    x_.linear().backward_weight(std::span<const T>(st(stash, fin_f_, T_ * h_)), std::span<const T>(st(stash, fin_dlogits_, T_ * V)),
                                G(tensor::WOUT), G(tensor::BOUT), T_, h_, V);
    ln_backward_weight(st(stash, fin_df_, T_ * h_).data(), st(stash, fin_xhat_, T_ * h_).data(), G(tensor::LNFG).data(),
                       G(tensor::LNFB).data());
  }

  using K = decltype(std::declval<const X&>().linear());

  const model_spec* m_;
  sharding s_;
  int tpr_, spr_, b0_, b1_;
  bool embed_, final_;
  stage_comms<C> c_;
  const T* targets_;
  T scale_;
  X x_{};
  std::unique_ptr<G> own_tp_, own_uly_, own_ring_;
  loom::tp_group<G> tp_;
  std::size_t T_, Tr_, h_, hl_, fl_;
  loom::usp_attention<G, T> att_;
  std::vector<tensor_slot> slots_;
  std::vector<loom::grad_range> ranges_;
  buffer<T> params_, grads_, work_;
  buffer<int> pos_;  //!< global position of each local token
  buffer<T> aux_scale_;  //!< the objective's weight of one routing unit's auxiliary loss (MoE blocks)
  std::vector<std::optional<moe_branch<C, X>>> moe_;  //!< per block of the stage: its MoE branch, if an MoE block
  std::vector<block_stash> bstash_;
  std::size_t fin_xhat_ = 0, fin_rstd_ = 0, fin_f_ = 0, fin_probs_ = 0, fin_dlogits_ = 0, fin_df_ = 0, emb_grad_ = 0;
  std::size_t stash_total_ = 0;
};

}  // namespace mesh_example
