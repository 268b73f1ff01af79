#!/usr/bin/env bash
# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# The main job: installs what is missing, builds the loom CLI, simulates and renders a schedule.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --preset default >/dev/null
cmake --build --preset default --target loom
./build/tools/loom/loom simulate --schedule zb-h1 --ranks 4 --microbatches 8 "$@"
./build/tools/loom/loom render --schedule zb-h1 --ranks 4 --microbatches 8
