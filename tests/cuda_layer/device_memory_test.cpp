// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Device memory: what the pipeline allocates on each rank's device is exactly what the buffer
// plan predicts (slots times the stages' sizes), its stash is the simulator's peak activation
// (the memory model) on ranks holding one stage, and steps allocate nothing more; on a dp x pp
// mesh, what data_parallel adds is its formula (data_parallel::memory()) at every ZeRO stage,
// with SGD, Adam and local SGD, between steps and at the peak of a step.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <vector>

#include <loom/exec/data_parallel.hpp>
#include <loom/exec/memory.hpp>
#include <loom/mesh/mesh_comm.hpp>

#include "device_support.hpp"

using namespace loom_device_test;

#if defined(LOOM_CUDA_SIM)
namespace {

//! Bytes the buffer plan predicts for `rank` (`loom::pipeline_device_bytes`, the MLP's stages'
//! sizes).
std::size_t predicted_bytes(const loom::schedule& s, int rank, const quickstart::mlp_spec& m, bool det) {
  return loom::pipeline_device_bytes(
      s, rank,
      [&](loom::stage_id id) {
        auto [a, b] = quickstart::stage_layers(m, id.stage, s.stages);
        cuda_mlp::stage probe_size_only(m, a, b, id.stage == s.stages - 1, nullptr);
        return loom::stage_sizes{probe_size_only.input_size(), probe_size_only.output_size(), probe_size_only.stash_size(),
                                 probe_size_only.weight_grad().size()};
      },
      det, sizeof(float));
}

}  // namespace

TEST_CASE("peak device memory of every rank equals the buffer plan's prediction for every family at P = 4") {
  for (bool det : {false, true})
    for (auto const& e : loom::default_registry().entries()) {
      if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
      loom::shape sh = e.resolve({.ranks = 4, .microbatches = 8});
      if (!e.check(sh).empty()) continue;
      loom::schedule s = e.make(sh);
      auto m = spec_for(s.stages);
      CAPTURE(e.name);
      CAPTURE(det);
      simulate_with(1);
      std::vector<std::size_t> before(4), built(4), stage_bytes(4), predicted(4), after_first(4), peak_later(4);
      std::vector<int> stash_ok(4, 1);
      const auto sim_peak = loom::simulate(s).peak_activation;
      loom::nccl::run(4, [&](loom::nccl::comm& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        const std::size_t in0 = static_cast<std::size_t>(m.samples) * m.width(0), fin = static_cast<std::size_t>(m.samples) * m.width(m.layers());
        loom::cuda::device_buffer<float> inputs(8 * in0), targets(8 * fin);
        c.all_reduce(std::span<double>(), loom::reduce_op::sum);  // every rank's buffers exist before anyone measures
        before[r] = loom::cudasim::device_memory(c.rank()).current;
        loom::pipeline p(s, c, [&](loom::stage_id id) {
          auto [a, z] = quickstart::stage_layers(m, id.stage, s.stages);
          cuda_mlp::stage st(m, a, z, id.stage == s.stages - 1, targets.data());
          stage_bytes[r] += 2 * st.weight_grad().size() * sizeof(float);  // parameters and gradient accumulator
          return st;
        }, {.deterministic = det});
        built[r] = loom::cudasim::device_memory(c.rank()).current;
        predicted[r] = predicted_bytes(s, c.rank(), m, det);
        // The memory model: one stage per rank holds as many stashes as the simulated peak.
        if (s.chunks == 1 && s.directions == 1) {
          auto plan = loom::plan_buffers(loom::lower(s), c.rank());
          stash_ok[r] = plan.local.size() == 1 && plan.local[0].stash == static_cast<int>(sim_peak[r]);
        }
        auto data = cuda_mlp::float_batch(m, 8, 0);
        loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
        loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
        p.step(std::span<const float>(inputs.span()));  // the first step may allocate (communicator staging)
        after_first[r] = loom::cudasim::device_memory(c.rank()).current;
        c.all_reduce(std::span<double>(), loom::reduce_op::sum);
        if (c.rank() == 0) loom::cudasim::reset_peaks();
        c.all_reduce(std::span<double>(), loom::reduce_op::sum);
        for (int i = 0; i < 3; ++i) p.step(std::span<const float>(inputs.span()));
        peak_later[r] = loom::cudasim::device_memory(c.rank()).peak;
      });
      for (std::size_t r = 0; r < 4; ++r) {
        CAPTURE(r);
        CHECK(built[r] - before[r] == predicted[r] + stage_bytes[r]);
        CHECK(stash_ok[r]);
        CHECK(peak_later[r] == after_first[r]);  // steps after the first allocate nothing
      }
    }
}

