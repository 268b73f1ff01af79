// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Lowering: inserts the point-to-point transfers a schedule needs between ranks.
//!
//! After every action that produces an item consumed on another rank (the activation of
//! `F(s,j)` for stage `s+1`, the input gradient of `B/BW(s,j)` for stage `s-1`) the producer
//! gets a `send`. Sends are asynchronous, receives block, and transfers are tagless: on each
//! ordered pair of ranks items are matched in FIFO order. So a receiver must receive the items
//! of one channel in the order they were sent. Each receive is placed immediately before its
//! first consumer; when a consumer needs an item that was sent after others not yet received on
//! the same channel, the earlier ones are received first (hoisted). Hoisting cannot create a
//! deadlock: an item sent earlier on the channel is available no later than the one needed.
//! `validate` proves the result by a FIFO replay.
//!
//! A vocabulary-parallel schedule (`schedule::vocab`; Yeung et al., MLSys 2025, §4) also gets the
//! messages of its vocabulary layers, on the same channels (hoisting keeps them deadlock-free as
//! above), each sent right after the pass that produces it and received before its first
//! consumer; `stage` of such an item is its sending rank, and a rank sends to several peers in
//! rank order. With L the last stage's rank and F the first's, per microbatch:
//! - after `F(S-1)` on L, `vocab_output` to every other rank, received before its `S`;
//! - after `S` on every rank, `vocab_stats` to every other rank, received before its `T` (and,
//!   Algorithm 2, on L before the last stage's backward: the all-reduce of the statistics);
//! - `vocab_grad` to L from every other rank, after `T` (Algorithm 1) or `S` (Algorithm 2),
//!   received before the last stage's backward (the output layer's input gradient);
//! - after `IF` on every rank but F, `vocab_embed` to F, received before `F(0)` (the all-reduce of
//!   the embedding);
//! - after the backward of stage 0 on F, `vocab_embed_grad` to every other rank, before its `IB`.
//! The authors' barriers are all-reduces (`megatron/core/pipeline_parallel/vocab_parallel_schedule.py`,
//! sail-sg/VocabularyParallelism at 6191c3bf, on a communicator of their own); loom's point-to-point
//! form moves the same data, and each receiver combines the parts in rank order, so the sums
//! are the same bits on every rank.

#include <cstddef>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

