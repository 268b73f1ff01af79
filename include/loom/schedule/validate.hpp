// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The validator. A schedule is valid when
//!  1. its placement is well formed and every action runs on the rank its stage is placed on
//!     (stage -> rank is a function);
//!  2. every (microbatch, stage) has exactly one `F` and exactly one backward: `B` + `W`, or
//!     `BW` (an `FB` counts as its two halves);
//!  3. every dependency is respected: replaying the compute programs in order, with blocking
//!     waits on dependencies, finishes (no deadlock);
//!  4. if the programs are lowered (contain send/recv): replaying them as they would run —
//!     asynchronous sends, blocking receives, tagless per-peer FIFO matching — finishes; every
//!     receive gets the item it names; every input is produced (locally) or received (remotely)
//!     before it is consumed; every item is sent after it is produced and received exactly once.
//!     Rule 4 implies rule 3, so a lowered schedule is checked by the lowered replay alone (the
//!     dependency replay runs only to explain a failure).
//!  5. weight versions: a synchronous schedule carries none (every `version` 0, no `update`); a
//!     versioned one (`schedule::versioned`: the asynchronous families) has one weight-buffer
//!     count >= 1 per stage, one direction, no `FB`, `update` only on `W`/`BW`, T m microbatches
//!     for T steps, and, replaying each rank's program in order: every action reads a version of
//!     its stage that is written (v <= the stage's updates so far) and not yet dropped (writing
//!     version v + K drops version v, K the stage's buffers); with `stash`, a microbatch's
//!     backward actions read the version its forward read; the last `W`/`BW` of every stage
//!     updates (no gradient is left unapplied).
//!  6. host copies: an `offload` of (mb, stage) runs on the stage's rank after its `F` and before
//!     its input backward, at most once; a `reload` follows the offload, before the input
//!     backward, at most once; the input backward of an offloaded activation follows its reload.
//!  7. vocabulary passes (`schedule::vocab` 1 or 2, one direction): rank r runs `S`, `T`, `IF`,
//!     `IB` of every microbatch on shard r, once each; a schedule with `vocab` 0 has none. Their
//!     barriers are dependencies of rule 3 (simulate.hpp), checked for lowered programs too.
//! Errors name the rank, the position and the action, and render the offending grid.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/format.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! Outcome of `validate`: `ok`, or the first broken rule as a message.
struct validation {
  bool ok = true;
  text message;
  constexpr explicit operator bool() const { return ok; }
};