namespace {
//! The CUDA MLP's stage without its own update: the reducer's optimizer updates it.
struct dp_stage : cuda_mlp::stage {
  using cuda_mlp::stage::stage;
  void update() = delete;
};
}  // namespace

TEST_CASE("device memory of a dp2 x pp2 mesh equals the pipeline's and data_parallel's formulas at every ZeRO stage") {
  struct config {
    const char* family;
    int zero;
    bool adam;
    int local_steps;
  };
  std::vector<config> configs;
  for (const char* fam : {"1f1b", "interleaved-1f1b"})
    for (int z = 0; z <= 3; ++z)
      for (bool adam : {false, true}) configs.push_back({fam, z, adam, 0});
  configs.push_back({"1f1b", 0, true, 2});
  for (auto const& cf : configs)
    for (backend b : {backend::cuda_local, backend::nccl}) {
      const std::string fam = cf.family, be = loom_device_test::name(b);
      CAPTURE(fam);
      CAPTURE(be);
      CAPTURE(cf.zero);
      CAPTURE(cf.adam);
      CAPTURE(cf.local_steps);
      simulate_with(3);
      loom::schedule s;
      for (auto const& e : loom::default_registry().entries())
        if (e.name == cf.family) s = e.make(e.resolve({.ranks = 2, .microbatches = 4}));
      const auto m = spec_for(s.stages);
      const bool one_stage = s.chunks == 1 && s.directions == 1;
      std::vector<std::size_t> want_built(4), built(4), want_between(4), between(4), want_peak(4), peak(4);
      std::vector<int> peak_in_bounds(4, 1);
      std::vector<std::string> errors(4);
      auto body = [&](auto& world) {
        const auto r = static_cast<std::size_t>(world.rank());
        try {
          loom::mesh_comm g(loom::mesh<loom::dp<>, loom::pp<>>{loom::dp<>{2}, loom::pp<>{2}}, world);
          const std::size_t in0 = static_cast<std::size_t>(m.samples) * m.width(0), fin = static_cast<std::size_t>(m.samples) * m.width(m.layers());
          loom::cuda::device_buffer<float> inputs(4 * in0), targets(4 * fin);
          auto run = [&](auto opt) {
            loom::data_parallel<decltype(g), dp_stage, decltype(opt)> sync(
                g, {.zero_stage = cf.zero, .local_steps = cf.local_steps, .deterministic = true, .grad_scale = cf.local_steps > 0 ? 1.0 : 0.5},
                opt);
            world.all_reduce(std::span<double>(), loom::reduce_op::sum);  // every rank's buffers exist before anyone measures
            const std::size_t before = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).current;
            std::size_t stage_bytes = 0;
            loom::pipeline p(s, g.pp(), [&](loom::stage_id id) {
              auto [a, z] = quickstart::stage_layers(m, id.stage, s.stages);
              dp_stage st(m, a, z, id.stage == s.stages - 1, targets.data());
              stage_bytes += 2 * st.weight_grad().size() * sizeof(float);  // parameters and gradient accumulator
              return st;
            }, {.deterministic = true, .observer = &sync});
            sync.attach(p);
            LOOM_CUDA_TRY(cudaDeviceSynchronize());  // ZeRO-3's released parameters are freed in stream order
            const auto dm = sync.memory();
            const std::size_t pipe = loom::pipeline_device_bytes(
                s, g.pp().rank(),
                [&](loom::stage_id id) {
                  auto [a, z] = quickstart::stage_layers(m, id.stage, s.stages);
                  dp_stage probe(m, a, z, id.stage == s.stages - 1, nullptr);
                  return loom::stage_sizes{probe.input_size(), probe.output_size(), probe.stash_size(), probe.weight_grad().size()};
                },
                true, sizeof(float), b == backend::cuda_local ? loom::cuda_local::comm::channel_bytes : 0);
            const std::size_t channels = loom::pipeline_device_bytes(s, g.pp().rank(), [](loom::stage_id) { return loom::stage_sizes{}; },
                                                                     true, sizeof(float),
                                                                     b == backend::cuda_local ? loom::cuda_local::comm::channel_bytes : 0);
            built[r] = loom::cudasim::owner_memory("rank " + std::to_string(world.rank())).current - before;
            want_built[r] = pipe - channels + stage_bytes - dm.released + dm.between_steps() - dm.optimizer;  // channels open at the first step
            for (int i = 0; i < 3; ++i) {
              auto data = cuda_mlp::float_batch(m, 4, 10 * i + g.coord(loom::dim::dp));
              loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
              loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
              (void)p.step(std::span<const float>(inputs.span()));
              if (i == 0) {  // the peak of the later steps
                LOOM_CUDA_TRY(cudaDeviceSynchronize());
                world.all_reduce(std::span<double>(), loom::reduce_op::sum);
                if (world.rank() == 0) loom::cudasim::reset_peaks();
                world.all_reduce(std::span<double>(), loom::reduce_op::sum);
              }
            }
            LOOM_CUDA_TRY(cudaDeviceSynchronize());
            world.all_reduce(std::span<double>(), loom::reduce_op::sum);
            const auto mem = loom::cudasim::owner_memory("rank " + std::to_string(world.rank()));
            between[r] = mem.current - before;
            want_between[r] = pipe + stage_bytes - dm.released + dm.between_steps();
            peak[r] = mem.peak - before;
            // The peak of a step: exact on a rank of one stage (its parameters and its buckets' full
            // buffers coexist once); with several stages the next stage's gather may be in flight
            // too, so between one and two stages' worth (timing-dependent).
            if (one_stage || cf.zero != 3) {
              want_peak[r] = want_between[r] + dm.transient;
            } else {
              peak_in_bounds[r] = peak[r] > want_between[r] && peak[r] <= want_between[r] + 2 * dm.transient;
              want_peak[r] = peak[r];
            }
            sync.finish();
          };
          if (cf.adam) run(loom::adam<float>{.lr = 0.01});
          else run(loom::sgd{.lr = m.lr});
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      };
      loom_device_test::run_on(b, 4, body);
      for (std::size_t r = 0; r < 4; ++r) {
        CAPTURE(r);
        CHECK(errors[r] == "");
        CHECK(built[r] == want_built[r]);
        CHECK(between[r] == want_between[r]);
        CHECK(peak[r] == want_peak[r]);
        CHECK(peak_in_bounds[r]);
      }
      CHECK(findings() == "");
    }
}

