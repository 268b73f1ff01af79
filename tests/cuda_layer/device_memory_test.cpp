// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Device memory: what the pipeline allocates on each rank's device is exactly what the buffer
// plan predicts (slots times the stages' sizes), its stash is the simulator's peak activation
// (the memory model) on ranks holding one stage, and steps allocate nothing more.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <vector>

#include "device_support.hpp"

using namespace loom_device_test;

#if defined(LOOM_CUDA_SIM)
namespace {

//! Bytes the buffer plan predicts for `rank`: every slot of every local stage at the stages'
//! sizes, the buffers received from the other copy, the loss-term buffers (one per microbatch
//! up to the space's limit), the loss seed and the discarded input gradient.
std::size_t predicted_bytes(const loom::schedule& s, int rank, const quickstart::mlp_spec& m, bool det) {
  auto lowered = loom::lower(s);
  auto plan = loom::plan_buffers(lowered, rank);
  std::size_t elems = 0, out_last = 0, in_first = 0;
  for (auto const& l : plan.local) {
    auto [a, b] = quickstart::stage_layers(m, l.id.stage, s.stages);
    cuda_mlp::stage probe_size_only(m, a, b, l.id.stage == s.stages - 1, nullptr);
    const std::size_t in = probe_size_only.input_size(), out = probe_size_only.output_size(), stash = probe_size_only.stash_size();
    const std::size_t wg = probe_size_only.weight_grad().size();
    elems += static_cast<std::size_t>(l.input) * in + static_cast<std::size_t>(l.stash) * stash + static_cast<std::size_t>(l.grad) * out +
             static_cast<std::size_t>(l.send_act) * out + static_cast<std::size_t>(l.send_grad) * in +
             (det ? static_cast<std::size_t>(l.wgrad) * wg : 0);
    const int twin = s.directions == 2 ? s.stage_to_rank[static_cast<std::size_t>((1 - l.id.direction) * s.stages + l.id.stage)] : -1;
    if (twin >= 0 && twin != rank) elems += static_cast<std::size_t>(det ? l.copy_recv : 1) * wg;
    if (l.id.stage == s.stages - 1) out_last = std::max(out_last, out);
    if (l.id.stage == 0) in_first = std::max(in_first, in);
  }
  // Loss terms: one buffer per microbatch on a device (copied to the host once per step) unless
  // they would take more than the space's limit, then one for all.
  const auto m_loss = static_cast<std::size_t>(s.microbatches);
  const std::size_t loss_bufs = m_loss * out_last * sizeof(float) <= loom::detail::device_space<float, loom::nccl::comm>::max_kept_loss_bytes ? m_loss : 1;
  return (elems + (loss_bufs + 1) * out_last + in_first) * sizeof(float);
}

}  // namespace

TEST_CASE("peak device memory of every rank equals the buffer plan's prediction for every family at P = 4") {
  for (bool det : {false, true})
    for (auto const& e : loom::default_registry().entries()) {
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
