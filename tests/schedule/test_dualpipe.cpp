// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
//
// DualPipe and DualPipeV (DeepSeek-V3 Technical Report, arXiv 2412.19437, §3.2.1, Table 2;
// deepseek-ai/DualPipe): validity over grids of shapes, the published bubble and activation
// closed forms, parameter copies, and a comparison with PyTorch's DualPipeV order.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/schedule.hpp"
#include "loom/schedule/dualpipe.hpp"
#include "loom/schedule/dualpipe_v.hpp"

namespace {

using loom::costs;
using loom::dualpipe;
using loom::dualpipe_v;
using loom::op;
using loom::shape;

// DualPipe's bubble `(PP/2-1)(F&B + B - 3W)` and activation `PP+1` (DeepSeek-V3 Table 2),
// written in the paper's per-chunk notation and converted to loom's units: a chunk is one
// virtual stage, holding the fraction q = P/S of a rank's share, so F = q f, B = q (b + w)
// (DualPipe's B is the full backward), W = q w, F&B = q fb, and PP = S stages on a path.
double paper_bubble(const loom::schedule& s, const costs& k) {
  const double q = s.stage_fraction();
  const double F = q * k.f, B = q * (k.b + k.w), W = q * k.w;
  const double FandB = k.fb >= 0 ? q * k.fb : F + B;
  const double PP = s.stages;
  return (PP / 2 - 1) * (FandB + B - 3 * W);
}
double paper_activation_units(const loom::schedule& s) { return (s.stages + 1) * s.stage_fraction(); }

double max_bubble_time(const loom::simulation& sim, int ranks) {
  double m = 0;
  for (int r = 0; r < ranks; ++r) m = sim.bubble_time(r) > m ? sim.bubble_time(r) : m;
  return m;
}

bool near(double a, double b) { return std::abs(a - b) < 1e-9 * (1 + std::abs(a) + std::abs(b)); }

// The shapes the reference implementation accepts (and the paper's formulas describe).
bool reference_shape(bool bidirectional, int p, int m) {
  return bidirectional ? m % 2 == 0 && m >= 2 * p : m >= 2 * p;
}

// Costs in the domain where the closed form is exact: f = b and b + w <= fb <= f + b + w (an
// overlapped pair no shorter than its longer half, the full backward, and no longer than both
// halves in turn).
std::vector<costs> closed_form_costs() {
  std::vector<costs> out;
  for (double f : {1.0, 2.0})
    for (double wr : {0.0, 0.3, 0.5, 1.0})
      for (double t : {0.0, 0.4, 1.0}) {
        const double w = wr * f, lo = f + w, hi = 2 * f + w;
        out.push_back(costs{.f = f, .b = f, .w = w, .c = 0, .fb = lo + t * (hi - lo)});
      }
  out.push_back(costs{.f = 1, .b = 1, .w = 1});  // fb < 0: the sum of the halves
  return out;
}

// PyTorch's DualPipeV order for 4 ranks x 10 microbatches, from PyTorch's test artifacts
// (test/distributed/pipelining/artifacts/, copied in ../shared/interop/torch/): one line per
// rank, cells `<stage><F|I|W|B><mb>` and `(<F cell>;<B cell>)OVERLAP_F_B`.
constexpr std::string_view torch_dualpipev_4x10 =
    "0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,(0F7;7B3)OVERLAP_F_B,(7F4;0B0)OVERLAP_F_B,(0F8;7B4)OVERLAP_F_B,(7F5;0B1)OVERLAP_F_B,(0F9;7B5)OVERLAP_F_B,(7F6;0B2)OVERLAP_F_B,7B6,(7F7;0B3)OVERLAP_F_B,7B7,(7F8;0B4)OVERLAP_F_B,7B8,(7F9;0B5)OVERLAP_F_B,7B9,0I6,0W6,0I7,0W7,0I8,0W8,0I9,0W9\n"
    "1F0,1F1,1F2,1F3,1F4,6F0,1F5,6F1,6I0,6W0,6F2,6I1,6W1,6F3,(1F6;6B2)OVERLAP_F_B,(6F4;1B0)OVERLAP_F_B,(1F7;6B3)OVERLAP_F_B,(6F5;1B1)OVERLAP_F_B,(1F8;6B4)OVERLAP_F_B,(6F6;1B2)OVERLAP_F_B,(1F9;6B5)OVERLAP_F_B,(6F7;1B3)OVERLAP_F_B,6B6,(6F8;1B4)OVERLAP_F_B,6B7,(6F9;1B5)OVERLAP_F_B,6B8,1B6,6I9,1I7,6W9,1I8,1W7,1I9,1W8,1W9\n"
    "2F0,2F1,2F2,5F0,2F3,5F1,2F4,5F2,5I0,5W0,5F3,(2F5;5B1)OVERLAP_F_B,(5F4;2B0)OVERLAP_F_B,(2F6;5B2)OVERLAP_F_B,(5F5;2B1)OVERLAP_F_B,(2F7;5B3)OVERLAP_F_B,(5F6;2B2)OVERLAP_F_B,(2F8;5B4)OVERLAP_F_B,(5F7;2B3)OVERLAP_F_B,(2F9;5B5)OVERLAP_F_B,(5F8;2B4)OVERLAP_F_B,5B6,(5F9;2B5)OVERLAP_F_B,5B7,2B6,5B8,2I7,5I9,2I8,2W7,2I9,5W9,2W8,2W9\n"
    "3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,3F4,4B0,(4F4;3B0)OVERLAP_F_B,(3F5;4B1)OVERLAP_F_B,(4F5;3B1)OVERLAP_F_B,(3F6;4B2)OVERLAP_F_B,(4F6;3B2)OVERLAP_F_B,(3F7;4B3)OVERLAP_F_B,(4F7;3B3)OVERLAP_F_B,(3F8;4B4)OVERLAP_F_B,(4F8;3B4)OVERLAP_F_B,(3F9;4B5)OVERLAP_F_B,(4F9;3B5)OVERLAP_F_B,4B6,3B6,4B7,3B7,4I8,3I8,4I9,3I9,4W8,3W8,4W9,3W9\n";

// A minimal reader for the compute-only cells above (the full importer lives in render/).
loom::action torch_cell(std::string_view c) {
  std::size_t i = 0;
  int stage = 0, mb = 0;
  while (i < c.size() && c[i] >= '0' && c[i] <= '9') stage = stage * 10 + (c[i++] - '0');
  const char kind = c[i++];
  while (i < c.size() && c[i] >= '0' && c[i] <= '9') mb = mb * 10 + (c[i++] - '0');
  switch (kind) {
    case 'F': return loom::forward(mb, stage);
    case 'I': return loom::backward_input(mb, stage);
    case 'W': return loom::backward_weight(mb, stage);
    default: return loom::backward(mb, stage);
  }
}
loom::schedule torch_schedule(std::string_view text, int ranks, int microbatches) {
  loom::schedule s = loom::make_schedule("torch", shape{ranks, microbatches, 2}, 2 * ranks, loom::placement_kind::v);
  std::size_t rank = 0;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    while (!line.empty()) {
      const std::size_t comma = line.find(',');
      std::string_view cell = line.substr(0, comma);
      line = comma == std::string_view::npos ? std::string_view{} : line.substr(comma + 1);
      if (cell.empty()) continue;
      if (cell.front() == '(') {
        const std::size_t semi = cell.find(';'), close = cell.find(')');
        loom::action f = torch_cell(cell.substr(1, semi - 1));
        loom::action b = torch_cell(cell.substr(semi + 1, close - semi - 1));
        s.programs[rank].push_back(loom::overlapped(f.mb, f.stage, b.kind, b.mb, b.stage));
      } else {
        s.programs[rank].push_back(torch_cell(cell));
      }
    }
    ++rank;
  }
  return s;
}

