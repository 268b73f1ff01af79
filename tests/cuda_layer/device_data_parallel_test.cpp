// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom::data_parallel on a device world: a dp x pp mesh on cuda_local and nccl (simulated), the
// CUDA MLP's stages (examples/02_cuda_mlp) on the pipeline, the gradient buckets in device memory
// reduced on the reducer's own stream and the optimizer on the device. Deterministic mode:
// dp2 with both replicas on the same batch and grad_scale 1/2 is bitwise dp1 (the sum of two
// equal gradients halved is exact); with different batches, ZeRO-2 is bitwise the unsharded
// reducer and both replicas hold the same parameters; dp1 is the CPU reference within fp32
// rounding. Every run under the simulator's random order and delays, race detector failing it.

#include <doctest/doctest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include <loom/exec/data_parallel.hpp>
#include <loom/mesh/mesh_comm.hpp>

#include "device_support.hpp"

namespace {

using loom_device_test::backend;

//! The CUDA MLP's stage without its own update: the reducer's optimizer updates it.
struct dp_stage : cuda_mlp::stage {
  using cuda_mlp::stage::stage;
  void update() = delete;
};
static_assert(loom::parameterized_stage<dp_stage>);

struct dp_run {
  int dp = 1;
  bool sharded = false;
  int zero_stage = 0;      // 0: `sharded` decides (ZeRO-2 or none)
  bool same_batch = true;  // every replica trains on the step's batch 0 (else replica d on batch d)
  double grad_scale = 1.0;
  bool after_step = false;                               // eager = false
  std::vector<loom::reduction_overlap>* overlaps = nullptr;  // measure: world rank 0's, per step
  std::size_t* buckets = nullptr;                        // world rank 0's bucket count
  loom::data_parallel_faults faults{};                   // deliberate bugs
};

//! Parameters per model layer after `steps` steps, from the replica `dp - 1` (and a check that
//! every replica holds the same), on `b`.
template <class Opt = loom::sgd>
std::vector<std::vector<float>> train(backend b, const loom::schedule& s, const quickstart::mlp_spec& m, int steps, dp_run r,
                                      std::string& error, Opt opt = loom::sgd{}, std::size_t* state_bytes = nullptr) {
  std::vector<std::vector<std::vector<float>>> per_replica(static_cast<std::size_t>(r.dp),
                                                           std::vector<std::vector<float>>(static_cast<std::size_t>(m.layers())));
  std::mutex mu;
  const std::size_t in0 = static_cast<std::size_t>(m.samples) * m.width(0), fin = static_cast<std::size_t>(m.samples) * m.width(m.layers());
  auto body = [&](auto& world) {
    try {
      using mesh_t = loom::mesh<loom::dp<>, loom::pp<>>;
      loom::mesh_comm g(mesh_t{loom::dp<>{r.dp}, loom::pp<>{s.ranks}}, world);
      const int d = g.coord(loom::dim::dp);
      loom::cuda::device_buffer<float> inputs(static_cast<std::size_t>(s.microbatches) * in0);
      loom::cuda::device_buffer<float> targets(static_cast<std::size_t>(s.microbatches) * fin);
      if constexpr (std::is_same_v<Opt, loom::sgd>) opt.lr = m.lr;
      loom::data_parallel<decltype(g), dp_stage, Opt> sync(
          g, {.sharded = r.sharded, .zero_stage = r.zero_stage, .deterministic = true, .eager = !r.after_step, .grad_scale = r.grad_scale, .measure = r.overlaps != nullptr, .faults = r.faults},
          opt);
      loom::pipeline p(s, g.pp(), [&](loom::stage_id id) {
        auto [a, z] = quickstart::stage_layers(m, id.stage, s.stages);
        return dp_stage(m, a, z, id.stage == s.stages - 1, targets.data());
      }, {.deterministic = true, .observer = &sync});
      sync.attach(p);
      for (int i = 0; i < steps; ++i) {
        auto data = cuda_mlp::float_batch(m, s.microbatches, r.same_batch ? i : i + 1000 * d);
        loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
        loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
        (void)p.step(std::span<const float>(inputs.span()));
        if (r.overlaps != nullptr && g.rank() == 0) r.overlaps->push_back(sync.overlap());
      }
      if (r.buckets != nullptr && g.rank() == 0) *r.buckets = sync.report().size();
      sync.finish();
      std::lock_guard lk(mu);
      if constexpr (requires { sync.optimizer().state_bytes(); })
        if (state_bytes != nullptr && g.rank() == 0) *state_bytes = sync.optimizer().state_bytes();
      for (auto& st : p.stages())
        for (int l = st.first_layer(); l < st.last_layer(); ++l)
          per_replica[static_cast<std::size_t>(d)][static_cast<std::size_t>(l)] = st.layer_params(l);
    } catch (const std::exception& e) {
      std::lock_guard lk(mu);
      if (error.empty()) error = e.what();
    }
  };
  const int n = r.dp * s.ranks;
  if (b == backend::cuda_local) loom::cuda_local::run(n, body, 0, std::chrono::milliseconds(20000));
  else loom::nccl::run(n, body, std::chrono::milliseconds(20000));
  for (std::size_t d = 1; d < per_replica.size(); ++d) CHECK(per_replica[d] == per_replica[0]);
  return per_replica.back();
}

loom::schedule family(const char* name, int ranks, int microbatches) {
  for (auto const& e : loom::default_registry().entries())
    if (e.name == name) return e.make(e.resolve({.ranks = ranks, .microbatches = microbatches}));
  FAIL("no family " << name);
  return {};
}

}  // namespace

