// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The tensor-parallel grids' linear layer (loom/exec/tensor_grid.hpp) on the threads backend:
// 2D (q = 2, 3) and 2.5D (q = 2, depth 2), alone and beside data parallelism, against the
// single-rank products, with the counters against the documented volumes; and its refusals.

#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/threads.hpp"
#include "tensor_grid_suite.hpp"

namespace {

using grid_suite::grid_case;

// Runs `body(world)` on `world` threads and reports every rank's failure.
template <class Body>
void run(int world, const Body& body) {
  std::mutex mu;
  std::vector<std::string> errors;
  loom::run_threads(world, [&](loom::threads::comm& w) {
    try {
      body(w);
    } catch (const grid_suite::failure& e) {
      std::lock_guard lk(mu);
      errors.emplace_back(e.what());
    }
  });
  for (auto& e : errors) FAIL_CHECK(e);
}

// A group that looks like a device group without rank-ordered sums (an nccl group bound to a
// stream): not a host communicator, and its reduce adds in no promised order. Nothing is ever
// called on it: the layer refuses first.
struct unordered_device_group {
  int rank() const { return 0; }
  int size() const { return 3; }
  template <class T>
  void broadcast(std::span<T>, int) {
    FAIL("the layer communicated before refusing");
  }
  template <class T>
  void reduce(std::span<T>, int, loom::reduce_op) {
    FAIL("the layer communicated before refusing");
  }
  template <class T>
  void all_gather(std::span<const T>, std::span<T>) {
    FAIL("the layer communicated before refusing");
  }
  template <class T>
  void reduce_scatter(std::span<const T>, std::span<T>, loom::reduce_op) {
    FAIL("the layer communicated before refusing");
  }
  template <class T>
  void all_reduce(std::span<T>, loom::reduce_op) {
    FAIL("the layer communicated before refusing");
  }
  template <class T>
  void ordered_reduce_scatter(std::span<const T>, std::span<T>) {
    FAIL("the layer communicated before refusing");
  }
  template <class T>
  void ordered_all_reduce(std::span<T>) {
    FAIL("the layer communicated before refusing");
  }
};
static_assert(!loom::rooted_communicator<unordered_device_group> && !loom::reduces_in_rank_order<unordered_device_group>);

}  // namespace

TEST_CASE("tensor grid: SUMMA's deterministic backward over more than two ranks of a device group without ordered sums is refused before communicating") {
  unordered_device_group row, col, depth;
  loom::tp_grid_comms<unordered_device_group> g{&row, &col, &depth, loom::make_tp_grid(loom::tp_kind::d2, 9), 4, true};
  const loom::summa_linear<> layer{9, 9};
  loom::summa_host_scratch<double> s(1, 9, 9, 3);
  std::vector<double> dy(3), w(9), dx(3), x(3), gw(9), gb(1);
  const std::string why = "tensor parallel 2d 3x3: a deterministic reduce over 3 ranks of a device group without rank-ordered sums (nccl) is not built yet";
  CHECK_THROWS_WITH_AS(layer.backward_input(g, std::span<const double>(dy), std::span<const double>(w), std::span<double>(dx), s.spans()),
                       why.c_str(), loom::config_error);
  CHECK_THROWS_WITH_AS(layer.backward_weight(g, std::span<const double>(x), std::span<const double>(dy), std::span<double>(gw),
                                             std::span<double>(gb), s.spans()),
                       why.c_str(), loom::config_error);
}

TEST_CASE("tensor grid: SUMMA's forward is bitwise the single-rank layer, its backward the grid-ordered sums, on 2d and 2.5d grids") {
  for (grid_case c : {grid_case{1, loom::tp_kind::d2, 4, 0}, grid_case{1, loom::tp_kind::d2, 9, 0},
                      grid_case{2, loom::tp_kind::d2, 4, 0}, grid_case{1, loom::tp_kind::d2_5, 8, 2},
                      grid_case{1, loom::tp_kind::d2_5, 4, 1}, grid_case{1, loom::tp_kind::d2, 1, 0},
                      grid_case{2, loom::tp_kind::d2_5, 2, 2}})
    for (bool ordered : {true, false}) {
      INFO("dp " << c.dp << " tp " << c.tp << " " << std::string(loom::to_string(c.kind)) << std::string(ordered ? " deterministic" : ""));
      run(c.dp * c.tp, [&](loom::threads::comm& w) { grid_suite::summa_matches_reference(w, c, ordered, true); });
    }
}

TEST_CASE("tensor grid: two chained 3D layers equal the blocked single-rank sums, the counters the documented volume") {
  for (auto [dp, tp] : {std::pair{1, 8}, std::pair{2, 8}, std::pair{1, 27}, std::pair{2, 1}})
    for (bool ordered : {true, false}) {
      INFO("dp " << dp << " tp " << tp << std::string(ordered ? " deterministic" : ""));
      run(dp * tp, [&](loom::threads::comm& w) { grid_suite::cube_matches_reference(w, dp, tp, ordered, true); });
    }
}

TEST_CASE("tensor grid: the layer norm over a grid's feature blocks equals the blocked single-rank norm, forward and backward") {
  for (auto [c, odd] : {std::pair{grid_case{1, loom::tp_kind::d2, 4, 0}, false}, std::pair{grid_case{2, loom::tp_kind::d2, 9, 0}, false},
                        std::pair{grid_case{1, loom::tp_kind::d2_5, 8, 2}, false}, std::pair{grid_case{1, loom::tp_kind::d3, 8, 0}, false},
                        std::pair{grid_case{1, loom::tp_kind::d3, 8, 0}, true}, std::pair{grid_case{1, loom::tp_kind::d3, 27, 0}, true}})
    for (bool ordered : {true, false}) {
      INFO("dp " << c.dp << " tp " << c.tp << " " << std::string(loom::to_string(c.kind)) << (odd ? " odd" : "")
                 << std::string(ordered ? " deterministic" : ""));
      run(c.dp * c.tp, [&](loom::threads::comm& w) { grid_suite::norm_matches_reference(w, c, odd, ordered, true); });
    }
}

