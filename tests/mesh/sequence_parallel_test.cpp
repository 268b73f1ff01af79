// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The tensor- and sequence-parallel patterns on the threads backend against single-rank
// computations: Megatron's column/row-parallel blocks (replicated and sequence-sharded), Ulysses'
// all-to-alls, ring attention (zig-zag, causal blocks skipped, balanced), USP, TokenRing (its merge
// also under arrivals forced out of order) and DSP, forward and backward, over grids of degrees.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/counting.hpp"
#include "loom/comm/threads.hpp"
#include "loom/exec/sequence_parallel.hpp"
#include "loom/exec/tensor_parallel.hpp"
#include "dsp_suite.hpp"
#include "token_ring_suite.hpp"

namespace {

double val(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

//! Plain causal attention on one rank: the reference (one block per row over all its keys).
void dense_attention(const loom::attention_dims& a, int n, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& dout, std::vector<double>& o,
                     std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) {
  const auto sz = static_cast<std::size_t>(n * a.heads * a.head_dim);
  o.assign(sz, 0.0);
  std::vector<double> lse(static_cast<std::size_t>(n * a.heads), -INFINITY),
      delta(lse.size());
  loom::attention_block_forward<double>(a, q, k, v, o, lse, 0, n, 0, n, loom::block_mask::causal);
  loom::attention_delta<double>(a, o, dout, delta);
  dq.assign(sz, 0.0);
  dk.assign(sz, 0.0);
  dv.assign(sz, 0.0);
  loom::attention_block_backward<double>(a, q, k, v, lse, dout, delta, dq, dk, dv, 0, n, 0, n, loom::block_mask::causal);
}

double max_rel(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::abs(got[i] - want[i]));
    m = std::max(m, std::abs(want[i]));
  }
  return d / m;
}

}  // namespace

TEST_CASE("sequence parallel: USP, Ulysses and ring attention equal plain causal attention forward and backward") {
  struct cfg {
    int u, ring;
  };
  for (cfg c : {cfg{1, 1}, cfg{2, 1}, cfg{4, 1}, cfg{1, 2}, cfg{1, 3}, cfg{1, 4}, cfg{2, 2}, cfg{2, 3}})
    for (int heads : {4, 8}) {
      const int sp = c.u * c.ring, N = 24, D = 3;
      loom::seq_split split{N, c.u, c.ring};
      if (!split.rule(heads).empty()) continue;
      INFO("ulysses " << c.u << " ring " << c.ring << " heads " << heads);
      const loom::attention_dims a{heads, D, 1.0 / std::sqrt(3.0)};
      auto at = [&](int tensor, int tok, int h, int d) { return val(static_cast<std::uint64_t>(tensor), static_cast<std::uint64_t>((tok * heads + h) * D + d)); };
      // Whole-sequence tensors.
      const auto sz = static_cast<std::size_t>(N * heads * D);
      std::vector<double> Q(sz), K(sz), V(sz), dO(sz), O, dQ, dK, dV;
      for (int t = 0; t < N; ++t)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < D; ++d) {
            auto i = static_cast<std::size_t>((t * heads + h) * D + d);
            Q[i] = at(1, t, h, d), K[i] = at(2, t, h, d), V[i] = at(3, t, h, d), dO[i] = at(4, t, h, d);
          }
      dense_attention(a, N, Q, K, V, dO, O, dQ, dK, dV);
      std::mutex mu;
      double worst = 0;
      std::vector<int> computed;
      loom::run_threads(sp, [&](loom::threads::comm& world) {
        const int r = world.rank();
        loom::counted<loom::threads::comm> uc(world.split(r / c.u, r % c.u)), rc(world.split(r % c.u, r / c.u));
        const int T = split.rank_tokens();
        loom::usp_attention<loom::counted<loom::threads::comm>, double> att(&uc, &rc, T, a, true);
        const auto n = static_cast<std::size_t>(T * heads * D);
        std::vector<double> qkv(3 * n), dout(n), o(n), dqkv(3 * n), stash(att.stash_size());
        for (int i = 0; i < T; ++i) {
          const int g = split.token(r, i);
          for (int x = 0; x < heads * D; ++x) {
            auto li = static_cast<std::size_t>(i * heads * D + x), gi = static_cast<std::size_t>(g * heads * D + x);
            qkv[li] = Q[gi], qkv[n + li] = K[gi], qkv[2 * n + li] = V[gi], dout[li] = dO[gi];
          }
        }
        att.forward(qkv, o, stash);
        att.backward(dout, dqkv, stash);
        std::vector<double> wo, wq, wk, wv, go, gq, gk, gv;
        for (int i = 0; i < T; ++i) {
          const int g = split.token(r, i);
          for (int x = 0; x < heads * D; ++x) {
            auto li = static_cast<std::size_t>(i * heads * D + x), gi = static_cast<std::size_t>(g * heads * D + x);
            go.push_back(o[li]), wo.push_back(O[gi]);
            gq.push_back(dqkv[li]), wq.push_back(dQ[gi]);
            gk.push_back(dqkv[n + li]), wk.push_back(dK[gi]);
            gv.push_back(dqkv[2 * n + li]), wv.push_back(dV[gi]);
          }
        }
        std::lock_guard lk(mu);
        worst = std::max({worst, max_rel(go, wo), max_rel(gq, wq), max_rel(gk, wk), max_rel(gv, wv)});
        computed.push_back(att.ring().computed_blocks());
        if (c.ring > 1) {
          // Zig-zag: 3 blocks on the first step (two diagonal, one full), 2 full ones on each later
          // step; the other 2R - 1 are masked and skipped. The same on every rank.
          CHECK(att.ring().computed_blocks() == 2 * c.ring + 1);
          CHECK(att.ring().skipped_blocks() == 2 * c.ring - 1);
        }
      });
      CHECK(worst < 1e-13);
      for (int x : computed) CHECK(x == computed[0]);
    }
}

