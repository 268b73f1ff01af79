// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Shared machinery of the V-shape families (`zb-v`, `v-half`, `v-min`): the V placement with
//! two chunks per rank (rank r holds virtual stage r, "chunk 0", and stage 2P-1-r, "chunk 1"),
//! a unit-slot timetable in which every chunk pass (F, B or W of one virtual stage) takes one
//! slot, and the two constructions that fill it:
//!
//!  - `v_zero_bubble_timetable`: the greedy of the Zero Bubble paper's ZB-V (Qi et al., ICLR
//!    2024, §6): forwards while memory allows until the first backward, then one forward and one
//!    input-gradient backward in turn, weight-gradient passes filling every slot in which the
//!    wanted pass is not ready, and a memory cap that forces a W before an F.
//!  - `v_block_timetable`: the building-block construction of "Pipeline Parallelism with
//!    Controllable Memory" (Qi et al., NeurIPS 2024, §3-§4): one microbatch's F/B passes at fixed
//!    offsets on every rank, the block repeated every 6 slots, W's in the free slots, then the
//!    warm-up and cool-down squeezed without raising any rank's peak memory.
//!
//! Both produce, for every pass, a slot in which all its dependencies (ARCHITECTURE.md) sit in
//! strictly earlier slots; each rank then runs its passes in slot order. That global slot order
//! is itself a valid execution, so the programs cannot deadlock, for any shape.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/error.hpp"
#include "loom/schedule/family.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom::detail {

//! The six passes a rank runs per microbatch in a V schedule, in the order a microbatch needs
//! them: forward of chunk 0 and 1, input-gradient backward of chunk 1 and 0, and the weight
//! gradients W of chunk 1 and 0.
enum v_pass : int { v_f0 = 0, v_f1 = 1, v_b1 = 2, v_b0 = 3, v_w1 = 4, v_w0 = 5 };

//! Chunk (0 or 1) of a pass.
constexpr int v_chunk(int pass) { return (pass == v_f0 || pass == v_b0 || pass == v_w0) ? 0 : 1; }

//! Activation units (in chunks) a pass adds: F +1, W -1, B 0 (activations live until W).
constexpr int v_mem_delta(int pass) { return pass <= v_f1 ? 1 : (pass >= v_w1 ? -1 : 0); }

//! A unit-slot timetable: `slot[(rank*6 + pass)*m + mb]`, -1 while unplaced.
struct v_timetable {
  int ranks = 0;
  int microbatches = 0;
  std::vector<int> slot;

  constexpr v_timetable(int p, int m)
      : ranks(p), microbatches(m), slot(static_cast<std::size_t>(p) * 6 * static_cast<std::size_t>(m), -1) {}
  constexpr int& at(int r, int pass, int mb) {
    return slot[(static_cast<std::size_t>(r) * 6 + static_cast<std::size_t>(pass)) * static_cast<std::size_t>(microbatches) + static_cast<std::size_t>(mb)];
  }
  constexpr int at(int r, int pass, int mb) const {
    return slot[(static_cast<std::size_t>(r) * 6 + static_cast<std::size_t>(pass)) * static_cast<std::size_t>(microbatches) + static_cast<std::size_t>(mb)];
  }
  //! Latest slot any dependency of (r, pass, mb) occupies (-1: none). Dependencies follow the
  //! V placement: F0 flows rank r-1 -> r, F1 rank r+1 -> r (rank P-1 turns F0 into F1), B1
  //! flows rank r-1 -> r (rank 0 starts it after its F1), B0 rank r+1 -> r (rank P-1 turns B1
  //! into B0); a B also waits for its own F, a W for its B. Unplaced dependencies count as
  //! "not ready" (a large value).
  constexpr int dependency_slot(int r, int pass, int mb) const {
    const int p = ranks;
    constexpr int not_ready = 1 << 29;
    auto get = [&](int rr, int pp) { int s = at(rr, pp, mb); return s < 0 ? not_ready : s; };
    switch (pass) {
      case v_f0: return r > 0 ? get(r - 1, v_f0) : -1;
      case v_f1: return r < p - 1 ? get(r + 1, v_f1) : get(r, v_f0);
      case v_b1: return std::max(r > 0 ? get(r - 1, v_b1) : -1, get(r, v_f1));
      case v_b0: return std::max(r < p - 1 ? get(r + 1, v_b0) : get(r, v_b1), get(r, v_f0));
      case v_w1: return get(r, v_b1);
      default: return get(r, v_b0);
    }
  }
};

