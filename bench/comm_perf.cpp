// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// nccl-tests-style benchmark of the threads communicator (options: see comm_perf_core.hpp).
//   comm_perf -t 4 -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 -o all

#include <cstdio>
#include <exception>

#include "comm_perf_core.hpp"
#include "loom/comm/threads.hpp"

int main(int argc, char** argv) {
  comm_perf::options o;
  if (!comm_perf::parse(argc, argv, o)) return 2;
  comm_perf::print_header("comm_perf", "threads", o.ranks, o);
  try {
    loom::run_threads(o.ranks, [&](loom::threads::comm& c) { comm_perf::run(c, o); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_perf: %s\n", e.what());
    return 1;
  }
}
