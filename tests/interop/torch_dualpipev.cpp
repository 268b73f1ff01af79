// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Must show (issue 3): loom's own `dualpipe-v` for 4 ranks x 10 microbatches is at least as good
// as PyTorch's DualPipeV schedule (imported from the shared test vector) under the same costs:
// makespan, bubble rate and peak activation each no worse.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <loom/render/torch_csv.hpp>
#include <loom/schedule.hpp>

namespace {

loom::schedule imported_dualpipev() {
  auto path = std::filesystem::path(__FILE__).parent_path() / "data" /
              "dualpipev_4rank_10mb.csv";
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return loom::read_torch_csv(ss.str(), {.name = "torch:dualpipev_4rank_10mb.csv"});
}

}  // namespace

TEST_CASE("Loom's dualpipe-v on 4 ranks x 10 microbatches is at least as good as PyTorch's DualPipeV") {
  const loom::schedule theirs = imported_dualpipev();
  REQUIRE(loom::validate(theirs).ok);
  const loom::family_entry* e = loom::default_registry().find("dualpipe-v");
  if (e == nullptr) {
    MESSAGE("dualpipe-v is not registered in this build; nothing to compare");
    return;
  }
  const loom::schedule ours = e->make({.ranks = 4, .microbatches = 10});
  auto v = loom::validate(ours);
  REQUIRE_MESSAGE(v.ok, v.message);
  CHECK(ours.ranks == theirs.ranks);
  CHECK(ours.stages == theirs.stages);
  CHECK(ours.microbatches == theirs.microbatches);
  CHECK(ours.param_copies == 1);

  // Unit costs; backward-heavy; with p2p latency; overlapped pairs cheaper than their parts (the
  // point of DualPipe's F&B overlap); W-light with comm; forward-heavy; and a memory ratio < 1.
  const loom::costs settings[] = {
      {.f = 1, .b = 1, .w = 1},
      {.f = 1, .b = 2, .w = 1},
      {.f = 1, .b = 1, .w = 1, .c = 0.1},
      {.f = 1, .b = 1, .w = 1, .fb = 1.5},
      {.f = 1, .b = 1.2, .w = 0.8, .c = 0.05, .fb = 2.4},
      {.f = 1, .b = 3, .w = 0.5, .c = 0.3},
      {.f = 2, .b = 1, .w = 1},
      {.f = 1, .b = 1, .w = 1, .mem_w_ratio = 0.5},
  };
  for (const loom::costs& k : settings) {
    CAPTURE(k.f);
    CAPTURE(k.b);
    CAPTURE(k.w);
    CAPTURE(k.c);
    CAPTURE(k.fb);
    CAPTURE(k.mem_w_ratio);
    auto a = loom::simulate(theirs, k);
    auto b = loom::simulate(ours, k);
    REQUIRE(a.ok);
    REQUIRE(b.ok);
    MESSAGE("torch DualPipeV: makespan " << a.makespan << ", bubble rate " << a.bubble_rate << ", peak "
                                         << a.max_peak_activation() << " | loom dualpipe-v: makespan " << b.makespan
                                         << ", bubble rate " << b.bubble_rate << ", peak " << b.max_peak_activation());
    CHECK(b.makespan <= a.makespan + 1e-9);
    CHECK(b.bubble_rate <= a.bubble_rate + 1e-9);
    for (std::size_t r = 0; r < 4; ++r) CHECK(b.peak_activation[r] <= a.peak_activation[r] + 1e-9);
  }
}
