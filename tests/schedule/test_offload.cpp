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
#include "loom/render/torch_csv.hpp"
#include "loom/schedule/offload.hpp"
#include "loom/stage/buffer_plan.hpp"
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
  CHECK(std::string(loom::plan_offload(loom::generate(loom::interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2}), k,
                                       {.chunks = 1, .time = 0.2})
                        .error)
            .starts_with("offload plans a split backward (B, then W): schedule interleaved-1f1b fuses them (BW"));
  // No offload: the schedule's own peaks.
  const auto none = loom::plan_offload(s, k, {.chunks = 0, .time = 0.2});
  CHECK(none.ok);
  CHECK(none.copies.empty());
  CHECK(none.peak_activation == loom::simulate(s, k).peak_activation);
}

namespace {

// Positions of the copies of (stage, mb) in a rank's program: offload, reload.
std::size_t position_of(const loom::schedule& s, int rank, const loom::action& a) {
  auto const& prog = s.programs[static_cast<std::size_t>(rank)];
  return static_cast<std::size_t>(std::find(prog.begin(), prog.end(), a) - prog.begin());
}

}  // namespace

TEST_CASE("with_offload: the plan's copies as actions validate, lower, and hide behind compute, and free copies change no time") {
  int programs = 0;
  for (int p : {4, 6, 8})
    for (int v : {2, 3, 4})
      for (int g = (p + 1) / 2; g <= p; ++g)
        for (int k = 1; k <= v; ++k) {
          const loom::schedule s = grouped(p, 3 * p + 1, v, g);
          const loom::costs c = per_stage(1.0, v);
          const auto plan = loom::plan_offload(s, c, {.chunks = k, .time = 0.2});
          if (!plan.ok) continue;
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(g);
          CAPTURE(k);
          const loom::schedule o = loom::with_offload(s, plan);
          ++programs;
          const auto v1 = loom::validate(o);
          CHECK_MESSAGE(v1.ok, std::string(v1.message));
          const auto v2 = loom::validate(loom::lower(o));
          CHECK_MESSAGE(v2.ok, std::string(v2.message));
          // Every copy of the plan is an action, where the plan starts it.
          std::size_t copies = 0;
          for (auto const& prog : o.programs)
            for (const auto& a : prog) copies += loom::is_host_copy(a.kind) ? 1 : 0;
          CHECK(copies == plan.copies.size());
          for (const auto& cp : plan.copies) {
            const loom::action a = cp.reload ? loom::reload_from_host(cp.mb, cp.stage) : loom::offload_to_host(cp.mb, cp.stage);
            const std::size_t at = position_of(o, cp.rank, a);
            REQUIRE(at < o.programs[static_cast<std::size_t>(cp.rank)].size());
            // The compute actions before it are those before `position` in the plain program.
            std::size_t compute = 0;
            for (std::size_t i = 0; i < at; ++i) compute += loom::is_compute(o.programs[static_cast<std::size_t>(cp.rank)][i].kind) ? 1 : 0;
            CHECK(compute == cp.position);
          }
          // Copies that take no time delay nothing: every compute action keeps its times.
          const auto base = loom::simulate(s, c);
          const auto free = loom::simulate(o, c);
          REQUIRE(free.ok);
          CHECK(free.makespan == base.makespan);
          for (int r = 0; r < p; ++r) {
            std::size_t j = 0;
            auto const& prog = o.programs[static_cast<std::size_t>(r)];
            for (std::size_t i = 0; i < prog.size(); ++i) {
              if (!loom::is_compute(prog[i].kind)) continue;
              CHECK(free.times[static_cast<std::size_t>(r)][i].start == base.times[static_cast<std::size_t>(r)][j].start);
              ++j;
            }
          }
          // At the plan's copy time the copies still hide, and offloading never raises a peak.
          loom::costs timed = c;
          timed.h = plan.copy_time / s.stage_fraction();
          const auto run = loom::simulate(o, timed);
          REQUIRE(run.ok);
          CHECK(run.makespan >= base.makespan);
          CHECK(run.makespan <= base.makespan * 1.01);
          double lowest = 1e300;
          for (int r = 0; r < p; ++r) {
            CHECK(run.peak_activation[static_cast<std::size_t>(r)] <= base.peak_activation[static_cast<std::size_t>(r)] + 1e-12);
            lowest = std::min(lowest, base.peak_activation[static_cast<std::size_t>(r)] - run.peak_activation[static_cast<std::size_t>(r)]);
          }
          CHECK(run.max_peak_activation() < base.max_peak_activation());
          // The same program under the stage-resolved model written out from these costs.
          const auto staged = loom::simulate(o, loom::cost_model::uniform(timed, s.stages, s.ranks));
          CHECK(staged.makespan == doctest::Approx(run.makespan).epsilon(1e-12));
          for (int r = 0; r < p; ++r)
            CHECK(staged.peak_activation[static_cast<std::size_t>(r)] == doctest::Approx(run.peak_activation[static_cast<std::size_t>(r)]).epsilon(1e-12));
        }
  CHECK(programs > 100);
}

