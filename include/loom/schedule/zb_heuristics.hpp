// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The Zero Bubble authors' two constructive heuristics, as loom seeds: every schedule they
//! produce is a candidate of `zb-auto` (loop and V placements) and of cost-aware `zb-v`, so those
//! are never worse than them (loom's searches then improve on the best seed).
//!
//! Paper: Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv:2401.10241),
//! §3.1 (the heuristic) and §6 (ZB-V). The paper describes the heuristic in prose; its exact
//! rules are those of the authors' released scheduler (sail-sg/zero-bubble-pipeline-parallelism,
//! `zerobubble/scheduler/zb.py` `Graph.manual_order` and `zbv.py` `PipelineGraph.try_v_schedule`,
//! commit 39f2c186), which loom re-implements from their description here. Both build per-rank
//! op orders while tracking the time every pass would end under the normative model
//! (ARCHITECTURE.md: a pass starts when its rank is free and its producer's output has arrived,
//! `c` after it ends on another rank), so the times they track equal `loom::simulate`'s.
//!
//! **Loop placement, one stage per rank** (`zb_round_heuristic`). The construction proceeds in
//! rounds, one per microbatch `i`:
//! - round 0 runs `F(·, 0)` on every stage, then sizes each stage's warm-up: walking the first
//!   backward up from the last stage, stage `j` takes as many further forwards as fit under the
//!   memory limit and end before `B(j+1, 0)`'s gradient can arrive (`warmup_until_arrival`) or
//!   start before it (otherwise); a stage never warms up more than the one before it (strictly
//!   fewer, where the count is positive); then every stage runs its warm-up forwards and `B(·, 0)`
//!   from the last stage up;
//! - round `i > 0`: every stage that has forwards left runs one more `F` (with `defer_forward`, a
//!   stage two or more forwards ahead of the next skips it when the next stage's `F` + `B` would
//!   otherwise leave it idle beyond the largest bubble so far); a stage runs `F` only if every
//!   later stage does; then `B(·, i)` from the last stage up;
//! - before a pass: `W`s while the pass's activation would exceed the limit (the memory
//!   sort-out); `W`s that end before the pass's input can arrive; and one more `W` into the
//!   remaining wait if that wait exceeds the stage's allowance (largest bubble so far minus its
//!   own), or, with `fill_small_gaps`, in any case; on stage 0, once its forwards are done, every
//!   pending `W` before its `B`; the rest at the end.
//!
//! The authors keep the best of the 8 settings of the three switches (`initial_solution`); so does
//! `zb-auto`. A setting that cannot meet the limit (no `W` left to release memory) yields nothing.
//!
//! **V placement** (`zbv_heuristic`; costs per chunk pass are half a rank's share). Warm-up: every
//! rank runs its first chunk-0 forward; from the tip of the V back to rank 0, rank `r` runs
//! further chunk-0 forwards (together with every rank before it) while their activations and the
//! room their chunk-1 forwards will need fit the limit and it would otherwise wait for its first
//! chunk-1 forward, then that forward; later ranks catch up with rank `r-1`'s count of forwards.
//! Then `2m` rounds: each round every rank runs one `B` (chunk 1's, whose gradient comes back up
//! the V, when its input exists or chunk 0 is done, else chunk 0's) and then one `F` (chunk 1's
//! when its input exists, else chunk 0's when possible); before each pass the memory sort-out and
//! the gap fill with `W`s as for the loop placement, the fill before `B`/`F` passes governed by
//! `fill_b`/`fill_f`. A finished run is run again with its per-rank bubbles as allowances (a rank
//! may idle up to the largest bubble minus its own) while that lowers the largest bubble; the
//! first run that does not improve ends the chain. The authors keep the best of the four
//! `fill_b` × `fill_f` settings; so do `zb-v` and `zb-auto` (V).
//!
//! A run that breaks a precondition (a pass whose input does not exist yet, a limit that cannot
//! be met) yields nothing, as the authors' code rejects it.

#include <cstddef>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/shape.hpp"

