#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Reference harness for PipeOffload's offload insertion (sail-sg/zero-bubble-pipeline-parallelism).

Runs the authors' own scheduler code (imported from a folder given on the command line, NOT copied
here) and, independently, a from-the-spec re-implementation ("port model") of the same algorithm,
as include/loom/schedule/offload.hpp states it (loom's port, checked against this harness's csv).

Preparing the folder (the five files of megatron/core/pipeline_parallel/zerobubble/scheduler/):
    R=/work/.mirror/sail-sg+zero-bubble-pipeline-parallelism/repo
    D=megatron/core/pipeline_parallel/zerobubble/scheduler
    mkdir -p /tmp/pofl/src
    for f in graph communication offloading passes group_interleaved_1f1b; do
        git -C $R show HEAD:$D/$f.py > /tmp/pofl/src/$f.py; done
Usage:
    python3 offload_reference.py /tmp/pofl/src table        # section 3 table, f=b=w=1 (markdown)
    python3 offload_reference.py /tmp/pofl/src table1000    # the same with f=b=w=1000
    python3 offload_reference.py /tmp/pofl/src asap         # add_time == ASAP check
    python3 offload_reference.py /tmp/pofl/src port         # port model == authors' add_offload check
    python3 offload_reference.py /tmp/pofl/src exact        # float-rounding sensitivity check
    python3 offload_reference.py /tmp/pofl/src one P M V G K OT [F B W COMM]   # one shape, verbose
    python3 offload_reference.py /tmp/pofl/src csv COMMIT   # tests/schedule/data/offload_reference.csv
Only the standard library is needed; megatron/torch are stubbed (the scheduler files only import
megatron.training.get_args, which the code paths used here never call).
"""
import contextlib
import dataclasses
import importlib.util
import io
import math
import os
import sys
import traceback
import types

PKG = "megatron.core.pipeline_parallel.zerobubble.scheduler"


def load_authors(src):
    parts = PKG.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        mod = types.ModuleType(name)
        mod.__path__ = []
        sys.modules[name] = mod
    tr = types.ModuleType("megatron.training")
    tr.get_args = lambda: types.SimpleNamespace(offload_overlap_sr=False)
    sys.modules["megatron.training"] = tr
    mods = {}
    for name in ["graph", "communication", "offloading", "passes", "group_interleaved_1f1b"]:
        spec = importlib.util.spec_from_file_location(PKG + "." + name, os.path.join(src, name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[PKG + "." + name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return types.SimpleNamespace(**mods)


A = None  # the authors' modules, set in main()


def quiet(fn, *args, **kw):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kw)


def make_config(p, m, v, f=1.0, b=1.0, w=1.0, comm=0.0):
    cfg = A.graph.GraphConfig.basic_config(float(f), float(b), float(w), p, m, v)
    cfg.cost_comm = float(comm)
    return cfg


def authors_orders(cfg, g, k):
    """create_schedule's group path, as runtime.py calls it (cpu_offload iff k > 0)."""
    return quiet(A.group_interleaved_1f1b.create_schedule, cfg, cpu_offload=k > 0,
                 recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
                 interleave_group_size=g, offload_chunk_num=k)


def where(exc):
    tb = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} in {os.path.basename(tb.filename)}:{tb.lineno} {tb.name}"


def authors_run(p, m, v, g, k, ot, f=1.0, b=1.0, w=1.0, comm=0.0, comm_pass=True):
    """The steps of passes.run_schedule_passes (pre_validate, add_send_recv_peer_stage, add_time,
    add_offload if k > 0, add_communication_nodes_without_sorting, validate_communication).
    Returns (peaks, order_after_add_offload, comm_error):
      peaks = get_peak_memory of the order right after add_offload (the later passes only insert
              SEND_/RECV_ FORWARD/BACKWARD nodes, which get_peak_memory ignores), or an
              "assert: ..." string when a step up to add_offload refuses;
      comm_error = None, or "assert: ..." when the later communication passes refuse (only run
              when comm_pass is true; they are the slow part)."""
    try:
        cfg = make_config(p, m, v, f, b, w, comm)
        lo = authors_orders(cfg, g, k)
        P = A.passes
        P.pre_validate(lo)
        lo = P.add_send_recv_peer_stage(cfg, lo)
        lo = P.add_time(cfg, lo)
        if k > 0:
            lo = quiet(A.offloading.add_offload, cfg, lo, ot)
    except Exception as e:  # AssertionError, IndexError, ...
        return "assert: " + where(e), None, None
    after = [list(r) for r in lo]
    peaks = A.offloading.get_peak_memory(lo)
    comm_error = None
    if comm_pass:
        try:
            lo = quiet(A.communication.add_communication_nodes_without_sorting, cfg, lo, False)
            quiet(A.communication.validate_communication, lo)
            assert A.offloading.get_peak_memory(lo) == peaks
        except Exception as e:
            comm_error = "assert: " + where(e)
    return peaks, after, comm_error


