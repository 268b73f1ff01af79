// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `zb-auto`: a memory-capped, cost-aware zero-bubble auto-scheduler.
//!
//! Paper: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv:2401.10241), §3.1
//! (the heuristic), §5.3-5.4 and Appendix B (memory limit vs bubble), §6 (V placement), and
//! Appendix G (the exact problem as an ILP). loom's implementation is its own:
//!
//! 1. **Greedy list scheduling in simulated time** (the paper's heuristic). Ranks are advanced in
//!    order of the time they become idle, under exactly the cost model of `loom::simulate`
//!    (ARCHITECTURE.md). An idle rank runs, in this order of preference: a ready `B` (input
//!    gradient; the critical path); a ready `F` if its activation fits under the memory limit
//!    (the warm-up therefore runs "as many F's as memory allows"); a pending `W` to fill a gap
//!    or, when the limit blocks an `F`, to recycle memory; otherwise it waits for the next event.
//!    Leftover `W`'s run at the tail. F's and B's of a stage run in microbatch order, W's oldest
//!    first. On the V placement a rank prefers its deeper chunk's F and reserves memory so that
//!    every first-chunk activation it admits can later take its second-chunk F (no deadlock).
//! 2. **A grid over the heuristic's binary choices** (§3.1): fill a gap shorter than `W` with a
//!    `W` or not (`eager_w`); let an `F` delay a `B` that becomes ready before the `F` would end
//!    or not (`f_may_delay_b`).
//! 3. **Local search over per-rank in-flight caps**: lowering the number of microbatches a rank
//!    may hold between `F` and `B` below what the memory allows ("skip an F if it does not cause
//!    more bubbles", §3.1, generalised) — hill climbing, one rank at a time.
//! 4. **Seeds**: on the loop placement the handcrafted ZB-H1 and ZB-H2 orders are candidates too
//!    whenever they fit the limit, so `zb-auto` is never worse than them; on the V placement, with
//!    a limit of at least `p`, so is `zb-v`'s cost-aware schedule (its greedy improved by local
//!    search, `zb_v.hpp`), so `zb-auto` (V) is never worse than `zb-v` at the same memory.
//!
//! Every candidate is scored with `loom::simulate` (the normative model): the smallest
//! `bubble_rate` wins, ties broken by makespan, then by peak memory. Every candidate's peak
//! activation is checked against the limit on every rank, so the result never exceeds it.
//!
//! Input: `generate_options{cost, mem_limit, placement}`. `mem_limit` is per rank, in
//! ARCHITECTURE.md units (activations of one microbatch through one rank's share of the model,
//! the paper's `M_B`); `mem_limit <= 0` means the documented default `p` (the paper's ZB-1p
//! budget, 1F1B's peak). `cost.mem_w_ratio` is the paper's `M_W/M_B` (32h/(34h+5as) for a
//! GPT-style layer, Table 1). The chunk count names the placement: 1 chunk (stage) per rank is
//! the loop placement, 2 chunks the V placement (§6); `placement = v` requires 2 chunks. Without
//! options (`generate(shape)`) costs are unit and the limit is `p`.
//!
//! Rules: any `m >= 1` and `p >= 1`; `mem_limit >= 1` (a rank must hold at least one
//! microbatch's activations: F allocates them and nothing releases them before that microbatch's
//! B); `f > 0`, `b > 0`, `w >= 0`, `c >= 0`, `0 <= mem_w_ratio <= 1`.
//!
//! Closed forms: none in general (it is a search). Bounds it meets: bubble rate no higher than
//! ZB-H1's when `mem_limit >= p` and ZB-H2's when `mem_limit >= 2p-1` (seeds); at `f = b = w`,
//! `c = 0`, `mem_limit = 2p-1` and `m >= 2p-1` it reaches zero bubble rate. Appendix B's lower
//! bound holds for any schedule: with `k` F's before the first B on rank 0 the bubble before it
//! is at least `(p-1)(b+2c) + (p-k)f`, so memory `k` must reach
//! `floor(((p-1)(b+2c) + p f) / f)` before the warm-up bubble closes.
//!
//! p = 4, m = 8, f = b = w = 1, c = 0, mem_limit = 4 (loop; one column per time unit). At unit
//! costs and 1F1B's memory the best order found is ZB-H1's (bubble rate 3/27 = 0.111, peak 4):
//! ```
//!   r0 | F0 F1 F2 F3  .  .  . B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
//!   r1 |  . F0 F1 F2  .  . B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7
//!   r2 |  .  . F0 F1  . B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7
//!   r3 |  .  .  . F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7
//! ```

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/error.hpp"
#include "loom/schedule/dualpipe_v.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/gpipe.hpp"
#include "loom/schedule/gpipe_2bp.hpp"
#include "loom/schedule/hanayo.hpp"
#include "loom/schedule/interleaved_1f1b.hpp"
#include "loom/schedule/looped_bfs.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/one_f_one_b_2bp.hpp"
#include "loom/schedule/order_search.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/v_half.hpp"
#include "loom/schedule/v_min.hpp"
#include "loom/schedule/zb_h1.hpp"
#include "loom/schedule/zb_h2.hpp"
#include "loom/schedule/zb_heuristics.hpp"
#include "loom/schedule/zb_order.hpp"
#include "loom/schedule/zb_v.hpp"

