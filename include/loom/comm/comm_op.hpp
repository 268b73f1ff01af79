// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The kinds of communicator operation (`comm_op`) and their bus factors, apart from the counting
//! communicator (`loom/comm/counting.hpp`), so that headers which only compute volumes (the
//! tensor grids' formulas, `loom/mesh/grid_volume.hpp`, which `loom::plan` prices) need no
//! communicator.

#include <array>
#include <string_view>

namespace loom {

//! The kinds of communicator operation that `counted` distinguishes.
enum class comm_op : unsigned char { send, recv, all_reduce, all_gather, reduce_scatter, all_to_all, barrier, broadcast, reduce };

//! Every `comm_op`, in declaration order.
inline constexpr std::array<comm_op, 9> all_comm_ops{comm_op::send,       comm_op::recv,           comm_op::all_reduce,
                                                     comm_op::all_gather, comm_op::reduce_scatter, comm_op::all_to_all,
                                                     comm_op::barrier,    comm_op::broadcast,      comm_op::reduce};

//! Name of an operation ("send", "all_reduce", ...).
constexpr std::string_view to_string(comm_op op) noexcept {
  switch (op) {
    case comm_op::send: return "send";
    case comm_op::recv: return "recv";
    case comm_op::all_reduce: return "all_reduce";
    case comm_op::all_gather: return "all_gather";
    case comm_op::reduce_scatter: return "reduce_scatter";
    case comm_op::all_to_all: return "all_to_all";
    case comm_op::barrier: return "barrier";
    case comm_op::broadcast: return "broadcast";
    case comm_op::reduce: return "reduce";
  }
  return "?";
}

//! The bytes one rank of an `n`-rank group sends over its link per byte of message, in the
//! bandwidth-optimal algorithm (nccl-tests' bus factor; `loom/comm/counting.hpp`'s file comment).
constexpr double bus_factor(comm_op op, int n) noexcept {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  switch (op) {
    case comm_op::send: return 1;
    case comm_op::recv: return 0;
    case comm_op::all_reduce: return 2 * f;
    case comm_op::all_gather:
    case comm_op::reduce_scatter:
    case comm_op::all_to_all: return f;
    case comm_op::barrier: return 0;
    case comm_op::broadcast:
    case comm_op::reduce: return 1;
  }
  return 0;
}

}  // namespace loom