# --------------------------------------------------------------------------------------------
# Port model: an independent implementation of the algorithm (include/loom/schedule/offload.hpp).
# Input: per-rank program orders of compute nodes (kind in 'FBW', layer, mb, chunk).
# --------------------------------------------------------------------------------------------

def plain_orders(lo):
    return [[(n.type.value, n.layer_group_idx, n.microbatch, n.chunk, n.should_offload) for n in r] for r in lo]


def asap_times(orders, p, v, f, b, w, comm):
    """Each rank runs its program in order; an action starts at max(end of the previous action on
    the rank, end of its data dependency (+comm if that is on another rank))."""
    L = p * v
    cost = {"F": f, "B": b, "W": w}
    rank_of = {}
    for r, o in enumerate(orders):
        for (t, l, mb, c, _) in o:
            rank_of[(t, l, mb)] = r

    def dep(t, l, mb):
        if t == "F":
            return None if l == 0 else ("F", l - 1, mb)
        if t == "B":
            return ("F", l, mb) if l == L - 1 else ("B", l + 1, mb)
        return ("B", l, mb)

    end, times = {}, [[None] * len(o) for o in orders]
    pos, free = [0] * len(orders), [0] * len(orders)
    done, total = 0, sum(len(o) for o in orders)
    while done < total:
        progressed = False
        for r, o in enumerate(orders):
            while pos[r] < len(o):
                t, l, mb = o[pos[r]][:3]
                d = dep(t, l, mb)
                if d is not None and d not in end:
                    break
                st = free[r]
                if d is not None:
                    de = end[d] + comm if rank_of[d] != r else end[d]
                    st = max(de, st)
                en = st + cost[t]
                end[(t, l, mb)] = en
                times[r][pos[r]] = [st, en]
                free[r] = en
                pos[r] += 1
                done += 1
                progressed = True
        if not progressed:
            raise RuntimeError("deadlock")
    return times


def port_peaks(orders, p, v, k, ot, f=1.0, b=1.0, w=1.0, comm=0.0, want_order=False, exact=False):
    """exact=True: same algorithm in exact rational arithmetic (fractions.Fraction), to find the
    cases whose result depends on binary floating-point rounding."""
    if exact:
        from fractions import Fraction
        f, b, w, comm = (Fraction(str(x)) for x in (f, b, w, comm))
    L = p * v
    times = asap_times(orders, p, v, f, b, w, comm)
    # -- 1. postpone_forward_in_warmup (moves start/end of some warm-up F; order unchanged)
    where_ = {}
    for r, o in enumerate(orders):
        for i, n in enumerate(o):
            where_[(n[0], n[1], n[2])] = (r, i)
    for r in range(p - 1, -1, -1):
        o, tm = orders[r], times[r]
        fb = next(i for i, n in enumerate(o) if n[0] == "B")
        bcost = tm[fb][1] - tm[fb][0]
        cur = tm[fb][0] - bcost
        for i in range(fb - 1, -1, -1):
            t, l, mb, c, _ = o[i]
            if t == "F" and c == v - 1 and mb == 0:
                break
            if (t, l + 1, mb) not in where_:
                raise AssertionError("postpone: next layer missing")
            nr, ni = where_[(t, l + 1, mb)]
            cost = tm[i][1] - tm[i][0]
            st = min(times[nr][ni][0] - comm - cost, cur - cost)
            if st > tm[i][0]:
                tm[i] = [st, st + cost]
            cur = tm[i][0]
    # -- 2. transfer time
    if exact:
        T = Fraction(str(round(float(f + b + w) * ot, 2)))
        solo = T * Fraction(7, 10)
    else:
        T = round((f + b + w) * ot, 2)
        solo = T * 0.7
    new_orders = []
    for r0 in range(0, p, 2):
        start = times[r0][0][1]
        qs = []
        for j, r in enumerate((r0, r0 + 1)):
            qs.append(slots(orders[r], times[r], start + (T if j else 0), T))
        adjust(qs, solo)
        pair = [merge(orders[r], times[r], qs[j]) for j, r in enumerate((r0, r0 + 1))]
        new_orders += barriers(*pair)
    peaks = []
    for o in new_orders:
        mem = pk = 0
        for n in o:
            if n[0] in ("F", "RECV_PREP"):
                mem += 1
            elif n[0] in ("W", "SEND_END"):
                mem -= 1
            pk = max(pk, mem)
        peaks.append(pk)
    return (peaks, new_orders) if want_order else peaks


