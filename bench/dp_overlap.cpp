// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Overlap of data-parallel gradient synchronisation with the pipeline's tail, on MPI processes
// (mpiexec -n dp*pp). Stages of fixed duration (a stand-in for device kernels: the rank sleeps,
// its CPU is free, as a host is while its GPU computes; --spin burns the CPU instead) with a
// weight gradient of -k KiB each run a schedule over pp ranks, replicated over dp. Three ways:
//   none  - the pipeline alone (no gradient synchronisation);
//   eager - loom::data_parallel, each bucket all-reduced as soon as its stages' last W ran;
//   after - the same buckets all-reduced after the step (data_parallel with eager = false);
// and the same all-reduces alone, without the pipeline. The four take turns step by step; prints
// the median step time of each (the slowest rank's, after a barrier) and the share of the
// all-reduce that eager synchronisation leaves exposed: (eager - none) / (after - none).
//
//   mpiexec -n 4 dp_overlap -d 2 -s interleaved-1f1b -c 4 -m 8 -k 2048 -b 2097152 -t 2000 -n 20 -w 3 -p 50

#include <cstdio>

#if defined(LOOM_HAS_MPI)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/mpi.hpp"
#include "loom/exec/data_parallel.hpp"
#include "loom/exec/pipeline.hpp"
#include "loom/mesh.hpp"
#include "loom/schedule.hpp"

namespace {

struct options {
  int dp = 2;
  std::string schedule = "interleaved-1f1b";
  int chunks = 4;
  int microbatches = 8;
  int kib = 2048;            // weight gradient per virtual stage
  int compute_us = 2000;     // forward; backward input and weight the same each
  std::size_t bucket_bytes = std::size_t{25} << 20;
  int iters = 20, warmup = 3;
  int progress_us = 50;      // data_parallel's progress thread interval (0: none)
  bool spin = false;
};

void busy(int us, bool spin) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  if (!spin) {
    std::this_thread::sleep_until(end);
    return;
  }
  volatile double x = 1;
  while (std::chrono::steady_clock::now() < end) x = x * 1.0000001 + 1e-9;
}

//! A stage that takes a fixed time and owns a weight gradient of `n` doubles.
struct timed_stage {
  using value_type = double;
  const options* o;
  std::vector<double> w, g;
  timed_stage(const options& opt, std::size_t n) : o(&opt), w(n, 0.5), g(n, 0.0) {}
  std::size_t input_size() const { return 1; }
  std::size_t output_size() const { return 1; }
  std::size_t stash_size() const { return 0; }
  std::span<double> weight_grad() { return g; }
  std::span<double> params() { return w; }
  void forward(const loom::stage_context&, loom::forward_buffers<double> b) {
    busy(o->compute_us, o->spin);
    b.output[0] = b.input.empty() ? 0 : b.input[0];
  }
  void backward_input(const loom::stage_context&, loom::backward_buffers<double> b) {
    busy(o->compute_us, o->spin);
    if (!b.input_grad.empty()) b.input_grad[0] = b.output_grad[0];
  }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) {
    busy(o->compute_us, o->spin);
    b.weight_grad[0] += 1.0;
  }
  void backward(const loom::stage_context& c, loom::backward_buffers<double> b) {
    backward_input(c, b);
    backward_weight(c, {b.input, b.stash, b.weight_grad});
  }
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--spin") {
      o.spin = true;
      continue;
    }
    if ((v = next()) == nullptr) return false;
    if (a == "-d") o.dp = std::atoi(v);
    else if (a == "-s") o.schedule = v;
    else if (a == "-c") o.chunks = std::atoi(v);
    else if (a == "-m") o.microbatches = std::atoi(v);
    else if (a == "-k") o.kib = std::atoi(v);
    else if (a == "-t") o.compute_us = std::atoi(v);
    else if (a == "-b") o.bucket_bytes = static_cast<std::size_t>(std::atoll(v));
    else if (a == "-n") o.iters = std::atoi(v);
    else if (a == "-w") o.warmup = std::atoi(v);
    else if (a == "-p") o.progress_us = std::atoi(v);
    else return false;
  }
  return o.dp >= 1 && o.microbatches >= 1 && o.kib >= 1 && o.iters >= 1;
}

using mesh_t = loom::mesh<loom::pp<>, loom::dp<>>;

//! One way of running a step (see the file comment), with its own mesh communicators.
struct way {
  const char* name;
  loom::mesh_comm<mesh_t, loom::mpi::comm> g;
  loom::data_parallel<loom::mesh_comm<mesh_t, loom::mpi::comm>, timed_stage> sync;
  loom::pipeline<loom::schedule, timed_stage, loom::counted<loom::mpi::comm>> p;
  std::vector<std::vector<double>> grads;  // "alone": one buffer per bucket-sized piece
  std::vector<double> times;