TEST_CASE("data_parallel on a device world: dp2 x pp2 equals dp1 bitwise, ZeRO-2 equals plain, race detector silent") {
  const int steps = 3;
  for (const char* fam : {"1f1b", "zb-h1"}) {
    const auto s = family(fam, 2, 4);
    const auto m = loom_device_test::spec_for(s.stages);
    for (backend b : {backend::cuda_local, backend::nccl}) {
      CAPTURE(fam);
      CAPTURE(loom_device_test::name(b));
      if (loom_device_test::skip_unless_devices(b, 4)) continue;
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        CAPTURE(seed);
        loom_device_test::simulate_with(seed);
        std::string e1, e2, e3, e4;
        const auto one = train(b, s, m, steps, {.dp = 1}, e1);
        const auto same = train(b, s, m, steps, {.dp = 2, .same_batch = true, .grad_scale = 0.5}, e2);
        const auto plain = train(b, s, m, steps, {.dp = 2, .same_batch = false, .grad_scale = 0.5}, e3);
        const auto zero = train(b, s, m, steps, {.dp = 2, .sharded = true, .same_batch = false, .grad_scale = 0.5}, e4);
        CHECK(e1 == "");
        CHECK(e2 == "");
        CHECK(e3 == "");
        CHECK(e4 == "");
        CHECK(same == one);
        CHECK(zero == plain);
        CHECK(plain != one);  // the second replica's batch changed the update
        CHECK(loom_device_test::findings() == "");
        // dp1 against the CPU reference (its update fuses the multiply-add: fp32 rounding apart).
        const auto ref = loom_device_test::reference(m, s.microbatches, steps);
        double worst = 0;
        for (std::size_t l = 0; l < one.size(); ++l)
          for (std::size_t i = 0; i < one[l].size(); ++i)
            worst = std::max(worst, std::abs(double(one[l][i]) - ref.params[l][i]) / std::max(1e-3, std::abs(double(ref.params[l][i]))));
        CHECK(worst < 1e-4);
      }
    }
  }
}

