// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Calibration (loom/exec/calibrate.hpp): the pipeline's per-call timings in measure mode, the cost
// model built from synthetic timings, the link fit, the gathers over the threads backend and the
// JSON cost file.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <loom/comm/threads.hpp>
#include <loom/exec/calibrate.hpp>
#include <loom/exec/pipeline.hpp>
#include <loom/schedule.hpp>

namespace {

constexpr std::size_t width = 3;

//! A split stage with a little arithmetic: y = w0 * x + w1, loss terms y^2 / 2 on the last stage.
struct tiny_stage {
  using value_type = double;
  double w0 = 0.5, w1 = 0.25;
  std::vector<double> grad = std::vector<double>(2, 0.0);
  std::size_t input_size() const { return width; }
  std::size_t output_size() const { return width; }
  std::size_t stash_size() const { return width; }
  std::span<double> weight_grad() { return grad; }
  void forward(const loom::stage_context& ctx, loom::forward_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      const double y = w0 * b.input[i] + w1;
      b.stash[i] = y;
      b.output[i] = ctx.last() ? 0.5 * y * y : y;
    }
  }
  void backward_input(const loom::stage_context& ctx, loom::backward_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      const double g = ctx.last() ? b.output_grad[i] * b.stash[i] : b.output_grad[i];
      b.input_grad[i] = w0 * g;
      b.stash[i] = g;
    }
  }
  void backward_weight(const loom::stage_context&, loom::weight_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      b.weight_grad[0] += b.stash[i] * b.input[i];
      b.weight_grad[1] += b.stash[i];
    }
  }
  void backward(const loom::stage_context& ctx, loom::backward_buffers<double> b) {
    for (std::size_t i = 0; i < width; ++i) {
      const double g = ctx.last() ? b.output_grad[i] * b.stash[i] : b.output_grad[i];
      b.input_grad[i] = w0 * g;
      b.weight_grad[0] += g * b.input[i];
      b.weight_grad[1] += g;
    }
  }
};
static_assert(loom::split_stage<tiny_stage>);

using loom::op;

//! (kind, microbatch, stage, in_fb) of every compute half of rank r's program, in order.
std::vector<std::tuple<op, int, int, bool>> halves(const loom::schedule& s, int r) {
  std::vector<std::tuple<op, int, int, bool>> out;
  for (const loom::action& a : s.programs[static_cast<std::size_t>(r)]) {
    if (a.kind == op::FB) {
      out.emplace_back(op::F, a.mb, a.stage, true);
      out.emplace_back(a.bkind, a.bmb, a.bstage, true);
    } else if (loom::is_compute(a.kind)) {
      out.emplace_back(a.kind, a.mb, a.stage, false);
    }
  }
  return out;
}

loom::action_timing t(op k, int stage, double sec, int mb = 0) {
  return {.kind = k, .microbatch = mb, .stage = stage, .seconds = sec};
}

}  // namespace

TEST_CASE("a measured step records exactly one timing per compute half, in program order, for every registered family") {
  int runs = 0;
  for (auto const& e : loom::default_registry().entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: a different training rule; vocabulary-parallel ones need vocab_layers; each tested on its own
    for (int p : {1, 2, 3, 4})
      for (int m : {2 * p, 3 * p + 1}) {
        loom::shape sh = e.resolve({.ranks = p, .microbatches = m});
        if (!e.check(sh).empty()) continue;
        const loom::schedule s = e.make(sh);
        CAPTURE(e.name);
        CAPTURE(p);
        CAPTURE(m);
        std::vector<double> batch(static_cast<std::size_t>(m) * width, 0.3);
        std::mutex mu;
        std::vector<std::string> errors;
        loom::run_threads(p, [&](loom::threads::comm& c) {
          loom::pipeline pl(s, c, [](loom::stage_id) { return tiny_stage{}; }, {.measure = true});
          const auto want = halves(pl.lowered(), c.rank());
          for (int step = 0; step < 2; ++step) {
            pl.step(batch);
            auto got = pl.last_timings();
            std::lock_guard lk(mu);
            if (got.size() != want.size()) {
              errors.push_back("rank " + std::to_string(c.rank()) + ": " + std::to_string(got.size()) + " timings for " +
                               std::to_string(want.size()) + " halves");
              continue;
            }
            for (std::size_t i = 0; i < got.size(); ++i) {
              auto [k, mb, st, fb] = want[i];
              if (got[i].kind != k || got[i].microbatch != mb || got[i].stage != st || got[i].in_fb != fb ||
                  got[i].rank != c.rank() || !(got[i].seconds >= 0))
                errors.push_back("rank " + std::to_string(c.rank()) + ": timing " + std::to_string(i) + " differs");
            }
          }
        }, std::chrono::seconds(30));
        CHECK_MESSAGE(errors.empty(), (errors.empty() ? std::string() : errors.front()));
        ++runs;
      }
  }
  MESSAGE(runs << " runs");
  CHECK(runs > 20);
}

