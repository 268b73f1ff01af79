// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The vocabulary-parallel input and output layers (loom/exec/vocab_parallel.hpp) against the
// unsplit layers: for p = 1..4 shards, with and without padding rows, both algorithms give the
// unsplit loss, weight gradient and input gradient within 1e-12 relative; the input layer is
// bitwise the unsplit lookup and scatter-add; the results are the same bits on every run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "loom/exec/vocab_parallel.hpp"
#include "loom/schedule/vocab.hpp"

namespace {

using vec = std::vector<double>;

struct problem {
  std::size_t n = 0, h = 0, vocab = 0;  // tokens, hidden, padded vocabulary
  vec x, w, e, dembed;                  // [n][h], [V][h], [V][h], [n][h]
  std::vector<std::int32_t> ids, targets;
};

problem make_problem(std::size_t n, std::size_t h, std::size_t vocab, std::size_t used, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(used) - 1);  // padding rows are never a token
  problem p{n, h, vocab, vec(n * h), vec(vocab * h), vec(vocab * h), vec(n * h), std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  for (auto* v : {&p.x, &p.w, &p.e, &p.dembed})
    for (double& a : *v) a = u(gen);
  for (std::size_t t = 0; t < n; ++t) {
    p.ids[t] = id(gen);
    p.targets[t] = id(gen);
  }
  return p;
}

// The unsplit output layer and loss: plain loops over the whole vocabulary.
struct reference {
  double loss = 0;
  vec gw, dx;
};

reference unsplit(const problem& p, double dl) {
  reference r{0, vec(p.vocab * p.h, 0.0), vec(p.n * p.h, 0.0)};
  vec l(p.vocab);
  for (std::size_t t = 0; t < p.n; ++t) {
    for (std::size_t v = 0; v < p.vocab; ++v) {
      double z = 0;
      for (std::size_t i = 0; i < p.h; ++i) z += p.x[t * p.h + i] * p.w[v * p.h + i];
      l[v] = z;
    }
    const double big = *std::max_element(l.begin(), l.end());
    double sigma = 0;
    for (double z : l) sigma += std::exp(z - big);
    r.loss += std::log(sigma) + big - l[static_cast<std::size_t>(p.targets[t])];
    for (std::size_t v = 0; v < p.vocab; ++v) {
      const double g = (std::exp(l[v] - big) / sigma - (static_cast<std::int32_t>(v) == p.targets[t] ? 1.0 : 0.0)) * dl;
      for (std::size_t i = 0; i < p.h; ++i) {
        r.gw[v * p.h + i] += g * p.x[t * p.h + i];
        r.dx[t * p.h + i] += g * p.w[v * p.h + i];
      }
    }
  }
  return r;
}

// One training pass of the split layers over `shards` ranks (played in one process, the
// statistics and partial gradients "sent" in rank order), Algorithm `variant`.
struct split_result {
  double loss = 0;
  vec gw, dx, embed, egrad;
};

split_result split(const problem& p, int shards, int variant, double dl) {
  const std::size_t n = p.n, h = p.h;
  const auto P = static_cast<std::size_t>(shards);
  split_result out{0, vec(p.vocab * h, 0.0), vec(n * h, 0.0), vec(n * h, 0.0), vec(p.vocab * h, 0.0)};
  std::vector<loom::vocab_output_layer<>> layers;
  std::vector<vec> e(P), st(P), gpart(P), ypart(P), dxpart(P);
  std::vector<loom::vocab_statistics<double>> stats;
  for (int r = 0; r < shards; ++r) {
    const auto shard = loom::shard_of(static_cast<std::int64_t>(p.vocab), shards, r, h);
    layers.push_back({.shard = shard});
    // IF: each shard's part, summed in rank order into the first stage's input.
    const loom::vocab_input_layer in{shard};
    vec part(n * h);
    const auto rows = std::span<const double>(p.e).subspan(static_cast<std::size_t>(shard.first) * h, shard.rows * h);
    in.forward(std::span<const std::int32_t>(p.ids), rows, std::span<double>(part));
    for (std::size_t k = 0; k < part.size(); ++k) out.embed[k] += part[k];
    // IB: the first stage's input gradient into the shard's rows.
    in.backward(std::span<const std::int32_t>(p.ids), std::span<const double>(p.dembed),
                std::span<double>(out.egrad).subspan(static_cast<std::size_t>(shard.first) * h, shard.rows * h));
  }
  auto w_of = [&](std::size_t r) {
    return std::span<const double>(p.w).subspan(static_cast<std::size_t>(layers[r].shard.first) * h, layers[r].shard.rows * h);
  };
  for (std::size_t r = 0; r < P; ++r) {  // S on every rank
    e[r].assign(layers[r].stash_size(n), 0.0);
    st[r].assign(3 * n, 0.0);
    stats.push_back({std::span<double>(st[r]), n});
    layers[r].forward(std::span<const double>(p.x), w_of(r), std::span<const std::int32_t>(p.targets), std::span<double>(e[r]), stats[r]);
    if (variant == 2) {
      vec scratch(n * layers[r].shard.rows);
      gpart[r].assign(n * h, 0.0);
      ypart[r].assign(n * h, 0.0);
      layers[r].input_gradient_parts(w_of(r), std::span<const std::int32_t>(p.targets), std::span<const double>(e[r]), stats[r],
                                     std::span<double>(scratch), std::span<double>(gpart[r]), std::span<double>(ypart[r]));
    }
  }
  vec global_data(3 * n);
  const loom::vocab_statistics<double> global{std::span<double>(global_data), n};
  loom::vocab_output_layer<>::combine(std::span<const loom::vocab_statistics<double>>(stats), global);
  out.loss = loom::vocab_output_layer<>::loss(global);
  for (std::size_t r = 0; r < P; ++r) {  // T on every rank
    if (variant == 1) dxpart[r].assign(n * h, 0.0);
    const auto gw = std::span<double>(out.gw).subspan(static_cast<std::size_t>(layers[r].shard.first) * h, layers[r].shard.rows * h);
    layers[r].backward(std::span<const double>(p.x), w_of(r), std::span<const std::int32_t>(p.targets), std::span<double>(e[r]), stats[r],
                       global, dl, gw, variant == 1 ? std::span<double>(dxpart[r]) : std::span<double>{});
  }
  std::vector<std::span<const double>> a, b;
  for (std::size_t r = 0; r < P; ++r) {
    a.emplace_back(variant == 1 ? dxpart[r] : gpart[r]);
    b.emplace_back(variant == 1 ? dxpart[r] : ypart[r]);
  }
  if (variant == 1) loom::vocab_output_layer<>::sum_input_gradient(std::span<const std::span<const double>>(a), std::span<double>(out.dx));
  else
    loom::vocab_output_layer<>::fused_input_gradient(std::span<const std::span<const double>>(a), std::span<const std::span<const double>>(b),
                                                     std::span<const loom::vocab_statistics<double>>(stats), global, dl, std::span<double>(out.dx));
  return out;
}

double relative_error(const vec& got, const vec& want) {
  double num = 0, den = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    num = std::max(num, std::abs(got[k] - want[k]));
    den = std::max(den, std::abs(want[k]));
  }
  return num / den;
}

}  // namespace