namespace loom {

namespace detail {

//! The heuristic's choices for one greedy construction.
struct zb_auto_knobs {
  bool eager_w = false;        //!< fill any gap with a W (else only gaps at least as long as W)
  bool f_may_delay_b = true;   //!< start an F even if a B becomes ready before it ends
  //! W's a rank may defer, as a multiple of the W's that fit the time its last B leads rank 0's:
  //! rank r keeps at most `w_defer * r * (b + c) / w` pending W's before it runs one ahead of an
  //! F (the 1F-1B-1W steady state); negative: no limit (W's only in gaps or for memory).
  double w_defer = -1;
};

//! A huge time (never reached by a finite schedule).
inline constexpr double zb_auto_never = 1e300;

//! One greedy construction (see the file comment). `cap[r]` bounds the microbatch-stages rank
//! `r` holds between F and B (`<= 0`: no cap beyond memory). `max_inflight` (if non-null)
//! receives the largest such count each rank reached. Throws `schedule_error` if it cannot
//! progress (not reachable with `limit >= 1`).
constexpr schedule zb_auto_build(std::string_view name, shape s, placement_kind pk, const costs& k, double limit,
                                 const zb_auto_knobs& kn, const std::vector<int>& cap,
                                 std::vector<int>* max_inflight) {
  const int P = s.ranks, M = s.microbatches;
  const bool vee = pk == placement_kind::v;
  const int C = vee ? 2 : (s.chunks < 1 ? 1 : s.chunks);  // local chunks per rank
  const int S = P * C;
  const auto uC = static_cast<std::size_t>(C);
  schedule out = make_schedule(name, shape{P, M, C}, S, pk);
  const double q = static_cast<double>(P) / S;
  const double df = q * k.f, db = q * k.b, dw = q * k.w, c = k.c;
  const double eps = 1e-9;
  const auto uP = static_cast<std::size_t>(P);
  const auto cells = static_cast<std::size_t>(M) * static_cast<std::size_t>(S);
  auto idx = [S](int mb, int st) { return static_cast<std::size_t>(mb) * static_cast<std::size_t>(S) + static_cast<std::size_t>(st); };
  std::vector<double> f_end(cells, -1.0), b_end(cells, -1.0);

  // Per rank: decision time `t` (>= `idle`, the end of its last action), counters per local
  // chunk, live memory, pending W's, in-flight count.
  std::vector<double> t(uP, 0.0), idle(uP, 0.0), live(uP, 0.0);
  std::vector<int> nf(uP * uC, 0), nb(uP * uC, 0), inflight(uP, 0), wq_head(uP, 0);
  std::vector<std::vector<int>> wq(uP);  // pending W stages and microbatches, encoded mb*S+st
  std::vector<int> peak_in(uP, 0);
  // A rank waiting for a dependency no rank has scheduled yet sleeps until a rank emits an action
  // that feeds it; it then decides again from the time it became idle (nothing ran there since).
  std::vector<char> blocked(uP, 0);
  auto notify = [&](int y) {
    auto uy = static_cast<std::size_t>(y);
    if (t[uy] < zb_auto_never && (blocked[uy] || t[uy] > idle[uy])) {
      blocked[uy] = 0;
      t[uy] = idle[uy];
    }
  };
  auto stage_of = [&](int r, int ch) { return vee ? (ch == 0 ? r : 2 * P - 1 - r) : ch * P + r; };
  for (std::size_t r = 0; r < uP; ++r) {
    out.programs[r].reserve(static_cast<std::size_t>(3 * M * C));
    wq[r].reserve(static_cast<std::size_t>(M * C));
  }
  std::size_t remaining = static_cast<std::size_t>(3) * cells;
  // Per local chunk of the deciding rank: when its next B / F is ready (-1: unknown), whether it
  // has one, and whether the F fits the memory.
  std::vector<double> ready_b(uC), ready_f(uC);
  std::vector<char> has_b(uC), has_f(uC), fits_f(uC);

  while (remaining > 0) {
    // The idle rank with the earliest decision time (ties: lowest rank).
    int r = -1;
    for (int i = 0; i < P; ++i) {
      auto ui = static_cast<std::size_t>(i);
      if (t[ui] >= zb_auto_never || blocked[ui]) continue;
      if (r < 0 || t[ui] < t[static_cast<std::size_t>(r)]) r = i;
    }
    bool force_w = false;
    if (r < 0) {
      // Every rank waits on another: the earliest one with a pending W runs it.
      for (int i = 0; i < P; ++i) {
        auto ui = static_cast<std::size_t>(i);
        if (t[ui] < zb_auto_never && wq_head[ui] < static_cast<int>(wq[ui].size()) &&
            (r < 0 || t[ui] < t[static_cast<std::size_t>(r)]))
          r = i;
      }
      if (r < 0) throw schedule_error("zb-auto: internal error, no rank can progress");
      force_w = true;
    }
    const auto ur = static_cast<std::size_t>(r);
    const double now = t[ur];
    auto& prog = out.programs[ur];

    // Earliest time a dependency produced on rank `pr` at `end` is usable here; -1 if unknown.
    auto arrive = [&](double end, int st) -> double {
      if (end < 0) return -1.0;
      return out.stage_to_rank[static_cast<std::size_t>(st)] == r ? end : end + c;
    };
    // Lower bound on when an unknown dependency (stage st) can be usable here.
    auto bound = [&](int st, double dur) -> double {
      int pr = out.stage_to_rank[static_cast<std::size_t>(st)];
      double tp = idle[static_cast<std::size_t>(pr)];
      return (tp > now ? tp : now) + dur + (pr == r ? 0.0 : c);
    };

    for (int ch = 0; ch < C; ++ch) {
      const auto uh = static_cast<std::size_t>(ch);
      ready_b[uh] = ready_f[uh] = -1;
      has_b[uh] = has_f[uh] = fits_f[uh] = 0;
    }
    double lb = zb_auto_never;
    const bool capped = !cap.empty() && cap[ur] > 0 && inflight[ur] >= cap[ur];
    for (int ch = 0; ch < C; ++ch) {
      const int st = stage_of(r, ch);
      const auto uc = ur * uC + static_cast<std::size_t>(ch);
      if (nb[uc] < nf[uc]) {
        has_b[ch] = true;
        const int mb = nb[uc];
        if (st == S - 1) ready_b[ch] = f_end[idx(mb, st)];
        else ready_b[ch] = arrive(b_end[idx(mb, st + 1)], st + 1);
        if (ready_b[ch] < 0) lb = lb < bound(st + 1, db) ? lb : bound(st + 1, db);
      }
      if (nf[uc] < M) {
        has_f[ch] = true;
        const int mb = nf[uc];
        ready_f[ch] = st == 0 ? 0.0 : arrive(f_end[idx(mb, st - 1)], st - 1);
        // Memory: the activation must fit; a first-chunk F also reserves room for the later-chunk
        // F's on this rank of every microbatch it admitted (no deadlock on a full rank).
        double need = live[ur] + q;
        if (ch == 0)
          for (std::size_t h = 1; h < uC; ++h) need += q * (nf[ur * uC] - nf[ur * uC + h] + 1);
        fits_f[ch] = need <= limit + eps && !(capped && ch == 0);
        if (ready_f[ch] < 0 && st > 0) lb = lb < bound(st - 1, df) ? lb : bound(st - 1, df);
      }
    }

    enum class pick { none, b, f, w, wait };
    pick what = force_w ? pick::w : pick::none;
    int ch_pick = -1;
    double start = now;
    // 1. A ready B: the earliest ready (ties: the shallower stage, which completes a microbatch).
    for (int ch = 0; ch < C; ++ch)
      if (has_b[ch] && ready_b[ch] >= 0 && ready_b[ch] <= now + eps)
        if (ch_pick < 0 || ready_b[ch] < ready_b[ch_pick] - eps) ch_pick = ch;
    if (ch_pick >= 0 && !force_w) what = pick::b;
    // The earliest known B arrival in the future.
    double next_b = zb_auto_never;
    for (int ch = 0; ch < C; ++ch)
      if (has_b[ch] && ready_b[ch] > now + eps && ready_b[ch] < next_b) next_b = ready_b[ch];
    // 2. A W when this rank defers more W's than its tail can absorb.
    const int pending_w = static_cast<int>(wq[ur].size()) - wq_head[ur];
    if (what == pick::none && kn.w_defer >= 0 && pending_w > 0) {
      const double tail = dw > 0 ? kn.w_defer * r * (db + c) / dw : 1e18;
      if (pending_w > tail) what = pick::w;
    }
    // 3. A ready F that fits (deeper chunk first).
    bool f_blocked_by_memory = false;
    if (what == pick::none) {
      for (int ch = C - 1; ch >= 0; --ch) {
        if (!has_f[ch] || ready_f[ch] < 0 || ready_f[ch] > now + eps) continue;
        if (!fits_f[ch]) {
          f_blocked_by_memory = f_blocked_by_memory || !(capped && ch == 0);
          continue;
        }
        if (!kn.f_may_delay_b && next_b < now + df - eps) continue;
        ch_pick = ch;
        what = pick::f;
        break;
      }
    }
    // 4. Otherwise a W, or wait.
    const bool has_w = wq_head[ur] < static_cast<int>(wq[ur].size());
    if (what == pick::none) {
      double next = next_b;
      for (int ch = 0; ch < C; ++ch)
        if (has_f[ch] && fits_f[ch] && ready_f[ch] > now + eps && ready_f[ch] < next) next = ready_f[ch];
      if (lb < next) next = lb;
      const double gap = next - now;
      bool nothing_else = true;
      for (int ch = 0; ch < C; ++ch) nothing_else = nothing_else && !has_b[ch] && !has_f[ch];
      if (has_w && (nothing_else || f_blocked_by_memory || kn.eager_w || gap >= dw - eps)) {
        what = pick::w;
      } else {
        // Wait for the next known arrival, or sleep until a rank feeds this one.
        double wake = next_b;
        for (int ch = 0; ch < C; ++ch)
          if (has_f[ch] && fits_f[ch] && ready_f[ch] > now + eps && ready_f[ch] < wake) wake = ready_f[ch];
        if (wake < zb_auto_never) t[ur] = wake;
        else blocked[ur] = 1;
        continue;
      }
    }

    // Emit the chosen action.
    if (what == pick::b) {
      const auto uc = ur * uC + static_cast<std::size_t>(ch_pick);
      const int st = stage_of(r, ch_pick), mb = nb[uc]++;
      start = ready_b[ch_pick] > now ? ready_b[ch_pick] : now;
      prog.push_back(backward_input(mb, st));
      b_end[idx(mb, st)] = start + db;
      t[ur] = start + db;
      if (st > 0 && out.stage_to_rank[static_cast<std::size_t>(st - 1)] != r) notify(out.stage_to_rank[static_cast<std::size_t>(st - 1)]);
      live[ur] -= (1 - k.mem_w_ratio) * q;
      --inflight[ur];
      wq[ur].push_back(mb * S + st);
    } else if (what == pick::f) {
      const auto uc = ur * uC + static_cast<std::size_t>(ch_pick);
      const int st = stage_of(r, ch_pick), mb = nf[uc]++;
      start = ready_f[ch_pick] > now ? ready_f[ch_pick] : now;
      prog.push_back(forward(mb, st));
      f_end[idx(mb, st)] = start + df;
      t[ur] = start + df;
      if (st + 1 < S && out.stage_to_rank[static_cast<std::size_t>(st + 1)] != r) notify(out.stage_to_rank[static_cast<std::size_t>(st + 1)]);
      live[ur] += q;
      if (++inflight[ur] > peak_in[ur]) peak_in[ur] = inflight[ur];
    } else {
      const int code = wq[ur][static_cast<std::size_t>(wq_head[ur]++)];
      prog.push_back(backward_weight(code / S, code % S));
      t[ur] = now + dw;
      live[ur] -= k.mem_w_ratio * q;
    }
    idle[ur] = t[ur];
    // A rank that ran a forced W decides again (its memory changed; nothing else would wake it).
    blocked[ur] = 0;
    --remaining;
    // A rank whose program is complete leaves the loop.
    if (static_cast<int>(prog.size()) == 3 * M * C) t[ur] = zb_auto_never;
  }
  if (max_inflight) *max_inflight = peak_in;
  return out;
}

//! Per rank, how many forwards it can finish before its first backward can start when every
//! rank runs only forwards until then (Appendix B's `k`, generalised to any placement): the
//! in-flight count beyond which an extra F would delay the first B. Plus `delta`, at least 1.
constexpr std::vector<int> zb_auto_warmup_caps(shape s, placement_kind pk, const costs& k, int delta) {
  const int P = s.ranks, C = pk == placement_kind::v ? 2 : (s.chunks < 1 ? 1 : s.chunks), S = P * C;
  const double q = 1.0 / C;
  auto rank_of = [&](int st) { return pk == placement_kind::v ? v_rank(st, P) : loop_rank(st, P); };
  auto hop = [&](int st) { return rank_of(st) != rank_of(st + 1) ? k.c : 0.0; };
  std::vector<double> f_start(static_cast<std::size_t>(S), 0.0);
  double t = 0;
  for (int st = 0; st < S; ++st) {
    f_start[static_cast<std::size_t>(st)] = t;
    t += q * k.f + (st + 1 < S ? hop(st) : 0.0);
  }
  // t: end of F(S-1) of the first microbatch; walk the first backward down.
  std::vector<double> b_start(static_cast<std::size_t>(S), 0.0);
  for (int st = S - 1; st >= 0; --st) {
    b_start[static_cast<std::size_t>(st)] = t;
    t += q * k.b + (st > 0 ? hop(st - 1) : 0.0);
  }
  std::vector<int> cap(static_cast<std::size_t>(P), 1);
  for (int r = 0; r < P; ++r) {
    // The rank's first forward is of its shallowest stage, its first backward of its deepest.
    const int lo = r, hi = pk == placement_kind::v ? 2 * P - 1 - r : (C - 1) * P + r;
    double window = b_start[static_cast<std::size_t>(hi)] - f_start[static_cast<std::size_t>(lo)];
    // More forwards than the rank runs in all (M*C) never bind; bounding the quotient first keeps
    // the conversion defined for any finite costs (b/f may be 1e300).
    const double fits = window / (q * k.f) + 1e-9;
    const int all = s.microbatches * C;
    int n = (fits < all ? static_cast<int>(fits) : all) + delta;
    cap[static_cast<std::size_t>(r)] = n < 1 ? 1 : n;
  }
  return cap;
}

//! Score of a candidate: lexicographic (bubble rate, makespan, peak memory).
struct zb_auto_score {
  double bubble_rate = 2;
  double makespan = 0;
  double peak = 0;
  constexpr bool better_than(const zb_auto_score& o) const {
    const double e = 1e-12;
    if (bubble_rate < o.bubble_rate - e) return true;
    if (bubble_rate > o.bubble_rate + e) return false;
    if (makespan < o.makespan - e) return true;
    if (makespan > o.makespan + e) return false;
    return peak < o.peak - e;
  }
};

//! Simulates `s` under `k` (`loom::costs` or `loom::cost_model`) and scores it; `ok` false if it
//! exceeds the limit on some rank or is invalid.
template <class Cost>
constexpr bool zb_auto_score_of(const schedule& s, const Cost& k, double limit, zb_auto_score& out) {
  simulation sim = simulate(s, k);
  if (!sim.ok) return false;
  for (double v : sim.peak_activation)
    if (v > limit + 1e-9) return false;
  out = {sim.bubble_rate, sim.makespan, sim.max_peak_activation()};
  return true;
}

//! The rule a cost model or limit breaks for zb-auto, or "".
constexpr text zb_auto_check_options(const generate_options& o, int ranks) {
  const costs& k = o.cost;
  if (!(k.f > 0)) return "zb-auto needs f > 0 (got f=" + real_text(k.f) + ")";
  if (!(k.b > 0)) return "zb-auto needs b > 0 (got b=" + real_text(k.b) + ")";
  if (!(k.w >= 0)) return "zb-auto needs w >= 0";
  if (!(k.c >= 0)) return "zb-auto needs c >= 0";
  if (!(k.mem_w_ratio >= 0 && k.mem_w_ratio <= 1)) return "zb-auto needs 0 <= mem-w-ratio <= 1";
  double limit = o.mem_limit > 0 ? o.mem_limit : ranks;
  if (limit < 1 - 1e-9)
    return "zb-auto needs mem-limit >= 1 (a rank holds at least one microbatch's activations from its F to its B)";
  return {};
}

//! `in` with every fused action split into its parts in place: a `BW` into its `B` and, after the
//! rank's `lag`-th next backward (at the end if there is none), its `W`; an overlapped `FB` into
//! its forward, then its backward split the same way. With lag 0 the split schedule takes no
//! longer than `in` (a part starts no later than the fused action would) and holds the same
//! memory. `lag_per_rank`: the lag is the rank index (ZB-H1's rule, Qi et al. 2024 §3, applied to
//! any order, e.g. interleaved 1F1B's: the peer is PyTorch's `ScheduleInterleavedZeroBubble`,
//! interleaved stages with split backward), else 0.
constexpr schedule zb_auto_split_seed(const schedule& in, std::string_view name, bool lag_per_rank) {
  schedule out = make_schedule(name, {.ranks = in.ranks, .microbatches = in.microbatches, .chunks = in.chunks}, in.stages,
                               in.placement);
  out.stage_to_rank = in.stage_to_rank;
  for (std::size_t r = 0; r < in.programs.size(); ++r) {
    auto& prog = out.programs[r];
    prog.reserve(in.programs[r].size() * 2);
    const std::size_t lag = lag_per_rank ? r : 0;
    std::vector<action> pending;
    std::size_t head = 0;
    auto backward_part = [&](op kind, int mb, int st) {
      prog.push_back(backward_input(mb, st));
      if (kind != op::BW) return;
      pending.push_back(backward_weight(mb, st));
      if (pending.size() - head > lag) prog.push_back(pending[head++]);
    };
    for (action a : in.programs[r]) {
      if (a.kind == op::FB) {
        prog.push_back(forward(a.mb, a.stage));
        backward_part(a.bkind, a.bmb, a.bstage);
      } else if (a.kind == op::BW) {
        backward_part(op::BW, a.mb, a.stage);
      } else {
        prog.push_back(a);
      }
    }
    while (head < pending.size()) prog.push_back(pending[head++]);
  }
  return out;
}

}  // namespace detail

//! The `zb-auto` family: the Zero Bubble auto-scheduler (§3.1 heuristic + grid + local search),
//! for the loop placement with any number of chunks per rank and the V placement (2 chunks),
//! under a per-rank activation-memory limit.
struct zb_auto {
  static constexpr std::string_view name = "zb-auto";
  static constexpr std::string_view summary =
      "Zero Bubble auto-scheduler: memory-capped search over the paper's heuristic, loop (any chunks) or V placement (Qi et al. 2024)";
  //! Evaluations the in-flight-cap local search may spend beyond the grid.
  int search_budget = 40;
  //! Size limits of the search (see `loom::max_ranks`): its run time grows with cells x (p + m),
  //! about 3 s at p = 256, m = 64 on one core.
  static constexpr int max_ranks = 256;
  static constexpr long long max_cells = 1LL << 14;  //!< see `max_ranks`

