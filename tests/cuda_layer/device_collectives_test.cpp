// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Collectives over device memory on both device communicators (cuda_local: copies and loom's
// reduction kernel; nccl: NCCL's collectives), stream-ordered, and their sub-groups by split:
// results bitwise equal to the threads backend's (both reduce in rank order), under 20 seeds of
// the simulator's random order and delays with the race detector failing the run; a collective
// not ordered after its producer is a race naming both operations; a mesh binds to a device world
// with the same per-dimension counters as on threads; Megatron's tensor-parallel operators, written
// once over a group, run on a device group bound to a stream with the threads backend's results.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <loom/comm/counting.hpp>
#include <loom/comm/threads.hpp>
#include <loom/exec/tensor_parallel.hpp>
#include <loom/mesh/mesh_comm.hpp>

#include "device_support.hpp"

static_assert(loom::device_collective_communicator<loom::cuda_local::comm>);
static_assert(loom::device_collective_communicator<loom::nccl::comm>);
// A mesh's groups on a device world are counted device communicators: the pipeline runs on them.
static_assert(loom::device_collective_communicator<loom::counted<loom::cuda_local::comm>>);
static_assert(loom::device_collective_communicator<loom::counted<loom::nccl::comm>>);
static_assert(loom::reduces_in_rank_order<loom::counted<loom::cuda_local::comm>>);

