// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Fault test: the last rank leaves in the middle of an operation, by `exit(3)` ("exit") or by an
// uncaught exception ("throw"), while rank 0 waits for a message from it and the others wait in
// an all_reduce. Every other rank must end with a comm_error naming the last rank and saying how
// it ended, within 5 s (the timeout is 30 s). Each survivor prints "FAULT-OK rank R" when it did;
// ctest counts those lines (tests/mpi/expect_lines.cmake).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "loom/comm/mpi.hpp"

int main(int argc, char** argv) {
  loom::mpi::environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "exit";
  auto c = loom::mpi::comm::world();
  c.set_timeout(std::chrono::seconds(30));
  const int n = c.size(), me = c.rank(), last = n - 1;
  double x = 1;
  c.all_reduce(std::span<double>(&x, 1), loom::reduce_op::sum);  // everyone is up
  if (me == last) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (mode == "throw") throw std::runtime_error("stage function failed on purpose");
    std::exit(3);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string what = "no error";
  int blamed = -2;
  try {
    if (me == 0) {
      std::int32_t v = 0;
      auto r = c.irecv(last, std::as_writable_bytes(std::span<std::int32_t>(&v, 1)));
      c.wait(r);
    } else {
      c.all_reduce(std::span<double>(&x, 1), loom::reduce_op::sum);
    }
  } catch (const loom::comm_error& e) {
    what = e.what();
    blamed = e.rank();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const char* how = mode == "throw" ? "uncaught exception: stage function failed on purpose" : "exited";
  const bool ok = blamed == last && what.find(how) != std::string::npos && took < 5.0;
  std::printf("rank %d ended after %.3f s with: %s\n%s rank %d\n", me, took, what.c_str(), ok ? "FAULT-OK" : "FAULT-BAD",
              me);
  std::fflush(stdout);
  return ok ? 0 : 1;
}
