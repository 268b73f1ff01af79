// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The asynchronous families (pipedream, pipedream-vs, pipedream-2bw, pipelined-backprop): their
// version rules as closed forms, the versions each rank keeps, the validator's rule 5 on broken
// variants, the bubble over T steps against 1F1B's, and the refusals.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "loom/schedule/format.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/pipedream.hpp"
#include "loom/schedule/registry.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/validate.hpp"

namespace {

using loom::shape;

int clamp0(int v) { return v > 0 ? v : 0; }

// Every compute action of stage `st` (one stage per rank) in program order.
std::vector<loom::action> stage_actions(const loom::schedule& s, int st) {
  std::vector<loom::action> out;
  for (auto const& a : s.programs[static_cast<std::size_t>(st)])
    if (loom::is_compute(a.kind)) out.push_back(a);
  return out;
}

// Replaces the first action of `s` matching `pred` by `edit(action)`.
template <class Pred, class Edit>
loom::schedule edited(loom::schedule s, Pred pred, Edit edit) {
  for (auto& prog : s.programs)
    for (auto& a : prog)
      if (pred(a)) {
        edit(a);
        return s;
      }
  FAIL("no action matched");
  return s;
}

}  // namespace

TEST_CASE("pipedream: forward j on stage s reads version max(j-(p-1-s), 0), its backward the same, p - s versions") {
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 3, 5})
      for (int T : {1, 4, 5}) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(T);
        const auto s = loom::generate(loom::pipedream{}, {.ranks = p, .microbatches = m, .chunks = 1, .steps = T});
        REQUIRE(s.versioned());
        CHECK(s.steps == T);
        CHECK(s.microbatches == m * T);
        CHECK(s.stash);
        const auto v = loom::validate(s);
        REQUIRE_MESSAGE(v.ok, v.message);
        const auto lv = loom::validate(loom::lower(s));
        REQUIRE_MESSAGE(lv.ok, lv.message);
        const auto sim = loom::simulate(s);
        REQUIRE(sim.ok);
        const int N = m * T;
        for (int st = 0; st < p; ++st) {
          int updates = 0;
          for (auto const& a : stage_actions(s, st)) {
            if (a.kind == loom::op::F) CHECK(a.version == clamp0(a.mb - (p - 1 - st)));
            if (a.kind == loom::op::BW) {
              CHECK(a.version == clamp0(a.mb - (p - 1 - st)));
              CHECK(a.update);  // one update per microbatch
              ++updates;
            }
          }
          CHECK(updates == N);
          // Stage s keeps p - s versions once the run is long enough that a version written at the
          // backward of j (j >= p-1-s) is read by the forward of j + p-1-s: N >= 2(p-1-s) + 1,
          // N >= 2p - 1 for every stage. In a shorter run some versions are written and never
          // read: fewer are alive than the K buffers of the v mod K layout need.
          CHECK(sim.weight_copies[static_cast<std::size_t>(st)] <= s.version_slots[static_cast<std::size_t>(st)]);
          if (N >= 2 * p - 1) {
            CHECK(sim.weight_copies[static_cast<std::size_t>(st)] == doctest::Approx(p - st));
            CHECK(s.version_slots[static_cast<std::size_t>(st)] == p - st);
          }
        }
      }
}

TEST_CASE("pipedream: update_every k updates after every k-th microbatch and after the last") {
  const auto s = loom::generate(loom::pipedream{.update_every = 3}, {.ranks = 3, .microbatches = 4, .chunks = 1, .steps = 2});
  REQUIRE(loom::validate(s).ok);
  for (int st = 0; st < 3; ++st) {
    int updates = 0;
    for (auto const& a : stage_actions(s, st))
      if (a.kind == loom::op::BW) {
        CHECK(a.update == ((a.mb + 1) % 3 == 0 || a.mb == 7));
        updates += a.update;
      } else {
        // the forward reads the number of updates done on this stage before it
        int done = 0;
        for (auto const& b : stage_actions(s, st)) {
          if (b == a) break;
          done += b.update;
        }
        CHECK(a.version == done);
      }
    CHECK(updates == 3);  // after microbatches 2, 5 and 7
  }
}