  //! Evaluations the final critical-path search (`detail::order_local_search`) may spend on the
  //! best candidate. Both bound the run time: p = 32, m = 256 stays under one second on one core.
  int order_budget = 60;

  //! Chunks per rank on the loop placement: the search's time grows faster than linearly in the
  //! chunk count (p = 64, m = 4, 64 chunks: about 2.6 s on one core; 256 chunks ran over a
  //! minute under ASan+UBSan, found by the engine fuzzer).
  static constexpr int max_chunks = 64;

  //! Rules every shape must meet: p, m, chunks >= 1, chunks <= `max_chunks` (the V placement
  //! needs exactly 2; see `generate`).
  constexpr text check(shape s) const {
    if (auto r = detail::check_basic(name, s); !r.empty()) return r;
    if (s.chunks > max_chunks)
      return "zb-auto runs at most " + detail::to_text(max_chunks) + " chunks per rank (got chunks=" +
             detail::to_text(s.chunks) + ")";
    return {};
  }

  //! Unit costs, limit `p`; 2 chunks mean the V placement, any other count the loop placement
  //! (`generate(s, o)` takes the placement from `o` instead).
  constexpr schedule generate(shape s) const {
    generate_options o;
    o.placement = s.chunks == 2 ? placement_kind::v : placement_kind::loop;
    return generate(s, o);
  }

