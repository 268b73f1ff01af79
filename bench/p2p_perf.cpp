// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// p2p_perf: the point-to-point pattern of a schedule, nccl-tests style. The pipeline runs the
// schedule's lowered program with stages that compute nothing: each forward fills its output
// with a pattern (cudaMemsetAsync) and each stage keeps a copy of what it received, so every
// byte the schedule transfers is moved and (-c 1) checked. Sizes from -b to -e bytes (factor
// -f) per activation/gradient message; -n timed steps after -w warm-up steps; -G 1 replays the
// step from a CUDA graph. Columns: size (bytes per message), count (floats), time (us per step,
// slowest rank, median of -n), algbw (bytes sent per rank per second, GB/s), busbw (= algbw:
// each byte of a point-to-point message crosses one link), #wrong (bytes that differ from the
// pattern, all ranks). Built against a GPU (p2p_perf_gpu) and against loom's CUDA simulator
// (p2p_perf, which checks the pattern; its timings are the simulator's, not a GPU's).
//
//   p2p_perf_gpu -s zb-h1 -p 1 -m 8 -B cuda_local -b 1K -e 256M -f 4
//   p2p_perf_gpu -s dualpipe-v -p 8 -m 16 -B nccl -b 64K -e 1G -f 2 -G 1
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <loom/comm/cuda_local.hpp>
#include <loom/comm/nccl.hpp>
#include <loom/cuda/device.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>
#if defined(LOOM_CUDA_SIM)
#include <loom/cudasim/sim.hpp>
#endif

namespace {

struct options {
  std::string schedule = "1f1b", backend = "cuda_local";
  int ranks = 2, microbatches = 8, chunks = 0, iters = 20, warmup = 5, check = 1, graph = 0;
  std::size_t min_bytes = 1024, max_bytes = 1 << 24, factor = 4;
};

std::size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<std::size_t>(v);
}

unsigned char act_byte(int mb, int s) { return static_cast<unsigned char>(1 + (mb * 31 + s * 7) % 251); }
unsigned char grad_byte(int mb, int s) { return static_cast<unsigned char>(1 + (mb * 17 + s * 13 + 101) % 251); }

//! A stage that computes nothing: it writes a pattern and keeps what it received.
struct pattern_stage {
  using value_type = float;
  std::size_t n = 1;
  int S = 1, M = 1, stage = 0;
  loom::cuda::device_buffer<float> grad{1}, got_act, got_grad;
  pattern_stage(std::size_t count, int stages, int microbatches, int s)
      : n(count), S(stages), M(microbatches), stage(s), got_act(count * static_cast<std::size_t>(microbatches)),
        got_grad(count * static_cast<std::size_t>(microbatches)) {}
  std::size_t input_size() const { return n; }
  //! The last stage's output is the loss (one float): its terms are copied to the host and summed
  //! every step, which is not the point-to-point pattern being measured.
  std::size_t output_size() const { return stage == S - 1 ? 1 : n; }
  std::size_t stash_size() const { return 0; }
  std::span<float> weight_grad() { return grad.span(); }
  void forward(const loom::stage_context& c, loom::forward_buffers<float> b) {
    if (c.stage > 0)
      LOOM_CUDA_TRY(cudaMemcpyAsync(got_act.data() + static_cast<std::size_t>(c.microbatch) * n, b.input.data(), n * 4, cudaMemcpyDeviceToDevice, c.stream));
    LOOM_CUDA_TRY(cudaMemsetAsync(b.output.data(), act_byte(c.microbatch, c.stage), b.output.size_bytes(), c.stream));
  }
  void backward_input(const loom::stage_context& c, loom::backward_buffers<float> b) {
    if (!c.last())
      LOOM_CUDA_TRY(cudaMemcpyAsync(got_grad.data() + static_cast<std::size_t>(c.microbatch) * n, b.output_grad.data(), n * 4, cudaMemcpyDeviceToDevice, c.stream));
    LOOM_CUDA_TRY(cudaMemsetAsync(b.input_grad.data(), grad_byte(c.microbatch, c.stage), b.input_grad.size_bytes(), c.stream));
  }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<float>) {}
  void backward(const loom::stage_context& c, loom::backward_buffers<float> b) { backward_input(c, b); }
  //! Bytes of what this stage received that differ from the pattern.
  long wrong(const loom::schedule& s, int dir) const {
    std::vector<unsigned char> a(n * 4 * static_cast<std::size_t>(M)), g(a.size());
    LOOM_CUDA_TRY(cudaMemcpy(a.data(), got_act.data(), a.size(), cudaMemcpyDeviceToHost));
    LOOM_CUDA_TRY(cudaMemcpy(g.data(), got_grad.data(), g.size(), cudaMemcpyDeviceToHost));
    long bad = 0;
    for (int mb = 0; mb < M; ++mb) {
      if (s.direction_of(mb) != dir) continue;
      for (std::size_t i = 0; i < n * 4; ++i) {
        const std::size_t k = static_cast<std::size_t>(mb) * n * 4 + i;
        if (stage > 0 && a[k] != act_byte(mb, stage - 1)) ++bad;
        if (stage + 1 < S && g[k] != grad_byte(mb, stage + 1)) ++bad;
      }
    }
    return bad;
  }
};

struct result {
  double us = 0;
  long wrong = 0;
  double bytes_per_rank = 0;
};