TEST_CASE("tensor grid: a layer that does not fit its grid, and blocks of the wrong size, are refused with one sentence") {
  using loom::tp_grid;
  const tp_grid g2 = loom::make_tp_grid(loom::tp_kind::d2, 4), g3 = loom::make_tp_grid(loom::tp_kind::d3, 8);
  CHECK(loom::summa_rule(8, 8, 4, g2).empty());
  CHECK(loom::summa_rule(7, 8, 4, g2) == "tensor parallel 2d 2x2: 7 input features are not divisible by q = 2");
  CHECK(loom::summa_rule(8, 6, 4, g2) ==
        "tensor parallel 2d 2x2: 6 output features are not divisible by q x q = 4 (the biases are split over the grid)");
  CHECK(loom::summa_rule(8, 8, 3, g2) == "tensor parallel 2d 2x2: 3 tokens are not divisible by q x depth = 2");
  CHECK(loom::summa_rule(8, 8, 4, g3) == "tensor parallel 3d 2x2x2: SUMMA's layer runs on the 2d and 2.5d grids");
  CHECK(loom::cube_rule(8, 8, 4, g3).empty());
  CHECK(loom::cube_rule(8, 6, 4, g3) == "tensor parallel 3d 2x2x2: 6 output features are not divisible by q x q = 4");
  CHECK(loom::cube_rule(8, 8, 6, g3) == "tensor parallel 3d 2x2x2: 6 tokens are not divisible by q x q = 4");
  CHECK(loom::cube_rule(8, 8, 4, g2) == "tensor parallel 2d 2x2: the 3D layer runs on the 3d grid");
  std::mutex mu;
  std::vector<std::string> errors;
  loom::run_threads(4, [&](loom::threads::comm& w) {
    loom::mesh_comm mc(loom::mesh<loom::tp<4, loom::tp_kind::d2>>{}, w);
    auto gc = loom::grid_comms(mc, true);
    loom::summa_host_scratch<double> s(2, 8, 8, 2);
    std::vector<double> x(2 * 4), wt(4 * 4), b(2), y(2 * 4);
    auto attempt = [&](const loom::summa_linear<>& layer, std::span<const double> xs) {
      try {
        layer.forward(gc, xs, std::span<const double>(wt), std::span<const double>(b), std::span<double>(y), s.spans());
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        errors.emplace_back(e.what());
      }
    };
    attempt(loom::summa_linear<>{7, 8}, std::span<const double>(x));                  // every rank refuses before communicating
    attempt(loom::summa_linear<>{8, 8}, std::span<const double>(x).first(7));         // not whole tokens
  });
  REQUIRE(errors.size() == 8);
  CHECK(std::count(errors.begin(), errors.end(), "tensor parallel 2d 2x2: 7 input features are not divisible by q = 2") == 4);
  CHECK(std::count(errors.begin(), errors.end(),
                   "loom summa_linear: an activation block of 7 elements is not a whole number of tokens of 4 features") == 4);
}

TEST_CASE("tensor grid: the layer norm refuses a span or a scratch of the wrong size with one sentence naming it, before communicating") {
  std::mutex mu;
  std::vector<std::string> errors;
  loom::run_threads(4, [&](loom::threads::comm& w) {
    loom::mesh_comm mc(loom::mesh<loom::tp<4, loom::tp_kind::d2>>{}, w);
    auto gc = loom::grid_comms(mc, true);
    auto ng = loom::norm_groups<typename decltype(mc)::comm_type>::of_summa(gc);
    const std::size_t n = 3, h = 8, hq = 4;  // 2 x 2 grid: feature blocks of 4, pieces of 2
    const loom::grid_layer_norm<> norm{h};
    loom::norm_host_scratch<double> s(n, h, 2);
    std::vector<double> x(n * hq), g(2), b(2), y(n * hq), xhat(n * hq), rstd(n), dx(n * hq), gg(2), gb(2), small(1);
    auto cs = [](const std::vector<double>& v) { return std::span<const double>(v); };
    auto ms = [](std::vector<double>& v) { return std::span<double>(v); };
    auto attempt = [&](auto&& call) {
      try {
        call();
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        errors.emplace_back(e.what());
      }
    };
    attempt([&] { norm.forward(ng, cs(x), cs(g), cs(b), ms(y).first(n * hq - 1), ms(xhat), ms(rstd), s.spans()); });
    attempt([&] {
      loom::norm_scratch<double> t = s.spans();
      t.stats = ms(small);
      norm.forward(ng, cs(x), cs(g), cs(b), ms(y), ms(xhat), ms(rstd), t);
    });
    attempt([&] { norm.backward_input(ng, cs(x), cs(xhat), cs(rstd), cs(g), cs(x).first(5), ms(dx), s.spans()); });
    attempt([&] { norm.backward_weight(ng, cs(x), cs(xhat).first(n * hq - 4), ms(gg), ms(gb), s.spans()); });
  });
  REQUIRE(errors.size() == 16);
  for (const char* want : {"loom grid_layer_norm: the output has 11 elements; the norm needs 12",
                           "loom grid_layer_norm: the scratch for the statistics has 1 elements; the norm needs at least 6",
                           "loom grid_layer_norm: the residual gradient has 5 elements; the norm needs 12",
                           "loom grid_layer_norm: the normalised input has 8 elements; the norm needs 12"})
    CHECK(std::count(errors.begin(), errors.end(), std::string(want)) == 4);
}