TEST_CASE("pipedream-vs: every stage reads the version the input stage read, p versions on every stage") {
  for (int p : {2, 3, 4})
    for (int m : {2, 4})
      for (int T : {4, 5}) {
        CAPTURE(p);
        CAPTURE(m);
        const auto s = loom::generate(loom::pipedream_vertical_sync{}, {.ranks = p, .microbatches = m, .chunks = 1, .steps = T});
        REQUIRE(loom::validate(s).ok);
        const auto sim = loom::simulate(s);
        for (int st = 0; st < p; ++st) {
          for (auto const& a : stage_actions(s, st)) CHECK(a.version == clamp0(a.mb - (p - 1)));
          CHECK(sim.weight_copies[static_cast<std::size_t>(st)] == doctest::Approx(p));
        }
      }
}

TEST_CASE("pipedream-2bw: step t reads version max(t-1, 0), one update per step, two versions") {
  for (int p : {2, 3, 4})
    for (int m : {p, p + 1, 2 * p})
      for (int T : {4, 6}) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(T);
        const auto s = loom::generate(loom::pipedream_2bw{}, {.ranks = p, .microbatches = m, .chunks = 1, .steps = T});
        const auto v = loom::validate(s);
        REQUIRE_MESSAGE(v.ok, v.message);
        REQUIRE(loom::validate(loom::lower(s)).ok);
        const auto sim = loom::simulate(s);
        for (int st = 0; st < p; ++st) {
          int updates = 0;
          for (auto const& a : stage_actions(s, st)) {
            CHECK(a.version == clamp0(a.mb / m - 1));
            if (a.update) {
              CHECK(a.mb % m == m - 1);  // after the step's last backward
              ++updates;
            }
          }
          CHECK(updates == T);
          CHECK(sim.weight_copies[static_cast<std::size_t>(st)] == doctest::Approx(2));
          CHECK(s.version_slots[static_cast<std::size_t>(st)] == 2);
        }
      }
  CHECK_THROWS_WITH_AS(loom::generate(loom::pipedream_2bw{}, {.ranks = 4, .microbatches = 3, .chunks = 1, .steps = 4}),
                       doctest::Contains("needs microbatches >= ranks"), loom::schedule_error);
}

TEST_CASE("pipelined-backprop: every action reads the latest version, forward and backward differ by p-1-s updates, one version") {
  for (int p : {2, 3, 4})
    for (int T : {4, 7}) {
      const auto s = loom::generate(loom::pipelined_backprop{}, {.ranks = p, .microbatches = 1, .chunks = 1, .steps = T});
      REQUIRE(loom::validate(s).ok);
      CHECK_FALSE(s.stash);
      const auto sim = loom::simulate(s);
      for (int st = 0; st < p; ++st) {
        for (auto const& a : stage_actions(s, st)) {
          if (a.kind == loom::op::F) CHECK(a.version == clamp0(a.mb - (p - 1 - st)));
          if (a.kind == loom::op::BW) CHECK(a.version == a.mb);
        }
        CHECK(sim.weight_copies[static_cast<std::size_t>(st)] == doctest::Approx(1));
      }
    }
}

TEST_CASE("validate rule 5: broken version plans are refused with the rule") {
  const auto good = loom::generate(loom::pipedream{}, {.ranks = 3, .microbatches = 2, .chunks = 1, .steps = 3});
  REQUIRE(loom::validate(good).ok);
  auto msg = [](const loom::schedule& s) { return std::string(loom::validate(s).message); };

  // Stashing off while the schedule promises it: a backward reads the latest weights.
  auto no_stash = edited(good, [](const loom::action& a) { return a.kind == loom::op::BW && a.stage == 0 && a.mb == 1; },
                         [](loom::action& a) { a.version = 1; });
  CHECK(msg(no_stash).find("weight stashing") != std::string::npos);
  // One buffer too few on stage 0: a stashed version is overwritten before its backward.
  auto fewer = good;
  fewer.version_slots[0] -= 1;
  CHECK(msg(fewer).find("dropped when version") != std::string::npos);
  // A version read before it is written.
  auto early = edited(good, [](const loom::action& a) { return a.kind == loom::op::F && a.stage == 1 && a.mb == 0; },
                      [](loom::action& a) { a.version = 1; });
  CHECK(msg(early).find("not written yet") != std::string::npos);
  // The last update removed: gradients left behind.
  auto lost = good;
  for (auto it = lost.programs[2].rbegin(); it != lost.programs[2].rend(); ++it)
    if (it->update) {
      it->update = false;
      break;
    }
  CHECK(msg(lost).find("would never be applied") != std::string::npos);
  // An update on a forward.
  auto on_forward = edited(good, [](const loom::action& a) { return a.kind == loom::op::F; }, [](loom::action& a) { a.update = true; });
  CHECK(msg(on_forward).find("only a weight-gradient action") != std::string::npos);
  // A synchronous schedule carrying a version.
  auto sync = loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2});
  sync.programs[1][1].version = 1;
  CHECK(msg(sync).find("synchronous schedule carries no weight versions") != std::string::npos);
  // The lowered replay applies rule 5 too.
  CHECK(msg(loom::lower(no_stash)).find("weight stashing") != std::string::npos);
}

