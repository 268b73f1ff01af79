// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The vocabulary of a per-rank program: compute actions (F, B, W, BW, overlapped FB, and the
//! vocabulary-parallel passes S, T, IF, IB), the host copies of an offloaded activation (offload,
//! reload) and, after lowering, point-to-point sends and receives.

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/schedule/error.hpp"

namespace loom {

//! Kind of an action. `F` forward; `B` input-gradient backward; `W` weight-gradient backward;
//! `BW` fused full backward (B then W as one action); `FB` a forward overlapped with a
//! backward (DualPipe); `send`/`recv` point-to-point transfers inserted by `lower`;
//! `offload`/`reload` the copy of the activation `F(mb, stage)` keeps for its backward to host
//! memory and back (PipeOffload, `with_offload`): the rank issues the copy and goes on, the copy
//! runs on the rank's host link, and the backward waits for the copy back.
//! `S`, `T`, `IF`, `IB` are the passes of vocabulary parallelism (Yeung et al., MLSys 2025; a
//! schedule with `schedule::vocab` != 0): every rank holds one shard of the output layer and of the
//! input embedding (`stage` = the shard, which is the rank's index) and runs, per microbatch, `S`
//! (the output layer's forward part: its logits and their local softmax statistics), `T` (its
//! backward part: the weight gradient from the rescaled softmax), `IF` (the input layer's forward
//! part: the shard's rows of the embedding) and `IB` (its backward part). The all-reduce
//! barriers that join the ranks are dependencies of the simulator (simulate.hpp).
//! Weight updates are not actions: in a versioned schedule (`schedule::versioned`) a `W` or
//! `BW` may carry `action::update`, the stage's optimizer step right after it.
enum class op : std::uint8_t { F, B, W, BW, FB, send, recv, offload, reload, S, T, IF, IB };

//! What a send/recv carries: the activation produced by `F(stage, mb)` or the input gradient
//! produced by the backward of `(stage, mb)`; in a vocabulary-parallel schedule
//! (`schedule::vocab`), also the vocabulary layers' messages of microbatch `mb`, whose `stage` is
//! the *sending rank* (see `lower`):
//! - `vocab_output`: the last stage's output, from its rank to every other rank's `S`;
//! - `vocab_stats`: a rank's softmax statistics from its `S`, to every other rank;
//! - `vocab_grad`: a rank's part of the output layer's input gradient, to the last stage's rank
//!   (Algorithm 1: from its `T`; Algorithm 2: from its `S`);
//! - `vocab_embed`: a rank's part of the input embedding from its `IF`, to the first stage's rank;
//! - `vocab_embed_grad`: the first stage's input gradient, from its rank to every other rank's `IB`.
enum class payload : std::uint8_t { activation, gradient, vocab_output, vocab_stats, vocab_grad, vocab_embed, vocab_embed_grad };

//! True for the vocabulary layers' payloads (`vocab_output` ... `vocab_embed_grad`).
constexpr bool is_vocab(payload w) { return w >= payload::vocab_output; }

//! Short name of a payload in action text: `act`, `grad`, `vx`, `vstat`, `vgrad`, `vemb`, `vdemb`.
constexpr std::string_view short_name(payload w) {
  switch (w) {
    case payload::activation: return "act";
    case payload::gradient: return "grad";
    case payload::vocab_output: return "vx";
    case payload::vocab_stats: return "vstat";
    case payload::vocab_grad: return "vgrad";
    case payload::vocab_embed: return "vemb";
    case payload::vocab_embed_grad: return "vdemb";
  }
  return "?";
}

//! One step of a rank's program. `mb` and `stage` name the microbatch and the virtual stage
//! along that microbatch's path. For `FB`, (`mb`, `stage`) is the forward half and
//! (`bkind`, `bmb`, `bstage`) the backward half. For `send`/`recv`, `peer` is the other rank and
//! (`what`, `mb`, `stage`) the transferred item, named by the stage that produced it.
//! In a versioned schedule (asynchronous families, `schedule::versioned`), `version` is the
//! weight version of `stage` the action reads (0: the initial weights; `v`: the weights after the
//! stage's v-th update) and `update` on a `W`/`BW` says that the stage's optimizer runs right
//! after it, writing the next version from the gradients accumulated since the previous update.
//! Synchronous schedules leave both at their defaults (one update per step, after the flush).
struct action {
  op kind = op::F;
  op bkind = op::B;
  payload what = payload::activation;
  bool update = false;  //!< versioned schedules: the stage's update runs after this `W`/`BW`
  std::int32_t mb = 0;
  std::int32_t stage = 0;
  std::int32_t bmb = -1;
  std::int32_t bstage = -1;
  std::int32_t peer = -1;
  std::int32_t version = 0;  //!< versioned schedules: the weight version of `stage` read

