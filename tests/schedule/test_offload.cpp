// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::plan_offload (PipeOffload, Wan et al. ICML 2025) against the authors' scheduler:
// tests/schedule/data/offload_reference.csv holds their per-rank peaks (or their refusal) for the
// issue's grid, written by tools/zb-reference/offload_reference.py (its header has the command).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "loom/schedule.hpp"
#include "loom/schedule/offload.hpp"
#include "reference_csv.hpp"

namespace {

struct ref_row {
  int p = 0, m = 0, v = 0, g = 0, k = 0;
  double time = 0, scale = 0;
  bool refused = false;
  std::vector<int> peaks;
};

std::vector<ref_row> read_reference() {
  std::vector<ref_row> rows;
  for (const std::string& line : loom_ref::data_lines(LOOM_SOURCE_DIR "/tests/schedule/data/offload_reference.csv")) {
    std::istringstream f(line);
    ref_row r;
    char c = 0;
    f >> r.p >> c >> r.m >> c >> r.v >> c >> r.g >> c >> r.k >> c >> r.time >> c >> r.scale >> c;
    std::string rest;
    std::getline(f, rest);
    r.refused = rest == "refused";
    std::istringstream ps(rest);
    for (int x = 0; !r.refused && ps >> x;) r.peaks.push_back(x);
    rows.push_back(r);
  }
  return rows;
}

loom::schedule grouped(int p, int m, int v, int g) {
  return loom::generate(loom::group_interleaved_1f1b{}, {.ranks = p, .microbatches = m, .chunks = v, .group = g});
}

// The authors' costs are per stage (one chunk); loom's per rank share, a chunk being 1/v of it.
loom::costs per_stage(double f, int v) { return {.f = f * v, .b = f * v, .w = f * v, .c = 0}; }

}  // namespace

TEST_CASE("offload: the plan's peaks and refusals equal the PipeOffload authors' scheduler on 224 cells") {
  const auto rows = read_reference();
  REQUIRE(rows.size() == 224);
  int refused = 0;
  for (const auto& r : rows) {
    CAPTURE(r.p);
    CAPTURE(r.v);
    CAPTURE(r.g);
    CAPTURE(r.k);
    CAPTURE(r.time);
    CAPTURE(r.scale);
    const auto plan = loom::plan_offload(grouped(r.p, r.m, r.v, r.g), per_stage(r.scale, r.v), {.chunks = r.k, .time = r.time});
    CHECK(plan.ok == !r.refused);
    if (r.refused) {
      ++refused;
      CHECK(std::string(plan.error).find("cannot copy the activation of") != std::string::npos);
      continue;
    }
    REQUIRE(plan.peak_activation.size() == static_cast<std::size_t>(r.p));
    for (int k = 0; k < r.p; ++k)
      CHECK(plan.peak_activation[static_cast<std::size_t>(k)] * r.v == doctest::Approx(r.peaks[static_cast<std::size_t>(k)]).epsilon(1e-12));
  }
  CHECK(refused == 36);
}

TEST_CASE("offload: every offloaded activation goes out after its forward and comes back before its backward, one copy at a time per link") {
  for (int p : {4, 6, 8})
    for (int v : {2, 3, 4})
      for (int g = (p + 1) / 2; g <= p; ++g) {
        const loom::schedule s = grouped(p, 3 * p + 1, v, g);
        const loom::costs k = per_stage(1.0, v);
        const auto sim = loom::simulate(s, k);
        const auto plan = loom::plan_offload(s, k, {.chunks = 1, .time = 0.2});
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(g);
        REQUIRE(plan.ok);
        // Where each (stage, mb) runs its forward and its input backward.
        std::vector<double> f_end(static_cast<std::size_t>(s.stages * s.microbatches)), b_start = f_end;
        for (int r = 0; r < p; ++r)
          for (std::size_t i = 0; i < s.programs[static_cast<std::size_t>(r)].size(); ++i) {
            const auto& a = s.programs[static_cast<std::size_t>(r)][i];
            const std::size_t key = static_cast<std::size_t>(a.stage * s.microbatches + a.mb);
            if (a.kind == loom::op::F) f_end[key] = sim.times[static_cast<std::size_t>(r)][i].end;
            if (a.kind == loom::op::B) b_start[key] = sim.times[static_cast<std::size_t>(r)][i].start;
          }
        std::set<std::tuple<int, int>> out, back;
        for (const auto& c : plan.copies) {
          CHECK(c.stage / p == 0);  // only the first chunk
          CHECK(c.stage % p == c.rank);
          CHECK(c.end > c.start);
          const std::size_t key = static_cast<std::size_t>(c.stage * s.microbatches + c.mb);
          if (!c.reload) {
            CHECK(c.start >= f_end[key]);  // the warm-up may postpone the forward, never advance it
            out.insert({c.stage, c.mb});
          } else {
            CHECK(c.end < b_start[key]);
            back.insert({c.stage, c.mb});
          }
        }
        CHECK(out == back);
        CHECK(!out.empty());
        for (const auto& c : plan.copies)
          if (c.reload)
            for (const auto& o : plan.copies)
              if (!o.reload && o.stage == c.stage && o.mb == c.mb) CHECK(c.start > o.end);
        // Each pair of ranks shares a link, one copy at a time in each direction.
        for (int pr = 0; pr < p; pr += 2)
          for (bool reload : {false, true}) {
            std::vector<std::pair<double, double>> spans;
            for (const auto& c : plan.copies)
              if (c.rank / 2 == pr / 2 && c.reload == reload) spans.push_back({c.start, c.end});
            std::sort(spans.begin(), spans.end());
            for (std::size_t i = 1; i < spans.size(); ++i) CHECK(spans[i].first >= spans[i - 1].second - 1e-9);
          }
        for (int r = 0; r < p; ++r)
          CHECK(plan.peak_activation[static_cast<std::size_t>(r)] <= plan.peak_without[static_cast<std::size_t>(r)] + 1e-12);
        CHECK(plan.peak_without == sim.peak_activation);
      }
}

TEST_CASE("offload: refusals, one line each") {
  const loom::schedule s = grouped(4, 8, 2, 2);
  const loom::costs k = per_stage(1.0, 2);
  CHECK(std::string(loom::plan_offload(s, k, {.chunks = 3, .time = 0.2}).error) ==
        "offload needs 0 <= offloaded chunks <= chunks per rank = 2 (got 3)");
  CHECK(std::string(loom::plan_offload(s, k, {.chunks = -1, .time = 0.2}).error) ==
        "offload needs 0 <= offloaded chunks <= chunks per rank = 2 (got -1)");
  CHECK(std::string(loom::plan_offload(s, k, {.chunks = 1, .time = 0}).error) == "offload time must be a finite number > 0 (got 0)");
  CHECK(std::string(loom::plan_offload(grouped(3, 6, 2, 2), k, {.chunks = 1, .time = 0.2}).error) ==
        "offload pairs ranks on a host link and needs an even number of ranks (got 3)");
  CHECK(std::string(loom::plan_offload(loom::generate(loom::zb_v{}, {.ranks = 4, .microbatches = 8}), k, {.chunks = 1, .time = 0.2}).error) ==
        "offload plans the loop placement only");
  // No offload: the schedule's own peaks.
  const auto none = loom::plan_offload(s, k, {.chunks = 0, .time = 0.2});
  CHECK(none.ok);
  CHECK(none.copies.empty());
  CHECK(none.peak_activation == loom::simulate(s, k).peak_activation);
}
