// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Compile-only checks of the V families: generated, validated, lowered and simulated during
// constant evaluation (the runtime test case only confirms the static programs match).
#include <doctest/doctest.h>

#include <loom/schedule/static_schedule.hpp>
#include <loom/schedule/v_half.hpp>
#include <loom/schedule/v_min.hpp>
#include <loom/schedule/zb_v.hpp>

namespace {
constexpr loom::shape s36{.ranks = 3, .microbatches = 6};
constexpr loom::shape s48{.ranks = 4, .microbatches = 8};
// ZB-V: zero span bubble at f = b = w with m = 2p, peak p units (1F1B's).
static_assert(loom::summarize(loom::zb_v{}, s36).valid);
static_assert(loom::summarize(loom::zb_v{}, s36).span_bubble == 0);
static_assert(loom::summarize(loom::zb_v{}, s36).peak_activation == 3);
// V-Half: (p+2)//2 = 3 units at p = 4, span bubble within half of 1F1B's (p-1)(f+b+w) = 9.
static_assert(loom::summarize(loom::v_half{}, s48).valid);
static_assert(loom::summarize(loom::v_half{}, s48).peak_activation == 3);
static_assert(loom::summarize(loom::v_half{}, s48).span_bubble <= 4.5);
// V-Min: (p+4)//3 = 2 units at p = 4, span bubble within two thirds of 9.
static_assert(loom::summarize(loom::v_min{}, s48).valid);
static_assert(loom::summarize(loom::v_min{}, s48).peak_activation == 2);
static_assert(loom::summarize(loom::v_min{}, s48).span_bubble <= 6);
// A bad chunk count is a compile-time rule.
static_assert(loom::check(loom::zb_v{}, {.ranks = 2, .microbatches = 4, .chunks = 3}) ==
              "zb-v runs exactly 2 chunk(s) per rank (got chunks=3)");

using vmin_static = loom::static_schedule<loom::v_min, s48>;
static_assert(vmin_static::stages == 8);
static_assert(vmin_static::program<0>.size() == 48);
}  // namespace

TEST_CASE("the V families' static programs are the runtime ones") {
  auto rt = vmin_static::runtime();
  for (std::size_t i = 0; i < vmin_static::program<0>.size(); ++i) CHECK(vmin_static::program<0>[i] == rt.programs[0][i]);
}
