// expect: ring attention: the sequence of 12 tokens is not divisible into 8 zig-zag chunks
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static mesh whose ring degree cannot cut the sequence into its zig-zag chunks must not
// compile, and the diagnostic must name the sequence and the chunks.
#include <loom/exec/sequence_parallel.hpp>

int main() {
  constexpr loom::layer_shape layer{.sequence = 12, .heads = 4, .ffn = 16};
  loom::static_sharding<layer, loom::mesh<loom::sp<4>>, loom::sp_kind::ring> s;
  (void)s;
}
