// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Actual-access tracking (see include/loom/cudasim/sim.hpp, "What it checks"). Code compiled by
// clang with -fsanitize-coverage=trace-pc-guard,trace-loads,trace-stores (CMake:
// loom_cuda_stage(target)) calls __sanitizer_cov_load<N>(addr) / __sanitizer_cov_store<N>(addr)
// before every load and store (src/cudasim/tracking.cpp). While the engine runs a kernel or host
// function it points `current_log` at that operation's log, and the callbacks add the address
// ranges there (see access_log); after the payload the engine merges the ranges and checks them
// like declared ones (core.cpp). Outside a payload `current_log` is null and a callback returns
// at once.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::cudasim::impl {

//! The byte ranges one operation's payload read and wrote. Open ranges sit in a small table
//! keyed by their end address, so an access that continues any of them (a row read element by
//! element, or the columns of a matrix read one row after another: as many open ranges as there
//! are columns) extends it in a few instructions; a range pushed out of the table by another goes
//! to a list, merged at the end.
struct access_log {
  struct range {
    std::uintptr_t lo = 0, hi = 0;
  };
  std::vector<range> reads, writes;           // ranges out of the tables
  std::uintptr_t lo_bound = 0, hi_bound = 0;  // the device allocations' span when the payload started
  std::size_t accesses = 0;

  access_log() : open_(2 * slots) {}

  //! Records `n` bytes at `a` (a load, or a store when `write`).
  void add(std::uintptr_t a, std::size_t n, bool write) {
    if (a < lo_bound || a >= hi_bound) return;  // not device memory: skipped fast
    ++accesses;
    range* t = open_.data() + (write ? slots : 0);
    auto& v = write ? writes : reads;
    range& r = t[slot(a)];
    if (r.hi == a && r.hi != 0) {  // continues the range that ends here
      const range grown{r.lo, a + n};
      r = {};
      put(t, v, grown);
      return;
    }
    range& q = t[slot(a + n)];
    if (q.hi == a + n && q.hi != 0 && q.lo <= a) return;  // inside the range that ends with it
    put(t, v, {a, a + n});
  }
  //! Moves the open ranges to the lists and merges each list.
  void finish() {
    for (std::size_t i = 0; i < 2 * slots; ++i)
      if (open_[i].hi != 0) (i < slots ? reads : writes).push_back(open_[i]);
    std::fill(open_.begin(), open_.end(), range{});
    compact(reads);
    compact(writes);
  }

 private:
  static constexpr std::size_t slots = 1024;  // per kind
  static constexpr std::size_t compact_at = std::size_t{1} << 16;
  static std::size_t slot(std::uintptr_t end) { return static_cast<std::size_t>(((end >> 2) * 0x9E3779B97F4A7C15ull) >> 54); }
  //! Opens `x` in its slot; a different range there goes to the list (one with the same end is merged).
  void put(range* t, std::vector<range>& v, range x) {
    range& s = t[slot(x.hi)];
    if (s.hi == x.hi) {
      s.lo = std::min(s.lo, x.lo);
      return;
    }
    if (s.hi != 0) {
      v.push_back(s);
      if (v.size() >= compact_at) compact(v);
    }
    s = x;
  }
  static void compact(std::vector<range>& v) {
    std::sort(v.begin(), v.end(), [](const range& x, const range& y) { return x.lo < y.lo; });
    std::size_t k = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (k > 0 && v[i].lo <= v[k - 1].hi) {
        v[k - 1].hi = std::max(v[k - 1].hi, v[i].hi);
        continue;
      }
      v[k++] = v[i];
    }
    v.resize(k);
  }
  std::vector<range> open_;  // reads' table, then writes'
};

//! The log of the operation whose payload the calling thread is running, or null.
extern thread_local access_log* current_log;
//! Set by the callbacks' first call: instrumented code is linked and has run.
extern bool tracking_seen;

}  // namespace loom::cudasim::impl
