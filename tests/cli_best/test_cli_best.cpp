// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom best` ranks every runnable family: the table is sorted (within the memory limit first,
// then by bubble rate), every row agrees with the library's own generate/simulate/lower/bound,
// and bad input exits 2 with one line on stderr.
#include <doctest/doctest.h>

#include <loom/schedule.hpp>
#include <loom/schedule/bound.hpp>
#include <loom/schedule/offload.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace {

struct result {
  int status = -1;
  std::string out;
};

result run(const std::string& args) {
  result r;
  std::string cmd = std::string(LOOM_CLI) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) r.out.append(buf.data(), n);
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

void check_ranking(int p, int m, const loom::costs& k, double limit) {
  char args[256];
  std::snprintf(args, sizeof args, "best -p %d -m %d --f %g --b %g --w %g --c %g --mem-w-ratio %g --mem-limit %g --json",
                p, m, k.f, k.b, k.w, k.c, k.mem_w_ratio, limit);
  INFO(args);
  result r = run(args);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  auto const& rows = j.at("ranking");
  REQUIRE(rows.size() >= 5);
  bool seen_over = false;
  double prev = -1;
  bool saw_auto = false, saw_group = false;
  for (auto const& x : rows) {
    const bool fits = x.at("within_mem_limit").get<bool>();
    const double rate = x.at("bubble_rate").get<double>();
    // Sorted: fitting rows first, each group by bubble rate.
    if (!fits && !seen_over) {
      seen_over = true;
      prev = -1;
    }
    CHECK((fits ? !seen_over : true));
    CHECK(rate >= prev - 1e-12);
    prev = rate;
    // Agrees with the library.
    std::string name = x.at("schedule").get<std::string>();
    loom::generate_options o{.cost = k, .mem_limit = limit};
    loom::shape s{p, m, 0};
    std::string family = name;
    if (auto g = name.find(" (g="); g != std::string::npos) {
      // a grouped family, once per group: "group-interleaved-1f1b (g=3)"
      family = name.substr(0, g);
      s.group = std::stoi(name.substr(g + 4));
      saw_group = true;
    } else if (auto sp = name.find(" ("); sp != std::string::npos) {
      family = name.substr(0, sp);
      bool vee = name.find("(v)") != std::string::npos;
      o.placement = vee ? loom::placement_kind::v : loom::placement_kind::loop;
      s.chunks = vee ? 2 : 1;
      saw_auto = true;
    }
    auto const& e = loom::default_registry().at(family);
    loom::schedule sched = e.make(s, o);
    auto sim = loom::simulate(sched, k);
    CHECK(rate == doctest::Approx(sim.bubble_rate).epsilon(1e-9));
    CHECK(x.at("peak_activation").get<double>() == doctest::Approx(sim.max_peak_activation()).epsilon(1e-9));
    CHECK(fits == (sim.max_peak_activation() <= limit + 1e-9));
    CHECK(x.at("param_copies").get<int>() == sched.param_copies);
    long long sends = 0;
    for (auto const& prog : loom::lower(sched).programs)
      for (auto const& a : prog) sends += a.kind == loom::op::send ? 1 : 0;
    CHECK(x.at("p2p_transfers").get<long long>() == sends);
    // The certified bound on its placement (at the limit, or its own peak when over it) and the gap.
    auto lb = loom::lower_bound(sched, k, fits ? limit : sim.max_peak_activation());
    CHECK(x.at("lower_bound").at("bubble_rate").get<double>() == doctest::Approx(lb.bubble_rate).epsilon(1e-9));
    CHECK(x.at("lower_bound").at("makespan").get<double>() == doctest::Approx(lb.makespan).epsilon(1e-9));
    CHECK(x.at("gap").at("bubble_rate").get<double>() == doctest::Approx(rate - lb.bubble_rate).epsilon(1e-9));
    CHECK(x.at("gap").at("bubble_rate").get<double>() >= -1e-12);
    CHECK(x.at("gap").at("makespan").get<double>() >= -1e-12);
  }
  CHECK(saw_auto);
  CHECK(saw_group);
  CHECK(j.at("chosen").at("schedule") == rows.at(0).at("schedule"));
  CHECK(j.at("chosen").at("gap") == rows.at(0).at("gap"));
}

}  // namespace

