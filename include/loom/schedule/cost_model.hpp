// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The stage- and link-resolved cost model: per virtual stage `f`, `b`, `w` (and the activation
//! memory, message size and parameter bytes of that stage), and per link class a latency and a
//! bandwidth term, `alpha + beta * bytes` (Hockney, "The communication challenge for MPP",
//! Parallel Computing 1994), with ranks mapped to link classes by node. `loom::costs` (uniform
//! stages, one latency `c`) stays the default; `cost_model::uniform(k, S, P)` is the same model
//! written out per stage, and `simulate(s, model)` then gives the same numbers as
//! `simulate(s, k)` (up to the rounding of `q * (f + b)` against `q * f + q * b` in overlapped
//! pairs). The JSON file format the CLI reads (`--costs FILE`) is documented in docs/costs.md.
//!
//! Units are the caller's: times in any one unit (the CLI prints them as given; calibration
//! writes seconds), `activation` in any one memory unit (memory limits are then in that unit),
//! `message_bytes` in bytes (so that `beta` is time per byte).

#include <cstddef>
#include <utility>
#include <vector>

#include "loom/schedule/error.hpp"
#include "loom/schedule/shape.hpp"

namespace loom {

//! The cost of one message over a link class: `alpha + beta * bytes`.
struct link_cost {
  double alpha = 0;  //!< latency: time of an empty message
  double beta = 0;   //!< inverse bandwidth: time per byte
  //! Time of a message of `bytes` bytes.
  constexpr double time(double bytes) const { return alpha + beta * bytes; }
  friend constexpr bool operator==(const link_cost&, const link_cost&) = default;
};

//! The costs of one virtual stage: times of one microbatch through it, and its sizes.
struct stage_cost {
  double f = 1;              //!< forward
  double b = 1;              //!< backward for inputs (`B`); `BW` takes `b + w`
  double w = 1;              //!< backward for weights (`W`)
  double fb = -1;            //!< an overlapped pair whose forward is of this stage (negative: the sum of its parts)
  double activation = 1;     //!< memory a forward of this stage allocates (released by B and W as in ARCHITECTURE.md)
  double message_bytes = 0;  //!< bytes of the activation it sends to the next stage (the gradient sent back has the same size)
  double param_bytes = 0;    //!< bytes of parameters the stage holds (reported, not timed)
  //! One optimizer update of the stage inside a program: a versioned schedule's `W`/`BW` that
  //! carries `action::update` takes `update` longer (a synchronous schedule's optimizer runs
  //! after its step, outside the program, and is not timed here)
  double update = 0;
  double activation_bytes = 0;  //!< bytes of the activation a forward keeps for its backward (an offload copies them over `cost_model::host`)
  friend constexpr bool operator==(const stage_cost&, const stage_cost&) = default;
};

//! Per-stage and per-link costs (see the file comment). `stages` lists the model's pieces in
//! order; a schedule of `S` virtual stages uses them as `fit(S)` says.
struct cost_model {
  std::vector<stage_cost> stages;  //!< one entry per piece of the model, in order
  link_cost intra{};               //!< between ranks of one node
  link_cost inter{};               //!< between ranks of different nodes
  link_cost host{};                //!< each rank's link to host memory, one copy per direction at a time (offload/reload)
  //! Vocabulary parallelism: one microbatch's `S`, `T` and each input-layer pass (`IF`, `IB`) on
  //! one rank's shard (as `costs::s`, `t`, `e`).
  double vocab_s = 0, vocab_t = 0, vocab_e = 0;
  int ranks_per_node = 0;          //!< pipeline ranks per node (rank r is on node r / ranks_per_node); 0: one node
  double mem_w_ratio = 1;          //!< the Zero Bubble paper's M_W / M_B (as `costs::mem_w_ratio`)