TEST_CASE("bubble over T steps: the asynchronous families strictly below 1F1B's, closed form (p-1)/(Tm+p-1) at unit costs") {
  for (int p : {2, 3, 4})
    for (int m : {4, 6})
      for (int T : {4, 8}) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(T);
        const auto flush = loom::simulate(loom::generate(loom::one_f_one_b{}, {.ranks = p, .microbatches = m}));
        CHECK(flush.bubble_ratio == doctest::Approx(double(p - 1) / (m + p - 1)));
        for (auto const& e : loom::builtin_registry().entries()) {
          if (!e.multi_step) continue;
          CAPTURE(e.name);
          const auto sim = loom::simulate(e.make({.ranks = p, .microbatches = m, .chunks = 0, .steps = T}));
          REQUIRE(sim.ok);
          CHECK(sim.bubble_ratio == doctest::Approx(double(p - 1) / (T * m + p - 1)));
          CHECK(sim.bubble_ratio < flush.bubble_ratio);
          // unequal costs: still below
          const loom::costs odd{.f = 1, .b = 2, .w = 1.5, .c = 0.25};
          CHECK(loom::simulate(e.make({.ranks = p, .microbatches = m, .chunks = 0, .steps = T}), odd).bubble_ratio <
                loom::simulate(loom::generate(loom::one_f_one_b{}, {.ranks = p, .microbatches = m}), odd).bubble_ratio);
        }
      }
}

TEST_CASE("steps: synchronous families refuse steps != 1, and the registry knows the asynchronous ones and pipedream-flush") {
  CHECK_THROWS_WITH_AS(loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2, .chunks = 1, .steps = 3}),
                       doctest::Contains("1f1b is synchronous"), loom::schedule_error);
  CHECK_THROWS_WITH_AS(loom::generate(loom::pipedream{}, {.ranks = 2, .microbatches = 2, .chunks = 1, .steps = 0}),
                       doctest::Contains("needs steps >= 1"), loom::schedule_error);
  CHECK_THROWS_WITH_AS(loom::generate(loom::pipedream{}, {.ranks = 2, .microbatches = 2, .chunks = 2, .steps = 2}),
                       doctest::Contains("exactly 1 chunk"), loom::schedule_error);
  CHECK_THROWS_WITH_AS(loom::generate(loom::pipedream{.update_every = 0}, {.ranks = 2, .microbatches = 2, .chunks = 1, .steps = 2}),
                       doctest::Contains("update_every >= 1"), loom::schedule_error);
  CHECK_THROWS_WITH_AS(loom::generate(loom::pipedream{}, {.ranks = 2, .microbatches = 1 << 20, .chunks = 1, .steps = 2}),
                       doctest::Contains("microbatches x steps <="), loom::schedule_error);
  const auto reg = loom::builtin_registry();
  for (auto name : {"pipedream", "pipedream-vs", "pipedream-2bw", "pipelined-backprop"}) {
    CAPTURE(name);
    REQUIRE(reg.find(name) != nullptr);
    CHECK(reg.find(name)->multi_step);
  }
  CHECK_FALSE(reg.find("1f1b")->multi_step);
  // The alias: the same entry as 1f1b, listed once.
  REQUIRE(reg.find("pipedream-flush") != nullptr);
  CHECK(reg.find("pipedream-flush") == reg.find("1f1b"));
  int listed = 0;
  for (auto const& e : reg.entries()) listed += e.name == "1f1b" || e.name == "pipedream-flush";
  CHECK(listed == 1);
  loom::registry r2 = loom::builtin_registry();
  CHECK_THROWS_WITH_AS(r2.alias("x", "nope"), doctest::Contains("unknown schedule 'nope'"), loom::schedule_error);
  CHECK_THROWS_WITH_AS(r2.alias("gpipe", "1f1b"), doctest::Contains("already a schedule's name"), loom::schedule_error);
  // synchronous schedules hold one version per stage: the simulator's copies are param_copies
  for (auto const& e : reg.entries()) {
    if (e.multi_step) continue;
    CAPTURE(e.name);
    const auto s = e.make({.ranks = 4, .microbatches = 8, .chunks = 0});
    const auto sim = loom::simulate(s);
    for (double c : sim.weight_copies) CHECK(c == doctest::Approx(s.param_copies));
  }
}

