// expect: tensor parallel 2.5d needs q x q x depth ranks; tp 8 is not q x q x 3 for any q
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static 2.5D grid whose size is not q x q x depth must not compile.
#include <loom/mesh.hpp>

int main() {
  loom::mesh<loom::dp<2>, loom::tp<8, loom::tp_kind::d2_5, 3>> m;
  return m.size();
}
