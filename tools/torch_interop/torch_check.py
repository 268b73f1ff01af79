# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Checks loom's PyTorch pipelining CSVs against a real PyTorch install, and writes test vectors.

Not run by ctest (CI has no PyTorch): its results are recorded in docs/torch-interop.md and its
vectors committed under tests/interop/data/torch-<version>/. Run it with the Python of a venv
that has torch (CPU is enough; gloo does the communication):

    python tools/torch_interop/torch_check.py --loom build/tools/loom/loom --out /tmp/torch-check

What it does, for every family `loom list` names that `loom export` accepts (the bidirectional
ones are refused by loom and listed as such), on 2 and 4 ranks and each shape of SHAPES:

1. `loom export --torch-csv` (compute-only form) and `loom export --torch-csv --lowered`
   (compute_comms form; `--lowered no-waits` runs `--lowered --no-waits` instead, the form of
   PyTorch 2.10-2.14, and `--lowered both` both).
2. compute-only: PyTorch's own `_validate_schedule` on the parsed actions.
3. Both forms: on P gloo processes, each rank builds its stages (a Linear + tanh per stage,
   float64, seeded by stage index), loads the file with
   `_PipelineScheduleRuntime._load_csv(file, format=...)` and runs one `step`. The stages'
   gradients are gathered on rank 0 and compared with a single-process run of the same model on
   the whole batch (mean-squared error; PyTorch divides the microbatch gradients by their number).
4. With `--vectors DIR`, PyTorch's own schedules (GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
   InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) on the shapes of VECTOR_SHAPES are dumped in
   both forms (`_dump_csv`), as PyTorch writes them. GPipe and 1F1B are single-stage schedules
   with no compute_comms dump of their own: their compute order is lowered by
   `_PipelineScheduleRuntime._prepare_schedule_with_comms`, as `_load_csv` would.

Prints one line per case and a summary; exits 1 if any case failed.
"""

import argparse
import csv
import datetime
import os
import pickle
import re
import subprocess
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as S

WIDTH = 8          # features of every stage
MB_ROWS = 2        # rows per microbatch
# (ranks, microbatches, chunks or 0 for the family's default)
SHAPES = [(2, 2, 0), (2, 5, 0), (4, 4, 0), (4, 8, 0), (2, 4, 2), (4, 8, 2)]
# PyTorch schedule class -> (the loom family it is compared with, placement, stages per rank)
TORCH_SCHEDULES = {
    "ScheduleGPipe": ("gpipe", "loop", 1),
    "Schedule1F1B": ("1f1b", "loop", 1),
    "ScheduleInterleaved1F1B": ("interleaved-1f1b", "loop", 2),
    "ScheduleLoopedBFS": ("looped-bfs", "loop", 2),
    "ScheduleInterleavedZeroBubble": ("zb-h1", "loop", 2),
    "ScheduleZBVZeroBubble": ("zb-v", "v", 2),
    "ScheduleDualPipeV": ("dualpipe-v", "v", 2),
}
VECTOR_SHAPES = [(2, 4), (4, 8), (3, 6)]

_stage_re = re.compile(r"(\d+)[A-Z_]")


def stages_of_lines(path):
    """Stage indices on each line of a PyTorch CSV (sub-actions of OVERLAP_F_B included)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return [sorted({int(m.group(1)) for cell in row for m in _stage_re.finditer(cell)}) for row in rows]


def stage_module(s):
    torch.manual_seed(1000 + s)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH, dtype=torch.float64), torch.nn.Tanh())


def batch(m):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m * MB_ROWS, WIDTH, generator=g, dtype=torch.float64)
    y = torch.randn(m * MB_ROWS, WIDTH, generator=g, dtype=torch.float64)
    return x, y


def reference_grads(num_stages, m):
    mods = [stage_module(s) for s in range(num_stages)]
    x, y = batch(m)
    out = x
    for mod in mods:
        out = mod(out)
    torch.nn.functional.mse_loss(out, y).backward()
    return {s: [p.grad.clone() for p in mods[s].parameters()] for s in range(num_stages)}