def slots(o, tm, start, T):
    """Live part of add_send_recv. Returns passes [index, kind('S'/'R'), key, start, end, fend]."""
    D = T + T
    fend = {}
    for (t, l, mb, c, off), (s, e) in zip(o, tm):
        if t == "F" and off:
            fend[(l, mb)] = e
    bad = set()
    for (t, l, mb, c, off), (s, e) in zip(o, tm):
        if t == "B" and off and s - (e - s) - fend[(l, mb)] <= D * 3:
            bad.add((l, mb))
    cur, idx, sends = start, 0, {}
    out = []
    for (t, l, mb, c, off), (s, e) in zip(o, tm):
        if t == "F" and off and (l, mb) not in bad:
            while cur < e:
                cur += D
                idx += 2
            sends[(l, mb)] = cur
            out.append([idx, "S", (l, mb), cur, cur + T, e])
            cur += D
            idx += 2
    while cur < tm[-1][1]:
        cur += D
        idx += 2
    recvs = []
    for (t, l, mb, c, off), (s, e) in reversed(list(zip(o, tm))):
        if t == "B" and off and (l, mb) not in bad:
            while cur > s - (e - s):
                cur -= D
                idx -= 2
            if not (cur - T > sends[(l, mb)] + T):
                raise AssertionError("Unable to schedule offload")
            recvs.append([idx - 1, "R", (l, mb), cur - T, cur, None])
            cur -= D
            idx -= 2
    return sorted(out + recvs[::-1], key=lambda x: x[0])


def adjust(qs, solo):
    """adjust_warmup: pack the pair's pre-reload sends back to back at the solo rate."""
    lim = qs[0][-1][0]
    for j, q in enumerate(qs):
        for ps in q:
            if ps[0] % 2 == 1:
                lim = min(lim, ps[0] + j)
    cur, ci, si = qs[0][0][3], qs[0][0][0], [0, 0]
    while ci < lim:
        for j, q in enumerate(qs):
            ps = q[si[j]]
            if ps[0] + j == ci:
                cur = max(cur, ps[5])
                assert cur <= ps[3]
                ps[3], ps[4] = cur, cur + solo
                si[j] += 1
                cur += solo
        ci += 1


def barriers(s0, s1):
    """add_barriers_before_offload: walk the pair in time; before every SEND_START/RECV_START on
    one rank put a BARRIER at the same time on the other (unless it has a START at that time).
    Only its refusals matter for memory."""
    eps = 1e-6
    assert s0[0][0] == "F"
    ss, out, j = (s0, s1), ([], []), [0, 0]
    starts = ("SEND_START", "RECV_START")
    while True:
        i = list(j)
        for r in (0, 1):
            while i[r] < len(ss[r]) and ss[r][i[r]][0] not in starts:
                i[r] += 1
        if i[0] >= len(s0) and i[1] >= len(s1):
            break
        t = s0[-1][4]
        for r in (0, 1):
            if i[r] < len(ss[r]):
                t = min(t, ss[r][i[r]][3])
        for r in (0, 1):
            while j[r] < i[r] and ss[r][j[r]][3] <= t + eps:
                out[r].append(ss[r][j[r]]); j[r] += 1
            here = i[r] < len(ss[r]) and ss[r][i[r]][3] <= t + eps
            if not here:
                out[r].append(("BARRIER", None, 0, t, t))
            else:
                assert i[r] == j[r], "barrier: a node after the START's time precedes it"
                out[r].append(ss[r][j[r]]); j[r] += 1
    for r in (0, 1):
        out[r].extend(ss[r][j[r]:])
    return list(out)


