// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom's CUDA simulator on raw NCCL calls: ranks as threads, communicators (blocking and not),
// split, point-to-point in per-peer FIFO order, collectives in rank order, mismatches, abort and
// asynchronous errors.
#include <doctest/doctest.h>

#include <barrier>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <loom/cuda.hpp>
#include <loom/cudasim/sim.hpp>

namespace sim = loom::cudasim;

namespace {

void fresh(std::uint64_t seed, int deadlock_ms = 3000) {
  sim::config c;
  c.seed = seed;
  c.races = sim::race_policy::record;
  c.deadlock_after = std::chrono::milliseconds(deadlock_ms);
  sim::configure(c);
}

//! Runs `body(rank, comm, stream)` on `n` threads, rank r on device r, one communicator.
void on_ranks(int n, const std::function<void(int, ncclComm_t, cudaStream_t)>& body, bool destroy = true, bool blocking = true) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      LOOM_CUDA_TRY(cudaSetDevice(r));
      ncclComm_t c = nullptr;
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = blocking ? 1 : 0;
      LOOM_NCCL_TRY(ncclCommInitRankConfig(&c, n, id, r, &cfg));
      ncclResult_t st = ncclInProgress;
      while (st == ncclInProgress) LOOM_NCCL_TRY(ncclCommGetAsyncError(c, &st));
      REQUIRE(st == ncclSuccess);
      loom::cuda::stream s;
      body(r, c, s.get());
      s.synchronize();
      if (destroy) LOOM_NCCL_TRY(ncclCommDestroy(c));  // (an aborted communicator is gone already)
    });
  for (auto& t : ts) t.join();
}

}  // namespace

TEST_CASE("collectives over four ranks give rank-order results on every rank") {
  for (std::uint64_t seed : {1, 2, 3}) {
    fresh(seed);
    std::vector<std::vector<double>> sums(4), gathered(4), scattered(4), a2a(4), bcast(4);
    on_ranks(4, [&](int r, ncclComm_t c, cudaStream_t s) {
      const auto ur = static_cast<std::size_t>(r);
      loom::cuda::device_buffer<double> in(8), out(8), g(32), rs(2), all(8), b(8);
      std::vector<double> h(8);
      for (int i = 0; i < 8; ++i) h[static_cast<std::size_t>(i)] = 0.1 * (r + 1) + i;
      loom::cuda::copy_to_device(in.span(), std::span<const double>(h));
      LOOM_NCCL_TRY(ncclAllReduce(in.data(), out.data(), 8, ncclFloat64, ncclSum, c, s));
      LOOM_NCCL_TRY(ncclAllGather(in.data(), g.data(), 8, ncclFloat64, c, s));
      LOOM_NCCL_TRY(ncclReduceScatter(in.data(), rs.data(), 2, ncclFloat64, ncclSum, c, s));
      LOOM_NCCL_TRY(ncclGroupStart());
      LOOM_NCCL_TRY(ncclAlltoAll(in.data(), all.data(), 2, ncclFloat64, c, s));
      LOOM_NCCL_TRY(ncclBroadcast(in.data(), b.data(), 8, ncclFloat64, 2, c, s));
      LOOM_NCCL_TRY(ncclGroupEnd());
      LOOM_CUDA_TRY(cudaStreamSynchronize(s));
      sums[ur].resize(8);
      gathered[ur].resize(32);
      scattered[ur].resize(2);
      a2a[ur].resize(8);
      bcast[ur].resize(8);
      loom::cuda::copy_to_host(std::span<double>(sums[ur]), std::span<const double>(out.span()));
      loom::cuda::copy_to_host(std::span<double>(gathered[ur]), std::span<const double>(g.span()));
      loom::cuda::copy_to_host(std::span<double>(scattered[ur]), std::span<const double>(rs.span()));
      loom::cuda::copy_to_host(std::span<double>(a2a[ur]), std::span<const double>(all.span()));
      loom::cuda::copy_to_host(std::span<double>(bcast[ur]), std::span<const double>(b.span()));
    });
    auto val = [](int r, int i) { return 0.1 * (r + 1) + i; };
    for (int r = 0; r < 4; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      for (int i = 0; i < 8; ++i) {
        const auto ui = static_cast<std::size_t>(i);
        double want = ((val(0, i) + val(1, i)) + val(2, i)) + val(3, i);  // rank order
        CHECK(std::memcmp(&sums[ur][ui], &want, sizeof want) == 0);
        CHECK(bcast[ur][ui] == val(2, i));
      }
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < 8; ++i) CHECK(gathered[ur][static_cast<std::size_t>(k * 8 + i)] == val(k, i));
      for (int i = 0; i < 2; ++i) CHECK(scattered[ur][static_cast<std::size_t>(i)] == ((val(0, 2 * r + i) + val(1, 2 * r + i)) + val(2, 2 * r + i)) + val(3, 2 * r + i));
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < 2; ++i) CHECK(a2a[ur][static_cast<std::size_t>(k * 2 + i)] == val(k, 2 * r + i));
    }
    CHECK(sim::reports().empty());
  }
}

