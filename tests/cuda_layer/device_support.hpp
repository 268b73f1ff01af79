// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the device-layer tests: train the CUDA MLP (examples/02_cuda_mlp) through
// loom::pipeline on cuda_local or nccl and compare with its fp32 CPU reference. The same
// sources are built against loom's CUDA simulator (always) and against the real runtime (label
// gpu), where a test without the devices it needs prints "SKIPPED: <reason>" (ctest reports it as
// skipped) instead of passing.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <loom/comm/cuda_local.hpp>
#include <loom/comm/nccl.hpp>
#include <loom/cuda/buffer.hpp>
#include <loom/cuda/device.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>
#if defined(LOOM_CUDA_SIM)
#include <loom/cudasim/sim.hpp>
#endif

#include "../../examples/02_cuda_mlp/reference.hpp"
#include "../../examples/02_cuda_mlp/stage.hpp"

namespace loom_device_test {

enum class backend { cuda_local, nccl };
inline const char* name(backend b) { return b == backend::cuda_local ? "cuda_local" : "nccl"; }

//! A model deep enough for S virtual stages (at least one layer per stage), with uneven widths.
inline quickstart::mlp_spec spec_for(int stages, int samples = 2) {
  quickstart::mlp_spec m;
  const int L = std::max(6, stages);
  m.widths.clear();
  m.widths.push_back(4);
  for (int l = 1; l < L; ++l) m.widths.push_back(3 + (l * 5) % 4);
  m.widths.push_back(3);
  m.samples = samples;
  return m;
}

//! Runs `body(comm&)` on every rank of an `n`-rank world of `b` (ranks as threads).
template <class F>
void run_on(backend b, int n, F&& body) {
  if (b == backend::cuda_local) loom::cuda_local::run(n, body);
  else loom::nccl::run(n, body);
}

//! Whether the devices `b` needs for `ranks` ranks are here; the reason when not.
inline std::string missing_devices(backend b, int ranks) {
  auto a = loom::cuda::available();
  if (!a) return a.why;
  if (b == backend::nccl && a.devices < ranks)
    return "nccl with " + std::to_string(ranks) + " ranks needs " + std::to_string(ranks) + " devices, " + std::to_string(a.devices) + " present";
  return {};
}

//! What the current test case ran on devices and what it could not run (device_skips.cpp reads
//! it when the test case ends: "SKIPPED: <reason>", the line ctest's skip expression matches,
//! only when no part ran, so that a test whose cuda_local part ran and failed is not reported
//! skipped because its nccl part needed more GPUs).
struct device_parts {
  int ran = 0;
  std::vector<std::string> missing;
};
inline device_parts& parts() {
  static device_parts p;
  return p;
}

//! Says whether to skip a part of a test that needs `ranks` ranks on `b`, and records which.
inline bool skip_unless_devices(backend b, int ranks) {
  auto why = missing_devices(b, ranks);
  if (why.empty()) {
    ++parts().ran;
    return false;
  }
  parts().missing.push_back(std::move(why));
  return true;
}

//! What one rank saw.
struct rank_outcome {
  std::string error;     //!< what() of the exception that ended the run, or empty
  int error_rank = -2;   //!< pipeline_error::rank(), or -2
  double seconds = 0;    //!< time from the first step to the end (or the error)
};

//! The result of a run: losses per step, final parameters per layer, what every rank saw.
struct outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  std::vector<rank_outcome> ranks;
  std::size_t buffer_bytes = 0;  //!< rank 0's pipeline buffers
  bool ok() const {
    for (auto& r : ranks)
      if (!r.error.empty()) return false;
    return true;
  }
  std::string errors() const {
    std::string s;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      if (!ranks[r].error.empty()) s += "[rank " + std::to_string(r) + "] " + ranks[r].error + "\n";
    return s;
  }
};

