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

  // Pass 1: the send order on every channel (items as codes cell * 2 + payload), each item's
  // index in its channel, and how many transfers each rank takes part in.
  std::vector<std::vector<std::size_t>> chan(uP * uP);
  std::vector<int> act_index(cells, -1), grad_index(cells, -1);
  std::vector<std::size_t> transfers(uP, 0);
  // The transfers action half (kind, mb, st) on `rank` causes: calls f(to, payload) for each.
  auto sends_of = [&](int rank, op kind, int mb, int st, auto&& f) {
    if (kind == op::F && st + 1 < S) {
      int to = s.rank_of(mb, st + 1);
      if (to != rank) f(to, payload::activation);
    }
    if (is_input_backward(kind) && st > 0) {
      int to = s.rank_of(mb, st - 1);
      if (to != rank) f(to, payload::gradient);
    }
  };
  for (int r = 0; r < P; ++r)
    for (const action& a : s.programs[static_cast<std::size_t>(r)]) {
      if (!is_compute(a.kind)) continue;
      auto note = [&](int mb, int st) {
        return [&, mb, st](int to, payload w) {
          auto& c = chan[static_cast<std::size_t>(r) * uP + static_cast<std::size_t>(to)];
          (w == payload::activation ? act_index : grad_index)[idx(mb, st)] = static_cast<int>(c.size());
          c.push_back(idx(mb, st) * 2 + (w == payload::gradient ? 1 : 0));
          ++transfers[static_cast<std::size_t>(r)];
          ++transfers[static_cast<std::size_t>(to)];
        };
      };
      sends_of(r, a.kind == op::FB ? op::F : a.kind, a.mb, a.stage, note(a.mb, a.stage));
      if (a.kind == op::FB) sends_of(r, a.bkind, a.bmb, a.bstage, note(a.bmb, a.bstage));
    }

  // Pass 2: per rank, receives (in channel order, hoisted as needed) before consumers and
  // sends after producers.
  const auto M = static_cast<std::size_t>(s.microbatches);
  std::vector<std::size_t> next(uP * uP, 0);  // next unreceived index per channel
  for (int r = 0; r < P; ++r) {
    auto const& in = s.programs[static_cast<std::size_t>(r)];
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(in.size() + transfers[static_cast<std::size_t>(r)]);
    auto receive_through = [&](int from, int index) {
      auto c = static_cast<std::size_t>(from) * uP + static_cast<std::size_t>(r);
      while (static_cast<int>(next[c]) <= index) {
        std::size_t code = chan[c][next[c]++];
        std::size_t cl = code / 2;
        prog.push_back(recv_from(from, code % 2 ? payload::gradient : payload::activation, static_cast<int>(cl % M),
                                 static_cast<int>(cl / M)));
      }
    };
    auto recvs_for = [&](op kind, int mb, int st) {
      if (kind == op::F && st > 0) {
        int from = s.rank_of(mb, st - 1);
        if (from != r) receive_through(from, act_index[idx(mb, st - 1)]);
      }
      if (is_input_backward(kind) && st + 1 < S) {
        int from = s.rank_of(mb, st + 1);
        if (from != r) receive_through(from, grad_index[idx(mb, st + 1)]);
      }
    };
    auto send = [&](int mb, int st) {
      return [&, mb, st](int to, payload w) { prog.push_back(send_to(to, w, mb, st)); };
    };
    for (const action& a : in) {
      if (is_host_copy(a.kind)) prog.push_back(a);  // a rank-local copy: kept where it stands
      if (!is_compute(a.kind)) continue;
      const op first = a.kind == op::FB ? op::F : a.kind;
      recvs_for(first, a.mb, a.stage);
      if (a.kind == op::FB) recvs_for(a.bkind, a.bmb, a.bstage);
      prog.push_back(a);
      sends_of(r, first, a.mb, a.stage, send(a.mb, a.stage));
      if (a.kind == op::FB) sends_of(r, a.bkind, a.bmb, a.bstage, send(a.bmb, a.bstage));
    }
  }
  return out;
}

}  // namespace loom
