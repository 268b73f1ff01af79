// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom's CUDA simulator on raw CUDA runtime calls: stream order, events, copies, host functions,
// capture and graphs, and the findings that make it stricter than CUDA (races, capture rules,
// use after free, deadlocks, memory accounting).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>  // the driver API's types for the stream memory operations

#include <loom/cuda.hpp>
#include <loom/cudasim/sim.hpp>

namespace sim = loom::cudasim;
using loom::cuda::byte_access;

namespace {

//! A fresh simulator configuration with seed `seed` (races recorded, not failed, unless asked).
void fresh(std::uint64_t seed, sim::race_policy p = sim::race_policy::record, int deadlock_ms = 3000) {
  sim::config c;
  c.seed = seed;
  c.races = p;
  c.deadlock_after = std::chrono::milliseconds(deadlock_ms);
  sim::configure(c);
}

std::vector<sim::report> of_kind(sim::report_kind k) {
  std::vector<sim::report> out;
  for (auto& r : sim::reports())
    if (r.kind == k) out.push_back(r);
  return out;
}

//! out[i] = in[i] * 2 as a kernel in a region that declares its accesses.
void doubler(cudaStream_t s, const float* in, float* out, std::size_t n, const char* label) {
  byte_access acc[] = {{in, n * sizeof(float), false}, {out, n * sizeof(float), true}};
  loom::cuda::region r(s, label, acc);
  sim::launch(s, label, [=] {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] * 2;
  });
}

}  // namespace

TEST_CASE("operations on one stream run in order and copies move the data") {
  fresh(1);
  loom::cuda::stream s;
  loom::cuda::device_buffer<float> a(64), b(64);
  std::vector<float> host(64), back(64, -1);
  std::iota(host.begin(), host.end(), 0.f);
  LOOM_CUDA_TRY(cudaMemcpyAsync(a.data(), host.data(), a.bytes(), cudaMemcpyHostToDevice, s.get()));
  doubler(s.get(), a.data(), b.data(), 64, "double");
  doubler(s.get(), b.data(), a.data(), 64, "double again");
  LOOM_CUDA_TRY(cudaMemcpyAsync(back.data(), a.data(), a.bytes(), cudaMemcpyDeviceToHost, s.get()));
  s.synchronize();
  for (int i = 0; i < 64; ++i) CHECK(back[static_cast<std::size_t>(i)] == 4.f * static_cast<float>(i));
  CHECK(sim::reports().empty());
}

TEST_CASE("regions nest: a kernel's own region inside a stage call's names its operations, then the call's region resumes") {
  fresh(3);
  loom::cuda::stream producer, consumer;
  loom::cuda::device_buffer<float> a(16), b(16), c(16), d(16);
  LOOM_CUDA_TRY(cudaMemsetAsync(a.data(), 0, a.bytes(), producer.get()));
  LOOM_CUDA_TRY(cudaMemsetAsync(c.data(), 0, c.bytes(), producer.get()));
  producer.synchronize();
  {
    byte_access call[] = {{a.data(), a.bytes(), false}, {b.data(), b.bytes(), true}, {d.data(), d.bytes(), true}};
    loom::cuda::region outer(producer.get(), "stage call", call);
    doubler(producer.get(), a.data(), b.data(), 16, "inner kernel");  // its own region, inside the call's
    sim::launch(producer.get(), "after the inner region", [p = d.data()] {
      for (int i = 0; i < 16; ++i) p[i] = 1;
    });
  }
  doubler(consumer.get(), b.data(), c.data(), 16, "reads b");  // unordered with the inner kernel
  byte_access rd[] = {{d.data(), d.bytes(), false}};
  {
    loom::cuda::region r(consumer.get(), "reads d", rd);
    sim::launch(consumer.get(), "reads d", [p = d.data()] { (void)p; });
  }
  producer.synchronize();
  consumer.synchronize();
  CHECK(of_kind(sim::report_kind::api).empty());  // nesting is not an error
  const auto races = of_kind(sim::report_kind::race);
  std::string all;
  for (auto& r : races) all += r.text + "\n";
  CAPTURE(all);
  CHECK(all.find("race: inner kernel on stream") != std::string::npos);  // named by the inner region
  bool call_resumed = false;  // d is written after the inner region closed: the call's region names it
  for (auto& r : races) call_resumed = call_resumed || (r.text.find("race: stage call on stream") == 0 && r.text.find("and reads d on stream") != std::string::npos);
  CHECK(call_resumed);
}

