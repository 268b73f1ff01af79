// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The simulator: replays a schedule under the normative cost and memory model of
//! ARCHITECTURE.md and reports makespan, bubbles, per-rank peak activation memory and the
//! start/end of every action. Constexpr: the same code answers `static_assert`s.
//!
//! Timing: a rank runs its program strictly in order; an action starts at
//! `max(rank free, end of each dependency + c)`, `c` added only for a dependency on another
//! rank. Dependencies: `F(s,j)` after `F(s-1,j)`; `B(s,j)`/`BW(s,j)` after the backward of
//! `(s+1,j)` (after `F(S-1,j)` on the last stage) and after `F(s,j)`; `W(s,j)` after `B(s,j)`.
//! An overlapped `FB` waits for the dependencies of both halves and completes both at its end.
//! Send/recv actions take no time here (latency is `c`). Under a `cost_model`, a `W`/`BW` that
//! carries `action::update` (a versioned schedule's optimizer step) lasts its stage's `update`
//! longer, and that time counts as busy.
//!
//! Host copies (`offload`, `reload`) take no time of the rank: it issues the copy and goes on.
//! Each rank has a host link that carries one copy per direction at a time, in program order: an
//! offload of `(s,j)` starts at `max(rank free, link free to host)` (after `F(s,j)`, which precedes
//! it), a reload at `max(rank free, end of the offload, link free to device)`, and each lasts `q h`
//! (`cost_model`: `host.time(activation_bytes)` of the stage). The input backward of an offloaded
//! `(s,j)` also waits for the end of its reload. The action's `action_time` is the copy's.
//!
//! Vocabulary parallelism (`schedule::vocab` 1 or 2; Yeung et al., MLSys 2025): `IF(j)` waits for
//! nothing; `F(0,j)` waits for the all-reduce of every rank's `IF(j)`; `S(j)` waits for
//! `F(S-1,j)` (its output is broadcast to every rank); `T(j)` waits for the barrier after every
//! rank's `S(j)`; the backward of `(S-1,j)` waits for that barrier (Vocab-2) or for the barrier
//! after every rank's `T(j)` (Vocab-1); `IB(j)` waits for the input backward of `(0,j)`. A barrier
//! or broadcast between ranks adds `c` (`cost_model`: `intra.alpha`). The passes last `s`, `t`,
//! `e` (`cost_model::vocab_s`, ...), count as busy, and hold no activation of the memory model.
//!
//! Memory (unit: activations of one microbatch through one rank's share): `F` allocates `q`,
//! `B` releases `(1-r)q`, `W` releases `rq`, `BW` releases `q`, with `q = P/S` and
//! `r = mem_w_ratio`; the peak is the maximum live sum in program order. An offload releases the
//! forward's `q` when its copy ends (before the first compute action of the rank that starts at or
//! after that time); a reload allocates it again where it stands in the program.

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/cost_model.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/shape.hpp"

namespace loom {

//! Start and end time of one action.
struct action_time {
  double start = 0;
  double end = 0;
};

//! Result of `simulate`. When `ok` is false the schedule deadlocks or names an impossible
//! action; `error` says where, and the metrics are those of the part that could run.
struct simulation {
  bool ok = false;
  text error;
  int stuck_rank = -1;         //!< on deadlock: the first rank that cannot proceed
  std::size_t stuck_pos = 0;   //!< on deadlock: its position
  double makespan = 0;       //!< global end - global start
  double bubble_ratio = 0;   //!< 1 - sum(busy) / (P * makespan)
  double bubble_rate = 0;    //!< 1 - sum(busy) / (P * max span)  (Zero Bubble paper)
  std::vector<double> busy;             //!< per rank: sum of action durations
  std::vector<double> span;             //!< per rank: end of last - start of first action
  std::vector<double> peak_activation;  //!< per rank: peak live activation units
  //! Per rank: the peak number of weight versions it holds, in units of the rank's share of one
  //! model copy (each stage counts `q = P/S` per version). Synchronous schedules hold one
  //! version per stage (so `param_copies`); a versioned schedule's count follows its programs
  //! (`weight_versions`).
  std::vector<double> weight_copies;
  std::vector<std::vector<action_time>> times;  //!< parallel to `schedule::programs`