TEST_CASE("a step that does not measure records no timing") {
  const loom::schedule s = loom::default_registry().at("1f1b").make({.ranks = 2, .microbatches = 4});
  std::vector<double> batch(4 * width, 0.3);
  loom::run_threads(2, [&](loom::threads::comm& c) {
    loom::pipeline pl(s, c, [](loom::stage_id) { return tiny_stage{}; });
    pl.step(batch);
    CHECK(pl.last_timings().empty());
  });
}

TEST_CASE("calibrate takes the median of each stage's F, B and W calls") {
  const loom::schedule s = loom::default_registry().at("zb-h1").make({.ranks = 2, .microbatches = 4});
  std::vector<loom::action_timing> ts{
      // stage 0: F 1, 2, 100 (an outlier: the median ignores it); B 3, 5 (even count: mean of the middle); W 7
      t(op::F, 0, 1), t(op::F, 0, 100), t(op::F, 0, 2), t(op::B, 0, 5), t(op::B, 0, 3), t(op::W, 0, 7),
      // stage 1: halves of an FB count as their plain kinds
      t(op::F, 1, 4), {.kind = op::B, .stage = 1, .in_fb = true, .seconds = 6}, t(op::W, 1, 8)};
  const std::vector<loom::stage_size> sizes{{.message_bytes = 96, .param_bytes = 16}, {.message_bytes = 0, .param_bytes = 16}};
  loom::calibration_options o{.intra = {.alpha = 1e-6, .beta = 1e-9}, .mem_w_ratio = 0.5};
  const loom::cost_model m = loom::calibrate(s, ts, sizes, o);
  REQUIRE(m.stages.size() == 2);
  CHECK(m.stages[0] == loom::stage_cost{.f = 2, .b = 4, .w = 7, .fb = -1, .activation = 1, .message_bytes = 96, .param_bytes = 16});
  CHECK(m.stages[1] == loom::stage_cost{.f = 4, .b = 6, .w = 8, .fb = -1, .activation = 1, .message_bytes = 0, .param_bytes = 16});
  CHECK(m.intra == loom::link_cost{.alpha = 1e-6, .beta = 1e-9});
  CHECK(m.inter == m.intra);  // one node: the inter-node link is the measured one
  CHECK(m.ranks_per_node == 0);
  CHECK(m.mem_w_ratio == 0.5);
}

TEST_CASE("calibrate makes a stage's update timings its update cost (their median), 0 without any, and refuses an update on F") {
  const loom::schedule s = loom::default_registry().at("pipedream").make({.ranks = 2, .microbatches = 2, .chunks = 0, .steps = 2});
  auto upd = [](op k, int st, double sec) { return loom::action_timing{.kind = k, .stage = st, .update = true, .seconds = sec}; };
  std::vector<loom::action_timing> ts{t(op::F, 0, 1), t(op::BW, 0, 4), upd(op::BW, 0, 3), upd(op::BW, 0, 9), upd(op::BW, 0, 5),
                                      t(op::F, 1, 2), t(op::BW, 1, 6)};
  const loom::cost_model m = loom::calibrate(s, ts, {});
  CHECK(m.stages[0].update == 5);  // the median of 3, 9, 5: not the BW's time
  CHECK(m.stages[0].b == 4);
  CHECK(m.stages[1].update == 0);  // no update timing: none
  CHECK(loom::cost_file_json(m).find("\"update\": 5}") != std::string::npos);
  ts.push_back(upd(op::F, 1, 1));
  CHECK_THROWS_WITH_AS(loom::calibrate(s, ts, {}), "calibrate: an update timing has kind F (updates follow W or BW)", loom::config_error);
}

TEST_CASE("calibrate writes a fused BW as b with w = 0, or splits it by w_fraction") {
  const loom::schedule s = loom::default_registry().at("1f1b").make({.ranks = 2, .microbatches = 2});
  std::vector<loom::action_timing> ts{t(op::F, 0, 1), t(op::BW, 0, 4), t(op::F, 1, 1), t(op::BW, 1, 8)};
  auto m = loom::calibrate(s, ts, {});
  CHECK(m.stages[0].b == 4);
  CHECK(m.stages[0].w == 0);
  CHECK(m.stages[1].b == 8);
  m = loom::calibrate(s, ts, {}, {.w_fraction = 0.25});
  CHECK(m.stages[0].b == 3);
  CHECK(m.stages[0].w == 1);
  CHECK(m.stages[1].b == 6);
  CHECK(m.stages[1].w == 2);
  // Either way the fused backward the schedule runs costs what was measured.
  CHECK(loom::simulate(s, m).makespan == loom::simulate(s, loom::calibrate(s, ts, {})).makespan);
}