TEST_CASE("a step copies its losses to the host once, not once per microbatch") {
  // Loss terms up to the space's limit stay on the device, one buffer per microbatch, until one
  // copy at the step's end; above it one buffer serves every microbatch, copied as it is written.
  // Both give the CPU reference's result bitwise (deterministic mode), eagerly and replayed.
  using space = loom::detail::device_space<float, loom::cuda_local::comm>;
  const int M = 8, steps = 2;
  loom::schedule s = loom::generate(loom::zb_h1{}, {.ranks = 2, .microbatches = M});
  for (int samples : {2, 16384}) {
    auto m = spec_for(s.stages, samples);
    const std::size_t width = static_cast<std::size_t>(samples) * m.width(m.layers());
    const bool kept = space::loss_buffers(M, width) == static_cast<std::size_t>(M);
    CHECK(kept == (samples == 2));  // 8 x 16384 x 3 floats are over the limit
    for (bool graph : {false, true}) {
      CAPTURE(samples);
      CAPTURE(graph);
      loom::cudasim::config c;
      c.seed = 5;
      c.trace = true;
      c.races = loom::cudasim::race_policy::fail;
      loom::cudasim::configure(c);
      auto o = run(backend::cuda_local, s, m, steps, {.deterministic = true, .graph = graph});
      REQUIRE_MESSAGE(o.ok(), o.errors());
      int per_step = 0, per_microbatch = 0;
      for (auto const& e : loom::cudasim::trace()) {
        if (e.kind != "copy") continue;
        per_step += e.label.starts_with("losses to host /");  // "region / call"
        per_microbatch += e.label.starts_with("loss to host /");
      }
      // Each step runs once (the first is captured and launched, the second replayed).
      CHECK(per_step == (kept ? steps : 0));
      CHECK(per_microbatch == (kept ? 0 : steps * M));
      CHECK(compare(o, reference(m, M, steps)).second == 0);
    }
  }
}
TEST_CASE("cuda_local orders its transfers by device flags, with no host hand-off, or by the hand-off when told") {
  // With device flags each transfer is one copy, one flag raised on the sender's stream and one
  // wait on the receiver's; without them there is no stream memory operation at all. Both give
  // the CPU reference's result bitwise, eagerly (a captured step uses the hand-off either way).
  for (const char* family : {"1f1b", "zb-v", "dualpipe"}) {
    auto s = loom::default_registry().at(family).make({4, 8, 0});
    auto m = spec_for(s.stages);
    std::size_t sends = 0;
    for (auto const& prog : loom::lower(s).programs)
      for (auto const& a : prog) sends += a.kind == loom::op::send;
    for (bool flags : {true, false}) {
      CAPTURE(std::string(family));
      CAPTURE(flags);
      loom::cudasim::config c;
      c.seed = 3;
      c.trace = true;
      loom::cudasim::configure(c);
      hooks h;
      std::atomic<int> used{0};
      h.on_local = [&](loom::cuda_local::comm& lc) {
        lc.set_device_flags(flags);
        lc.open_channels({});  // the agreement (collective): no channel of its own
        used += lc.device_flags();
      };
      const int steps = 3;  // the first uses the hand-off (lazy loading, see cuda_local.hpp)
      auto o = run(backend::cuda_local, s, m, steps, {.deterministic = true}, h);
      REQUIRE_MESSAGE(o.ok(), o.errors());
      CHECK(used == (flags ? 4 : 0));
      std::size_t waits = 0, writes = 0;
      for (auto const& e : loom::cudasim::trace()) {
        waits += e.kind == "wait value";
        writes += e.kind == "write value";
      }
      // The flagged steps' transfers, plus (dualpipe) the parameter copies' exchange after them.
      CHECK(waits == writes);
      CHECK(waits >= (flags ? (steps - 1) * sends : 0));
      if (!flags) CHECK(waits == 0);
      CHECK(compare(o, reference(m, 8, steps)).second == 0);
    }
  }
}

#endif

#if defined(LOOM_CUDA_SIM)
TEST_CASE("a cuda_local communicator assigned another frees its own scratch and streams first") {
  simulate_with(1);
  auto a = loom::cuda_local::world(1);
  auto b = loom::cuda_local::world(1);
  const auto before = loom::cudasim::device_memory(0).current;
  a[0].reserve_scratch(1000);
  b[0].reserve_scratch(3000);
  CHECK(loom::cudasim::device_memory(0).current - before == 4000);
  a[0] = std::move(b[0]);  // a's 1000 bytes go, b's 3000 now belong to a
  CHECK(loom::cudasim::device_memory(0).current - before == 3000);
  CHECK(a[0].scratch_bytes() == 3000);
  b.clear();  // the moved-from communicator owns nothing
  CHECK(loom::cudasim::device_memory(0).current - before == 3000);
  a.clear();
  CHECK(loom::cudasim::device_memory(0).current == before);
}
#endif