def run_case(rank, world, case):
    """Loads `case['path']` in PyTorch's runtime on this rank and runs one step; returns this
    rank's gradients by stage, or raises."""
    lines = stages_of_lines(case["path"])
    if len(lines) != world:
        raise RuntimeError(f"{case['path']} has {len(lines)} lines for {world} ranks")
    num_stages = max(max(l) for l in lines if l) + 1
    mine = lines[rank]
    mods = {s: stage_module(s) for s in mine}
    stages = [PipelineStage(mods[s], s, num_stages, torch.device("cpu")) for s in mine]
    m = case["m"]
    sched = S._PipelineScheduleRuntime(stages, m, loss_fn=torch.nn.functional.mse_loss, scale_grads=True)
    sched._load_csv(case["path"], format=case["format"])
    x, y = batch(m)
    args = (x,) if 0 in mine else ()
    kwargs = {"target": y} if num_stages - 1 in mine else {}
    sched.step(*args, **kwargs)
    return {s: [p.grad.clone() for p in mods[s].parameters()] for s in mine}, num_stages


def compare(grads, ref):
    worst = 0.0
    for s, ps in ref.items():
        if s not in grads:
            raise RuntimeError(f"no gradients for stage {s}")
        for a, b in zip(grads[s], ps):
            worst = max(worst, (a - b).abs().max().item())
    return worst


def dump_torch_vectors(rank, world, out_dir):
    """PyTorch's own schedules on `world` ranks, dumped by rank 0 in both forms."""
    written = []
    for name, (family, placement, per_rank) in TORCH_SCHEDULES.items():
        for P, m in VECTOR_SHAPES:
            if P != world:
                continue
            cls = getattr(S, name)
            single = issubclass(cls, S.PipelineScheduleSingle)
            n = P * (1 if single else per_rank)
            mine = [rank] if single else ([rank, 2 * P - 1 - rank] if placement == "v" else [rank + k * P for k in range(per_rank)])
            stages = [PipelineStage(stage_module(s), s, n, torch.device("cpu")) for s in mine]
            loss = torch.nn.functional.mse_loss
            try:
                sched = cls(stages[0], m, loss_fn=loss) if single else cls(stages, m, loss_fn=loss)
            except Exception as e:  # noqa: BLE001 - a shape PyTorch's class does not run
                written.append(f"(no {name} on {P} ranks x {m}: {str(e).splitlines()[0]})")
                continue
            base = os.path.join(out_dir, f"{name}_{P}rank_{m}mb")
            if single:
                order = sched._get_pipeline_order()
                if rank == 0:
                    with open(base + "_compute.csv", "w", newline="") as f:
                        w = csv.writer(f)
                        for r in sorted(order):
                            w.writerow(order[r])
                    written.append(os.path.basename(base) + "_compute.csv")
                compute = {r: [a for a in acts if a is not None and a.is_compute_op] for r, acts in order.items()}
                try:
                    runtime = S._PipelineScheduleRuntime(stages, m, loss_fn=loss)
                    runtime._prepare_schedule_with_comms(compute)
                except Exception as e:  # noqa: BLE001 - PyTorch refusing its own order is a result
                    written.append(f"(no {os.path.basename(base)}_comms.csv: PyTorch's lowering refuses {name}'s "
                                   f"_get_pipeline_order: {str(e).splitlines()[0]})")
                    continue
                if rank == 0:
                    runtime._dump_csv(base + "_comms.csv", format="compute_comms")
                    written.append(os.path.basename(base) + "_comms.csv")
            elif rank == 0:
                sched._dump_csv(base + "_compute.csv", format="compute_only")
                sched._dump_csv(base + "_comms.csv", format="compute_comms")
                written += [os.path.basename(base) + "_compute.csv", os.path.basename(base) + "_comms.csv"]
    return written


