// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The mixture-of-experts routing contract (loom/exec/moe.hpp): Tutel's slots, capacity and
// dropping on a hand-made example, its capacity formula, GShard's auxiliary loss, dispatch ->
// experts -> combine equal to the per-token layer bit for bit, and the backward of all of it
// against central finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "loom/exec/moe.hpp"
#include "loom/exec/tensor_parallel.hpp"

namespace {

using vec = std::vector<double>;

// Six tokens over three experts, top-2: first choices 0 0 0 1 0 2, second choices 1 2 1 0 1 0.
vec six_tokens() {
  const int first[6] = {0, 0, 0, 1, 0, 2}, second[6] = {1, 2, 1, 0, 1, 0};
  vec l(18, 0.0);
  for (int t = 0; t < 6; ++t) {
    l[static_cast<std::size_t>(t * 3 + first[t])] = 2.0;
    l[static_cast<std::size_t>(t * 3 + second[t])] = 1.0;
  }
  return l;
}

std::vector<std::pair<int, int>> dropped_pairs(const loom::moe_routing<double>& r) {
  std::vector<std::pair<int, int>> out;
  for (std::size_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < r.top_k; ++j)
      if (!r.kept(t, j)) out.emplace_back(static_cast<int>(t), j);
  return out;
}

// A small MoE layer: router Wg [E][h], experts W_e [h][h] (linear, no bias), loss
// sum_t y[t] . c[t] + lambda l_aux.
struct layer {
  std::size_t n = 0, h = 0;
  loom::moe_options o;
  vec x, wg, we, c;
  double lambda = 0.01;

  double loss(loom::moe_routing<double>* keep = nullptr, vec* y_out = nullptr) const {
    const auto E = static_cast<std::size_t>(o.experts);
    vec logits(n * E);
    loom::linear_kernel::forward(std::span<const double>(x), std::span<const double>(wg), std::span<const double>{}, std::span<double>(logits), n,
                                 h, E);
    auto r = loom::moe_route(o, std::span<const double>(logits));
    loom::set_capacity(r, o, r.max_load());
    const auto C = static_cast<std::size_t>(r.capacity);
    vec slots(E * C * h), out(E * C * h), y(n * h);
    loom::moe_dispatch(r, std::span<const double>(x), std::span<double>(slots), h);
    for (std::size_t e = 0; e < E; ++e)
      loom::linear_kernel::forward(std::span<const double>(slots).subspan(e * C * h, C * h), std::span<const double>(we).subspan(e * h * h, h * h),
                                   std::span<const double>{}, std::span<double>(out).subspan(e * C * h, C * h), C, h, h);
    loom::moe_combine(r, std::span<const double>(out), std::span<double>(y), h);
    double L = 0;
    for (std::size_t k = 0; k < y.size(); ++k) L += y[k] * c[k];
    L += lambda * loom::moe_aux_loss(r);
    if (keep != nullptr) *keep = r;
    if (y_out != nullptr) *y_out = y;
    return L;
  }

  // The analytic gradients of `loss` with respect to x, wg and we.
  void gradients(vec& dx, vec& dwg, vec& dwe) const {
    const auto E = static_cast<std::size_t>(o.experts), k = static_cast<std::size_t>(o.top_k);
    loom::moe_routing<double> r;
    loss(&r);
    const auto C = static_cast<std::size_t>(r.capacity);
    vec slots(E * C * h), out(E * C * h);
    loom::moe_dispatch(r, std::span<const double>(x), std::span<double>(slots), h);
    for (std::size_t e = 0; e < E; ++e)
      loom::linear_kernel::forward(std::span<const double>(slots).subspan(e * C * h, C * h), std::span<const double>(we).subspan(e * h * h, h * h),
                                   std::span<const double>{}, std::span<double>(out).subspan(e * C * h, C * h), C, h, h);
    vec dout(E * C * h), dgate(n * k), dslots(E * C * h), dlogits(n * E);
    loom::moe_combine_backward(r, std::span<const double>(out), std::span<const double>(c), std::span<double>(dout), std::span<double>(dgate), h);
    dwe.assign(E * h * h, 0.0);
    for (std::size_t e = 0; e < E; ++e) {
      loom::linear_kernel::backward_input(std::span<const double>(dout).subspan(e * C * h, C * h), std::span<const double>(we).subspan(e * h * h, h * h),
                                          std::span<double>(dslots).subspan(e * C * h, C * h), C, h, h);
      loom::linear_kernel::backward_weight(std::span<const double>(slots).subspan(e * C * h, C * h), std::span<const double>(dout).subspan(e * C * h, C * h),
                                           std::span<double>(dwe).subspan(e * h * h, h * h), std::span<double>{}, C, h, h);
    }
    dx.assign(n * h, 0.0);
    loom::moe_dispatch_backward(r, std::span<const double>(dslots), std::span<double>(dx), h);
    loom::moe_route_backward(r, o, std::span<const double>(dgate), lambda, std::span<double>(dlogits));
    vec dx_router(n * h);
    loom::linear_kernel::backward_input(std::span<const double>(dlogits), std::span<const double>(wg), std::span<double>(dx_router), n, h, E);
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dx_router[i];
    dwg.assign(E * h, 0.0);
    loom::linear_kernel::backward_weight(std::span<const double>(x), std::span<const double>(dlogits), std::span<double>(dwg), std::span<double>{}, n, h, E);
  }
};

layer make_layer(int E, int k, double f, bool normalize, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  layer L;
  L.n = 9;
  L.h = 3;
  L.o = {.experts = E, .top_k = k, .capacity_factor = f, .normalize_gate = normalize};
  L.x.resize(L.n * L.h);
  L.wg.resize(static_cast<std::size_t>(E) * L.h);
  L.we.resize(static_cast<std::size_t>(E) * L.h * L.h);
  L.c.resize(L.n * L.h);
  for (auto* v : {&L.x, &L.wg, &L.we, &L.c})
    for (double& a : *v) a = u(gen);
  for (double& a : L.wg) a *= 3.0;  // distinct scores: no choice flips under the finite differences
  return L;
}

// Central differences of `L.loss` in every element of `*v`, against `g`.
double worst_gradient_error(layer& L, vec* v, const vec& g) {
  double worst = 0;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const double keep = (*v)[i], eps = 1e-6;
    (*v)[i] = keep + eps;
    const double up = L.loss();
    (*v)[i] = keep - eps;
    const double down = L.loss();
    (*v)[i] = keep;
    const double fd = (up - down) / (2 * eps);
    worst = std::max(worst, std::abs(fd - g[i]) / std::max(1.0, std::abs(fd)));
  }
  return worst;
}

}  // namespace