TEST_CASE("sequence parallel: TokenRing keeps K and V home, equals its single-rank order bitwise and ring attention's backward bitwise") {
  for (int R : {1, 2, 3, 4})
    for (bool causal : {true, false})
      for (int round = 0; round < 3; ++round) {  // no delay, then the ranks started late in two orders
        INFO("ring " << R << (causal ? " causal" : "") << " round " << round);
        std::mutex mu;
        std::vector<std::string> errors;
        loom::run_threads(R, [&](loom::threads::comm& world) {
          const int r = world.rank();
          if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2 * (round == 1 ? r : R - 1 - r)));
          try {
            token_ring_suite::matches_reference(world, causal);
          } catch (const token_ring_suite::failure& e) {
            std::lock_guard lk(mu);
            errors.emplace_back(e.what());
          }
        });
        for (auto& e : errors) FAIL_CHECK(e);
      }
}

//! A threads communicator that watches TokenRing's partial outputs arrive and makes them arrive
//! out of step order. Every call polls the receives of `partial_bytes` posted through it and logs
//! each one's source the first time it finds it complete (so the log is the order of arrival, to
//! the polling's resolution); and the first partial this rank sends waits `delay x rank` first,
//! so at the first owner the step-1 partial (from the last rank) comes after later steps'.
class arrival_watch : public loom::threads::comm {
 public:
  arrival_watch(loom::threads::comm c, std::size_t partial_bytes, std::chrono::milliseconds delay, std::vector<int>* log)
      : comm(std::move(c)), bytes_(partial_bytes), delay_(delay), log_(log) {}
  arrival_watch split(int color, int key) { return {comm::split(color, key), bytes_, delay_, log_}; }
  request isend(int peer, std::span<const std::byte> d) {
    observe();
    if (d.size() == bytes_ && sent_++ == 0) std::this_thread::sleep_for(delay_ * rank());
    return comm::isend(peer, d);
  }
  request irecv(int peer, std::span<std::byte> d) {
    observe();
    request r = comm::irecv(peer, d);
    if (d.size() == bytes_) pending_.push_back({r, peer});
    return r;
  }
  void wait(request& r) {
    while (!comm::test(r)) {
      observe();
      std::this_thread::yield();
    }
    observe();
    comm::wait(r);
  }

