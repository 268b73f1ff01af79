// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The asynchronous pipeline families: 1F1B that never flushes, over T steps, with weight
//! versions (`schedule::versioned`).
//!
//! - `pipedream`: PipeDream (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for
//!   DNN Training", SOSP 2019, §3.3 "weight stashing"). Every stage updates after every k-th
//!   microbatch's backward (k = `update_every`, 1 in the paper); the forward of microbatch j on
//!   stage s reads the latest version of that stage, and its backward reads the *same* version
//!   (stashed). With one update per microbatch, stage s of p keeps p - s versions (0-indexed s:
//!   the input stage keeps p) once the run has at least 2p - 1 microbatches (in a shorter one some
//!   versions are written and never read). *Vertical sync* (`pipedream-vs`, §3.3): every stage reads the
//!   version the input stage read for that microbatch (the version id travels with the
//!   activation), so one microbatch sees one consistent set of weights; stage s then keeps p
//!   versions.
//! - `pipedream-2bw`: PipeDream-2BW (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
//!   Training", ICML 2021, §3.1): the m microbatches of step t are coalesced into one update per
//!   stage, applied after the stage's last backward of the step, with the one-step-stale rule
//!   W(t+1) = W(t) - lr * grad f_t(W(t-1)), W(-1) = W(0): every action of step t reads version
//!   max(t-1, 0). Two versions per stage. The paper requires m >= p (§3.1: "m >= d"); loom checks
//!   it, and the validator proves the two-buffer rule on every generated schedule.
//! - `pipelined-backprop`: Kosson et al. 2021, every stage updating after every sample without
//!   stashing (see the struct).
//! - `pipedream-flush`: the synchronous 1F1B under the name the 2BW paper gives it (§3.2); an
//!   alias of `1f1b` (one step, one version, the update after the flush).
//!
//! Program order (all three asynchronous rules): microbatch `t*m + i` is the i-th of step t;
//! rank r runs min(p-1-r, T m) warm-up forwards, then one forward and one fused backward until
//! the T m microbatches are through, then the cool-down backwards: 1F1B over all T steps, the
//! pipeline never drained between steps. Loop placement, one stage per rank.
//!
//! Versions: version v of a stage is its weights after its v-th update (0: initial); it lives in
//! weight buffer v mod K (`schedule::version_slots`, K per stage), so writing version v + K drops
//! version v. `validate` checks that every read finds its version written and not yet dropped,
//! that a microbatch's forward and backward read the same version (`schedule::stash`), and that
//! the last backward of every stage updates (no gradient left behind). `simulate` reports the
//! versions each rank keeps (`simulation::weight_copies`).
//!
//! p = 3, m = 2, T = 2, `pipedream` (`format_programs`; `/vN` the version read when not 0, `+u`
//! the update after the action): rank r keeps 3 - r versions (rank 0: v0, v1, v2 at BW1).
//! ```
//!   r0 | F0@s0 F1@s0 F2@s0 BW0@s0+u F3@s0/v1 BW1@s0+u BW2@s0+u BW3@s0/v1+u
//!   r1 | F0@s1 F1@s1 BW0@s1+u F2@s1/v1 BW1@s1+u F3@s1/v2 BW2@s1/v1+u BW3@s1/v2+u
//!   r2 | F0@s2 BW0@s2+u F1@s2/v1 BW1@s2/v1+u F2@s2/v2 BW2@s2/v2+u F3@s2/v3 BW3@s2/v3+u
//! ```

#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/family.hpp"
#include "loom/schedule/one_f_one_b.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom {

namespace detail {

//! How an asynchronous family assigns weight versions (see the file comment).
struct version_rule {
  enum kind_t : unsigned char {
    stashed,        //!< PipeDream: the forward reads the latest version; the backward the same
    vertical_sync,  //!< PipeDream vertical sync: every stage reads the input stage's version
    one_step_stale, //!< PipeDream-2BW: step t reads version max(t-1, 0)
    latest          //!< no stashing: every action reads the latest version (pipelined backprop)
  };
  kind_t kind = stashed;
  int update_every = 1;  //!< microbatches per update (the 2BW rule updates once per step)
};

//! 1F1B over the T m microbatches of `s` (no flush), with versions, updates and weight buffers
//! assigned by `rule`. The buffers per stage are the fewest that hold every read: one more than
//! the largest distance, at a read, between the stage's latest version and the version read.
constexpr schedule asynchronous_1f1b(std::string_view name, shape s, version_rule rule) {
  const int m = s.microbatches, T = s.steps, N = m * T, P = s.ranks;
  schedule out = one_f_one_b{}.generate({.ranks = P, .microbatches = N, .chunks = 1});
  out.name = text(name);
  out.steps = T;
  out.stash = rule.kind != version_rule::latest;
  out.version_slots.assign(static_cast<std::size_t>(P), 1);
  // Is the update after the backward of microbatch j?
  auto updates_after = [&](int j) {
    if (rule.kind == version_rule::one_step_stale) return (j + 1) % m == 0;
    return (j + 1) % rule.update_every == 0 || j == N - 1;
  };
  // The version stage 0's forward of each microbatch read (vertical sync): stage 0 runs on rank 0.
  std::vector<int> input_version(static_cast<std::size_t>(N), 0);
  std::vector<int> forward_version(static_cast<std::size_t>(N), 0);
  for (int r = 0; r < P; ++r) {
    int updates = 0, far = 0;
    for (action& a : out.programs[static_cast<std::size_t>(r)]) {
      const auto j = static_cast<std::size_t>(a.mb);
      if (a.kind == op::F) {
        switch (rule.kind) {
          case version_rule::vertical_sync: a.version = r == 0 ? updates : input_version[j]; break;
          case version_rule::one_step_stale: a.version = a.mb / m > 0 ? a.mb / m - 1 : 0; break;
          default: a.version = updates;
        }
        if (r == 0) input_version[j] = a.version;
        forward_version[j] = a.version;
      } else {
        a.version = rule.kind == version_rule::latest ? updates : forward_version[j];
        if (updates_after(a.mb)) {
          a.update = true;
          ++updates;
        }
      }
      const int distance = (a.update ? updates - 1 : updates) - a.version;
      far = distance > far ? distance : far;
    }
    out.version_slots[static_cast<std::size_t>(r)] = far + 1;
  }
  return out;
}

//! The rules the asynchronous families share: `check_basic` with one chunk, and steps >= 1.
constexpr text check_asynchronous(std::string_view name, shape s) {
  if (text rule = check_basic(name, s, 1); !rule.empty()) return rule;
  if (s.steps < 1) return text(name) + " needs steps >= 1 (got steps=" + to_text(s.steps) + ")";
  return {};
}

}  // namespace detail

//! PipeDream with weight stashing (`pipedream`): 1F1B without a flush, an update after every
//! `update_every` microbatches (the last one included), the backward reading the version its
//! forward read. Set `vertical_sync` for the vertical-sync variant (`pipedream-vs`).
struct pipedream {
  static constexpr std::string_view name = "pipedream";
  static constexpr std::string_view summary =
      "PipeDream: 1F1B never flushed, update per microbatch, weight stashing (Narayanan et al. 2019)";
  static constexpr bool multi_step = true;
  int update_every = 1;        //!< microbatches per update (the paper: 1)
  bool vertical_sync = false;  //!< every stage reads the version the input stage read
  friend constexpr bool operator==(const pipedream&, const pipedream&) = default;

  constexpr text check(shape s) const {
    if (text rule = detail::check_asynchronous(name, s); !rule.empty()) return rule;
    if (update_every < 1) return text(name) + " needs update_every >= 1 (got " + detail::to_text(update_every) + ")";
    return {};
  }
  constexpr schedule generate(shape s) const {
    return detail::asynchronous_1f1b(vertical_sync ? "pipedream-vs" : name, s,
                                     {vertical_sync ? detail::version_rule::vertical_sync : detail::version_rule::stashed,
                                      update_every});
  }
};
static_assert(schedule_family<pipedream> && multi_step_family<pipedream>);

