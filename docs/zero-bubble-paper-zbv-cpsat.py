#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Exact check of a zb-v schedule with Google OR-Tools CP-SAT (an offline analysis for
docs/zero-bubble-paper.md, not part of the library or its tests).

The model is loom::simulate's (ARCHITECTURE.md): passes of a rank never overlap; F(s,j) after
F(s-1,j), B(s,j) after B(s+1,j) (after F(S-1,j) on the last stage) and after F(s,j), W(s,j) after
B(s,j), plus the p2p latency c between ranks; per-rank activation memory (F +q at its start, B
-(1-r)q and W -rq at their end, q = 1/2 for two chunks per rank) never above p units; objective:
the longest per-rank span (the Zero Bubble paper's bubble rate). Each stream (one kind on one
stage) keeps microbatch order, as in loom's V schedules.

Input: the output of docs/zero-bubble-paper-zbv-dump.cpp (a schedule with its start times), used
as the solver's starting solution. Neighbourhoods (what the solver may change):
  --fix-before T   every pass that starts before time T keeps its time; the rest is free
  --free-ranks L   ranks in L (comma-separated) are free; the others keep their program order
                   (their times may still move)
  --window A,B     passes that start in [A, B) are free; every other pass keeps its order among
                   them on its rank (times may move)
  neither          the whole schedule is free

    pip install ortools
    python3 docs/zero-bubble-paper-zbv-cpsat.py /tmp/zbv-row0.txt --fix-before 36 --seconds 300

It prints OPTIMAL when it proves that no schedule in the neighbourhood has a shorter longest
span, FEASIBLE with the best span and the proven lower bound otherwise.
"""
import argparse
import sys
from fractions import Fraction


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump")
    hood = ap.add_mutually_exclusive_group()
    hood.add_argument("--fix-before", type=float, default=None)
    hood.add_argument("--free-ranks", default=None)
    hood.add_argument("--window", default=None)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        print("needs Google OR-Tools: pip install ortools", file=sys.stderr)
        return 2

    lines = [l.split() for l in open(a.dump) if l.strip()]
    p, m = int(lines[0][0]), int(lines[0][1])
    f, b, w, c, rw, rate = map(float, lines[0][2:8])
    scale = 400000  # time unit -> integer ticks (the derived costs have 6 decimals)
    df, db, dw, dc = (round(x * scale) for x in (f / 2, b / 2, w / 2, c))
    r = Fraction(rw).limit_denominator(1000)  # M_W/M_B = 32h/(34h+5as) is rational
    unit = 2 * r.denominator  # one memory unit in integer ticks; F adds q = 1/2 unit
    mem_f, mem_b, mem_w = unit // 2, -int((1 - r) * unit / 2), -int(r * unit / 2)
    assert mem_f + mem_b + mem_w == 0
    stages = 2 * p
    rank_of = lambda s: s if s < p else stages - 1 - s
    kinds = {0: "F", 1: "B", 2: "W"}

    M = cp_model.CpModel()
    horizon = round(4 * m * (f + b + w) * scale)
    dur = {"F": df, "B": db, "W": dw}
    start, interval = {}, {}
    for s in range(stages):
        for j in range(m):
            for k in "FBW":
                start[k, s, j] = M.NewIntVar(0, horizon, f"{k}{s}_{j}")
                interval[k, s, j] = M.NewFixedSizeIntervalVar(start[k, s, j], dur[k], f"i{k}{s}_{j}")
    end = lambda k, s, j: start[k, s, j] + dur[k]
    hop = lambda s, t: dc if rank_of(s) != rank_of(t) else 0
    for s in range(stages):
        for j in range(m):
            if s > 0:
                M.Add(start["F", s, j] >= end("F", s - 1, j) + hop(s - 1, s))
            if s == stages - 1:
                M.Add(start["B", s, j] >= end("F", s, j))
            else:
                M.Add(start["B", s, j] >= end("B", s + 1, j) + hop(s + 1, s))
                M.Add(start["B", s, j] >= end("F", s, j))
            M.Add(start["W", s, j] >= end("B", s, j))
            if j > 0:
                for k in "FBW":
                    M.Add(start[k, s, j] >= end(k, s, j - 1))

    programs = {q: [] for q in range(p)}
    given = {}
    for rk, kd, j, s, t in lines[1:]:
        key = (kinds[int(kd)], int(s), int(j))
        given[key] = round(float(t) * scale)
        programs[int(rk)].append((float(t), key))
    free = set(range(p)) if a.free_ranks is None else {int(x) for x in a.free_ranks.split(",")}
    spans = []
    for q in range(p):
        own = [q, stages - 1 - q]
        if q in free:
            M.AddNoOverlap([interval[k, s, j] for s in own for j in range(m) for k in "FBW"])
            times, deltas = [], []
            for s in own:
                for j in range(m):
                    times += [start["F", s, j], end("B", s, j), end("W", s, j)]
                    deltas += [mem_f, mem_b, mem_w]
            M.AddReservoirConstraint(times, deltas, 0, p * unit)
        if a.window is not None:
            lo_t, hi_t = (float(x) for x in a.window.split(","))
            prog = [key for t, key in sorted(programs[q]) if not lo_t <= t < hi_t]
            for x, y in zip(prog, prog[1:]):
                M.Add(start[y] >= end(*x))
        elif q not in free:
            prog = [key for _, key in sorted(programs[q])]
            for x, y in zip(prog, prog[1:]):
                M.Add(start[y] >= end(*x))
        lo, hi = M.NewIntVar(0, horizon, f"lo{q}"), M.NewIntVar(0, horizon, f"hi{q}")
        M.Add(lo == start["F", q, 0])  # a rank's first pass is its first chunk-0 forward
        M.AddMaxEquality(hi, [end(k, s, m - 1) for s in own for k in "BW"])
        span = M.NewIntVar(0, horizon, f"span{q}")
        M.Add(span == hi - lo)
        spans.append(span)
    longest = M.NewIntVar(0, horizon, "longest")
    M.AddMaxEquality(longest, spans)
    M.Minimize(longest)
    for key, t in given.items():
        if a.fix_before is not None and t < a.fix_before * scale:
            M.Add(start[key] == t)
        else:
            M.AddHint(start[key], t)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = a.seconds
    solver.parameters.num_workers = a.workers
    status = solver.Solve(M)
    busy = m * (f + b + w)
    print(f"input: longest span {busy / (1 - rate):.6f}, bubble rate {rate:.6f}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        print(f"{solver.StatusName(status)}: no schedule found within {a.seconds:g} s")
        return 1
    best, bound = solver.ObjectiveValue() / scale, solver.BestObjectiveBound() / scale
    proven = f"lower bound {bound:.6f} (bubble rate >= {1 - busy / bound:.6f})" if bound >= busy else "no bound proven"
    print(f"{solver.StatusName(status)}: longest span {best:.6f} (bubble rate {1 - busy / best:.6f}), {proven}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