TEST_CASE("pipedream's programs print their versions and updates as docs/asynchronous.md and the header show them") {
  const auto s = loom::generate(loom::pipedream{}, {.ranks = 3, .microbatches = 2, .chunks = 1, .steps = 2});
  CHECK(std::string(loom::format_programs(s)) ==
        "  r0 | F0@s0 F1@s0 F2@s0 BW0@s0+u F3@s0/v1 BW1@s0+u BW2@s0+u BW3@s0/v1+u\n"
        "  r1 | F0@s1 F1@s1 BW0@s1+u F2@s1/v1 BW1@s1+u F3@s1/v2 BW2@s1/v1+u BW3@s1/v2+u\n"
        "  r2 | F0@s2 BW0@s2+u F1@s2/v1 BW1@s2/v1+u F2@s2/v2 BW2@s2/v2+u F3@s2/v3 BW3@s2/v3+u\n");
}

// The same generators in constant evaluation.
static_assert(loom::validate(loom::generate(loom::pipedream{}, {.ranks = 3, .microbatches = 2, .chunks = 1, .steps = 4})).ok);
static_assert(loom::validate(loom::generate(loom::pipedream_2bw{}, {.ranks = 3, .microbatches = 3, .chunks = 1, .steps = 4})).ok);
static_assert(loom::simulate(loom::generate(loom::pipedream_2bw{}, {.ranks = 4, .microbatches = 4, .chunks = 1, .steps = 4}))
                  .weight_copies[0] == 2);

TEST_CASE("a stage's update cost lengthens every W/BW carrying an update by exactly that much, busy time included") {
  for (auto const& e : loom::builtin_registry().entries()) {
    if (!e.multi_step) continue;
    for (int p : {2, 3, 4}) {
      const loom::shape sh{.ranks = p, .microbatches = p + 1, .chunks = 0, .steps = 4};
      if (!e.check(e.resolve(sh)).empty()) continue;
      const loom::schedule s = e.make(sh);
      CAPTURE(e.name);
      CAPTURE(p);
      loom::cost_model none = loom::cost_model::uniform({}, s.stages, s.ranks), with = none;
      for (std::size_t st = 0; st < with.stages.size(); ++st) with.stages[st].update = 0.25 * static_cast<double>(st + 1);
      const auto a = loom::simulate(s, none), b = loom::simulate(s, with);
      REQUIRE(a.ok);
      REQUIRE(b.ok);
      CHECK(a.makespan == doctest::Approx(loom::simulate(s).makespan));
      CHECK(b.makespan > a.makespan);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        double extra = 0;
        auto const& prog = s.programs[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < prog.size(); ++i) {
          if (!loom::is_compute(prog[i].kind)) continue;
          const double u = prog[i].update ? with.stages[static_cast<std::size_t>(prog[i].stage)].update : 0.0;
          extra += u;
          // each action lasts its plain time plus its update
          CHECK(b.times[static_cast<std::size_t>(r)][i].end - b.times[static_cast<std::size_t>(r)][i].start ==
                doctest::Approx(a.times[static_cast<std::size_t>(r)][i].end - a.times[static_cast<std::size_t>(r)][i].start + u));
        }
        CHECK(extra > 0);
        CHECK(b.busy[static_cast<std::size_t>(r)] == doctest::Approx(a.busy[static_cast<std::size_t>(r)] + extra));
      }
    }
  }
  // A synchronous schedule carries no update: the update cost changes nothing.
  const loom::schedule flush = loom::generate(loom::one_f_one_b{}, {.ranks = 3, .microbatches = 5});
  loom::cost_model m = loom::cost_model::uniform({}, 3, 3);
  for (auto& st : m.stages) st.update = 7;
  CHECK(loom::simulate(flush, m).makespan == doctest::Approx(loom::simulate(flush).makespan));
}

TEST_CASE("the update cost is checked, and split or summed with the pieces when a model is fitted") {
  loom::cost_model m = loom::cost_model::uniform({}, 2, 2);
  m.stages[0].update = 0.5;
  m.stages[1].update = 1.5;
  const auto split = m.fit(4);
  CHECK(split.stages[0].update == doctest::Approx(0.25));
  CHECK(split.stages[3].update == doctest::Approx(0.75));
  const auto merged = m.fit(1);
  CHECK(merged.stages[0].update == doctest::Approx(2.0));
  m.stages[1].update = -1;
  CHECK(std::string(loom::detail::check_model(m)) == "cost model: stages[1].update must be a finite number >= 0 (got -1)");
}