template <class Comm>
result measure(Comm& c, const loom::schedule& s, std::size_t bytes, const options& o) {
  const std::size_t n = std::max<std::size_t>(bytes / 4, 1);
  loom::cuda::device_buffer<float> in(n * static_cast<std::size_t>(s.microbatches));
  loom::pipeline p(s, c, [&](loom::stage_id id) { return pattern_stage(n, s.stages, s.microbatches, id.stage); },
                   {.graph = o.graph != 0});
  for (int i = 0; i < o.warmup; ++i) p.step(std::span<const float>(in.span()));
  std::vector<double> t;
  for (int i = 0; i < o.iters; ++i) t.push_back(p.step(std::span<const float>(in.span())).seconds);
  std::sort(t.begin(), t.end());
  std::vector<double> worst{t[t.size() / 2]};
  c.all_reduce(std::span<double>(worst), loom::reduce_op::max);
  long bad = 0;
  if (o.check)
    for (std::size_t i = 0; i < p.stages().size(); ++i) bad += p.stages()[i].wrong(s, p.ids()[i].direction);
  std::vector<std::int64_t> w{bad};
  c.all_reduce(std::span<std::int64_t>(w), loom::reduce_op::sum);
  std::int64_t sends = 0;
  for (auto const& prog : p.lowered().programs)
    for (auto const& a : prog) sends += a.kind == loom::op::send;
  return {worst[0] * 1e6, static_cast<long>(w[0]), static_cast<double>(sends) * static_cast<double>(n * 4) / s.ranks};
}

int usage() {
  std::fprintf(stderr, "usage: p2p_perf [-s schedule] [-p ranks] [-m microbatches] [-C chunks] [-B cuda_local|nccl] "
                       "[-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-c 0|1] [-G 0|1]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "-s") o.schedule = v;
    else if (a == "-p") o.ranks = std::atoi(v);
    else if (a == "-m") o.microbatches = std::atoi(v);
    else if (a == "-C") o.chunks = std::atoi(v);
    else if (a == "-B") o.backend = v;
    else if (a == "-b") o.min_bytes = parse_size(v);
    else if (a == "-e") o.max_bytes = parse_size(v);
    else if (a == "-f") o.factor = parse_size(v);
    else if (a == "-n") o.iters = std::atoi(v);
    else if (a == "-w") o.warmup = std::atoi(v);
    else if (a == "-c") o.check = std::atoi(v);
    else if (a == "-G") o.graph = std::atoi(v);
    else return usage();
  }
  if (o.ranks < 1 || o.microbatches < 1 || o.iters < 1 || o.warmup < 0 || o.factor < 2 || o.min_bytes < 4 || o.max_bytes < o.min_bytes ||
      (o.backend != "cuda_local" && o.backend != "nccl"))
    return usage();
  try {
    auto avail = loom::cuda::available();
    if (!avail) {
      std::fprintf(stderr, "p2p_perf: no usable CUDA device: %s\n", avail.why.c_str());
      return 2;
    }
    if (o.backend == "nccl" && avail.devices < o.ranks) {
      std::fprintf(stderr, "p2p_perf: -B nccl needs a device per rank (%d ranks, %d devices)\n", o.ranks, avail.devices);
      return 2;
    }
#if defined(LOOM_CUDA_SIM)
    loom::cudasim::config cfg;
    cfg.delays = false;
    loom::cudasim::configure(cfg);
#endif
    loom::schedule s = loom::default_registry().at(o.schedule).make({o.ranks, o.microbatches, o.chunks});
    std::int64_t sends = 0;
    for (auto const& prog : loom::lower(s).programs)
      for (auto const& a : prog) sends += a.kind == loom::op::send;
    std::printf("# loom p2p_perf: %s, %d ranks (%s%s), %d microbatches, %lld messages per step, %s\n", s.name.c_str(), s.ranks,
                o.backend.c_str(), loom::cuda::simulated() ? ", loom CUDA simulator" : "", s.microbatches,
                static_cast<long long>(sends), o.graph ? "CUDA graph replay" : "eager");
    std::printf("# -b %zu -e %zu -f %zu -n %d -w %d -c %d -G %d\n", o.min_bytes, o.max_bytes, o.factor, o.iters, o.warmup, o.check, o.graph);
    std::printf("#%13s %12s %6s %12s %12s %12s %8s\n", "size", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    double bw_sum = 0;
    int rows = 0;
    long wrong = 0;
    for (std::size_t b = o.min_bytes; b <= o.max_bytes; b *= o.factor) {
      result r;
      std::mutex m;
      auto body = [&](auto& c) {
        auto x = measure(c, s, b, o);
        std::lock_guard lk(m);
        if (c.rank() == 0) r = x;
      };
      if (o.backend == "cuda_local") loom::cuda_local::run(o.ranks, body);
      else loom::nccl::run(o.ranks, body);
      const double algbw = r.bytes_per_rank / (r.us * 1e-6) / 1e9;
      std::printf("%14zu %12zu %6s %12.1f %12.2f %12.2f %8ld\n", b, b / 4, "float", r.us, algbw, algbw, r.wrong);
      bw_sum += algbw;
      ++rows;
      wrong += r.wrong;
    }
    std::printf("# Out of bounds values : %ld %s\n", wrong, wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %.3f\n", rows ? bw_sum / rows : 0.0);
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "p2p_perf: %s\n", e.what());
    return 1;
  }
}
