// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mesh: dimensions, rank <-> coordinates (at compile time and at run time), sub-groups on
// the threads backend, and the errors for sizes that cannot work.

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <tuple>
#include <utility>
#include <set>
#include <string>
#include <vector>

#include "loom/comm/threads.hpp"
#include "loom/mesh.hpp"

namespace {

using loom::dim;

// Compile time: the layout of a static mesh is a constant.
using m222 = loom::mesh<loom::pp<2>, loom::dp<2>, loom::tp<2>>;
static_assert(m222::is_static && m222::static_size == 8);
static_assert(m222{}.size() == 8 && m222{}.size(dim::sp) == 1);
static_assert(m222{}.coord(dim::tp, 1) == 1 && m222{}.coord(dim::dp, 1) == 0, "the last dimension is innermost");
static_assert(m222{}.coord(dim::dp, 2) == 1 && m222{}.coord(dim::pp, 4) == 1);
static_assert(m222{}.rank_of({1, 1, 1, 0, 0}) == 7);  // indexed by dim: dp, tp, pp, sp, ep
static_assert(m222{}.group_id(dim::dp | dim::tp, 5) == 1 && m222{}.group_index(dim::dp | dim::tp, 5) == 1);
static_assert(m222{}.group_member(dim::dp, 1, 1) == 3);
static_assert(loom::world_check<m222, 8>::ok);
static_assert(!loom::mesh<loom::dp<>, loom::tp<2>>::is_static);
static_assert(loom::mesh<loom::dp<>, loom::tp<2>>{loom::dp<>{3}, loom::tp<2>{}}.size() == 6);
// ep is a dimension like the others: dp2 x ep2 x tp2, the expert-data layout's group of dp x ep.
using m_ep = loom::mesh<loom::dp<2>, loom::ep<2>, loom::tp<2>>;
static_assert(m_ep{}.size(dim::ep) == 2 && m_ep{}.coord(dim::ep, 2) == 1 && m_ep{}.coord(dim::dp, 4) == 1);
static_assert(m_ep{}.size(dim::dp | dim::ep) == 4 && m_ep{}.group_member(dim::dp | dim::ep, 1, 3) == 7);
static_assert(loom::to_string(dim::dp | dim::ep) == "dp x ep" && m_ep{}.describe() == "dp2 x ep2 x tp2");

// Tensor-parallel grids (issue 25): the shape, the position of each member and the groups.
using m_2d = loom::mesh<loom::pp<2>, loom::tp<4, loom::tp_kind::d2>>;
static_assert(m_2d::is_static && m_2d{}.size() == 8 && m_2d{}.grid().q == 2 && m_2d{}.grid().depth == 1);
static_assert(m_2d{}.describe() == "pp2 x tp4[2d 2x2]");
using m_25d = loom::mesh<loom::dp<2>, loom::tp<8, loom::tp_kind::d2_5, 2>>;
static_assert(m_25d{}.grid() == loom::tp_grid{loom::tp_kind::d2_5, 8, 2, 2} && m_25d{}.describe() == "dp2 x tp8[2.5d 2x2x2]");
static_assert(loom::mesh<loom::tp<27, loom::tp_kind::d3>>{}.grid() == loom::tp_grid{loom::tp_kind::d3, 27, 3, 3});
static_assert(loom::mesh<loom::tp<4>>{}.grid() == loom::tp_grid{loom::tp_kind::d1, 4, 1, 1}, "1D: no grid");
static_assert(loom::mesh<loom::dp<2>>{}.grid().ranks == 1);
static_assert(!loom::tp<4, loom::tp_kind::d2_5>::is_static && !loom::tp<4, loom::tp_kind::dynamic>::is_static);
// Member 6 of a 3 x 3 grid: row 2, column 0; its row is 6, 7, 8 and its column 0, 3, 6.
constexpr loom::tp_grid g33 = loom::make_tp_grid(loom::tp_kind::d2, 9);
static_assert(g33.row(6) == 2 && g33.column(6) == 0 && g33.group_member(loom::grid_group::row, 6, 2) == 8);
static_assert(g33.group_member(loom::grid_group::column, 6, 1) == 3 && g33.size(loom::grid_group::depth) == 1);
static_assert(g33.describe() == "2d 3x3");

template <class M>
void check_round_trip(const M& m) {
  std::set<int> seen;
  for (int r = 0; r < m.size(); ++r) {
    auto c = m.coords(r);
    CHECK(m.rank_of(c) == r);
    seen.insert(r);
    // The group of every set holds exactly the ranks that agree on the other coordinates.
    for (unsigned bits = 0; bits < (1u << loom::dim_count); ++bits) {
      loom::dim_set s;
      s.bits = bits;
      const int id = m.group_id(s, r), idx = m.group_index(s, r);
      CHECK(m.group_member(s, r, idx) == r);
      CHECK(idx < m.size(s));
      for (int q = 0; q < m.size(); ++q) {
        bool same = true;
        for (dim d : loom::all_dims)
          if (!s.contains(d) && m.coord(d, q) != m.coord(d, r)) same = false;
        CHECK((m.group_id(s, q) == id) == same);
      }
    }
  }
  CHECK(static_cast<int>(seen.size()) == m.size());
}

}  // namespace