// Compile-time checks: the closed forms hold during constant evaluation too.
constexpr costs unit_fb3{.f = 1, .b = 1, .w = 1, .c = 0, .fb = 3};
using dp_4x8 = loom::static_schedule<dualpipe, shape{4, 8}>;
using dpv_4x8 = loom::static_schedule<dualpipe_v, shape{4, 8}>;
static_assert(dp_4x8::metrics<unit_fb3>.valid);
// (P/2-1)(F&B + B - 3W) with F&B = 3, B = 2, W = 1: (2-1)(3+2-3) = 2; peak P+1 = 5.
static_assert(dp_4x8::metrics<unit_fb3>.bubble_time == 2);
static_assert(dp_4x8::metrics<unit_fb3>.peak_activation == 5);
static_assert(loom::generate(dualpipe{}, shape{4, 8}).param_copies == 2);
static_assert(dpv_4x8::metrics<unit_fb3>.valid);
// q = 1/2, PP = 8: (8/2-1)(1.5 + 1 - 1.5) = 3; peak (PP+1)/2 = 4.5 units.
static_assert(dpv_4x8::metrics<unit_fb3>.bubble_time == 3);
static_assert(dpv_4x8::metrics<unit_fb3>.peak_activation == 4.5);
static_assert(loom::generate(dualpipe_v{}, shape{4, 8}).param_copies == 1);

}  // namespace

