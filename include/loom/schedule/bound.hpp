// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! A certified lower bound on the makespan, the longest rank span and the bubble rate of every
//! valid schedule on a given placement, under given costs `(f, b, w, c)`, a per-rank activation
//! limit and `M_W/M_B`: no order of the passes can beat it (`loom::lower_bound`). The gap of a
//! schedule to it tells how much any search could still gain. No peer reports such a number.
//!
//! Model: ARCHITECTURE.md's (a rank runs its program in order; a pass starts when its rank is free
//! and its inputs have arrived, `c` after they end on another rank; `F` allocates `q` units, `B`
//! releases `(1-r)q`, `W` the rest). The bound holds for every program order with the same
//! placement (stages on ranks, microbatch directions) and for fused `BW` as well as split `B`/`W`
//! passes. With overlapped `FB` passes and `0 <= fb < f+b+w` it takes the overlap into account
//! (work `min(fb, f+b+w)` per pair, chain passes no longer than `fb`).
//!
//! Per rank `r` (`N` microbatch-stages, work `N q (f+b+w)`; `σ`/`τ` its shallowest/deepest stage
//! on a microbatch's path), three facts, each a consequence of the dependencies and the limit `L`:
//!
//! 1. **Head.** Its first pass is an `F` of stage `σ`. Its first backward, of some microbatch `j`
//!    at a stage `s` of the rank, waits for `F(j, σ)` and the whole chain `F(j, σ+1..S-1)`,
//!    `B(j, S-1..s+1)` with a latency `c` at every change of rank, so it starts at least
//!    `H = q f + chain(σ → S-1 → τ)` after the rank's first pass. Until then the rank can only run
//!    forwards, and nothing is released before a backward, so at most `k = floor(L/q)` of them: it
//!    idles at least `H - k q f` there (the Zero Bubble paper's Appendix B argument, any placement).
//! 2. **Tail.** After its last `F` (of some microbatch `j`, at stage `τ`) the rank must still run
//!    `B(j, σ)` and its `W`, which wait for the chain `F(j, τ+1..S-1)`, `B(j, S-1..σ+1)`: at least
//!    `T = chain(τ → S-1 → σ) + q(b+w)` until its end. What it can run meanwhile is only the work
//!    it holds activations for: with `n_b` microbatch-stages awaiting their `B` and `n_w` their `W`,
//!    `q n_b + r q n_w <= L`, at most `n_b q(b+w) + n_w q w`; it idles at least `T` minus the most of
//!    that over the feasible `(n_b >= 1, n_w)`.
//! 3. The two windows are disjoint when some forward runs after the first backward; otherwise (all
//!    `N` forwards first, possible only if `N q <= L`) the span is at least
//!    `max(N q f + T, H + N q(b+w), N q (f+b+w))`. The rank's bound is the smaller of the two cases.
//!
//! The longest span is at least the largest per-rank bound; the makespan at least, for each rank,
//! its bound plus the forward chain before its first pass can start, and at least one
//! microbatch's whole chain; the bubble rate at least `1 - busy / (P * longest span bound)`.
//! At the loop placement with one stage per rank and limit `p` this is exactly ZB-H1's rank-0
//! bubble `(p-1)(f+b-w+4c)` whenever `(b+w) >= w/r` (holding a B is worth more than deferring Ws),
//! which proves ZB-H1 optimal there; with more memory the bound tends to zero bubble.

#include <cstddef>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/shape.hpp"

