// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! PipeOffload's activation offload (Wan et al., "PipeOffload: Improving Scalability of Pipeline
//! Parallelism with Memory Optimization", ICML 2025, arXiv 2503.01328) as a plan over a timed
//! schedule: which activations leave device memory after their forward, when their copy to host
//! runs and when their copy back runs, and the per-rank peak activation that results.
//!
//! The rule is the authors' `add_offload` (sail-sg/zero-bubble-pipeline-parallelism, file
//! `megatron/core/pipeline_parallel/zerobubble/scheduler/offloading.py`, commit 39f2c186), which
//! loom rewrites from the rule:
//! - **Candidates.** The activations of the first `chunks` model chunks of every rank (stage
//!   c p + r with c < `chunks`, loop placement).
//! - **Times.** Each action's start and end as `simulate` gives them (the authors' `add_time` is the
//!   same as-soon-as-possible execution), then the warm-up forwards between a rank's forward of its
//!   last chunk for microbatch 0 and its first backward are postponed as late as their consumer and
//!   the first backward allow (ranks from the last down; one backward's time of slack kept).
//! - **Link.** Ranks 2i and 2i+1 share one host link (p must be even). A copy one way takes
//!   T = round(X `time`, 2), X the largest f + b + w of a stage; the link is cut into slots of 2T,
//!   the first half for a copy to host, the second for a copy back; rank 2i+1's slots start T later.
//! - **Slots.** An activation whose backward starts less than 3 slots (6T) plus one backward after
//!   its forward ends stays on the device. The others, in program order, each take the first free
//!   slot starting at or after its forward's end; in reverse program order, each copy back takes the
//!   latest free slot ending one backward's time before its backward starts, and must start after its
//!   copy to host ended (else the plan is refused, as the authors' scheduler refuses).
//! - **Warm-up.** Before the pair's first copy back, the copies to host run back to back in the
//!   pair's slot order at 0.7 T each (a link carrying one direction is faster), none before its
//!   forward ends.
//! - **Memory.** A copy to host frees its activation when it ends: before the first action of the
//!   rank that starts at or after that time. A copy back allocates it when it starts: before the
//!   first action that ends after that time. Events at one point are ordered by time, then
//!   frees before allocations. Peaks count the program with these events.
//! Times are `double`, in the authors' order of operations (their numbers at unit costs depend
//! on the rounding of the slot cursor); built without FMA contraction (`-ffp-contract=off`, the
//! same as no FMA instructions, x86-64's default target) the plan equals theirs bit for bit.
//!
//! ctest checks the plan's peaks and refusals against the authors' scheduler run on 112 cells
//! (p in {4, 8}, v in {2, 4}, m = 4p, every allowed group, 0..v offloaded chunks, offload times
//! 0.2 and 0.5, at unit costs and at costs 1000: tests/schedule/data/offload_reference.csv).
//! Runtime only (not constexpr): the authors' `round(x, 2)` is decimal rounding.
//!
//! `with_offload` turns the plan into actions of the program (`op::offload`, `op::reload`), each
//! issued where the plan starts it; `validate` checks them (rule 6) and `simulate` times them on
//! each rank's host link and counts their memory. The executors do not run them yet: they refuse
//! a program with host copies (docs/offload.md).
//!
//! The authors' pass then adds barriers that synchronise a pair before each copy; they change no
//! count and are not part of the plan (they refuse some shapes with b != f, which loom does not).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom {

//! What to offload: the first `chunks` model chunks of every rank (0: none), with `time` the
//! authors' `--offload-time`: one copy's time as a fraction of the largest f + b + w of a stage.
struct offload_options {
  int chunks = 0;
  double time = 0.2;
};

//! One copy on a host link: the activation of (`mb`, `stage`) on `rank`, to host (`reload`
//! false) or back, over [`start`, `end`). `position`: the index in the rank's program of the
//! first action that ends after `start`, before which `with_offload` issues the copy.
struct offload_copy {
  int rank = 0;
  int mb = 0;
  int stage = 0;
  bool reload = false;
  double start = 0;
  double end = 0;
  std::size_t position = 0;
};