namespace loom::detail {

//! The three switches of the loop-placement heuristic (the authors' names in parentheses).
struct zb_round_knobs {
  bool warmup_until_arrival = false;  //!< warm-up forwards may end as late as the gradient arrives (allow_bubble_before_first_b)
  bool defer_forward = false;         //!< a stage ahead of the next may skip a round's F (prioritize_b)
  bool fill_small_gaps = true;        //!< fill a wait within the stage's allowance with a W too (no_bubble_greedy)
};

//! Builds the loop-placement heuristic's order for shape `s` (one stage per rank) under costs `k`
//! and the per-rank activation limit `limit`; false when the setting cannot meet the limit.
constexpr bool zb_round_heuristic(std::string_view name, shape s, const costs& k, double limit, const zb_round_knobs& kn,
                                  schedule& out) {
  const int P = s.ranks, M = s.microbatches;
  out = make_schedule(name, shape{P, M, 1}, P, placement_kind::loop);
  const auto uP = static_cast<std::size_t>(P);
  const double cost[3] = {k.f, k.b, k.w};
  const double mem[3] = {1.0, -(1.0 - k.mem_w_ratio), -k.mem_w_ratio};
  const double c = k.c;
  // Per stage: counts of F, B, W, the end of its last pass, its live memory and its bubble.
  std::vector<int> cnt(uP * 3, 0);
  std::vector<double> e(uP, 0.0), live(uP, 0.0), bubble(uP, 0.0);
  // End time of every pass, [kind][stage][mb] (0 until placed, as the construction reads it).
  std::vector<double> t(static_cast<std::size_t>(3) * uP * static_cast<std::size_t>(M), 0.0);
  auto at = [&](int kind, int st, int mb) -> double& {
    return t[(static_cast<std::size_t>(kind) * uP + static_cast<std::size_t>(st)) * static_cast<std::size_t>(M) +
             static_cast<std::size_t>(mb)];
  };
  auto n = [&](int st, int kind) -> int& { return cnt[static_cast<std::size_t>(st) * 3 + static_cast<std::size_t>(kind)]; };
  auto max_bubble = [&] {
    double mx = 0;
    for (double v : bubble) mx = v > mx ? v : mx;
    return mx;
  };
  for (auto& prog : out.programs) prog.reserve(static_cast<std::size_t>(3 * M));
  auto put = [&](int st, int kind) {
    const auto us = static_cast<std::size_t>(st);
    const int mb = n(st, kind);
    double end = e[us] + cost[kind];
    const double no_wait = end;
    if (st > 0 && kind == 0) {
      const double a = at(0, st - 1, mb) + c + cost[kind];
      end = a > end ? a : end;
    }
    if (st < P - 1 && kind == 1) {
      const double a = at(1, st + 1, mb) + c + cost[kind];
      end = a > end ? a : end;
    }
    if (n(st, 0) > 0) bubble[us] += end - no_wait;
    e[us] = end;
    at(kind, st, mb) = end;
    live[us] += mem[kind];
    ++n(st, kind);
    out.programs[us].push_back(kind == 0 ? forward(mb, st) : kind == 1 ? backward_input(mb, st) : backward_weight(mb, st));
  };
  // W's before a pass on stage `st` whose input arrives at `arrival`: those that end in time, then
  // one into the remaining wait if it exceeds the stage's allowance (or, with fill_small_gaps, always).
  auto fill = [&](int st, double arrival) {
    const auto us = static_cast<std::size_t>(st);
    while (n(st, 2) < n(st, 1) && e[us] + cost[2] <= arrival) put(st, 2);
    if (n(st, 2) < n(st, 1) && e[us] < arrival) {
      if (arrival - e[us] <= max_bubble() - bubble[us]) {
        if (kn.fill_small_gaps) put(st, 2);
      } else {
        put(st, 2);
      }
    }
  };
  // W's until a pass allocating `need` fits; false if none is left.
  auto make_room = [&](int st, double need) {
    while (live[static_cast<std::size_t>(st)] + need > limit) {
      if (n(st, 2) >= n(st, 1)) return false;
      put(st, 2);
    }
    return true;
  };

  std::vector<int> req(uP, 0);
  for (int i = 0; i < M; ++i) {
    if (i == 0) {
      for (int j = 0; j < P; ++j) put(j, 0);
      for (auto& x : req) x = 0;
      double last_t = 0;
      for (int j = P - 1; j >= 0; --j) {
        const auto uj = static_cast<std::size_t>(j);
        if (j == P - 1) {
          last_t = at(0, j, i) + cost[1];
          continue;
        }
        double m_j = live[uj], busy = e[uj];
        while (n(j, 0) + req[uj] < M && m_j + mem[0] <= limit) {
          if (kn.warmup_until_arrival ? busy + cost[0] > last_t + c : busy >= last_t + c) break;
          m_j += mem[0];
          busy += cost[0];
          ++req[uj];
        }
        const double arrive = last_t + c;
        last_t = (busy > arrive ? busy : arrive) + cost[1];
      }
      for (int j = 1; j < P; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        while (req[uj] > 0 && req[uj] >= req[uj - 1] && n(j, 0) + req[uj] < M) --req[uj];
      }
      for (int j = 0; j < P; ++j)
        for (int x = 0; x < req[static_cast<std::size_t>(j)]; ++x) put(j, 0);
      for (int j = P - 1; j >= 0; --j) put(j, 1);
      continue;
    }
    for (auto& x : req) x = 0;
    for (int j = 0; j < P; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      if (n(j, 0) >= M) continue;
      if (j + 1 < P && n(j, 0) >= n(j + 1, 0) + 2 && kn.defer_forward) {
        const double next_plus_fb = e[uj + 1] + cost[0] + cost[1] + c;
        if (e[uj] >= next_plus_fb) continue;
        double w_cost = 0, mem_with_w = live[uj] + mem[0];
        for (int w = 0; mem_with_w > limit && n(j, 2) + w < n(j, 1); ++w) {
          w_cost += cost[2];
          mem_with_w += mem[2];
        }
        if (e[uj] + cost[0] + w_cost <= next_plus_fb) {
          req[uj] = 1;
          continue;
        }
        if (next_plus_fb - e[uj] <= max_bubble() - bubble[uj]) continue;
      }
      req[uj] = 1;
    }
    for (int j = P - 2; j >= 0; --j) {
      const auto uj = static_cast<std::size_t>(j);
      req[uj] = req[uj] < req[uj + 1] ? req[uj] : req[uj + 1];
    }
    for (int j = 0; j < P; ++j) {
      if (req[static_cast<std::size_t>(j)] == 0) continue;
      if (!make_room(j, mem[0])) return false;
      if (j > 0) fill(j, at(0, j - 1, n(j, 0)) + c);
      put(j, 0);
    }
    for (int j = P - 1; j >= 0; --j) {
      if (!make_room(j, mem[1])) return false;
      if (j + 1 < P) fill(j, at(1, j + 1, i) + c);
      if (j == 0 && n(j, 0) == M)
        while (n(j, 2) < n(j, 1)) put(j, 2);
      put(j, 1);
    }
  }
  for (int j = 0; j < P; ++j)
    while (n(j, 2) < M) put(j, 2);
  return true;
}

//! The two switches of the V heuristic: fill a wait before a chunk-0 `B` (`fill_b`) or before an
//! `F` (`fill_f`) with a `W` when it exceeds the rank's allowance.
struct zbv_knobs {
  bool fill_b = true;
  bool fill_f = true;
};

namespace zbv {

//! One run of the V heuristic (see the file comment): the order, its per-rank bubbles and the
//! largest of them; `ok` false when the run broke a precondition.
struct run {
  bool ok = false;
  std::vector<std::vector<action>> programs;
  std::vector<double> bubble;
  double max_bubble = 0;
};

//! One run under allowances `approved` (empty: none).
constexpr run one_run(shape s, const costs& k, double limit, const zbv_knobs& kn, const std::vector<double>& approved) {
  const int P = s.ranks, M = s.microbatches;
  const auto uP = static_cast<std::size_t>(P), uM = static_cast<std::size_t>(M);
  const double q = 0.5;  // each V chunk holds half of a rank's share
  const double cost[3] = {q * k.f, q * k.b, q * k.w};
  const double mem[3] = {q, -((1.0 - k.mem_w_ratio) * q), -(k.mem_w_ratio * q)};
  const double c = k.c;
  run out;
  out.programs.resize(uP);
  // count[rank][cat * 2 + chunk]; chunk 0 of F is the V's way down (stage r), chunk 0 of B/W the
  // way back up (stage 2P-1-r: the first backward a rank runs for a microbatch).
  std::vector<int> count(uP * 6, 0);
  const std::size_t nodes = 6 * uP * uM;
  std::vector<double> end_time(nodes, -1.0);
  std::vector<double> cur(uP, 0.0), live(uP, 0.0), bubble(uP, 0.0);
  std::vector<std::vector<int>> pending(uP);  // chunks of pending W's, FIFO
  std::vector<std::size_t> head(uP, 0);
  double max_approved = -1;
  for (double v : approved) max_approved = v > max_approved ? v : max_approved;
  auto id = [&](int cat, int chunk, int st, int mb) {
    return ((static_cast<std::size_t>(cat) * 2 + static_cast<std::size_t>(chunk)) * uP + static_cast<std::size_t>(st)) * uM +
           static_cast<std::size_t>(mb);
  };
  auto cnt = [&](int st, int slot) -> int& { return count[static_cast<std::size_t>(st) * 6 + static_cast<std::size_t>(slot)]; };
  // A dependency on a pass that does not exist reads the last node's time (-1 until the very end),
  // as the authors' table lookup at index -1 does.
  auto end_of = [&](long long node) { return node >= 0 ? end_time[static_cast<std::size_t>(node)] : end_time[nodes - 1]; };
  auto allowance = [&](int st) {
    double mx = 0;
    for (double v : bubble) mx = v > mx ? v : mx;
    if (!approved.empty()) {
      const double a = max_approved - approved[static_cast<std::size_t>(st)];
      mx = a > mx ? a : mx;
    }
    return mx - bubble[static_cast<std::size_t>(st)];
  };
  bool ok = true;
  auto stage_of = [&](int cat, int chunk, int st) { return (cat == 0) == (chunk == 0) ? st : 2 * P - 1 - st; };
  auto put = [&](int cat, int chunk, int st) {
    if (!ok) return;
    const auto us = static_cast<std::size_t>(st);
    const int mb = cnt(st, cat * 2 + chunk);
    if (mb >= M || live[us] + mem[cat] > limit) {
      ok = false;
      return;
    }
    if (cat > 0 || chunk > 0) {
      const int last = cat * 2 + chunk - 1;
      const std::size_t need = cat < 2 ? id(last / 2, last % 2, st, mb) : id(1, chunk, st, mb);
      if (end_time[need] < 0) {
        ok = false;
        return;
      }
    }
    double end = cur[us] + cost[cat];
    const double no_wait = end;
    if (cat < 2 && ((chunk == 1 && st < P - 1) || (chunk == 0 && st > 0))) {
      const double dep = end_time[id(cat, chunk, chunk == 1 ? st + 1 : st - 1, mb)];
      if (dep < 0) {
        ok = false;
        return;
      }
      const double a = dep + c + cost[cat];
      end = a > end ? a : end;
    }
    if (cnt(st, 0) > 0) bubble[us] += end - no_wait;
    end_time[id(cat, chunk, st, mb)] = end;
    cur[us] = end;
    live[us] += mem[cat];
    const int stage = stage_of(cat, chunk, st);
    out.programs[us].push_back(cat == 0 ? forward(mb, stage) : cat == 1 ? backward_input(mb, stage) : backward_weight(mb, stage));
    if (cat == 1) pending[us].push_back(chunk);
    ++cnt(st, cat * 2 + chunk);
  };
  auto has_w = [&](int st) { return head[static_cast<std::size_t>(st)] < pending[static_cast<std::size_t>(st)].size(); };
  auto put_w = [&](int st) {
    const auto us = static_cast<std::size_t>(st);
    put(2, pending[us][head[us]++], st);
  };
  // W's until a pass allocating `need` fits; a rank with none left breaks the run.
  auto make_room = [&](int st, double need) {
    while (ok && live[static_cast<std::size_t>(st)] + need > limit) {
      if (!has_w(st)) {
        ok = false;
        return;
      }
      put_w(st);
    }
  };
  // W's before a pass whose input comes from node `dep` (-1: none): those that end in time, then
  // one more if the wait exceeds the allowance and `fill` says so.
  auto fill = [&](int st, long long dep, bool fill_more) {
    const auto us = static_cast<std::size_t>(st);
    while (ok && has_w(st) && dep >= 0 && end_of(dep) + c >= cur[us] + cost[2]) put_w(st);
    if (ok && has_w(st) && end_of(dep) + c - cur[us] > allowance(st) && fill_more) put_w(st);
  };

  // Warm-up.
  for (int i = 0; i < P; ++i) put(0, 0, i);
  for (int i = P - 1; i >= 0 && ok; --i) {
    if (i == P - 1) {
      put(0, 1, i);
      continue;
    }
    const double arrive = end_time[id(0, 1, i + 1, 0)] + c;
    while (ok && live[static_cast<std::size_t>(i)] + mem[0] * (2 + 2 * i) <= limit &&
           cur[static_cast<std::size_t>(i)] + cost[0] <= arrive && cnt(i, 0) < M)
      for (int j = 0; j <= i; ++j) put(0, 0, j);
    put(0, 1, i);
  }
  int chunk_turn = 0;
  for (int i = 1; i < P && ok; ++i) {
    while (ok && (cnt(i, 0) + cnt(i, 1) < cnt(i - 1, 0) + cnt(i - 1, 1) || (cnt(i, 1) <= cnt(i - 1, 1) && cnt(i - 1, 1) < M))) {
      for (int j = P - 1; j >= i; --j)
        if (cnt(j, chunk_turn) < M) put(0, chunk_turn, j);
      chunk_turn = 1 - chunk_turn;
    }
  }
  // Steady state and cool-down: 2m rounds of one B and one F per rank.
  std::vector<int> b0, b1;
  for (int round = 0; round < 2 * M && ok; ++round) {
    for (int i = 0; i < P; ++i) make_room(i, mem[1]);
    b0.clear();
    b1.clear();
    for (int i = 0; i < P; ++i) {
      if (cnt(i, 3) >= cnt(i, 2)) b0.push_back(i);
      else if (i == P - 1) b1.push_back(i);
      else if (end_time[id(1, 1, i + 1, cnt(i, 3))] >= 0 || cnt(i, 2) >= M) b1.push_back(i);
      else b0.push_back(i);
    }
    auto run_b = [&](int i, int chunk) {
      long long dep = -1;
      if (chunk == 1 && i < P - 1) dep = static_cast<long long>(id(1, 1, i + 1, cnt(i, 3)));
      if (chunk == 0 && i > 0) dep = static_cast<long long>(id(1, 0, i - 1, cnt(i, 2)));
      fill(i, dep, chunk == 1 || kn.fill_b);
      put(1, chunk, i);
    };
    for (std::size_t x = b1.size(); x-- > 0;) run_b(b1[x], 1);
    for (int i : b0) run_b(i, 0);
    for (int i = 0; i < P && ok; ++i) {
      if (cnt(i, 1) >= M) continue;
      int item = -1;
      if (cnt(i, 1) >= cnt(i, 0)) item = 0;
      else if (i == P - 1) item = 1;
      else if (end_time[id(0, 1, i + 1, cnt(i, 1))] >= 0) item = 1;
      else if (cnt(i, 0) < M && (i == 0 || end_time[id(0, 0, i - 1, cnt(i, 0))] >= 0)) item = 0;
      if (item < 0) continue;
      make_room(i, mem[0]);
      long long dep = -1;
      if (item == 0 && i > 0) dep = static_cast<long long>(id(0, 0, i - 1, cnt(i, 0)));
      if (item == 1 && i < P - 1) dep = static_cast<long long>(id(0, 1, i + 1, cnt(i, 1)));
      fill(i, dep, kn.fill_f);
      put(0, item, i);
    }
  }
  for (int i = 0; i < P && ok; ++i)
    while (ok && has_w(i)) put_w(i);
  if (!ok) return out;
  // Every pass must have been placed (the rounds are sized for it).
  for (int i = 0; i < P; ++i)
    for (int x = 0; x < 6; ++x)
      if (cnt(i, x) != M) return out;
  double mx = 0;
  for (double v : bubble) mx = v > mx ? v : mx;
  out.bubble = static_cast<std::vector<double>&&>(bubble);
  out.max_bubble = mx;
  out.ok = true;
  return out;
}

}  // namespace zbv

//! The V heuristic for shape `s` (2 chunks per rank) under costs `k` (per rank's share) and the
//! per-rank limit `limit`: the first run, then re-runs with the previous run's bubbles as
//! allowances while they lower the largest bubble (the best of the chain is kept). False when a
//! run of the chain broke a precondition (the authors' code then yields nothing either).
constexpr bool zbv_heuristic(std::string_view name, shape s, const costs& k, double limit, const zbv_knobs& kn, schedule& out) {
  zbv::run best = zbv::one_run(s, k, limit, kn, {});
  if (!best.ok) return false;
  // Re-run while the previous run improved on its allowances (the authors' recursion, unrolled;
  // bounded as their recursion is by the interpreter's depth limit).
  for (int depth = 0; depth < 1000; ++depth) {
    zbv::run next = zbv::one_run(s, k, limit, kn, best.bubble);
    if (!next.ok) return false;
    if (!(next.max_bubble < best.max_bubble)) break;
    best = static_cast<zbv::run&&>(next);
  }
  out = make_schedule(name, shape{s.ranks, s.microbatches, 2}, 2 * s.ranks, placement_kind::v);
  out.programs = static_cast<std::vector<std::vector<action>>&&>(best.programs);
  return true;
}

}  // namespace loom::detail