TEST_CASE("data_parallel on dp4: nccl's rank-ordered device sums equal cuda_local's bitwise, ZeRO-2 equals plain") {
  const int steps = 2;
  const auto s = family("1f1b", 1, 2);
  const auto m = loom_device_test::spec_for(s.stages);
  if (loom_device_test::skip_unless_devices(backend::nccl, 4)) return;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    loom_device_test::simulate_with(seed);
    std::string e1, e2, e3, e4;
    const auto local = train(backend::cuda_local, s, m, steps, {.dp = 4, .same_batch = false, .grad_scale = 0.25}, e1);
    const auto local_zero = train(backend::cuda_local, s, m, steps, {.dp = 4, .sharded = true, .same_batch = false, .grad_scale = 0.25}, e2);
    const auto nccl = train(backend::nccl, s, m, steps, {.dp = 4, .same_batch = false, .grad_scale = 0.25}, e3);
    const auto nccl_zero = train(backend::nccl, s, m, steps, {.dp = 4, .sharded = true, .same_batch = false, .grad_scale = 0.25}, e4);
    CHECK(e1 == "");
    CHECK(e2 == "");
    CHECK(e3 == "");
    CHECK(e4 == "");
    CHECK(nccl == local);
    CHECK(local_zero == local);
    CHECK(nccl_zero == local);
    CHECK(loom_device_test::findings() == "");
  }
}

TEST_CASE("data_parallel with Adam on a device world: ZeRO-2 equals plain and nccl equals cuda_local bitwise, and the shard's moments are half") {
  const int steps = 3;
  const auto s = family("zb-h1", 2, 4);
  const auto m = loom_device_test::spec_for(s.stages);
  if (loom_device_test::skip_unless_devices(backend::nccl, 4)) return;
  const loom::adam<float> adam{.lr = 0.01};
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    loom_device_test::simulate_with(seed);
    std::string e1, e2, e3, e4;
    std::size_t plain_bytes = 0, zero_bytes = 0;
    const auto local = train(backend::cuda_local, s, m, steps, {.dp = 2, .same_batch = false, .grad_scale = 0.5}, e1, adam, &plain_bytes);
    const auto local_zero =
        train(backend::cuda_local, s, m, steps, {.dp = 2, .sharded = true, .same_batch = false, .grad_scale = 0.5}, e2, adam, &zero_bytes);
    const auto nccl = train(backend::nccl, s, m, steps, {.dp = 2, .same_batch = false, .grad_scale = 0.5}, e3, adam);
    const auto nccl_zero = train(backend::nccl, s, m, steps, {.dp = 2, .sharded = true, .same_batch = false, .grad_scale = 0.5}, e4, adam);
    CHECK(e1 == "");
    CHECK(e2 == "");
    CHECK(e3 == "");
    CHECK(e4 == "");
    CHECK(local_zero == local);
    CHECK(nccl == local);
    CHECK(nccl_zero == local);
    CHECK(loom_device_test::findings() == "");
    // Rank 0's moments: its stages' parameters twice, or the shard's (half, one padding element).
    CHECK(plain_bytes > 0);
    CHECK((zero_bytes * 2 >= plain_bytes && zero_bytes * 2 <= plain_bytes + 2 * 2 * sizeof(float)));
    // And Adam moved the parameters differently from SGD.
    std::string e5;
    CHECK(train(backend::cuda_local, s, m, steps, {.dp = 2, .same_batch = false, .grad_scale = 0.5}, e5) != local);
  }
}