TEST_CASE("loom best ranks every runnable family, sorted, in agreement with the library") {
  check_ranking(4, 8, {.f = 1, .b = 1, .w = 0.5, .c = 0.05}, 4);
  check_ranking(4, 12, {.f = 1, .b = 1.1, .w = 0.6, .c = 0.02, .mem_w_ratio = 0.4}, 8);
  check_ranking(6, 6, {}, 6);
}

TEST_CASE("loom best prints a table whose first row is the JSON ranking's first, and bytes when asked") {
  result t = run("best -p 4 -m 8 --w 0.5 --mem-limit 4 --activation-bytes 1000");
  REQUIRE(t.status == 0);
  result j = run("best -p 4 -m 8 --w 0.5 --mem-limit 4 --activation-bytes 1000 --json");
  REQUIRE(j.status == 0);
  auto first = nlohmann::json::parse(j.out).at("ranking").at(0);
  std::string name = first.at("schedule").get<std::string>();
  auto line = t.out.find("\n   1  ");
  REQUIRE(line != std::string::npos);
  CHECK(t.out.find(name, line) == line + 7);
  CHECK(first.at("p2p_bytes").get<double>() == doctest::Approx(1000.0 * first.at("p2p_transfers").get<double>()));
  // The text names the chosen schedule's bound and gap.
  auto chosen = t.out.find("# chosen: " + name + ";");
  REQUIRE(chosen != std::string::npos);
  CHECK(t.out.find("its gap:", chosen) != std::string::npos);
}

TEST_CASE("loom best rejects a missing shape, a --schedule and a bad limit with one line and exit 2") {
  for (const char* args : {"best -m 8", "best -p 4", "best -p 4 -m 8 -s 1f1b", "best -p 4 -m 8 --mem-limit 0.5",
                           "best -p 4 -m 8 --mem-limit x"}) {
    INFO(args);
    result r = run(args);
    CHECK(r.status == 2);
    CHECK(r.out.find("loom: ") == 0);
    CHECK(r.out.find('\n') == r.out.size() - 1);
  }
}