  //! `k` written out per stage for a schedule of `S` stages on `P` ranks: each stage takes
  //! `q = P / S` of a rank's share (`f = q * k.f`, ...; `activation = activation_bytes = q`),
  //! every link costs `c`, and the host link `h` per unit (so a stage's copy takes `q * h`).
  static constexpr cost_model uniform(const costs& k, int S, int P) {
    cost_model m;
    const double q = static_cast<double>(P) / S;
    m.stages.assign(static_cast<std::size_t>(S > 0 ? S : 0),
                    stage_cost{.f = q * k.f, .b = q * k.b, .w = q * k.w, .fb = k.fb >= 0 ? q * k.fb : -1, .activation = q,
                               .activation_bytes = q});
    m.intra = m.inter = {.alpha = k.c, .beta = 0};
    m.host = {.alpha = 0, .beta = k.h};
    m.vocab_s = k.s;
    m.vocab_t = k.t;
    m.vocab_e = k.e;
    m.mem_w_ratio = k.mem_w_ratio;
    return m;
  }

  //! The link class between pipeline ranks `a` and `b`.
  constexpr const link_cost& link(int a, int b) const {
    if (ranks_per_node <= 0) return intra;
    return a / ranks_per_node == b / ranks_per_node ? intra : inter;
  }

  //! The model for a schedule of `S` stages: the stages as they are when there are `S`; each
  //! piece split evenly into `S / n` stages when `S` is a multiple of their number `n` (times,
  //! activation and parameters divided, every inner message as large as the piece's); `n / S`
  //! consecutive pieces merged when `n` is a multiple of `S` (sums; the group's last message). An
  //! update scales with the parameters it writes: divided when a piece is split, summed when merged.
  //! Throws `config_error` otherwise, or when the model breaks a rule (`detail::check_model`).
  constexpr cost_model fit(int S) const;

