#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Writes the hand-made seeds of the fuzz corpora (tests/fuzz/corpus/*/seed-*); inputs found by
fuzzing are kept beside them under their libFuzzer names. Run from anywhere; idempotent."""
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))

# Registry order (loom::builtin_families).
families = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "dualpipe", "dualpipe-v", "chimera", "bitpipe",
            "hanayo", "looped-bfs", "gpipe-2bp", "1f1b-2bp", "zb-auto", "zb-v", "v-half", "v-min"]


def small(v):  # fuzz_bytes.hpp size_like(): a mode byte < 160 gives mode % 17
    assert 0 <= v <= 16
    return bytes([v])


def raw_int(v):  # mode >= 240: the next 4 bytes, little-endian
    return bytes([240]) + struct.pack("<i", v)


def quarter(v):  # real(): a mode byte < 128 gives (mode % 16) * 0.25
    n = int(round(v * 4))
    assert 0 <= n < 16
    return bytes([n])


def raw_real(v):
    return bytes([240]) + struct.pack("<d", v)


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# engine: family, ranks, microbatches, chunks, f, b, w, c, fb, mem_w_ratio, mem_limit, placement, with_options
for i, fam in enumerate(families):
    for p, m, v in [(4, 8, 0), (2, 3, 0), (3, 9, 0), (1, 1, 0), (4, 16, 2)]:
        data = bytes([i]) + small(p) + small(m) + small(v)
        data += quarter(1) + quarter(1) + quarter(1) + quarter(0) + raw_real(-1.0) + quarter(1)
        data += quarter(0) + bytes([0 if i != 14 else 1]) + bytes([1])
        write("engine", f"{fam}-{p}x{m}x{v}", data)
    # cost-aware path with real costs and a memory limit
    data = bytes([i]) + small(4) + small(8) + small(0) + quarter(1) + quarter(1.5) + quarter(0.5) + quarter(0.25)
    data += raw_real(-1.0) + quarter(0.5) + quarter(3) + bytes([1]) + bytes([0])
    write("engine", f"{fam}-costs", data)
# edge cases: a huge shape, negative sizes, NaN costs
write("engine", "huge-1f1b", bytes([1]) + raw_int(1 << 30) + raw_int(2**31 - 1) + small(0) + bytes(12))
write("engine", "negative-gpipe", bytes([0]) + raw_int(-5) + small(4) + small(0) + bytes(12))
write("engine", "nan-cost-zb-auto", bytes([13]) + small(4) + small(8) + small(1) + raw_real(float("nan")) + bytes(9))

# torch_csv: spelling byte (0 detect, 1 current, 2 legacy), then the file
data_dir = os.path.join(here, "..", "interop", "data")
for name in sorted(os.listdir(data_dir)):
    if name.endswith(".csv"):
        with open(os.path.join(data_dir, name), "rb") as f:
            write("torch_csv", name, b"\0" + f.read())
for name, text in {
    "1f1b-2x2": "0F0,0F1,0I0,0W0,0I1,0W1\n,1F0,1I0,1W0,1F1,1I1,1W1\n",
    "legacy-2x2": "0F0,0F1,0B0,0W0,0B1,0W1\n,1F0,1B0,1W0,1F1,1B1,1W1\n",
    "overlap": "0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n",
    "comms": "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
    "quoted": "\"0F0\",\"0B0\"\n",
    "bad-cell": "0Q0\n",
    "unshard": "0UNSHARD,0F0,0B0,0RESHARD\n",
}.items():
    write("torch_csv", name, b"\1" + text.encode())

# cli: NUL-separated words, an empty word, then the contents of in.csv
def cli(name, words, csv=b""):
    write("cli", name, b"\0".join(w.encode() for w in words) + b"\0\0" + csv)

cli("simulate", ["simulate", "--schedule", "zb-h1", "--ranks", "4", "--microbatches", "8"])
cli("simulate-json", ["simulate", "--schedule", "dualpipe-v", "--ranks", "4", "--microbatches", "10", "--json"])
cli("best", ["best", "--ranks", "4", "--microbatches", "8", "--mem-limit", "4"])
cli("render", ["render", "--schedule", "zb-v", "--ranks", "4", "--microbatches", "8", "--svg", "out.svg", "--ascii"])
cli("trace", ["render", "-s", "1f1b", "-p", "2", "-m", "3", "--trace", "t.json"])
cli("list", ["list", "--long"])
cli("export", ["export", "--torch-csv", "-", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2"])
cli("torch-in", ["simulate", "--torch-csv", "in.csv"], b"0F0,0F1,0I0,0W0,0I1,0W1\n,1F0,1I0,1W0,1F1,1I1,1W1\n")
cli("costs", ["simulate", "-s", "zb-auto", "-p", "4", "-m", "8", "--f", "1", "--b", "2", "--w", "0.5", "--c", "0.1",
              "--mem-limit", "5"])
cli("bad", ["simulate", "--schedule", "zb-h1", "--ranks", "-3", "--microbatches", "8"])
cli("costs-file", ["best", "-p", "4", "-m", "8", "--costs", "in.csv", "--mem-limit", "6"],
    b'{"stages": [{"f": 1, "b": 1.2, "w": 0.8, "activation": 1.5, "message_bytes": 4096}, {"f": 2, "b": 2.5, "w": 1.5}],'
    b' "links": {"intra": {"alpha": 0.01, "beta": 1e-9}, "inter": {"alpha": 0.1, "beta": 1e-8}}, "ranks_per_node": 2,'
    b' "mem_w_ratio": 0.5}')
cli("plan", ["plan", "--model", "in.csv", "--cluster", "in.csv", "--top", "3"],
    b'{"name": "m", "layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 32000, "global_batch": 64}')
