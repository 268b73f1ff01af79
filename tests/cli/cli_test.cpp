// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Runs the `loom` binary (LOOM_CLI_PATH) and checks it against the library it is built from.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <loom/loom.hpp>
#include <loom/schedule/bound.hpp>
#include <loom/schedule/offload.hpp>

#include "costs/vocab_heavy_8.hpp"

namespace {

struct result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quote(const std::string& a) {
  std::string q = "'";
  for (char c : a) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

// Runs `loom args...` with a 60 s limit (a hang fails the test with code 124).
result run(const std::vector<std::string>& args) {
  const std::string dir = LOOM_CLI_WORKDIR;
  // Per process: ctest runs this file's test cases as parallel processes in one directory.
  const std::string tag = std::to_string(::getpid());
  const std::string out = dir + "/last-" + tag + ".out", err = dir + "/last-" + tag + ".err";
  std::string cmd = "timeout 60 " + quote(LOOM_CLI_PATH);
  for (auto const& a : args) cmd += " " + quote(a);
  cmd += " >" + quote(out) + " 2>" + quote(err) + " </dev/null";
  int status = std::system(cmd.c_str());
  result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

std::size_t line_count(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string tmp_path(const std::string& name) { return std::string(LOOM_CLI_WORKDIR) + "/" + name; }

// Families and shapes compared with the library: every registered family on the shapes it
// accepts, under costs with unequal f, b, w and a p2p latency.
struct case_ {
  std::string family;
  loom::shape shape;
};

std::vector<case_> cases() {
  std::vector<case_> out;
  for (auto const& e : loom::default_registry().entries())
    for (loom::shape sh : {loom::shape{2, 3, 0}, loom::shape{4, 8, 0}, loom::shape{3, 7, 0}})
      if (e.check(e.resolve(sh)).empty()) out.push_back({e.name, sh});
  // the asynchronous families over several steps (--steps)
  for (auto const& e : loom::default_registry().entries())
    if (e.multi_step) out.push_back({e.name, loom::shape{3, 4, 0, 3}});
  out.push_back({"interleaved-1f1b", {3, 6, 3}});
  return out;
}

}  // namespace

TEST_CASE("loom list prints every registered schedule name, one per line") {
  auto r = run({"list"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  std::string expected;
  for (auto const& e : loom::default_registry().entries()) expected += e.name + "\n";
  for (auto const& a : loom::default_registry().aliases()) expected += a.first + "\n";
  CHECK(r.out == expected);
  for (auto name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "pipedream", "pipedream-2bw", "pipedream-flush", "1f1b-vocab-1",
                    "v-half-vocab-2"})
    CHECK(r.out.find(std::string(name) + "\n") != std::string::npos);
  // --synchronous: the families that run with stages alone (no asynchronous, no vocabulary-parallel
  // ones, no aliases); --long marks the others.
  auto sync = run({"list", "--synchronous"});
  CHECK(sync.code == 0);
  std::string want;
  for (auto const& e : loom::default_registry().entries())
    if (!e.multi_step && !e.vocab) want += e.name + "\n";
  CHECK(sync.out == want);
  auto long_list = run({"list", "--long"});
  CHECK(long_list.out.find("[vocabulary-parallel, loom::vocab_layers] 1F1B with vocabulary parallelism, Algorithm 1") != std::string::npos);
}

TEST_CASE("loom simulate --json agrees with the library's own simulation for every family") {
  const loom::costs k{.f = 1, .b = 1.5, .w = 0.75, .c = 0.25, .fb = 2.25, .mem_w_ratio = 0.5};
  for (auto const& c : cases()) {
    CAPTURE(c.family);
    CAPTURE(c.shape.ranks);
    CAPTURE(c.shape.microbatches);
    std::vector<std::string> args{"simulate", "--schedule", c.family, "--ranks", std::to_string(c.shape.ranks),
                                  "--microbatches", std::to_string(c.shape.microbatches), "--f", "1", "--b", "1.5",
                                  "--w", "0.75", "--c", "0.25", "--fb", "2.25", "--mem-w-ratio", "0.5", "--json"};
    if (c.shape.chunks > 0) {
      args.push_back("--chunks");
      args.push_back(std::to_string(c.shape.chunks));
    }
    if (c.shape.steps != 1) {
      args.push_back("--steps");
      args.push_back(std::to_string(c.shape.steps));
    }
    CAPTURE(c.shape.steps);
    auto r = run(args);
    REQUIRE(r.code == 0);
    CHECK(r.err.empty());
    CHECK(line_count(r.out) == 1);
    auto j = nlohmann::json::parse(r.out);

    auto const& e = loom::default_registry().at(c.family);
    loom::generate_options o;
    o.cost = k;
    auto s = e.make(c.shape, o);
    auto sim = loom::simulate(s, k);
    REQUIRE(sim.ok);
    CHECK(j.at("schedule") == c.family);
    CHECK(j.at("ranks") == c.shape.ranks);
    CHECK(j.at("microbatches") == c.shape.microbatches * c.shape.steps);
    CHECK(j.at("chunks") == s.chunks);
    if (s.versioned()) {  // the asynchronous families add their versions
      CHECK(j.at("steps") == s.steps);
      CHECK(j.at("stash") == s.stash);
      CHECK(j.at("version_slots").get<std::vector<int>>() == s.version_slots);
      CHECK(j.at("weight_copies").get<std::vector<double>>() == sim.weight_copies);
    } else {
      CHECK(!j.contains("steps"));
    }
    CHECK(j.at("valid") == true);
    CHECK(j.at("makespan").get<double>() == sim.makespan);
    CHECK(j.at("bubble_ratio").get<double>() == sim.bubble_ratio);
    CHECK(j.at("bubble_rate").get<double>() == sim.bubble_rate);
    CHECK(j.at("peak_activation").get<std::vector<double>>() == sim.peak_activation);
    CHECK(j.at("param_copies") == s.param_copies);
    REQUIRE(j.at("stage_to_rank").size() == static_cast<std::size_t>(s.directions));
    for (int d = 0; d < s.directions; ++d)
      for (int st = 0; st < s.stages; ++st)
        CHECK(j.at("stage_to_rank").at(d).at(st) == s.stage_to_rank[static_cast<std::size_t>(d * s.stages + st)]);
    REQUIRE(j.at("mb_direction").size() == static_cast<std::size_t>(s.microbatches));
    for (int mb = 0; mb < s.microbatches; ++mb) CHECK(j.at("mb_direction").at(mb) == s.direction_of(mb));
    REQUIRE(j.at("actions").size() == s.programs.size());
    for (std::size_t rk = 0; rk < s.programs.size(); ++rk) {
      auto const& row = j.at("actions").at(rk);
      REQUIRE(row.size() == s.programs[rk].size());
      for (std::size_t i = 0; i < row.size(); ++i) {
        auto const& a = s.programs[rk][i];
        auto const& x = row.at(i);
        CHECK(x.at("op") == loom::to_string(a.kind));
        CHECK(x.at("mb") == a.mb);
        CHECK(x.at("stage") == a.stage);
        CHECK(x.at("start").get<double>() == sim.times[rk][i].start);
        if (s.versioned()) {
          CHECK(x.at("version") == a.version);
          CHECK(x.value("update", false) == a.update);
        } else {
          CHECK(!x.contains("version"));
        }
        CHECK(x.at("end").get<double>() == sim.times[rk][i].end);
        if (a.kind == loom::op::FB) {
          CHECK(x.at("bop") == loom::to_string(a.bkind));
          CHECK(x.at("bmb") == a.bmb);
          CHECK(x.at("bstage") == a.bstage);
        } else {
          CHECK(!x.contains("bop"));
        }
      }
    }
  }
}

TEST_CASE("loom simulate's summary reports the closed-form numbers of ZB-H1") {
  // ARCHITECTURE.md: ZB-H1 bubble time (p-1)(f+b-w) = 3 at p = 4, f = b = w = 1; peak p = 4;
  // makespan m(f+b+w) + 3 = 27.
  auto r = run({"simulate", "--schedule", "zb-h1", "--ranks", "4", "--microbatches", "8"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("valid            yes") != std::string::npos);
  CHECK(r.out.find("makespan         27\n") != std::string::npos);
  CHECK(r.out.find("bubble time      3 3 3 3 ") != std::string::npos);
  CHECK(r.out.find("peak activation  4 4 4 4 ") != std::string::npos);
  CHECK(r.out.find("param copies     1\n") != std::string::npos);
}

TEST_CASE("loom simulate --steps: the asynchronous families print their versions, and synchronous ones refuse steps") {
  auto r = run({"simulate", "--schedule", "pipedream", "--ranks", "4", "--microbatches", "4", "--steps", "4"});
  CHECK(r.code == 0);
  CHECK(r.out.find("steps            4 without a flush (4 microbatches each)") != std::string::npos);
  CHECK(r.out.find("weight versions  4 3 2 1   ") != std::string::npos);
  // (p-1)/(Tm+p-1) = 3/19 at unit costs
  CHECK(r.out.find("bubble ratio     0.1579") != std::string::npos);
  auto two = run({"simulate", "--schedule", "pipedream-2bw", "--ranks", "4", "--microbatches", "4", "--steps", "4"});
  CHECK(two.out.find("weight versions  2 2 2 2   ") != std::string::npos);
  auto sync = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "4", "--steps", "2"});
  CHECK(sync.code != 0);
  CHECK(sync.err.find("1f1b is synchronous") != std::string::npos);
  auto alias = run({"simulate", "--schedule", "pipedream-flush", "--ranks", "2", "--microbatches", "4"});
  CHECK(alias.code == 0);
  CHECK(alias.out.find("schedule         1f1b\n") != std::string::npos);
  auto bad = run({"simulate", "--schedule", "pipedream", "--ranks", "2", "--microbatches", "4", "--steps", "0"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--steps") != std::string::npos);
}

TEST_CASE("loom --group: the grouped family takes g in ceil(P/2)..P, the others refuse it, and loom best ranks every g") {
  auto two = run({"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "4", "--microbatches", "8", "--group", "2", "--json"});
  auto four = run({"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "4", "--microbatches", "8", "--group", "4", "--json"});
  REQUIRE(two.code == 0);
  REQUIRE(four.code == 0);
  // PipeOffload's point: the smaller group holds fewer activations (peaks 3 and 4 units on rank 0).
  CHECK(nlohmann::json::parse(two.out).at("peak_activation").at(0) == 3.0);
  CHECK(nlohmann::json::parse(four.out).at("peak_activation").at(0) == 4.0);
  auto low = run({"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "4", "--microbatches", "8", "--group", "1"});
  CHECK(low.code != 0);
  CHECK(low.err.find("needs a group size between ceil(p/2) = 2 and p = 4 (got group=1)") != std::string::npos);
  auto other = run({"simulate", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "8", "--group", "2"});
  CHECK(other.code != 0);
  CHECK(other.err.find("1f1b issues no microbatch groups") != std::string::npos);
  auto zero = run({"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "4", "--microbatches", "8", "--group", "0"});
  CHECK(zero.code == 2);
  CHECK(zero.err.find("--group") != std::string::npos);
  auto best = run({"best", "--ranks", "4", "--microbatches", "8", "--json"});
  REQUIRE(best.code == 0);
  std::set<std::string> names;
  const auto all = nlohmann::json::parse(best.out);  // kept: a range-for over a temporary's member dangles
  for (auto const& row : all.at("ranking")) names.insert(row.at("schedule").get<std::string>());
  for (const char* g : {"group-interleaved-1f1b (g=2)", "group-interleaved-1f1b (g=3)", "group-interleaved-1f1b (g=4)"})
    CHECK(names.count(g) == 1);
  auto one = run({"best", "--ranks", "4", "--microbatches", "8", "--group", "3", "--json"});
  REQUIRE(one.code == 0);
  names.clear();
  const auto only = nlohmann::json::parse(one.out);
  for (auto const& row : only.at("ranking")) names.insert(row.at("schedule").get<std::string>());
  CHECK(names.count("group-interleaved-1f1b") == 1);
  CHECK(names.count("1f1b") == 1);
}

TEST_CASE("loom simulate --offload-chunks prints PipeOffload's plan, as the library makes it, and refuses what it cannot plan") {
  const std::initializer_list<const char*> base = {"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "4", "--microbatches", "16",
                                                   "--group", "2", "--f", "2", "--b", "2", "--w", "2"};
  auto with = [&](std::initializer_list<const char*> more) {
    std::vector<std::string> a(base.begin(), base.end());
    a.insert(a.end(), more.begin(), more.end());
    return run(a);
  };
  const loom::schedule s = loom::default_registry().at("group-interleaved-1f1b").make({.ranks = 4, .microbatches = 16, .chunks = 2, .group = 2});
  const auto plan = loom::plan_offload(s, {.f = 2, .b = 2, .w = 2}, {.chunks = 1, .time = 0.2});
  REQUIRE(plan.ok);
  auto j = with({"--offload-chunks", "1", "--json"});
  REQUIRE(j.code == 0);
  const auto js = nlohmann::json::parse(j.out);
  CHECK(js.at("offload").at("peak_activation").get<std::vector<double>>() == plan.peak_activation);
  CHECK(js.at("offload").at("copies").size() == plan.copies.size());
  CHECK(js.at("offload").at("copy_time").get<double>() == 0.6);
  // The run: the schedule with the plan's copies as actions, each taking the copy time (q h = 0.6).
  loom::costs timed{.f = 2, .b = 2, .w = 2, .h = 0.6 / s.stage_fraction()};
  const auto run_lib = loom::simulate(loom::with_offload(s, plan), timed);
  CHECK(js.at("offload").at("run").at("valid").get<bool>());
  CHECK(js.at("offload").at("run").at("makespan").get<double>() == run_lib.makespan);
  CHECK(js.at("offload").at("run").at("peak_activation").get<std::vector<double>>() == run_lib.peak_activation);
  CHECK(js.at("offload").at("copies").at(0).at("position").get<std::size_t>() == plan.copies.at(0).position);
  // The authors' peaks at unit cost per stage: 4 3 3 3 chunk-activations, i.e. 2 1.5 1.5 1.5 units.
  auto t = with({"--offload-chunks", "1"});
  REQUIRE(t.code == 0);
  CHECK(t.out.find("peak offloaded   2 1.5 1.5 1.5   (per rank") != std::string::npos);
  CHECK(t.out.find("offload          first 1 chunk of each rank, one copy 0.6 (--offload-time 0.2): ") != std::string::npos);
  CHECK(t.out.find("offload run      makespan 104 (+0.00%), peak 2 1.5 1.5 1.5   (the copies as actions") != std::string::npos);
  auto none = with({});
  CHECK(none.out.find("offload") == std::string::npos);
  // Refusals: one line, exit 2, nothing on stdout.
  for (auto [more, says] : std::vector<std::pair<std::vector<const char*>, const char*>>{
           {{"--offload-chunks", "3"}, "offload needs 0 <= offloaded chunks <= chunks per rank = 2 (got 3)"},
           {{"--offload-chunks", "1", "--offload-time", "0"}, "--offload-time '0' must be > 0"}}) {
    std::vector<std::string> a(base.begin(), base.end());
    a.insert(a.end(), more.begin(), more.end());
    auto r = run(a);
    CAPTURE(says);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(says) != std::string::npos);
  }
  // Both chunks of p = 8 at offload time 0.5: the link is too slow (the authors refuse it too).
  auto slow = run({"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "8", "--microbatches", "32", "--group", "4", "--f", "2",
                   "--b", "2", "--w", "2", "--offload-chunks", "2", "--offload-time", "0.5"});
  CHECK(slow.code == 2);
  CHECK(slow.out.empty());
  CHECK(slow.err.find("cannot copy the activation of") != std::string::npos);
  auto odd = run({"simulate", "--schedule", "group-interleaved-1f1b", "--ranks", "3", "--microbatches", "6", "--offload-chunks", "1"});
  CHECK(odd.code == 2);
  CHECK(odd.err.find("needs an even number of ranks (got 3)") != std::string::npos);
}

TEST_CASE("loom simulate prints the certified lower bound on the schedule's placement and the gap to it") {
  // ZB-H1 at its own peak (p units) is optimal: the bound equals it (bound.hpp), gap 0.
  auto r = run({"simulate", "--schedule", "zb-h1", "--ranks", "4", "--microbatches", "8", "--c", "0.5"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("lower bound      makespan 33, bubble rate 0.2727") != std::string::npos);
  CHECK(r.out.find("within 4 units of activation, its own peak") != std::string::npos);
  CHECK(r.out.find("gap              makespan 0.00%, bubble rate +0.0000") != std::string::npos);
  // 1F1B at the same limit is 3(f+b+w)-ish above it; the JSON carries both, equal to the library's.
  auto j = run({"simulate", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "8", "--mem-limit", "4", "--json"});
  REQUIRE(j.code == 0);
  auto js = nlohmann::json::parse(j.out);
  auto sched = loom::generate(loom::one_f_one_b{}, {4, 8});
  auto lb = loom::lower_bound(sched, {}, 4);
  auto sim = loom::simulate(sched);
  CHECK(js.at("lower_bound").at("makespan").get<double>() == doctest::Approx(lb.makespan));
  CHECK(js.at("lower_bound").at("bubble_rate").get<double>() == doctest::Approx(lb.bubble_rate));
  CHECK(js.at("lower_bound").at("mem_limit_source") == "--mem-limit");
  CHECK(js.at("gap").at("makespan").get<double>() == doctest::Approx((sim.makespan - lb.makespan) / sim.makespan));
  CHECK(js.at("gap").at("bubble_rate").get<double>() > 0.1);
}

TEST_CASE("loom exact proves the optimum of a small shape, beats or equals zb-auto, and rejects bad input") {
  auto r = run({"exact", "--ranks", "4", "--microbatches", "8", "--f", "2", "--b", "1.5", "--w", "0.5", "--c", "0.6",
                "--mem-w-ratio", "0.2", "--mem-limit", "4", "--json"});
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("optimal") == true);
  CHECK(j.at("max_span").get<double>() == doctest::Approx(j.at("lower_bound").at("max_span").get<double>()));
  CHECK(j.at("max_span").get<double>() <= j.at("zb_auto").at("max_span").get<double>() + 1e-9);
  // The programs it prints are a valid schedule with that span.
  loom::schedule s = loom::make_schedule("x", {4, 8, 1}, 4, loom::placement_kind::loop);
  for (std::size_t rk = 0; rk < 4; ++rk)
    for (auto const& a : j.at("programs").at(rk)) {
      std::string t = a.get<std::string>();  // e.g. "F3@s1"
      const auto at = t.find("@s");
      const loom::op kind = t[0] == 'F' ? loom::op::F : t[0] == 'B' ? loom::op::B : loom::op::W;
      const int mb = std::stoi(t.substr(1, at - 1)), st = std::stoi(t.substr(at + 2));
      s.programs[rk].push_back(kind == loom::op::F ? loom::forward(mb, st) : kind == loom::op::B ? loom::backward_input(mb, st) : loom::backward_weight(mb, st));
    }
  const loom::costs k{.f = 2, .b = 1.5, .w = 0.5, .c = 0.6, .mem_w_ratio = 0.2};
  auto sim = loom::simulate(s, k);
  REQUIRE(sim.ok);
  CHECK(sim.max_peak_activation() <= 4 + 1e-9);
  CHECK(*std::max_element(sim.span.begin(), sim.span.end()) == doctest::Approx(j.at("max_span").get<double>()));
  auto text = run({"exact", "--ranks", "2", "--microbatches", "3"});
  REQUIRE(text.code == 0);
  CHECK(text.out.find("result           optimal") != std::string::npos);
  for (auto const& bad : std::vector<std::vector<std::string>>{{"exact", "--ranks", "2"},
                                                               {"exact", "--ranks", "2", "--microbatches", "2", "-s", "1f1b"},
                                                               {"exact", "--ranks", "2", "--microbatches", "2", "--seconds", "x"},
                                                               {"exact", "--ranks", "2", "--microbatches", "2", "--placement", "v", "--chunks", "3"}}) {
    auto e = run(bad);
    CHECK(e.code == 2);
    CHECK(line_count(e.err) == 1);
  }
}

TEST_CASE("loom render draws ASCII by default and writes a well-formed SVG and a parseable trace") {
  auto r = run({"render", "--schedule", "zb-h2", "--ranks", "3", "--microbatches", "5"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.rfind("zb-h2: 3 ranks x 5 microbatches", 0) == 0);
  for (auto row : {"\nr0 | F0 ", "\nr1 | ", "\nr2 | "}) CHECK(r.out.find(row) != std::string::npos);

  auto s = loom::generate(loom::zb_h2{}, {3, 5});
  auto sim = loom::simulate(s);
  const std::string svg = tmp_path("zb-h2.svg"), trace = tmp_path("zb-h2.json");
  std::remove(svg.c_str());
  std::remove(trace.c_str());
  r = run({"render", "--schedule", "zb-h2", "--ranks", "3", "--microbatches", "5", "--svg", svg, "--trace", trace});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("wrote " + svg) != std::string::npos);
  auto doc = slurp(svg);
  CHECK(doc.rfind("<?xml", 0) == 0);
  CHECK(doc.find("</svg>") != std::string::npos);
  CHECK(doc == loom::render_svg(s, sim));  // the CLI draws what the library draws
  std::size_t boxes = 0;
  for (auto p = doc.find("class=\"action\""); p != std::string::npos; p = doc.find("class=\"action\"", p + 1)) ++boxes;
  CHECK(boxes == s.size());
  auto j = nlohmann::json::parse(slurp(trace));
  std::size_t events = 0;
  for (auto const& e : j.at("traceEvents")) events += e.at("ph") == "X";
  CHECK(events == s.size());
}

TEST_CASE("bad input gives exit code 2 and exactly one stderr line naming the offending value") {
  const std::string base[] = {"simulate", "--schedule", "zb-h1", "--ranks", "4", "--microbatches", "8"};
  auto with = [&](std::initializer_list<std::string> extra) {
    std::vector<std::string> v(std::begin(base), std::end(base));
    v.insert(v.end(), extra);
    return v;
  };
  auto shape_of = [](std::string sched, std::string p, std::string m) {
    return std::vector<std::string>{"simulate", "--schedule", sched, "--ranks", p, "--microbatches", m};
  };
  struct bad {
    std::vector<std::string> args;
    std::string mentions;
  };
  const std::vector<bad> cases = {
      {shape_of("no-such-schedule", "4", "8"), "no-such-schedule"},
      {shape_of("zb-h1", "0", "8"), "--ranks '0'"},
      {shape_of("zb-h1", "-3", "8"), "--ranks '-3'"},
      {shape_of("zb-h1", "4", "0"), "--microbatches '0'"},
      {shape_of("zb-h1", "4x", "8"), "'4x'"},
      {shape_of("zb-h1", "", "8"), "--ranks ''"},
      {shape_of("zb-h1", "4", "8.5"), "'8.5'"},
      {shape_of("zb-h1", "99999999999999999999", "8"), "99999999999999999999"},
      {with({"--f", "nan"}), "'nan'"},
      {with({"--b", "1e999"}), "'1e999'"},
      {with({"--w", "inf"}), "'inf'"},
      {with({"--c", "-1"}), "'-1'"},
      {with({"--f", "1x"}), "'1x'"},
      {with({"--fb", ""}), "--fb"},
      {with({"--mem-w-ratio", "2"}), "'2'"},
      {with({"--chunks", "0"}), "--chunks '0'"},
      {with({"--chunks", "2"}), "chunks=2"},  // a shape zb-h1 cannot run
      {with({"--placement", "diagonal"}), "'diagonal'"},
      {with({"--placement", "v"}), "--placement applies to cost-aware families"},  // zb-h1 has a fixed placement
      {{"simulate", "--schedule", "zb-auto", "--ranks", "4", "--microbatches", "8", "--placement", "v", "--chunks", "1"},
       "--placement v runs 2 chunk(s) per rank, but --chunks is 1"},
      {with({"--mem-limit", "0"}), "--mem-limit '0'"},
      {with({"--bogus-flag"}), "--bogus-flag"},
      {{"simulate", "--ranks", "4", "--microbatches", "8"}, "--schedule"},
      {{"simulate", "--schedule", "zb-h1", "--ranks", "4"}, "--microbatches"},
      {{"frobnicate"}, "'frobnicate'"},
      {{"render", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--svg", "/nonexistent-dir/x.svg"},
       "/nonexistent-dir/x.svg"},
      {{"render", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--trace", LOOM_CLI_WORKDIR},
       LOOM_CLI_WORKDIR},
      {{"render", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--step", "-1"}, "'-1'"},
      {{"render", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--width", "wide"}, "'wide'"},
  };
  for (auto const& c : cases) {
    std::string shown;
    for (auto const& a : c.args) shown += a + " ";
    CAPTURE(shown);
    auto r = run(c.args);
    CHECK(r.code == 2);
    CHECK(line_count(r.err) == 1);
    CHECK(r.err.rfind("loom: ", 0) == 0);
    CHECK(r.err.find(c.mentions) != std::string::npos);
    CHECK(r.out.empty());
  }
  // A family's rule is reported verbatim: ZB-H1 runs one chunk per rank.
  auto r = run(with({"--chunks", "3"}));
  auto rule = loom::check(loom::zb_h1{}, {4, 8, 3});
  REQUIRE(!rule.empty());
  CHECK(r.err == "loom: " + rule + "\n");
}

TEST_CASE("help is not an error") {
  auto r = run({"--help"});
  CHECK(r.code == 0);
  CHECK(r.out.find("simulate") != std::string::npos);
  r = run({"render", "--help"});
  CHECK(r.code == 0);
  CHECK(r.out.find("--svg") != std::string::npos);
}

TEST_CASE("a cost-aware family's placement flag and chunk count follow each other") {
  // zb-auto on the V placement needs no --chunks: the placement names 2 chunks per rank.
  auto r = run({"simulate", "--schedule", "zb-auto", "--ranks", "4", "--microbatches", "8", "--placement", "v", "--json"});
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("chunks") == 2);
  CHECK(j.at("placement") == "v");
  auto const& e = loom::default_registry().at("zb-auto");
  loom::generate_options o;
  o.placement = loom::placement_kind::v;
  auto sim = loom::simulate(e.make({.ranks = 4, .microbatches = 8, .chunks = 2}, o));
  CHECK(j.at("makespan").get<double>() == doctest::Approx(sim.makespan));
  // And --chunks 2 alone means the V placement too; the loop placement is the default.
  auto v = run({"simulate", "--schedule", "zb-auto", "--ranks", "4", "--microbatches", "8", "--chunks", "2", "--json"});
  REQUIRE(v.code == 0);
  CHECK(nlohmann::json::parse(v.out).at("placement") == "v");
  auto loop = run({"simulate", "--schedule", "zb-auto", "--ranks", "4", "--microbatches", "8", "--json"});
  REQUIRE(loop.code == 0);
  CHECK(nlohmann::json::parse(loop.out).at("placement") == "loop");
  CHECK(nlohmann::json::parse(loop.out).at("chunks") == 1);
  // The loop placement runs any chunk count (interleaved stages with split backward).
  for (const char* v : {"2", "3"}) {
    auto il = run({"simulate", "--schedule", "zb-auto", "--ranks", "4", "--microbatches", "8", "--placement", "loop",
                   "--chunks", v, "--json"});
    REQUIRE(il.code == 0);
    CHECK(nlohmann::json::parse(il.out).at("placement") == "loop");
    CHECK(nlohmann::json::parse(il.out).at("chunks") == std::stoi(v));
  }
  auto three = run({"simulate", "--schedule", "zb-auto", "--ranks", "4", "--microbatches", "8", "--chunks", "3", "--json"});
  REQUIRE(three.code == 0);
  CHECK(nlohmann::json::parse(three.out).at("placement") == "loop");
}

TEST_CASE("--costs FILE: simulate and best use the stage- and link-resolved model, and bad files name the field") {
  auto write = [](const std::string& name, const std::string& text) {
    const std::string p = tmp_path(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  };
  // The hand-computed case of tests/schedule/test_cost_model.cpp: 1F1B on 2 ranks, makespan 21.
  const std::string good = write("costs-good.json", R"({
    "stages": [{"f": 1, "b": 2, "w": 1, "activation": 3, "message_bytes": 100},
               {"f": 2, "b": 3, "w": 2, "activation": 5}],
    "links": {"intra": {"alpha": 0.5, "beta": 0.01}},
    "mem_w_ratio": 0.25})");
  auto r = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs", good, "--json"});
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["makespan"].get<double>() == 21);
  CHECK(j["peak_activation"][0].get<double>() == 6);
  CHECK(j["lower_bound"].is_null());
  r = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs", good});
  CHECK(r.code == 0);
  CHECK(r.out.find("makespan         21\n") != std::string::npos);
  CHECK(r.out.find("costs            from " + good + ": 2 stages") != std::string::npos);
  // best ranks by makespan under the model and agrees with simulate for each row.
  r = run({"best", "--ranks", "2", "--microbatches", "4", "--costs", good, "--json"});
  REQUIRE(r.code == 0);
  j = nlohmann::json::parse(r.out);
  double prev = 0;
  for (auto const& row : j["ranking"]) {
    if (!row["within_mem_limit"].get<bool>()) break;
    CHECK(row["makespan"].get<double>() >= prev);
    prev = row["makespan"].get<double>();
  }
  CHECK(prev > 0);

  struct bad {
    std::string file;
    std::string mentions;
  };
  const std::vector<bad> cases = {
      {R"({"stages": [{"f": 1, "b": 1}]})", "stages[0].w is missing"},
      {R"({"stages": [{"f": 1, "b": 1, "w": -2}]})", "stages[0].w must be >= 0 (got -2)"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}, {"f": "x", "b": 1, "w": 1}]})", "stages[1].f must be a number (got \"x\")"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1, "flops": 3}]})", "unknown field stages[0].flops"},
      {R"({"stages": []})", "stages must be a non-empty list"},
      {R"({"stage": [{"f": 1, "b": 1, "w": 1}]})", "unknown field stage"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}], "links": {"intra": {"beta": 1}}})", "links.intra.alpha is missing"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}], "ranks_per_node": 1.5})", "ranks_per_node must be an integer"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}], "mem_w_ratio": 3})", "mem_w_ratio must be in [0, 1] (got 3)"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}], "vocab": {"s": -1}})", "vocab.s must be >= 0 (got -1)"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}], "vocab": {"x": 1}})", "unknown field vocab.x"},
      {R"({"stages": [{"f": 0, "b": 0, "w": 0}]})", "every stage's f, b and w are 0; at least one must be > 0"},
      {R"({"stages": [{"f": 1, "b": 1, "w": 1}])", "not valid JSON"},
      {R"([1, 2])", "the document must be an object"},
  };
  int i = 0;
  for (auto const& c : cases) {
    const std::string p = write("costs-bad-" + std::to_string(i++) + ".json", c.file);
    CAPTURE(c.file);
    auto e = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs", p});
    CHECK(e.code == 2);
    CHECK(line_count(e.err) == 1);
    CHECK(e.err.find("loom: cost file '" + p + "': " + c.mentions) == 0);
    CHECK(e.out.empty());
  }
  // A model that cannot be fitted to the schedule's stages; --costs with --f; a missing file.
  const std::string three = write("costs-three.json", R"({"stages": [{"f": 1, "b": 1, "w": 1}, {"f": 1, "b": 1, "w": 1}, {"f": 1, "b": 1, "w": 1}]})");
  auto e = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs", three});
  CHECK(e.code == 2);
  CHECK(e.err == "loom: cost model: 3 stages cannot be fitted to a schedule of 2 stages (one count must be a multiple of the other)\n");
  e = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs", good, "--f", "2"});
  CHECK(e.code == 2);
  CHECK(e.err.find("give either --costs or --f") != std::string::npos);
  e = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--costs", tmp_path("no-such.json")});
  CHECK(e.code == 2);
  CHECK(e.err.find("cannot read --costs") != std::string::npos);
}