TEST_CASE("dualpipe rejects an odd or too small rank count and a chunk count other than 2, naming the rule") {
  CHECK(loom::check(dualpipe{}, shape{3, 8}) == "dualpipe needs an even number of ranks >= 2 (got 3)");
  CHECK(loom::check(dualpipe{}, shape{1, 8}).find("even number of ranks") != std::string::npos);
  CHECK(loom::check(dualpipe{}, shape{4, 8, 3}).find("exactly 2 chunk") != std::string::npos);
  CHECK(loom::check(dualpipe{}, shape{4, 0}).find("microbatches >= 1") != std::string::npos);
  CHECK_THROWS_AS(loom::generate(dualpipe{}, shape{5, 10}), loom::schedule_error);
  CHECK(loom::check(dualpipe_v{}, shape{4, 8, 1}).find("exactly 2 chunk") != std::string::npos);
  CHECK_THROWS_AS(loom::generate(dualpipe_v{}, shape{0, 8}), loom::schedule_error);
  // Every microbatch count runs, including odd and fewer than the reference's 2P.
  CHECK(loom::check(dualpipe{}, shape{4, 3}).empty());
  CHECK(loom::check(dualpipe_v{}, shape{3, 1}).empty());
}

TEST_CASE("dualpipe places direction 0 forward and direction 1 backward over the ranks with two parameter copies") {
  for (int p = 2; p <= 16; p += 2)
    for (int m : {1, 2, 5, 2 * p, 2 * p + 3}) {
      auto s = loom::generate(dualpipe{}, shape{p, m});
      CAPTURE(p);
      CAPTURE(m);
      CHECK(s.directions == 2);
      CHECK(s.param_copies == 2);
      CHECK(s.stages == p);
      CHECK(s.chunks == 2);
      CHECK(s.placement == loom::placement_kind::bidirectional);
      for (int st = 0; st < p; ++st) {
        CHECK(s.stage_to_rank[static_cast<std::size_t>(st)] == st);
        CHECK(s.stage_to_rank[static_cast<std::size_t>(p + st)] == p - 1 - st);
      }
      int dir0 = 0;
      for (int mb = 0; mb < m; ++mb) dir0 += s.direction_of(mb) == 0;
      CHECK(dir0 == (m + 1) / 2);  // the batch is split between the directions
      // Every overlapped pair joins the two directions (DualPipe's cross-direction overlap).
      for (auto const& prog : s.programs)
        for (auto const& a : prog)
          if (a.kind == op::FB) {
            CHECK(s.direction_of(a.mb) != s.direction_of(a.bmb));
            CHECK(a.bkind == op::BW);
          }
    }
}

TEST_CASE("dualpipe at an odd microbatch count runs it for real: strictly faster than at the next even count") {
  // Direction 0 carries one more microbatch, run as an unpaired steady-state step (no phantom):
  // every odd m from 2P-1 (the next even count is a shape the reference runs) is faster than
  // m+1 and slower than m-1, for every even P up to 16 and several cost models.
  const std::vector<costs> grid = {
      {},                                              // f = b = w = 1, fb = the sum of the halves
      {.f = 1, .b = 1, .w = 0.5, .fb = 2.5},           // the closed-form domain, fb between b+w and f+b+w
      {.f = 1, .b = 2, .w = 1},                        // b != f
      {.f = 2, .b = 1, .w = 0.5, .c = 0.2},            // with p2p latency
      {.f = 1, .b = 1, .w = 0.3, .fb = 1.5},           // a pair faster than f+b+w
      {.f = 1, .b = 1, .w = 0.5, .c = 0.3, .fb = 2.2},
  };
  int compared = 0;
  for (int p = 2; p <= 16; p += 2)
    for (int m = 2 * p - 1; m <= 2 * p + 21; m += 2) {
      auto s = loom::generate(dualpipe{}, shape{p, m});
      CAPTURE(p);
      CAPTURE(m);
      REQUIRE(loom::validate(loom::lower(s)).ok);
      int dir0 = 0;
      for (int mb = 0; mb < m; ++mb) dir0 += s.direction_of(mb) == 0;
      CHECK(dir0 == m / 2 + 1);
      for (auto const& k : grid) {
        CAPTURE(k.f);
        CAPTURE(k.fb);
        const double odd = loom::simulate(s, k).makespan;
        const double next = loom::simulate(loom::generate(dualpipe{}, shape{p, m + 1}), k).makespan;
        const double prev = loom::simulate(loom::generate(dualpipe{}, shape{p, m - 1}), k).makespan;
        CHECK(odd < next - 1e-9);
        CHECK(odd > prev + 1e-9);
        ++compared;
      }
    }
  CHECK(compared == 8 * 12 * 6);
  // P = 4, unit costs: 26 at m = 8, 30 at m = 9 (was 32, as long as m = 10), 32 at m = 10.
  CHECK(loom::simulate(loom::generate(dualpipe{}, shape{4, 9})).makespan == 30);
}

