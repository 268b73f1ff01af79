// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Deliberately broken variants of the device path are caught (against the simulator: a removed
// event dependency and a buffer reused before its event are races naming both operations;
// swapped receives give a wrong result or a named error), and failures end every rank with the
// cause (a rank that throws, a rank that hangs, an asynchronous NCCL error, a synchronisation
// inside a capture), on several families and both backends.
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <set>
#include <thread>
#include <unistd.h>
#include <string>

#include "device_support.hpp"

using namespace loom_device_test;

namespace {

loom::schedule make(const char* family, int P, int m) {
  return loom::default_registry().at(family).make({P, m, 0});
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// cuda_local's transfer paths the fault tests run: the host hand-off (the default) and, against the
// simulator, device flags (opt-in; on real GPUs they hang, see cuda_local.hpp).
#if defined(LOOM_CUDA_SIM)
constexpr bool flag_modes[] = {false, true};
#else
constexpr bool flag_modes[] = {false};
#endif

}  // namespace

#if defined(LOOM_CUDA_SIM)
TEST_CASE("a send that does not wait for its producer's event is a race naming both operations, the same on every seed") {
  for (const char* family : {"1f1b", "zb-h1", "interleaved-1f1b", "dualpipe-v"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 2, 4);
      auto spec = spec_for(s.stages);
      // Each rank's race report is the same on every seed. Which rank's report reaches rank 0
      // first is not: with nccl, rank 1 may find its own race and abort rank 0 before rank 0
      // finds its own, and rank 0 then ends with rank 1's cause ("rank 1: ..."). So the texts
      // are compared per reporting rank.
      std::map<std::string, std::set<std::string>> texts;  // "rank N" -> race sentences
      for (std::uint64_t seed : {1, 2, 3}) {
        simulate_with(seed);
        loom::pipeline_options o;
        o.faults.skip_send_wait = true;
        auto out = run(b, s, spec, 1, o);
        REQUIRE(!out.ok());
        auto const& e = out.ranks[0].error;
        CAPTURE(e);
        CHECK(contains(e, "race: "));
        CHECK((contains(e, "F mb") || contains(e, "B mb") || contains(e, "BW mb")));
        CHECK(contains(e, b == backend::nccl ? "ncclSend" : "copy r"));
        CHECK(contains(e, "neither is ordered before the other"));
        auto const at = e.find("rank ");
        REQUIRE(at != std::string::npos);
        texts[e.substr(at, e.find(':', at) - at)].insert(e.substr(e.find("race: ")));
      }
      for (auto const& [reporter, sentences] : texts) {
        CAPTURE(reporter);
        CHECK(sentences.size() == 1);  // reported deterministically
      }
    }
}

TEST_CASE("a receive that reuses its buffer before the event that frees it is a race naming the pair") {
  // (On 2 ranks the next transfer into a freed buffer is ordered after its last use through the
  // data it carries for these families, so the bug is masked; on 4 it is not.)
  for (const char* family : {"1f1b", "zb-h1", "zb-v", "interleaved-1f1b"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 4, 8);  // more microbatches than slots: slots are reused
      auto spec = spec_for(s.stages);
      simulate_with(1);
      loom::pipeline_options o;
      o.faults.skip_free_wait = true;
      auto out = run(b, s, spec, 1, o);
      REQUIRE(!out.ok());
      std::string all = out.errors();
      CAPTURE(all);
      CHECK(contains(all, "race: "));
      CHECK(contains(all, " slots'"));
      CHECK(contains(all, b == backend::nccl ? "ncclRecv" : "copy r"));
    }
}

TEST_CASE("two receives posted in swapped order give a wrong result or a named error") {
  for (const char* family : {"1f1b", "gpipe", "zb-h1"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 2, 4);
      auto spec = spec_for(s.stages);
      auto ref = reference(spec, 4, 1);
      simulate_with(1, 1000);
      loom::pipeline_options o;
      o.deterministic = true;
      o.faults.swap_receives = 0;
      hooks h;
      h.timeout = std::chrono::milliseconds(3000);
      auto out = run(b, s, spec, 1, o, h);
      if (out.ok()) {
        CHECK(compare(out, ref).second > 0);  // the data went to the wrong microbatches
      } else {
        auto all = out.errors();
        CAPTURE(all);
        CHECK((contains(all, "deadlock") || contains(all, "expects") || contains(all, "matched")));
      }
    }
}

TEST_CASE("an asynchronous NCCL error on one rank ends every rank's step with the cause") {
  for (const char* family : {"1f1b", "zb-h1", "dualpipe"}) {
    CAPTURE(std::string(family));
    auto s = make(family, 4, 8);
    auto spec = spec_for(s.stages);
    simulate_with(1);
    hooks h;
    h.timeout = std::chrono::milliseconds(5000);
    h.on_comm = [](int rank, ncclComm_t c) {
      if (rank == 2) loom::cudasim::fail_nccl_after(c, 3, ncclRemoteError);
    };
    auto out = run(backend::nccl, s, spec, 3, {}, h);
    for (int r = 0; r < 4; ++r) {
      auto const& x = out.ranks[static_cast<std::size_t>(r)];
      CAPTURE(r);
      CAPTURE(x.error);
      CHECK(contains(x.error, "NCCL asynchronous error"));
      CHECK(contains(x.error, "on rank 2"));
      CHECK(x.seconds < 4.0);
    }
  }
}
#endif

TEST_CASE("a synchronisation inside a captured step is a capture error that ends every rank") {
  int ran = 0;
  for (const char* family : {"1f1b", "zb-h1"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      if (!missing_devices(b, 2).empty()) continue;
      ++ran;
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 2, 4);
      auto spec = spec_for(s.stages);
      simulate_with(1);
      hooks h;
      h.timeout = std::chrono::milliseconds(3000);
      h.adjust = [](int rank, cuda_mlp::stage& st) { st.sync_in_forward = rank == 0; };
      auto out = run(b, s, spec, 2, {.graph = true}, h);
      REQUIRE(!out.ok());
      auto const& e0 = out.ranks[0].error;
      CAPTURE(out.errors());
      CHECK((contains(e0, "cudaErrorStreamCaptureUnsupported") || contains(e0, "cudaErrorStreamCaptureInvalidated")));
      for (auto const& r : out.ranks) CHECK(!r.error.empty());
    }
  if (ran == 0) std::cout << "SKIPPED: " << missing_devices(backend::cuda_local, 1) << "\n";
}

// The fault comes in the first step, and with device flags also in the second: cuda_local's first
// step uses the host hand-off and later ones flags, and both must release every rank.
TEST_CASE("a stage that throws on one rank ends every rank's step naming that rank and the cause") {
  int ran = 0;
  for (const char* family : {"1f1b", "zb-h1", "dualpipe-v", "chimera"})
    for (backend b : {backend::cuda_local, backend::nccl})
      for (int fault_step : {0, 1})
        for (bool flags : flag_modes) {
          if (!missing_devices(b, 4).empty() || (flags && b != backend::cuda_local) || (fault_step == 1 && !flags)) continue;
          ++ran;
          CAPTURE(std::string(family));
          CAPTURE(std::string(name(b)));
          CAPTURE(fault_step);
          CAPTURE(flags);
          auto s = make(family, 4, 8);
          auto spec = spec_for(s.stages);
          simulate_with(2);
          hooks h;
          h.on_local = [=](loom::cuda_local::comm& lc) { lc.set_device_flags(flags); };
          h.before_step = [=](int step, int rank, cuda_mlp::stage& st) { st.fail_on = rank == 1 && step == fault_step ? 2 : -1; };
          auto out = run(b, s, spec, 2, {}, h);
          for (int r = 0; r < 4; ++r) {
            auto const& x = out.ranks[static_cast<std::size_t>(r)];
            CAPTURE(r);
            CAPTURE(x.error);
            CHECK(x.error_rank == 1);
            CHECK(contains(x.error, "injected failure"));
            CHECK(contains(x.error, "microbatch 2"));
            CHECK(x.seconds < 4.0);
          }
        }
  if (ran == 0) std::cout << "SKIPPED: " << missing_devices(backend::cuda_local, 1) << "\n";
}

TEST_CASE("a rank that hangs makes every rank end within seconds with the timeout as the cause") {
  int ran = 0;
  for (const char* family : {"1f1b", "zb-v"})
    for (backend b : {backend::cuda_local, backend::nccl})
      for (int fault_step : {0, 1})
        for (bool flags : flag_modes) {
          // A second-step fault differs from a first-step one only where flags start at step 2.
          if (!missing_devices(b, 2).empty() || (flags && b != backend::cuda_local) || (fault_step == 1 && !flags)) continue;
          ++ran;
          CAPTURE(std::string(family));
          CAPTURE(std::string(name(b)));
          CAPTURE(fault_step);
          CAPTURE(flags);
          auto s = make(family, 2, 4);
          auto spec = spec_for(s.stages);
          simulate_with(1, 10000);
          hooks h;
          h.timeout = std::chrono::milliseconds(400);
          h.on_local = [=](loom::cuda_local::comm& lc) { lc.set_device_flags(flags); };
          h.before_step = [=](int step, int rank, cuda_mlp::stage& st) { st.hang_ms = rank == 1 && step == fault_step ? 1500 : 0; };
          auto out = run(b, s, spec, 2, {}, h);
          for (int r = 0; r < 2; ++r) {
            auto const& x = out.ranks[static_cast<std::size_t>(r)];
            CAPTURE(r);
            CAPTURE(x.error);
            CHECK(contains(x.error, "timed out"));
            CHECK(x.seconds < 4.0);
          }
        }
  if (ran == 0) std::cout << "SKIPPED: " << missing_devices(backend::cuda_local, 1) << "\n";
}

#if defined(LOOM_CUDA_SIM)
TEST_CASE("ranks meeting through a file (environment bootstrap) train, and a failure reaches every rank through the file") {
  auto s = make("1f1b", 3, 6);
  auto spec = spec_for(s.stages);
  auto ref = reference(spec, 6, 2);
  for (bool fail : {false, true}) {
    CAPTURE(fail);
    simulate_with(1);
    const std::string path = "/tmp/loom-nccl-file-test-" + std::to_string(::getpid()) + (fail ? "-fail" : "-ok");
    std::remove(path.c_str());
    std::remove((path + ".abort").c_str());
    std::vector<std::string> errors(3);
    std::vector<double> losses(3, 0.0);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
      ts.emplace_back([&, r] {
        try {
          LOOM_CUDA_TRY(cudaSetDevice(r));
          auto c = loom::nccl::from_file(r, 3, r, path, std::chrono::milliseconds(5000));
          const std::size_t in0 = static_cast<std::size_t>(spec.samples) * spec.width(0), fin = static_cast<std::size_t>(spec.samples) * spec.width(spec.layers());
          loom::cuda::device_buffer<float> inputs(6 * in0), targets(6 * fin);
          loom::pipeline p(s, c, [&](loom::stage_id id) {
            auto [a, z] = quickstart::stage_layers(spec, id.stage, s.stages);
            cuda_mlp::stage st(spec, a, z, id.stage == s.stages - 1, targets.data());
            st.hang_ms = fail && r == 2 ? 2500 : 0;  // ranks 0 and 1 time out; rank 2 learns it from the file
            return st;
          }, {.deterministic = true, .timeout = std::chrono::milliseconds(fail ? 500 : 5000)});
          for (int i = 0; i < 2; ++i) {
            auto data = cuda_mlp::float_batch(spec, 6, i);
            loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
            loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
            losses[static_cast<std::size_t>(r)] = p.step(std::span<const float>(inputs.span())).loss;
          }
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CAPTURE(errors[static_cast<std::size_t>(r)]);
      if (fail) {
        CHECK(contains(errors[static_cast<std::size_t>(r)], "timed out"));
      } else {
        CHECK(errors[static_cast<std::size_t>(r)].empty());
        CHECK(losses[static_cast<std::size_t>(r)] == ref.losses[1]);
      }
    }
    std::remove(path.c_str());
    std::remove((path + ".abort").c_str());
  }
}
#endif