TEST_CASE("moe: Tutel's slots place every first choice before any second choice, and the capacity drops exactly the pairs at or past it") {
  const vec logits = six_tokens();
  loom::moe_options o{.experts = 3, .top_k = 2, .capacity_factor = 1.0};
  auto r = loom::moe_route(o, std::span<const double>(logits));
  CHECK(r.expert == std::vector<int>{0, 1, 0, 2, 0, 1, 1, 0, 0, 1, 2, 0});
  CHECK(r.slot == std::vector<long long>{0, 1, 1, 1, 2, 2, 0, 4, 3, 3, 0, 5});
  CHECK(r.load == std::vector<long long>{6, 4, 2});
  CHECK(r.first == std::vector<long long>{4, 1, 1});
  // f = 1: C = k floor(f ceil(6 / 3)) = 4; the second choices of tokens 3 and 5 (slots 4, 5) drop.
  loom::set_capacity(r, o, r.max_load());
  CHECK(r.capacity == 4);
  CHECK(dropped_pairs(r) == std::vector<std::pair<int, int>>{{3, 1}, {5, 1}});
  // f = 0.5: C = 2; expert 0's third and fourth first choices drop before any second choice is placed.
  o.capacity_factor = 0.5;
  loom::set_capacity(r, o, r.max_load());
  CHECK(r.capacity == 2);
  CHECK(dropped_pairs(r) == std::vector<std::pair<int, int>>{{2, 0}, {2, 1}, {3, 1}, {4, 0}, {4, 1}, {5, 1}});
  // f = 0: the largest load over the group, here 6 (or a larger one from another rank): nothing drops.
  o.capacity_factor = 0;
  loom::set_capacity(r, o, r.max_load());
  CHECK(r.capacity == 6);
  CHECK(r.dropped() == 0);
  loom::set_capacity(r, o, 9);
  CHECK(r.capacity == 9);
  // Gates: the normalised scores of the two choices, (e^2, e^1) / (e^2 + e^1).
  CHECK(r.gate[0] == doctest::Approx(std::exp(1.0) / (std::exp(1.0) + 1.0)));
  CHECK(r.gate[0] + r.gate[1] == doctest::Approx(1.0));
}

TEST_CASE("moe: the capacity formula, its alignment, and ties going to the lower expert") {
  loom::moe_options o{.experts = 4, .top_k = 2, .capacity_factor = 1.25};
  CHECK(loom::moe_capacity(o, 10, 0) == 6);  // 2 floor(1.25 x ceil(10/4) = 3.75)
  o.capacity_factor = 2;
  CHECK(loom::moe_capacity(o, 10, 0) == 12);
  o.capacity_factor = 1.25;
  o.alignment = 4;
  CHECK(loom::moe_capacity(o, 10, 0) == 8);
  o.capacity_factor = 0;
  CHECK(loom::moe_capacity(o, 10, 5) == 8);
  o.alignment = 1;
  CHECK(loom::moe_capacity(o, 10, 5) == 5);
  const vec flat(8, 0.0);  // two tokens, four equal scores
  const auto r = loom::moe_route(loom::moe_options{.experts = 4, .top_k = 2}, std::span<const double>(flat));
  CHECK(r.expert == std::vector<int>{0, 1, 0, 1});
}

