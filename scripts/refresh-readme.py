#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
"""Rewrites README.md's output blocks from the real binaries in build/ (after
`cmake --build --preset default`): the block after "a test checks that this block is current"
gets the quick example's output, and every `$ loom ...` line in a fenced block is followed by
that command's real output up to the closing fence."""
import pathlib, subprocess, sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = root / "README.md"
text = readme.read_text()

def run(args):
    return subprocess.run(args, cwd=root, check=True, capture_output=True, text=True).stdout.rstrip("\n")

def fill(text, after, output):
    """Replaces what follows the first occurrence of `after` up to the next closing fence."""
    at = text.index(after) + len(after)
    end = text.index("```", at)
    return text[:at] + output + "\n" + text[end:]

anchor = "a test checks that this block is current):\n\n```\n"
text = fill(text, anchor, run([str(root / "build/examples/00_schedule_lab/schedule_lab_quick")]))
for line in [l for l in text.splitlines() if l.startswith("$ loom ")]:
    text = fill(text, line + "\n", run([str(root / "build/tools/loom/loom")] + line.split()[2:]))
readme.write_text(text)
print("README.md refreshed", file=sys.stderr)
