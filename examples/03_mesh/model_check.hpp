// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The checks the example's grid model (`grid_model.hpp`) and spatial-temporal model
//! (`dsp_model.hpp`) share: a rank's parameters against the reference's, and a step's loss over
//! the world against the reference's.

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>

#include "loom/comm/communicator.hpp"
#include "moe_model.hpp"

namespace mesh_example {

//! Where `N` tensors sit, one after another, in a parameter vector (a block of the grid or the
//! DSP model): set `size`, then `place()` computes the offsets and the total.
template <std::size_t N>
struct tensor_table {
  std::array<std::size_t, N> size{};    //!< elements of each tensor
  std::array<std::size_t, N> offset{};  //!< where each starts
  std::size_t total = 0;                //!< every element

  //! The offsets and the total from `size`.
  void place() {
    total = 0;
    for (std::size_t i = 0; i < N; ++i) {
      offset[i] = total;
      total += size[i];
    }
  }
  //! Tensor `i` of `params`.
  template <class T>
  std::span<T> tensor(std::span<T> params, std::size_t i) const { return params.subspan(offset[i], size[i]); }
};

//! A rank's parameters against the single-rank reference's.
struct param_check {
  long long differing = 0;  //!< values that differ from the reference's
  long long compared = 0;   //!< values compared
  long long moved = 0;      //!< values that differ from their initial values (0: nothing trained)

  //! Adds `got` against the reference's `want` (bitwise, or within 1e-12 of `want`'s largest
  //! value) and against the initial values `initial`.
  void add(std::span<const double> got, std::span<const double> want, std::span<const double> initial, bool bitwise) {
    differing += moe::value_differences(got, want, bitwise);
    compared += static_cast<long long>(want.size());
    moved += moe::value_differences(got, initial, true);
  }
};

//! Whether step `st`'s loss, this rank's share `mine` summed over `world` and divided by
//! `copies` (the ranks holding each share), is within 1e-12 of the reference's `want`; rank 0
//! prints the line when `print`. Collective.
template <class World>
bool step_loss_matches(World& world, std::size_t st, double mine, double want, int copies, bool print) {
  double loss = mine;
  world.all_reduce(std::span<double>(&loss, 1), loom::reduce_op::sum);
  loss /= copies;
  const bool same = std::abs(loss - want) <= 1e-12 * std::abs(want);
  if (print && world.rank() == 0)
    std::printf("step %zu: loss %.15g, the reference's %.15g (%s)\n", st, loss, want, same ? "equal within 1e-12" : "DIFFERENT");
  return same;
}

}  // namespace mesh_example