TEST_CASE("mesh: rank and coordinates round-trip and groups hold exactly the ranks agreeing elsewhere") {
  check_round_trip(m222{});
  for (int a : {1, 2, 3})
    for (int b : {1, 2})
      for (int c : {1, 2, 4})
        for (int d : {1, 3})
          for (int e : {1, 2}) {
            loom::mesh<loom::dp<>, loom::ep<>, loom::pp<>, loom::sp<>, loom::tp<>> m{loom::dp<>{a}, loom::ep<>{e}, loom::pp<>{b},
                                                                                     loom::sp<>{c}, loom::tp<>{d}};
            INFO(m.describe());
            CHECK(m.size() == a * b * c * d * e);
            check_round_trip(m);
          }
}

TEST_CASE("mesh: the order of the type fixes the layout, the last dimension innermost") {
  loom::mesh<loom::tp<2>, loom::dp<3>> tp_outer;
  loom::mesh<loom::dp<3>, loom::tp<2>> tp_inner;
  CHECK(tp_outer.coord(dim::dp, 1) == 1);
  CHECK(tp_outer.coord(dim::tp, 1) == 0);
  CHECK(tp_inner.coord(dim::tp, 1) == 1);
  CHECK(tp_inner.coord(dim::dp, 1) == 0);
  CHECK(tp_inner.describe() == "dp3 x tp2");
}

TEST_CASE("mesh: a dimension of 0 ranks, a wrong static size and a world of another size are refused with one sentence") {
  CHECK_THROWS_WITH_AS(loom::dp<>{0}, "mesh dimension dp has 0 ranks; every dimension needs at least 1 rank",
                       loom::config_error);
  CHECK_THROWS_WITH_AS(loom::sp<>{-2}, "mesh dimension sp has -2 ranks; every dimension needs at least 1 rank",
                       loom::config_error);
  CHECK_THROWS_WITH_AS(loom::tp<2>{3}, "mesh dimension tp<2> was given the size 3", loom::config_error);
  CHECK_THROWS_WITH_AS(loom::ep<>{0}, "mesh dimension ep has 0 ranks; every dimension needs at least 1 rank",
                       loom::config_error);
  loom::mesh<loom::pp<>, loom::tp<>> m{loom::pp<>{2}, loom::tp<>{2}};
  CHECK_THROWS_WITH_AS(m.check_world(8), "mesh pp2 x tp2 has 4 ranks but the world has 8", loom::config_error);
  CHECK_THROWS_WITH_AS((void)m.coords(4), "rank 4 is outside the mesh pp2 x tp2 (ranks 0..3)", loom::config_error);
}

TEST_CASE("mesh: every rank refuses a mesh that does not match the world before communicating") {
  std::mutex mu;
  std::vector<std::string> errors;
  loom::run_threads(6, [&](loom::threads::comm& c) {
    try {
      loom::mesh_comm g(m222{}, c);
    } catch (const loom::config_error& e) {
      std::lock_guard lk(mu);
      errors.emplace_back(e.what());
    }
  });
  REQUIRE(errors.size() == 6);
  for (auto& e : errors) CHECK(e == "mesh pp2 x dp2 x tp2 has 8 ranks but the world has 6");
}

