// expect: ulysses: 6 attention heads are not divisible by the Ulysses degree 4
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static mesh whose sequence-parallel degree does not divide the heads (Ulysses splits heads)
// must not compile, and the diagnostic must name both.
#include <loom/exec/sequence_parallel.hpp>

int main() {
  constexpr loom::layer_shape layer{.sequence = 16, .heads = 6, .ffn = 12};
  loom::static_sharding<layer, loom::mesh<loom::dp<2>, loom::sp<4>>, loom::sp_kind::ulysses> s;
  (void)s;
}