//! PipeDream with vertical sync (`pipedream-vs`): `pipedream` where every stage reads the
//! version the input stage read for the microbatch.
struct pipedream_vertical_sync {
  static constexpr std::string_view name = "pipedream-vs";
  static constexpr std::string_view summary =
      "PipeDream with vertical sync: every stage uses the input stage's weight version (Narayanan et al. 2019)";
  static constexpr bool multi_step = true;
  constexpr text check(shape s) const { return detail::check_asynchronous(name, s); }
  constexpr schedule generate(shape s) const { return pipedream{.update_every = 1, .vertical_sync = true}.generate(s); }
};
static_assert(schedule_family<pipedream_vertical_sync> && multi_step_family<pipedream_vertical_sync>);

//! PipeDream-2BW (`pipedream-2bw`): 1F1B never flushed, one coalesced update per step and
//! stage, two weight versions, W(t+1) = W(t) - lr * grad f_t(W(t-1)).
struct pipedream_2bw {
  static constexpr std::string_view name = "pipedream-2bw";
  static constexpr std::string_view summary =
      "PipeDream-2BW: 1F1B never flushed, one update per step, two weight versions (Narayanan et al. 2021)";
  static constexpr bool multi_step = true;
  constexpr text check(shape s) const {
    if (text rule = detail::check_asynchronous(name, s); !rule.empty()) return rule;
    if (s.microbatches < s.ranks)
      return text(name) + " needs microbatches >= ranks, so that two weight versions suffice (ICML 2021, §3.1; got ranks=" +
             detail::to_text(s.ranks) + ", microbatches=" + detail::to_text(s.microbatches) + ")";
    return {};
  }
  constexpr schedule generate(shape s) const {
    return detail::asynchronous_1f1b(name, s, {detail::version_rule::one_step_stale, 1});
  }
};
static_assert(schedule_family<pipedream_2bw> && multi_step_family<pipedream_2bw>);

//! PipeDream-Flush: the name the 2BW paper (§3.2) gives to 1F1B with a flush after every step.
//! The same family (the registry knows `pipedream-flush` as an alias of `1f1b`).
using pipedream_flush = one_f_one_b;

//! Pipelined backpropagation (`pipelined-backprop`; Kosson et al., "Pipelined Backpropagation at
//! Scale: Training Large Models without Batches", MLSys 2021): microbatches of one sample (the
//! batch size one of the paper is the user's choice of microbatch), every stage updating after
//! every sample, and no weight stashing: every forward and backward reads the stage's latest
//! weights. In loom's 1F1B program order (one forward and one backward in turn per rank), the
//! forward of sample j on stage s (0-indexed, of p) reads version j - (p-1-s) and its backward
//! version j, so the gradient applied by stage s's update after sample j was computed from
//! activations of weights p-1-s updates old, and with weights that differ between its forward
//! and its backward (the paper's "weight inconsistency"). That delay is loom's derivation for
//! this program order (checked by the tests), not the paper's formula: the paper pipelines a
//! forward and a backward on every stage in the same time step, which doubles the delay of its
//! units. The paper's text could not be read for this implementation and its authors' code was
//! not found, so its delay compensations (spike compensation, linear weight prediction) are left
//! out rather than reconstructed from memory.
struct pipelined_backprop {
  static constexpr std::string_view name = "pipelined-backprop";
  static constexpr std::string_view summary =
      "Pipelined backpropagation: update per sample, no weight stashing, 1F1B never flushed (Kosson et al. 2021)";
  static constexpr bool multi_step = true;
  constexpr text check(shape s) const { return detail::check_asynchronous(name, s); }
  constexpr schedule generate(shape s) const { return detail::asynchronous_1f1b(name, s, {detail::version_rule::latest, 1}); }
};
static_assert(schedule_family<pipelined_backprop> && multi_step_family<pipelined_backprop>);

}  // namespace loom