TEST_CASE("mesh: the communicator of each dimension and of each pair groups the right ranks in the right order") {
  using mesh5 = loom::mesh<loom::pp<2>, loom::dp<2>, loom::ep<>, loom::sp<>, loom::tp<2>>;
  for (auto [epn, spn] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 1}}) {
    mesh5 m{loom::pp<2>{}, loom::dp<2>{}, loom::ep<>{epn}, loom::sp<>{spn}, loom::tp<2>{}};
    std::mutex mu;
    int checked = 0;
    loom::run_threads(m.size(), [&](loom::threads::comm& c) {
      loom::mesh_comm g(m, c);
      std::vector<loom::dim_set> sets{dim::dp, dim::tp, dim::pp, dim::sp, dim::ep, dim::dp | dim::sp, dim::dp | dim::tp,
                                      dim::pp | dim::tp, dim::dp | dim::ep, dim::dp | dim::ep | dim::tp, loom::dim_set{}};
      for (auto s : sets) {
        auto& sub = g.group(s);  // the single dimensions are the ones of(d) returns
        CHECK(sub.size() == m.size(s));
        CHECK(sub.rank() == m.group_index(s, c.rank()));
        // Each member's world rank, gathered: must be the members of the group in index order.
        std::vector<std::int32_t> mine{c.rank()}, all(static_cast<std::size_t>(sub.size()));
        sub.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
        for (int i = 0; i < sub.size(); ++i) CHECK(all[static_cast<std::size_t>(i)] == m.group_member(s, c.rank(), i));
      }
      CHECK(&g.group(dim::pp) == &g.pp());
      CHECK(&g.group(dim::ep) == &g.ep());
      CHECK(g.ep().size() == epn);
      CHECK(g.pp().counters()[loom::comm_op::all_gather].calls == 1);
      std::lock_guard lk(mu);
      ++checked;
    });
    CHECK(checked == m.size());
  }
}

TEST_CASE("mesh: a tensor-parallel grid's row, column and depth groups hold the ranks agreeing on the other grid coordinates") {
  for (auto [kind, n, depth] : {std::tuple{loom::tp_kind::d2, 4, 0}, std::tuple{loom::tp_kind::d2, 9, 0},
                                std::tuple{loom::tp_kind::d2_5, 8, 2}, std::tuple{loom::tp_kind::d2_5, 12, 3},
                                std::tuple{loom::tp_kind::d3, 8, 0}, std::tuple{loom::tp_kind::d3, 27, 0}}) {
    const loom::tp_grid g = loom::make_tp_grid(kind, n, depth);
    INFO(std::string(g.describe().view()));
    CHECK(g.q * g.q * g.depth == n);
    for (int t = 0; t < n; ++t) {
      CHECK(g.member(g.layer(t), g.row(t), g.column(t)) == t);
      for (auto x : {loom::grid_group::row, loom::grid_group::column, loom::grid_group::depth}) {
        const int idx = g.group_index(x, t);
        CHECK(g.group_member(x, t, idx) == t);
        int members = 0;
        for (int u = 0; u < n; ++u) {
          const bool same_row = g.row(u) == g.row(t), same_col = g.column(u) == g.column(t), same_layer = g.layer(u) == g.layer(t);
          const bool expected = x == loom::grid_group::row      ? same_row && same_layer
                                : x == loom::grid_group::column ? same_col && same_layer
                                                                : same_row && same_col;
          CHECK((g.group_id(x, u) == g.group_id(x, t)) == expected);
          members += expected ? 1 : 0;
        }
        CHECK(members == g.size(x));
      }
    }
  }
}