TEST_CASE("--costs FILE: a stage's update cost lengthens an asynchronous schedule by its updates, and is checked") {
  auto write = [](const std::string& name, const std::string& text) {
    const std::string p = tmp_path(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  };
  const std::string plain = write("costs-update-0.json", R"({"stages": [{"f": 1, "b": 1, "w": 1}, {"f": 1, "b": 1, "w": 1}]})");
  const std::string upd = write("costs-update-1.json", R"({"stages": [{"f": 1, "b": 1, "w": 1, "update": 0.5}, {"f": 1, "b": 1, "w": 1, "update": 0.5}]})");
  auto sim = [](const std::string& schedule, const std::string& file) {
    auto r = run({"simulate", "--schedule", schedule, "--ranks", "2", "--microbatches", "4", "--steps", "4", "--costs", file, "--json"});
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  // pipedream-2bw updates once per step (4 per stage), pipedream after every microbatch (16): each
  // update adds 0.5 to its rank's busy time.
  for (auto [schedule, updates] : {std::pair<const char*, int>{"pipedream-2bw", 4}, {"pipedream", 16}}) {
    CAPTURE(schedule);
    const auto a = sim(schedule, plain), b = sim(schedule, upd);
    CHECK(b["makespan"].get<double>() > a["makespan"].get<double>());
    // busy time over both ranks: (1 - bubble ratio) * 2 * makespan
    auto busy = [](const nlohmann::json& j) { return (1 - j["bubble_ratio"].get<double>()) * 2 * j["makespan"].get<double>(); };
    CHECK(busy(b) - busy(a) == doctest::Approx(2 * 0.5 * updates));
  }
  // loom best --steps 4: an asynchronous row is its run's makespan; a synchronous row is 4 flushed
  // steps, each followed by the slowest rank's update of its stage (0.5).
  auto r = run({"best", "--ranks", "2", "--microbatches", "4", "--steps", "4", "--costs", upd, "--json"});
  REQUIRE(r.code == 0);
  const auto best = nlohmann::json::parse(r.out);
  auto row_of = [&](const std::string& name) {
    for (auto const& row : best["ranking"])
      if (row["schedule"] == name) return row;
    FAIL("no row " << name);
    return nlohmann::json();
  };
  auto one = run({"simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "4", "--costs", upd, "--json"});
  REQUIRE(one.code == 0);
  CHECK(row_of("1f1b")["makespan"].get<double>() == doctest::Approx(4 * (nlohmann::json::parse(one.out)["makespan"].get<double>() + 0.5)));
  CHECK(row_of("pipedream-2bw")["makespan"].get<double>() == doctest::Approx(sim("pipedream-2bw", upd)["makespan"].get<double>()));
  const std::string bad = write("costs-update-bad.json", R"({"stages": [{"f": 1, "b": 1, "w": 1, "update": -1}]})");
  auto e = run({"simulate", "--schedule", "pipedream", "--ranks", "2", "--microbatches", "2", "--steps", "2", "--costs", bad});
  CHECK(e.code == 2);
  CHECK(e.err.find("stages[0].update must be >= 0 (got -1)") != std::string::npos);
}

TEST_CASE("docs/costs/vocab-heavy-8.json read by the CLI is the model docs/costs.md's table is computed from") {
  const loom::cost_model m = loom::docs::vocab_heavy_8();
  for (auto fam : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"}) {
    auto r = run({"simulate", "--schedule", fam, "--ranks", "8", "--microbatches", "16", "--costs",
                  std::string(LOOM_SOURCE_DIR) + "/docs/costs/vocab-heavy-8.json", "--json"});
    REQUIRE(r.code == 0);
    auto j = nlohmann::json::parse(r.out);
    const auto& e = loom::default_registry().at(fam);
    auto s = e.make({8, 16}, {.cost = loom::share_costs(m, 8), .model = m});
    CAPTURE(fam);
    CHECK(j["makespan"].get<double>() == loom::simulate(s, m).makespan);
  }
}