namespace detail {

constexpr validation fail_at(const schedule& s, int rank, std::size_t pos, text why) {
  text m = "rank " + to_text(rank) + ", position " + to_text(static_cast<long long>(pos));
  if (rank >= 0 && static_cast<std::size_t>(rank) < s.programs.size() && pos < s.programs[static_cast<std::size_t>(rank)].size())
    m += ", action " + to_string(s.programs[static_cast<std::size_t>(rank)][pos]);
  m += ": " + why + "\n" + format_programs(s, rank, pos);
  return {false, m};
}

//! Rule 4 (and, on the way, rules 1-2): replays lowered programs with asynchronous sends and
//! blocking FIFO receives. Each item has one producer and one consumer, both fixed by the
//! placement, so the replay keeps one flag byte per (microbatch, stage) and one FIFO index per
//! item. Returns an empty message when rules 1-2 are broken (`validate` explains those).
constexpr validation replay_lowered(const schedule& s) {
  const int P = s.ranks, S = s.stages, M = s.microbatches;
  const auto uP = static_cast<std::size_t>(P);
  const auto cells = static_cast<std::size_t>(M) * static_cast<std::size_t>(S);
  auto idx = [M](int mb, int st) { return cell(mb, st, M); };
  // Per cell: which of F, B, W, BW ran, and whether its activation / gradient was received.
  enum : unsigned char { sF = 1, sB = 2, sW = 4, sBW = 8, got_act = 16, got_grad = 32 };
  std::vector<unsigned char> state(cells, 0);
  // FIFO position of each sent item on its channel (`none`: unsent): code = cell * 2 + payload for
  // activations and gradients; a vocabulary message (kind k, microbatch, sender, receiver) after
  // them (`lower`), with one byte saying it arrived.
  constexpr std::uint32_t none = ~std::uint32_t{0};
  const bool vp = s.vocab != 0;
  const std::size_t vbase = cells * 2, vcodes = vp ? 5 * static_cast<std::size_t>(M) * uP * uP : 0;
  std::vector<std::uint32_t> item_index(vbase + vcodes, none);
  std::vector<char> vgot(vcodes, 0);
  // Per (microbatch, rank): which vocabulary passes ran (bits S, T, IF, IB).
  enum : unsigned char { vS = 1, vT = 2, vIF = 4, vIB = 8 };
  std::vector<unsigned char> vstate(vp ? static_cast<std::size_t>(M) * uP : 0, 0);
  auto vcode = [&](payload w, int mb, int from, int to) {
    const auto k = static_cast<std::size_t>(w) - static_cast<std::size_t>(payload::vocab_output);
    return ((k * static_cast<std::size_t>(M) + static_cast<std::size_t>(mb)) * uP + static_cast<std::size_t>(from)) * uP +
           static_cast<std::size_t>(to);
  };
  auto last_rank = [&](int mb) { return s.rank_of(mb, S - 1); };
  auto first_rank = [&](int mb) { return s.rank_of(mb, 0); };
  // True when rank `to` has received vocabulary message `w` of `mb` from every rank in `from`
  // (-1: every other rank).
  auto vhas = [&](payload w, int mb, int from, int to) {
    for (int r = 0; r < P; ++r)
      if (r != to && (from < 0 || r == from) && !vgot[vcode(w, mb, r, to)]) return false;
    return true;
  };
  std::vector<std::uint32_t> sent(uP * uP, 0), head(uP * uP, 0);
  std::vector<std::size_t> pos(uP, 0);
  std::vector<int> waiter(uP * uP, -1);
  std::vector<char> queued(uP, 1);
  std::vector<int> work;
  for (int r = P - 1; r >= 0; --r) work.push_back(r);
  bool structure_broken = false;

  // Producer and consumer ranks of an item (the consumer is -1 past the path's ends).
  auto producer = [&](int mb, int st) { return s.rank_of(mb, st); };
  auto consumer = [&](payload w, int mb, int st) {
    int to = w == payload::activation ? st + 1 : st - 1;
    return to < 0 || to >= S ? -1 : s.rank_of(mb, to);
  };
  auto describe = [](payload w, std::size_t mb, std::size_t st) {
    return text(w == payload::activation ? "the activation" : "the gradient") + " of mb " +
           to_text(static_cast<long long>(mb)) + " stage " + to_text(static_cast<long long>(st));
  };
  // The item sent `index`-th on channel from -> to (error path only).
  auto item_at = [&](int from, int to, std::uint32_t index) {
    for (std::size_t code = 0; code < item_index.size(); ++code) {
      if (item_index[code] != index) continue;
      if (code >= vbase) {
        std::size_t c = code - vbase;
        const int r_to = static_cast<int>(c % uP), r_from = static_cast<int>(c / uP % uP);
        c /= uP * uP;
        if (r_from != from || r_to != to) continue;
        const auto w = static_cast<payload>(static_cast<std::size_t>(payload::vocab_output) + c / static_cast<std::size_t>(M));
        return text(short_name(w)) + " of mb " + to_text(static_cast<long long>(c % static_cast<std::size_t>(M))) + " from rank " + to_text(from);
      }
      const auto cl = code / 2;
      const int mb = static_cast<int>(cl % static_cast<std::size_t>(M)), st = static_cast<int>(cl / static_cast<std::size_t>(M));
      const payload w = code % 2 ? payload::gradient : payload::activation;
      if (producer(mb, st) == from && consumer(w, mb, st) == to) return describe(w, static_cast<std::size_t>(mb), static_cast<std::size_t>(st));
    }
    return text("an unknown item");
  };
  // Runs one compute half: false if rules 1-2 are broken (flagged) or an input is missing.
  auto run_half = [&](int rank, op kind, int mb, int st) -> bool {
    if (static_cast<unsigned>(mb) >= static_cast<unsigned>(M) || static_cast<unsigned>(st) >= static_cast<unsigned>(S) ||
        s.rank_of(mb, st) != rank) {
      structure_broken = true;
      return false;
    }
    const std::size_t i = idx(mb, st);
    const unsigned char bit = kind == op::F ? sF : kind == op::B ? sB : kind == op::W ? sW : sBW;
    if (state[i] & bit) {
      structure_broken = true;
      return false;
    }
    if (vp && kind == op::F && st == 0 && !vhas(payload::vocab_embed, mb, -1, rank)) return false;
    if (vp && is_input_backward(kind) && st == S - 1 &&
        !(vhas(payload::vocab_grad, mb, -1, rank) && (s.vocab == 1 || vhas(payload::vocab_stats, mb, -1, rank))))
      return false;
    if (kind == op::F) {
      // The previous stage's activation: produced here, or received from its rank.
      if (st > 0) {
        const std::size_t in = i - static_cast<std::size_t>(M);
        if (!(producer(mb, st - 1) == rank ? (state[in] & sF) : (state[in] & got_act))) return false;
      }
    } else if (kind == op::W) {
      if (!(state[i] & sB)) return false;
    } else {
      if (!(state[i] & sF)) return false;
      if (st + 1 < S) {
        const std::size_t in = i + static_cast<std::size_t>(M);
        if (!(producer(mb, st + 1) == rank ? (state[in] & (sB | sBW)) : (state[in] & got_grad))) return false;
      }
    }
    state[i] = static_cast<unsigned char>(state[i] | bit);
    return true;
  };
  // Why `run_half` refused an input (error path only).
  auto explain_half = [&](int rank, std::size_t at, op kind, int mb, int st) -> validation {
    auto missing = [&](payload w, int st_in) {
      int from = producer(mb, st_in);
      text item = describe(w, static_cast<std::size_t>(mb), static_cast<std::size_t>(st_in));
      if (from == rank) return fail_at(s, rank, at, "needs " + item + " before this rank has produced it");
      return fail_at(s, rank, at, "needs " + item + " from rank " + to_text(from) + " before receiving it");
    };
    if (vp && kind == op::F && st == 0 && !vhas(payload::vocab_embed, mb, -1, rank))
      return fail_at(s, rank, at, "needs every other rank's embedding part (vemb) of mb " + to_text(mb) + " before receiving it");
    if (vp && is_input_backward(kind) && st == S - 1 && (state[idx(mb, st)] & sF) &&
        !(vhas(payload::vocab_grad, mb, -1, rank) && (s.vocab == 1 || vhas(payload::vocab_stats, mb, -1, rank))))
      return fail_at(s, rank, at, "needs every other rank's output-layer gradient part (vgrad" + text(s.vocab == 2 ? " and vstat" : "") + ") of mb " +
                                      to_text(mb) + " before receiving it");
    if (kind == op::F) return missing(payload::activation, st - 1);
    if (kind == op::W) return fail_at(s, rank, at, "runs before the B of the same microbatch and stage");
    if (!(state[idx(mb, st)] & sF)) return fail_at(s, rank, at, "runs before the F of the same microbatch and stage");
    return missing(payload::gradient, st + 1);
  };
  const auto uM = static_cast<unsigned>(M), uS = static_cast<unsigned>(S), uPu = static_cast<unsigned>(P);
  // Item `code` sent on channel rank `ur` -> `peer`: its FIFO position, and the peer woken if it
  // waits on that channel.
  auto post_send = [&](std::size_t ur, int peer, std::size_t code) {
    const auto c = ur * uP + static_cast<std::size_t>(peer);
    item_index[code] = sent[c]++;
    if (int w = waiter[c]; w >= 0 && !queued[static_cast<std::size_t>(w)]) {
      queued[static_cast<std::size_t>(w)] = 1;
      work.push_back(w);
      detail::prefetch(s.programs[static_cast<std::size_t>(w)].data() + pos[static_cast<std::size_t>(w)]);
    }
  };

  while (!work.empty()) {
    const int rank = work.back();
    work.pop_back();
    const auto ur = static_cast<std::size_t>(rank);
    queued[ur] = 0;
    auto const& prog = s.programs[ur];
    while (pos[ur] < prog.size()) {
      const std::size_t at = pos[ur];
      const action& a = prog[at];
      if (is_host_copy(a.kind)) {  // rule 6
        ++pos[ur];
        continue;
      }
      if (is_vocab(a.kind)) {  // rule 7 checks the passes; here their inputs and their messages
        if (!vp || static_cast<unsigned>(a.mb) >= uM || a.stage != rank) {
          ++pos[ur];
          continue;
        }
        const int mb = a.mb;
        if (a.kind == op::S && rank != last_rank(mb) && !vhas(payload::vocab_output, mb, last_rank(mb), rank))
          return fail_at(s, rank, at, "needs the last stage's output (vx) of mb " + to_text(mb) + " before receiving it");
        if (a.kind == op::T && !vhas(payload::vocab_stats, mb, -1, rank))
          return fail_at(s, rank, at, "needs every other rank's statistics (vstat) of mb " + to_text(mb) + " before receiving them");
        if (a.kind == op::IB && rank != first_rank(mb) && !vhas(payload::vocab_embed_grad, mb, first_rank(mb), rank))
          return fail_at(s, rank, at, "needs the first stage's input gradient (vdemb) of mb " + to_text(mb) + " before receiving it");
        auto& v = vstate[static_cast<std::size_t>(mb) * uP + ur];
        v = static_cast<unsigned char>(v | (a.kind == op::S ? vS : a.kind == op::T ? vT : a.kind == op::IF ? vIF : vIB));
        ++pos[ur];
        continue;
      }
      if ((a.kind == op::send || a.kind == op::recv) && is_vocab(a.what)) {
        if (static_cast<unsigned>(a.peer) >= uPu || a.peer == rank)
          return fail_at(s, rank, at, "names peer " + to_text(a.peer) + ", which is not another rank");
        if (!vp) return fail_at(s, rank, at, "carries a vocabulary message, but the schedule is not vocabulary-parallel (vocab = 0)");
        if (static_cast<unsigned>(a.mb) >= uM || static_cast<unsigned>(a.stage) >= uPu)
          return fail_at(s, rank, at, "names a microbatch or sending rank out of range");
        const int mb = a.mb, from = a.stage, to = a.kind == op::send ? a.peer : rank;
        const int L = last_rank(mb), F0 = first_rank(mb);
        bool route = from != to;
        switch (a.what) {
          case payload::vocab_output: route = route && from == L; break;
          case payload::vocab_grad: route = route && to == L; break;
          case payload::vocab_embed: route = route && to == F0; break;
          case payload::vocab_embed_grad: route = route && from == F0; break;
          default: break;
        }
        if (!route) return fail_at(s, rank, at, "moves a vocabulary message from rank " + to_text(from) + " to rank " + to_text(to) + ", which it never travels");
        const std::size_t vc = vcode(a.what, mb, from, to), code = vbase + vc;
        if (a.kind == op::send) {
          if (from != rank) return fail_at(s, rank, at, "sends a vocabulary message of rank " + to_text(from));
          const unsigned char v = vstate[static_cast<std::size_t>(mb) * uP + ur];
          const bool made = a.what == payload::vocab_output       ? (state[idx(mb, S - 1)] & sF) != 0
                            : a.what == payload::vocab_stats      ? (v & vS) != 0
                            : a.what == payload::vocab_grad       ? (v & (s.vocab == 1 ? vT : vS)) != 0
                            : a.what == payload::vocab_embed      ? (v & vIF) != 0
                                                                  : (state[idx(mb, 0)] & (sB | sBW)) != 0;
          if (!made) return fail_at(s, rank, at, "sends an item before this rank has produced it");
          if (item_index[code] != none) return fail_at(s, rank, at, "sends an item that was already sent");
          post_send(ur, a.peer, code);
        } else {
          if (from != a.peer) return fail_at(s, rank, at, "receives from rank " + to_text(a.peer) + " a message rank " + to_text(from) + " sends");
          const auto c = static_cast<std::size_t>(a.peer) * uP + ur;
          if (head[c] == sent[c]) {
            waiter[c] = rank;
            break;
          }
          waiter[c] = -1;
          if (item_index[code] != head[c])
            return fail_at(s, rank, at, "the FIFO from rank " + to_text(a.peer) + " delivers " + item_at(a.peer, rank, head[c]) +
                                            " here (tagless matching pairs them in order)");
          if (vgot[vc]) return fail_at(s, rank, at, "receives an item a second time");
          vgot[vc] = 1;
          ++head[c];
        }
        ++pos[ur];
        continue;
      }
      if (a.kind == op::send || a.kind == op::recv) {
        if (static_cast<unsigned>(a.peer) >= uPu || a.peer == rank)
          return fail_at(s, rank, at, "names peer " + to_text(a.peer) + ", which is not another rank");
        if (static_cast<unsigned>(a.mb) >= uM || static_cast<unsigned>(a.stage) >= uS)
          return fail_at(s, rank, at, "names a microbatch or stage out of range");
        const std::size_t i = idx(a.mb, a.stage);
        const std::size_t code = i * 2 + (a.what == payload::gradient ? 1 : 0);
        const int from = producer(a.mb, a.stage), to = consumer(a.what, a.mb, a.stage);
        if (a.kind == op::send) {
          if (from != rank) return fail_at(s, rank, at, "sends an item produced on rank " + to_text(from));
          if (!(state[i] & (a.what == payload::activation ? sF : (sB | sBW))))
            return fail_at(s, rank, at, "sends an item before this rank has produced it");
          if (to != a.peer)
            return fail_at(s, rank, at, "sends to rank " + to_text(a.peer) + ", but the item is consumed on " + (to < 0 ? text("no rank") : "rank " + to_text(to)));
          if (item_index[code] != none) return fail_at(s, rank, at, "sends an item that was already sent");
          post_send(ur, a.peer, code);
        } else {
          if (from != a.peer || to != rank)
            return fail_at(s, rank, at, "receives an item that goes from rank " + to_text(from) + " to " + (to < 0 ? text("no rank") : "rank " + to_text(to)));
          const auto c = static_cast<std::size_t>(a.peer) * uP + ur;
          if (head[c] == sent[c]) {
            waiter[c] = rank;  // blocks until the peer sends on this channel
            break;
          }
          waiter[c] = -1;
          if (item_index[code] != head[c])
            return fail_at(s, rank, at, "the FIFO from rank " + to_text(a.peer) + " delivers " + item_at(a.peer, rank, head[c]) +
                                            " here (tagless matching pairs them in order)");
          const unsigned char got = a.what == payload::activation ? got_act : got_grad;
          if (state[i] & got) return fail_at(s, rank, at, "receives an item a second time");
          state[i] = static_cast<unsigned char>(state[i] | got);
          ++head[c];
        }
      } else {
        const op first = a.kind == op::FB ? op::F : a.kind;
        if (a.kind == op::FB && !is_input_backward(a.bkind)) return validation{false, {}};
        if (!run_half(rank, first, a.mb, a.stage))
          return structure_broken ? validation{false, {}} : explain_half(rank, at, first, a.mb, a.stage);
        if (a.kind == op::FB && !run_half(rank, a.bkind, a.bmb, a.bstage))
          return structure_broken ? validation{false, {}} : explain_half(rank, at, a.bkind, a.bmb, a.bstage);
      }
      ++pos[ur];
    }
  }
  for (std::size_t r = 0; r < uP; ++r)
    if (pos[r] < s.programs[r].size())
      return fail_at(s, static_cast<int>(r), pos[r], "deadlock: this receive never matches a send (asynchronous sends, blocking receives, tagless per-peer FIFO)");
  for (unsigned char c : state)
    if ((c & 15) != (sF | sB | sW) && (c & 15) != (sF | sBW)) return {false, {}};  // incomplete: explained by the structural pass
  for (std::size_t c = 0; c < sent.size(); ++c)
    if (head[c] != sent[c])
      return {false, "rank " + to_text(static_cast<long long>(c / uP)) + " sends " + item_at(static_cast<int>(c / uP), static_cast<int>(c % uP), head[c]) +
                         " that rank " + to_text(static_cast<long long>(c % uP)) + " never receives\n" + format_programs(s)};
  return {};
}

//! Where (mb, st)'s action of `kind` first appears (error path only).
struct place {
  int rank = -1;
  std::size_t pos = 0;
};
constexpr place find_first(const schedule& s, op kind, int mb, int st) {
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    auto const& prog = s.programs[r];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      bool fb = a.kind == op::FB;
      if ((a.kind == kind && a.mb == mb && a.stage == st) || (fb && kind == op::F && a.mb == mb && a.stage == st) ||
          (fb && a.bkind == kind && a.bmb == mb && a.bstage == st))
        return {static_cast<int>(r), i};
    }
  }
  return {};
}

}  // namespace detail