TEST_CASE("calibrate on timings of unit costs predicts what simulate predicts with unit costs, for a grid of shapes") {
  for (const char* fam : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "gpipe"})
    for (int p : {2, 3, 4}) {
      const auto& e = loom::default_registry().at(fam);
      loom::shape sh = e.resolve({.ranks = p, .microbatches = 2 * p});
      if (!e.check(sh).empty()) continue;
      const loom::schedule s = e.make(sh);
      CAPTURE(fam);
      CAPTURE(p);
      const double q = s.stage_fraction();
      std::vector<loom::action_timing> ts;
      for (int st = 0; st < s.stages; ++st)
        for (int mb = 0; mb < s.microbatches; ++mb)
          for (op k : {op::F, op::B, op::W, op::BW}) ts.push_back(t(k, st, k == op::BW ? 2 * q : q, mb));
      // A split schedule uses B and W; a fused one BW = b + w with w = 0 here: the same times.
      const auto m = loom::calibrate(s, ts, {});
      CHECK(loom::simulate(s, m).makespan == doctest::Approx(loom::simulate(s).makespan).epsilon(1e-12));
    }
}

TEST_CASE("calibrate refuses timings it cannot turn into a model, naming the stage") {
  const loom::schedule s = loom::default_registry().at("zb-h1").make({.ranks = 2, .microbatches = 2});
  auto what = [&](std::vector<loom::action_timing> ts, std::vector<loom::stage_size> sz = {}, loom::calibration_options o = {}) {
    try {
      (void)loom::calibrate(s, ts, sz, o);
    } catch (const loom::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(what({t(op::F, 0, 1), t(op::B, 0, 1), t(op::W, 0, 1)}).find("no forward timing of stage 1") != std::string::npos);
  CHECK(what({t(op::F, 0, 1), t(op::B, 0, 1), t(op::F, 1, 1), t(op::BW, 1, 1)}).find("stage 0 has B timings but no W") !=
        std::string::npos);
  CHECK(what({t(op::F, 2, 1)}).find("names stage 2") != std::string::npos);
  CHECK(what({t(op::F, 0, 1), t(op::BW, 0, 1), t(op::F, 1, 1), t(op::BW, 1, 1)}, {{}}).find("1 stage sizes") != std::string::npos);
  CHECK(what({t(op::F, 0, 1), t(op::BW, 0, 1), t(op::F, 1, 1), t(op::BW, 1, 1)}, {}, {.w_fraction = 2}).find("w_fraction") !=
        std::string::npos);
}

TEST_CASE("fit_link recovers alpha + beta * bytes and never returns a negative term") {
  const std::vector<double> n{0, 1024, 8192, 65536};
  std::vector<double> y;
  for (double b : n) y.push_back(2e-6 + 1e-10 * b);
  const loom::link_cost l = loom::fit_link(n, y);
  CHECK(l.alpha == doctest::Approx(2e-6).epsilon(1e-9));
  CHECK(l.beta == doctest::Approx(1e-10).epsilon(1e-9));
  CHECK(loom::fit_link(std::vector<double>{8}, std::vector<double>{3e-6}) == loom::link_cost{.alpha = 3e-6, .beta = 0});
  const loom::link_cost neg = loom::fit_link(std::vector<double>{0, 100}, std::vector<double>{5e-6, 1e-6});  // slope < 0
  CHECK(neg.beta == 0);
  CHECK(neg.alpha == doctest::Approx(3e-6));
  const loom::link_cost noalpha = loom::fit_link(std::vector<double>{10, 20}, std::vector<double>{1, 3});  // intercept < 0
  CHECK(noalpha.alpha == 0);
  CHECK(noalpha.beta > 0);
}

TEST_CASE("measure_link and gather_timings give every rank the same answer over the threads backend") {
  for (int p : {1, 2, 3}) {
    CAPTURE(p);
    std::mutex mu;
    std::vector<loom::link_cost> links;
    std::vector<std::vector<loom::action_timing>> gathered;
    loom::run_threads(p, [&](loom::threads::comm& c) {
      const std::vector<std::size_t> sizes{8, 4096, 65536};
      const loom::link_cost l = loom::measure_link(c, sizes, 0, p > 1 ? p - 1 : 1, 5, 1);
      std::vector<loom::action_timing> mine;
      for (int i = 0; i <= c.rank(); ++i)  // rank r contributes r + 1 timings
        mine.push_back({.kind = i % 2 ? op::W : op::F, .microbatch = i, .stage = c.rank(), .rank = c.rank(), .in_fb = i == 1,
                        .update = i == 3, .seconds = 0.5 * i + c.rank()});
      auto all = loom::gather_timings(c, mine);
      std::lock_guard lk(mu);
      links.push_back(l);
      gathered.push_back(std::move(all));
    });
    for (const auto& l : links) {
      CHECK(l == links.front());
      CHECK(std::isfinite(l.alpha));
      CHECK(l.alpha >= 0);
      CHECK(l.beta >= 0);
    }
    if (p == 1) CHECK(links.front() == loom::link_cost{});
    std::vector<loom::action_timing> want;
    for (int r = 0; r < p; ++r)
      for (int i = 0; i <= r; ++i)
        want.push_back({.kind = i % 2 ? op::W : op::F, .microbatch = i, .stage = r, .rank = r, .in_fb = i == 1, .update = i == 3,
                        .seconds = 0.5 * i + r});
    for (const auto& g : gathered) CHECK(g == want);
  }
}

TEST_CASE("gather_stage_sizes reports each stage's output and parameter bytes on every rank") {
  const loom::schedule s = loom::default_registry().at("interleaved-1f1b").make({.ranks = 2, .microbatches = 4, .chunks = 2});
  std::mutex mu;
  std::vector<std::vector<loom::stage_size>> got;
  loom::run_threads(2, [&](loom::threads::comm& c) {
    loom::pipeline pl(s, c, [](loom::stage_id) { return tiny_stage{}; });
    auto sz = loom::gather_stage_sizes(pl, c);
    std::lock_guard lk(mu);
    got.push_back(sz);
  });
  const loom::stage_size mid{.message_bytes = width * sizeof(double), .param_bytes = 2 * sizeof(double)};
  const loom::stage_size last{.message_bytes = 0, .param_bytes = 2 * sizeof(double)};
  for (const auto& g : got) CHECK(g == std::vector<loom::stage_size>{mid, mid, mid, last});
}

TEST_CASE("the cost file is the JSON the CLI reads, field for field") {
  loom::cost_model m;
  m.stages = {{.f = 0.00125, .b = 0.0025, .w = 0.001, .fb = -1, .activation = 0.5, .message_bytes = 8192, .param_bytes = 2101248},
              {.f = 1.0 / 3, .b = 2e-7, .w = 0, .fb = -1, .activation = 0.5, .message_bytes = 0, .param_bytes = 24}};
  m.intra = {.alpha = 1.5e-6, .beta = 2.5e-10};
  m.inter = {.alpha = 1e-5, .beta = 1e-9};
  m.ranks_per_node = 4;
  m.mem_w_ratio = 1;
  CHECK(loom::cost_file_json(m) ==
        "{\n"
        "  \"stages\": [\n"
        "    {\"f\": 0.00125, \"b\": 0.0025, \"w\": 0.001, \"fb\": -1, \"activation\": 0.5, \"message_bytes\": 8192, \"param_bytes\": 2101248},\n"
        "    {\"f\": 0.333333333, \"b\": 2e-07, \"w\": 0, \"fb\": -1, \"activation\": 0.5, \"message_bytes\": 0, \"param_bytes\": 24}\n"
        "  ],\n"
        "  \"links\": {\"intra\": {\"alpha\": 1.5e-06, \"beta\": 2.5e-10}, \"inter\": {\"alpha\": 1e-05, \"beta\": 1e-09}},\n"
        "  \"ranks_per_node\": 4,\n"
        "  \"mem_w_ratio\": 1\n"
        "}\n");
  m.stages[1].f = -1;
  CHECK_THROWS_AS((void)loom::cost_file_json(m), loom::config_error);
}

TEST_CASE("write_cost_file writes exactly cost_file_json, and names the path it cannot write") {
  loom::cost_model m;
  m.stages = {{.f = 1, .b = 2, .w = 0.5, .fb = -1, .activation = 1, .message_bytes = 16, .param_bytes = 8}};
  const std::string path = "loom_test_write_cost_file.json";
  loom::write_cost_file(path, m);
  std::string back;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[256];
    for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) back.append(buf, got);
    std::fclose(f);
  }
  std::remove(path.c_str());
  CHECK(back == loom::cost_file_json(m));
  const std::string nowhere = "loom-no-such-directory/costs.json";
  try {
    loom::write_cost_file(nowhere, m);
    FAIL("write_cost_file wrote into a directory that does not exist");
  } catch (const loom::config_error& e) {
    CHECK(std::string(e.what()).find(nowhere) != std::string::npos);
  }
}