//! The schedule whose rank programs run the passes of `tt` in slot order (V placement, 2P
//! stages). Throws `schedule_error` if two passes of one rank share a slot or one is unplaced
//! (an internal error: the constructions never do that).
constexpr schedule v_schedule_from_timetable(std::string_view name, shape s, const v_timetable& tt) {
  const int p = s.ranks, m = s.microbatches;
  schedule out = make_schedule(name, s, 2 * p, placement_kind::v);
  out.chunks = 2;
  struct item { int slot, pass, mb; };
  for (int r = 0; r < p; ++r) {
    std::vector<item> items;
    items.reserve(static_cast<std::size_t>(6 * m));
    for (int pass = 0; pass < 6; ++pass)
      for (int j = 0; j < m; ++j) {
        int sl = tt.at(r, pass, j);
        if (sl < 0) throw schedule_error(text(name) + ": internal error, a pass of rank " + to_text(r) + " was left unplaced");
        items.push_back({sl, pass, j});
      }
    std::sort(items.begin(), items.end(), [](const item& a, const item& b) { return a.slot < b.slot; });
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && items[i].slot == items[i - 1].slot)
        throw schedule_error(text(name) + ": internal error, two passes of rank " + to_text(r) + " share slot " + to_text(items[i].slot));
      const int st = v_chunk(items[i].pass) == 0 ? r : 2 * p - 1 - r;
      const int j = items[i].mb;
      switch (items[i].pass) {
        case v_f0:
        case v_f1: prog.push_back(forward(j, st)); break;
        case v_b0:
        case v_b1: prog.push_back(backward_input(j, st)); break;
        default: prog.push_back(backward_weight(j, st)); break;
      }
    }
  }
  return out;
}