namespace {

using loom::reduce_op;
using loom_device_test::backend;
using loom_device_test::download;
using loom_device_test::upload;

//! Element i of rank r's contribution: values whose sums round, so the order shows in the bits.
template <class T>
T value(int r, std::size_t i) {
  return static_cast<T>(std::sin(1.0 + 7.3 * r + 0.37 * static_cast<double>(i)) * (1.0 + r) / 3.0);
}

//! What every rank of an `n`-rank group ends with after one of each collective, per rank.
template <class T>
struct results {
  std::vector<std::vector<T>> sum, max, gathered, scattered, exchanged, broadcast, reduced;
  friend bool operator==(const results&, const results&) = default;
};

constexpr std::size_t count = 37;  // elements per rank: not a multiple of the group sizes

//! One of each collective on `c`, through `xfer(in_host) -> device span` and `back(span) ->
//! host` helpers that the backend supplies (host memory on threads, device memory on a GPU).
template <class T, class Run>
void one_of_each(int rank, int n, results<T>& out, std::mutex& m, Run&& run) {
  std::vector<T> mine(count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value<T>(rank, i);
  auto r = run(mine);
  std::lock_guard lk(m);
  const auto k = static_cast<std::size_t>(rank);
  out.sum[k] = r.sum[0];
  out.max[k] = r.max[0];
  out.gathered[k] = r.gathered[0];
  out.scattered[k] = r.scattered[0];
  out.exchanged[k] = r.exchanged[0];
  out.broadcast[k] = r.broadcast[0];
  out.reduced[k] = r.reduced[0];
}

template <class T>
results<T> sized(int n) {
  results<T> r;
  for (auto* v : {&r.sum, &r.max, &r.gathered, &r.scattered, &r.exchanged, &r.broadcast, &r.reduced}) v->resize(static_cast<std::size_t>(n));
  return r;
}

//! The threads backend's results (the reference: rank-ordered reductions).
template <class T>
results<T> on_threads(int n) {
  auto out = sized<T>(n);
  std::mutex m;
  loom::run_threads(n, [&](loom::threads::comm& c) {
    one_of_each<T>(c.rank(), n, out, m, [&](const std::vector<T>& mine) {
      results<T> r = sized<T>(1);
      r.sum[0] = mine;
      c.all_reduce(std::span<T>(r.sum[0]), reduce_op::sum);
      r.max[0] = mine;
      c.all_reduce(std::span<T>(r.max[0]), reduce_op::max);
      r.gathered[0].resize(mine.size() * static_cast<std::size_t>(n));
      c.all_gather(std::span<const T>(mine), std::span<T>(r.gathered[0]));
      r.scattered[0].resize(count);
      c.reduce_scatter(std::span<const T>(mine), std::span<T>(r.scattered[0]), reduce_op::sum);
      r.exchanged[0].resize(mine.size());
      c.all_to_all(std::span<const T>(mine), std::span<T>(r.exchanged[0]));
      // Broadcast from the last rank, as a gather's slice of it.
      r.broadcast[0].assign(r.gathered[0].end() - static_cast<std::ptrdiff_t>(mine.size()), r.gathered[0].end());
      // Reduce (sum) to rank 1 of n >= 2: its buffer holds the rank-ordered sum, the others' their own.
      r.reduced[0] = mine;
      c.reduce(std::span<T>(r.reduced[0]), 1, reduce_op::sum);
      return r;
    });
  });
  return out;
}

//! A group split from a device world, counted, bound to a stream of its own (not movable: the
//! binding points at the group).
template <class W>
struct bound_group {
  using comm = loom::counted<W>;
  comm c;
  loom::cuda::stream st;
  loom::on_stream<comm> on{c, st.get()};
  explicit bound_group(W& w) : c(w.split(0, w.rank())) {}
  bound_group(const bound_group&) = delete;
  bound_group& operator=(const bound_group&) = delete;
};

//! One of each collective on a device communicator, every buffer written by a copy on the
//! rank's stream just before the collective (so a collective that did not follow the stream
//! would read stale bytes, and race).
template <class T, class C>
results<T> device_one_of_each(C& c, const std::vector<T>& mine) {
  const int n = c.size();
  loom::cuda::stream stream;
  cudaStream_t st = stream.get();
  results<T> r = sized<T>(1);
  const std::size_t all = mine.size();
  {
    auto d = upload(mine, st);
    c.all_reduce(d.span(), reduce_op::sum, st);
    r.sum[0] = download(d, st);
    upload(d.span(), mine, st);
    c.all_reduce(d.span(), reduce_op::max, st);
    r.max[0] = download(d, st);
  }
  {
    auto in = upload(mine, st);
    loom::cuda::device_buffer<T> out(all * static_cast<std::size_t>(n));
    c.all_gather(std::span<const T>(in.span()), out.span(), st);
    r.gathered[0] = download(out, st);
    c.reduce_scatter(std::span<const T>(in.span()), out.span().first(count), reduce_op::sum, st);
    r.scattered[0] = download(out, st, count);
    c.all_to_all(std::span<const T>(in.span()), out.span().first(all), st);
    r.exchanged[0] = download(out, st, all);
    c.broadcast(in.span(), n - 1, st);
    r.broadcast[0] = download(in, st);
    upload(in.span(), mine, st);
    c.reduce(in.span(), 1, reduce_op::sum, st);
    r.reduced[0] = download(in, st);
  }
  return r;
}

template <class T>
results<T> on_device(backend b, int n) {
  auto out = sized<T>(n);
  std::mutex m;
  auto body = [&](auto& c) {
    one_of_each<T>(c.rank(), n, out, m, [&](const std::vector<T>& mine) { return device_one_of_each<T>(c, mine); });
  };
  loom_device_test::run_on(b, n, body);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("device collectives equal the threads backend's bit for bit, under 20 seeds, race detector on", T, float, double) {
  for (backend b : {backend::cuda_local, backend::nccl})
    for (int n : {2, 3, 4}) {
      CAPTURE(loom_device_test::name(b));
      CAPTURE(n);
      if (loom_device_test::skip_unless_devices(b, n)) continue;
      const auto want = on_threads<T>(n);
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        CAPTURE(seed);
        loom_device_test::simulate_with(seed);
        const auto got = on_device<T>(b, n);
        CHECK(got.sum == want.sum);
        CHECK(got.max == want.max);
        CHECK(got.gathered == want.gathered);
        CHECK(got.scattered == want.scattered);
        CHECK(got.exchanged == want.exchanged);
        CHECK(got.broadcast == want.broadcast);
        CHECK(got.reduced == want.reduced);
        CHECK(loom_device_test::findings() == "");
      }
    }
}

#if defined(LOOM_CUDA_SIM)
TEST_CASE("a device collective not ordered after its producer is a race naming both operations") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    loom::cudasim::config cfg;
    cfg.seed = 3;
    cfg.races = loom::cudasim::race_policy::record;
    loom::cudasim::configure(cfg);
    auto body = [&](auto& c) {
      // The producer writes on one stream; the all-reduce runs on another that does not wait.
      loom::cuda::stream producer, comm_stream;
      loom::cuda::name_stream(producer.get(), "r" + std::to_string(c.rank()) + " producer");
      std::vector<float> h(64, 1.0f);
      auto d = upload(h, producer.get());
      c.all_reduce(d.span(), reduce_op::sum, comm_stream.get());
      LOOM_CUDA_TRY(cudaStreamSynchronize(comm_stream.get()));
      LOOM_CUDA_TRY(cudaStreamSynchronize(producer.get()));
      c.all_reduce(std::span<std::int64_t>(), reduce_op::sum);  // both ranks are done before the buffers go
    };
    loom_device_test::run_on(b, 2, body);
    const auto all = loom_device_test::findings();
    CAPTURE(all);
    CHECK(all.find("race: ") != std::string::npos);
    CHECK(all.find("producer") != std::string::npos);
    CHECK(all.find(b == backend::cuda_local ? "cuda_local all_reduce" : "ncclAllReduce") != std::string::npos);
  }
  loom_device_test::simulate_with(1);
}
#endif