 private:
  struct entry {
    request r;
    int peer;
    bool seen = false;
  };
  void observe() {
    for (auto& e : pending_)
      if (!e.seen && comm::test(e.r)) {
        e.seen = true;
        log_->push_back(e.peer);
      }
  }
  std::size_t bytes_;
  std::chrono::milliseconds delay_;
  std::vector<int>* log_;
  int sent_ = 0;
  std::vector<entry> pending_;
};

TEST_CASE("sequence parallel: TokenRing's merge does not depend on the order its partials arrive in (out-of-order arrivals observed, bits unchanged)") {
  int reordered = 0;
  for (int R : {3, 4})
    for (bool causal : {true, false}) {
      const int T = 24 / R;  // token_ring_suite: 24 tokens, 4 heads of 3 features
      const std::size_t partial = static_cast<std::size_t>(T * 4 * (3 + 1)) * sizeof(double);
      std::vector<std::vector<int>> arrivals(static_cast<std::size_t>(R));
      std::mutex mu;
      std::vector<std::string> errors;
      loom::run_threads(R, [&](loom::threads::comm& world) {
        const int r = world.rank();
        arrival_watch w(world.split(0, r), partial, std::chrono::milliseconds(50), &arrivals[static_cast<std::size_t>(r)]);
        try {
          token_ring_suite::matches_reference(w, causal);
        } catch (const token_ring_suite::failure& e) {
          std::lock_guard lk(mu);
          errors.emplace_back(e.what());
        }
      });
      for (auto& e : errors) FAIL_CHECK(e);
      for (int o = 0; o < R; ++o) {
        // Each owner hears from every other position once, in some order; as steps (s = o - source).
        std::vector<int> steps;
        for (int src : arrivals[static_cast<std::size_t>(o)]) steps.push_back((o - src + R) % R);
        INFO("ring " << R << (causal ? " causal" : "") << ", owner " << o);
        CHECK(steps.size() == static_cast<std::size_t>(R - 1));
        reordered += std::is_sorted(steps.begin(), steps.end()) ? 0 : 1;
      }
    }
  CHECK(reordered >= 1);  // the delays did reorder arrivals: the equalities above are not vacuous
}

TEST_CASE("sequence parallel: DSP switches the sharded dimension with one all-to-all, equals one rank bitwise, and moves less than Ulysses") {
  for (int P : {1, 2, 4})
    for (bool causal : {false, true}) {
      INFO("P " << P << (causal ? " causal" : ""));
      std::mutex mu;
      std::vector<std::string> errors;
      std::vector<dsp_suite::volumes> seen;
      loom::run_threads(P, [&](loom::threads::comm& world) {
        try {
          const auto v = dsp_suite::matches_one_rank(world, causal);
          std::lock_guard lk(mu);
          seen.push_back(v);
        } catch (const dsp_suite::failure& e) {
          std::lock_guard lk(mu);
          errors.emplace_back(e.what());
        }
      });
      for (auto& e : errors) FAIL_CHECK(e);
      for (const auto& v : seen) {
        CHECK(v.ulysses == 4 * v.shard_bytes * (P > 1 ? 1 : 0));
        CHECK(v.dsp * 2 == v.ulysses);  // half of Ulysses' volume per block pair
      }
    }
}

TEST_CASE("sequence parallel: DSP refuses a dimension that does not split over its ranks") {
  loom::run_threads(4, [](loom::threads::comm& w) {
    CHECK_THROWS_WITH_AS((loom::dsp_switch<loom::threads::comm, double>(&w, 6, 8, 2)),
                         "dsp: the first sequence dimension of 6 tokens is not divisible by the 4 sequence-parallel ranks", loom::config_error);
  });
}