TEST_CASE("the race detector names both operations of an unordered pair, on every seed, and an event silences it") {
  std::string first_text;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    fresh(seed);
    loom::cuda::stream producer, consumer;
    loom::cuda::name_stream(producer.get(), "producer");
    loom::cuda::name_stream(consumer.get(), "consumer");
    loom::cuda::device_buffer<float> a(16), b(16), c(16);
    loom::cuda::name_memory(b.data(), "b");
    LOOM_CUDA_TRY(cudaMemset(a.data(), 0, a.bytes()));
    doubler(producer.get(), a.data(), b.data(), 16, "write b");
    doubler(consumer.get(), b.data(), c.data(), 16, "read b");  // no event: a race
    producer.synchronize();
    consumer.synchronize();
    auto races = of_kind(sim::report_kind::race);
    REQUIRE(races.size() == 1);
    CHECK(races[0].text.find("write b on stream 'producer'") != std::string::npos);
    CHECK(races[0].text.find("read b on stream 'consumer'") != std::string::npos);
    CHECK(races[0].text.find("bytes [0, 64) of 'b'") != std::string::npos);
    if (seed == 1) first_text = races[0].text;
    CHECK(races[0].text == first_text);  // deterministic whatever the order of execution

    fresh(seed);
    loom::cuda::event e;
    doubler(producer.get(), a.data(), b.data(), 16, "write b");
    e.record(producer);
    consumer.ref().wait(e);
    doubler(consumer.get(), b.data(), c.data(), 16, "read b");
    consumer.synchronize();
    producer.synchronize();
    CHECK(sim::reports().empty());
  }
}

TEST_CASE("with the fail policy a race fails the host synchronisation that orders both operations") {
  fresh(3, sim::race_policy::fail);
  loom::cuda::stream p, q;
  loom::cuda::device_buffer<float> a(8), b(8);
  LOOM_CUDA_TRY(cudaMemset(a.data(), 0, a.bytes()));
  doubler(p.get(), a.data(), b.data(), 8, "first");
  doubler(q.get(), a.data(), b.data(), 8, "second");  // both write b
  p.synchronize();  // orders only "first": nothing to report yet
  cudaError_t e = cudaStreamSynchronize(q.get());
  CHECK(e == cudaErrorLaunchFailure);
  CHECK(sim::detail().find("race: first on stream") != std::string::npos);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
}

TEST_CASE("a missing dependency also shows up as a wrong result under random delays") {
  int wrong = 0;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    fresh(seed);
    loom::cuda::stream p, q;
    loom::cuda::device_buffer<float> a(4), b(4), c(4);
    std::vector<float> ones(4, 1.f), out(4);
    LOOM_CUDA_TRY(cudaMemcpy(a.data(), ones.data(), 16, cudaMemcpyHostToDevice));
    LOOM_CUDA_TRY(cudaMemset(b.data(), 0, 16));
    doubler(p.get(), a.data(), b.data(), 4, "producer");
    doubler(q.get(), b.data(), c.data(), 4, "consumer");
    LOOM_CUDA_TRY(cudaMemcpyAsync(out.data(), c.data(), 16, cudaMemcpyDeviceToHost, q.get()));
    q.synchronize();
    p.synchronize();
    wrong += out[0] != 4.f;
  }
  CHECK(wrong > 0);
  CHECK(wrong < 20);
}

TEST_CASE("synchronising inside a capture is a capture error and invalidates the capture") {
  fresh(1);
  loom::cuda::stream s;
  loom::cuda::device_buffer<float> a(4), b(4);
  LOOM_CUDA_TRY(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  doubler(s.get(), a.data(), b.data(), 4, "inside");
  CHECK(cudaStreamSynchronize(s.get()) == cudaErrorStreamCaptureUnsupported);
  CHECK(sim::detail().find("cudaStreamSynchronize on stream") != std::string::npos);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s.get(), &g) == cudaErrorStreamCaptureInvalidated);
  auto caps = of_kind(sim::report_kind::capture);
  REQUIRE(!caps.empty());
  CHECK(caps[0].text.find("inside a capture") != std::string::npos);
  (void)cudaGetLastError();
  s.synchronize();  // usable again
}