TEST_CASE("a mesh binds to a device world: its groups reduce on the device, counted as on threads") {
  using mesh = loom::mesh<loom::dp<2>, loom::tp<2>>;
  // The same program on threads (host buffers) and on each device communicator (device buffers):
  // an all-reduce over tp, an all-gather over dp, a reduce-scatter over the world.
  struct counts {
    std::vector<loom::comm_counters> tp, dp, world;
  };
  auto host = counts{std::vector<loom::comm_counters>(4), std::vector<loom::comm_counters>(4), std::vector<loom::comm_counters>(4)};
  std::vector<std::vector<float>> host_tp(4), host_dp(4), host_world(4);
  loom::run_threads(4, [&](loom::threads::comm& w) {
    loom::mesh_comm g(mesh{}, w);
    const auto r = static_cast<std::size_t>(g.rank());
    std::vector<float> x(8);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = value<float>(g.rank(), i);
    g.tp().all_reduce(std::span<float>(x), reduce_op::sum);
    std::vector<float> y(16);
    g.dp().all_gather(std::span<const float>(x), std::span<float>(y));
    std::vector<float> z(4);
    g.world().reduce_scatter(std::span<const float>(y), std::span<float>(z), reduce_op::sum);
    host_tp[r] = x;
    host_dp[r] = y;
    host_world[r] = z;
    host.tp[r] = g.tp().counters();
    host.dp[r] = g.dp().counters();
    host.world[r] = g.world().counters();
  });
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    if (loom_device_test::skip_unless_devices(b, 4)) continue;
    loom_device_test::simulate_with(7);
    counts dev{std::vector<loom::comm_counters>(4), std::vector<loom::comm_counters>(4), std::vector<loom::comm_counters>(4)};
    std::vector<std::vector<float>> dev_tp(4), dev_dp(4), dev_world(4);
    auto body = [&](auto& w) {
      loom::mesh_comm g(mesh{}, w);
      const auto r = static_cast<std::size_t>(g.rank());
      loom::cuda::stream stream;
      cudaStream_t st = stream.get();
      std::vector<float> x(8);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = value<float>(g.rank(), i);
      auto dx = upload(x, st);
      loom::cuda::device_buffer<float> dy(16), dz(4);
      g.tp().all_reduce(dx.span(), reduce_op::sum, st);
      g.dp().all_gather(std::span<const float>(dx.span()), dy.span(), st);
      g.world().reduce_scatter(std::span<const float>(dy.span()), dz.span(), reduce_op::sum, st);
      dev_tp[r] = download(dx, st);
      dev_dp[r] = download(dy, st);
      dev_world[r] = download(dz, st);
      dev.tp[r] = g.tp().counters();
      dev.dp[r] = g.dp().counters();
      dev.world[r] = g.world().counters();
    };
    loom_device_test::run_on(b, 4, body);
    CHECK(dev_tp == host_tp);
    CHECK(dev_dp == host_dp);
    CHECK(dev_world == host_world);
    CHECK(dev.tp == host.tp);
    CHECK(dev.dp == host.dp);
    CHECK(dev.world == host.world);
    CHECK(loom_device_test::findings() == "");
  }
}

namespace {

//! Megatron's four operators (enter/exit, forward/backward) in `mode` on a tp group: what each
//! rank ends with, in order, as one vector.
template <class G>
void tp_operators(loom::tp_group<G>& g, std::span<float> x, std::span<float> full, std::span<float> part) {
  const std::size_t tokens_full = full.size();
  loom::tp_enter_forward(g, std::span<const float>(x), full);                        // f / all-gather
  loom::tp_exit_forward(g, full, x);                                                 // g / reduce-scatter
  loom::tp_exit_backward(g, std::span<const float>(x), part.first(tokens_full));     // identity / all-gather
  loom::tp_enter_backward(g, part.first(tokens_full), x);                            // all-reduce / reduce-scatter
}

}  // namespace

