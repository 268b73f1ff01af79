// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The exact mode: branch and bound over every schedule of split `F`/`B`/`W` passes on the loop
//! (any chunk count) or V placement, under costs and a per-rank activation limit, minimising the
//! longest rank span (the Zero Bubble paper's bubble rate). For small shapes (p <= 4, m <= 8) it
//! proves the optimum within seconds or returns the best schedule found with the gap to what it
//! proved; it is the reference `zb-auto` is measured against (the paper states the problem as an
//! ILP, Appendix G; loom searches it directly).
//!
//! Search space: every program order in which each stream (one kind of pass at one stage) runs
//! its microbatches in order, as the authors' ILP also fixes, timed by `loom::simulate`'s rules.
//! With that order rank `r`'s first pass is `F(0, σ_r)`, which starts at a fixed time, so the
//! objective only grows with completion times and schedules are compared by their times alone.
//!
//! Branching: the search appends passes to the rank that is free first (ties: the lower rank),
//! trying each stream's next pass that the dependencies and the limit allow; a pass whose input is
//! still unscheduled on another rank is committed and timed when that input is placed, so every
//! order is generated exactly once. Pruning: (1) a lower bound per node: per rank, the passes
//! left with the earliest start their dependency chains allow, scheduled on one machine
//! (`max over h: max(free, h) + work of the passes that cannot start before h`); (2) dominance:
//! two nodes that have placed the same passes, where one is no later in every time the rest of the
//! schedule can read (ranks' free times, outputs not yet consumed), keep only the earlier; (3) the
//! certified bound of `bound.hpp` at the root. The incumbent starts as `zb-auto`'s schedule.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/schedule/bound.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/simulate.hpp"
#include "loom/schedule/zb_auto.hpp"

namespace loom {

//! Limits of an exact search.
struct exact_options {
  double seconds = 10;              //!< wall-clock limit (<= 0: none)
  long long node_limit = 200000000;  //!< search nodes at most
  std::size_t memo_limit = 500000;   //!< dominance entries kept at most
};

//! Result of `solve_exact`.
struct exact_result {
  schedule best;            //!< the best schedule found (valid, within the limit)
  bool optimal = false;     //!< the search finished: `best` is optimal in the search space
  double span = 0;          //!< its longest rank span
  double bubble_rate = 0;   //!< its bubble rate
  double bound_span = 0;    //!< proven: no schedule in the search space has a shorter longest span
  double bound_rate = 0;    //!< the bubble rate that span gives
  long long nodes = 0;      //!< search nodes visited
  double seconds = 0;       //!< time spent
};

namespace detail {

//! The branch and bound of `solve_exact` (see the file comment).
class exact_search {
 public:
  exact_search(shape s, placement_kind pk, const costs& k, double limit, const exact_options& opt)
      : P_(s.ranks), M_(s.microbatches), C_(pk == placement_kind::v ? 2 : s.chunks), S_(P_ * C_), pk_(pk), k_(k),
        limit_(limit), opt_(opt) {
    q_ = 1.0 / C_;
    dur_[0] = q_ * k.f;
    dur_[1] = q_ * k.b;
    dur_[2] = q_ * k.w;
    rel_[0] = -q_;
    rel_[1] = (1 - k.mem_w_ratio) * q_;
    rel_[2] = k.mem_w_ratio * q_;
    frame_ = make_schedule("zb-exact", {P_, M_, C_}, S_, pk);
    const auto uP = static_cast<std::size_t>(P_);
    cnt_.assign(uP * static_cast<std::size_t>(C_) * 3, 0);
    fend_.assign(cells(), -1.0);
    bend_.assign(cells(), -1.0);
    free_.assign(uP, 0.0);
    live_.assign(uP, 0.0);
    done_.assign(uP, 0);
    pending_.assign(uP, -1);
    start_.assign(uP, 0.0);
    prog_.assign(uP, {});
    // Rank r's first pass F(0, σ_r) starts at the end of the forward chain before it.
    double t = 0;
    std::vector<double> f0(static_cast<std::size_t>(S_), 0.0);
    for (int st = 0; st < S_; ++st) {
      f0[static_cast<std::size_t>(st)] = t;
      t += dur_[0] + (st + 1 < S_ && rank_of(st) != rank_of(st + 1) ? k.c : 0.0);
    }
    for (int r = 0; r < P_; ++r) start_[static_cast<std::size_t>(r)] = f0[static_cast<std::size_t>(stage_of(r, 0))];
    total_ = 3 * M_ * S_;
  }