TEST_CASE("a captured graph replays its kernels, copies and forked streams") {
  fresh(5);
  loom::cuda::stream s, side;
  loom::cuda::device_buffer<float> a(4), b(4), c(4);
  std::vector<float> init{1, 2, 3, 4}, out(4);
  loom::cuda::copy_to_device(a.span(), std::span<const float>(init));
  loom::cuda::event fork, join;
  auto g = loom::cuda::capture(s, [&] {
    fork.record(s);
    side.ref().wait(fork);
    doubler(side.get(), a.data(), b.data(), 4, "side");
    join.record(side);
    s.ref().wait(join);
    doubler(s.get(), b.data(), c.data(), 4, "main");
    LOOM_CUDA_TRY(cudaMemcpyAsync(a.data(), c.data(), 16, cudaMemcpyDeviceToDevice, s.get()));
  });
  CHECK(g.size() >= 4);
  loom::cuda::graph_exec x(g);
  for (int i = 0; i < 3; ++i) x.launch(s);
  s.synchronize();
  loom::cuda::copy_to_host(std::span<float>(out), std::span<const float>(a.span()));
  CHECK(out == std::vector<float>{64, 128, 192, 256});  // x4 per replay, three replays
  CHECK(sim::reports().empty());
}

TEST_CASE("a stream forked into a capture and never joined makes the capture fail") {
  fresh(1);
  loom::cuda::stream s, side;
  loom::cuda::device_buffer<float> a(4), b(4);
  loom::cuda::event fork;
  LOOM_CUDA_TRY(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  fork.record(s);
  side.ref().wait(fork);
  doubler(side.get(), a.data(), b.data(), 4, "forgotten");
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s.get(), &g) == cudaErrorStreamCaptureUnjoined);
  CHECK(sim::detail().find("never joined back") != std::string::npos);
  (void)cudaGetLastError();
}

TEST_CASE("an access to freed device memory is reported as a use after free") {
  fresh(1, sim::race_policy::fail);
  loom::cuda::stream s;
  float* dangling = nullptr;
  loom::cuda::device_buffer<float> out(4);
  {
    loom::cuda::device_buffer<float> gone(4);
    dangling = gone.data();
    loom::cuda::name_memory(dangling, "scratch");
  }
  doubler(s.get(), dangling, out.data(), 4, "late reader");
  auto bad = of_kind(sim::report_kind::bad_pointer);
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].text.find("'scratch'") != std::string::npos);
  CHECK(bad[0].text.find("which was freed") != std::string::npos);
  s.synchronize();
}

TEST_CASE("device memory is accounted per device and per thread label, with peaks") {
  fresh(1);
  const auto before = sim::device_memory(3);
  std::thread t([] {
    LOOM_CUDA_TRY(cudaSetDevice(3));
    loom::cuda::name_thread("accounting test");
    loom::cuda::device_buffer<double> a(1000);
    { loom::cuda::device_buffer<double> b(500); }
    loom::cuda::device_buffer<double> c(100);
  });
  t.join();
  auto d = sim::device_memory(3);
  CHECK(d.current == before.current);
  CHECK(d.peak == before.current + 1500 * sizeof(double));
  auto o = sim::owner_memory("accounting test");
  CHECK(o.current == 0);
  CHECK(o.peak == 1500 * sizeof(double));
}

TEST_CASE("a host function calling CUDA is refused") {
  fresh(1);
  loom::cuda::stream s;
  static cudaError_t seen = cudaSuccess;
  LOOM_CUDA_TRY(cudaLaunchHostFunc(s.get(), [](void*) { seen = cudaDeviceSynchronize(); }, nullptr));
  s.synchronize();
  CHECK(seen == cudaErrorNotPermitted);
  auto api = of_kind(sim::report_kind::api);
  REQUIRE(!api.empty());
  CHECK(api[0].text.find("inside a kernel or host function") != std::string::npos);
}

