// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The vocabulary of a per-rank program: compute actions (F, B, W, BW, overlapped FB) and,
//! after lowering, point-to-point sends and receives.

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/schedule/error.hpp"

namespace loom {

//! Kind of an action. `F` forward; `B` input-gradient backward; `W` weight-gradient backward;
//! `BW` fused full backward (B then W as one action); `FB` a forward overlapped with a
//! backward (DualPipe); `send`/`recv` point-to-point transfers inserted by `lower`.
enum class op : std::uint8_t { F, B, W, BW, FB, send, recv };

//! What a send/recv carries: the activation produced by `F(stage, mb)` or the input gradient
//! produced by the backward of `(stage, mb)`.
enum class payload : std::uint8_t { activation, gradient };

//! One step of a rank's program. `mb` and `stage` name the microbatch and the virtual stage
//! along that microbatch's path. For `FB`, (`mb`, `stage`) is the forward half and
//! (`bkind`, `bmb`, `bstage`) the backward half. For `send`/`recv`, `peer` is the other rank and
//! (`what`, `mb`, `stage`) the transferred item, named by the stage that produced it.
struct action {
  op kind = op::F;
  op bkind = op::B;
  payload what = payload::activation;
  std::int32_t mb = 0;
  std::int32_t stage = 0;
  std::int32_t bmb = -1;
  std::int32_t bstage = -1;
  std::int32_t peer = -1;

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

//! True for the actions that run a stage function (everything but send/recv).
constexpr bool is_compute(op k) { return k != op::send && k != op::recv; }
//! True for the actions that carry an input-gradient backward (`B`, `BW`).
constexpr bool is_input_backward(op k) { return k == op::B || k == op::BW; }

//! The op's name as used in JSON and CSV: `F`, `B`, `W`, `BW`, `FB`, `SEND`, `RECV`.
constexpr std::string_view to_string(op k) {
  switch (k) {
    case op::F: return "F";
    case op::B: return "B";
    case op::W: return "W";
    case op::BW: return "BW";
    case op::FB: return "FB";
    case op::send: return "SEND";
    case op::recv: return "RECV";
  }
  return "?";
}

//! Compact text of an action: `F3@s1`, `FB(F3@s1+B0@s6)`, `SEND(act 3@s1 ->r2)`.
constexpr text to_string(const action& a) {
  using detail::to_text;
  auto one = [](op k, int mb, int s) { return text(to_string(k)) + to_text(mb) + "@s" + to_text(s); };
  switch (a.kind) {
    case op::FB: return "FB(" + one(op::F, a.mb, a.stage) + "+" + one(a.bkind, a.bmb, a.bstage) + ")";
    case op::send:
    case op::recv:
      return text(to_string(a.kind)) + "(" + (a.what == payload::activation ? "act " : "grad ") +
             to_text(a.mb) + "@s" + to_text(a.stage) + (a.kind == op::send ? " ->r" : " <-r") + to_text(a.peer) + ")";
    default: return one(a.kind, a.mb, a.stage);
  }
}

}  // namespace loom