TEST_CASE("sequence parallel: a split that cannot work is refused with one sentence") {
  CHECK(loom::seq_split{16, 4, 1}.rule(6) == "ulysses: 6 attention heads are not divisible by the Ulysses degree 4");
  CHECK(loom::seq_split{12, 1, 4}.rule(4) ==
        "ring attention: the sequence of 12 tokens is not divisible into 8 zig-zag chunks x 1 Ulysses ranks");
  CHECK(loom::seq_split{10, 4, 1}.rule(4) == "sequence parallel: the sequence of 10 tokens is not divisible by 4 ranks");
  CHECK(loom::seq_split{16, 2, 2}.rule(4).empty());
  CHECK(loom::default_ulysses_degree(8) == 2);
  CHECK(loom::default_ulysses_degree(16) == 4);
  CHECK(loom::default_ulysses_degree(6) == 2);
  CHECK(loom::default_ulysses_degree(7) == 1);
  CHECK(loom::tp_rule(3, 4, 8) == "tensor parallel: 4 attention heads are not divisible by tp 3");
  CHECK(loom::tp_rule(2, 4, 6).empty());
  CHECK(loom::tp_rule(4, 4, 6) == "tensor parallel: 6 MLP features are not divisible by tp 4");
  auto comms = loom::threads::world(4);
  CHECK_THROWS_WITH_AS((loom::ulysses<loom::threads::comm, double>(&comms[0], 3, 2, 6, 2)),
                       "ulysses: 6 attention heads are not divisible by the Ulysses degree 4", loom::config_error);
}