TEST_CASE("sends and receives are matched per peer in FIFO order, grouped or not") {
  fresh(7);
  std::vector<std::vector<float>> got(3);
  on_ranks(3, [&](int r, ncclComm_t c, cudaStream_t s) {
    const int next = (r + 1) % 3, prev = (r + 2) % 3;
    loom::cuda::device_buffer<float> a(4), b(4), x(4), y(4);
    std::vector<float> ha(4, static_cast<float>(10 * r + 1)), hb(4, static_cast<float>(10 * r + 2));
    loom::cuda::copy_to_device(a.span(), std::span<const float>(ha));
    loom::cuda::copy_to_device(b.span(), std::span<const float>(hb));
    LOOM_NCCL_TRY(ncclGroupStart());
    LOOM_NCCL_TRY(ncclSend(a.data(), 4, ncclFloat32, next, c, s));
    LOOM_NCCL_TRY(ncclRecv(x.data(), 4, ncclFloat32, prev, c, s));
    LOOM_NCCL_TRY(ncclGroupEnd());
    LOOM_NCCL_TRY(ncclGroupStart());
    LOOM_NCCL_TRY(ncclSend(b.data(), 4, ncclFloat32, next, c, s));
    LOOM_NCCL_TRY(ncclRecv(y.data(), 4, ncclFloat32, prev, c, s));
    LOOM_NCCL_TRY(ncclGroupEnd());
    LOOM_CUDA_TRY(cudaStreamSynchronize(s));
    got[static_cast<std::size_t>(r)].resize(8);
    loom::cuda::copy_to_host(std::span<float>(got[static_cast<std::size_t>(r)]).first(4), std::span<const float>(x.span()));
    loom::cuda::copy_to_host(std::span<float>(got[static_cast<std::size_t>(r)]).last(4), std::span<const float>(y.span()));
  });
  for (int r = 0; r < 3; ++r) {
    const int prev = (r + 2) % 3;
    CHECK(got[static_cast<std::size_t>(r)][0] == static_cast<float>(10 * prev + 1));
    CHECK(got[static_cast<std::size_t>(r)][4] == static_cast<float>(10 * prev + 2));
  }
}