//! The schedule `s` with send/recv actions inserted (see the file comment). Compute actions and
//! host copies keep their order (send/recv already in `s` are dropped and placed anew); `s` must be valid (`validate`) for the result to be.
constexpr schedule lower(const schedule& s) {
  const int P = s.ranks, S = s.stages;
  const auto uP = static_cast<std::size_t>(P);
  const auto cells = static_cast<std::size_t>(s.microbatches) * static_cast<std::size_t>(S);
  auto idx = [M = s.microbatches](int mb, int st) { return detail::cell(mb, st, M); };

  schedule out;
  out.name = s.name;
  out.ranks = s.ranks;
  out.microbatches = s.microbatches;
  out.chunks = s.chunks;
  out.stages = s.stages;
  out.directions = s.directions;
  out.param_copies = s.param_copies;
  out.placement = s.placement;
  out.stage_to_rank = s.stage_to_rank;
  out.mb_direction = s.mb_direction;
  out.steps = s.steps;
  out.version_slots = s.version_slots;
  out.stash = s.stash;
  out.vocab = s.vocab;
  out.programs.resize(uP);

  // Items as codes: the activation or gradient of a cell, cell * 2 + payload; a vocabulary
  // message (kind k, microbatch, sender, receiver) after them.
  const bool vp = s.vocab != 0;
  const std::size_t vbase = cells * 2;
  const std::size_t codes = vbase + (vp ? 5 * static_cast<std::size_t>(s.microbatches) * uP * uP : 0);
  auto code_of = [&](payload w, int mb, int st, int to) -> std::size_t {
    if (!is_vocab(w)) return idx(mb, st) * 2 + (w == payload::gradient ? 1 : 0);
    const auto k = static_cast<std::size_t>(w) - static_cast<std::size_t>(payload::vocab_output);
    return vbase + ((k * static_cast<std::size_t>(s.microbatches) + static_cast<std::size_t>(mb)) * uP + static_cast<std::size_t>(st)) * uP +
           static_cast<std::size_t>(to);
  };
  auto recv_of = [&](std::size_t code, int from) -> action {
    if (code < vbase)
      return recv_from(from, code % 2 ? payload::gradient : payload::activation, static_cast<int>(code / 2 % static_cast<std::size_t>(s.microbatches)),
                       static_cast<int>(code / 2 / static_cast<std::size_t>(s.microbatches)));
    std::size_t c = (code - vbase) / uP;  // (k * M + mb) * P + sender
    const int sender = static_cast<int>(c % uP);
    c /= uP;
    const int mb = static_cast<int>(c % static_cast<std::size_t>(s.microbatches));
    const auto k = static_cast<int>(c / static_cast<std::size_t>(s.microbatches));
    return recv_from(from, static_cast<payload>(static_cast<int>(payload::vocab_output) + k), mb, sender);
  };
  // The ranks of a microbatch's last and first stages (vocabulary parallelism).
  auto last_rank = [&](int mb) { return s.rank_of(mb, S - 1); };
  auto first_rank = [&](int mb) { return s.rank_of(mb, 0); };

  // Pass 1: the send order on every channel, each item's index in its channel, and how many
  // transfers each rank takes part in.
  std::vector<std::vector<std::size_t>> chan(uP * uP);
  std::vector<int> index(codes, -1);
  std::vector<std::size_t> transfers(uP, 0);
  // The transfers action half (kind, mb, st) on `rank` causes: calls f(to, payload, stage) for
  // each, `stage` naming the item (a vocabulary message: the sending rank), in send order.
  auto sends_of = [&](int rank, op kind, int mb, int st, auto&& f) {
    auto to_others = [&](payload w) {
      for (int to = 0; to < P; ++to)
        if (to != rank) f(to, w, rank);
    };
    if (kind == op::F && st + 1 < S) {
      int to = s.rank_of(mb, st + 1);
      if (to != rank) f(to, payload::activation, st);
    }
    if (is_input_backward(kind) && st > 0) {
      int to = s.rank_of(mb, st - 1);
      if (to != rank) f(to, payload::gradient, st);
    }
    if (!vp) return;
    if (kind == op::F && st == S - 1) to_others(payload::vocab_output);
    if (kind == op::S) to_others(payload::vocab_stats);
    if (((kind == op::S && s.vocab == 2) || (kind == op::T && s.vocab == 1)) && rank != last_rank(mb))
      f(last_rank(mb), payload::vocab_grad, rank);
    if (kind == op::IF && rank != first_rank(mb)) f(first_rank(mb), payload::vocab_embed, rank);
    if (is_input_backward(kind) && st == 0) to_others(payload::vocab_embed_grad);
  };
  for (int r = 0; r < P; ++r)
    for (const action& a : s.programs[static_cast<std::size_t>(r)]) {
      if (!is_compute(a.kind)) continue;
      auto note = [&](int mb) {
        return [&, mb](int to, payload w, int st) {
          auto& c = chan[static_cast<std::size_t>(r) * uP + static_cast<std::size_t>(to)];
          index[code_of(w, mb, st, to)] = static_cast<int>(c.size());
          c.push_back(code_of(w, mb, st, to));
          ++transfers[static_cast<std::size_t>(r)];
          ++transfers[static_cast<std::size_t>(to)];
        };
      };
      sends_of(r, a.kind == op::FB ? op::F : a.kind, a.mb, a.stage, note(a.mb));
      if (a.kind == op::FB) sends_of(r, a.bkind, a.bmb, a.bstage, note(a.bmb));
    }

  // Pass 2: per rank, receives (in channel order, hoisted as needed) before consumers and
  // sends after producers.
  std::vector<std::size_t> next(uP * uP, 0);  // next unreceived index per channel
  for (int r = 0; r < P; ++r) {
    auto const& in = s.programs[static_cast<std::size_t>(r)];
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(in.size() + transfers[static_cast<std::size_t>(r)]);
    // Receives everything `from` sent to this rank up to the item `code` (nothing when it is
    // already here: an item two consumers read is received before the first).
    auto receive_through = [&](int from, std::size_t code) {
      auto c = static_cast<std::size_t>(from) * uP + static_cast<std::size_t>(r);
      while (static_cast<int>(next[c]) <= index[code]) prog.push_back(recv_of(chan[c][next[c]++], from));
    };
    auto from_others = [&](payload w, int mb) {
      for (int from = 0; from < P; ++from)
        if (from != r) receive_through(from, code_of(w, mb, from, r));
    };
    auto recvs_for = [&](op kind, int mb, int st) {
      if (kind == op::F && st > 0) {
        int from = s.rank_of(mb, st - 1);
        if (from != r) receive_through(from, code_of(payload::activation, mb, st - 1, r));
      }
      if (is_input_backward(kind) && st + 1 < S) {
        int from = s.rank_of(mb, st + 1);
        if (from != r) receive_through(from, code_of(payload::gradient, mb, st + 1, r));
      }
      if (!vp) return;
      if (kind == op::S && r != last_rank(mb)) receive_through(last_rank(mb), code_of(payload::vocab_output, mb, last_rank(mb), r));
      if (kind == op::T || (is_input_backward(kind) && st == S - 1 && s.vocab == 2)) from_others(payload::vocab_stats, mb);
      if (is_input_backward(kind) && st == S - 1) from_others(payload::vocab_grad, mb);
      if (kind == op::F && st == 0) from_others(payload::vocab_embed, mb);
      if (kind == op::IB && r != first_rank(mb)) receive_through(first_rank(mb), code_of(payload::vocab_embed_grad, mb, first_rank(mb), r));
    };
    auto send = [&](int mb) {
      return [&, mb](int to, payload w, int st) { prog.push_back(send_to(to, w, mb, st)); };
    };
    for (const action& a : in) {
      if (is_host_copy(a.kind)) prog.push_back(a);  // a rank-local copy: kept where it stands
      if (!is_compute(a.kind)) continue;
      const op first = a.kind == op::FB ? op::F : a.kind;
      recvs_for(first, a.mb, a.stage);
      if (a.kind == op::FB) recvs_for(a.bkind, a.bmb, a.bstage);
      prog.push_back(a);
      sends_of(r, first, a.mb, a.stage, send(a.mb));
      if (a.kind == op::FB) sends_of(r, a.bkind, a.bmb, a.bstage, send(a.bmb));
    }
  }
  return out;
}

}  // namespace loom
