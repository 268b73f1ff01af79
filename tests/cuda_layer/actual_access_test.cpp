// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The simulator's race detector on the bytes kernels actually touch (src/cudasim/tracking.hpp):
// the CUDA MLP's stage is built with loom_cuda_stage (clang's load/store tracing), so with the
// regions loom declares switched off the broken variants of device_faults_test.cpp are still
// reported from actual accesses alone, and bugs no region can show (a side stream without waits,
// a write one element past the output slot, an update on another stream while a forward reads the
// parameters) are reported naming both operations and the bytes. Built only where the stage is
// traced (LOOM_ACTUAL_ACCESSES, clang); a GCC build has no such tests rather than skipped ones.
#include <doctest/doctest.h>

#include <string>

#include "device_support.hpp"

#if defined(LOOM_CUDA_SIM) && defined(LOOM_ACTUAL_ACCESSES)

using namespace loom_device_test;

namespace {

loom::schedule make(const char* family, int P, int m) { return loom::default_registry().at(family).make({P, m, 0}); }

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

//! `simulate_with(seed)`, then the declared regions off (`regions`) or on.
void simulate(std::uint64_t seed, bool regions) {
  simulate_with(seed);
  auto c = loom::cudasim::current_config();
  c.regions = regions;
  loom::cudasim::configure(c);
}

}  // namespace

TEST_CASE("actual accesses: the traced stage's kernels report their loads and stores to the simulator") {
  REQUIRE(loom::cudasim::actual_accesses_linked());
  auto s = make("1f1b", 2, 4);
  auto spec = spec_for(s.stages);
  simulate(1, true);
  auto out = run(backend::cuda_local, s, spec, 1, {.deterministic = true});
  REQUIRE(out.ok());
  // Every layer's forward and backward reads and writes device memory: far more than the regions' count.
  CHECK(loom::cudasim::actual_accesses_seen() > 1000);
  CHECK(findings() == "");
}

TEST_CASE("with the declared regions off, a send without its producer's event is still a race naming both operations") {
  for (const char* family : {"1f1b", "zb-h1", "interleaved-1f1b"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 2, 4);
      auto spec = spec_for(s.stages);
      simulate(1, false);
      loom::pipeline_options o;
      o.faults.skip_send_wait = true;
      auto out = run(b, s, spec, 1, o);
      REQUIRE(!out.ok());
      const std::string e = out.errors();
      CAPTURE(e);
      CHECK(contains(e, "race: "));
      CHECK((contains(e, "F mb") || contains(e, "B mb") || contains(e, "BW mb")));
      CHECK(contains(e, b == backend::nccl ? "ncclSend" : "copy r"));
    }
}

TEST_CASE("with the declared regions off, a receive into a buffer not yet freed is still a race naming the pair") {
  for (const char* family : {"1f1b", "zb-h1"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 4, 8);
      auto spec = spec_for(s.stages);
      simulate(1, false);
      loom::pipeline_options o;
      o.faults.skip_free_wait = true;
      auto out = run(b, s, spec, 1, o);
      REQUIRE(!out.ok());
      const std::string e = out.errors();
      CAPTURE(e);
      CHECK(contains(e, "race: "));
      CHECK(contains(e, " slots'"));
      CHECK(contains(e, b == backend::nccl ? "ncclRecv" : "copy r"));
    }
}

TEST_CASE("with the declared regions off, swapped receives still give a wrong result or a named error") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(std::string(name(b)));
    auto s = make("1f1b", 2, 4);
    auto spec = spec_for(s.stages);
    auto ref = reference(spec, 4, 1);
    simulate(1, false);
    loom::pipeline_options o;
    o.deterministic = true;
    o.faults.swap_receives = 0;
    hooks h;
    h.timeout = std::chrono::milliseconds(3000);
    auto out = run(b, s, spec, 1, o, h);
    const bool caught = !out.ok() || compare(out, ref).second > 0;
    CHECK(caught);
  }
}