  friend constexpr bool operator==(const cost_model&, const cost_model&) = default;
};

namespace detail {

//! The rule `m` breaks, or "": at least one stage; every time, size and link term a finite
//! number >= 0 (`fb` finite: negative means the sum of its parts); `ranks_per_node >= 0`;
//! `mem_w_ratio` in [0, 1]. Messages name the field as the JSON file does (`stages[2].f`).
constexpr text check_model(const cost_model& m) {
  if (m.stages.empty()) return "cost model: stages must list at least one stage";
  auto rule = [](const text& name, double v) -> text {
    if (finite(v) && v >= 0) return {};
    return "cost model: " + name + " must be a finite number >= 0 (got " + real_text(v) + ")";
  };
  for (std::size_t i = 0; i < m.stages.size(); ++i) {
    const stage_cost& s = m.stages[i];
    const text at = "stages[" + to_text(static_cast<long long>(i)) + "].";
    for (auto [name, v] : {std::pair<const char*, double>{"f", s.f}, {"b", s.b}, {"w", s.w}, {"activation", s.activation},
                           {"message_bytes", s.message_bytes}, {"param_bytes", s.param_bytes}, {"update", s.update},
                           {"activation_bytes", s.activation_bytes}})
      if (text r = rule(at + name, v); !r.empty()) return r;
    if (!finite(s.fb)) return "cost model: " + at + "fb must be finite (negative: the sum of its parts) (got " + real_text(s.fb) + ")";
  }
  for (auto [name, l] : {std::pair<const char*, link_cost>{"links.intra", m.intra}, {"links.inter", m.inter}, {"links.host", m.host}}) {
    if (text r = rule(text(name) + ".alpha", l.alpha); !r.empty()) return r;
    if (text r = rule(text(name) + ".beta", l.beta); !r.empty()) return r;
  }
  for (auto [name, v] : {std::pair<const char*, double>{"vocab.s", m.vocab_s}, {"vocab.t", m.vocab_t}, {"vocab.e", m.vocab_e}})
    if (text r = rule(name, v); !r.empty()) return r;
  if (m.ranks_per_node < 0) return "cost model: ranks_per_node must be >= 0 (got " + to_text(m.ranks_per_node) + ")";
  if (!(m.mem_w_ratio >= 0 && m.mem_w_ratio <= 1))
    return "cost model: mem_w_ratio must be in [0, 1] (got " + real_text(m.mem_w_ratio) + ")";
  return {};
}

}  // namespace detail

constexpr cost_model cost_model::fit(int S) const {
  if (text r = detail::check_model(*this); !r.empty()) throw config_error(r);
  const auto n = static_cast<int>(stages.size());
  if (S < 1) throw config_error("cost model: a schedule needs at least one stage (got " + detail::to_text(S) + ")");
  if (S == n) return *this;
  cost_model out = *this;
  out.stages.clear();
  out.stages.reserve(static_cast<std::size_t>(S));
  if (S % n == 0) {
    const int k = S / n;
    for (const stage_cost& p : stages)
      for (int i = 0; i < k; ++i)
        out.stages.push_back({.f = p.f / k, .b = p.b / k, .w = p.w / k, .fb = p.fb >= 0 ? p.fb / k : -1,
                              .activation = p.activation / k, .message_bytes = p.message_bytes, .param_bytes = p.param_bytes / k,
                              .update = p.update / k, .activation_bytes = p.activation_bytes / k});
    return out;
  }
  if (n % S == 0) {
    const int k = n / S;
    for (int g = 0; g < S; ++g) {
      stage_cost sum{.f = 0, .b = 0, .w = 0, .fb = 0, .activation = 0};
      for (int i = 0; i < k; ++i) {
        const stage_cost& p = stages[static_cast<std::size_t>(g * k + i)];
        sum.f += p.f;
        sum.b += p.b;
        sum.w += p.w;
        sum.fb = sum.fb >= 0 && p.fb >= 0 ? sum.fb + p.fb : -1;
        sum.activation += p.activation;
        sum.param_bytes += p.param_bytes;
        sum.update += p.update;
        sum.activation_bytes += p.activation_bytes;
        sum.message_bytes = p.message_bytes;
      }
      out.stages.push_back(sum);
    }
    return out;
  }
  throw config_error("cost model: " + detail::to_text(n) + " stages cannot be fitted to a schedule of " + detail::to_text(S) +
                     " stages (one count must be a multiple of the other)");
}

//! The uniform costs a generator that knows only `loom::costs` sees for model `m` on `P` ranks:
//! per rank share the model's mean (`f = sum of stage f / P`, likewise `b`, `w`, and `fb` when
//! every stage gives one), `c` the mean over neighbouring ranks `r, r + 1` of the link time of the
//! model's mean message, `h` the host link's time for a rank share's `activation_bytes`, and its
//! `mem_w_ratio`. zb-auto builds its candidates from these and
//! scores them under `m` itself; the CLI hands them to cost-aware families that take no model.
constexpr costs share_costs(const cost_model& m, int P) {
  if (text r = detail::check_model(m); !r.empty()) throw config_error(r);
  if (P < 1) throw config_error("cost model: share_costs needs at least one rank (got " + detail::to_text(P) + ")");
  costs k{.f = 0, .b = 0, .w = 0, .c = 0, .fb = 0, .mem_w_ratio = m.mem_w_ratio};
  double bytes = 0, kept = 0;
  for (const stage_cost& s : m.stages) {
    k.f += s.f;
    k.b += s.b;
    k.w += s.w;
    k.fb = k.fb >= 0 && s.fb >= 0 ? k.fb + s.fb : -1;
    bytes += s.message_bytes;
    kept += s.activation_bytes;
  }
  k.h = m.host.time(kept / P);
  k.s = m.vocab_s;
  k.t = m.vocab_t;
  k.e = m.vocab_e;
  k.f /= P;
  k.b /= P;
  k.w /= P;
  if (k.fb >= 0) k.fb /= P;
  bytes /= static_cast<double>(m.stages.size());
  for (int r = 0; r + 1 < P; ++r) k.c += m.link(r, r + 1).time(bytes);
  if (P > 1) k.c /= P - 1;
  return k;
}

//! The activation of one rank's share of model `m` on `P` ranks (the sum over stages / P): the
//! unit of `loom::costs`-based memory limits, in the model's activation unit.
constexpr double share_activation(const cost_model& m, int P) {
  double a = 0;
  for (const stage_cost& s : m.stages) a += s.activation;
  return P > 0 ? a / P : a;
}

}  // namespace loom
