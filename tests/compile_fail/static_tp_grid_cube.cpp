// expect: tensor parallel 3d needs q x q x q ranks; tp 4 is not a cube
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static 3D grid whose size is not a cube must not compile.
#include <loom/mesh.hpp>

int main() {
  loom::mesh<loom::dp<2>, loom::tp<4, loom::tp_kind::d3>> m;
  return m.size();
}