TEST_CASE("loom best --offload-time ranks each schedule PipeOffload's plan accepts with its first k chunks offloaded") {
  // p = 4, m = 16, unit cost per stage with 2 chunks, a limit of 2 units (half of 1F1B's peak).
  const loom::costs k{.f = 2, .b = 2, .w = 2};
  result r = run("best -p 4 -m 16 --f 2 --b 2 --w 2 --offload-time 0.2 --mem-limit 2 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  int offloaded = 0;
  for (auto const& x : j.at("ranking")) {
    const std::string name = x.at("schedule").get<std::string>();
    const auto at = name.find(" +offload ");
    if (at == std::string::npos) continue;
    ++offloaded;
    INFO(name);
    // Agrees with the library: the plan, its program, the run at the plan's copy time.
    std::string family = name.substr(0, at);
    loom::shape s{4, 16, 0};
    if (auto g = family.find(" (g="); g != std::string::npos) {
      s.group = std::stoi(family.substr(g + 4));
      family = family.substr(0, g);
    } else if (auto sp = family.find(" ("); sp != std::string::npos) {
      family = family.substr(0, sp);
    }
    const int chunks = std::stoi(name.substr(at + 10));
    const auto& e = loom::default_registry().at(family);
    const loom::schedule sched = e.make(e.resolve(s), {.cost = k, .mem_limit = 2});
    const auto plan = loom::plan_offload(sched, k, {.chunks = chunks, .time = 0.2});
    REQUIRE(plan.ok);
    loom::costs timed = k;
    timed.h = plan.copy_time / sched.stage_fraction();
    const auto sim = loom::simulate(loom::with_offload(sched, plan), timed);
    CHECK(x.at("peak_activation").get<double>() == doctest::Approx(sim.max_peak_activation()).epsilon(1e-12));
    CHECK(x.at("bubble_rate").get<double>() == doctest::Approx(sim.bubble_rate).epsilon(1e-12));
    CHECK(x.at("within_mem_limit").get<bool>() == (sim.max_peak_activation() <= 2 + 1e-9));
  }
  CHECK(offloaded >= 3);
  // At this limit an offloaded schedule is chosen, with a smaller bubble than the best that fits
  // without offload (schedules built for low memory: v-min, zb-auto under the limit).
  const std::string chosen = j.at("chosen").at("schedule").get<std::string>();
  CHECK(chosen.find(" +offload ") != std::string::npos);
  CHECK(j.at("ranking").at(0).at("within_mem_limit").get<bool>());
  result plain = run("best -p 4 -m 16 --f 2 --b 2 --w 2 --mem-limit 2 --json");
  REQUIRE(plain.status == 0);
  const auto top = nlohmann::json::parse(plain.out).at("ranking").at(0);
  CHECK(top.at("within_mem_limit").get<bool>());
  CHECK(j.at("ranking").at(0).at("bubble_rate").get<double>() < top.at("bubble_rate").get<double>() - 0.01);
  // Refusals: one line, exit 2.
  for (const char* args : {"best -p 4 -m 16 --offload-time 0", "best -p 4 -m 16 --offload-time x", "best -p 4 -m 16 --offload-time 0.2 --steps 2"}) {
    INFO(args);
    result bad = run(args);
    CHECK(bad.status == 2);
    CHECK(bad.out.find("loom: ") == 0);
  }
}

TEST_CASE("loom best --vocab-parallel ranks the vocabulary-parallel families, their passes timed by --vocab-s/-t/-e or a cost file") {
  const loom::costs k{.f = 1, .b = 1, .w = 1, .s = 0.3, .t = 0.4, .e = 0.05};
  result r = run("best -p 4 -m 8 --vocab-parallel --vocab-s 0.3 --vocab-t 0.4 --vocab-e 0.05 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  int vocab_rows = 0;
  for (auto const& x : j.at("ranking")) {
    const std::string name = x.at("schedule").get<std::string>();
    auto const* e = loom::default_registry().find(name);
    if (e == nullptr || !e->vocab) continue;
    ++vocab_rows;
    INFO(name);
    const loom::schedule sched = e->make(e->resolve({4, 8, 0}), {.cost = k});
    CHECK(sched.vocab != 0);
    const auto sim = loom::simulate(sched, k);
    REQUIRE(sim.ok);
    CHECK(x.at("bubble_rate").get<double>() == doctest::Approx(sim.bubble_rate).epsilon(1e-12));
    CHECK(x.at("makespan").get<double>() == doctest::Approx(sim.makespan).epsilon(1e-12));
    CHECK(x.at("peak_activation").get<double>() == doctest::Approx(sim.max_peak_activation()).epsilon(1e-12));
    CHECK(x.at("lower_bound").is_null());  // the bound does not model the vocabulary passes
  }
  CHECK(vocab_rows == 4);
  // Without the flag they are not ranked; the text table marks their bound as absent.
  result plain = run("best -p 4 -m 8 --json");
  REQUIRE(plain.status == 0);
  const auto plain_doc = nlohmann::json::parse(plain.out);
  for (auto const& x : plain_doc.at("ranking")) CHECK(x.at("schedule").get<std::string>().find("vocab") == std::string::npos);
  result text = run("best -p 4 -m 8 --vocab-parallel --vocab-s 0.3 --vocab-t 0.4 --vocab-e 0.05");
  REQUIRE(text.status == 0);
  CHECK(text.out.find("1f1b-vocab-2") != std::string::npos);
  // A cost file's "vocab" times the passes: slower passes, a longer step for the same schedule.
  auto makespan_with = [](const std::string& vocab) {
    const std::string path = "cli_best_vocab_costs.json";
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fprintf(f, "{\"stages\": [{\"f\": 1, \"b\": 1, \"w\": 1}], %s}\n", vocab.c_str());
    std::fclose(f);
    result c = run("best -p 4 -m 8 --vocab-parallel --costs " + path + " --json");
    std::remove(path.c_str());
    REQUIRE(c.status == 0);
    const auto doc = nlohmann::json::parse(c.out);  // kept: a range over a temporary's member would dangle
    for (auto const& x : doc.at("ranking"))
      if (x.at("schedule").get<std::string>() == "1f1b-vocab-1") return x.at("makespan").get<double>();
    FAIL("no 1f1b-vocab-1 row in " << c.out);
    return 0.0;
  };
  CHECK(makespan_with("\"vocab\": {\"s\": 1, \"t\": 1, \"e\": 0.5}") > makespan_with("\"vocab\": {\"s\": 0.1, \"t\": 0.1, \"e\": 0.05}") + 1);
  // Refusals: one line, exit 2.
  for (const char* args : {"best -p 4 -m 8 --vocab-parallel --vocab-s -1", "best -p 4 -m 8 --vocab-parallel --vocab-t x"}) {
    INFO(args);
    result bad = run(args);
    CHECK(bad.status == 2);
    CHECK(bad.out.find("loom: ") == 0);
  }
}