TEST_CASE("simulate: an offload frees its activation when its copy ends, and a slow host link delays the backward that waits for the reload") {
  // One rank, three microbatches (F 1, BW 2): F0 F1 OFF1 F2 BW0 REL1 BW1 BW2.
  const loom::schedule plain = loom::generate(loom::gpipe{}, {.ranks = 1, .microbatches = 3});
  loom::schedule s = plain;
  using loom::forward, loom::backward;
  s.programs[0] = {forward(0, 0), forward(1, 0), loom::offload_to_host(1, 0), forward(2, 0), backward(0, 0),
                   loom::reload_from_host(1, 0), backward(1, 0), backward(2, 0)};
  REQUIRE(loom::validate(s).ok);
  const auto none = loom::simulate(plain);
  CHECK(none.peak_activation[0] == 3);
  // A copy that ends as F2 starts (h = 0) frees F1's activation before F2 allocates its own.
  const auto instant = loom::simulate(s, {.h = 0});
  REQUIRE(instant.ok);
  CHECK(instant.peak_activation[0] == 2);
  CHECK(instant.makespan == none.makespan);
  CHECK(instant.times[0][2].start == 2);  // issued when F1 ends
  // A copy still running when F2 starts (2 .. 2.5) frees nothing yet.
  const auto running = loom::simulate(s, {.h = 0.5});
  REQUIRE(running.ok);
  CHECK(running.peak_activation[0] == 3);
  CHECK(running.times[0][2].end == 2.5);
  CHECK(running.makespan == none.makespan + 0.5);  // the reload is issued when BW0 ends (5) and BW1 waits for it (5.5)
  // A slow link: out 2 .. 5, back 5 .. 8, and BW1 waits for it.
  const auto slow = loom::simulate(s, {.h = 3});
  REQUIRE(slow.ok);
  CHECK(slow.times[0][5].start == 5);
  CHECK(slow.times[0][5].end == 8);
  CHECK(slow.times[0][6].start == 8);
  CHECK(slow.makespan == none.makespan + 3);
  CHECK(slow.busy == none.busy);  // copies are not the rank's work
}