  //! The best schedule found for costs `o.cost` under `o.mem_limit` (default `p`), on placement
  //! `o.placement`: loop with `s.chunks` chunks per rank (virtual stage `k*p + r` on rank `r`;
  //! chunks = 0 takes 1), or V with 2 (chunks = 0 takes 2). Throws `config_error` naming the
  //! rule for a bad cost or limit, `schedule_error` for a placement/chunk mismatch.
  constexpr schedule generate(shape s, const generate_options& o) const {
    if (s.chunks == 0) s.chunks = o.placement == placement_kind::v ? 2 : 1;
    if (auto r = check(s); !r.empty()) throw schedule_error(r);
    if (o.placement != placement_kind::loop && o.placement != placement_kind::v)
      throw schedule_error("zb-auto runs the loop or the v placement (got " + text(to_string(o.placement)) + ")");
    if (o.placement == placement_kind::v && s.chunks != 2)
      throw schedule_error("zb-auto with placement v runs 2 chunk(s) per rank (got chunks=" + detail::to_text(s.chunks) + ")");
    const placement_kind pk = o.placement;
    const schedule frame = make_schedule(name, s, pk == placement_kind::v ? 2 * s.ranks : s.chunks * s.ranks, pk);
    // With a stage- and link-resolved model (o.model), candidates are built from its per-share
    // means under the limit in units of the heaviest rank (detail::uniform_view) and scored under
    // the model itself, seeds from the fixed families included.
    const detail::options_view view = detail::uniform_view(o, frame);
    const bool staged = view.staged;
    const cost_model& fitted = view.fitted;
    const double model_limit = view.model_limit;
    const generate_options& uo = view.uniform;
    if (auto r = detail::zb_auto_check_options(uo, s.ranks); !r.empty()) throw config_error(r);
    const double limit = uo.mem_limit > 0 ? uo.mem_limit : s.ranks;
    const costs& k = uo.cost;
    auto score = [&](const schedule& cand, detail::zb_auto_score& sc) {
      return staged ? detail::zb_auto_score_of(cand, fitted, model_limit, sc) : detail::zb_auto_score_of(cand, k, limit, sc);
    };

    schedule best;
    detail::zb_auto_score best_score;
    bool have = false;
    auto consider = [&](schedule&& cand) {
      detail::zb_auto_score sc;
      if (!score(cand, sc)) return false;
      if (!have || sc.better_than(best_score)) {
        best = static_cast<schedule&&>(cand);
        best_score = sc;
        have = true;
        return true;
      }
      return false;
    };

    // Seeds: loom's fixed families on this placement and chunk count (fused backwards split, W
    // right after its B, and with ZB-H1's lag), whenever they fit the limit, so zb-auto is never
    // worse than any of them.
    auto seed = [&](auto family, int chunks) {
      const shape fs{s.ranks, s.microbatches, chunks};
      if (!loom::check(family, fs).empty()) return;
      const schedule fixed = family.generate(fs);
      // Only a family on exactly this placement (same stages on the same ranks) is a seed.
      if (fixed.placement != pk || fixed.stages != frame.stages || fixed.stage_to_rank != frame.stage_to_rank ||
          fixed.directions != 1)
        return;
      bool fused = false;
      for (auto const& prog : fixed.programs)
        for (auto const& a : prog) fused = fused || a.kind == op::BW || a.kind == op::FB;
      consider(detail::zb_auto_split_seed(fixed, name, false));
      if (fused) consider(detail::zb_auto_split_seed(fixed, name, true));
    };
    if (pk == placement_kind::loop && s.chunks == 1) {
      // And the Zero Bubble authors' heuristic in all 8 of its settings (zb_heuristics.hpp).
      seed(gpipe{}, 1);
      seed(one_f_one_b{}, 1);
      seed(gpipe_2bp{}, 1);
      seed(one_f_one_b_2bp{}, 1);
      seed(zb_h1{}, 1);
      seed(zb_h2{}, 1);
      for (int g = 0; g < 8; ++g) {
        schedule cand;
        const detail::zb_round_knobs kn{.warmup_until_arrival = (g & 4) == 0, .defer_forward = (g & 2) == 0,
                                        .fill_small_gaps = (g & 1) == 0};
        if (detail::zb_round_heuristic(name, s, k, limit, kn, cand)) consider(static_cast<schedule&&>(cand));
      }
    } else if (pk == placement_kind::loop) {
      seed(interleaved_1f1b{}, s.chunks);
      seed(looped_bfs{}, s.chunks);
    } else {
      seed(v_half{}, 2);
      seed(v_min{}, 2);
      seed(hanayo{}, 1);  // one wave: the V
      seed(dualpipe_v{}, 2);
    }
    if (pk == placement_kind::v && limit >= s.ranks - 1e-9) {
      // On the V placement, zb-v's cost-aware schedule (its greedy and the authors' V heuristic,
      // improved by local search under these costs) whenever the limit admits it (>= p units), so
      // zb-auto (v) is never worse than zb-v or the authors' ZB-V there.
      generate_options vo = uo;
      vo.mem_limit = limit;
      consider(zb_v{}.generate(s, vo));
    } else if (pk == placement_kind::v) {
      for (int fb = 0; fb < 4; ++fb) {
        schedule cand;
        if (detail::zbv_heuristic(name, s, k, limit, {.fill_b = fb < 2, .fill_f = fb % 2 == 0}, cand))
          consider(static_cast<schedule&&>(cand));
      }
    }
    // Grid over the heuristic's choices; remember the best greedy point for the local search.
    // Caps: none (memory only), or the warm-up count of Appendix B plus 0 or 1 (the paper's
    // "one more F that may delay the first B").
    detail::zb_auto_knobs best_kn;
    detail::zb_auto_score gbest;
    bool gh = false;
    std::vector<int> best_cap;
    const std::vector<int> caps[3] = {{}, detail::zb_auto_warmup_caps(s, pk, k, 0),
                                      detail::zb_auto_warmup_caps(s, pk, k, 1)};
    for (int g = 0; g < 16; ++g) {
      // g 0-7: warm-up caps (+0, +1); 8-11: caps +0 with 1F-1B-1W W-deferral (twice the tail);
      // 12-15: memory only.
      detail::zb_auto_knobs kn{.eager_w = (g & 1) != 0, .f_may_delay_b = (g & 2) == 0,
                               .w_defer = g >= 8 && g < 12 ? 2.0 : -1.0};
      const std::vector<int>& cap = g < 8 ? caps[1 + g / 4] : g < 12 ? caps[1] : caps[0];
      schedule cand = detail::zb_auto_build(name, s, pk, k, limit, kn, cap, nullptr);
      detail::zb_auto_score sc;
      if (!score(cand, sc)) continue;
      if (!gh || sc.better_than(gbest)) {
        gbest = sc;
        gh = true;
        best_kn = kn;
        best_cap = cap;
      }
      consider(static_cast<schedule&&>(cand));
    }
    // Local search: move one rank's in-flight cap by one at a time; keep improvements, until a
    // full pass improves nothing or the budget is spent.
    if (gh && !best_cap.empty()) {
      std::vector<int> cap = best_cap;
      detail::zb_auto_score cur = gbest;
      int budget = search_budget;
      bool improved = true;
      while (improved && budget > 0) {
        improved = false;
        for (int r = 0; r < s.ranks && budget > 0; ++r) {
          for (int d : {-1, 1}) {
            auto ur = static_cast<std::size_t>(r);
            if (cap[ur] + d < 1 || budget <= 0) continue;
            std::vector<int> trial = cap;
            trial[ur] += d;
            --budget;
            schedule cand = detail::zb_auto_build(name, s, pk, k, limit, best_kn, trial, nullptr);
            detail::zb_auto_score sc;
            if (!score(cand, sc)) continue;
            if (sc.better_than(cur)) {
              cur = sc;
              cap = trial;
              improved = true;
              consider(static_cast<schedule&&>(cand));
              break;
            }
          }
        }
      }
    }
    if (!have && staged)
      throw config_error("zb-auto found no schedule within mem-limit " + detail::real_text(model_limit) +
                         " under the cost model's stage activations");
    if (!have) throw schedule_error("zb-auto found no schedule within mem-limit (internal error)");
    // Critical-path moves on the best candidate (zb-v's local search, order_search.hpp).
    if (staged) detail::order_local_search(best, fitted, model_limit, order_budget);
    else detail::order_local_search(best, k, limit, order_budget);
    best.name = text(name);
    return best;
  }
};
static_assert(cost_aware_family<zb_auto>);

}  // namespace loom