TEST_CASE("a stream waiting for work that never comes is a deadlock naming the stuck operation") {
  fresh(1, sim::race_policy::record, 300);
  // A stream-ordered dependency that cannot be met: an NCCL receive whose send never comes.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      LOOM_CUDA_TRY(cudaSetDevice(r));
      LOOM_NCCL_TRY(ncclCommInitRank(&comms[static_cast<std::size_t>(r)], 2, id, r));
    });
  for (auto& t : ts) t.join();
  loom::cuda::stream s;  // device 0
  loom::cuda::name_stream(s.get(), "lonely");
  loom::cuda::device_buffer<float> buf(4);
  LOOM_NCCL_TRY(ncclRecv(buf.data(), 4, ncclFloat32, 1, comms[0], s.get()));
  cudaError_t e = cudaStreamSynchronize(s.get());
  CHECK(e == cudaErrorLaunchTimeout);
  CHECK(sim::detail().find("deadlock") != std::string::npos);
  CHECK(sim::detail().find("ncclRecv from rank 1 on stream 'lonely'") != std::string::npos);
  CHECK(sim::detail().find("no matching ncclSend posted by rank 1") != std::string::npos);
  (void)cudaGetLastError();
  LOOM_NCCL_TRY(ncclCommAbort(comms[0]));  // the stuck receive ends (failed)
  s.synchronize();
  LOOM_NCCL_TRY(ncclCommAbort(comms[1]));
}

TEST_CASE("memory freed by another stream before a pending reader runs is a use after free naming the reader") {
  fresh(1);
  loom::cuda::stream reader, freer, slow;
  loom::cuda::name_stream(reader.get(), "reader");
  float* x = nullptr;
  LOOM_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&x), 64));
  loom::cuda::name_memory(x, "x");
  loom::cuda::device_buffer<float> out(16);
  // The reader waits for a slow host function on a third stream; the free does not wait.
  LOOM_CUDA_TRY(cudaLaunchHostFunc(slow.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr));
  loom::cuda::event e;
  e.record(slow);
  reader.ref().wait(e);
  doubler(reader.get(), x, out.data(), 16, "late reader");
  LOOM_CUDA_TRY(cudaFreeAsync(x, freer.get()));
  freer.synchronize();
  reader.synchronize();
  auto uaf = of_kind(sim::report_kind::use_after_free);
  REQUIRE(uaf.size() == 1);
  CHECK(uaf[0].text.find("late reader on stream 'reader' reads bytes [0, 64) of 'x'") != std::string::npos);
}

TEST_CASE("the operation trace lists what ran, in order per stream, with labels") {
  sim::config c;
  c.trace = true;
  c.races = sim::race_policy::record;
  sim::configure(c);
  loom::cuda::stream s;
  loom::cuda::name_stream(s.get(), "traced");
  loom::cuda::device_buffer<float> a(4), b(4);
  LOOM_CUDA_TRY(cudaMemsetAsync(a.data(), 0, a.bytes(), s.get()));
  doubler(s.get(), a.data(), b.data(), 4, "F mb0 s0");
  LOOM_CUDA_TRY(cudaMemcpyAsync(a.data(), b.data(), a.bytes(), cudaMemcpyDeviceToDevice, s.get()));
  s.synchronize();
  std::vector<std::string> seen;
  for (auto& t : sim::trace())
    if (t.stream == "traced") seen.push_back(t.kind + ":" + t.label);
  CHECK(seen == std::vector<std::string>{"memset:cudaMemsetAsync", "region:F mb0 s0", "kernel:F mb0 s0", "copy:cudaMemcpyAsync"});
}

namespace {

using value_fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
value_fn driver_entry(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  REQUIRE(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) == cudaSuccess);
  REQUIRE(q == cudaDriverEntryPointSuccess);
  return reinterpret_cast<value_fn>(p);
}
CUdeviceptr word(const std::uint32_t* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

TEST_CASE("a stream waiting on a flag (cuStreamWaitValue32) runs after the write that raises it, ordered for the race detector") {
  const value_fn wait = driver_entry("cuStreamWaitValue32"), write = driver_entry("cuStreamWriteValue32");
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    CAPTURE(seed);
    for (bool flagged : {true, false}) {
      fresh(seed);
      loom::cuda::stream p, q;
      loom::cuda::name_stream(p.get(), "p");
      loom::cuda::name_stream(q.get(), "q");
      loom::cuda::device_buffer<float> a(16), b(16), c(16);
      loom::cuda::device_buffer<std::uint32_t> flag(1);
      std::vector<float> ones(16, 1.f), out(16);
      LOOM_CUDA_TRY(cudaMemcpy(a.data(), ones.data(), a.bytes(), cudaMemcpyHostToDevice));
      LOOM_CUDA_TRY(cudaMemset(flag.data(), 0, flag.bytes()));
      if (flagged) REQUIRE(wait(q.get(), word(flag.data()), 3, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);  // enqueued first
      doubler(q.get(), b.data(), c.data(), 16, "read b");
      doubler(p.get(), a.data(), b.data(), 16, "write b");
      REQUIRE(write(p.get(), word(flag.data()), 3, 0) == CUDA_SUCCESS);
      q.synchronize();
      p.synchronize();
      LOOM_CUDA_TRY(cudaMemcpy(out.data(), c.data(), c.bytes(), cudaMemcpyDeviceToHost));
      if (flagged) {
        CHECK(sim::reports().empty());
        CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 4.f; }));
      } else {
        CHECK(of_kind(sim::report_kind::race).size() == 1);  // the flag is what orders them
      }
    }
  }
}