TEST_CASE("vocab layers: split over 1 to 4 shards, both algorithms equal the unsplit layers within 1e-12, the input layer bit for bit") {
  int cases = 0;
  for (int shards = 1; shards <= 4; ++shards)
    for (std::size_t used : {std::size_t{24}, std::size_t{21}})  // 21: the last shards hold padding rows
      for (int variant : {1, 2}) {
        CAPTURE(shards);
        CAPTURE(used);
        CAPTURE(variant);
        const problem p = make_problem(7, 5, 24, used, 100u + static_cast<unsigned>(shards) * 7u + static_cast<unsigned>(used));
        const double dl = 1.0 / 3.0;
        const reference want = unsplit(p, dl);
        const split_result got = split(p, shards, variant, dl);
        CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
        CHECK(relative_error(got.gw, want.gw) <= 1e-12);
        CHECK(relative_error(got.dx, want.dx) <= 1e-12);
        // The input layer: the lookup and the scatter-add, exactly.
        vec embed(p.n * p.h), egrad(p.vocab * p.h, 0.0);
        for (std::size_t t = 0; t < p.n; ++t)
          for (std::size_t i = 0; i < p.h; ++i) {
            embed[t * p.h + i] = p.e[static_cast<std::size_t>(p.ids[t]) * p.h + i];
            egrad[static_cast<std::size_t>(p.ids[t]) * p.h + i] += p.dembed[t * p.h + i];
          }
        CHECK(got.embed == embed);
        CHECK(got.egrad == egrad);
        // Reproducible: the same bits again.
        const split_result again = split(p, shards, variant, dl);
        CHECK(again.loss == got.loss);
        CHECK(again.gw == got.gw);
        CHECK(again.dx == got.dx);
        ++cases;
      }
  CHECK(cases == 16);
}

TEST_CASE("vocab layers: the two algorithms agree, and the statistics survive logits far apart") {
  problem p = make_problem(5, 4, 16, 16, 7u);
  for (double& a : p.w) a *= 40.0;  // logits in the hundreds: a naive sum of exp would overflow
  const reference want = unsplit(p, 1.0);
  REQUIRE(std::isfinite(want.loss));
  const split_result one = split(p, 4, 1, 1.0), two = split(p, 4, 2, 1.0);
  CHECK(std::isfinite(one.loss));
  CHECK(std::abs(one.loss - want.loss) <= 1e-12 * std::abs(want.loss));
  CHECK(relative_error(one.dx, two.dx) <= 1e-12);
  CHECK(one.gw == two.gw);  // the weight gradient is computed the same way in both
}

TEST_CASE("vocab layers: refusals, one line each") {
  CHECK_THROWS_WITH_AS(loom::shard_of(50257, 8, 0, 16),
                       "vocabulary parallelism: a vocabulary of 50257 ids does not split into 8 equal shards for rank 0 (pad it with "
                       "loom::split_vocabulary)",
                       loom::config_error);
  CHECK_THROWS_AS(loom::shard_of(64, 4, 4, 16), loom::config_error);
  const auto split = loom::split_vocabulary(50257, 8);
  const auto shard = loom::shard_of(split.padded, 8, 3, 16);
  CHECK(shard.first == 3 * 6288);
  CHECK(shard.rows == 6288);
  const loom::vocab_input_layer in{loom::shard_of(8, 2, 0, 2)};
  vec part(6), table(8);
  const std::vector<std::int32_t> two_ids{1, 2};
  CHECK_THROWS_WITH_AS(in.forward(std::span<const std::int32_t>(two_ids), std::span<const double>(table), std::span<double>(part)),
                       "vocabulary parallelism: the input layer got 2 token ids for 3 tokens", loom::config_error);
}