//! The plan: the copies, and per rank the peak activation with them (loom's unit: one microbatch
//! through a rank's share) and without them. `ok` false: `error` says which rule refused.
//! `copy_time` is T, one copy's time on the link (0 when nothing is offloaded).
struct offload_plan {
  bool ok = false;
  text error;
  double copy_time = 0;
  std::vector<offload_copy> copies;
  std::vector<double> peak_activation;
  std::vector<double> peak_without;
};

namespace detail {

//! Python's `round(x, 2)` (correctly rounded decimal, ties to even on the binary value).
inline double round2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return std::strtod(buf, nullptr);
}

struct timed {
  action a;
  double start = 0, end = 0;
};

}  // namespace detail

//! PipeOffload's plan for schedule `s` under costs `k` (see the file comment). `s` must be on the
//! loop placement with a split backward and an even number of ranks.
inline offload_plan plan_offload(const schedule& s, const costs& k, offload_options o) {
  offload_plan out;
  const int P = s.ranks, S = s.stages, v = s.chunks, m = s.microbatches;
  auto fail = [&](text why) {
    out.ok = false;
    out.error = why;
    return out;
  };
  if (o.chunks < 0 || o.chunks > v)
    return fail("offload needs 0 <= offloaded chunks <= chunks per rank = " + detail::to_text(v) + " (got " + detail::to_text(o.chunks) + ")");
  if (!(o.time > 0) || !detail::finite(o.time)) return fail("offload time must be a finite number > 0 (got " + detail::real_text(o.time) + ")");
  if (s.placement != placement_kind::loop) return fail("offload plans the loop placement only");
  const simulation sim = simulate(s, k);
  if (!sim.ok) return fail("the schedule does not run: " + sim.error);
  // The simulator's own durations and memory rule, so the plan counts what `simulate` counts.
  const detail::uniform_cost_view view(k, s.stage_fraction());
  out.peak_without = sim.peak_activation;
  if (o.chunks == 0) {
    out.ok = true;
    out.peak_activation = sim.peak_activation;
    return out;
  }
  if (P % 2 != 0) return fail("offload pairs ranks on a host link and needs an even number of ranks (got " + detail::to_text(P) + ")");

  // Per rank: the actions with their times, then the warm-up postponement.
  std::vector<std::vector<detail::timed>> nodes(static_cast<std::size_t>(P));
  // where_f[stage * m + mb] = (rank, index) of that forward
  auto slot = [&](int st, int mb) { return static_cast<std::size_t>(st) * static_cast<std::size_t>(m) + static_cast<std::size_t>(mb); };
  std::vector<std::pair<int, int>> where_f(static_cast<std::size_t>(S * m), {-1, -1});
  for (int rk = 0; rk < P; ++rk) {
    const auto& prog = s.programs[static_cast<std::size_t>(rk)];
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const action& a = prog[i];
      if (a.kind == op::BW)
        return fail("offload plans a split backward (B, then W): schedule " + s.name + " fuses them (" + to_string(a) + ")");
      if (a.kind != op::F && a.kind != op::B && a.kind != op::W)
        return fail("offload plans forwards and backwards only (got " + to_string(a) + ")");
      nodes[static_cast<std::size_t>(rk)].push_back({a, sim.times[static_cast<std::size_t>(rk)][i].start, sim.times[static_cast<std::size_t>(rk)][i].end});
      const int idx = static_cast<int>(nodes[static_cast<std::size_t>(rk)].size()) - 1;
      if (a.kind == op::F) where_f[slot(a.stage, a.mb)] = {rk, idx};
    }
  }
  auto node_at = [&](std::pair<int, int> w) -> detail::timed& { return nodes[static_cast<std::size_t>(w.first)][static_cast<std::size_t>(w.second)]; };
  for (int rk = P - 1; rk >= 0; --rk) {
    auto& ns = nodes[static_cast<std::size_t>(rk)];
    std::size_t first_b = ns.size();
    for (std::size_t i = 0; i < ns.size(); ++i)
      if (ns[i].a.kind == op::B || ns[i].a.kind == op::BW) {
        first_b = i;
        break;
      }
    if (first_b == ns.size()) continue;
    double cur = ns[first_b].start - (ns[first_b].end - ns[first_b].start);
    for (std::size_t i = first_b; i-- > 0;) {
      detail::timed& n = ns[i];
      if (n.a.kind == op::F && n.a.stage / P == v - 1 && n.a.mb == 0) break;
      if (n.a.kind != op::F || n.a.stage + 1 >= S) return fail("offload: a warm-up action has no next stage to wait for (" + to_string(n.a) + ")");
      const detail::timed& nx = node_at(where_f[slot(n.a.stage + 1, n.a.mb)]);
      const double d = n.end - n.start;
      const double a1 = (nx.start - k.c) - d, a2 = cur - d;
      const double st = a1 < a2 ? a1 : a2;
      if (st > n.start) {
        n.start = st;
        n.end = st + d;
      }
      cur = n.start;
    }
  }

  // Transfer times (every stage takes the same f + b + w under uniform costs).
  const double X = (view.plain(op::F, 0) + view.plain(op::B, 0)) + view.plain(op::W, 0);
  const double T = detail::round2(X * o.time), solo = T * 0.7;
  out.copy_time = T;
  if (!(T > 0)) return fail("offload: one copy would take " + detail::real_text(T) + " (the offload time times f + b + w of a stage, rounded to 0.01): nothing can be planned");

  struct pass {
    int index = 0;
    bool reload = false;
    std::size_t node = 0;  // the F (copy to host) or the B (copy back)
    int stage = 0, mb = 0;
    double start = 0, end = 0;
  };
  auto offloadable = [&](const action& a) { return a.stage / P < o.chunks; };
  // One rank's slots (the authors' add_send_recv).
  auto slots = [&](int rk, double start, std::vector<pass>& queue) -> text {
    const auto& ns = nodes[static_cast<std::size_t>(rk)];
    const double h2d = T, d2h = T;
    std::vector<double> fend(static_cast<std::size_t>(S * m), 0.0);
    std::vector<char> invalid(static_cast<std::size_t>(S * m), 0);
    for (const auto& n : ns)
      if (n.a.kind == op::F && offloadable(n.a)) fend[slot(n.a.stage, n.a.mb)] = n.end;
    for (const auto& n : ns)
      if (n.a.kind == op::B && offloadable(n.a))
        if ((n.start - (n.end - n.start)) - fend[slot(n.a.stage, n.a.mb)] <= (h2d + d2h) * 3) invalid[slot(n.a.stage, n.a.mb)] = 1;
    std::vector<pass> sends;
    std::vector<double> send_start(static_cast<std::size_t>(S * m), 0.0);
    double cur = start;
    int idx = 0;
    for (std::size_t i = 0; i < ns.size(); ++i) {
      const auto& n = ns[i];
      if (n.a.kind != op::F || !offloadable(n.a) || invalid[slot(n.a.stage, n.a.mb)]) continue;
      while (cur < n.end) {
        cur += h2d + d2h;
        idx += 2;
      }
      send_start[slot(n.a.stage, n.a.mb)] = cur;
      sends.push_back({idx, false, i, n.a.stage, n.a.mb, cur, cur + d2h});
      cur += h2d + d2h;
      idx += 2;
    }
    while (cur < ns.back().end) {
      cur += h2d + d2h;
      idx += 2;
    }
    std::vector<pass> recvs;
    for (std::size_t i = ns.size(); i-- > 0;) {
      const auto& n = ns[i];
      if (n.a.kind != op::B || !offloadable(n.a) || invalid[slot(n.a.stage, n.a.mb)]) continue;
      while (cur > n.start - (n.end - n.start)) {
        cur -= h2d + d2h;
        idx -= 2;
      }
      if (!(cur - h2d > send_start[slot(n.a.stage, n.a.mb)] + d2h))
        return "offload: rank " + detail::to_text(rk) + " cannot copy the activation of " + to_string(forward(n.a.mb, n.a.stage)) +
               " back before its backward after copying it out (offload fewer chunks or use a faster host link)";
      recvs.push_back({idx - 1, true, i, n.a.stage, n.a.mb, cur - h2d, cur});
      cur -= h2d + d2h;
      idx -= 2;
    }
    queue = sends;
    for (std::size_t i = recvs.size(); i-- > 0;) queue.push_back(recvs[i]);
    std::sort(queue.begin(), queue.end(), [](const pass& x, const pass& y) { return x.index < y.index; });  // indices are unique
    return {};
  };

  std::vector<std::vector<pass>> queues(static_cast<std::size_t>(P));
  for (int pr = 0; pr < P; pr += 2) {
    auto& n0 = nodes[static_cast<std::size_t>(pr)];
    if (n0.empty() || n0[0].a.kind != op::F) return fail("offload: rank " + detail::to_text(pr) + " does not start with a forward");
    const double S0 = n0[0].end;
    auto& q0 = queues[static_cast<std::size_t>(pr)];
    auto& q1 = queues[static_cast<std::size_t>(pr + 1)];
    if (text e = slots(pr, S0, q0); !e.empty()) return fail(e);
    if (text e = slots(pr + 1, S0 + T, q1); !e.empty()) return fail(e);
    if (q0.empty()) return fail("offload: rank " + detail::to_text(pr) + " has no activation that lives long enough to offload");
    // The warm-up: the pair's copies to host back to back at the solo speed until its first copy back.
    int lim = q0.back().index;
    for (int rho = 0; rho < 2; ++rho)
      for (const pass& ps : rho == 0 ? q0 : q1)
        if (ps.index % 2 != 0) lim = ps.index + rho < lim ? ps.index + rho : lim;
    double cur = q0[0].start;
    int ci = q0[0].index;
    std::size_t pos[2] = {0, 0};
    while (ci < lim) {
      for (int rho = 0; rho < 2; ++rho) {
        auto& qq = rho == 0 ? q0 : q1;
        if (pos[rho] >= qq.size()) return fail("offload: rank " + detail::to_text(pr + rho) + " has too few activations to offload in the warm-up");
        pass& ps = qq[pos[rho]];
        if (ps.index + rho == ci) {
          const double fe = nodes[static_cast<std::size_t>(pr + rho)][ps.node].end;
          cur = cur > fe ? cur : fe;
          if (!(cur <= ps.start)) return fail("offload: the warm-up copies of ranks " + detail::to_text(pr) + " and " + detail::to_text(pr + 1) + " do not fit their slots");
          ps.start = cur;
          ps.end = cur + solo;
          ++pos[rho];
          cur += solo;
        }
      }
      ++ci;
    }
  }

  // Memory: the events in program order, per rank.
  out.peak_activation.assign(static_cast<std::size_t>(P), 0.0);
  for (int rk = 0; rk < P; ++rk) {
    const auto& ns = nodes[static_cast<std::size_t>(rk)];
    const auto& qq = queues[static_cast<std::size_t>(rk)];
    // The authors' lists: per pass in index order, a copy to host gives (left: its start, no
    // memory effect; right: its end, free); a copy back gives (left: its start, allocate; right:
    // its start, no memory effect). Markers without an effect still block the heads they sit in.
    struct mk {
      double time;
      int priority;  // authors' priorities: 0 send start, 1 send end, 2 recv prep, 3 recv start
      double effect;
    };
    std::vector<mk> l, rt;
    const std::size_t base = out.copies.size();  // l[k] is the start of copy base + k
    for (const pass& ps : qq) {
      if (!ps.reload) {
        l.push_back({ps.start, 0, 0.0});
        rt.push_back({ps.end, 1, -view.alloc(ps.stage)});
        out.copies.push_back({rk, ps.mb, ps.stage, false, ps.start, ps.end});
      } else {
        l.push_back({ps.start, 2, view.alloc(ps.stage)});
        rt.push_back({ps.start, 3, 0.0});
        out.copies.push_back({rk, ps.mb, ps.stage, true, ps.start, ps.end});
      }
    }
    double live = 0, peak = 0;
    std::size_t li = 0, ri = 0;
    std::vector<mk> pending;
    auto apply = [&](double x) {
      live += x;
      peak = live > peak ? live : peak;
    };
    for (std::size_t at = 0; at < ns.size(); ++at) {
      const auto& n = ns[at];
      while (ri < rt.size() && !(rt[ri].time > n.start)) pending.push_back(rt[ri++]);
      while (li < l.size() && !(l[li].time >= n.end)) {
        out.copies[base + li].position = at;
        pending.push_back(l[li++]);
      }
      // A stable sort by (time, priority), as the authors': an insertion sort (a handful of markers).
      for (std::size_t i = 1; i < pending.size(); ++i)
        for (std::size_t j = i; j > 0; --j) {
          const mk& x = pending[j - 1];
          const mk& y = pending[j];
          if (!(y.time < x.time || (y.time == x.time && y.priority < x.priority))) break;
          std::swap(pending[j - 1], pending[j]);
        }
      for (const mk& e : pending) apply(e.effect);
      pending.clear();
      apply(n.a.kind == op::F ? view.alloc(n.a.stage) : -view.release(n.a.kind, n.a.stage));
    }
    if (ri < rt.size() || li < l.size())
      return fail("offload: a copy on rank " + detail::to_text(rk) + " ends after the rank's last action");
    out.peak_activation[static_cast<std::size_t>(rk)] = peak;
  }
  out.ok = true;
  return out;
}