  //! Runs the search from incumbent `seed` (its longest span `seed_span`); `floor`: a proven bound.
  exact_result run(const schedule& seed, double seed_span, double floor) {
    const auto t0 = std::chrono::steady_clock::now();
    t0_ = t0;
    best_span_ = seed_span;
    best_ = seed;
    floor_ = floor;
    aborted_ = false;
    open_min_ = 1e300;
    if (best_span_ > floor_ + eps_) dfs(0);
    exact_result out;
    out.best = best_;
    out.span = best_span_;
    out.optimal = !aborted_;
    double proven = aborted_ ? std::min(open_min_, best_span_) : best_span_;
    proven = std::max(proven, floor_);
    out.bound_span = std::min(proven, best_span_);
    out.nodes = nodes_;
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

 private:
  int P_, M_, C_, S_;
  placement_kind pk_;
  costs k_;
  double limit_;
  exact_options opt_;
  double q_ = 1, dur_[3]{}, rel_[3]{};
  const double eps_ = 1e-9;
  schedule frame_;
  int total_ = 0, placed_ = 0;
  std::vector<int> cnt_;  // [rank][chunk][kind]: passes placed
  std::vector<double> fend_, bend_, free_, live_, start_;
  std::vector<char> done_;
  std::vector<int> pending_;  // per rank: encoded committed pass awaiting its input, or -1
  std::vector<std::vector<action>> prog_;
  schedule best_;
  double best_span_ = 0, floor_ = 0, open_min_ = 1e300;
  bool aborted_ = false;
  long long nodes_ = 0;
  std::chrono::steady_clock::time_point t0_;
  std::unordered_map<std::string, std::vector<std::vector<double>>> memo_;
  std::vector<double> fe_, be_;
  std::vector<std::pair<double, double>> jobs_;
  std::size_t memo_size_ = 0;

  std::size_t cells() const { return static_cast<std::size_t>(M_) * static_cast<std::size_t>(S_); }
  std::size_t cell(int mb, int st) const {
    return static_cast<std::size_t>(mb) * static_cast<std::size_t>(S_) + static_cast<std::size_t>(st);
  }
  int stage_of(int r, int ch) const { return pk_ == placement_kind::v ? (ch == 0 ? r : 2 * P_ - 1 - r) : ch * P_ + r; }
  int rank_of(int st) const { return frame_.stage_to_rank[static_cast<std::size_t>(st)]; }
  int& count(int r, int ch, int kind) {
    return cnt_[(static_cast<std::size_t>(r) * static_cast<std::size_t>(C_) + static_cast<std::size_t>(ch)) * 3 +
                static_cast<std::size_t>(kind)];
  }
  int count(int r, int ch, int kind) const {
    return cnt_[(static_cast<std::size_t>(r) * static_cast<std::size_t>(C_) + static_cast<std::size_t>(ch)) * 3 +
                static_cast<std::size_t>(kind)];
  }
  // Encoded pass: (rank, chunk, kind); the microbatch is the stream's count.
  static int code(int ch, int kind) { return ch * 3 + kind; }
  double hop(int a, int b) const { return rank_of(a) != rank_of(b) ? k_.c : 0.0; }

  //! When the input of pass (kind, mb, st) on its rank is available: -1 if unknown; -2 if it can
  //! never be (its producer is on the same rank and not placed).
  double input_ready(int kind, int mb, int st) const {
    if (kind == 0) {
      if (st == 0) return 0;
      const double e = fend_[cell(mb, st - 1)];
      if (e >= 0) return e + hop(st - 1, st);
      return rank_of(st - 1) == rank_of(st) ? -2 : -1;
    }
    if (kind == 2) return bend_[cell(mb, st)];
    const double own = fend_[cell(mb, st)];
    if (st == S_ - 1) return own;
    const double e = bend_[cell(mb, st + 1)];
    if (e < 0) return rank_of(st + 1) == rank_of(st) ? -2 : -1;
    const double a = e + hop(st + 1, st);
    return a > own ? a : own;
  }

  // Undo log entries: what to restore after a child.
  struct undo {
    int rank;
    double free, live;
    int pending;
    std::size_t cell_index;  // cell whose end was set (or SIZE_MAX)
    bool was_f;
    char done;
  };
  std::vector<undo> log_;

  //! Times (start, end) of the pass `kind` of chunk `ch` on rank `r` given it starts at `at`.
  void finish(int r, int ch, int kind, int mb, double end) {
    const int st = stage_of(r, ch);
    const std::size_t ci = cell(mb, st);
    log_.push_back({r, free_[static_cast<std::size_t>(r)], live_[static_cast<std::size_t>(r)],
                    pending_[static_cast<std::size_t>(r)], kind == 2 ? SIZE_MAX : ci, kind == 0,
                    done_[static_cast<std::size_t>(r)]});
    free_[static_cast<std::size_t>(r)] = end;
    if (kind == 0) fend_[ci] = end;
    if (kind == 1) bend_[ci] = end;
    pending_[static_cast<std::size_t>(r)] = -1;
    // A rank waiting on this output can now be timed.
    if (kind == 2) return;
    const int consumer_st = kind == 0 ? st + 1 : st - 1;
    if (consumer_st < 0 || consumer_st >= S_) return;
    const int y = rank_of(consumer_st);
    const int pc = pending_[static_cast<std::size_t>(y)];
    if (pc < 0) return;
    const int pch = pc / 3, pkind = pc % 3;
    const int pmb = count(y, pch, pkind) - 1;
    if (stage_of(y, pch) != consumer_st || pkind != kind || pmb != mb) return;
    const double ready = input_ready(pkind, pmb, consumer_st);
    const double s0 = std::max(free_[static_cast<std::size_t>(y)], ready);
    finish(y, pch, pkind, pmb, s0 + dur_[pkind]);
  }

  //! Places the next pass of stream (r, ch, kind); returns false if it can never run.
  bool place(int r, int ch, int kind) {
    const int st = stage_of(r, ch);
    const int mb = count(r, ch, kind);
    const double ready = input_ready(kind, mb, st);
    if (ready == -2) return false;
    const auto ur = static_cast<std::size_t>(r);
    ++count(r, ch, kind);
    ++placed_;
    prog_[ur].push_back(kind == 0 ? forward(mb, st) : kind == 1 ? backward_input(mb, st) : backward_weight(mb, st));
    const double live_before = live_[ur];
    live_[ur] -= rel_[kind];
    const std::size_t mark = log_.size();
    if (ready < 0) {
      // Committed; timed when its input is placed.
      log_.push_back({r, free_[ur], live_before, pending_[ur], SIZE_MAX, false, done_[ur]});
      pending_[ur] = code(ch, kind);
    } else {
      const double s0 = std::max(free_[ur], ready);
      finish(r, ch, kind, mb, s0 + dur_[kind]);
      log_[mark].live = live_before;
    }
    bool all = true;
    for (int c = 0; c < C_ && all; ++c)
      for (int x = 0; x < 3; ++x) all = all && count(r, c, x) == M_;
    if (all) done_[ur] = 1;
    return true;
  }

  void unplace(int r, int ch, int kind, std::size_t mark) {
    while (log_.size() > mark) {
      const undo u = log_.back();
      log_.pop_back();
      const auto uu = static_cast<std::size_t>(u.rank);
      free_[uu] = u.free;
      live_[uu] = u.live;
      pending_[uu] = u.pending;
      done_[uu] = u.done;
      if (u.cell_index != SIZE_MAX) (u.was_f ? fend_ : bend_)[u.cell_index] = -1;
    }
    --count(r, ch, kind);
    --placed_;
    prog_[static_cast<std::size_t>(r)].pop_back();
  }

  //! Lower bound on the longest span of any completion of the current node.
  double node_bound() {
    // Earliest ends of every unplaced (or placed but untimed) pass along its chains.
    std::vector<double>& fe = fe_;
    std::vector<double>& be = be_;
    fe.resize(cells());
    be.resize(cells());
    for (int st = 0; st < S_; ++st) {
      const int r = rank_of(st);
      double prev = -1;
      for (int mb = 0; mb < M_; ++mb) {
        const std::size_t ci = cell(mb, st);
        if (fend_[ci] >= 0) {
          fe[ci] = prev = fend_[ci];
          continue;
        }
        double h = free_[static_cast<std::size_t>(r)];
        if (st > 0) h = std::max(h, fe[cell(mb, st - 1)] + hop(st - 1, st));
        if (prev >= 0) h = std::max(h, prev);
        fe[ci] = prev = h + dur_[0];
      }
    }
    for (int st = S_ - 1; st >= 0; --st) {
      const int r = rank_of(st);
      double prev = -1;
      for (int mb = 0; mb < M_; ++mb) {
        const std::size_t ci = cell(mb, st);
        if (bend_[ci] >= 0) {
          be[ci] = prev = bend_[ci];
          continue;
        }
        double h = std::max(free_[static_cast<std::size_t>(r)], fe[ci]);
        if (st + 1 < S_) h = std::max(h, be[cell(mb, st + 1)] + hop(st + 1, st));
        if (prev >= 0) h = std::max(h, prev);
        be[ci] = prev = h + dur_[1];
      }
    }
    double worst = 0;
    std::vector<std::pair<double, double>>& jobs = jobs_;  // (earliest start, duration)
    for (int r = 0; r < P_; ++r) {
      jobs.clear();
      const auto ur = static_cast<std::size_t>(r);
      for (int ch = 0; ch < C_; ++ch) {
        const int st = stage_of(r, ch);
        for (int mb = 0; mb < M_; ++mb) {
          const std::size_t ci = cell(mb, st);
          if (fend_[ci] < 0) jobs.push_back({fe[ci] - dur_[0], dur_[0]});
          if (bend_[ci] < 0) jobs.push_back({be[ci] - dur_[1], dur_[1]});
          if (mb >= count(r, ch, 2)) jobs.push_back({be[ci], dur_[2]});
        }
      }
      double e = free_[ur];
      std::sort(jobs.begin(), jobs.end(), [](auto const& a, auto const& b) { return a.first > b.first; });
      double tail = 0;
      for (auto const& [h, d] : jobs) {
        tail += d;
        const double v = std::max(free_[ur], h) + tail;
        e = v > e ? v : e;
      }
      const double span = e - start_[ur];
      worst = span > worst ? span : worst;
    }
    // Drains: the last B at stage s' (on rank ρ) ends after ρ's free time plus every unplaced F of
    // ρ and unplaced B at its stages >= s'; its backward chain then reaches each shallower rank's
    // first stage, whose W ends that rank (bound.hpp's drain argument on the remaining work).
    for (int sp = 1; sp < S_; ++sp) {
      const int rho = rank_of(sp);
      int unplaced_b = 0;
      for (int mb = 0; mb < M_; ++mb) unplaced_b += bend_[cell(mb, sp)] < 0 ? 1 : 0;
      if (unplaced_b == 0) continue;
      double last = free_[static_cast<std::size_t>(rho)];
      for (int ch = 0; ch < C_; ++ch) {
        const int st = stage_of(rho, ch);
        for (int mb = 0; mb < M_; ++mb) {
          const std::size_t ci = cell(mb, st);
          if (fend_[ci] < 0) last += dur_[0];
          if (st >= sp && bend_[ci] < 0) last += dur_[1];
        }
      }
      double chain = 0;
      for (int y = sp - 1; y >= 0; --y) {
        chain += hop(y, y + 1) + dur_[1];
        const int r = rank_of(y);
        if (stage_of(r, 0) != y) continue;  // only a rank's shallowest stage
        const double span = last + chain + dur_[2] - start_[static_cast<std::size_t>(r)];
        worst = span > worst ? span : worst;
      }
    }
    return worst;
  }

  //! Dominance: true if an earlier node with the same placed passes was no later everywhere.
  bool dominated() {
    std::string key;
    key.reserve(cnt_.size() + static_cast<std::size_t>(P_));
    for (int v : cnt_) key.push_back(static_cast<char>(v));
    for (int v : pending_) key.push_back(static_cast<char>(v + 1));
    std::vector<double> t;
    t.reserve(static_cast<std::size_t>(P_) + 2 * static_cast<std::size_t>(S_));
    for (double v : free_) t.push_back(v);
    // Outputs a later pass will read: forwards not yet consumed by the next stage, backwards not
    // yet consumed by the previous one.
    for (int st = 0; st < S_; ++st) {
      for (int mb = 0; mb < M_; ++mb) {
        const std::size_t ci = cell(mb, st);
        if (st + 1 < S_ && fend_[ci] >= 0 && fend_[cell(mb, st + 1)] < 0) t.push_back(fend_[ci]);
        if (st > 0 && bend_[ci] >= 0 && bend_[cell(mb, st - 1)] < 0) t.push_back(bend_[ci]);
      }
    }
    auto& list = memo_[key];
    for (auto const& old : list) {
      if (old.size() != t.size()) continue;
      bool le = true;
      for (std::size_t i = 0; i < t.size() && le; ++i) le = old[i] <= t[i] + eps_;
      if (le) return true;
    }
    if (memo_size_ < opt_.memo_limit) {
      list.push_back(static_cast<std::vector<double>&&>(t));
      ++memo_size_;
    }
    return false;
  }

  bool out_of_budget() {
    if (nodes_ >= opt_.node_limit) return true;
    if (opt_.seconds > 0 && (nodes_ & 1023) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() > opt_.seconds)
      return true;
    return false;
  }

  void record() {
    double worst = 0;
    for (int r = 0; r < P_; ++r) {
      const double span = free_[static_cast<std::size_t>(r)] - start_[static_cast<std::size_t>(r)];
      worst = span > worst ? span : worst;
    }
    if (worst < best_span_ - eps_) {
      best_span_ = worst;
      best_ = frame_;
      best_.programs = prog_;
    }
  }

  void dfs(int depth) {
    if (aborted_) return;
    ++nodes_;
    if (placed_ == total_) {
      record();
      return;
    }
    const double lb = node_bound();
    if (lb >= best_span_ - eps_) return;
    if (out_of_budget()) {
      aborted_ = true;
      open_min_ = std::min(open_min_, lb);
      return;
    }
    if (dominated()) return;
    // The free rank that is free first.
    int r = -1;
    for (int i = 0; i < P_; ++i) {
      const auto ui = static_cast<std::size_t>(i);
      if (done_[ui] || pending_[ui] >= 0) continue;
      if (r < 0 || free_[ui] < free_[static_cast<std::size_t>(r)] - eps_) r = i;
    }
    if (r < 0) return;  // every unfinished rank waits on another: a deadlock
    // Children: each stream's next pass; ready ones by start time (B first on ties), then the
    // ones whose input is not placed yet.
    struct child {
      int ch, kind;
      double key;
    };
    child kids[3 * 8];
    int nk = 0;
    const auto ur = static_cast<std::size_t>(r);
    for (int ch = 0; ch < C_; ++ch) {
      const int st = stage_of(r, ch);
      const int nf = count(r, ch, 0), nb = count(r, ch, 1), nw = count(r, ch, 2);
      auto add = [&](int kind, int mb) {
        const double ready = input_ready(kind, mb, st);
        if (ready == -2) return;
        const double s0 = ready < 0 ? 1e299 : std::max(free_[ur], ready);
        const double pri = kind == 1 ? 0 : kind == 0 ? 1 : 2;
        kids[nk++] = {ch, kind, s0 * 4 + pri};
      };
      if (nb < nf) add(1, nb);
      if (nf < M_ && live_[ur] + q_ <= limit_ + eps_) add(0, nf);
      if (nw < nb) add(2, nw);
    }
    std::sort(kids, kids + nk, [](const child& a, const child& b) { return a.key < b.key; });
    for (int i = 0; i < nk; ++i) {
      const std::size_t mark = log_.size();
      if (!place(r, kids[i].ch, kids[i].kind)) continue;
      dfs(depth + 1);
      unplace(r, kids[i].ch, kids[i].kind, mark);
      if (aborted_) {
        open_min_ = std::min(open_min_, lb);
        return;
      }
      if (best_span_ <= floor_ + eps_) return;  // the incumbent meets a proven bound
    }
  }
};

}  // namespace detail

//! Exact search (see the file comment) for shape `s` on placement `pk` (loop: `s.chunks` chunks
//! per rank, chunks = 0 takes 1; v: 2) under costs `k` and per-rank limit `mem_limit` (<= 0: `p`).
//! Starts from `zb-auto`'s schedule for the same input. Throws `config_error` / `schedule_error`
//! as `zb-auto` does for bad input.
inline exact_result solve_exact(shape s, placement_kind pk, const costs& k, double mem_limit,
                                const exact_options& opt = {}) {
  if (s.chunks == 0) s.chunks = pk == placement_kind::v ? 2 : 1;
  if (s.chunks > 8) throw schedule_error("the exact mode runs at most 8 chunks per rank (got chunks=" + detail::to_text(s.chunks) + ")");
  generate_options o{.cost = k, .mem_limit = mem_limit, .placement = pk};
  const double limit = mem_limit > 0 ? mem_limit : s.ranks;
  schedule seed = generate(zb_auto{}, s, o);
  simulation sim = simulate(seed, k);
  double span = 0;
  for (double v : sim.span) span = v > span ? v : span;
  const double floor = lower_bound(seed, k, limit).max_span;
  detail::exact_search search(s, pk, k, limit, opt);
  exact_result out = search.run(seed, span, floor);
  out.best.name = "zb-exact";
  simulation bs = simulate(out.best, k);
  double busy = 0;
  for (double v : bs.busy) busy += v;
  out.bubble_rate = bs.bubble_rate;
  out.bound_rate = out.bound_span > 0 ? std::max(0.0, 1 - busy / (s.ranks * out.bound_span)) : 0;
  return out;
}

}  // namespace loom
