// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// One engine for both times: generators, validator, lowering and simulator run in constant
// evaluation. Most of this file is static_asserts; the runtime checks confirm that the static
// programs are the runtime ones.
#include <doctest/doctest.h>

#include <loom/schedule.hpp>

#include <string>

namespace {
using loom::costs;
using loom::shape;

// The example: ZB-H1, 4 ranks x 8 microbatches, f = b = w = 1.
static_assert(loom::summarize(loom::zb_h1{}, {.ranks = 4, .microbatches = 8}).valid);
static_assert(loom::summarize(loom::zb_h1{}, {.ranks = 4, .microbatches = 8}).bubble_time == 3);
static_assert(loom::summarize(loom::zb_h1{}, {.ranks = 4, .microbatches = 8}).peak_activation == 4);
// Closed forms at compile time.
static_assert(loom::summarize(loom::gpipe{}, {.ranks = 4, .microbatches = 6}, {.f = 1, .b = 2, .w = 1}).bubble_time == 3 * 4);
static_assert(loom::summarize(loom::one_f_one_b{}, {.ranks = 5, .microbatches = 3}).peak_activation_rank0 == 3);
static_assert(loom::summarize(loom::interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2}).bubble_time == 4.5);
static_assert(loom::summarize(loom::zb_h2{}, {.ranks = 4, .microbatches = 8}, {.f = 1, .b = 1, .w = 1}).span_bubble == 0);
static_assert(loom::summarize(loom::zb_h2{}, {.ranks = 4, .microbatches = 8}).peak_activation == 7);
// loom::text's editing in constant evaluation: pop_back down to empty and back.
constexpr bool text_edits() {
  loom::text t;
  t.append("abc");
  t.pop_back();
  if (t.view() != "ab" || t.size() != 2) return false;
  t.pop_back();
  t.pop_back();
  if (!t.empty() || t.size() != 0 || t.view() != "") return false;
  t.push_back('x');
  t.append("yz");
  t.pop_back();
  return t.view() == "xy" && t.back() == 'y';
}
static_assert(text_edits());
// Pick the best family for given costs at compile time.
constexpr costs k{.f = 1, .b = 1, .w = 1};
constexpr shape s48{.ranks = 4, .microbatches = 8};
static_assert(loom::summarize(loom::zb_h2{}, s48, k).bubble_rate < loom::summarize(loom::zb_h1{}, s48, k).bubble_rate);
static_assert(loom::summarize(loom::zb_h1{}, s48, k).bubble_rate < loom::summarize(loom::one_f_one_b{}, s48, k).bubble_rate);
// Validation and lowering at compile time, including a deliberately broken schedule.
static_assert(loom::validate(loom::lower(loom::generate(loom::interleaved_1f1b{}, {.ranks = 3, .microbatches = 5, .chunks = 3}))).ok);
static_assert([] {
  auto s = loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2});
  s.programs[1].pop_back();
  return !loom::validate(s).ok;
}());

// Static schedules: programs as std::array constants.
using zb = loom::static_schedule<loom::zb_h2, shape{.ranks = 4, .microbatches = 8}>;
static_assert(zb::ok && zb::ranks == 4 && zb::stages == 4);
static_assert(zb::program<0>.size() == 24);
static_assert(zb::program<3>[0] == loom::forward(0, 3));
static_assert(zb::metrics<costs{.f = 1, .b = 1, .w = 1}>.span_bubble == 0);
static_assert(zb::lowered_program<1>.size() == 24 + 4 * 8);  // F in/out, B in/out per microbatch
using il = loom::static_schedule<loom::interleaved_1f1b, shape{.ranks = 2, .microbatches = 4}>;
static_assert(il::shape_v.chunks == 2 && il::stages == 4);  // chunks defaulted to the family's 2

// Concepts: positive and negative models.
struct not_a_family {};
struct missing_check {
  static constexpr std::string_view name = "x";
  constexpr loom::schedule generate(shape) const { return {}; }
};
static_assert(loom::schedule_family<loom::gpipe> && loom::schedule_family<loom::zb_h2>);
static_assert(!loom::schedule_family<not_a_family> && !loom::schedule_family<missing_check> && !loom::schedule_family<int>);
static_assert(!loom::cost_aware_family<loom::gpipe>);
}  // namespace

TEST_CASE("static programs equal the programs generated at run time") {
  auto rt = zb::runtime();
  auto low = loom::lower(rt);
  auto same = [](auto const& arr, auto const& vec) { return arr.size() == vec.size() && std::equal(arr.begin(), arr.end(), vec.begin()); };
  CHECK(same(zb::program<0>, rt.programs[0]));
  CHECK(same(zb::program<3>, rt.programs[3]));
  CHECK(same(zb::lowered_program<1>, low.programs[1]));
  CHECK(same(zb::lowered_program<2>, low.programs[2]));
}