TEST_CASE("validate: broken host copies name both actions") {
  const loom::schedule s = grouped(4, 8, 2, 2);
  const loom::costs c = per_stage(1.0, 2);
  const auto plan = loom::plan_offload(s, c, {.chunks = 1, .time = 0.2});
  REQUIRE(plan.ok);
  const loom::schedule o = loom::with_offload(s, plan);
  REQUIRE(loom::validate(o).ok);
  // A copy on rank 0 to break.
  const loom::offload_copy* off = nullptr;
  for (const auto& cp : plan.copies)
    if (cp.rank == 0 && !cp.reload) {
      off = &cp;
      break;
    }
  REQUIRE(off != nullptr);
  const loom::action out = loom::offload_to_host(off->mb, off->stage), back = loom::reload_from_host(off->mb, off->stage);
  auto moved = [&](const loom::action& a, auto where) {
    loom::schedule b = o;
    auto& prog = b.programs[0];
    prog.erase(std::find(prog.begin(), prog.end(), a));
    prog.insert(prog.begin() + static_cast<long>(where(prog)), a);
    return b;
  };
  auto index_of = [](const std::vector<loom::action>& prog, auto pred) {
    return static_cast<std::size_t>(std::find_if(prog.begin(), prog.end(), pred) - prog.begin());
  };
  auto is_backward = [&](const loom::action& a) { return loom::is_input_backward(a.kind) && a.mb == off->mb && a.stage == off->stage; };
  auto is_forward = [&](const loom::action& a) { return a.kind == loom::op::F && a.mb == off->mb && a.stage == off->stage; };
  auto message = [](const loom::schedule& b) { return std::string(loom::validate(b).message); };

  // The reload late: after the backward that needs it.
  const auto late = moved(back, [&](auto const& prog) { return index_of(prog, is_backward) + 1; });
  const std::string m1 = message(late);
  CHECK(m1.find("needs the activation that " + std::string(loom::to_string(out))) != std::string::npos);
  CHECK(m1.find("its reload " + std::string(loom::to_string(back))) != std::string::npos);
  CHECK(m1.find("(too late)") != std::string::npos);
  // ... which the simulator reports as the rank waiting for the reload.
  const auto sim = loom::simulate(late, c);
  CHECK_FALSE(sim.ok);
  CHECK(std::string(sim.error).find("waiting for " + std::string(loom::to_string(back))) != std::string::npos);
  // The offload early: before the forward that produces the activation.
  const std::string m2 = message(moved(out, [&](auto const& prog) { return index_of(prog, is_forward); }));
  CHECK(m2.find("offloads an activation before " + std::string(loom::to_string(loom::forward(off->mb, off->stage))) + " produces it") !=
        std::string::npos);
  // The offload after the backward that used the activation.
  loom::schedule after = o;
  {
    auto& prog = after.programs[0];
    prog.erase(std::find(prog.begin(), prog.end(), back));
    prog.erase(std::find(prog.begin(), prog.end(), out));
    prog.insert(prog.begin() + static_cast<long>(index_of(prog, is_backward)) + 1, out);
  }
  CHECK(message(after).find("offloads an activation after the input backward of mb " + std::to_string(off->mb)) != std::string::npos);
  // Twice, and a reload of nothing.
  loom::schedule twice = o;
  twice.programs[0].insert(twice.programs[0].begin() + static_cast<long>(position_of(twice, 0, out)) + 1, out);
  CHECK(message(twice).find("offloads an activation a second time: " + std::string(loom::to_string(out))) != std::string::npos);
  loom::schedule orphan = o;
  std::erase(orphan.programs[0], out);
  CHECK(message(orphan).find("reloads an activation that no earlier offload copied to host") != std::string::npos);
  // On another rank than its stage's.
  loom::schedule elsewhere = o;
  elsewhere.programs[1].insert(elsewhere.programs[1].end(), out);
  CHECK(message(elsewhere).find("which is placed on rank 0, not here") != std::string::npos);
  // Forgotten: offloaded and never reloaded.
  loom::schedule lost = o;
  std::erase(lost.programs[0], back);
  CHECK(message(lost).find("no reload brings it back") != std::string::npos);
}

TEST_CASE("host copies: costs and models refuse a negative host link, and the PyTorch CSV refuses copies") {
  CHECK(std::string(loom::detail::check_costs({.h = -1})) == "cost h must be a finite number >= 0 (got h=-1)");
  loom::cost_model m = loom::cost_model::uniform({}, 4, 4);
  m.host.beta = -1;
  CHECK(std::string(loom::detail::check_model(m)) == "cost model: links.host.beta must be a finite number >= 0 (got -1)");
  m.host.beta = 0;
  m.stages[1].activation_bytes = -2;
  CHECK(std::string(loom::detail::check_model(m)) == "cost model: stages[1].activation_bytes must be a finite number >= 0 (got -2)");
  const loom::schedule s = grouped(4, 8, 2, 2);
  const auto o = loom::with_offload(s, loom::plan_offload(s, per_stage(1.0, 2), {.chunks = 1, .time = 0.2}));
  CHECK_THROWS_WITH_AS(loom::write_torch_csv(o), doctest::Contains("PyTorch's pipeline CSV has no action that copies an activation to host"),
                       loom::schedule_error);
  // A refused plan cannot be applied.
  const auto refused = loom::plan_offload(s, per_stage(1.0, 2), {.chunks = 3, .time = 0.2});
  CHECK_THROWS_WITH_AS(loom::with_offload(s, refused), doctest::Contains("with_offload: the plan was refused: offload needs"), loom::config_error);
}