PRIO = {"SEND_START": 0, "SEND_END": 1, "RECV_PREP": 2, "RECV_START": 3, "RECV_END": 4}


def merge(o, tm, q):
    """add_send_recv_in_schedule + remove of unused flags (flags do not matter for memory)."""
    left, right, sent = [], [], set()
    for idx, kind, key, st, en, _ in q:
        if kind == "S":
            sent.add(key)
            left.append(("SEND_START", key, st))
            right.append(("SEND_END", key, en))
        else:
            left.append(("RECV_PREP", key, st))
            right.append(("RECV_START", key, st))
    out, li, ri, pend = [], 0, 0, []
    for n, (s, e) in zip(o, tm):
        while ri < len(right) and right[ri][2] <= s:
            pend.append(right[ri]); ri += 1
        while li < len(left) and left[li][2] < e:
            pend.append(left[li]); li += 1
        pend.sort(key=lambda x: (x[2], PRIO[x[0]]))
        out += [(x[0], x[1][0], x[1][1], x[2], x[2]) for x in pend]
        pend = []
        out.append((n[0], n[1], n[2], s, e))
        if n[0] == "W" and (n[1], n[2]) in sent:
            pend.append(("RECV_END", (n[1], n[2]), e))
    out += [(x[0], x[1][0], x[1][1], x[2], x[2]) for x in pend]
    assert li == len(left) and ri == len(right)
    return out


# --------------------------------------------------------------------------------------------