namespace detail {
//! Rules 1 and 2: placement and counts (one bit per kind and cell), ignoring send/recv.
constexpr validation check_structure(const schedule& s) {
  using detail::to_text;
  const int P = s.ranks, S = s.stages, M = s.microbatches;
  enum : unsigned char { kF = 1, kB = 2, kW = 4, kBW = 8 };
  std::vector<unsigned char> seen(static_cast<std::size_t>(M) * static_cast<std::size_t>(S), 0);
  auto note = [&](int rank, op kind, int mb, int st) -> bool {
    if (mb < 0 || mb >= M || st < 0 || st >= S || s.rank_of(mb, st) != rank) return false;
    unsigned char bit = kind == op::F ? kF : kind == op::B ? kB : kind == op::W ? kW : kBW;
    auto& cell = seen[detail::cell(mb, st, M)];
    if (cell & bit) return false;
    cell = static_cast<unsigned char>(cell | bit);
    return true;
  };
  // Explains why `note` refused (error path only).
  auto refusal = [&](int rank, std::size_t pos, op kind, int mb, int st) -> validation {
    if (mb < 0 || mb >= M || st < 0 || st >= S)
      return fail_at(s, rank, pos, "microbatch " + to_text(mb) + " / stage " + to_text(st) + " is out of range (microbatches=" + to_text(M) + ", stages=" + to_text(S) + ")");
    if (s.rank_of(mb, st) != rank)
      return fail_at(s, rank, pos, "stage " + to_text(st) + " of microbatch " + to_text(mb) + " is placed on rank " + to_text(s.rank_of(mb, st)) + ", not here");
    detail::place first = detail::find_first(s, kind, mb, st);
    return fail_at(s, rank, pos, "duplicates " + text(to_string(kind)) + " of microbatch " + to_text(mb) + " stage " + to_text(st) + ", already at rank " + to_text(first.rank) + " position " + to_text(static_cast<long long>(first.pos)));
  };
  for (int r = 0; r < P; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!is_compute(a.kind) || is_vocab(a.kind)) continue;  // vocabulary passes: rule 7
      if (a.kind == op::FB) {
        if (!is_input_backward(a.bkind)) return fail_at(s, r, i, "the backward half of an FB must be B or BW");
        if (!note(r, op::F, a.mb, a.stage)) return refusal(r, i, op::F, a.mb, a.stage);
        if (!note(r, a.bkind, a.bmb, a.bstage)) return refusal(r, i, a.bkind, a.bmb, a.bstage);
      } else if (!note(r, a.kind, a.mb, a.stage)) {
        return refusal(r, i, a.kind, a.mb, a.stage);
      }
    }
  }
  for (int st = 0; st < S; ++st)
    for (int mb = 0; mb < M; ++mb) {
      const unsigned char c = seen[detail::cell(mb, st, M)];
      if (c == (kF | kB | kW) || c == (kF | kBW)) continue;
      text what = "microbatch " + to_text(mb) + " stage " + to_text(st) + " (rank " + to_text(s.rank_of(mb, st)) + ")";
      auto at = [&](op kind) { return detail::find_first(s, kind, mb, st); };
      if (!(c & kF)) return {false, what + " has no F\n" + format_programs(s)};
      if ((c & kBW) && (c & (kB | kW))) {
        auto p = at(op::BW);
        return fail_at(s, p.rank, p.pos, what + " has both a fused BW and a split B/W backward");
      }
      if (!(c & (kB | kW | kBW))) return {false, what + " has no backward (B+W or BW)\n" + format_programs(s)};
      if (!(c & kB)) {
        auto p = at(op::W);
        return fail_at(s, p.rank, p.pos, what + " has a W but no B");
      }
      auto p = at(op::B);
      return fail_at(s, p.rank, p.pos, what + " has a B but no W");
    }

  return {};
}
}  // namespace detail