def worker(rank, world, cases, out_dir, vectors, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    lines = []
    for case in cases:
        status = None
        try:
            grads, num_stages = run_case(rank, world, case)
        except Exception as e:  # noqa: BLE001 - report every failure as a case result
            grads, num_stages, status = None, 0, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if os.environ.get("LOOM_TORCH_CHECK_TRACE"):
                traceback.print_exc()
        gathered = [None] * world if rank == 0 else None
        dist.gather_object((grads, num_stages, status), gathered, dst=0)
        if rank == 0:
            errors = [g[2] for g in gathered if g[2]]
            if errors:
                lines.append((case, False, errors[0]))
                continue
            merged = {}
            for g, _, _ in gathered:
                merged.update(g)
            ref = reference_grads(gathered[0][1], case["m"])
            worst = compare(merged, ref)
            lines.append((case, worst <= 1e-12, f"max |grad - reference| = {worst:.1e}"))
    if vectors:
        written = dump_torch_vectors(rank, world, vectors)
        if rank == 0:
            lines.append(({"name": f"torch vectors on {world} ranks"}, True, ", ".join(written)))
    if rank == 0:
        with open(os.path.join(out_dir, f"results-{world}.pickle"), "wb") as f:
            pickle.dump(lines, f)
    dist.barrier()
    dist.destroy_process_group()


def loom_export(loom, path, family, P, m, chunks, *extra):
    cmd = [loom, "export", "--torch-csv", path, "--schedule", family, "--ranks", str(P), "--microbatches", str(m)]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    r = subprocess.run(cmd + list(extra), capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


def parse_actions(path):
    with open(path, newline="") as f:
        return {r: [S._Action.from_str(c) for c in row] for r, row in enumerate(csv.reader(f))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loom", required=True, help="the loom binary")
    ap.add_argument("--out", required=True, help="folder for the exported files")
    ap.add_argument("--vectors", help="also dump PyTorch's own schedules into this folder")
    ap.add_argument("--lowered", choices=["waits", "no-waits", "both"], default="waits",
                    help="which lowered files to run: `--lowered` (PyTorch >= 2.15), `--lowered --no-waits` "
                         "(PyTorch 2.10-2.14), or both")
    ap.add_argument("--families", help="comma-separated families (default: all of `loom list`)")
    ap.add_argument("--port", type=int, default=29561)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.vectors:
        os.makedirs(args.vectors, exist_ok=True)
    families = args.families.split(",") if args.families else subprocess.run(
        [args.loom, "list"], capture_output=True, text=True, check=True).stdout.split()
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, loom {args.loom}")

    lowered_forms = []
    if args.lowered in ("waits", "both"):
        lowered_forms.append(("comms", "compute_comms", ["--lowered"]))
    if args.lowered in ("no-waits", "both"):
        lowered_forms.append(("comms-nowaits", "compute_comms", ["--lowered", "--no-waits"]))
    cases = {2: [], 4: []}
    refused, unrunnable, static_fail = [], [], []
    for family in families:
        for P, m, chunks in SHAPES:
            tag = f"{family}_{P}r_{m}mb" + (f"_{chunks}c" if chunks else "")
            compute = os.path.join(args.out, tag + "_compute.csv")
            rc, err = loom_export(args.loom, compute, family, P, m, chunks)
            if rc != 0:
                (refused if "directions" in err else unrunnable).append(f"{tag}: {err}")
                continue
            # PyTorch's own check of a compute-only schedule.
            try:
                acts = parse_actions(compute)
                n = max(a.stage_index for row in acts.values() for a in row for a in (a.sub_actions or (a,))) + 1
                S._validate_schedule(acts, P, n, m)
            except Exception as e:  # noqa: BLE001
                static_fail.append(f"{tag}: _validate_schedule: {type(e).__name__}: {str(e).splitlines()[0]}")
            cases[P].append({"name": tag + " compute_only", "path": compute, "format": "compute_only", "m": m})
            if not (os.environ.get("LOOM_TORCH_CHECK_SKIP_LOWERED")):
                for suffix, fmt, flags in lowered_forms:
                    path = os.path.join(args.out, f"{tag}_{suffix}.csv")
                    rc, err = loom_export(args.loom, path, family, P, m, chunks, *flags)
                    if rc != 0:
                        static_fail.append(f"{tag}: loom export {' '.join(flags)}: {err}")
                        continue
                    cases[P].append({"name": f"{tag} {suffix}", "path": path, "format": fmt, "m": m})

    validated = sum(1 for c in cases[2] + cases[4] if c["format"] == "compute_only") - len(
        [s for s in static_fail if "_validate_schedule" in s])
    passed, failed = validated, len(static_fail)
    for line in refused:
        print(f"refused by loom (bidirectional)  {line}")
    for line in unrunnable:
        print(f"shape not run by the family      {line}")
    for line in static_fail:
        print(f"FAIL  {line}")
    print(f"ok    {validated} compute-only files pass PyTorch's _validate_schedule")
    for world in sorted({2, 4} | ({P for P, _ in VECTOR_SHAPES} if args.vectors else set())):
        cases.setdefault(world, [])
        mp.start_processes(worker, args=(world, cases[world], args.out, args.vectors, args.port + world),
                           nprocs=world, join=True, start_method="spawn")
        with open(os.path.join(args.out, f"results-{world}.pickle"), "rb") as f:
            lines = pickle.load(f)
        for case, ok, detail in lines:
            passed += ok
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'}  {world} gloo ranks  {case['name']:<40} {detail}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