TEST_CASE("dualpipe-v uses the V placement with one parameter copy and overlaps its two legs") {
  for (int p = 1; p <= 16; ++p)
    for (int m : {1, p, 2 * p, 2 * p + 5}) {
      auto s = loom::generate(dualpipe_v{}, shape{p, m});
      CAPTURE(p);
      CAPTURE(m);
      CHECK(s.directions == 1);
      CHECK(s.param_copies == 1);
      CHECK(s.stages == 2 * p);
      CHECK(s.placement == loom::placement_kind::v);
      for (int st = 0; st < 2 * p; ++st) CHECK(s.stage_to_rank[static_cast<std::size_t>(st)] == loom::v_rank(st, p));
      for (auto const& prog : s.programs)
        for (auto const& a : prog)
          if (a.kind == op::FB) CHECK((a.stage < p) != (a.bstage < p));
    }
}

TEST_CASE("dualpipe and dualpipe-v are valid and deadlock-free after lowering on every shape up to 16 ranks and 64 microbatches") {
  int checked = 0;
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m) {
      auto v = loom::generate(dualpipe_v{}, shape{p, m});
      auto ok = loom::validate(v);
      auto lowered = loom::validate(loom::lower(v));
      if (!ok || !lowered) FAIL_CHECK("dualpipe-v p=" << p << " m=" << m << ": " << ok.message << lowered.message);
      ++checked;
      if (p % 2 != 0) continue;
      auto d = loom::generate(dualpipe{}, shape{p, m});
      ok = loom::validate(d);
      lowered = loom::validate(loom::lower(d));
      if (!ok || !lowered) FAIL_CHECK("dualpipe p=" << p << " m=" << m << ": " << ok.message << lowered.message);
      ++checked;
    }
  CHECK(checked == 16 * 64 + 8 * 64);
}

TEST_CASE("dualpipe and dualpipe-v reach the paper's bubble (PP/2-1)(F&B+B-3W) when the input-gradient time equals the forward time") {
  const auto grid = closed_form_costs();
  for (int p = 1; p <= 16; ++p)
    for (int m = 2 * p; m <= 64; m += 3) {
      for (bool bidirectional : {false, true}) {
        if (bidirectional && (p % 2 != 0 || m % 2 != 0)) continue;
        REQUIRE(reference_shape(bidirectional, p, m));
        auto s = bidirectional ? loom::generate(dualpipe{}, shape{p, m}) : loom::generate(dualpipe_v{}, shape{p, m});
        for (auto const& k : grid) {
          auto sim = loom::simulate(s, k);
          REQUIRE(sim.ok);
          const double got = max_bubble_time(sim, p), want = paper_bubble(s, k);
          if (!near(got, want))
            FAIL_CHECK(s.name << " p=" << p << " m=" << m << " f=b=" << k.f << " w=" << k.w << " fb=" << k.fb
                              << ": bubble " << got << ", paper " << want);
          // With no overlap gain (F&B = F + B) every rank has exactly that bubble.
          if (k.fb < 0)
            for (int r = 0; r < p; ++r) CHECK(near(sim.bubble_time(r), want));
        }
      }
    }
}