TEST_CASE("a stage that runs its layers on its own stream: a race naming the side stream without waits, silent with them") {
  for (const char* family : {"1f1b", "zb-h1"})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(family));
      CAPTURE(std::string(name(b)));
      auto s = make(family, 2, 4);
      auto spec = spec_for(s.stages);
      for (bool regions : {true, false}) {
        CAPTURE(regions);
        hooks broken;
        broken.adjust = [](int, cuda_mlp::stage& st) { st.side_stream = 2; };
        simulate(1, regions);
        // (Recorded when both kernels have run; reported to a host call only where one
        // synchronises with both streams, and nothing here waits for the stage's own stream.)
        (void)run(b, s, spec, 1, {.deterministic = true}, broken);
        const std::string e = findings();
        CAPTURE(e);
        CHECK(contains(e, "race: "));
        CHECK(contains(e, "on stream 'side stream of layers"));
        CHECK(contains(e, "neither is ordered before the other"));
        // The same stage with an event each way is correct: silent, and bitwise the reference.
        hooks ordered;
        ordered.adjust = [](int, cuda_mlp::stage& st) { st.side_stream = 1; };
        simulate(1, regions);
        auto good = run(b, s, spec, 2, {.deterministic = true}, ordered);
        CAPTURE(good.errors());
        REQUIRE(good.ok());
        CHECK(compare(good, reference(spec, 4, 2)).second == 0);
        CHECK(findings() == "");
      }
    }
}

TEST_CASE("a kernel that writes one element past its output slot is an undeclared access naming the operation and the bytes") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(std::string(name(b)));
    auto s = make("1f1b", 2, 4);
    auto spec = spec_for(s.stages);
    hooks h;
    h.adjust = [](int rank, cuda_mlp::stage& st) { st.write_past_output = rank == 0; };
    simulate(1, true);
    auto out = run(b, s, spec, 1, {.deterministic = true}, h);
    REQUIRE(!out.ok());
    const std::string e = out.errors();
    CAPTURE(e);
    CHECK(contains(e, "undeclared access: F mb"));
    CHECK(contains(e, " wrote bytes ["));
    CHECK(contains(e, "which loom did not hand it"));
  }
}

TEST_CASE("a kernel that writes past the end of its allocation is a bad pointer naming the operation and the bytes") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(std::string(name(b)));
    auto s = make("1f1b", 2, 1);  // one microbatch: its slot is the whole allocation
    auto spec = spec_for(s.stages);
    hooks h;
    h.adjust = [](int rank, cuda_mlp::stage& st) { st.write_past_output = rank == 0; };
    simulate(1, true);
    auto out = run(b, s, spec, 1, {.deterministic = true}, h);
    REQUIRE(!out.ok());
    const std::string e = out.errors();
    CAPTURE(e);
    CHECK(contains(e, "bad pointer: F mb0 s0 on stream 'r0 compute' wrote bytes [48, 52) past the end of 'r0 stage 0 activation-send slots'"));
  }
}

TEST_CASE("a kernel that writes device memory after it was freed is a use after free naming the operation") {
  auto s = make("1f1b", 2, 4);
  auto spec = spec_for(s.stages);
  hooks h;
  h.adjust = [](int rank, cuda_mlp::stage& st) { st.write_freed = rank == 1; };
  simulate(1, true);
  auto out = run(backend::cuda_local, s, spec, 1, {.deterministic = true}, h);
  REQUIRE(!out.ok());
  const std::string e = out.errors();
  CAPTURE(e);
  CHECK(contains(e, "use after free: F mb0 s1 on stream 'r1 compute' writes bytes [0, 4) of device memory"));
}

TEST_CASE("an update on another stream while the next step's forward reads the parameters is a race naming both") {
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(std::string(name(b)));
    auto s = make("1f1b", 2, 4);
    auto spec = spec_for(s.stages);
    hooks h;
    h.adjust = [](int, cuda_mlp::stage& st) { st.update_unordered = true; };
    simulate(1, true);
    (void)run(b, s, spec, 2, {.deterministic = true}, h);
    const std::string f = findings();
    CAPTURE(f);
    CHECK(contains(f, "race: "));
    CHECK(contains(f, "sgd on stream 'side stream of layers"));
    CHECK(contains(f, "F mb"));
  }
}

#endif
