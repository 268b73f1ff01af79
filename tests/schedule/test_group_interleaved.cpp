// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// group-interleaved-1f1b (PipeOffload, Wan et al. ICML 2025) against the authors' own generator:
// tests/schedule/data/group_interleaved_reference.csv holds, per shape, the per-rank peaks and a
// digest of the per-rank orders their GroupBuildingBlockScheduler produces (its header names the
// commit and the command, tools/zb-reference/group_interleaved_reference.py).
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "loom/schedule.hpp"
#include "reference_csv.hpp"

namespace {

struct ref_row {
  int p = 0, m = 0, v = 0, g = 0;
  std::vector<int> peaks;
  std::uint64_t digest = 0;
};

std::vector<ref_row> read_reference() {
  std::vector<ref_row> rows;
  for (const std::string& line : loom_ref::data_lines(LOOM_SOURCE_DIR "/tests/schedule/data/group_interleaved_reference.csv")) {
    std::istringstream f(line);
    ref_row r;
    char comma = 0;
    std::string peaks, digest;
    f >> r.p >> comma >> r.m >> comma >> r.v >> comma >> r.g >> comma;
    std::getline(f, peaks, ',');
    std::getline(f, digest);
    std::istringstream ps(peaks);
    for (int x = 0; ps >> x;) r.peaks.push_back(x);
    r.digest = std::stoull(digest, nullptr, 16);
    rows.push_back(r);
  }
  return rows;
}

// FNV-1a 64 of the per-rank programs, each action as loom writes it, ranks joined by newlines:
// the same text the reference script hashes.
std::uint64_t digest(const loom::schedule& s) {
  std::string all;
  for (std::size_t r = 0; r < s.programs.size(); ++r) {
    if (r > 0) all.push_back('\n');
    bool first = true;
    for (const auto& a : s.programs[r]) {
      if (!first) all.push_back(' ');
      first = false;
      all += std::string(loom::to_string(a));
    }
  }
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : all) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

TEST_CASE("group-interleaved-1f1b: the per-rank orders and peaks equal the PipeOffload authors' generator on 460 shapes") {
  const auto rows = read_reference();
  REQUIRE(rows.size() == 460);
  for (const auto& r : rows) {
    CAPTURE(r.p);
    CAPTURE(r.m);
    CAPTURE(r.v);
    CAPTURE(r.g);
    const loom::schedule s =
        loom::generate(loom::group_interleaved_1f1b{}, {.ranks = r.p, .microbatches = r.m, .chunks = r.v, .group = r.g});
    CHECK(digest(s) == r.digest);
    REQUIRE(loom::validate(loom::lower(s)).ok);
    const auto sim = loom::simulate(s);
    REQUIRE(sim.ok);
    REQUIRE(r.peaks.size() == static_cast<std::size_t>(r.p));
    // loom's unit is one microbatch through a rank's share; a chunk-activation is 1/v of it.
    // (A chunk allocates 1/v, so the sum is exact only up to rounding for v = 3.)
    for (int k = 0; k < r.p; ++k)
      CHECK(sim.peak_activation[static_cast<std::size_t>(k)] * r.v == doctest::Approx(r.peaks[static_cast<std::size_t>(k)]).epsilon(1e-12));
  }
}

TEST_CASE("group-interleaved-1f1b: group p keeps Megatron's interleaved forward and backward order and a smaller group holds less") {
  for (int p : {2, 4, 6, 8})
    for (int v : {2, 3}) {
      const int m = 2 * p;
      const loom::schedule full = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v, .group = p});
      const loom::schedule mega = loom::generate(loom::interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v});
      for (int r = 0; r < p; ++r) {
        // The forwards, and the backwards (split into B and W here, fused in Megatron's), in the same order.
        std::vector<loom::action> fa, fb, ma, mb;
        for (auto a : full.programs[static_cast<std::size_t>(r)]) {
          if (a.kind == loom::op::F) fa.push_back(a);
          if (a.kind == loom::op::B) fb.push_back(loom::backward(a.mb, a.stage));
        }
        for (auto a : mega.programs[static_cast<std::size_t>(r)]) (a.kind == loom::op::F ? ma : mb).push_back(a);
        CHECK(fa == ma);
        CHECK(fb == mb);
      }
      const int lo = (p + 1) / 2;
      const auto small = loom::simulate(loom::generate(loom::group_interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v, .group = lo}));
      const auto big = loom::simulate(full);
      if (lo < p) CHECK(small.max_peak_activation() < big.max_peak_activation());
    }
}

TEST_CASE("group-interleaved-1f1b: the group defaults to ceil(p/2) and is refused outside ceil(p/2)..p, one line each") {
  const auto def = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = 5, .microbatches = 10, .chunks = 2});
  const auto three = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = 5, .microbatches = 10, .chunks = 2, .group = 3});
  CHECK(def.programs == three.programs);
  CHECK(std::string(loom::check(loom::group_interleaved_1f1b{}, {.ranks = 5, .microbatches = 10, .chunks = 2, .group = 2})) ==
        "group-interleaved-1f1b needs a group size between ceil(p/2) = 3 and p = 5 (got group=2)");
  CHECK(std::string(loom::check(loom::group_interleaved_1f1b{}, {.ranks = 5, .microbatches = 10, .chunks = 2, .group = 6})) ==
        "group-interleaved-1f1b needs a group size between ceil(p/2) = 3 and p = 5 (got group=6)");
  CHECK_THROWS_WITH_AS(loom::generate(loom::group_interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2, .group = -1}),
                       "group-interleaved-1f1b needs a group size between ceil(p/2) = 2 and p = 4 (got group=-1)", loom::schedule_error);
  // Every other family has no groups.
  CHECK_THROWS_WITH_AS(loom::generate(loom::interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2, .group = 2}),
                       "interleaved-1f1b issues no microbatch groups (got group=2; --group is for the grouped families, e.g. "
                       "group-interleaved-1f1b)",
                       loom::schedule_error);
  CHECK(loom::default_registry().at("group-interleaved-1f1b").grouped);
  CHECK_FALSE(loom::default_registry().at("1f1b").grouped);
  CHECK(loom::default_registry().at("1f1b").check({.ranks = 4, .microbatches = 8, .chunks = 1, .group = 3}) ==
        "1f1b issues no microbatch groups (got group=3; --group is for the grouped families, e.g. group-interleaved-1f1b)");
}

// At compile time, as every family.
static_assert(loom::validate(loom::lower(loom::generate(loom::group_interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2, .group = 2})))
                  .ok);
static_assert(loom::simulate(loom::generate(loom::group_interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2, .group = 2}))
                  .max_peak_activation() == 3.0);