namespace detail {
//! Rule 7: vocabulary passes (see the file comment).
constexpr validation check_vocab(const schedule& s) {
  using detail::to_text;
  const int P = s.ranks, M = s.microbatches;
  if (s.vocab == 0) {
    for (int r = 0; r < P; ++r)
      for (std::size_t i = 0; i < s.programs[static_cast<std::size_t>(r)].size(); ++i)
        if (is_vocab(s.programs[static_cast<std::size_t>(r)][i].kind))
          return fail_at(s, r, i, "is a vocabulary pass, but the schedule is not vocabulary-parallel (vocab = 0)");
    return {};
  }
  if (s.vocab != 1 && s.vocab != 2) return {false, "vocab must be 0, 1 or 2 (got " + to_text(s.vocab) + ")"};
  if (s.directions != 1) return {false, "a vocabulary-parallel schedule has one direction (got " + to_text(s.directions) + ")"};
  constexpr const char* names[4] = {"S", "T", "IF", "IB"};
  auto bit_of = [](op k) { return k == op::S ? 1 : k == op::T ? 2 : k == op::IF ? 4 : 8; };
  std::vector<unsigned char> seen(static_cast<std::size_t>(M) * static_cast<std::size_t>(P), 0);
  for (int r = 0; r < P; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!is_vocab(a.kind)) continue;
      if (static_cast<unsigned>(a.mb) >= static_cast<unsigned>(M))
        return fail_at(s, r, i, "microbatch " + to_text(a.mb) + " is out of range (microbatches=" + to_text(M) + ")");
      if (a.stage != r)
        return fail_at(s, r, i, "runs a pass of vocabulary shard " + to_text(a.stage) + ", but rank " + to_text(r) + " holds shard " + to_text(r));
      unsigned char& c = seen[cell(a.mb, r, M)];
      const int bit = bit_of(a.kind);
      if (c & bit) return fail_at(s, r, i, "runs " + to_string(a) + " a second time");
      c = static_cast<unsigned char>(c | bit);
    }
  }
  for (int r = 0; r < P; ++r)
    for (int mb = 0; mb < M; ++mb)
      for (int k = 0; k < 4; ++k)
        if (!(seen[cell(mb, r, M)] & (1 << k)))
          return {false, "rank " + to_text(r) + " runs no " + text(names[k]) + " of microbatch " + to_text(mb) +
                             " (a vocabulary-parallel schedule runs S, T, IF and IB of every microbatch on every rank)\n" + format_programs(s)};
  return {};
}