  way(const char* n, loom::mpi::comm& world, const options& o, const loom::schedule& s)
      : name(n),
        g(mesh_t{loom::pp<>{s.ranks}, loom::dp<>{o.dp}}, world),
        sync(g, {.bucket_bytes = o.bucket_bytes, .eager = std::strcmp(n, "eager") == 0,
                 .progress_interval = std::chrono::microseconds(o.progress_us)}),
        p(s, g.pp(), [&](loom::stage_id) { return timed_stage(o, static_cast<std::size_t>(o.kib) * 1024 / sizeof(double)); },
          {.observer = synced() ? &sync : nullptr}) {
    if (synced()) sync.attach(p);
    const std::size_t piece = o.bucket_bytes / sizeof(double);
    if (std::strcmp(n, "alone") == 0)
      for (auto& st : p.stages())
        for (std::size_t at = 0; at < st.g.size(); at += piece)
          grads.emplace_back(st.g.begin() + static_cast<std::ptrdiff_t>(at),
                             st.g.begin() + static_cast<std::ptrdiff_t>(std::min(st.g.size(), at + piece)));
  }
  bool synced() const { return std::strcmp(name, "eager") == 0 || std::strcmp(name, "after") == 0; }

  //! One step (or the all-reduces alone); returns this rank's seconds.
  double run(std::span<const double> inputs) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!grads.empty()) {
      std::vector<loom::mpi::comm::request> reqs;
      for (auto& b : grads) reqs.push_back(g.dp().inner().iall_reduce(std::span<double>(b), loom::reduce_op::sum));
      for (auto& r : reqs) g.dp().inner().wait(r);
    } else {
      p.step(inputs);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env(argc, argv);
  options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr, "usage: dp_overlap [-d dp] [-s schedule] [-c chunks] [-m microbatches] [-k KiB per stage] "
                         "[-t compute us] [-b bucket bytes] [-n iters] [-w warmup] [-p progress us] [--spin]\n");
    return 2;
  }
  try {
    int rc = 0;
    loom::run_mpi([&](loom::mpi::comm& c) {
      if (c.size() % o.dp != 0) throw loom::config_error("the world of " + std::to_string(c.size()) + " ranks is not a multiple of -d " + std::to_string(o.dp));
      const loom::schedule s = loom::default_registry().at(o.schedule).make({c.size() / o.dp, o.microbatches, o.chunks});
      // The four ways take turns, step by step, so that the load of the machine (shared, noisy)
      // falls on all of them alike; the figures are medians over the iterations.
      std::vector<std::unique_ptr<way>> ways;
      for (const char* n : {"none", "alone", "after", "eager"}) ways.push_back(std::make_unique<way>(n, c, o, s));
      std::vector<double> inputs(static_cast<std::size_t>(s.microbatches), 1.0);
      for (int it = 0; it < o.warmup + o.iters; ++it)
        for (std::size_t k = 0; k < ways.size(); ++k) {
          way& w = *ways[(k + static_cast<std::size_t>(it)) % ways.size()];
          c.barrier();
          std::vector<double> t{w.run(inputs)};
          c.all_reduce(std::span<double>(t), loom::reduce_op::max);
          if (it >= o.warmup) w.times.push_back(t[0]);
        }
      const double none = median(ways[0]->times), alone = median(ways[1]->times), after = median(ways[2]->times),
                   eager = median(ways[3]->times);
      if (c.rank() == 0) {
        std::printf("# dp_overlap: %d ranks = dp %d x pp %d, %s (%d virtual stages), %d microbatches, %d KiB of gradient per "
                    "stage, buckets of %zu bytes, stage actions of %d us (%s), progress thread every %d us, %d iterations after %d warm-up\n",
                    c.size(), o.dp, s.ranks, s.name.c_str(), s.stages, s.microbatches, o.kib, o.bucket_bytes, o.compute_us,
                    o.spin ? "busy CPU" : "sleeping: device stand-in", o.progress_us, o.iters, o.warmup);
        std::printf("median step, pipeline alone:                %9.3f ms\n", none * 1e3);
        std::printf("median, all-reduces alone (no pipeline):    %9.3f ms\n", alone * 1e3);
        std::printf("median step, all-reduce after the step:     %9.3f ms  (+%.3f ms)\n", after * 1e3, (after - none) * 1e3);
        std::printf("median step, eager all-reduce (overlapped): %9.3f ms  (+%.3f ms)\n", eager * 1e3, (eager - none) * 1e3);
        std::printf("exposed share of the all-reduce: (eager - none) / (after - none) = %.3f\n", (eager - none) / (after - none));
      }
    });
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_overlap: %s\n", e.what());
    return 1;
  }
}
#else
int main() {
  std::puts("dp_overlap: loom was built without MPI");
  return 0;
}
#endif