TEST_CASE("tensor parallel: column- then row-parallel blocks equal the dense layers, replicated and sequence-sharded") {
  for (int tp : {1, 2, 3, 4})
    for (auto mode : {loom::tp_mode::replicated, loom::tp_mode::sequence_sharded})
      for (bool ordered : {false, true}) {
        const int N = 12, h = 5, f = 12;  // y = W2 tanh(W1 x + b1) + b2
        INFO("tp " << tp << (mode == loom::tp_mode::replicated ? " replicated" : " sequence-sharded") << (ordered ? " ordered" : ""));
        auto W1 = [&](int o, int i) { return val(11, static_cast<std::uint64_t>(o * h + i)); };
        auto W2 = [&](int o, int i) { return val(12, static_cast<std::uint64_t>(o * f + i)); };
        auto b1 = [&](int o) { return val(13, static_cast<std::uint64_t>(o)); };
        auto b2 = [&](int o) { return val(14, static_cast<std::uint64_t>(o)); };
        auto X = [&](int t, int i) { return val(15, static_cast<std::uint64_t>(t * h + i)); };
        auto DY = [&](int t, int o) { return val(16, static_cast<std::uint64_t>(t * h + o)); };
        // Dense reference: y, dx, dW1, dW2.
        std::vector<double> y(N * h), dx(N * h), gw1(f * h), gw2(h * f);
        for (int t = 0; t < N; ++t) {
          std::vector<double> act(f), dact(f);
          for (int o = 0; o < f; ++o) {
            double z = b1(o);
            for (int i = 0; i < h; ++i) z += W1(o, i) * X(t, i);
            act[static_cast<std::size_t>(o)] = std::tanh(z);
          }
          for (int o = 0; o < h; ++o) {
            double z = b2(o);
            for (int i = 0; i < f; ++i) z += W2(o, i) * act[static_cast<std::size_t>(i)];
            y[static_cast<std::size_t>(t * h + o)] = z;
          }
          for (int i = 0; i < f; ++i) {
            double s = 0;
            for (int o = 0; o < h; ++o) s += DY(t, o) * W2(o, i);
            dact[static_cast<std::size_t>(i)] = s * (1 - act[static_cast<std::size_t>(i)] * act[static_cast<std::size_t>(i)]);
          }
          for (int i = 0; i < h; ++i) {
            double s = 0;
            for (int o = 0; o < f; ++o) s += dact[static_cast<std::size_t>(o)] * W1(o, i);
            dx[static_cast<std::size_t>(t * h + i)] = s;
          }
          for (int o = 0; o < f; ++o)
            for (int i = 0; i < h; ++i) gw1[static_cast<std::size_t>(o * h + i)] += dact[static_cast<std::size_t>(o)] * X(t, i);
          for (int o = 0; o < h; ++o)
            for (int i = 0; i < f; ++i) gw2[static_cast<std::size_t>(o * f + i)] += DY(t, o) * act[static_cast<std::size_t>(i)];
        }
        std::mutex mu;
        double worst = 0;
        loom::run_threads(tp, [&](loom::threads::comm& c) {
          loom::tp_group<loom::threads::comm> g{&c, mode, ordered};
          const int r = c.rank(), fl = f / tp;
          const bool sharded = mode == loom::tp_mode::sequence_sharded && tp > 1;
          const int T = sharded ? N / tp : N, t0 = sharded ? r * T : 0;
          std::vector<double> w1(static_cast<std::size_t>(fl * h)), bb1(static_cast<std::size_t>(fl)), w2(static_cast<std::size_t>(h * fl)),
              bb2(static_cast<std::size_t>(h)), x(static_cast<std::size_t>(T * h)), dy(static_cast<std::size_t>(T * h));
          for (int o = 0; o < fl; ++o) {
            bb1[static_cast<std::size_t>(o)] = b1(r * fl + o);
            for (int i = 0; i < h; ++i) w1[static_cast<std::size_t>(o * h + i)] = W1(r * fl + o, i);
          }
          for (int o = 0; o < h; ++o) {
            bb2[static_cast<std::size_t>(o)] = b2(o);
            for (int i = 0; i < fl; ++i) w2[static_cast<std::size_t>(o * fl + i)] = W2(o, r * fl + i);
          }
          for (int t = 0; t < T; ++t)
            for (int i = 0; i < h; ++i) {
              x[static_cast<std::size_t>(t * h + i)] = X(t0 + t, i);
              dy[static_cast<std::size_t>(t * h + i)] = DY(t0 + t, i);
            }
          loom::column_parallel_linear<> col{static_cast<std::size_t>(h), static_cast<std::size_t>(fl)};
          loom::row_parallel_linear<> row{static_cast<std::size_t>(fl), static_cast<std::size_t>(h)};
          std::vector<double> xf(static_cast<std::size_t>(N * h)), u(static_cast<std::size_t>(N * fl)), part(static_cast<std::size_t>(N * h)),
              out(static_cast<std::size_t>(T * h)), dyf(static_cast<std::size_t>(N * h)), du(static_cast<std::size_t>(N * fl)),
              dxf(static_cast<std::size_t>(N * h)), dxl(static_cast<std::size_t>(T * h)), g1(w1.size()), g2(w2.size()), gb1(bb1.size());
          col.forward<loom::threads::comm, double>(g, x, xf, w1, bb1, u);
          for (auto& e : u) e = std::tanh(e);
          row.forward<loom::threads::comm, double>(g, u, w2, bb2, part, out);
          row.backward_input<loom::threads::comm, double>(g, dy, dyf, w2, du);
          for (std::size_t i = 0; i < du.size(); ++i) du[i] *= 1 - u[i] * u[i];
          col.backward_input<loom::threads::comm, double>(g, du, w1, dxf, dxl);
          col.backward_weight<double>(xf, du, g1, gb1);
          row.backward_weight<double>(u, dyf, g2);
          std::vector<double> ry, rdx, rg1, rg2, wy, wdx, wg1, wg2;
          for (int t = 0; t < T; ++t)
            for (int i = 0; i < h; ++i) {
              ry.push_back(out[static_cast<std::size_t>(t * h + i)]), wy.push_back(y[static_cast<std::size_t>((t0 + t) * h + i)]);
              rdx.push_back(dxl[static_cast<std::size_t>(t * h + i)]), wdx.push_back(dx[static_cast<std::size_t>((t0 + t) * h + i)]);
            }
          for (int o = 0; o < fl; ++o)
            for (int i = 0; i < h; ++i)
              rg1.push_back(g1[static_cast<std::size_t>(o * h + i)]), wg1.push_back(gw1[static_cast<std::size_t>((r * fl + o) * h + i)]);
          for (int o = 0; o < h; ++o)
            for (int i = 0; i < fl; ++i)
              rg2.push_back(g2[static_cast<std::size_t>(o * fl + i)]), wg2.push_back(gw2[static_cast<std::size_t>(o * f + r * fl + i)]);
          std::lock_guard lk(mu);
          worst = std::max({worst, max_rel(ry, wy), max_rel(rdx, wdx), max_rel(rg1, wg1), max_rel(rg2, wg2)});
        });
        CHECK(worst < 1e-14);
      }
}