//! The ZB-V greedy (Zero Bubble, §6) at unit slots with a per-rank memory cap of `cap_chunks`
//! chunk activations (2P for ZB-V: P units, 1F1B's peak). At every slot each rank, in parallel:
//!  - before its first backward, runs a ready forward if memory allows (chunk 1 first: it is
//!    further along its microbatch's V), else the backward as soon as one is ready;
//!  - afterwards wants a forward and a backward in turn (1F1B discipline); it runs the wanted
//!    kind if one is ready (the backward of the oldest microbatch, chunk 1 first on ties; a
//!    forward only if memory allows), else the oldest pending W (filling what would be a
//!    bubble, or freeing memory), else the other kind if ready, else idles.
//! Each microbatch's passes of one kind and chunk run in microbatch order.
constexpr v_timetable v_zero_bubble_timetable(int p, int m, int cap_chunks) {
  v_timetable tt(p, m);
  const auto up = static_cast<std::size_t>(p);
  std::vector<int> next(up * 6, 0);  // next microbatch per (rank, pass) for F0, F1, B1, B0
  std::vector<int> mem(up, 0);
  std::vector<char> want_b(up, 0), started(up, 0);
  std::vector<std::vector<int>> wq(up);  // pending W passes, encoded pass*m + mb, FIFO
  std::vector<std::size_t> wq_head(up, 0);
  auto nx = [&](int r, int pass) -> int& { return next[static_cast<std::size_t>(r) * 6 + static_cast<std::size_t>(pass)]; };
  const long long total = 6LL * p * m;
  long long done = 0;
  struct pick { int pass = -1, mb = -1; };
  std::vector<pick> picks(up);
  for (int t = 0; done < total; ++t) {
    bool any = false;
    for (int r = 0; r < p; ++r) {
      auto ur = static_cast<std::size_t>(r);
      // Ready = every dependency ended by slot t (occupies a slot < t).
      auto ready = [&](int pass) {
        int j = nx(r, pass);
        return j < m && tt.dependency_slot(r, pass, j) < t;
      };
      pick b{}, f{};
      {
        bool r1 = ready(v_b1), r0 = ready(v_b0);
        if (r1 && (!r0 || nx(r, v_b1) <= nx(r, v_b0))) b = {v_b1, nx(r, v_b1)};
        else if (r0) b = {v_b0, nx(r, v_b0)};
      }
      if (mem[ur] + 1 <= cap_chunks) {
        if (ready(v_f1)) f = {v_f1, nx(r, v_f1)};
        else if (ready(v_f0)) f = {v_f0, nx(r, v_f0)};
      }
      const bool f_left = nx(r, v_f0) + nx(r, v_f1) < 2 * m;
      const bool b_left = nx(r, v_b0) + nx(r, v_b1) < 2 * m;
      bool want_backward = started[ur] ? want_b[ur] != 0 : b.pass >= 0;
      if (!want_backward && !f_left) want_backward = true;
      if (want_backward && !b_left) want_backward = false;
      pick chosen = want_backward ? b : f;
      if (chosen.pass < 0) {
        if (wq_head[ur] < wq[ur].size()) {
          int code = wq[ur][wq_head[ur]++];
          chosen = {code / m, code % m};
        } else {
          chosen = want_backward ? f : b;
        }
      }
      picks[ur] = chosen;
    }
    for (int r = 0; r < p; ++r) {
      auto ur = static_cast<std::size_t>(r);
      pick c = picks[ur];
      if (c.pass < 0) continue;
      any = true;
      ++done;
      tt.at(r, c.pass, c.mb) = t;
      mem[ur] += v_mem_delta(c.pass);
      if (c.pass <= v_b0) ++nx(r, c.pass);
      if (c.pass == v_f0 || c.pass == v_f1) want_b[ur] = 1;
      if (c.pass == v_b0 || c.pass == v_b1) {
        want_b[ur] = 0;
        started[ur] = 1;
        wq[ur].push_back((c.pass == v_b1 ? v_w1 : v_w0) * m + c.mb);
      }
    }
    if (!any) throw schedule_error("zb-v: internal error, the V greedy stalled at slot " + to_text(t));
  }
  return tt;
}

//! Which V-shape building block (Controllable Memory, §4): `min` (V-Min, ~1/3 of 1F1B's
//! activation memory) or `half` (V-Half, ~1/2).
enum class v_block_kind { min, half };

//! Offsets (slots) of F0, F1, B1, B0 of microbatch 0 on rank `r` in the building block.
//! V-Min: forwards and backwards one slot apart along the V (F at stage s in slot s, B back up
//! the V right after), lifespans summing to 4P slots per rank, i.e. ~P/3 units of peak
//! activation with a period of 6. V-Half: chunk-0 forwards two slots apart and the matching
//! backwards one apart, lifespans summing to ~6P slots, ~P/2 units. `d` shifts the backwards
//! when P would make two passes of one rank collide modulo the period (P divisible by 3 for
//! V-Min, even P for V-Half), as in the paper's blocks.
constexpr void v_block_offsets(v_block_kind kind, int p, int r, int (&o)[4]) {
  if (kind == v_block_kind::min) {
    const int d = p % 3 == 0 ? 2 : 0;
    o[v_f0] = r;
    o[v_f1] = 2 * p - 1 - r;
    o[v_b1] = 2 * p + d + r;
    o[v_b0] = 4 * p + d - 1 - r;
  } else {
    const int d = p % 2 == 0 ? 3 : 0;
    o[v_f0] = 2 * r;
    o[v_f1] = 3 * p - 2 - r;
    o[v_b1] = 3 * p + d + 2 * r - 1;
    o[v_b0] = 6 * p + d - r - 2;
  }
}