TEST_CASE("the paper's bubble formula does not describe a backward slower than the forward or a pair faster than its backward") {
  // DeepSeek's formula assumes the input-gradient time equals the forward time; with b = 2f, or
  // with an overlapped pair shorter than its full backward, the schedule is not described by it,
  // which shows the test above can fail.
  for (int p : {4, 8}) {
    auto d = loom::generate(dualpipe{}, shape{p, 3 * p});
    auto v = loom::generate(dualpipe_v{}, shape{p, 3 * p});
    for (const costs& k : {costs{.f = 1, .b = 2, .w = 1}, costs{.f = 1, .b = 1, .w = 1, .c = 0, .fb = 1.75}}) {
      CHECK_FALSE(near(max_bubble_time(loom::simulate(d, k), p), paper_bubble(d, k)));
      CHECK_FALSE(near(max_bubble_time(loom::simulate(v, k), p), paper_bubble(v, k)));
    }
  }
}

TEST_CASE("dualpipe and dualpipe-v peak at the paper's PP+1 chunks of activation on every rank") {
  for (int p = 1; p <= 16; ++p)
    for (int m = 2 * p; m <= 64; m += 5) {
      for (bool bidirectional : {false, true}) {
        if (bidirectional && (p % 2 != 0 || m % 2 != 0)) continue;
        auto s = bidirectional ? loom::generate(dualpipe{}, shape{p, m}) : loom::generate(dualpipe_v{}, shape{p, m});
        auto sim = loom::simulate(s, costs{.f = 1, .b = 1, .w = 1, .c = 0.1, .fb = 2.5});
        REQUIRE(sim.ok);
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          CHECK_MESSAGE(near(sim.peak_activation[static_cast<std::size_t>(r)], paper_activation_units(s)),
                        s.name << " p=" << p << " m=" << m);
        }
      }
    }
}

TEST_CASE("one more microbatch never shortens a dualpipe or dualpipe-v step") {
  const costs k{.f = 1, .b = 1, .w = 1, .c = 0, .fb = 2};
  for (int p = 1; p <= 8; ++p) {
    double last_v = 0, last_d = 0;
    for (int m = 1; m <= 4 * p + 2; ++m) {
      double v = loom::simulate(loom::generate(dualpipe_v{}, shape{p, m}), k).makespan;
      CHECK_MESSAGE(v >= last_v, "dualpipe-v p=" << p << " m=" << m);
      last_v = v;
      if (p % 2 != 0) continue;
      double d = loom::simulate(loom::generate(dualpipe{}, shape{p, m}), k).makespan;
      CHECK_MESSAGE(d >= last_d, "dualpipe p=" << p << " m=" << m);
      last_d = d;
    }
  }
}

TEST_CASE("dualpipe-v on 4 ranks and 10 microbatches is at least as good as PyTorch's DualPipeV under the same costs") {
  auto torch = torch_schedule(torch_dualpipev_4x10, 4, 10);
  REQUIRE(loom::validate(torch).ok);
  REQUIRE(loom::validate(loom::lower(torch)).ok);
  auto ours = loom::generate(dualpipe_v{}, shape{4, 10});
  for (double b : {0.5, 1.0, 2.0})
    for (double w : {0.0, 0.5, 1.0})
      for (double fb : {-1.0, 1.5, 2.5})
        for (double c : {0.0, 0.2}) {
          const costs k{.f = 1, .b = b, .w = w, .c = c, .fb = fb};
          auto t = loom::simulate(torch, k), o = loom::simulate(ours, k);
          REQUIRE(t.ok);
          REQUIRE(o.ok);
          CAPTURE(b);
          CAPTURE(w);
          CAPTURE(fb);
          CAPTURE(c);
          CHECK(o.makespan <= t.makespan + 1e-9);
          CHECK(o.bubble_rate <= t.bubble_rate + 1e-9);
          CHECK(o.max_peak_activation() <= t.max_peak_activation() + 1e-9);
        }
}

TEST_CASE("the registry knows dualpipe and dualpipe-v and builds the same schedules") {
  auto const& reg = loom::default_registry();
  REQUIRE(reg.find("dualpipe") != nullptr);
  REQUIRE(reg.find("dualpipe-v") != nullptr);
  CHECK(reg.at("dualpipe").default_chunks == 2);
  CHECK(reg.at("dualpipe").make(shape{6, 12}).programs == loom::generate(dualpipe{}, shape{6, 12}).programs);
  CHECK(reg.at("dualpipe-v").make(shape{3, 7}).programs == loom::generate(dualpipe_v{}, shape{3, 7}).programs);
  CHECK_THROWS_AS(reg.at("dualpipe").make(shape{7, 12}), loom::schedule_error);
}
