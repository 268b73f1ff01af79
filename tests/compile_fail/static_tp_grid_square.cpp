// expect: tensor parallel 2d needs q x q ranks; tp 8 is not a square
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static 2D grid whose size is not a square must not compile.
#include <loom/mesh.hpp>

int main() {
  loom::mesh<loom::dp<2>, loom::tp<8, loom::tp_kind::d2>> m;
  return m.size();
}