def table_shapes():
    for p in (4, 8):
        for v in (2, 4):
            m = 4 * p
            for g in range((p + 1) // 2, p + 1):
                yield p, m, v, g


def fmt(r):
    peaks, _, cerr = r
    if isinstance(peaks, str):
        return "assert (" + peaks.split(" in ")[1].split(" ")[0] + ")"
    return "[" + ",".join(map(str, peaks)) + "]" + (" \u2020" if cerr else "")


def cmd_table(scale=1.0):
    """scale: f = b = w = scale (1.0: the authors' unit tests; 1000.0: the costs the runtime uses
    for its first schedule, before profiling)."""
    S = (scale, scale, scale)
    print(f"f = b = w = {scale}, comm = 0")
    print()
    print("| p | m | v | g | k=0 (no offload) | k=1, ot=0.2 | k=1, ot=0.5 | max: k=0 / 0.2 / 0.5 |")
    print("|---|---|---|---|---|---|---|---|")
    notes = set()
    for p, m, v, g in table_shapes():
        rs = [authors_run(p, m, v, g, 0, None, *S), authors_run(p, m, v, g, 1, 0.2, *S),
              authors_run(p, m, v, g, 1, 0.5, *S)]
        notes |= {r[2] for r in rs if r[2]}
        mx = " / ".join(str(max(r[0])) if isinstance(r[0], list) else "assert" for r in rs)
        print(f"| {p} | {m} | {v} | {g} | " + " | ".join(fmt(r) for r in rs) + f" | {mx} |")
    print()
    print("Extra rows, k = 2..v (same shapes):")
    print()
    print("| p | m | v | g | k | ot=0.2 | ot=0.5 |")
    print("|---|---|---|---|---|---|---|")
    for p, m, v, g in table_shapes():
        for k in range(2, v + 1):
            rs = [authors_run(p, m, v, g, k, 0.2, *S), authors_run(p, m, v, g, k, 0.5, *S)]
            notes |= {r[2] for r in rs if r[2]}
            print(f"| {p} | {m} | {v} | {g} | {k} | " + " | ".join(fmt(r) for r in rs) + " |")
    print()
    print("\u2020 = add_offload succeeded (peaks shown) but the later communication pass refused:", sorted(notes))


def check_shapes():
    for p in (2, 4, 6, 8):
        for v in (1, 2, 3, 4):
            for m in sorted({p, 2 * p, 4 * p, 4 * p + 3, 5}):
                for g in range((p + 1) // 2, p + 1):
                    yield p, m, v, g


def cmd_asap():
    costs = [(1.0, 1.0, 1.0, 0.0), (1.0, 1.0, 1.0, 0.5), (1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 3.0),
             (1.0, 2.0, 1.0, 0.0), (1.3, 2.7, 0.9, 0.25), (12.4, 25.1, 11.7, 0.0)]
    n = bad = n1 = bad1 = 0
    for p, m, v, g in list(check_shapes()) + [(3, 12, 2, 2), (5, 20, 3, 3), (5, 9, 2, 4)]:
        for f, b, w, c in costs:
            try:
                cfg = make_config(p, m, v, f, b, w, c)
                lo = authors_orders(cfg, g, 0)
            except Exception:
                continue
            lo = A.passes.add_send_recv_peer_stage(cfg, lo)
            timed = A.passes.add_time(cfg, lo)
            mine = asap_times(plain_orders(lo), p, v, f, b, w, c)
            if g == 1:
                # transform_schedule pre-sets grid times (slot j -> [j*max f, (j+1)*max f]) when
                # the group size is 1, and add_time then returns at once: not ASAP.
                n1 += 1
                bad1 += any(mm != [[x.start_time, x.completion_time] for x in rr] for rr, mm in zip(timed, mine))
                continue
            n += 1
            ok = all([x.start_time, x.completion_time] == y for rr, mm in zip(timed, mine) for x, y in zip(rr, mm))
            ok = ok and all(len(rr) == len(mm) for rr, mm in zip(timed, mine))
            if not ok:
                bad += 1
                print("MISMATCH", p, m, v, g, f, b, w, c)
    print(f"asap check: {n} (shape, cost) cases with g >= 2, {bad} mismatches (exact float equality of every start/end)")
    print(f"g == 1: {n1} cases, {bad1} of them differ from ASAP (add_time skipped; grid times kept)")


def cmd_port():
    n = bad = 0
    cases = []
    for p, m, v, g in check_shapes():
        if p % 2 or g == 1:  # g == 1: add_time is skipped (grid times), see cmd_asap
            continue
        for k in range(1, v + 1):
            if p in (4, 8) and m in (2 * p, 4 * p, 4 * p + 3):
                for ot in (0.1, 0.2, 0.3, 0.5, 1.0):
                    cases.append((p, m, v, g, k, ot, 1.0, 1.0, 1.0, 0.0))
                cases.append((p, m, v, g, k, 0.5, 1.0, 1.0, 1.0, 0.5))
                cases.append((p, m, v, g, k, 0.2, 1.0, 2.0, 1.0, 0.0))
                cases.append((p, m, v, g, k, 0.3, 1.3, 2.7, 0.9, 0.25))
            else:
                for ot in (0.2, 0.5):
                    cases.append((p, m, v, g, k, ot, 1.0, 1.0, 1.0, 0.0))
    for (p, m, v, g, k, ot, f, b, w, c) in cases:
        ra, after, _ = authors_run(p, m, v, g, k, ot, f, b, w, c, comm_pass=False)
        try:
            cfg = make_config(p, m, v, f, b, w, c)
            lo = authors_orders(cfg, g, k)
            rp, orders = port_peaks(plain_orders(lo), p, v, k, ot, f, b, w, c, want_order=True)
        except Exception as e:
            rp, orders = "assert: " + where(e), None
        n += 1
        same = (isinstance(ra, list) and ra == rp) or (isinstance(ra, str) and isinstance(rp, str))
        if same and after is not None:
            # compare the full marker-augmented order (barriers excluded; they do not count)
            aa = [[(x.type.value.replace("OFFLOAD_", ""), x.layer_group_idx, x.microbatch, x.start_time)
                   for x in r] for r in after]
            same = aa == [[x[:4] for x in r] for r in orders]
        if not same:
            bad += 1
            print("MISMATCH", (p, m, v, g, k, ot, f, b, w, c), ra, rp)
    print(f"port check: {n} cases, {bad} mismatches (peaks, refusals and full marker order)")


def cmd_exact():
    """Float sensitivity: authors' (binary double) result vs the port model in exact rationals,
    at unit costs and at f=b=w=1000 (the costs of the first schedule the runtime builds)."""
    diff = n = 0
    for scale in (1.0, 1000.0):
        for p, m, v, g in table_shapes():
            for k in range(1, v + 1):
                for ot in (0.1, 0.2, 0.3, 0.5, 1.0):
                    base, _, _ = authors_run(p, m, v, g, k, ot, scale, scale, scale, comm_pass=False)
                    lo = authors_orders(make_config(p, m, v, scale, scale, scale), g, k)
                    try:
                        alt = port_peaks(plain_orders(lo), p, v, k, ot, scale, scale, scale, exact=True)
                    except Exception as e:
                        alt = "assert: " + where(e)
                    n += 1
                    if (isinstance(base, str) != isinstance(alt, str)) or (isinstance(base, list) and base != alt):
                        diff += 1
                        print("SENSITIVE", (p, m, v, g, k, ot, scale), base, alt)
    print(f"exact check: {n} cases, {diff} where double and exact arithmetic differ")


def cmd_one(argv):
    p, m, v, g, k = map(int, argv[:5])
    ot = float(argv[5])
    f, b, w, c = (list(map(float, argv[6:10])) + [1.0, 1.0, 1.0, 0.0][len(argv[6:10]):])
    ra, after, cerr = authors_run(p, m, v, g, k, ot, f, b, w, c)
    print("authors:", ra, "| communication pass:", cerr or "ok")
    if after:
        for r, row in enumerate(after):
            print(f"rank {r}: " + " ".join(
                f"{x.type.value.replace('OFFLOAD_', '').lower()}{x.layer_group_idx if x.layer_group_idx is not None else ''}.{x.microbatch}@{x.start_time:g}"
                for x in row))
    cfg = make_config(p, m, v, f, b, w, c)
    print("port   :", port_peaks(plain_orders(authors_orders(cfg, g, k)), p, v, k, ot, f, b, w, c))


def cmd_csv(commit):
    """The reference loom's ctest reads: the authors' peaks (chunk-activations, get_peak_memory
    right after add_offload) or "refused", per shape, offloaded chunks k (0: the pass not run),
    offload time and cost scale (f = b = w = scale per stage, comm 0)."""
    print(f"# PipeOffload's scheduler (sail-sg/zero-bubble-pipeline-parallelism {commit}, megatron/core/pipeline_parallel/")
    print("# zerobubble/scheduler/: group_interleaved_1f1b.create_schedule, passes.add_time, offloading.add_offload)")
    print(f"# produced by: python3 tools/zb-reference/offload_reference.py DIR csv {commit}")
    print("# p,m,v,g,k,offload_time,scale,peaks (rank 0..p-1, chunk-activations) or refused")
    for scale in (1.0, 1000.0):
        S = (scale, scale, scale)
        for p, m, v, g in table_shapes():
            for k in range(0, v + 1):
                for ot in ((0.2,) if k == 0 else (0.2, 0.5)):
                    peaks, _, _ = authors_run(p, m, v, g, k, None if k == 0 else ot, *S, comm_pass=False)
                    cell = "refused" if isinstance(peaks, str) else " ".join(map(str, peaks))
                    print(f"{p},{m},{v},{g},{k},{ot},{scale:g},{cell}")


def main():
    global A
    A = load_authors(sys.argv[1])
    what = sys.argv[2] if len(sys.argv) > 2 else "table"
    {"table": cmd_table, "table1000": lambda: cmd_table(1000.0), "asap": cmd_asap, "port": cmd_port, "exact": cmd_exact,
     "csv": lambda: cmd_csv(sys.argv[3])}.get(
        what, lambda: cmd_one(sys.argv[3:]))()


if __name__ == "__main__":
    main()
