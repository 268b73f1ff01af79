// expect: tensor parallel: 6 attention heads are not divisible by tp 4
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static mesh whose tensor-parallel degree does not divide the heads must not compile.
#include <loom/exec/sequence_parallel.hpp>

int main() {
  constexpr loom::layer_shape layer{.sequence = 16, .heads = 6, .ffn = 16};
  loom::static_sharding<layer, loom::mesh<loom::pp<2>, loom::tp<4>>, loom::sp_kind::megatron> s;
  (void)s;
}