//! Rule 6: host copies (see the file comment). Assumes rules 1-2 hold.
constexpr validation check_copies(const schedule& s) {
  using detail::to_text;
  bool any = false;
  for (auto const& prog : s.programs)
    for (const action& a : prog) any = any || is_host_copy(a.kind);
  if (!any) return {};
  const int M = s.microbatches, S = s.stages;
  // Per cell: where its F, offload, reload and input backward stand (rank, position), -1 if none yet.
  enum event : int { f_seen, off_seen, rel_seen, bwd_seen, events };
  struct seen {
    long long at[events] = {-1, -1, -1, -1};
  };
  std::vector<seen> cells(static_cast<std::size_t>(M) * static_cast<std::size_t>(S));
  for (int r = 0; r < s.ranks; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    auto named = [&](op kind, int mb, int st, long long pos) {
      text t = kind == op::offload ? to_string(offload_to_host(mb, st))
               : kind == op::reload ? to_string(reload_from_host(mb, st))
               : kind == op::F ? to_string(forward(mb, st)) : "the input backward of mb " + to_text(mb) + " stage " + to_text(st);
      return t + " (position " + to_text(pos) + ")";
    };
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      const auto here = static_cast<long long>(i);
      if (is_host_copy(a.kind)) {
        if (static_cast<unsigned>(a.mb) >= static_cast<unsigned>(M) || static_cast<unsigned>(a.stage) >= static_cast<unsigned>(S))
          return fail_at(s, r, i, "microbatch " + to_text(a.mb) + " / stage " + to_text(a.stage) + " is out of range (microbatches=" +
                                      to_text(M) + ", stages=" + to_text(S) + ")");
        if (s.rank_of(a.mb, a.stage) != r)
          return fail_at(s, r, i, "copies an activation of stage " + to_text(a.stage) + ", which is placed on rank " +
                                      to_text(s.rank_of(a.mb, a.stage)) + ", not here");
        seen& c = cells[cell(a.mb, a.stage, M)];
        if (a.kind == op::offload) {
          if (c.at[off_seen] >= 0) return fail_at(s, r, i, "offloads an activation a second time: " + named(op::offload, a.mb, a.stage, c.at[off_seen]) + " already did");
          if (c.at[f_seen] < 0) return fail_at(s, r, i, "offloads an activation before " + to_string(forward(a.mb, a.stage)) + " produces it");
          if (c.at[bwd_seen] >= 0)
            return fail_at(s, r, i, "offloads an activation after " + named(op::B, a.mb, a.stage, c.at[bwd_seen]) + " has used it");
          c.at[off_seen] = here;
        } else {
          if (c.at[rel_seen] >= 0) return fail_at(s, r, i, "reloads an activation a second time: " + named(op::reload, a.mb, a.stage, c.at[rel_seen]) + " already did");
          if (c.at[off_seen] < 0) return fail_at(s, r, i, "reloads an activation that no earlier offload copied to host");
          c.at[rel_seen] = here;
        }
        continue;
      }
      if (!is_compute(a.kind)) continue;
      auto note = [&](op kind, int mb, int st) -> validation {
        seen& c = cells[cell(mb, st, M)];
        if (kind == op::F) {
          c.at[f_seen] = here;
        } else if (is_input_backward(kind)) {
          c.at[bwd_seen] = here;
          if (c.at[off_seen] >= 0 && c.at[rel_seen] < 0) {
            text why = "needs the activation that " + named(op::offload, mb, st, c.at[off_seen]) + " copied to host, but ";
            for (std::size_t j = i + 1; j < prog.size(); ++j)
              if (prog[j] == reload_from_host(mb, st))
                return fail_at(s, r, i, why + "its reload " + named(op::reload, mb, st, static_cast<long long>(j)) + " comes after it (too late)");
            return fail_at(s, r, i, why + "no reload brings it back");
          }
        }
        return {};
      };
      if (validation v = note(a.kind == op::FB ? op::F : a.kind, a.mb, a.stage); !v.ok) return v;
      if (a.kind == op::FB)
        if (validation v = note(a.bkind, a.bmb, a.bstage); !v.ok) return v;
    }
  }
  return {};
}

