// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The callbacks of clang's -fsanitize-coverage=trace-pc-guard,trace-loads,trace-stores for code
// built with loom_cuda_stage(target) (see tracking.hpp). Built without instrumentation, in its own
// library (loom::cudasim_tracking), so that only programs with instrumented stages define them.
#include <cstdint>

#include "tracking.hpp"

namespace {
using loom::cudasim::impl::current_log;

inline void on(const void* p, std::size_t n, bool write) {
  if (auto* log = current_log) log->add(reinterpret_cast<std::uintptr_t>(p), n, write);
}
}  // namespace

extern "C" {
// Coverage guards: loom needs only the loads and stores, but clang emits them only with a
// coverage kind, so the guards are accepted and ignored.
void __sanitizer_cov_trace_pc_guard_init(std::uint32_t*, std::uint32_t*) { loom::cudasim::impl::tracking_seen = true; }
void __sanitizer_cov_trace_pc_guard(std::uint32_t*) {}
// (clang passes a pointer to the accessed type; the address is all that is used.)
void __sanitizer_cov_load1(void* p) { on(p, 1, false); }
void __sanitizer_cov_load2(void* p) { on(p, 2, false); }
void __sanitizer_cov_load4(void* p) { on(p, 4, false); }
void __sanitizer_cov_load8(void* p) { on(p, 8, false); }
void __sanitizer_cov_load16(void* p) { on(p, 16, false); }
void __sanitizer_cov_store1(void* p) { on(p, 1, true); }
void __sanitizer_cov_store2(void* p) { on(p, 2, true); }
void __sanitizer_cov_store4(void* p) { on(p, 4, true); }
void __sanitizer_cov_store8(void* p) { on(p, 8, true); }
void __sanitizer_cov_store16(void* p) { on(p, 16, true); }
}
