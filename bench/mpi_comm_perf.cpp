// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// nccl-tests-style benchmark of the MPI communicator (options: see comm_perf_core.hpp; the rank
// count is mpiexec's -n).
//   mpiexec -n 2 mpi_comm_perf -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 -o all

#include <cstdio>

#if defined(LOOM_HAS_MPI)
#include <exception>

#include "comm_perf_core.hpp"
#include "loom/comm/mpi.hpp"

int main(int argc, char** argv) {
  loom::mpi::environment env(argc, argv);
  comm_perf::options o;
  if (!comm_perf::parse(argc, argv, o)) return 2;
  try {
    loom::run_mpi([&](loom::mpi::comm& c) {
      if (c.rank() == 0) comm_perf::print_header("mpi_comm_perf", "mpi", c.size(), o);
      comm_perf::run(c, o);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_comm_perf: %s\n", e.what());
    return 1;
  }
}
#else
int main() {
  std::puts("mpi_comm_perf: loom was built without MPI");
  return 0;
}
#endif