//! Rule 5: weight versions (see the file comment). Assumes rules 1-2 hold (stages in range and
//! on their ranks).
constexpr validation check_versions(const schedule& s) {
  using detail::to_text;
  if (!s.versioned()) {
    for (int r = 0; r < s.ranks; ++r) {
      auto const& prog = s.programs[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < prog.size(); ++i)
        if (is_compute(prog[i].kind) && (prog[i].version != 0 || prog[i].update))
          return fail_at(s, r, i, "a synchronous schedule carries no weight versions or updates (version_slots is empty)");
    }
    if (s.steps != 1) return {false, "a synchronous schedule spans one step (got steps=" + to_text(s.steps) + ")"};
    return {};
  }
  const int S = s.stages;
  if (s.directions != 1) return {false, "a versioned schedule has one direction (got " + to_text(s.directions) + ")"};
  if (s.version_slots.size() != static_cast<std::size_t>(S))
    return {false, "version_slots has " + to_text(static_cast<long long>(s.version_slots.size())) + " entries for " + to_text(S) + " stages"};
  for (int st = 0; st < S; ++st)
    if (s.version_slots[static_cast<std::size_t>(st)] < 1)
      return {false, "stage " + to_text(st) + " has " + to_text(s.version_slots[static_cast<std::size_t>(st)]) + " weight buffers (needs >= 1)"};
  if (s.steps < 1 || s.microbatches % s.steps != 0)
    return {false, "a versioned schedule of " + to_text(s.steps) + " steps needs a multiple of them as microbatches (got " +
                       to_text(s.microbatches) + ")"};
  std::vector<int> updates(static_cast<std::size_t>(S), 0), forward_version(static_cast<std::size_t>(s.microbatches) * static_cast<std::size_t>(S), -1);
  std::vector<std::size_t> last_grad(static_cast<std::size_t>(S), ~std::size_t{0});
  std::vector<int> last_grad_rank(static_cast<std::size_t>(S), -1);
  for (int r = 0; r < s.ranks; ++r) {
    auto const& prog = s.programs[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!is_compute(a.kind)) continue;
      if (a.kind == op::FB) return fail_at(s, r, i, "a versioned schedule has no overlapped FB actions");
      if (a.update && a.kind != op::W && a.kind != op::BW)
        return fail_at(s, r, i, "only a weight-gradient action (W or BW) carries an update");
      const auto st = static_cast<std::size_t>(a.stage);
      const int K = s.version_slots[st], have = updates[st];
      if (a.version < 0 || a.version > have)
        return fail_at(s, r, i, "reads version " + to_text(a.version) + " of stage " + to_text(a.stage) + ", which is not written yet (the stage has " +
                                    to_text(have) + " update(s) so far)");
      if (a.version <= have - K)
        return fail_at(s, r, i, "reads version " + to_text(a.version) + " of stage " + to_text(a.stage) + ", dropped when version " +
                                    to_text(a.version + K) + " was written (" + to_text(K) + " weight buffer(s))");
      const std::size_t c = cell(a.mb, a.stage, s.microbatches);
      if (a.kind == op::F) {
        forward_version[c] = a.version;
      } else if (s.stash && forward_version[c] != a.version) {
        return fail_at(s, r, i, "reads version " + to_text(a.version) + " but the forward of the same microbatch read version " +
                                    to_text(forward_version[c]) + " (weight stashing: the backward reads the forward's weights)");
      }
      if (a.kind == op::W || a.kind == op::BW) {
        last_grad[st] = i;
        last_grad_rank[st] = r;
      }
      if (a.update) ++updates[st];
    }
  }
  for (std::size_t st = 0; st < static_cast<std::size_t>(S); ++st) {
    const int r = last_grad_rank[st];
    if (r >= 0 && !s.programs[static_cast<std::size_t>(r)][last_grad[st]].update)
      return fail_at(s, r, last_grad[st], "the last weight-gradient action of stage " + to_text(static_cast<long long>(st)) +
                                              " has no update: its gradients would never be applied");
  }
  return {};
}
}  // namespace detail