  friend constexpr bool operator==(const action&, const action&) = default;
};

//! `F(mb, stage)`.
constexpr action forward(int mb, int stage) { return {.kind = op::F, .mb = mb, .stage = stage}; }
//! `B(mb, stage)`: input-gradient backward.
constexpr action backward_input(int mb, int stage) { return {.kind = op::B, .mb = mb, .stage = stage}; }
//! `W(mb, stage)`: weight-gradient backward.
constexpr action backward_weight(int mb, int stage) { return {.kind = op::W, .mb = mb, .stage = stage}; }
//! `BW(mb, stage)`: fused full backward.
constexpr action backward(int mb, int stage) { return {.kind = op::BW, .mb = mb, .stage = stage}; }
//! `FB`: forward of (`mb`, `stage`) overlapped with a backward of kind `bkind` (`B` or `BW`) of
//! (`bmb`, `bstage`).
constexpr action overlapped(int mb, int stage, op bkind, int bmb, int bstage) {
  return {.kind = op::FB, .bkind = bkind, .mb = mb, .stage = stage, .bmb = bmb, .bstage = bstage};
}
//! A send of `what` produced by (`mb`, `stage`) to rank `peer`.
constexpr action send_to(int peer, payload what, int mb, int stage) {
  return {.kind = op::send, .what = what, .mb = mb, .stage = stage, .peer = peer};
}
//! A receive of `what` produced by (`mb`, `stage`) from rank `peer`.
constexpr action recv_from(int peer, payload what, int mb, int stage) {
  return {.kind = op::recv, .what = what, .mb = mb, .stage = stage, .peer = peer};
}

//! `OFFLOAD(mb, stage)`: copy the activation kept by `F(mb, stage)` to host memory; its device
//! memory is free once the copy ends.
constexpr action offload_to_host(int mb, int stage) { return {.kind = op::offload, .mb = mb, .stage = stage}; }
//! `RELOAD(mb, stage)`: copy the offloaded activation of `F(mb, stage)` back to the device before
//! its backward.
constexpr action reload_from_host(int mb, int stage) { return {.kind = op::reload, .mb = mb, .stage = stage}; }

//! A vocabulary-parallel pass (`S`, `T`, `IF` or `IB`) of microbatch `mb` on vocabulary shard
//! `shard` (the rank's index).
constexpr action vocab_pass(op kind, int mb, int shard) { return {.kind = kind, .mb = mb, .stage = shard}; }

//! True for the vocabulary-parallel passes (`S`, `T`, `IF`, `IB`).
constexpr bool is_vocab(op k) { return k == op::S || k == op::T || k == op::IF || k == op::IB; }
//! True for the point-to-point transfers that `lower` inserts (`send`, `recv`).
constexpr bool is_transfer(op k) { return k == op::send || k == op::recv; }
//! True for the host copies of an offloaded activation (`offload`, `reload`).
constexpr bool is_host_copy(op k) { return k == op::offload || k == op::reload; }
//! True for the actions that run a stage function (everything but transfers and host copies).
constexpr bool is_compute(op k) { return !is_transfer(k) && !is_host_copy(k); }
//! True for the actions that carry an input-gradient backward (`B`, `BW`).
constexpr bool is_input_backward(op k) { return k == op::B || k == op::BW; }

//! The op's name as used in JSON and CSV: `F`, `B`, `W`, `BW`, `FB`, `SEND`, `RECV`, `OFFLOAD`,
//! `RELOAD`, `S`, `T`, `IF`, `IB`.
constexpr std::string_view to_string(op k) {
  switch (k) {
    case op::F: return "F";
    case op::B: return "B";
    case op::W: return "W";
    case op::BW: return "BW";
    case op::FB: return "FB";
    case op::send: return "SEND";
    case op::recv: return "RECV";
    case op::offload: return "OFFLOAD";
    case op::reload: return "RELOAD";
    case op::S: return "S";
    case op::T: return "T";
    case op::IF: return "IF";
    case op::IB: return "IB";
  }
  return "?";
}

//! Compact text of an action: `F3@s1`, `FB(F3@s1+B0@s6)`, `SEND(act 3@s1 ->r2)`, `RECV(vstat 3@r1 <-r1)`
//! (a vocabulary payload names its sending rank), `OFF3@s1`
//! (offload), `REL3@s1` (reload), `S3@v1` (a vocabulary pass on shard 1); a version
//! other than 0 is appended as `/v2`, an update as `+u` (`BW3@s1/v2+u`).
constexpr text to_string(const action& a) {
  using detail::to_text;
  auto one = [&a](op k, int mb, int s) {
    text t = text(to_string(k)) + to_text(mb) + "@s" + to_text(s);
    if (a.version != 0) t += "/v" + to_text(a.version);
    if (a.update) t += "+u";
    return t;
  };
  switch (a.kind) {
    case op::FB: return "FB(" + one(op::F, a.mb, a.stage) + "+" + one(a.bkind, a.bmb, a.bstage) + ")";
    case op::send:
    case op::recv:
      return text(to_string(a.kind)) + "(" + text(short_name(a.what)) + " " + to_text(a.mb) + (is_vocab(a.what) ? "@r" : "@s") + to_text(a.stage) + (a.kind == op::send ? " ->r" : " <-r") + to_text(a.peer) + ")";
    case op::offload: return "OFF" + to_text(a.mb) + "@s" + to_text(a.stage);
    case op::reload: return "REL" + to_text(a.mb) + "@s" + to_text(a.stage);
    case op::S:
    case op::T:
    case op::IF:
    case op::IB: return text(to_string(a.kind)) + to_text(a.mb) + "@v" + to_text(a.stage);
    default: return one(a.kind, a.mb, a.stage);
  }
}

}  // namespace loom
