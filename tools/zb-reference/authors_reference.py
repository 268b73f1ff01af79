#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Reference numbers from the Zero Bubble authors' own schedulers, for loom's comparison.

Draws seeded random pipeline configurations and runs, on each, the two heuristics of
sail-sg/zero-bubble-pipeline-parallelism (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024) exactly as that repository's runtime calls them:

- loop placement: `zb.create_schedule` -> `initial_solution`, the best of `Graph.manual_order`
  over its 8 settings (allow_bubble_before_first_b, prioritize_b, no_bubble_greedy), under
  `max_mem` = the memory limit;
- V placement: `zbv.PipelineGraph.create_schedule`'s search, the best of `try_v_schedule` over
  (fill_b, fill_f) (with its approved-bubble re-runs), under `max_mem` = the memory limit.

Their code is NOT part of loom and is not committed: fetch the repository and point --authors
at a folder holding its three scheduler files (graph.py, zb.py, zbv.py from
megatron/core/pipeline_parallel/zerobubble/scheduler/). `torch` and `pulp` are imported at the
top of zb.py but not used by the heuristic; stand-ins are installed so nothing else is needed.

Units: loom's (ARCHITECTURE.md). Costs f, b, w, c of one microbatch through one rank's share;
memory in activations of one microbatch through one rank's share (M_B = 1), so F allocates 1,
B releases 1 - r, W releases r (r = M_W/M_B). On the V placement every pass is half a rank's
share: costs f/2, b/2, w/2 (c unchanged) and memory halved. Every drawn number is a multiple
of 1/4 (costs) or 1/256 (r), so all arithmetic here and in loom is exact in binary floating
point and both sides take the same decisions.

Output (stdout): CSV, one row per configuration and limit, with the authors' longest stage span
and bubble rate (1 - m(f+b+w) / span; "none" if the heuristic raised for every setting).
"""
import argparse
import importlib.util
import random
import sys
import types


def load_authors(folder):
    # Stand-ins for imports the heuristics never use.
    for name in ("torch", "pulp"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["torch"].Tensor = object  # only named in a type annotation
    pkg = "megatron.core.pipeline_parallel.zerobubble.scheduler"
    parts = pkg.split(".")
    for i in range(1, len(parts) + 1):
        mod = types.ModuleType(".".join(parts[:i]))
        mod.__path__ = []
        sys.modules.setdefault(".".join(parts[:i]), mod)
    loaded = {}
    for name in ("graph", "zb", "zbv"):
        spec = importlib.util.spec_from_file_location(pkg + "." + name, f"{folder}/{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[pkg + "." + name] = mod
        spec.loader.exec_module(mod)
        loaded[name] = mod
    return loaded


def quarter(rng, lo, hi):
    return rng.randint(int(lo * 4), int(hi * 4)) / 4.0


def draw(rng):
    p = rng.randint(2, 16)
    m = rng.randint(p, 4 * p)
    return {
        "p": p,
        "m": m,
        "f": quarter(rng, 10, 60),
        "b": quarter(rng, 10, 60),
        "w": quarter(rng, 2, 50),
        "c": quarter(rng, 0, 25),
        "r": rng.randint(0, 256) / 256.0,
    }


def authors_loop(A, x, limit, orders=None):
    """Longest stage span of the authors' loop-placement heuristic, or None. `orders` (a list)
    receives the per-rank op order of the best setting, in loom's names (kind, microbatch, stage)."""
    p, m, r = x["p"], x["m"], x["r"]
    cfg = A["graph"].GraphConfig(
        cost_f=[x["f"]] * p, cost_b=[x["b"]] * p, cost_w=[x["w"]] * p, cost_comm=x["c"],
        mem_f=[1.0] * p, mem_b=[-(1.0 - r)] * p, mem_w=[-r] * p, max_mem=[limit] * p,
        n_stages=p, n_micro=m)
    g = A["zb"].Graph.build_graph(p, m, cfg)
    best = None
    for a in (True, False):
        for pb in (True, False):
            for nb in (True, False):
                try:
                    order, _, span = g.manual_order(allow_bubble_before_first_b=a, prioritize_b=pb, no_bubble_greedy=nb)
                except (ValueError, AssertionError):
                    continue
                if best is None or span < best:
                    best = span
                    if orders is not None:
                        orders[:] = [sorted(((order[g.get_id(k, st, mb)], "FBW"[k], mb, st) for k in range(3)
                                             for mb in range(m)))for st in range(p)]
    return best