//! Checks rules 1-5 above. Never throws; see `require_valid`.
constexpr validation validate(const schedule& s) {
  using detail::fail_at;
  using detail::to_text;
  const int P = s.ranks, S = s.stages, M = s.microbatches, D = s.directions;
  if (P < 1 || S < 1 || M < 1 || D < 1 || D > 2)
    return {false, "schedule needs ranks, stages and microbatches >= 1 and 1 or 2 directions (got ranks=" + to_text(P) + ", stages=" + to_text(S) + ", microbatches=" + to_text(M) + ", directions=" + to_text(D) + ")"};
  if (s.programs.size() != static_cast<std::size_t>(P))
    return {false, "schedule has " + to_text(static_cast<long long>(s.programs.size())) + " programs for " + to_text(P) + " ranks"};
  if (s.stage_to_rank.size() != static_cast<std::size_t>(D * S))
    return {false, "stage_to_rank has " + to_text(static_cast<long long>(s.stage_to_rank.size())) + " entries for " + to_text(D) + " direction(s) x " + to_text(S) + " stages"};
  for (std::size_t i = 0; i < s.stage_to_rank.size(); ++i)
    if (s.stage_to_rank[i] < 0 || s.stage_to_rank[i] >= P)
      return {false, "stage " + to_text(static_cast<long long>(i) % S) + " of direction " + to_text(static_cast<long long>(i) / S) + " is placed on rank " + to_text(s.stage_to_rank[i]) + ", outside 0.." + to_text(P - 1)};
  if (!s.mb_direction.empty()) {
    if (s.mb_direction.size() != static_cast<std::size_t>(M))
      return {false, "mb_direction has " + to_text(static_cast<long long>(s.mb_direction.size())) + " entries for " + to_text(M) + " microbatches"};
    for (std::size_t j = 0; j < s.mb_direction.size(); ++j)
      if (s.mb_direction[j] < 0 || s.mb_direction[j] >= D)
        return {false, "microbatch " + to_text(static_cast<long long>(j)) + " has direction " + to_text(s.mb_direction[j]) + ", outside 0.." + to_text(D - 1)};
  }

  bool lowered = false;
  for (auto const& prog : s.programs) {
    for (const action& a : prog)
      if (is_transfer(a.kind)) {
        lowered = true;
        break;
      }
    if (lowered) break;
  }
  if (!lowered) {
    if (validation v = detail::check_structure(s); !v.ok) return v;
    if (validation v = detail::check_vocab(s); !v.ok) return v;
    if (validation v = detail::check_copies(s); !v.ok) return v;
    simulation sim = simulate(s);  // rule 3
    if (!sim.ok) return {false, sim.error + "\n" + format_programs(s, sim.stuck_rank, sim.stuck_pos)};
    return detail::check_versions(s);
  }
  // Lowered: the replay checks rules 1-4 in one pass; on failure, explain it by the first broken
  // rule in order (structure, then dependencies, then the replay's own finding).
  validation v = detail::replay_lowered(s);
  if (v.ok) {
    if (validation c = detail::check_vocab(s); !c.ok) return c;
    if (validation c = detail::check_copies(s); !c.ok) return c;
    if (s.vocab != 0) {  // the vocabulary barriers are not in the lowered replay: rule 3
      simulation sim = simulate(s);
      if (!sim.ok) return {false, sim.error + "\n" + format_programs(s, sim.stuck_rank, sim.stuck_pos)};
    }
    return detail::check_versions(s);
  }
  if (validation sv = detail::check_structure(s); !sv.ok) return sv;
  if (validation c = detail::check_vocab(s); !c.ok) return c;
  if (validation c = detail::check_copies(s); !c.ok) return c;
  simulation sim = simulate(s);
  if (!sim.ok) return {false, sim.error + "\n" + format_programs(s, sim.stuck_rank, sim.stuck_pos)};
  if (v.message.empty()) v.message = "the lowered programs break the placement or the action counts";
  return v;
}

//! `validate(s)`, throwing `schedule_error` with the message when it fails.
constexpr void require_valid(const schedule& s) {
  if (validation v = validate(s); !v.ok) throw schedule_error(v.message);
}

}  // namespace loom
