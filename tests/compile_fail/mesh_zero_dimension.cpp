// expect: a mesh dimension needs at least 1 rank
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static dimension of 0 ranks must not compile.
#include <loom/mesh.hpp>

int main() {
  loom::mesh<loom::dp<0>, loom::tp<2>> m;
  return m.size();
}
