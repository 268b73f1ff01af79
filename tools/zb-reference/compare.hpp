// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! zb-auto and zb-v against the Zero Bubble authors' own heuristics on seeded random
//! configurations (tests/schedule/data/zb_authors_reference.csv, produced by
//! tools/zb-reference/authors_reference.py from sail-sg/zero-bubble-pipeline-parallelism; the
//! CSV's header holds the exact commands), and against loom's fixed families on the same
//! placement. Shared by the comparison program (compare.cpp), the document table
//! (docs/zb-auto-vs-authors-table.cpp) and the test (tests/schedule/test_zb_authors_reference.cpp).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <loom/schedule.hpp>
#include <loom/schedule/bound.hpp>

namespace loom_zbref {

//! One reference row: a configuration, its limit and the authors' results (span < 0: none).
struct reference_row {
  int id = 0, p = 0, m = 0;
  double f = 0, b = 0, w = 0, c = 0, mem_w_ratio = 0, limit = 0;
  double loop_span = -1, loop_rate = -1, v_span = -1, v_rate = -1;
  loom::costs cost() const { return {.f = f, .b = b, .w = w, .c = c, .mem_w_ratio = mem_w_ratio}; }
  double limit_factor() const { return limit / p; }
};

//! Reads the reference CSV (comment lines start with '#'); throws std::runtime_error on a
//! malformed line, naming it.
inline std::vector<reference_row> read_reference(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<reference_row> rows;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#' || line.rfind("id,", 0) == 0) continue;
    std::vector<std::string> v;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) v.push_back(cell);
    if (v.size() != 13) throw std::runtime_error(path + ":" + std::to_string(n) + ": expected 13 cells");
    auto num = [&](std::size_t i) { return v[i] == "none" ? -1.0 : std::stod(v[i]); };
    reference_row r;
    r.id = std::stoi(v[0]);
    r.p = std::stoi(v[1]);
    r.m = std::stoi(v[2]);
    r.f = num(3);
    r.b = num(4);
    r.w = num(5);
    r.c = num(6);
    r.mem_w_ratio = num(7);
    r.limit = num(8);
    r.loop_span = num(9);
    r.loop_rate = num(10);
    r.v_span = num(11);
    r.v_rate = num(12);
    rows.push_back(r);
  }
  return rows;
}

//! loom's results for one reference row (bubble rates; -1: none fits the limit).
struct comparison {
  reference_row ref;
  double auto_loop = -1, auto_v = -1, zb_v = -1;
  double auto_loop_peak = 0, auto_v_peak = 0, zb_v_peak = 0;
  double auto_loop_bound = 0, auto_v_bound = 0, zb_v_bound = 0;  //!< certified bubble-rate bound (loom::lower_bound)
  double fixed_loop = -1, fixed_v = -1;    //!< best fixed single-copy family on that placement within the limit
  std::string fixed_loop_name, fixed_v_name;
  double two_copy = -1;                    //!< best two-copy (bidirectional) family within the limit
  std::string two_copy_name;
};

//! The best bubble rate among the registry's fixed (not cost-aware) families within `limit`, by
//! where their schedule for `s` lies: the loop placement with one chunk, the V placement (single
//! copy, one direction each), and any two-copy (bidirectional) placement; -1 where none fits.
struct fixed_best {
  double loop = -1, vee = -1, two_copy = -1;
  std::string loop_name, vee_name, two_copy_name;
};
inline fixed_best best_fixed(const loom::shape& s, const loom::costs& k, double limit) {
  fixed_best out;
  auto keep = [](double rate, const std::string& name, double& best, std::string& best_name) {
    if (best < 0 || rate < best - 1e-12) {
      best = rate;
      best_name = name;
    }
  };
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    if (e.cost_aware) continue;
    for (int ch : {0, 1, 2}) {
      loom::shape sh = e.resolve({s.ranks, s.microbatches, ch});
      if (ch != 0 && sh.chunks == e.resolve({s.ranks, s.microbatches, 0}).chunks) continue;  // the default again
      if (!e.check(sh).empty()) continue;
      const loom::schedule sc = e.make(sh);
      const bool two = sc.param_copies == 2;
      const bool loop = !two && sc.directions == 1 && sc.placement == loom::placement_kind::loop && sc.chunks == 1;
      const bool vee = !two && sc.directions == 1 && sc.placement == loom::placement_kind::v && sc.chunks == 2;
      if (!two && !loop && !vee) continue;
      auto sim = loom::simulate(sc, k);
      if (!sim.ok || sim.max_peak_activation() > limit + 1e-9) continue;
      if (two) keep(sim.bubble_rate, e.name, out.two_copy, out.two_copy_name);
      if (loop) keep(sim.bubble_rate, e.name, out.loop, out.loop_name);
      if (vee) keep(sim.bubble_rate, e.name, out.vee, out.vee_name);
    }
  }
  return out;
}