TEST_CASE("mesh: a tensor-parallel grid that does not fit is refused at run time with one sentence") {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  CHECK_THROWS_WITH_AS(tpd(8, loom::tp_kind::d2), "tensor parallel 2d needs q x q ranks; tp 8 is not a square", loom::config_error);
  CHECK_THROWS_WITH_AS(tpd(9, loom::tp_kind::d3), "tensor parallel 3d needs q x q x q ranks; tp 9 is not a cube", loom::config_error);
  CHECK_THROWS_WITH_AS(tpd(8, loom::tp_kind::d2_5, 3),
                       "tensor parallel 2.5d needs q x q x depth ranks; tp 8 is not q x q x 3 for any q", loom::config_error);
  CHECK_THROWS_WITH_AS(tpd(8, loom::tp_kind::d2_5), "tensor parallel 2.5d needs a depth of at least 1; it was given 0",
                       loom::config_error);
  CHECK_THROWS_WITH_AS(tpd(4, loom::tp_kind::d2, 2), "tensor parallel 2d takes no depth (only 2.5d does); it was given 2",
                       loom::config_error);
  CHECK_THROWS_WITH_AS(tpd(4, loom::tp_kind::dynamic), "tensor parallel: the kind must be 1d, 2d, 2.5d or 3d", loom::config_error);
  CHECK_THROWS_WITH_AS((loom::tp<4, loom::tp_kind::d2>{4, loom::tp_kind::d3}),
                       "mesh dimension tp of kind 2d was given the kind 3d", loom::config_error);
  CHECK_THROWS_WITH_AS((loom::tp<8, loom::tp_kind::d2_5, 2>{8, loom::tp_kind::d2_5, 4}),
                       "mesh dimension tp of depth 2 was given the depth 4", loom::config_error);
  CHECK(tpd(8, loom::tp_kind::d2_5, 2).grid() == loom::tp_grid{loom::tp_kind::d2_5, 8, 2, 2});
  CHECK(tpd(4).grid().kind == loom::tp_kind::d1);
  loom::tp_kind k{};
  CHECK((loom::parse_tp_kind("2.5d", k) && k == loom::tp_kind::d2_5));
  CHECK_FALSE(loom::parse_tp_kind("4d", k));
  // A 1D mesh has no grid groups: asking for one is an error, not a silent whole group.
  loom::run_threads(2, [&](loom::threads::comm& c) {
    loom::mesh_comm g(loom::mesh<loom::tp<2>>{}, c);
    CHECK_THROWS_WITH_AS(g.grid(loom::grid_group::row),
                         "mesh tp2: tensor parallel 1d has no row group (only the grid kinds 2d, 2.5d and 3d do)", loom::config_error);
  });
}

TEST_CASE("mesh: mesh_comm splits a grid's row, column and depth groups with the members in grid order") {
  using tpd = loom::tp<loom::dynamic, loom::tp_kind::dynamic>;
  for (auto [dpn, kind, n, depth] : {std::tuple{2, loom::tp_kind::d2, 4, 0}, std::tuple{1, loom::tp_kind::d2, 9, 0},
                                     std::tuple{1, loom::tp_kind::d2_5, 8, 2}, std::tuple{1, loom::tp_kind::d3, 8, 0}}) {
    loom::mesh<loom::dp<>, tpd> m{loom::dp<>{dpn}, tpd{n, kind, depth}};
    INFO(std::string(m.describe().view()));
    std::atomic<int> checked{0};
    loom::run_threads(m.size(), [&](loom::threads::comm& c) {
      loom::mesh_comm g(m, c);
      const loom::tp_grid& grid = m.grid();
      const int t = g.coord(dim::tp);
      for (auto x : {loom::grid_group::row, loom::grid_group::column, loom::grid_group::depth}) {
        auto& sub = g.grid(x);
        CHECK(sub.size() == grid.size(x));
        CHECK(sub.rank() == grid.group_index(x, t));
        std::vector<std::int32_t> mine{c.rank()}, all(static_cast<std::size_t>(sub.size()));
        sub.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
        for (int i = 0; i < sub.size(); ++i) {
          const int member = m.group_member(dim::tp, c.rank(), grid.group_member(x, t, i));
          CHECK(all[static_cast<std::size_t>(i)] == member);
        }
        CHECK(sub.counters()[loom::comm_op::all_gather].bytes == 4u * static_cast<unsigned>(sub.size()));
      }
      g.reset_counters();
      CHECK(g.grid(loom::grid_group::column).counters() == loom::comm_counters{});
      ++checked;
    });
    CHECK(checked == m.size());
  }
}
