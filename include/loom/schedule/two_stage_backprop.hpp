// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The 2BP transformation (Rae, Lee & Richings, "2BP: 2-Stage Backpropagation", 2024): every
//! fused backward `BW` of a schedule becomes its input-gradient half `B` in place, and the
//! weight-gradient halves `W` run after everything else on their rank, in the order their `B`s
//! ran. `gpipe-2bp` and `1f1b-2bp` are this transformation applied to `gpipe` and `1f1b`.

#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule/action.hpp"
#include "loom/schedule/schedule.hpp"

namespace loom::detail {

//! `in` with each `BW` split into a `B` in place and a `W` deferred to the end of its rank's
//! program, named `name`. (Built as a new schedule rather than by modifying a by-value copy:
//! GCC 12 cannot move a short std::string out of a function parameter in constant evaluation.)
constexpr schedule defer_weight_gradients(const schedule& in, std::string_view name) {
  schedule out = make_schedule(name, {.ranks = in.ranks, .microbatches = in.microbatches, .chunks = in.chunks}, in.stages,
                               in.placement);
  out.directions = in.directions;
  out.param_copies = in.param_copies;
  out.stage_to_rank = in.stage_to_rank;
  out.mb_direction = in.mb_direction;
  for (std::size_t r = 0; r < in.programs.size(); ++r) {
    auto& prog = out.programs[r];
    std::vector<action> deferred;
    prog.reserve(in.programs[r].size() * 2);
    for (action a : in.programs[r]) {
      if (a.kind == op::BW) {
        a.kind = op::B;
        deferred.push_back(backward_weight(a.mb, a.stage));
      }
      prog.push_back(a);
    }
    prog.insert(prog.end(), deferred.begin(), deferred.end());
  }
  return out;
}

}  // namespace loom::detail
