// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The body of the nccl-tests-style communicator benchmarks (comm_perf: threads;
//! mpi_comm_perf: MPI), written once over `loom::communicator`.
//!
//! Options (as nccl-tests): -b min bytes, -e max bytes, -f multiplication factor, -n timed
//! iterations, -w warm-up iterations, -c 1|0 check results (#wrong), -o operation
//! (sendrecv|pingpong|all_reduce|all_gather|reduce_scatter|all_to_all|all), -d type
//! (float|double|int32|int64), -t ranks (threads backend only). The size is the total buffer
//! of one rank as nccl-tests counts it (for all_gather/reduce_scatter the gathered/scattered
//! whole). time = mean over iterations of the slowest rank; algbw = size/time; busbw = algbw
//! times nccl-tests' factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
//! (n-1)/n; sendrecv 1); pingpong reports half a round trip, rank 0 <-> rank 1.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"

namespace comm_perf {

struct options {
  std::size_t min_bytes = 8, max_bytes = std::size_t{64} << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  int check = 1;
  std::string op = "all";
  std::string type = "float";
  int ranks = 2;
};

//! Parses nccl-tests-style flags; returns false (after a message) on a bad one.
inline bool parse(int argc, char** argv, options& o) {
  auto bytes = [](const char* s) {
    char* end = nullptr;
    double v = std::strtod(s, &end);
    std::string u = end ? end : "";
    if (u == "K" || u == "k") v *= 1024;
    if (u == "M" || u == "m") v *= 1024 * 1024;
    if (u == "G" || u == "g") v *= 1024.0 * 1024 * 1024;
    return static_cast<std::size_t>(v);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "comm_perf: option %s needs a value\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "-b") o.min_bytes = bytes(v);
    else if (a == "-e") o.max_bytes = bytes(v);
    else if (a == "-f") o.factor = std::atof(v);
    else if (a == "-n") o.iters = std::atoi(v);
    else if (a == "-w") o.warmup = std::atoi(v);
    else if (a == "-c") o.check = std::atoi(v);
    else if (a == "-o") o.op = v;
    else if (a == "-d") o.type = v;
    else if (a == "-t") o.ranks = std::atoi(v);
    else {
      std::fprintf(stderr, "comm_perf: unknown option %s\n", a.c_str());
      return false;
    }
  }
  if (o.factor <= 1 || o.iters < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes || o.ranks < 1) {
    std::fprintf(stderr, "comm_perf: need -f > 1, -n >= 1, -w >= 0, -b <= -e, -t >= 1\n");
    return false;
  }
  return true;
}

template <class T>
T fill_value(int r, std::size_t i) {
  return static_cast<T>(static_cast<int>((static_cast<std::size_t>(r) * 5 + i * 3) % 19));
}

//! One table for one operation and element type.
template <class T, loom::communicator C>
void run_op(C& c, const options& o, const std::string& op, const char* tname) {
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  const bool print = me == 0;
  if (op == "pingpong" && n < 2) return;
  if (print) {
    std::printf("#\n# %s\n#%12s %12s %7s %6s %12s %12s %12s %8s\n", op.c_str(), "size(B)", "count", "type", "redop",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = std::max(bytes + 1, static_cast<std::size_t>(static_cast<double>(bytes) * o.factor))) {
    // count: elements per rank buffer; for segmented ops a multiple of n
    std::size_t count = bytes / sizeof(T);
    const bool segmented = op == "all_gather" || op == "reduce_scatter" || op == "all_to_all";
    if (segmented) count = count / un * un;
    if (count == 0) continue;
    const std::size_t seg = segmented ? count / un : count;
    std::vector<T> a(count), b(count);
    for (std::size_t i = 0; i < count; ++i) a[i] = fill_value<T>(me, i);
    auto once = [&] {
      if (op == "all_reduce") {
        c.all_reduce(std::span<T>(b), loom::reduce_op::sum);
      } else if (op == "all_gather") {
        c.all_gather(std::span<const T>(a.data(), seg), std::span<T>(b));
      } else if (op == "reduce_scatter") {
        c.reduce_scatter(std::span<const T>(a), std::span<T>(b.data(), seg), loom::reduce_op::sum);
      } else if (op == "all_to_all") {
        c.all_to_all(std::span<const T>(a), std::span<T>(b));
      } else if (op == "sendrecv") {
        auto r = c.irecv((me + n - 1) % n, std::as_writable_bytes(std::span<T>(b)));
        auto s = c.isend((me + 1) % n, std::as_bytes(std::span<const T>(a)));
        c.wait(s);
        c.wait(r);
      } else if (op == "pingpong") {
        if (me == 0) {
          auto s = c.isend(1, std::as_bytes(std::span<const T>(a)));
          auto r = c.irecv(1, std::as_writable_bytes(std::span<T>(b)));
          c.wait(s);
          c.wait(r);
        } else if (me == 1) {
          auto r = c.irecv(0, std::as_writable_bytes(std::span<T>(b)));
          c.wait(r);
          auto s = c.isend(0, std::as_bytes(std::span<const T>(b)));
          c.wait(s);
        }
      }
    };
    for (int i = 0; i < o.warmup; ++i) once();
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) once();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / o.iters;
    c.all_reduce(std::span<double>(&us, 1), loom::reduce_op::max);
    if (op == "pingpong") us /= 2;
    // check: one more call on fresh inputs, compared with closed formulas
    long long wrong = 0;
    if (o.check) {
      for (std::size_t i = 0; i < count; ++i) b[i] = op == "all_reduce" ? fill_value<T>(me, i) : T{};
      once();
      if (op == "all_reduce") {
        for (std::size_t i = 0; i < count; ++i) {
          T e{};
          for (int r = 0; r < n; ++r) e = static_cast<T>(e + fill_value<T>(r, i));
          wrong += b[i] != e;
        }
      } else if (op == "all_gather") {
        for (std::size_t i = 0; i < count; ++i) wrong += b[i] != fill_value<T>(static_cast<int>(i / seg), i % seg);
      } else if (op == "reduce_scatter") {
        for (std::size_t i = 0; i < seg; ++i) {
          T e{};
          for (int r = 0; r < n; ++r) e = static_cast<T>(e + fill_value<T>(r, static_cast<std::size_t>(me) * seg + i));
          wrong += b[i] != e;
        }
      } else if (op == "all_to_all") {
        for (std::size_t i = 0; i < count; ++i)
          wrong += b[i] != fill_value<T>(static_cast<int>(i / seg), static_cast<std::size_t>(me) * seg + i % seg);
      } else if (op == "sendrecv") {
        for (std::size_t i = 0; i < count; ++i) wrong += b[i] != fill_value<T>((me + n - 1) % n, i);
      } else if (op == "pingpong" && me == 0) {
        for (std::size_t i = 0; i < count; ++i) wrong += b[i] != fill_value<T>(0, i);
      }
      c.all_reduce(std::span<long long>(&wrong, 1), loom::reduce_op::sum);
    }
    const double size = static_cast<double>(count * sizeof(T));
    const double algbw = size / us / 1e3;
    double factor = 1;
    if (op == "all_reduce") factor = 2.0 * (n - 1) / n;
    if (segmented) factor = static_cast<double>(n - 1) / n;
    if (print) {
      std::printf(" %12zu %12zu %7s %6s %12.2f %12.3f %12.3f %8s\n", count * sizeof(T), count, tname,
                  op == "all_reduce" || op == "reduce_scatter" ? "sum" : "none", us, algbw, algbw * factor,
                  o.check ? std::to_string(wrong).c_str() : "N/A");
      std::fflush(stdout);
    }
  }
}

//! Runs the selected operations on this rank; rank 0 prints.
template <loom::communicator C>
void run(C& c, const options& o) {
  std::vector<std::string> ops = {o.op};
  if (o.op == "all") ops = {"sendrecv", "pingpong", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  for (const auto& op : ops) {
    if (o.type == "float") run_op<float>(c, o, op, "float");
    else if (o.type == "double") run_op<double>(c, o, op, "double");
    else if (o.type == "int32") run_op<std::int32_t>(c, o, op, "int32");
    else run_op<std::int64_t>(c, o, op, "int64");
  }
}

//! The `#` header recording every setting.
inline void print_header(const char* program, const char* backend, int ranks, const options& o) {
  std::printf("# %s: backend %s, ranks %d\n", program, backend, ranks);
  std::printf("#  minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d validation: %d op: %s type: %s\n",
              o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.check, o.op.c_str(), o.type.c_str());
}

}  // namespace comm_perf