TEST_CASE("a send and a receive of different sizes are reported naming both and fail the communicators") {
  fresh(1, 400);
  on_ranks(2, [&](int r, ncclComm_t c, cudaStream_t s) {
    loom::cuda::device_buffer<float> a(8);
    if (r == 0) LOOM_NCCL_TRY(ncclSend(a.data(), 8, ncclFloat32, 1, c, s));
    else LOOM_NCCL_TRY(ncclRecv(a.data(), 4, ncclFloat32, 0, c, s));
    ncclResult_t st = ncclSuccess;
    for (int i = 0; i < 2000 && st == ncclSuccess; ++i) {
      LOOM_NCCL_TRY(ncclCommGetAsyncError(c, &st));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(st == ncclInvalidUsage);
    LOOM_NCCL_TRY(ncclCommAbort(c));
  }, false);
  bool found = false;
  for (auto& rep : sim::reports())
    if (rep.kind == sim::report_kind::nccl && rep.text.find("ncclSend of 32 bytes by rank 0") != std::string::npos &&
        rep.text.find("ncclRecv of 16 bytes on rank 1") != std::string::npos)
      found = true;
  CHECK(found);
}

TEST_CASE("ncclCommSplit makes sub-communicators ordered by key, and NOCOLOR ranks get none") {
  fresh(2);
  std::vector<int> sizes(4, -1), ranks(4, -1);
  std::vector<double> sums(4, 0);
  on_ranks(4, [&](int r, ncclComm_t c, cudaStream_t s) {
    ncclComm_t sub = nullptr;
    const int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
    LOOM_NCCL_TRY(ncclCommSplit(c, color, -r, &sub, nullptr));
    if (sub == nullptr) return;
    LOOM_NCCL_TRY(ncclCommCount(sub, &sizes[static_cast<std::size_t>(r)]));
    LOOM_NCCL_TRY(ncclCommUserRank(sub, &ranks[static_cast<std::size_t>(r)]));
    loom::cuda::device_buffer<double> x(1);
    double v = r;
    loom::cuda::copy_to_device(x.span(), std::span<const double>(&v, 1));
    LOOM_NCCL_TRY(ncclAllReduce(x.data(), x.data(), 1, ncclFloat64, ncclSum, sub, s));
    LOOM_CUDA_TRY(cudaStreamSynchronize(s));
    loom::cuda::copy_to_host(std::span<double>(&sums[static_cast<std::size_t>(r)], 1), std::span<const double>(x.span()));
    LOOM_NCCL_TRY(ncclCommDestroy(sub));
  });
  CHECK(sizes == std::vector<int>{2, 1, 2, -1});
  CHECK(ranks == std::vector<int>{1, 0, 0, -1});  // key -r: rank 2 before rank 0
  CHECK(sums == std::vector<double>{2, 1, 2, 0});
  CHECK(sim::reports().empty());
}

TEST_CASE("an injected asynchronous NCCL error is reported by ncclCommGetAsyncError and abort ends the stuck work") {
  fresh(3, 5000);
  on_ranks(2, [&](int r, ncclComm_t c, cudaStream_t s) {
    if (r == 0) sim::fail_nccl_after(c, 0, ncclRemoteError);
    loom::cuda::device_buffer<float> a(4);
    LOOM_NCCL_TRY(ncclAllReduce(a.data(), a.data(), 4, ncclFloat32, ncclSum, c, s));
    ncclResult_t st = ncclSuccess;
    if (r == 0) {
      LOOM_NCCL_TRY(ncclCommGetAsyncError(c, &st));
      CHECK(st == ncclRemoteError);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);  // the collective cannot finish
    LOOM_NCCL_TRY(ncclCommAbort(c));
  }, false);
}

TEST_CASE("two ranks of one communicator on the same device are refused, as NCCL does") {
  fresh(1);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclResult_t> res(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      LOOM_CUDA_TRY(cudaSetDevice(0));
      ncclComm_t c = nullptr;
      res[static_cast<std::size_t>(r)] = ncclCommInitRank(&c, 2, id, r);
      if (c != nullptr) (void)ncclCommAbort(c);
    });
  for (auto& t : ts) t.join();
  CHECK(res[0] == ncclInvalidUsage);
  CHECK(res[1] == ncclInvalidUsage);
}

TEST_CASE("NCCL calls captured into a graph are matched anew on every replay") {
  fresh(4);
  std::vector<std::vector<float>> got(2);
  // The copies to and from the host run on the legacy default stream, which would join a rank's
  // stream while that one is being captured (an error, as in CUDA): no rank copies while another
  // captures.
  std::barrier captures(2);
  on_ranks(2, [&](int r, ncclComm_t c, cudaStream_t s) {
    loom::cuda::device_buffer<float> a(2), b(2);
    std::vector<float> h{static_cast<float>(r + 1), 1.f};
    loom::cuda::copy_to_device(a.span(), std::span<const float>(h));
    loom::cuda::stream_ref sr(s);
    captures.arrive_and_wait();
    auto g = loom::cuda::capture(sr, [&] {
      LOOM_NCCL_TRY(ncclAllReduce(a.data(), b.data(), 2, ncclFloat32, ncclSum, c, s));
      LOOM_CUDA_TRY(cudaMemcpyAsync(a.data(), b.data(), 8, cudaMemcpyDeviceToDevice, s));
    });
    captures.arrive_and_wait();
    loom::cuda::graph_exec x(g);
    for (int i = 0; i < 3; ++i) x.launch(sr);
    sr.synchronize();
    got[static_cast<std::size_t>(r)].resize(2);
    loom::cuda::copy_to_host(std::span<float>(got[static_cast<std::size_t>(r)]), std::span<const float>(a.span()));
  });
  // a = (1+2, 1+1) = (3, 2), then (6, 4), then (12, 8)
  for (auto& g : got) CHECK(g == std::vector<float>{12, 8});
  CHECK(sim::reports().empty());
}