//! `s` with the plan's copies as actions (`offload`, `reload`): each copy issued before the
//! action at its `position` in its rank's program (copies at one position in the plan's order).
//! The result validates when `s` does; `simulate` then runs the copies on each rank's host link
//! at the costs' `h` and counts their memory (simulate.hpp). Throws `config_error` for a refused
//! plan or a plan of another shape.
inline schedule with_offload(const schedule& s, const offload_plan& plan) {
  if (!plan.ok) throw config_error("with_offload: the plan was refused: " + plan.error);
  if (plan.peak_activation.size() != static_cast<std::size_t>(s.ranks) || s.programs.size() != static_cast<std::size_t>(s.ranks))
    throw config_error("with_offload: the plan has " + detail::to_text(static_cast<long long>(plan.peak_activation.size())) +
                       " ranks, the schedule " + detail::to_text(s.ranks));
  std::vector<std::vector<const offload_copy*>> at(static_cast<std::size_t>(s.ranks));
  for (const offload_copy& c : plan.copies) {
    if (c.rank < 0 || c.rank >= s.ranks || c.position > s.programs[static_cast<std::size_t>(c.rank)].size())
      throw config_error("with_offload: a copy of the plan names rank " + detail::to_text(c.rank) + " position " +
                         detail::to_text(static_cast<long long>(c.position)) + ", outside the schedule");
    at[static_cast<std::size_t>(c.rank)].push_back(&c);
  }
  schedule out = s;
  for (std::size_t r = 0; r < at.size(); ++r) {
    auto& cs = at[r];
    // By position, then the plan's order (the pointers point into one vector).
    std::sort(cs.begin(), cs.end(), [](const offload_copy* x, const offload_copy* y) {
      return x->position < y->position || (x->position == y->position && x < y);
    });
    auto const& in = s.programs[r];
    auto& prog = out.programs[r];
    prog.clear();
    prog.reserve(in.size() + cs.size());
    std::size_t k = 0;
    for (std::size_t i = 0; i <= in.size(); ++i) {
      for (; k < cs.size() && cs[k]->position == i; ++k)
        prog.push_back(cs[k]->reload ? reload_from_host(cs[k]->mb, cs[k]->stage) : offload_to_host(cs[k]->mb, cs[k]->stage));
      if (i < in.size()) prog.push_back(in[i]);
    }
  }
  return out;
}

}  // namespace loom
