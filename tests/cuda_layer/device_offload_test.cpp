// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Offload and reload actions on the device path (PipeOffload's plan as a program,
// loom::with_offload): pinned host slots, a copy stream per direction, tickets. Training with the
// copies equals training without them bit for bit, eagerly and replayed from a graph, on both
// communicators; against the simulator, each rank's device memory is the buffer plan's
// prediction with and without offload (less with it), and the two deliberate bugs (a backward
// that does not wait for its reload, a forward that reuses a slot before its copy to host ran)
// are races naming both operations.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <loom/exec/memory.hpp>
#include <loom/schedule/offload.hpp>

#include "device_support.hpp"

using namespace loom_device_test;

namespace {

struct offloaded {
  loom::schedule plain, with;
};

// Group-interleaved 1F1B on 4 ranks, 2 chunks, m = 8, g = 2, the first chunk offloaded (unit
// cost per stage; the plan the authors' rules make).
offloaded program() {
  const loom::schedule s = loom::generate(loom::group_interleaved_1f1b{}, {.ranks = 4, .microbatches = 8, .chunks = 2, .group = 2});
  const auto plan = loom::plan_offload(s, {.f = 2, .b = 2, .w = 2}, {.chunks = 1, .time = 0.2});
  REQUIRE(plan.ok);
  return {s, loom::with_offload(s, plan)};
}

}  // namespace

TEST_CASE("offload on the device: training with the copies equals training without them, bitwise, eager and graph, both communicators") {
  const auto o = program();
  const auto spec = spec_for(o.plain.stages);
  for (backend b : {backend::cuda_local, backend::nccl}) {
    if (skip_unless_devices(b, 4)) continue;
    for (bool graph : {false, true})
      for (bool det : {true, false}) {
        CAPTURE(std::string(name(b)));
        CAPTURE(graph);
        CAPTURE(det);
        simulate_with(det ? 1 : 2);
        const auto with = run(b, o.with, spec, 3, {.deterministic = det, .graph = graph});
        INFO(with.errors() << findings());
        REQUIRE(with.ok());
        CHECK(findings().empty());
        simulate_with(det ? 1 : 2);
        const auto without = run(b, o.plain, spec, 3, {.deterministic = det, .graph = graph});
        REQUIRE(without.ok());
        CHECK(std::memcmp(with.losses.data(), without.losses.data(), with.losses.size() * sizeof(double)) == 0);
        REQUIRE(with.params.size() == without.params.size());
        for (std::size_t l = 0; l < with.params.size(); ++l) CHECK(with.params[l] == without.params[l]);
        if (det) {
          auto [rel, differ] = compare(with, reference(spec, o.plain.microbatches, 3));
          CHECK(differ == 0);
          CHECK(rel == 0);
        }
      }
  }
}

#if defined(LOOM_CUDA_SIM)
namespace {
bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
}  // namespace

TEST_CASE("offload on the simulated device: each rank's device memory is the buffer plan's prediction, with and without offload") {
  const auto o = program();
  const auto spec = spec_for(o.plain.stages);
  auto sizes = [&](const loom::schedule& s) {
    return [&spec, &s](loom::stage_id id) {
      auto [a, b] = quickstart::stage_layers(spec, id.stage, s.stages);
      cuda_mlp::stage probe_size_only(spec, a, b, id.stage == s.stages - 1, nullptr);
      return loom::stage_sizes{probe_size_only.input_size(), probe_size_only.output_size(), probe_size_only.stash_size(),
                               probe_size_only.weight_grad().size()};
    };
  };
  std::vector<std::size_t> measured[2];
  int lower = 0;
  for (int with : {0, 1}) {
    const loom::schedule& s = with ? o.with : o.plain;
    measured[with].assign(4, 0);
    simulate_with(1);
    loom::nccl::run(4, [&](loom::nccl::comm& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      const std::size_t in0 = static_cast<std::size_t>(spec.samples) * spec.width(0),
                        fin = static_cast<std::size_t>(spec.samples) * spec.width(spec.layers());
      loom::cuda::device_buffer<float> inputs(8 * in0), targets(8 * fin);
      std::size_t stage_bytes = 0;
      c.all_reduce(std::span<double>(), loom::reduce_op::sum);
      const std::size_t before = loom::cudasim::device_memory(c.rank()).current;
      loom::pipeline p(s, c, [&](loom::stage_id id) {
        auto [a, z] = quickstart::stage_layers(spec, id.stage, s.stages);
        cuda_mlp::stage st(spec, a, z, id.stage == s.stages - 1, targets.data());
        stage_bytes += 2 * st.weight_grad().size() * sizeof(float);
        return st;
      }, {.deterministic = true});
      measured[with][r] = loom::cudasim::device_memory(c.rank()).current - before - stage_bytes;
      CHECK(measured[with][r] == loom::pipeline_device_bytes(s, c.rank(), sizes(s), true, sizeof(float)));
      CHECK((p.host_buffer_bytes() > 0) == (with == 1));
      auto data = cuda_mlp::float_batch(spec, 8, 0);
      loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
      loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
      p.step(std::span<const float>(inputs.span()));
      const std::size_t after_first = loom::cudasim::device_memory(c.rank()).current;
      p.step(std::span<const float>(inputs.span()));
      CHECK(loom::cudasim::device_memory(c.rank()).current == after_first);  // pinned host slots are not device memory; nothing grows
    });
  }
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(measured[1][r] <= measured[0][r]);
    lower += measured[1][r] < measured[0][r] ? 1 : 0;
  }
  CHECK(lower > 0);
}

TEST_CASE("offload on the simulated device: a late reload and an early overwrite are races naming both operations") {
  const auto o = program();
  const auto spec = spec_for(o.plain.stages);
  struct broken {
    const char* what;
    bool loom::device_faults::*fault;
    const char* copy;     // the copy's label
    const char* compute;  // the stage call's label
  };
  for (const broken& v : {broken{"a backward that does not wait for its reload", &loom::device_faults::skip_reload_wait, "REL mb", "B mb"},
                          broken{"a forward that reuses a slot before its copy to host ran", &loom::device_faults::skip_offload_wait, "OFF mb",
                                 "F mb"}})
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(std::string(v.what));
      CAPTURE(std::string(name(b)));
      simulate_with(1);
      loom::pipeline_options opt;
      opt.faults.*v.fault = true;
      const auto out = run(b, o.with, spec, 1, opt);
      REQUIRE(!out.ok());
      const std::string e = out.errors();
      CAPTURE(e);
      CHECK(contains(e, "race: "));
      CHECK(contains(e, "neither is ordered before the other"));
      // The step fails on the first race it meets; among every finding, one names the copy and
      // the stage call of the broken order (the first may pair the stage call with another copy
      // the missing wait also leaves unordered).
      const std::string all = findings();
      CAPTURE(all);
      bool named = false;
      for (std::size_t at = 0, end = 0; at < all.size(); at = end + 1) {
        end = all.find('\n', at);
        if (end == std::string::npos) end = all.size();
        const std::string line = all.substr(at, end - at);
        named = named || (contains(line, "race: ") && contains(line, v.copy) && contains(line, v.compute));
      }
      CHECK(named);
    }
}
#endif
