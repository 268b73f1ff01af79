// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The per-element arithmetic of loom's stateful optimizers, shared by the host loops
//! (`loom::adam`, `loom/exec/data_parallel.hpp`) and the simulator's kernels
//! (`loom/cuda/kernels.hpp`); the GPU kernel (`src/cuda/kernels.cu`) spells the same operations
//! with round-to-nearest intrinsics. Every operation is rounded on its own (the `volatile`
//! temporaries keep a compiler from fusing a multiply and an add), so all three give the same bits.

#include <cmath>

namespace loom::detail {

//! One Adam element (Kingma and Ba 2015, Algorithm 1, efficient form of §2): `m = b1 m + (1 - b1)
//! g`, `v = b2 v + (1 - b2) g g`, `p -= (lr_t m) / (sqrt(v) + eps_t)`.
template <class T>
inline void adam_element(T& p, T g, T& m, T& v, T b1, T b2, T lr_t, T eps_t) {
  volatile T a = b1 * m, b = (T(1) - b1) * g;
  m = a + b;
  volatile T gg = g * g;
  volatile T c = b2 * v, d = (T(1) - b2) * gg;
  v = c + d;
  volatile T den = std::sqrt(v);
  den = den + eps_t;
  volatile T num = lr_t * m;
  volatile T q = num / den;
  p = p - q;
}

}  // namespace loom::detail
