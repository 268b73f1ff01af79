// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The one instantiation of the built-in registry (every built-in family's type-erased entry) that
// loom's own programs share: they compile with LOOM_EXTERN_REGISTRY, which declares it extern in
// loom/schedule/registry.hpp, and link this object (CMakeLists.txt, loom_registry). A program
// that includes loom as headers only instantiates it where it uses it, as before.
#include <loom/schedule/registry.hpp>

template loom::registry loom::builtin_registry<loom::builtin_families>();