  //! Idle time of rank `r` inside the global window: `makespan - busy[r]`.
  constexpr double bubble_time(int r) const { return makespan - busy[static_cast<std::size_t>(r)]; }
  //! Idle time of rank `r` inside its own span: `span[r] - busy[r]`.
  constexpr double span_bubble(int r) const {
    return span[static_cast<std::size_t>(r)] - busy[static_cast<std::size_t>(r)];
  }
  //! Largest per-rank peak activation.
  constexpr double max_peak_activation() const {
    double m = 0;
    for (double v : peak_activation) m = v > m ? v : m;
    return m;
  }
};

//! Duration of action `a` on a stage holding fraction `q` of a rank's share (of its copy, for an
//! `offload`/`reload`; send/recv take none).
constexpr double duration(const action& a, const costs& k, double q) {
  auto bwd = [&](op kind) { return kind == op::BW ? k.b + k.w : k.b; };
  switch (a.kind) {
    case op::F: return q * k.f;
    case op::B: return q * k.b;
    case op::W: return q * k.w;
    case op::BW: return q * (k.b + k.w);
    case op::FB: return k.fb >= 0 ? q * k.fb : q * (k.f + bwd(a.bkind));
    case op::offload:
    case op::reload: return q * k.h;
    case op::S: return k.s;
    case op::T: return k.t;
    case op::IF:
    case op::IB: return k.e;
    default: return 0;
  }
}

namespace detail {

//! Hints the cache that `p` is about to be read (the next action of a rank the replay just woke:
//! ranks take turns, so each turn would otherwise start with a miss). No-op in constant evaluation.
constexpr void prefetch(const void* p) {
  if (!std::is_constant_evaluated()) __builtin_prefetch(p);
}

//! Text of the dependency that half `backward_half` of `a` waits for, for deadlock reports.
constexpr text waited_for(const schedule& s, const action& a, bool backward_half) {
  const int mb = backward_half ? a.bmb : a.mb;
  const int st = backward_half ? a.bstage : a.stage;
  const op k = backward_half ? a.bkind : a.kind;
  auto at = [&](text what, int stage) {
    return what + " (rank " + to_text(s.rank_of(mb, stage)) + ")";
  };
  const int last = s.stages - 1;
  if (k == op::S) return at(to_string(forward(mb, last)), last);
  if (k == op::T) return "the S passes of mb " + to_text(mb) + " on every rank (their barrier)";
  if (k == op::IB) return at("the input backward of mb " + to_text(mb) + " stage 0", 0);
  if (k == op::F && st == 0 && s.vocab != 0) return "the IF passes of mb " + to_text(mb) + " on every rank (their all-reduce)";
  if (k == op::F) return at(to_string(forward(mb, st - 1)), st - 1);
  if (k == op::W) return at(to_string(backward_input(mb, st)), st);
  if (st == last && s.vocab != 0)
    return "the " + text(s.vocab == 1 ? "T" : "S") + " passes of mb " + to_text(mb) + " on every rank (their barrier), after " +
           at(to_string(forward(mb, st)), st);
  if (st == last) return at(to_string(forward(mb, st)), st);
  return at("the backward of mb " + to_text(mb) + " stage " + to_text(st + 1), st + 1);
}

}  // namespace detail

namespace detail {

//! Per rank, the peak number of weight versions held (see `simulation::weight_copies`). In a
//! versioned schedule, a version of a stage is held from the update that writes it until it is
//! neither the latest nor read again: replaying each rank's program, the count after each action
//! is, per stage, 1 (the latest) plus the older versions some later action reads. Versions out
//! of range (an invalid schedule) are ignored: `validate` reports them.
constexpr std::vector<double> weight_versions(const schedule& s) {
  const auto uP = static_cast<std::size_t>(s.ranks);
  const auto uS = static_cast<std::size_t>(s.stages);
  const double q = s.stages >= 1 ? s.stage_fraction() : 1.0;
  std::vector<double> out(uP, 0.0);
  std::vector<int> held(uP, 0);  // stages on each rank
  for (int r : s.stage_to_rank)
    if (static_cast<std::size_t>(r) < uP) ++held[static_cast<std::size_t>(r)];
  if (!s.versioned() || s.version_slots.size() != uS || s.programs.size() != uP) {
    for (std::size_t r = 0; r < uP; ++r) out[r] = held[r] * q;
    return out;
  }
  // Pass 1: updates per stage, then the position of the last read of every version.
  std::vector<int> updates(uS, 0);
  for (auto const& prog : s.programs)
    for (const action& a : prog)
      if (is_compute(a.kind) && a.update && static_cast<std::size_t>(a.stage) < uS) ++updates[static_cast<std::size_t>(a.stage)];
  std::vector<std::vector<long long>> last_read(uS);
  for (std::size_t st = 0; st < uS; ++st) last_read[st].assign(static_cast<std::size_t>(updates[st]) + 1, -1);
  auto readable = [&](const action& a) {
    return is_compute(a.kind) && static_cast<std::size_t>(a.stage) < uS &&
           static_cast<std::size_t>(a.version) < last_read[static_cast<std::size_t>(a.stage)].size();
  };
  for (auto const& prog : s.programs)
    for (std::size_t i = 0; i < prog.size(); ++i)
      if (readable(prog[i])) last_read[static_cast<std::size_t>(prog[i].stage)][static_cast<std::size_t>(prog[i].version)] = static_cast<long long>(i);
  // Pass 2: the count after every action.
  std::vector<int> latest(uS, 0);
  for (std::size_t r = 0; r < uP; ++r) {
    int live = held[r], peak = live;  // version 0 of every stage the rank holds
    auto const& prog = s.programs[r];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (!readable(a)) continue;
      const auto st = static_cast<std::size_t>(a.stage);
      auto const& lr = last_read[st];
      const auto here = static_cast<long long>(i);
      const bool done = lr[static_cast<std::size_t>(a.version)] == here;
      if (a.update && latest[st] < updates[st]) {
        const int old = latest[st]++;
        ++live;
        if (lr[static_cast<std::size_t>(old)] <= here) --live;  // the old latest is read no more
        if (a.version != old && done) --live;
      } else if (a.version != latest[st] && done) {
        --live;
      }
      peak = live > peak ? live : peak;
    }
    out[r] = peak * q;
  }
  return out;
}

//! The simulator's view of `loom::costs`: every stage takes `q` of a rank's share, every hop `c`.
struct uniform_cost_view {
  const costs& k;
  double q;
  double r;
  double dur[4];  // F, B, W, BW
  constexpr uniform_cost_view(const costs& kk, double qq)
      : k(kk), q(qq), r(kk.mem_w_ratio), dur{qq * kk.f, qq * kk.b, qq * kk.w, qq * (kk.b + kk.w)} {}
  //! Duration of a plain action (`F`, `B`, `W`, `BW`) of stage `st`.
  constexpr double plain(op kind, int /*st*/) const { return dur[static_cast<int>(kind)]; }
  //! Duration of an overlapped pair.
  constexpr double fused(const action& a) const { return duration(a, k, q); }
  //! Latency of the message from `from` to `to` (different ranks) across boundary `st`|`st+1`.
  constexpr double hop(int /*from*/, int /*to*/, int /*st*/) const { return k.c; }
  //! Time of an optimizer update of stage `st` inside the program (`action::update`): none here.
  constexpr double update(int /*st*/) const { return 0; }
  //! Time of one host copy (offload or reload) of stage `st`'s activation.
  constexpr double copy(int /*st*/) const { return q * k.h; }
  //! Time of a vocabulary-parallel pass (`S`, `T`, `IF`, `IB`) on one rank's shard.
  constexpr double vocab(op kind) const { return kind == op::S ? k.s : kind == op::T ? k.t : k.e; }
  //! Latency of a barrier or broadcast that joins the ranks (vocabulary parallelism).
  constexpr double collective() const { return k.c; }
  //! Memory a forward of stage `st` allocates.
  constexpr double alloc(int /*st*/) const { return q; }
  //! Memory an action of `kind` of stage `st` releases.
  constexpr double release(op kind, int /*st*/) const { return kind == op::BW ? q : (kind == op::B ? (1 - r) * q : r * q); }
  //! The costs, for the error that the makespan is not finite.
  constexpr text describe() const {
    return "f=" + real_text(k.f) + ", b=" + real_text(k.b) + ", w=" + real_text(k.w) + ", c=" + real_text(k.c) +
           ", fb=" + real_text(k.fb) + ", h=" + real_text(k.h);
  }
};

//! The simulator's view of a `cost_model` already fitted to the schedule's stage count.
struct staged_cost_view {
  const cost_model& m;
  constexpr double plain(op kind, int st) const {
    const stage_cost& c = m.stages[static_cast<std::size_t>(st)];
    switch (kind) {
      case op::F: return c.f;
      case op::B: return c.b;
      case op::W: return c.w;
      default: return c.b + c.w;
    }
  }
  constexpr double fused(const action& a) const {
    const stage_cost& c = m.stages[static_cast<std::size_t>(a.stage)];
    return c.fb >= 0 ? c.fb : c.f + plain(a.bkind, a.bstage);
  }
  constexpr double hop(int from, int to, int st) const {
    return m.link(from, to).time(m.stages[static_cast<std::size_t>(st)].message_bytes);
  }
  constexpr double update(int st) const { return m.stages[static_cast<std::size_t>(st)].update; }
  constexpr double copy(int st) const { return m.host.time(m.stages[static_cast<std::size_t>(st)].activation_bytes); }
  constexpr double vocab(op kind) const { return kind == op::S ? m.vocab_s : kind == op::T ? m.vocab_t : m.vocab_e; }
  constexpr double collective() const { return m.intra.alpha; }
  constexpr double alloc(int st) const { return m.stages[static_cast<std::size_t>(st)].activation; }
  constexpr double release(op kind, int st) const {
    const double a = m.stages[static_cast<std::size_t>(st)].activation;
    return kind == op::BW ? a : (kind == op::B ? (1 - m.mem_w_ratio) * a : m.mem_w_ratio * a);
  }
  constexpr text describe() const { return text("the cost model's"); }
};

//! The replay shared by both cost models (see `simulate`).
template <class View>
constexpr simulation simulate_with(const schedule& s, const View& view) {
  simulation out;
  const int P = s.ranks, S = s.stages, M = s.microbatches;
  const auto uP = static_cast<std::size_t>(P);
  out.busy.assign(uP, 0.0);
  out.span.assign(uP, 0.0);
  out.peak_activation.assign(uP, 0.0);
  out.times.resize(uP);
  if (P < 1 || S < 1 || M < 1 || s.programs.size() != uP) {
    out.error = "schedule has " + to_text(static_cast<long long>(s.programs.size())) +
                " programs for " + to_text(P) + " ranks";
    return out;
  }
  const auto cells = static_cast<std::size_t>(M) * static_cast<std::size_t>(S);
  // End times per (mb, stage): forward and input-gradient backward (B or BW; a W waits for
  // it — a W after a BW is the validator's business); -1 = pending.
  struct cell_state {
    double f = -1, bwd = -1;
  };
  std::vector<cell_state> done(cells);
  auto idx = [M](int mb, int st) { return cell(mb, st, M); };
  auto in_range = [uM = static_cast<unsigned>(M), uS = static_cast<unsigned>(S)](int mb, int st) {
    return static_cast<unsigned>(mb) < uM && static_cast<unsigned>(st) < uS;
  };
  const int* s2r = s.stage_to_rank.data();
  const int* dir = s.mb_direction.empty() ? nullptr : s.mb_direction.data();
  auto rank_of = [&](int mb, int st) { return s2r[(dir ? dir[mb] * S : 0) + st]; };

  std::vector<std::size_t> pos(uP, 0);
  std::vector<double> free_at(uP, 0.0), first(uP, -1.0), live(uP, 0.0);
  // Host copies, allocated at the first one: per cell the end of its offload and of its reload
  // (-1: none yet); per rank its link's free time each way and the releases of offloads whose
  // copy is still running (ends ascend: one link, in program order), consumed from `drained`.
  struct copy_state {
    std::vector<double> off, rel;
    std::vector<double> to_host, to_device;
    std::vector<std::vector<std::pair<double, double>>> releases;
    std::vector<std::size_t> drained;
  } cp;
  bool copies = false;
  auto start_copies = [&] {
    copies = true;
    cp.off.assign(cells, -1.0);
    cp.rel.assign(cells, -1.0);
    cp.to_host.assign(uP, 0.0);
    cp.to_device.assign(uP, 0.0);
    cp.releases.resize(uP);
    cp.drained.assign(uP, 0);
  };
  // Vocabulary parallelism: per microbatch, how many ranks ran each pass and when the last ended.
  struct vocab_state {
    int count[4] = {0, 0, 0, 0};  // S, T, IF, IB
    double end[4] = {-1, -1, -1, -1};
  };
  std::vector<vocab_state> vs(s.vocab != 0 ? static_cast<std::size_t>(M) : 0);
  const double coll = s.vocab != 0 ? view.collective() : 0;
  auto vocab_index = [](op k) { return k == op::S ? 0 : k == op::T ? 1 : k == op::IF ? 2 : 3; };
  // The barrier after every rank's pass `k` of `mb`: its end, or -1 while a rank has not run it.
  auto barrier = [&](op k, int mb) -> double {
    const vocab_state& v = vs[static_cast<std::size_t>(mb)];
    const int i = vocab_index(k);
    if (v.count[i] < P) return -1.0;
    return P > 1 ? v.end[i] + coll : v.end[i];
  };
  // Releases the activations of rank `ur`'s offloads whose copy has ended by time `t`.
  auto drain = [&](std::size_t ur, double t) {
    auto const& rl = cp.releases[ur];
    std::size_t& k = cp.drained[ur];
    for (; k < rl.size() && rl[k].first <= t; ++k) live[ur] -= rl[k].second;
  };
  std::vector<char> queued(uP, 1);
  std::vector<int> work;
  work.reserve(uP * 2);
  for (int rr = P - 1; rr >= 0; --rr) {
    work.push_back(rr);
    out.times[static_cast<std::size_t>(rr)].resize(s.programs[static_cast<std::size_t>(rr)].size());
  }
  auto wake = [&](int w) {
    if (!queued[static_cast<std::size_t>(w)]) {
      queued[static_cast<std::size_t>(w)] = 1;
      work.push_back(w);
      prefetch(s.programs[static_cast<std::size_t>(w)].data() + pos[static_cast<std::size_t>(w)]);
    }
  };
  // Earliest start of one half (kind, mb, st) on `rank`, or -1 if a dependency is pending.
  auto ready = [&](op kind, int mb, int st, int rank) -> double {
    if (is_vocab(kind)) {
      if (kind == op::IF) return 0;
      if (kind == op::T) return barrier(op::S, mb);
      const int from = kind == op::S ? rank_of(mb, S - 1) : rank_of(mb, 0);
      const double e = kind == op::S ? done[idx(mb, S - 1)].f : done[idx(mb, 0)].bwd;
      if (e < 0) return -1.0;
      return from != rank ? e + coll : e;
    }
    const cell_state& here = done[idx(mb, st)];
    if (kind == op::F) {
      if (st == 0) return s.vocab != 0 ? barrier(op::IF, mb) : 0;
      const double e = done[idx(mb, st - 1)].f;
      if (e < 0) return -1.0;
      const int from = rank_of(mb, st - 1);
      return from != rank ? e + view.hop(from, rank, st - 1) : e;
    }
    if (kind == op::W) return here.bwd;  // B ran on this rank (same stage)
    if (here.f < 0) return -1.0;       // own forward first
    double own = here.f;
    if (copies) {  // an offloaded activation: its reload first
      const std::size_t c = idx(mb, st);
      if (cp.off[c] >= 0) {
        if (cp.rel[c] < 0) return -1.0;
        own = cp.rel[c] > own ? cp.rel[c] : own;
      }
    }
    if (st == S - 1) {
      if (s.vocab == 0) return own;
      const double v = barrier(s.vocab == 1 ? op::T : op::S, mb);  // the output layer's input gradient
      if (v < 0) return -1.0;
      return v > own ? v : own;
    }
    const double e = done[idx(mb, st + 1)].bwd;
    if (e < 0) return -1.0;
    const int from = rank_of(mb, st + 1);
    const double t = from != rank ? e + view.hop(from, rank, st) : e;
    return t > own ? t : own;
  };
  auto wake_all = [&] {
    for (int w = 0; w < P; ++w) wake(w);
  };
  auto finish = [&](op kind, int mb, int st, double end) {
    if (is_vocab(kind)) {
      vocab_state& v = vs[static_cast<std::size_t>(mb)];
      const int i = vocab_index(kind);
      v.end[i] = end > v.end[i] ? end : v.end[i];
      if (++v.count[i] == P) wake_all();  // a barrier completed
      return;
    }
    cell_state& here = done[idx(mb, st)];
    if (kind == op::F) {
      here.f = end;
      if (st + 1 < S) wake(rank_of(mb, st + 1));
      else if (s.vocab != 0) wake_all();  // every rank's S waits for the last stage's output
    } else if (kind == op::B || kind == op::BW) {
      here.bwd = end;
      if (st > 0) wake(rank_of(mb, st - 1));
      else if (s.vocab != 0) wake_all();  // every rank's IB waits for the first stage's input gradient
    }
  };
  while (!work.empty()) {
    const int rank = work.back();
    work.pop_back();
    const auto ur = static_cast<std::size_t>(rank);
    queued[ur] = 0;
    auto const& prog = s.programs[ur];
    action_time* times = out.times[ur].data();
    std::size_t i = pos[ur];
    double t_free = free_at[ur];
    while (i < prog.size()) {
      const action& a = prog[i];
      if (is_transfer(a.kind)) {
        times[i] = {t_free, t_free};
        ++i;
        continue;
      }
      if (is_host_copy(a.kind)) {
        if (!in_range(a.mb, a.stage)) {
          out.error = "rank " + to_text(rank) + ", position " + to_text(static_cast<long long>(i)) +
                      ": action " + to_string(a) + " names a microbatch or stage out of range";
          return out;
        }
        if (!copies) start_copies();
        const std::size_t c = idx(a.mb, a.stage);
        const bool out_copy = a.kind == op::offload;
        // An offload follows its forward (on this rank, earlier in the program), a reload its
        // offload; otherwise the rank waits for them forever (a deadlock the report names).
        const double after = out_copy ? done[c].f : cp.off[c];
        if (after < 0) break;
        double& link = out_copy ? cp.to_host[ur] : cp.to_device[ur];
        double start = t_free > link ? t_free : link;
        start = after > start ? after : start;
        const double end = start + view.copy(a.stage);
        times[i] = {start, end};
        link = end;
        if (out_copy) {
          cp.off[c] = end;
          cp.releases[ur].push_back({end, view.alloc(a.stage)});
        } else {
          cp.rel[c] = end;
          drain(ur, start);
          live[ur] += view.alloc(a.stage);
          if (live[ur] > out.peak_activation[ur]) out.peak_activation[ur] = live[ur];
        }
        ++i;
        continue;
      }
      const bool fb = a.kind == op::FB;
      const bool vp = is_vocab(a.kind);
      if (vp ? (s.vocab == 0 || static_cast<unsigned>(a.mb) >= static_cast<unsigned>(M) || static_cast<unsigned>(a.stage) >= static_cast<unsigned>(P))
             : (!in_range(a.mb, a.stage) || (fb && !in_range(a.bmb, a.bstage)))) {
        out.error = "rank " + to_text(rank) + ", position " + to_text(static_cast<long long>(i)) + ": action " + to_string(a) +
                    (vp && s.vocab == 0 ? " is a vocabulary pass, but the schedule is not vocabulary-parallel (vocab = 0)"
                                        : " names a microbatch or stage out of range");
        return out;
      }
      double t = ready(fb ? op::F : a.kind, a.mb, a.stage, rank);
      if (t < 0) break;
      if (fb) {
        const double tb = ready(a.bkind, a.bmb, a.bstage, rank);
        if (tb < 0) break;
        t = tb > t ? tb : t;
      }
      const double start = t > t_free ? t : t_free;
      if (copies) drain(ur, start);
      // An update carried by the action (a versioned schedule's optimizer step) runs right after
      // it on the same rank: its time extends the action (what depends on the action's output
      // waits for the update too, as the executor runs them: the send follows both).
      const double d = vp ? view.vocab(a.kind) : (fb ? view.fused(a) : view.plain(a.kind, a.stage)) + (a.update ? view.update(a.stage) : 0.0);
      const double end = start + d;
      times[i] = {start, end};
      if (first[ur] < 0) first[ur] = start;
      t_free = end;
      out.busy[ur] += d;
      // Memory in program order (the vocabulary passes hold none of the model's activations).
      if (!vp) {
        if (a.kind == op::F || fb) {
          live[ur] += view.alloc(a.stage);
          if (live[ur] > out.peak_activation[ur]) out.peak_activation[ur] = live[ur];
          if (fb) live[ur] -= view.release(a.bkind, a.bstage);
        } else {
          live[ur] -= view.release(a.kind, a.stage);
        }
      }
      if (fb) {
        finish(op::F, a.mb, a.stage, end);
        finish(a.bkind, a.bmb, a.bstage, end);
      } else {
        finish(a.kind, a.mb, a.stage, end);
      }
      ++i;
    }
    pos[ur] = i;
    free_at[ur] = t_free;
  }

  double g_start = -1, g_end = 0, max_span = 0, total = 0;
  for (std::size_t i = 0; i < uP; ++i) {
    if (pos[i] < s.programs[i].size()) {
      if (out.error.empty()) {
        out.error = "deadlock:";
        out.stuck_rank = static_cast<int>(i);
        out.stuck_pos = pos[i];
      }
      const action& a = s.programs[i][pos[i]];
      bool fb = a.kind == op::FB;
      bool second = fb && ready(op::F, a.mb, a.stage, static_cast<int>(i)) >= 0;
      text why;
      if (is_host_copy(a.kind)) {
        why = a.kind == op::offload ? to_string(forward(a.mb, a.stage)) : to_string(offload_to_host(a.mb, a.stage));
        why += " (this rank)";
      } else if (const int mb = second ? a.bmb : a.mb, st = second ? a.bstage : a.stage;
                 copies && is_input_backward(second ? a.bkind : a.kind) && cp.off[idx(mb, st)] >= 0 && cp.rel[idx(mb, st)] < 0) {
        why = to_string(reload_from_host(mb, st)) + " (this rank)";
      } else {
        why = waited_for(s, a, second);
      }
      out.error += " rank " + to_text(static_cast<long long>(i)) + " is stuck at position " +
                   to_text(static_cast<long long>(pos[i])) + " on " + to_string(a) + ", waiting for " + why + ";";
    }
    double last = s.programs[i].empty() ? 0.0 : free_at[i];
    double f0 = first[i] < 0 ? last : first[i];
    out.span[i] = last - f0;
    if (first[i] >= 0 && (g_start < 0 || f0 < g_start)) g_start = f0;
    if (last > g_end) g_end = last;
    if (out.span[i] > max_span) max_span = out.span[i];
    total += out.busy[i];
  }
  if (!out.error.empty()) {
    out.error.pop_back();
    return out;
  }
  if (g_start < 0) g_start = 0;
  out.makespan = g_end - g_start;
  if (!finite(out.makespan) || !finite(total))
    throw config_error("costs too large: the makespan of schedule " + s.name + " is not a finite number (" +
                       view.describe() + ")");
  out.weight_copies = weight_versions(s);
  out.bubble_ratio = out.makespan > 0 ? 1 - total / (P * out.makespan) : 0;
  out.bubble_rate = max_span > 0 ? 1 - total / (P * max_span) : 0;
  out.ok = true;
  return out;
}

}  // namespace detail