//! Per-rank occupancy of a timetable: `occ[r][slot]` = pass*m + mb, or -1 when free.
struct v_occupancy {
  int horizon = 0;
  std::vector<std::vector<int>> occ;
};

//! Places every W of `tt` (those still -1) FIFO into the free slots of its rank after its B
//! (the paper's W filling), extending past the last F/B if needed.
constexpr void v_put_w(v_timetable& tt, v_occupancy& o) {
  const int p = tt.ranks, m = tt.microbatches;
  for (int r = 0; r < p; ++r) {
    auto& row = o.occ[static_cast<std::size_t>(r)];
    std::vector<int> queue;
    std::size_t head = 0;
    int placed = 0;
    for (int s = 0; placed < 2 * m; ++s) {
      if (s >= static_cast<int>(row.size())) row.resize(static_cast<std::size_t>(s) + 1, -1);
      int code = row[static_cast<std::size_t>(s)];
      if (code >= 0) {
        int pass = code / m;
        if (pass == v_b1 || pass == v_b0) queue.push_back((pass == v_b1 ? v_w1 : v_w0) * m + code % m);
      } else if (head < queue.size()) {
        int w = queue[head++];
        row[static_cast<std::size_t>(s)] = w;
        tt.at(r, w / m, w % m) = s;
        ++placed;
      }
    }
    if (static_cast<int>(row.size()) > o.horizon) o.horizon = static_cast<int>(row.size());
  }
  for (auto& row : o.occ) row.resize(static_cast<std::size_t>(o.horizon), -1);
}