TEST_CASE("moe: GShard's auxiliary loss is 1 for uniform scores and grows with imbalance") {
  const vec flat(8 * 4, 0.0);
  auto r = loom::moe_route(loom::moe_options{.experts = 4, .top_k = 1}, std::span<const double>(flat));
  CHECK(loom::moe_aux_loss(r) == 1.0);  // E / n^2 x (n / E) x n
  vec skewed(8 * 4, 0.0);
  for (std::size_t t = 0; t < 8; ++t) skewed[t * 4] = 3.0;  // every token prefers expert 0
  r = loom::moe_route(loom::moe_options{.experts = 4, .top_k = 1}, std::span<const double>(skewed));
  double me0 = 0;
  for (std::size_t t = 0; t < 8; ++t) me0 += r.scores[t * 4];
  CHECK(loom::moe_aux_loss(r) == doctest::Approx(4.0 / 64 * me0 * 8));
  CHECK(loom::moe_aux_loss(r) > 1.0);
}

TEST_CASE("moe: dispatch, the experts and combine equal the per-token layer bit for bit, dropping included") {
  int cases = 0;
  for (int k : {1, 2})
    for (double f : {0.0, 0.5, 1.0, 2.0}) {
      CAPTURE(k);
      CAPTURE(f);
      const layer L = make_layer(4, k, f, true, 11u + static_cast<unsigned>(k * 10 + f * 4));
      loom::moe_routing<double> r;
      vec y;
      L.loss(&r, &y);
      if (f == 0.0) CHECK(r.dropped() == 0);
      if (f == 0.5) CHECK(r.dropped() > 0);
      // Per expert: the slots 0 .. load - 1 are taken, so load - C of them are dropped when positive.
      const auto per = r.dropped_per_expert();
      REQUIRE(per.size() == 4);
      long long sum = 0;
      for (std::size_t e = 0; e < 4; ++e) {
        CHECK(per[e] == std::max(0LL, r.load[e] - r.capacity));
        sum += per[e];
      }
      CHECK(sum == static_cast<long long>(r.dropped()));
      // Per token: y[t] = sum over its kept choices of g W_e x[t], with the same sums in the same order.
      const std::size_t h = L.h;
      for (std::size_t t = 0; t < L.n; ++t) {
        vec want(h, 0.0);
        for (int j = 0; j < k; ++j) {
          if (!r.kept(t, j)) continue;
          const auto e = static_cast<std::size_t>(r.expert[t * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)]);
          for (std::size_t o = 0; o < h; ++o) {
            double z = 0;
            for (std::size_t i = 0; i < h; ++i) z += L.x[t * h + i] * L.we[e * h * h + o * h + i];
            want[o] += r.gate[t * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)] * z;
          }
        }
        for (std::size_t o = 0; o < h; ++o) CHECK(y[t * h + o] == want[o]);
      }
      ++cases;
    }
  CHECK(cases == 8);
}

TEST_CASE("moe: the backward through combine, the experts, dispatch, the gates, the aux loss and the router equals finite differences") {
  for (int k : {1, 2})
    for (bool normalize : {true, false})
      for (double f : {0.0, 0.75}) {
        CAPTURE(k);
        CAPTURE(normalize);
        CAPTURE(f);
        layer L = make_layer(4, k, f, normalize, 101u + static_cast<unsigned>(k * 7) + (normalize ? 1u : 0u));
        vec dx, dwg, dwe;
        L.gradients(dx, dwg, dwe);
        CHECK(worst_gradient_error(L, &L.x, dx) < 1e-6);
        CHECK(worst_gradient_error(L, &L.wg, dwg) < 1e-6);
        CHECK(worst_gradient_error(L, &L.we, dwe) < 1e-6);
      }
}

TEST_CASE("moe: refusals, one line each") {
  auto rule = [](loom::moe_options o) { return loom::moe_rule(o); };
  CHECK(rule({.experts = 4, .top_k = 5}) == "moe: top-k must be between 1 and the number of experts 4 (got 5)");
  CHECK(rule({.experts = 0}) == "moe: the number of experts must be >= 1 (got 0)");
  CHECK(rule({.experts = 4, .top_k = 1, .capacity_factor = -1}) ==
        "moe: the capacity factor must be a finite number >= 0 (0: no dropping; got -1)");
  CHECK(rule({.experts = 4, .top_k = 1, .capacity_factor = std::nan("")}).find("finite") != std::string::npos);
  CHECK(rule({.experts = 4, .top_k = 1, .alignment = 0}) == "moe: the capacity alignment must be >= 1 (got 0)");
  const vec seven(7, 0.0);
  CHECK_THROWS_WITH_AS(loom::moe_route(loom::moe_options{.experts = 4}, std::span<const double>(seven)),
                       "moe: 7 router logits are not a whole number of tokens of 4 experts", loom::config_error);
  CHECK_THROWS_AS(loom::moe_route(loom::moe_options{.experts = 2, .top_k = 3}, std::span<const double>(seven)), loom::config_error);
}