//! Simulates `s` under costs `k`. Works on generated and lowered programs alike (send/recv are
//! instantaneous). Never throws for a malformed schedule: it reports `ok = false`. Throws
//! `config_error` for costs outside their domain (`detail::check_costs`) and for costs so large
//! that the makespan is not a finite number.
constexpr simulation simulate(const schedule& s, const costs& k = {}) {
  if (text rule = detail::check_costs(k); !rule.empty()) throw config_error(rule);
  return detail::simulate_with(s, detail::uniform_cost_view(k, s.stages >= 1 ? s.stage_fraction() : 1.0));
}

//! Simulates `s` under the stage- and link-resolved model `m` (fitted to the schedule's stage
//! count by `cost_model::fit`): an action of stage `st` takes that stage's time, a forward
//! allocates its `activation`, and a dependency between ranks `a` and `b` across the boundary of
//! stages `st` and `st + 1` adds `link(a, b).time(stages[st].message_bytes)`. Peaks are in the
//! unit of `activation`. Throws `config_error` for a model that breaks a rule or does not fit.
constexpr simulation simulate(const schedule& s, const cost_model& m) {
  const cost_model fitted = m.fit(s.stages < 1 ? 1 : s.stages);
  return detail::simulate_with(s, detail::staged_cost_view{fitted});
}

}  // namespace loom
