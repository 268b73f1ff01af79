#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Reference orders and peaks from PipeOffload's own generator, for loom's group-interleaved-1f1b.

Runs `GroupBuildingBlockScheduler` of sail-sg/zero-bubble-pipeline-parallelism (Wan et al.,
"PipeOffload", ICML 2025) as `create_schedule` calls it without recomputation or offload: the
smallest allowed group ceil(p/2) (what `create_schedule` derives under uniform costs), the
group size g, `chunk_num` v. Their code is NOT part of loom and is not committed: point
--authors at a folder holding `group_interleaved_1f1b.py` from
megatron/core/pipeline_parallel/zerobubble/scheduler/ (it imports nothing outside the standard
library).

Output (stdout): CSV, one row per (p, m, v, g): the per-rank peak activation in chunk-activations
(+1 at F, -1 at W, the authors' `calculate_peak_memory` per rank) and an FNV-1a 64 digest of
the per-rank orders written as loom writes actions (`F3@s5 B3@s5 W3@s5`, stage = chunk*p + rank
of the loop placement; ranks joined by newlines).
"""
import argparse
import contextlib
import importlib.util
import io


def load_authors(folder):
    spec = importlib.util.spec_from_file_location("group_interleaved_1f1b", folder + "/group_interleaved_1f1b.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(mod, p, m, v, g):
    G = mod.GroupBuildingBlockScheduler
    with contextlib.redirect_stdout(io.StringIO()):  # the generator prints its progress
        rows = G(p, m, chunk_num=v, min_group_size=(p + 1) // 2, group_size=g).get_schedule()
    orders, peaks = [], []
    for row in rows:
        toks, mem, peak = [], 0, 0
        for n in row:
            if n.is_nan():
                continue
            toks.append(f"{n.type.value}{n.micro}@s{n.chunk * p + n.device}")
            mem += 1 if n.type == mod.PassType.F else -1 if n.type == mod.PassType.W else 0
            peak = max(peak, mem)
        orders.append(" ".join(toks))
        peaks.append(peak)
    return orders, peaks


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, help="folder holding group_interleaved_1f1b.py")
    ap.add_argument("--commit", required=True, help="the commit the file came from (printed in the header)")
    a = ap.parse_args()
    mod = load_authors(a.authors)
    print(f"# PipeOffload's GroupBuildingBlockScheduler (sail-sg/zero-bubble-pipeline-parallelism {a.commit},")
    print("# megatron/core/pipeline_parallel/zerobubble/scheduler/group_interleaved_1f1b.py), min_group_size ceil(p/2)")
    print("# produced by: python3 tools/zb-reference/group_interleaved_reference.py --authors DIR --commit " + a.commit)
    print("# p,m,v,g,peaks (rank 0..p-1, chunk-activations),fnv1a64 of the per-rank orders")
    for p in (1, 2, 3, 4, 5, 6, 8):
        for v in (1, 2, 3, 4):
            for m in sorted({1, 3, 5, 8, 16, 4 * p}):
                for g in range((p + 1) // 2, p + 1):
                    orders, peaks = run(mod, p, m, v, g)
                    print(f"{p},{m},{v},{g},{' '.join(map(str, peaks))},{fnv1a64(chr(10).join(orders)):016x}")


if __name__ == "__main__":
    main()