namespace loom {

//! A certified lower bound (see the file comment) for one placement, costs and limit.
struct schedule_bound {
  double makespan = 0;     //!< no valid schedule ends sooner after it starts
  double max_span = 0;     //!< no valid schedule has a shorter longest rank span
  double bubble_rate = 0;  //!< no valid schedule has a lower bubble rate (1 - busy / (P * max span))
  double mem_limit = 0;    //!< the per-rank limit it assumed (0: none)
  std::vector<double> span;  //!< per rank: no valid schedule has a shorter span on that rank
};

namespace detail {

//! Largest `n_b q (b+w) + n_w q w` over integers `1 <= n_b`, `n_w >= 0`, `n_b + n_w <= n`,
//! `q n_b + r q n_w <= limit` (`limit <= 0`: no limit): the most backward work a rank holding at
//! most `limit` units can have pending.
constexpr double bound_pending_work(int n, double q, double b, double w, double r, double limit) {
  if (limit <= 0) return n * q * (b + w);
  double best = q * (b + w);  // n_b = 1 always fits a rank that ran a forward
  const int nb_max = static_cast<int>(limit / q + 1e-9) < n ? static_cast<int>(limit / q + 1e-9) : n;
  for (int nb = 1; nb <= nb_max; ++nb) {
    int nw = n - nb;
    if (r > 0) {
      const double room = (limit - q * nb) / (r * q) + 1e-9;
      const int fit = room < 0 ? 0 : static_cast<int>(room);
      nw = fit < nw ? fit : nw;
    }
    const double v = nb * q * (b + w) + nw * q * w;
    best = v > best ? v : best;
  }
  return best;
}

}  // namespace detail

//! The certified lower bound for schedules on `placement`'s placement (its ranks, stages, stage
//! ranks, microbatch directions and, for the overlap rule, whether it has `FB` passes; its order
//! is not used) under costs `k` and per-rank activation limit `mem_limit` (units of
//! ARCHITECTURE.md; `<= 0`: no limit).
constexpr schedule_bound lower_bound(const schedule& placement, const costs& k, double mem_limit) {
  schedule_bound out;
  const int P = placement.ranks, S = placement.stages, M = placement.microbatches;
  const int D = placement.directions < 1 ? 1 : placement.directions;
  out.mem_limit = mem_limit > 0 ? mem_limit : 0;
  out.span.assign(static_cast<std::size_t>(P > 0 ? P : 0), 0.0);
  if (P < 1 || S < 1 || M < 1) return out;
  const double q = placement.stage_fraction();
  const double L = mem_limit > 0 ? mem_limit : 0;
  const double r = k.mem_w_ratio;
  bool overlapped = false;
  for (auto const& prog : placement.programs)
    for (auto const& a : prog) overlapped = overlapped || a.kind == op::FB;
  const double full = k.f + k.b + k.w;
  const bool credit = overlapped && k.fb >= 0 && k.fb < full;
  // Durations a pass on another rank's chain can take at least (an overlapped pair ends both).
  const double fq = q * (credit && k.fb < k.f ? k.fb : k.f);
  const double bq = q * (credit && k.fb < k.b ? k.fb : k.b);
  const double work_per = q * (credit ? k.fb : full);  // per microbatch-stage, at least

  std::vector<int> mbs(static_cast<std::size_t>(D), 0);
  for (int mb = 0; mb < M; ++mb) {
    const int d = placement.direction_of(mb);
    if (d >= 0 && d < D) ++mbs[static_cast<std::size_t>(d)];
  }
  auto rank_at = [&](int d, int st) { return placement.stage_to_rank[static_cast<std::size_t>(d * S + st)]; };
  auto hop = [&](int d, int a, int b) { return rank_at(d, a) != rank_at(d, b) ? k.c : 0.0; };
  // Forward chain from the end of F(a) to the end of F(b), a <= b.
  auto ff = [&](int d, int a, int b) {
    double t = 0;
    for (int s = a + 1; s <= b; ++s) t += hop(d, s - 1, s) + fq;
    return t;
  };
  // From the end of F(S-1) to the start of B(s): B(S-1..s+1) and the hops down to s.
  auto bb = [&](int d, int s) {
    double t = 0;
    for (int x = S - 1; x > s; --x) t += bq + hop(d, x - 1, x);
    return t;
  };

  double max_span = 0, makespan = 0, busy_total = 0;
  // One microbatch's whole chain.
  for (int d = 0; d < D; ++d)
    if (mbs[static_cast<std::size_t>(d)] > 0) {
      const double chain = q * k.f + ff(d, 0, S - 1) + bb(d, 0) + q * (k.b + k.w);
      makespan = chain > makespan ? chain : makespan;
    }
  for (int rk = 0; rk < P; ++rk) {
    int n = 0;
    double head = -1, tail = -1, before = -1;
    for (int d = 0; d < D; ++d) {
      const int md = mbs[static_cast<std::size_t>(d)];
      if (md == 0) continue;
      int lo = -1, hi = -1;
      for (int st = 0; st < S; ++st)
        if (rank_at(d, st) == rk) {
          if (lo < 0) lo = st;
          hi = st;
          n += md;
        }
      if (lo < 0) continue;
      const double h = q * k.f + ff(d, lo, S - 1) + bb(d, hi);
      const double t = ff(d, hi, S - 1) + bb(d, lo) + q * (k.b + k.w);
      head = head < 0 || h < head ? h : head;
      tail = tail < 0 || t < tail ? t : tail;
      // The chain before F(lo) can start: F(0..lo-1) and their hops.
      double start = 0;
      for (int s = 0; s < lo; ++s) start += fq + hop(d, s, s + 1);
      before = before < 0 || start < before ? start : before;
    }
    if (n == 0) continue;
    const double work = n * work_per;
    busy_total += n * q * full;
    const int fit = L > 0 ? static_cast<int>(L / q + 1e-9) : n;
    // Case A: some forward after the first backward (needs n >= 2).
    double bound = -1;
    if (n >= 2) {
      const int k_head = fit < n - 1 ? fit : n - 1;
      const double idle_head = head - k_head * q * k.f;
      const double idle_tail = tail - detail::bound_pending_work(n, q, k.b, k.w, r, L);
      bound = work + (idle_head > 0 ? idle_head : 0) + (idle_tail > 0 ? idle_tail : 0);
    }
    // Case B: every forward before the first backward (needs all n activations to fit).
    if (fit >= n || n == 1) {
      double b2 = n * q * full;
      const double x1 = n * q * k.f + tail, x2 = head + n * q * (k.b + k.w);
      b2 = x1 > b2 ? x1 : b2;
      b2 = x2 > b2 ? x2 : b2;
      bound = bound < 0 || b2 < bound ? b2 : bound;
    }
    // Drains: the last B at a stage s' on rank ρ ends after every F of its direction on ρ and every
    // B at stages >= s' there; its backward chain then reaches this rank's shallowest stage, whose
    // W ends the rank. Rank ρ (deeper on the path) starts no earlier than the forward chain from
    // this rank allows. (Not with overlapped pairs shorter than their parts.)
    if (!credit)
      for (int d = 0; d < D; ++d) {
        const int md = mbs[static_cast<std::size_t>(d)];
        if (md == 0) continue;
        int lo = -1;
        for (int st = 0; st < S && lo < 0; ++st)
          if (rank_at(d, st) == rk) lo = st;
        if (lo < 0) continue;
        for (int sp = lo; sp < S; ++sp) {
          const int rho = rank_at(d, sp);
          int rho_lo = -1, n_f = 0, n_b = 0;
          for (int st = 0; st < S; ++st)
            if (rank_at(d, st) == rho) {
              if (rho_lo < 0) rho_lo = st;
              ++n_f;
              n_b += st >= sp ? 1 : 0;
            }
          if (rho != rk && rho_lo <= lo) continue;  // ρ may start before this rank
          const double offset = rho == rk ? 0.0 : ff(d, lo, rho_lo);
          double chain = 0;
          for (int y = sp - 1; y >= lo; --y) chain += hop(d, y, y + 1) + bq;
          const double drain = offset + md * q * (k.f * n_f + k.b * n_b) + chain + q * k.w;
          bound = drain > bound ? drain : bound;
        }
      }
    out.span[static_cast<std::size_t>(rk)] = bound;
    max_span = bound > max_span ? bound : max_span;
    const double ms = before + bound;
    makespan = ms > makespan ? ms : makespan;
  }
  out.max_span = max_span;
  out.makespan = makespan > max_span ? makespan : max_span;
  const double rate = max_span > 0 ? 1 - busy_total / (P * max_span) : 0;
  out.bubble_rate = rate > 0 ? rate : 0;
  return out;
}

}  // namespace loom
