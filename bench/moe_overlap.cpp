// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// FSMoE's overlap on a device (loom/cuda/moe.hpp): one MoE exchange with linear experts (loom's
// device linear kernel) on `ep` cuda_local ranks, as streams of the device(s) present, either
// unchunked (ep_to_experts, the experts, ep_from_experts on one stream) or overlapped in `chunks`
// pieces (ep_overlapped: the pieces' all-to-alls on a communication stream, ordered by events,
// while the experts compute). Time: world rank 0's wall time per exchange, the device drained
// (mean over the timed exchanges). Built twice: against loom's CUDA simulator (moe_overlap: a
// smoke run at small sizes, no meaningful time) and against a GPU (moe_overlap_gpu, run by
// scripts/gpu-check.sh bench). Arguments: ep, chunks (0: unchunked), capacity C; E = 2 ep
// experts, width h (256 on a GPU, 8 simulated).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <span>

#include <loom/comm/cuda_local.hpp>
#include <loom/cuda/buffer.hpp>
#include <loom/cuda/moe.hpp>
#include <loom/cuda/patterns.hpp>
#include <loom/cuda/stream.hpp>

namespace {

#if defined(LOOM_CUDA_SIM)
constexpr std::size_t width = 8;
#else
constexpr std::size_t width = 256;
#endif

//! Mean seconds per exchange on world rank 0 (see the file comment).
double run(int ep, int chunks, std::size_t capacity, int warmup, int timed) {
  double seconds = 0;
  loom::cuda_local::run(ep, [&](loom::cuda_local::comm& w) {
    using G = loom::on_stream<loom::cuda_local::comm>;
    loom::cuda::stream compute, exchange;
    G g(w, compute.get()), x(w, exchange.get());
    loom::ep_group<G> grp{&g, nullptr, nullptr, &x};
    const int E = 2 * ep, El = E / ep;
    const std::size_t h = width, all = static_cast<std::size_t>(E) * capacity * h, rows = static_cast<std::size_t>(ep) * capacity;
    loom::cuda::device_buffer<float> slots(all), back(all), rin(all), rout(all), scratch(4 * all), weights(static_cast<std::size_t>(El) * h * h);
    for (auto* b : {&slots, &rin, &rout, &weights}) loom::cuda::detail::fill_async(b->data(), 0.01f, b->size(), compute.get());
    const loom::cuda::linear_kernel k{compute.get()};
    auto weight = [&](int e) { return std::span<const float>(weights.data() + static_cast<std::size_t>(e) * h * h, h * h); };
    auto expert = [&](int e, std::span<const float> in, std::span<float> out, std::size_t n) { k.forward(in, weight(e), {}, out, n, h, h); };
    auto once = [&] {
      if (chunks == 0) {
        loom::ep_to_experts(grp, E, std::span<const float>(slots.span()), scratch.span().first(all), rin.span());
        for (int e = 0; e < El; ++e) {
          const std::size_t at = static_cast<std::size_t>(e) * rows * h;
          expert(e, std::span<const float>(rin.span().subspan(at, rows * h)), rout.span().subspan(at, rows * h), rows);
        }
        loom::ep_from_experts(grp, E, std::span<const float>(rout.span()), scratch.span().first(all), back.span());
      } else {
        loom::ep_overlapped(grp, E, capacity, h, chunks, std::span<const float>(slots.span()), back.span(), rin.span(), rout.span(), scratch.span(),
                            expert);
      }
    };
    for (int i = 0; i < warmup; ++i) once();
    LOOM_CUDA_TRY(cudaStreamSynchronize(compute.get()));
    w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank ready
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < timed; ++i) once();
    LOOM_CUDA_TRY(cudaStreamSynchronize(compute.get()));
    const auto t1 = std::chrono::steady_clock::now();
    if (w.rank() == 0) seconds = std::chrono::duration<double>(t1 - t0).count() / timed;
    w.all_reduce(std::span<std::int64_t>(), loom::reduce_op::sum);  // every rank done before the buffers go
  });
  return seconds;
}

void BM_moe_exchange(benchmark::State& st) {
  const int ep = static_cast<int>(st.range(0)), chunks = static_cast<int>(st.range(1));
  const auto capacity = static_cast<std::size_t>(st.range(2));
  for (auto _ : st) st.SetIterationTime(run(ep, chunks, capacity, 2, 5));
  st.counters["ep"] = ep;
  st.counters["chunks"] = chunks;
  st.counters["C"] = static_cast<double>(capacity);
  st.counters["h"] = static_cast<double>(width);
  // Bytes each rank sends per exchange: two all-to-alls of E C h floats, (ep - 1)/ep of them away.
  st.counters["bytes_out"] = 2.0 * 2 * ep * static_cast<double>(capacity * width) * sizeof(float) * (ep - 1) / ep;
}

#if defined(LOOM_CUDA_SIM)
BENCHMARK(BM_moe_exchange)->Args({2, 0, 8})->Args({2, 2, 8})->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
#else
BENCHMARK(BM_moe_exchange)
    ->Args({2, 0, 1024})->Args({2, 2, 1024})->Args({2, 4, 1024})
    ->Args({4, 0, 512})->Args({4, 2, 512})->Args({4, 4, 512})
    ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
#endif

}  // namespace

BENCHMARK_MAIN();