//! Runs zb-auto (loop, V), cost-aware zb-v and the fixed families on one reference row.
inline comparison compare(const reference_row& x) {
  comparison out;
  out.ref = x;
  const loom::costs k = x.cost();
  const loom::shape s1{x.p, x.m, 1}, s2{x.p, x.m, 2};
  auto run = [&](auto family, loom::shape s, loom::placement_kind pk, double& rate, double& peak, double& bound) {
    const loom::schedule sched = loom::generate(family, s, {.cost = k, .mem_limit = x.limit, .placement = pk});
    auto sim = loom::simulate(sched, k);
    rate = sim.bubble_rate;
    peak = sim.max_peak_activation();
    bound = loom::lower_bound(sched, k, x.limit).bubble_rate;
  };
  run(loom::zb_auto{}, s1, loom::placement_kind::loop, out.auto_loop, out.auto_loop_peak, out.auto_loop_bound);
  run(loom::zb_auto{}, s2, loom::placement_kind::v, out.auto_v, out.auto_v_peak, out.auto_v_bound);
  run(loom::zb_v{}, s2, loom::placement_kind::v, out.zb_v, out.zb_v_peak, out.zb_v_bound);
  const fixed_best fx = best_fixed(s1, k, x.limit);
  out.fixed_loop = fx.loop;
  out.fixed_loop_name = fx.loop_name;
  out.fixed_v = fx.vee;
  out.fixed_v_name = fx.vee_name;
  out.two_copy = fx.two_copy;
  out.two_copy_name = fx.two_copy_name;
  return out;
}

//! Counts of a - b below / within / above the tolerance, with the largest gain (b - a) and the
//! largest loss (a - b).
struct tally {
  int better = 0, equal = 0, worse = 0;
  double gain_sum = 0, max_gain = 0, max_loss = 0;
  void add(double a, double b, double tol = 1e-9) {
    if (a < b - tol) ++better;
    else if (a > b + tol) ++worse;
    else ++equal;
    gain_sum += b - a;
    max_gain = std::max(max_gain, b - a);
    max_loss = std::max(max_loss, a - b);
  }
  int total() const { return better + equal + worse; }
};

//! The summary table (markdown): per placement and limit, loom against the authors' heuristic
//! (bubble rates; gain = theirs - loom's) and against loom's best fixed family on the placement.
inline std::string summary_table(const std::vector<comparison>& rows) {
  std::string out =
      "| schedule | against | limit | configs | better / equal / worse | mean gain | largest gain | largest loss |"
      " vs best fixed family on the placement: better / equal / worse (none fits) |"
      " gap to the certified bound: mean / largest / proven optimal |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (int kind = 0; kind < 3; ++kind)
    for (double factor : {1.0, 1.5, 2.0}) {
      tally t, fx;
      int no_fixed = 0, optimal = 0, n = 0;
      double gap_sum = 0, gap_max = 0;
      for (auto const& x : rows) {
        if (std::abs(x.ref.limit_factor() - factor) > 1e-9) continue;
        const double mine = kind == 0 ? x.auto_loop : kind == 1 ? x.auto_v : x.zb_v;
        const double theirs = kind == 0 ? x.ref.loop_rate : x.ref.v_rate;
        if (theirs >= 0) t.add(mine, theirs);
        const double bound = kind == 0 ? x.auto_loop_bound : kind == 1 ? x.auto_v_bound : x.zb_v_bound;
        ++n;
        gap_sum += mine - bound;
        gap_max = std::max(gap_max, mine - bound);
        optimal += mine - bound < 1e-9 ? 1 : 0;
        const double fixed = kind == 0 ? x.fixed_loop : x.fixed_v;
        if (fixed < 0) ++no_fixed;
        else fx.add(mine, fixed);
      }
      const char* name = kind == 0 ? "zb-auto (loop)" : kind == 1 ? "zb-auto (V)" : "zb-v";
      const char* against = kind == 0 ? "authors' heuristic (loop)" : "authors' ZB-V heuristic";
      const char* lim = factor == 1.0 ? "p" : factor == 1.5 ? "1.5p" : "2p";
      std::snprintf(buf, sizeof buf, "| %s | %s | %s | %d | %d / %d / %d | %.4f | %.4f | %.4f | %d / %d / %d (%d) | %.4f / %.4f / %d |\n",
                    name, against, lim, t.total(), t.better, t.equal, t.worse, t.total() ? t.gain_sum / t.total() : 0.0,
                    t.max_gain, t.max_loss, fx.better, fx.equal, fx.worse, no_fixed, n ? gap_sum / n : 0.0, gap_max, optimal);
      out += buf;
    }
  return out;
}

//! Two-copy families (bidirectional, two parameter copies) within the limit that beat the better
//! of zb-auto's placements, per limit: how often and by how much at most (reported, not a goal:
//! they hold a second copy of the weights).
inline std::string two_copy_table(const std::vector<comparison>& rows) {
  std::string out = "| limit | configs | a two-copy family within the limit beats zb-auto | by at most |\n|---|---|---|---|\n";
  char buf[256];
  for (double factor : {1.0, 1.5, 2.0}) {
    int n = 0, beats = 0;
    double most = 0;
    for (auto const& x : rows) {
      if (std::abs(x.ref.limit_factor() - factor) > 1e-9) continue;
      ++n;
      const double mine = std::min(x.auto_loop, x.auto_v);
      if (x.two_copy >= 0 && x.two_copy < mine - 1e-9) {
        ++beats;
        most = std::max(most, mine - x.two_copy);
      }
    }
    std::snprintf(buf, sizeof buf, "| %s | %d | %d | %.4f |\n", factor == 1.0 ? "p" : factor == 1.5 ? "1.5p" : "2p", n, beats, most);
    out += buf;
  }
  return out;
}

}  // namespace loom_zbref