TEST_CASE("a flag nobody raises is a deadlock naming the wait and the word, and a later write ends it") {
  const value_fn wait = driver_entry("cuStreamWaitValue32"), write = driver_entry("cuStreamWriteValue32");
  fresh(1, sim::race_policy::record, 300);
  loom::cuda::stream q, r;
  loom::cuda::name_stream(q.get(), "q");
  loom::cuda::device_buffer<std::uint32_t> flag(2);
  loom::cuda::name_memory(flag.data(), "flags");
  LOOM_CUDA_TRY(cudaMemset(flag.data(), 0, flag.bytes()));
  REQUIRE(write(q.get(), word(flag.data() + 1), 1, 0) == CUDA_SUCCESS);
  REQUIRE(wait(q.get(), word(flag.data() + 1), 5, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
  CHECK(cudaStreamSynchronize(q.get()) == cudaErrorLaunchTimeout);
  CHECK(sim::detail().find("cuStreamWaitValue32 on stream 'q'") != std::string::npos);
  CHECK(sim::detail().find("the 32-bit word at 'flags'") != std::string::npos);
  CHECK(sim::detail().find("+ 4 to be >= 5 (it is 1)") != std::string::npos);
  (void)cudaGetLastError();
  REQUIRE(write(r.get(), word(flag.data() + 1), 5, 0) == CUDA_SUCCESS);
  r.synchronize();  // the wait, reported stuck, completes with the write
  q.synchronize();
  // A cyclic comparison, as CUDA's: 2 is after 0xfffffffe.
  REQUIRE(write(r.get(), word(flag.data()), 2, 0) == CUDA_SUCCESS);
  REQUIRE(wait(q.get(), word(flag.data()), 0xfffffffeu, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
  q.synchronize();
  // Refused: a misaligned word, a word outside device memory, capture.
  CHECK(write(q.get(), word(flag.data()) + 2, 1, 0) == CUDA_ERROR_INVALID_VALUE);
  std::uint32_t host = 0;
  CHECK(wait(q.get(), word(&host), 1, 0) == CUDA_ERROR_INVALID_VALUE);
  LOOM_CUDA_TRY(cudaStreamBeginCapture(q.get(), cudaStreamCaptureModeRelaxed));
  CHECK(write(q.get(), word(flag.data()), 1, 0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(q.get(), &g) != cudaSuccess);
  (void)cudaGetLastError();
  void* none = nullptr;
  cudaDriverEntryPointQueryResult status{};
  CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &none, 12000, cudaEnableDefault, &status) == cudaSuccess);
  CHECK(status == cudaDriverEntryPointSymbolNotFound);
  CHECK(none == nullptr);
}

TEST_CASE("a host hand-off between threads, told to the simulator, orders their streams' work") {
  for (bool told : {true, false}) {
    CAPTURE(told);
    fresh(2);
    loom::cuda::device_buffer<float> b(8);
    int key = 0;
    std::thread([&] {
      loom::cuda::stream s;
      LOOM_CUDA_TRY(cudaMemsetAsync(b.data(), 0, b.bytes(), s.get()));
      s.synchronize();
      if (told) loom::cuda::host_release(&key);
    }).join();
    std::thread([&] {  // the join above orders the threads, which the simulator cannot see
      if (told) loom::cuda::host_acquire(&key);
      loom::cuda::stream s;
      LOOM_CUDA_TRY(cudaMemsetAsync(b.data(), 1, b.bytes(), s.get()));
      s.synchronize();
    }).join();
    CHECK(of_kind(sim::report_kind::race).size() == (told ? 0u : 1u));
  }
}
