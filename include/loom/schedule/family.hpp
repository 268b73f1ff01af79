// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The `schedule_family` concept, `generate`, and `static_schedule`: one generator used at
//! run time and at compile time.

#include <concepts>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/cost_model.hpp"
#include "loom/schedule/error.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/schedule/shape.hpp"

namespace loom {

//! What a cost- or memory-aware family (an auto-scheduler) may use when generating: the uniform
//! cost model, a per-rank activation-memory limit in the units of ARCHITECTURE.md (`mem_limit
//! <= 0`: none), a placement request, and optionally a stage- and link-resolved `model`
//! (non-empty `model.stages`): a family that understands it (zb-auto) scores its candidates
//! under it, and `mem_limit` is then in the model's activation unit. Families that ignore costs
//! never see it.
struct generate_options {
  costs cost{};                                     //!< uniform costs
  double mem_limit = 0;                             //!< per-rank activation limit (<= 0: the family's default)
  placement_kind placement = placement_kind::loop;  //!< requested placement
  cost_model model{};                               //!< stage- and link-resolved costs (empty: use `cost`)
};

namespace detail {

//! What a cost-aware generator works with (`uniform_view`): when `o` carries a model, its fit to
//! the placement's stage count, the limit in the model's activation unit (default: `p` times the
//! heaviest rank's activation per microbatch, as `p` units are without a model), and the options a uniform-cost construction uses: the
//! model's per-share means (`share_costs`) and the limit in units of the heaviest rank's
//! activation per microbatch, so that a candidate within it fits on every rank. Without a model,
//! `uniform` is `o`.
struct options_view {
  bool staged = false;         //!< `o.model` has stages
  cost_model fitted{};         //!< the model fitted to the frame's stages
  double model_limit = 0;      //!< per-rank limit in the model's unit
  generate_options uniform{};  //!< what a uniform-cost construction sees
};

//! The view of `o` for a schedule of `frame`'s placement (its `stages` and `stage_to_rank`).
constexpr options_view uniform_view(const generate_options& o, const schedule& frame) {
  options_view v;
  v.uniform = o;
  v.uniform.model = {};
  v.staged = !o.model.stages.empty();
  if (!v.staged) return v;
  v.fitted = o.model.fit(frame.stages);
  v.uniform.cost = share_costs(v.fitted, frame.ranks);
  std::vector<double> per_rank(static_cast<std::size_t>(frame.ranks), 0.0);
  for (int st = 0; st < frame.stages; ++st)
    per_rank[static_cast<std::size_t>(frame.stage_to_rank[static_cast<std::size_t>(st)])] +=
        v.fitted.stages[static_cast<std::size_t>(st)].activation;
  double heaviest = 0;
  for (double a : per_rank) heaviest = a > heaviest ? a : heaviest;
  if (text r = check_costs(v.uniform.cost); !r.empty())
    throw config_error("cost model: its per-rank means break a rule: " + r);
  v.model_limit = o.mem_limit > 0 ? o.mem_limit : frame.ranks * heaviest;
  if (!finite(v.model_limit))
    throw config_error("cost model: a rank's activation per microbatch times the ranks is not a finite number");
  // No rank holds more than every stage of every microbatch: a larger limit (or activations of
  // zero size) never binds, and is that.
  const double never = static_cast<double>(frame.microbatches) * frame.stages;
  v.uniform.mem_limit = heaviest > 0 ? v.model_limit / heaviest : never;
  if (!(v.uniform.mem_limit <= never)) v.uniform.mem_limit = never;
  return v;
}

}  // namespace detail

//! A schedule family: a default-constructible type with a `name`, a constexpr `check(shape)`
//! returning the violated rule as a sentence (empty when the shape can run) as a `loom::text`
//! (a `std::string` works at run time, but not during constant evaluation under clang with
//! libstdc++ 12; `static_schedule` requires `loom::text`), and a constexpr
//! `generate(shape)` returning the schedule. It may declare `static constexpr int
//! default_chunks` (else 1), `static constexpr std::string_view summary`, and a cost-aware
//! `generate(shape, const generate_options&)` (see `cost_aware_family`).
//! User families model it exactly like the built-in ones and plug into validate, lower,
//! simulate, render and the registry.
template <class F>
concept schedule_family = std::semiregular<F> && requires(const F& f, const shape& s) {
  { F::name } -> std::convertible_to<std::string_view>;
  { f.check(s) } -> std::convertible_to<text>;
  { f.generate(s) } -> std::same_as<schedule>;
};

//! A family whose schedule depends on costs and memory limits (an auto-scheduler).
template <class F>
concept cost_aware_family = schedule_family<F> && requires(const F& f, const shape& s, const generate_options& o) {
  { f.generate(s, o) } -> std::same_as<schedule>;
};

//! A family whose one schedule spans `shape::steps` training steps without a flush (the
//! asynchronous families: `pipedream`, `pipedream-2bw`, ...): it declares
//! `static constexpr bool multi_step = true`. Every other family runs one step per schedule and
//! refuses `steps != 1`.
template <class F>
concept multi_step_family = schedule_family<F> && requires {
  requires static_cast<bool>(F::multi_step);
};

//! A family whose microbatches are issued in groups of `shape::group` (PipeOffload's
//! `group-interleaved-1f1b`): it declares `static constexpr bool grouped = true` and reads
//! `shape::group` (0: its natural group). Every other family refuses `group != 0`.
template <class F>
concept grouped_family = schedule_family<F> && requires {
  requires static_cast<bool>(F::grouped);
};

//! The family's natural chunk count (its `default_chunks`, or 1).
template <class F>
inline constexpr int default_chunks_v = [] {
  if constexpr (requires { F::default_chunks; })
    return static_cast<int>(F::default_chunks);
  else
    return 1;
}();

//! The family's limit on ranks x microbatches x chunks: its `max_cells` if it declares one (a
//! generator that searches is superlinear), else `loom::max_shape_cells`.
template <class F>
inline constexpr long long max_cells_v = [] {
  if constexpr (requires { F::max_cells; })
    return static_cast<long long>(F::max_cells) < max_shape_cells ? static_cast<long long>(F::max_cells) : max_shape_cells;
  else
    return max_shape_cells;
}();

//! The family's limit on ranks: its `max_ranks` if it declares a smaller one, else
//! `loom::max_ranks`.
template <class F>
inline constexpr int max_ranks_v = [] {
  if constexpr (requires { F::max_ranks; })
    return static_cast<int>(F::max_ranks) < max_ranks ? static_cast<int>(F::max_ranks) : max_ranks;
  else
    return max_ranks;
}();

//! `s` with `chunks == 0` replaced by the family's natural value.
template <schedule_family F>
constexpr shape resolve(shape s) {
  if (s.chunks == 0) s.chunks = default_chunks_v<F>;
  return s;
}

namespace detail {
//! The frame of a schedule of two mirrored paths over `s.ranks` ranks (Chimera's and DualPipe's
//! placement): stage `st` of the down path (direction 0) on rank `st`, of the up path on rank
//! P-1-`st`; S = P, two parameter copies, `chunks` recorded as given, every microbatch down
//! (`mb_direction` of size m, zeros) and one empty program per rank.
constexpr schedule mirrored_frame(std::string_view name, shape s, int chunks) {
  const int P = s.ranks;
  schedule out;
  out.name = text(name);
  out.ranks = P;
  out.microbatches = s.microbatches;
  out.chunks = chunks;
  out.stages = P;
  out.directions = 2;
  out.param_copies = 2;
  out.placement = placement_kind::bidirectional;
  out.stage_to_rank.resize(static_cast<std::size_t>(2 * P), 0);  // with a value: clang + libstdc++ 12 constexpr
  for (int st = 0; st < P; ++st) {
    out.stage_to_rank[static_cast<std::size_t>(st)] = st;
    out.stage_to_rank[static_cast<std::size_t>(P + st)] = P - 1 - st;
  }
  out.mb_direction.assign(static_cast<std::size_t>(s.microbatches), 0);
  out.programs.resize(static_cast<std::size_t>(P));
  return out;
}

//! The rules every family shares: positive ranks, microbatches and chunks; a family that runs
//! one chunk per rank (`fixed_chunks`) rejects any other count.
constexpr text check_basic(std::string_view family, shape s, int fixed_chunks = 0) {
  text f(family);
  if (s.ranks < 1) return f + " needs ranks >= 1 (got ranks=" + to_text(s.ranks) + ")";
  if (s.microbatches < 1) return f + " needs microbatches >= 1 (got microbatches=" + to_text(s.microbatches) + ")";
  if (s.chunks < 1) return f + " needs chunks >= 1 (got chunks=" + to_text(s.chunks) + ")";
  if (fixed_chunks > 0 && s.chunks != fixed_chunks)
    return f + " runs exactly " + to_text(fixed_chunks) + " chunk(s) per rank (got chunks=" + to_text(s.chunks) + ")";
  return {};
}

//! loom's size limits (see `loom::max_ranks`) for a shape whose ranks, microbatches and chunks
//! are already known to be >= 1: ranks <= `ranks_limit`, ranks x microbatches x chunks <=
//! `max_cells`.
constexpr text check_size(std::string_view family, shape s, long long max_cells, int ranks_limit = max_ranks) {
  if (s.ranks > ranks_limit)
    return text(family) + " needs ranks <= " + to_text(ranks_limit) + " (loom's limit for this family; got ranks=" +
           to_text(s.ranks) + ")";
  // ranks <= 2^12, microbatches < 2^31: the first product fits; the second is formed only when
  // the first is <= max_cells.
  const long long rm = static_cast<long long>(s.ranks) * s.microbatches;
  if (rm > max_cells || rm * s.chunks > max_cells)
    return text(family) + " needs ranks x microbatches x chunks <= " + to_text(max_cells) +
           " (loom's limit for this family; got " + to_text(s.ranks) + " x " + to_text(s.microbatches) + " x " +
           to_text(s.chunks) + ")";
  return {};
}

//! The rule `o` breaks for any cost-aware family, or "": its costs (`check_costs`), its model
//! when it has stages (`check_model`) and a finite `mem_limit` (<= 0: none; NaN or an infinity is
//! an error, not "none").
constexpr text check_options(const generate_options& o) {
  if (text rule = check_costs(o.cost); !rule.empty()) return rule;
  if (!o.model.stages.empty())
    if (text rule = check_model(o.model); !rule.empty()) return rule;
  if (!finite(o.mem_limit)) return "mem_limit must be a finite number (<= 0: none) (got mem_limit=" + real_text(o.mem_limit) + ")";
  return {};
}

//! `f.check(s)` followed by loom's size limits for `F`; `s` resolved. A family that is not a
//! `multi_step_family` runs exactly one step; a multi-step one counts its cells over all steps.
template <schedule_family F>
constexpr text check_all(const F& f, shape s) {
  if constexpr (!multi_step_family<F>) {
    if (s.steps != 1)
      return text(F::name) + " is synchronous: one schedule is one step, flushed (got steps=" + to_text(s.steps) +
             "; the asynchronous families span several)";
  } else {
    if (s.steps < 1) return text(F::name) + " needs steps >= 1 (got steps=" + to_text(s.steps) + ")";
  }
  if constexpr (!grouped_family<F>) {
    if (s.group != 0)
      return text(F::name) + " issues no microbatch groups (got group=" + to_text(s.group) +
             "; --group is for the grouped families, e.g. group-interleaved-1f1b)";
  }
  if (text rule = f.check(s); !rule.empty()) return rule;
  if constexpr (multi_step_family<F>) {
    if (s.microbatches >= 1 && static_cast<long long>(s.microbatches) * s.steps > max_shape_cells)
      return text(F::name) + " needs microbatches x steps <= " + to_text(max_shape_cells) + " (got " +
             to_text(s.microbatches) + " x " + to_text(s.steps) + ")";
    s.microbatches *= s.steps;  // the cells of all T steps
  }
  return check_size(F::name, s, max_cells_v<F>, max_ranks_v<F>);
}
}  // namespace detail

//! The rule `shape` breaks for family `F` (after defaulting its chunks), including loom's size
//! limits, or "" if it can run.
template <schedule_family F>
constexpr text check(const F& f, shape s) {
  return detail::check_all(f, resolve<F>(s));
}

//! Generates `F`'s schedule for shape `s`. Throws `schedule_error` naming the rule if the
//! family cannot run that shape; in a constant expression that is a compile error.
template <schedule_family F>
constexpr schedule generate(const F& f, shape s) {
  s = resolve<F>(s);
  if (text rule = detail::check_all(f, s); !rule.empty()) throw schedule_error(rule);
  return f.generate(s);
}

//! As `generate(f, s)`, passing `o` to a cost-aware family (others ignore it). For a cost-aware
//! family, throws `config_error` naming the rule when `o` breaks `detail::check_options`.
template <schedule_family F>
constexpr schedule generate(const F& f, shape s, const generate_options& o) {
  s = resolve<F>(s);
  if (text rule = detail::check_all(f, s); !rule.empty()) throw schedule_error(rule);
  if constexpr (cost_aware_family<F>) {
    if (text rule = detail::check_options(o); !rule.empty()) throw config_error(rule);
    return f.generate(s, o);
  } else {
    return f.generate(s);
  }
}

}  // namespace loom