//! Hooks of a run: `adjust(rank, stage)` changes a stage after it is built (fault injection),
//! `on_comm(rank, comm)` sees the communicator (nccl only) before the pipeline.
struct hooks {
  std::function<void(int, cuda_mlp::stage&)> adjust;
  std::function<void(int, ncclComm_t)> on_comm;
  std::function<void(loom::cuda_local::comm&)> on_local;  //!< before the pipeline is built
  std::function<void(int step, int rank, cuda_mlp::stage&)> before_step;  //!< before each step, on each stage of the rank
  std::function<void(int rank, std::span<const loom::measured_action>)> on_timeline;  //!< after the last step: the rank's timeline
  std::chrono::milliseconds timeout{20000};
};

//! Trains `steps` steps of `s` on `b` with options `opt`; every rank's failure is caught and kept.
inline outcome run(backend b, const loom::schedule& s, const quickstart::mlp_spec& m, int steps, loom::pipeline_options opt,
                   const hooks& h = {}) {
  outcome out;
  out.losses.assign(static_cast<std::size_t>(steps), 0.0);
  out.params.assign(static_cast<std::size_t>(m.layers()), {});
  out.ranks.assign(static_cast<std::size_t>(s.ranks), {});
  opt.timeout = h.timeout;
  std::mutex mu;
  const std::size_t in0 = static_cast<std::size_t>(m.samples) * m.width(0), fin = static_cast<std::size_t>(m.samples) * m.width(m.layers());
  auto body = [&](auto& c) {
    auto& me = out.ranks[static_cast<std::size_t>(c.rank())];
    auto t0 = std::chrono::steady_clock::now();
    try {
      // Two batch buffers used in turn: a captured step (graph mode) must read each step's batch.
      loom::cuda::device_buffer<float> batches[2] = {loom::cuda::device_buffer<float>(static_cast<std::size_t>(s.microbatches) * in0),
                                                     loom::cuda::device_buffer<float>(static_cast<std::size_t>(s.microbatches) * in0)};
      loom::cuda::device_buffer<float> targets(static_cast<std::size_t>(s.microbatches) * fin);
      loom::pipeline p(s, c, [&](loom::stage_id id) {
        auto [a, z] = quickstart::stage_layers(m, id.stage, s.stages);
        cuda_mlp::stage st(m, a, z, id.stage == s.stages - 1, targets.data());
        if (h.adjust) h.adjust(c.rank(), st);
        return st;
      }, opt);
      if (c.rank() == 0) out.buffer_bytes = p.buffer_bytes();
      for (int i = 0; i < steps; ++i) {
        auto data = cuda_mlp::float_batch(m, s.microbatches, i);
        auto& inputs = batches[i % 2];
        loom::cuda::copy_to_device(inputs.span(), std::span<const float>(data.inputs));
        loom::cuda::copy_to_device(targets.span(), std::span<const float>(data.targets));
        if (h.before_step)
          for (auto& st : p.stages()) h.before_step(i, c.rank(), st);
        auto r = p.step(std::span<const float>(inputs.span()));
        if (c.rank() == 0) out.losses[static_cast<std::size_t>(i)] = r.loss;
      }
      if (h.on_timeline) h.on_timeline(c.rank(), p.last_timeline());
      std::lock_guard lk(mu);
      for (auto& st : p.stages())
        for (int l = st.first_layer(); l < st.last_layer(); ++l)
          if (out.params[static_cast<std::size_t>(l)].empty()) out.params[static_cast<std::size_t>(l)] = st.layer_params(l);
    } catch (const loom::pipeline_error& e) {
      me.error = e.what();
      me.error_rank = e.rank();
    } catch (const std::exception& e) {
      me.error = e.what();
    }
    me.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (b == backend::cuda_local) {
    loom::cuda_local::run(s.ranks, [&](loom::cuda_local::comm& c) {
      if (h.on_local) h.on_local(c);
      body(c);
    }, 0, h.timeout);
  } else {
    loom::nccl::run(s.ranks, [&](loom::nccl::comm& c) {
      if (h.on_comm) h.on_comm(c.rank(), c.get());
      body(c);
    }, h.timeout);
  }
  return out;
}

//! The CPU reference of `steps` steps.
inline cuda_mlp::reference reference(const quickstart::mlp_spec& m, int microbatches, int steps) {
  cuda_mlp::reference ref(m);
  for (int i = 0; i < steps; ++i) ref.step(m, microbatches, cuda_mlp::float_batch(m, microbatches, i), 1.0 / microbatches);
  return ref;
}

//! Largest relative difference of the parameters, and the number of values that differ bitwise.
inline std::pair<double, long> compare(const outcome& o, const cuda_mlp::reference& ref) {
  double worst = 0;
  long differ = 0;
  for (std::size_t l = 0; l < ref.params.size(); ++l) {
    auto const& a = o.params[l];
    auto const& b = ref.params[l];
    if (a.size() != b.size()) return {1e30, 1 << 30};
    double d = 0, n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
      n = std::max(n, static_cast<double>(std::abs(b[i])));
      differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    }
    worst = std::max(worst, n > 0 ? d / n : d);
  }
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    const double rel = std::abs(o.losses[i] - ref.losses[i]) / std::max(std::abs(ref.losses[i]), 1e-300);
    worst = std::max(worst, rel);
    differ += std::memcmp(&o.losses[i], &ref.losses[i], sizeof(double)) != 0;
  }
  return {worst, differ};
}