TEST_CASE("Megatron's tensor-parallel operators run unchanged on a device group bound to a stream") {
  for (bool ordered : {false, true})
  for (auto mode : {loom::tp_mode::replicated, loom::tp_mode::sequence_sharded})
    for (int n : {2, 4}) {
      CAPTURE(ordered);
      CAPTURE(static_cast<int>(mode));
      CAPTURE(n);
      const std::size_t local = 12, full_n = mode == loom::tp_mode::replicated ? local : local * static_cast<std::size_t>(n);
      auto input = [&](int r) {
        std::vector<float> x(local);
        for (std::size_t i = 0; i < local; ++i) x[i] = value<float>(r, i);
        return x;
      };
      std::vector<std::vector<float>> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
      std::vector<loom::comm_counters> want_counts(static_cast<std::size_t>(n)), got_counts(static_cast<std::size_t>(n));
      loom::run_threads(n, [&](loom::threads::comm& w) {
        loom::counted<loom::threads::comm> c(w.split(0, w.rank()));
        loom::tp_group<loom::counted<loom::threads::comm>> g{&c, mode, ordered};
        auto x = input(c.rank());
        std::vector<float> full(full_n), part(full_n);
        tp_operators(g, std::span<float>(x), std::span<float>(full), std::span<float>(part));
        want[static_cast<std::size_t>(c.rank())] = x;
        want_counts[static_cast<std::size_t>(c.rank())] = c.counters();
      });
      for (backend b : {backend::cuda_local, backend::nccl}) {
        CAPTURE(loom_device_test::name(b));
        if (loom_device_test::skip_unless_devices(b, n)) continue;
        for (std::uint64_t seed = 1; seed <= 20; ++seed) {
          CAPTURE(seed);
          loom_device_test::simulate_with(seed);
          auto body = [&](auto& w) {
            bound_group<std::remove_cvref_t<decltype(w)>> b(w);
            loom::tp_group<std::remove_reference_t<decltype(b.on)>> g{&b.on, mode, ordered};
            const auto r = static_cast<std::size_t>(b.c.rank());
            const auto host_x = input(b.c.rank());  // alive until the copy ran (downloads synchronise)
            auto x = upload(host_x, b.st.get());
            loom::cuda::device_buffer<float> full(full_n), part(full_n);
            tp_operators(g, x.span(), full.span(), part.span());
            got[r] = download(x, b.st.get());
            got_counts[r] = b.c.counters();
          };
          loom_device_test::run_on(b, n, body);
          CHECK(got == want);
          // Ordered sums on nccl (no order promised) over more than 2 ranks are an all-to-all and an
          // all-gather where the rank-ordered threads backend all-reduces: the same bytes.
          if (!ordered || b == backend::cuda_local || n <= 2) CHECK(got_counts == want_counts);
          CHECK(loom_device_test::findings() == "");
        }
      }
    }
}

TEST_CASE("a rank that throws inside a tensor-parallel region ends every rank within seconds, naming it and the cause") {
  const int n = 4;
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    if (loom_device_test::skip_unless_devices(b, n)) continue;
    loom_device_test::simulate_with(5);
    std::mutex mu;
    std::vector<std::string> seen(n);
    std::string thrown;
    const auto t0 = std::chrono::steady_clock::now();
    auto body = [&](auto& w) {
      bound_group<std::remove_cvref_t<decltype(w)>> b(w);
      auto& c = b.c;
      loom::tp_group<std::remove_reference_t<decltype(b.on)>> g{&b.on, loom::tp_mode::sequence_sharded, false};
      std::vector<float> h(8, 1.0f);
      auto x = upload(h, b.st.get());
      loom::cuda::device_buffer<float> full(8 * static_cast<std::size_t>(n));
      try {
        loom::tp_enter_forward(g, std::span<const float>(x.span()), full.span());
        if (c.rank() == 1) {  // inside the region; its own buffers go only after the all-gather ran
          LOOM_CUDA_TRY(cudaStreamSynchronize(b.st.get()));
          throw std::runtime_error("the attention kernel of rank 1 failed");
        }
        loom::tp_exit_forward(g, full.span(), x.span());
        c.synchronize(b.st.get());  // bounded: ends with the failure of any rank
      } catch (const loom::comm_error& e) {
        std::lock_guard lk(mu);
        seen[static_cast<std::size_t>(c.rank())] = e.what();
      }
      // Rank 1's exception left its function: the world was aborted.
    };
    try {
      loom_device_test::run_on(b, n, body);
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(thrown.find("rank 1 failed") != std::string::npos);
    for (int r = 0; r < n; ++r) {
      if (r == 1) continue;
      CAPTURE(r);
      CAPTURE(seen[static_cast<std::size_t>(r)]);
      CHECK(seen[static_cast<std::size_t>(r)].find("rank 1") != std::string::npos);
      CHECK(seen[static_cast<std::size_t>(r)].find("the attention kernel of rank 1 failed") != std::string::npos);
    }
    CHECK(seconds < 10.0);
  }
  loom_device_test::simulate_with(1);
}