TEST_CASE("sequence parallel: sharding_rule names the value and the rule for every kind, at run time and at compile time") {
  constexpr loom::layer_shape l{.sequence = 16, .heads = 4, .ffn = 16};
  static_assert(loom::static_sharding<l, loom::mesh<loom::pp<2>, loom::sp<4>, loom::tp<1>>, loom::sp_kind::usp>::ok);
  static_assert(loom::static_sharding<l, loom::mesh<loom::dp<2>, loom::tp<4>>, loom::sp_kind::megatron>::ok);
  static_assert(loom::sharding_rule(l, 2, 2, loom::sp_kind::ulysses).empty());
  CHECK(loom::sharding_rule(l, 2, 4, loom::sp_kind::ulysses) == "ulysses: 2 attention heads are not divisible by the Ulysses degree 4");
  CHECK(loom::sharding_rule(l, 1, 16, loom::sp_kind::ring) ==
        "ring attention: the sequence of 16 tokens is not divisible into 32 zig-zag chunks x 1 Ulysses ranks");
  CHECK(loom::sharding_rule(l, 1, 8, loom::sp_kind::usp).empty());  // ulysses 2 x ring 4
  CHECK(loom::sharding_rule(l, 1, 8, loom::sp_kind::usp, 3) == "usp: the Ulysses degree 3 does not divide sp 8");
  CHECK(loom::sharding_rule({.sequence = 10, .heads = 4, .ffn = 16}, 4, 1, loom::sp_kind::megatron) ==
        "megatron sequence parallel: the sequence of 10 tokens is not divisible by tp 4");
  CHECK(loom::sharding_rule(l, 0, 1, loom::sp_kind::ring) == "tensor parallel: tp 0 is not a positive number of ranks");
  CHECK(loom::sharding_rule(l, 1, 0, loom::sp_kind::ring) == "sequence parallel: sp 0 is not a positive number of ranks");
}

namespace {
//! A user's kernel: the default arithmetic, scaled by 2, counting its calls (stands in for a
//! BLAS or CUDA kernel the blocks do not know).
struct doubling_kernel {
  static inline std::atomic<int> calls{0};
  template <class T>
  static void forward(std::span<const T> x, std::span<const T> w, std::span<const T> b, std::span<T> y, std::size_t n,
                      std::size_t in, std::size_t out) {
    ++calls;
    loom::linear_kernel::forward(x, w, b, y, n, in, out);
    for (auto& v : y) v *= 2;
  }
  template <class T>
  static void backward_input(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n, std::size_t in,
                             std::size_t out) {
    ++calls;
    loom::linear_kernel::backward_input(dy, w, dx, n, in, out);
  }
};
}  // namespace

TEST_CASE("tensor parallel: a user's kernel takes the place of the default one inside the blocks") {
  loom::run_threads(2, [](loom::threads::comm& c) {
    loom::tp_group<loom::threads::comm> g{&c, loom::tp_mode::replicated, true};
    // Row-parallel: each rank holds one input feature of 2; y = 2 * (x0 w0 + x1 w1) summed over ranks.
    loom::row_parallel_linear<doubling_kernel> row{1, 1};
    std::vector<double> x{c.rank() == 0 ? 3.0 : 5.0}, w{c.rank() == 0 ? 7.0 : 11.0}, b{1.0}, part(1), y(1);
    row.forward<loom::threads::comm, double>(g, x, w, b, part, y);
    CHECK(y[0] == 2 * 3.0 * 7.0 + 2 * 5.0 * 11.0 + 1.0);
    std::vector<double> dy{1.0}, dyf(1), dx(1);
    row.backward_input<loom::threads::comm, double>(g, dy, dyf, w, dx);
    CHECK(dx[0] == w[0]);
  });
  CHECK(doubling_kernel::calls == 4);
}
