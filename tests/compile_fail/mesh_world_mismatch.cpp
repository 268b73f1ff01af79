// expect: mesh pp2 x tp2 has 4 ranks but the world has 8
// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// A static mesh bound to a world of a static size it does not match must not compile, and the
// diagnostic must name both sizes.
#include <loom/comm/threads.hpp>
#include <loom/mesh.hpp>

int main() {
  using mesh = loom::mesh<loom::pp<2>, loom::tp<2>>;
  auto comms = loom::threads::world(8);
  loom::mesh_comm g(mesh{}, comms[0], loom::static_world<8>{});
  (void)g;
}