TEST_CASE("data_parallel measures on a device how much of its reductions the pipeline hid: none when they run after the step") {
  const auto s = family("1f1b", 2, 4);
  const auto m = loom_device_test::spec_for(s.stages);
  for (backend b : {backend::cuda_local, backend::nccl}) {
    CAPTURE(loom_device_test::name(b));
    if (loom_device_test::skip_unless_devices(b, 4)) continue;
    for (std::uint64_t seed = 1; seed <= 5; ++seed) {
      CAPTURE(seed);
      loom_device_test::simulate_with(seed);
      std::string e1, e2, e3;
      std::vector<loom::reduction_overlap> after, eager, single;
      std::size_t buckets = 0;
      (void)train(b, s, m, 2, {.dp = 2, .same_batch = false, .grad_scale = 0.5, .after_step = true, .overlaps = &after, .buckets = &buckets}, e1);
      (void)train(b, s, m, 2, {.dp = 2, .same_batch = false, .grad_scale = 0.5, .overlaps = &eager}, e2);
      (void)train(b, s, m, 2, {.dp = 1, .overlaps = &single}, e3);
      CHECK(e1 == "");
      CHECK(e2 == "");
      CHECK(e3 == "");
      REQUIRE(after.size() == 2);
      REQUIRE(eager.size() == 2);
      REQUIRE(single.size() == 2);
      CHECK(buckets > 0);
      for (std::size_t i = 0; i < 2; ++i) {
        CAPTURE(i);
        // Reduced after the pipeline's work: every second of it is exposed (the float
        // milliseconds of several events summed against one: a rounding's slack).
        CHECK(after[i].buckets == static_cast<int>(buckets));
        CHECK(after[i].reduce_seconds >= 0);
        CHECK(after[i].exposed_seconds >= after[i].reduce_seconds * (1 - 1e-4));
        CHECK(after[i].hidden() <= 1e-4);
        CHECK(eager[i].buckets == static_cast<int>(buckets));
        CHECK((eager[i].hidden() >= 0.0 && eager[i].hidden() <= 1.0));
        // A group of one rank reduces nothing: nothing measured, nothing exposed.
        CHECK(single[i].buckets == 0);
        CHECK(single[i].exposed_seconds == 0.0);
        CHECK(single[i].hidden() == 1.0);
      }
      CHECK(loom_device_test::findings() == "");
    }
  }
}

#if defined(LOOM_CUDA_SIM)
// The reducer's two orderings on a device, removed one at a time (data_parallel_faults). The
// race detector records each on every configuration and seed here; the host call that first
// synchronises with both operations reports it (for the update's, `finish()`'s wait for the
// communication stream: nothing else in a step waits for that stream).
TEST_CASE("a bucket packed before its stages' last W, an update before the reduction ends, or ZeRO-3 parameters unpacked before their gather, is a race naming both operations") {
  struct broken {
    const char* what;
    loom::data_parallel_faults faults;
    const char* reducer;  // the reducer's operation the report must name
    const char* other;    // and a word of the other one
    int zero_stage = 0;
    // Or, where the unordered operation may also outlive the buffer it writes: a use-after-free
    // report naming this buffer (the transient gather buffer is freed on the compute stream,
    // which no longer waits for the gather).
    const char* freed = nullptr;
  };
  const broken variants[] = {
      {"bucket does not wait for W", {.skip_bucket_wait = true}, "dp bucket pack on stream 'r", " compute'"},
      {"update does not wait for the reduction", {.skip_update_wait = true}, "dp gradient scale on stream 'r", " dp'"},
      {"ZeRO-3 unpack does not wait for the gather", {.skip_gather_wait = true}, "dp parameters unpack on stream 'r", " dp'", 3,
       "all_gather"},
  };
  for (const broken& v : variants)
    for (const char* fam : {"1f1b", "zb-h1", "interleaved-1f1b"})
      for (backend b : {backend::cuda_local, backend::nccl}) {
        CAPTURE(std::string(v.what));
        CAPTURE(std::string(fam));
        CAPTURE(std::string(loom_device_test::name(b)));
        const auto s = family(fam, 2, 4);
        const auto m = loom_device_test::spec_for(s.stages);
        for (std::uint64_t seed = 1; seed <= 3; ++seed) {
          CAPTURE(seed);
          loom_device_test::simulate_with(seed);
          std::string e;
          (void)train(b, s, m, 2, {.dp = 2, .zero_stage = v.zero_stage, .same_batch = false, .grad_scale = 0.5, .faults = v.faults}, e);
          CAPTURE(e);
          const bool race = e.find("race: ") != std::string::npos && e.find(v.reducer) != std::string::npos &&
                            e.find(v.other) != std::string::npos && e.find("neither is ordered before the other") != std::string::npos;
          // (cuda_local names its gather "cuda_local all_gather", NCCL "ncclAllGather")
          const bool freed = v.freed != nullptr && e.find("use after free: ") != std::string::npos &&
                             (e.find(v.freed) != std::string::npos || e.find("ncclAllGather") != std::string::npos) &&
                             e.find("dp bucket parameters (ZeRO-3, transient)") != std::string::npos;
          CHECK((race || freed));
        }
      }
}
#endif