//! Simulator: a fresh configuration (seeded order and delays, races fail the step).
inline void simulate_with(std::uint64_t seed, int deadlock_ms = 3000) {
#if defined(LOOM_CUDA_SIM)
  loom::cudasim::config c;
  c.seed = seed;
  c.races = loom::cudasim::race_policy::fail;
  // LOOM_CUDASIM_ACTUAL=0 turns actual-access tracking off (to measure what it costs).
  const char* actual = std::getenv("LOOM_CUDASIM_ACTUAL");
  c.actual_accesses = actual == nullptr || std::string_view(actual) != "0";
  c.deadlock_after = std::chrono::milliseconds(deadlock_ms);
  loom::cudasim::configure(c);
#else
  (void)seed;
  (void)deadlock_ms;
#endif
}

//! Simulator: every finding since the last configuration, as text.
inline std::string findings() {
  std::string s;
#if defined(LOOM_CUDA_SIM)
  for (auto& r : loom::cudasim::reports()) {
    const std::string kind = std::string(loom::cudasim::to_string(r.kind)) + ": ";
    s += (r.text.starts_with(kind) ? "" : kind) + r.text + "\n";  // the text may name its kind already
  }
#endif
  return s;
}

//! Copies `v` into `d` on `st` (the producer the collective must follow); `v` must stay alive
//! until `st` has run the copy.
template <class T>
void upload(std::span<T> d, const std::vector<T>& v, cudaStream_t st) {
  LOOM_CUDA_TRY(cudaMemcpyAsync(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, st));
}
//! Device memory holding `v`, filled by a copy on `st` (see the other overload).
template <class T>
loom::cuda::device_buffer<T> upload(const std::vector<T>& v, cudaStream_t st) {
  loom::cuda::device_buffer<T> d(v.size());
  upload(d.span(), v, st);
  return d;
}
//! The first `n` elements of `d` (all of them by default), once `st` has run its work so far.
template <class T>
std::vector<T> download(const loom::cuda::device_buffer<T>& d, cudaStream_t st, std::size_t n = std::size_t(-1)) {
  std::vector<T> v(std::min(n, d.span().size()));
  LOOM_CUDA_TRY(cudaMemcpyAsync(v.data(), d.data(), v.size() * sizeof(T), cudaMemcpyDeviceToHost, st));
  LOOM_CUDA_TRY(cudaStreamSynchronize(st));
  return v;
}

}  // namespace loom_device_test