//! Occupancy of every placed pass of `tt`, with `extra` free slots of room at the end.
constexpr v_occupancy v_occupy(const v_timetable& tt, int extra) {
  const int p = tt.ranks, m = tt.microbatches;
  v_occupancy o;
  int last = 0;
  for (int s : tt.slot) last = s > last ? s : last;
  o.horizon = last + 1 + extra;
  o.occ.assign(static_cast<std::size_t>(p), std::vector<int>(static_cast<std::size_t>(o.horizon), -1));
  for (int r = 0; r < p; ++r)
    for (int pass = 0; pass < 6; ++pass)
      for (int j = 0; j < m; ++j)
        if (int s = tt.at(r, pass, j); s >= 0) {
          int& cell = o.occ[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
          if (cell >= 0) throw schedule_error("v-shape block: internal error, two passes of rank " + to_text(r) + " collide in slot " + to_text(s));
          cell = pass * m + j;
        }
  return o;
}

//! Peak chunk activations of rank `r` when its W's are assumed to fill free slots FIFO (the
//! memory of the schedule `v_put_w` would make from this occupancy without W's).
constexpr int v_peak_with_w_fill(const std::vector<int>& row, int m) {
  int cur = 0, peak = 0, pending = 0;
  for (int code : row) {
    if (code < 0) {
      if (pending > 0) { --pending; --cur; }
    } else if (code / m <= v_f1) {
      ++cur;
      peak = cur > peak ? cur : peak;
    } else if (code / m <= v_b0) {
      ++pending;
    }
  }
  return peak;
}

//! The V-Min / V-Half schedule's timetable (Controllable Memory, §3-§4): the building block of
//! `v_block_offsets` repeated every 6 slots (microbatch j shifted by 6j), W's filling free slots,
//! then two squeezing passes over the warm-up and cool-down:
//!  1. every pass, in slot order, moves to the earliest free slot after its dependencies (and
//!     after the same pass of the previous microbatch) that keeps the rank's peak activation at
//!     the block's own peak;
//!  2. the W's are lifted out and every B, in slot order, moves earlier the same way as long as
//!     refilling the W's FIFO keeps that peak; then the W's are refilled.
//! In the steady state the block leaves no free slot, so only the ramps change; moving a pass
//! earlier never breaks a dependency of a later one, and each move keeps its own dependencies,
//! so the result keeps the "dependencies in earlier slots" invariant.
constexpr v_timetable v_block_timetable(v_block_kind kind, int p, int m) {
  v_timetable tt(p, m);
  for (int r = 0; r < p; ++r) {
    int o[4]{};
    v_block_offsets(kind, p, r, o);
    for (int pass = 0; pass < 4; ++pass)
      for (int j = 0; j < m; ++j) tt.at(r, pass, j) = o[pass] + 6 * j;
  }
  v_occupancy occ = v_occupy(tt, 2 * m + 8);
  v_put_w(tt, occ);

  struct item { int slot, r, pass, mb; };
  for (int round = 0; round < 2; ++round) {
    const auto H = static_cast<std::size_t>(occ.horizon);
    // Memory profile (chunks, after each slot) and target peak per rank, W's included.
    std::vector<std::vector<int>> prof(static_cast<std::size_t>(p), std::vector<int>(H, 0));
    std::vector<int> target(static_cast<std::size_t>(p), 0);
    for (int r = 0; r < p; ++r) {
      auto ur = static_cast<std::size_t>(r);
      int cur = 0;
      for (std::size_t s = 0; s < H; ++s) {
        if (int code = occ.occ[ur][s]; code >= 0) cur += v_mem_delta(code / m);
        prof[ur][s] = cur;
        target[ur] = cur > target[ur] ? cur : target[ur];
      }
    }
    if (round == 1)
      for (int r = 0; r < p; ++r)
        for (int pass = v_w1; pass <= v_w0; ++pass)
          for (int j = 0; j < m; ++j) {
            int& s = tt.at(r, pass, j);
            occ.occ[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)] = -1;
            s = -1;
          }
    std::vector<item> items;
    items.reserve(static_cast<std::size_t>(6 * p * m));
    for (int r = 0; r < p; ++r)
      for (int pass = round == 0 ? 0 : v_b1; pass <= (round == 0 ? 5 : v_b0); ++pass)
        for (int j = 0; j < m; ++j) items.push_back({tt.at(r, pass, j), r, pass, j});
    std::sort(items.begin(), items.end(), [](const item& a, const item& b) {
      return a.slot != b.slot ? a.slot < b.slot : (a.r != b.r ? a.r < b.r : (a.pass != b.pass ? a.pass < b.pass : a.mb < b.mb));
    });
    for (const item& it : items) {
      const auto ur = static_cast<std::size_t>(it.r);
      auto& row = occ.occ[ur];
      const int now = tt.at(it.r, it.pass, it.mb);
      int lo = tt.dependency_slot(it.r, it.pass, it.mb) + 1;
      if (it.mb > 0) lo = std::max(lo, tt.at(it.r, it.pass, it.mb - 1) + 1);
      if (lo < 0) lo = 0;
      for (int s = lo; s < now; ++s) {
        if (row[static_cast<std::size_t>(s)] >= 0) continue;
        const int code = it.pass * m + it.mb;
        if (round == 0) {
          if (v_mem_delta(it.pass) > 0) {
            int hi = 0;
            for (int x = s; x < now; ++x) hi = std::max(hi, prof[ur][static_cast<std::size_t>(x)]);
            if (hi + 1 > target[ur]) continue;
          }
          for (int x = s; x < now; ++x) prof[ur][static_cast<std::size_t>(x)] += v_mem_delta(it.pass);
        } else {
          row[static_cast<std::size_t>(now)] = -1;
          row[static_cast<std::size_t>(s)] = code;
          const bool fits = v_peak_with_w_fill(row, m) <= target[ur];
          row[static_cast<std::size_t>(s)] = -1;
          row[static_cast<std::size_t>(now)] = code;
          if (!fits) continue;
        }
        row[static_cast<std::size_t>(now)] = -1;
        row[static_cast<std::size_t>(s)] = code;
        tt.at(it.r, it.pass, it.mb) = s;
        break;
      }
    }
    if (round == 1) v_put_w(tt, occ);
  }
  return tt;
}

//! The rule every V family checks: the common ones plus exactly two chunks per rank.
constexpr text check_v_shape(std::string_view family, shape s) {
  return check_basic(family, s, 2);
}

}  // namespace loom::detail
