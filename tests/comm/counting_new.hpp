// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Replaces the global operator new and delete of the test program with versions that count every
// allocation (all threads, one atomic counter). Include from exactly one source file of a test
// executable: the replacement is program-wide (it is harmless for the other tests: it only counts).

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

// The replacements below pair operator new with malloc and operator delete with free; GCC sees
// both ends once they are inlined into a caller and wrongly reports a mismatch.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace loom_test {

//! Number of successful calls of any global operator new (array, aligned and nothrow forms too).
inline std::atomic<long long> allocations{0};

//! Allocations made so far.
inline long long allocation_count() { return allocations.load(std::memory_order_seq_cst); }

namespace counting_detail {
inline void* allocate(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p != nullptr) allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}
inline void* allocate_aligned(std::size_t n, std::align_val_t a) {
  const auto al = static_cast<std::size_t>(a);
  const std::size_t size = ((n == 0 ? 1 : n) + al - 1) / al * al;  // aligned_alloc wants a multiple
  void* p = std::aligned_alloc(al, size);
  if (p != nullptr) allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}
}  // namespace counting_detail

}  // namespace loom_test

void* operator new(std::size_t n) {
  if (void* p = loom_test::counting_detail::allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = loom_test::counting_detail::allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return loom_test::counting_detail::allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return loom_test::counting_detail::allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = loom_test::counting_detail::allocate_aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = loom_test::counting_detail::allocate_aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return loom_test::counting_detail::allocate_aligned(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return loom_test::counting_detail::allocate_aligned(n, a);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