def authors_v(A, x, limit, orders=None):
    """Longest stage span of the authors' ZB-V heuristic, or None (`orders` as for the loop)."""
    p, m, r = x["p"], x["m"], x["r"]
    g = A["zbv"].PipelineGraph(p, m, x["f"] / 2, x["b"] / 2, x["w"] / 2, x["c"],
                               f_mem=0.5, b_mem=-(1.0 - r) / 2, w_mem=-r / 2, max_mem=limit)
    best = None
    for fill_b in (True, False):
        for fill_f in (True, False):
            try:
                sched, _, bubble = g.try_v_schedule(fill_b=fill_b, fill_f=fill_f)
            except (AssertionError, IndexError):
                continue
            if best is None or bubble < best:
                best = bubble
                if orders is not None:
                    # (cat, chunk, mb): F chunk 0 is stage i, F chunk 1 stage 2p-1-i; B/W chunk 0
                    # is the backward of stage 2p-1-i, chunk 1 of stage i.
                    orders[:] = [[(j, "FBW"[cat], mb, (i if chunk == 0 else 2 * p - 1 - i) if cat == 0
                                   else (2 * p - 1 - i if chunk == 0 else i))
                                  for j, (cat, chunk, mb) in enumerate(sched[i])] for i in range(p)]
    return None if best is None else best + m * (x["f"] + x["b"] + x["w"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, help="folder with the authors' graph.py, zb.py, zbv.py")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--configs", type=int, default=200, help="random configurations (each at 3 limits)")
    ap.add_argument("--commit", default="", help="the authors' commit, recorded in the header")
    ap.add_argument("--orders", help="also write the best op orders here (one line per rank)")
    args = ap.parse_args()
    A = load_authors(args.authors)
    orders_out = open(args.orders, "w") if args.orders else None
    rng = random.Random(args.seed)
    print(f"# Zero Bubble authors' heuristics (sail-sg/zero-bubble-pipeline-parallelism {args.commit}) on "
          f"{args.configs} seeded random configurations x limits p, 1.5p, 2p")
    print("# DIR: graph.py, zb.py and zbv.py of megatron/core/pipeline_parallel/zerobubble/scheduler/ at that commit, e.g.")
    print(f"#   for f in graph zb zbv; do git -C <clone> show {args.commit}:megatron/core/pipeline_parallel/zerobubble/"
          f"scheduler/$f.py > DIR/$f.py; done")
    print(f"# produced by: python3 tools/zb-reference/authors_reference.py --authors DIR --seed {args.seed} "
          f"--configs {args.configs} --commit {args.commit} > tests/schedule/data/zb_authors_reference.csv")
    print("# costs f, b, w, c: one microbatch through one rank's share; limit: per-rank activation units "
          "(ARCHITECTURE.md); on the V placement every pass is half a rank's share")
    print("# span: longest stage span (time units); rate: 1 - m(f+b+w)/span; none: every setting raised")
    print("id,p,m,f,b,w,c,mem_w_ratio,limit,loop_span,loop_rate,v_span,v_rate")
    for i in range(args.configs):
        x = draw(rng)
        for mult in (1.0, 1.5, 2.0):
            limit = mult * x["p"]
            busy = x["m"] * (x["f"] + x["b"] + x["w"])
            out = []
            for kind, fn in (("loop", authors_loop), ("v", authors_v)):
                orders = []
                span = fn(A, x, limit, orders)
                out += ["none", "none"] if span is None else [repr(span), f"{1 - busy / span:.10f}"]
                if orders_out and span is not None:
                    orders_out.write(f"{i} {limit} {kind} {len(orders)}\n")
                    for rank in orders:
                        orders_out.write(" ".join(f"{k}{mb}@{st}" for _, k, mb, st in rank) + "\n")
            print(",".join(str(v) for v in [i, x["p"], x["m"], x["f"], x["b"], x["w"], x["c"], x["r"], limit] + out))


if __name__ == "__main__":
    main()
