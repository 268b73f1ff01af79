// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `loom plan` run as a program: its --json ranking is the library's (loom::plan on the same
// files), --top bounds it, the example files in docs/plan/ read cleanly, and every bad file
// (a bad value, a wrong type, a missing or unknown field, malformed JSON, no file) exits 2 with
// one line on stderr that names the file and the field.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "plan_io.hpp"

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct result {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Per process: ctest may run the test cases (each its own process) in parallel.
std::string tmp(const std::string& name) { return std::string(PLAN_TMP_DIR) + "/" + std::to_string(getpid()) + "-" + name; }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

result run(const std::string& args) {
  result r;
  const std::string err = tmp("stderr.txt");
  std::string cmd = std::string(LOOM_CLI) + " " + args + " 2>" + err;
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) r.out.append(buf.data(), n);
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err);
  return r;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

const char* model_text = R"({"name": "small", "layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 32000,
  "micro_batch": 1, "global_batch": 64})";
const char* cluster_text = R"({"name": "sixteen", "gpus": 16, "gpus_per_node": 4, "memory_gib": 8, "peak_flops": 1e14,
  "achievable_fraction": 0.5, "intra": {"alpha": 5e-6, "beta": 5e-12}, "inter": {"alpha": 1e-5, "beta": 5e-11}})";

// Writes the good files with `from` replaced by `to` in one of them; runs `loom plan` on them.
result run_with(bool model, const std::string& from, const std::string& to) {
  std::string m = model_text, c = cluster_text;
  std::string& s = model ? m : c;
  if (!from.empty()) {
    auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
  }
  write(tmp("m.json"), m);
  write(tmp("c.json"), c);
  return run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json"));
}

void check_usage_error(const result& r, const std::string& expected) {
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
  CHECK(r.err.find(expected) != std::string::npos);
}

}  // namespace

TEST_CASE("loom plan --json ranks exactly what loom::plan ranks on the same files") {
  write(tmp("m.json"), model_text);
  write(tmp("c.json"), cluster_text);
  result r = run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --json --top 4");
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  auto j = nlohmann::json::parse(r.out);
  auto rep = loom::plan(loom::plan_io::read_model(tmp("m.json")).desc, loom::plan_io::read_cluster(tmp("c.json")).desc);
  auto const& rows = j.at("ranking");
  REQUIRE(rows.size() == std::min<std::size_t>(4, rep.ranked.size()));
  CHECK(j.at("fitting").get<std::size_t>() == rep.ranked.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto const& x = rows[i];
    auto const& k = rep.ranked[i].config;
    CHECK(x.at("dp").get<long long>() == k.dp);
    CHECK(x.at("tp").get<long long>() == k.tp);
    CHECK(x.at("pp").get<long long>() == k.pp);
    CHECK(x.at("schedule").get<std::string>() == k.family);
    CHECK(x.at("chunks").get<int>() == k.chunks);
    CHECK(x.at("step_time").get<double>() == doctest::Approx(rep.ranked[i].step_time));
    CHECK(x.at("memory_bytes").get<double>() <= 8.0 * (1LL << 30));
    CHECK(x.at("dp").get<long long>() * x.at("tp").get<long long>() * x.at("pp").get<long long>() == 16);
  }
}

TEST_CASE("loom plan prints a markdown table of --top rows, and the restricted search obeys --families, --recompute, --sp") {
  write(tmp("m.json"), model_text);
  write(tmp("c.json"), cluster_text);
  result r = run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --top 2");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("| rank | dp | tp | pp |") != std::string::npos);
  CHECK(r.out.find("\n| 2 |") != std::string::npos);
  CHECK(r.out.find("\n| 3 |") == std::string::npos);
  r = run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --json --top 100 --families 1f1b --recompute full --sp off");
  REQUIRE(r.status == 0);
  const auto doc = nlohmann::json::parse(r.out);  // a range-for over a temporary's member would dangle
  for (auto const& x : doc.at("ranking")) {
    CHECK(x.at("schedule") == "1f1b");
    CHECK(x.at("recompute") == "full");
    CHECK(x.at("sp") == false);
  }
}

TEST_CASE("loom plan --vocab-parallel adds the vocabulary-parallel families, and --families takes them by name") {
  const std::string files = "plan --model " + std::string(LOOM_SOURCE_DIR) + "/docs/plan/gpt-70b.model.json --cluster " +
                            std::string(LOOM_SOURCE_DIR) + "/docs/plan/selene-64.cluster.json --json --top 1000 ";
  result r = run(files + "--families 1f1b,v-half --recompute selective --sp on --vocab-parallel");
  REQUIRE(r.status == 0);
  const auto doc = nlohmann::json::parse(r.out);
  bool vocab = false, plain = false;
  for (auto const& x : doc.at("ranking")) {
    const std::string s = x.at("schedule");
    CHECK((s == "1f1b" || s == "v-half" || s == "1f1b-vocab-1" || s == "1f1b-vocab-2" || s == "v-half-vocab-1" || s == "v-half-vocab-2"));
    vocab = vocab || s.find("vocab") != std::string::npos;
    plain = plain || s.find("vocab") == std::string::npos;
  }
  CHECK(vocab);
  CHECK(plain);
  CHECK(doc.at("ranking").at(0).at("schedule") == "v-half-vocab-2");  // docs/plan.md: the best at 128256 rows
  r = run(files + "--families v-half-vocab-1 --recompute selective --sp on");
  REQUIRE(r.status == 0);
  const auto only = nlohmann::json::parse(r.out);  // kept: a range over a temporary's member would dangle
  for (auto const& x : only.at("ranking")) CHECK(x.at("schedule") == "v-half-vocab-1");
}

TEST_CASE("loom plan --offload tries PipeOffload over the cluster's host link, and refuses a cluster without one") {
  const std::string files = "plan --model " + tmp("m.json") + " --cluster " + tmp("c.json");
  write(tmp("m.json"), model_text);
  std::string c = cluster_text;
  const std::string host = R"(, "host": {"alpha": 1e-5, "beta": 1e-11}})";
  c.replace(c.rfind('}'), 1, host);
  write(tmp("c.json"), c);
  result r = run(files + " --offload --recompute selective --sp on --families 1f1b --json --top 1000");
  REQUIRE(r.status == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc.contains("refused_offload_plans"));
  bool offloaded = false;
  for (auto const& x : doc.at("ranking")) {
    const std::string s = x.at("schedule");
    CHECK((s == "1f1b" || s == "group-interleaved-1f1b"));
    const int off = x.at("offload_chunks"), chunks = x.at("chunks");
    CHECK(off <= chunks);
    offloaded = offloaded || off > 0;
  }
  CHECK(offloaded);
  r = run(files + " --offload --recompute selective --sp on --families 1f1b");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("offload plans refused") != std::string::npos);
  CHECK(r.out.find("group-interleaved-1f1b g=") != std::string::npos);
  // No host link: one line naming the field.
  write(tmp("c.json"), cluster_text);
  check_usage_error(run(files + " --offload"), "offload needs the cluster's link to host memory (field \"host\"");
  // A bad host link: one line naming it.
  c = cluster_text;
  c.replace(c.rfind('}'), 1, R"(, "host": {"alpha": 1e-5}})");
  write(tmp("c.json"), c);
  check_usage_error(run(files), "field \"host.beta\"");
}

TEST_CASE("the example files in docs/plan read cleanly") {
  for (const char* m : {"gpt3-175b", "gpt-145b", "gpt-310b", "mt-nlg-530b", "gpt-1t", "gpt-70b", "switch-large-moe"})
    CHECK_NOTHROW(loom::plan_io::read_model(std::string(LOOM_SOURCE_DIR) + "/docs/plan/" + m + ".model.json"));
  for (const char* c : {"selene-64", "selene-64-host", "selene-1024", "selene-1536", "selene-1920", "selene-2520", "selene-3072"})
    CHECK_NOTHROW(loom::plan_io::read_cluster(std::string(LOOM_SOURCE_DIR) + "/docs/plan/" + c + ".cluster.json"));
}

TEST_CASE("a bad value in the model file exits 2 with one line naming the field") {
  check_usage_error(run_with(true, "\"hidden\": 1024", "\"hidden\": -3"),
                    "loom: model file " + tmp("m.json") + ": field \"hidden\" must be a positive integer (got -3)");
  check_usage_error(run_with(true, "\"layers\": 8", "\"layers\": 2.5"), "field \"layers\" must be a positive integer (got 2.5)");
  check_usage_error(run_with(true, "\"seq\": 1024", "\"seq\": \"long\""), "field \"seq\" must be a positive integer (got \"long\")");
  check_usage_error(run_with(true, "\"heads\": 16", "\"heads\": 7"), "field \"heads\" must divide \"hidden\"");
  check_usage_error(run_with(true, "\"vocab\": 32000,", ""), "field \"vocab\" is missing");
  check_usage_error(run_with(true, "\"layers\": 8", "\"layers\": 8, \"hiden\": 3"), "unknown field \"hiden\"");
}

TEST_CASE("a spatial-temporal model file (frames) plans DSP with --context-parallel, and bad frames exit 2 naming the field") {
  result r = run_with(true, "\"seq\": 1024", "\"seq\": 1024, \"frames\": 16");
  REQUIRE(r.status == 0);
  r = run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --context-parallel --top 1000 --families 1f1b");
  REQUIRE(r.status == 0);
  CHECK(r.out.find(" dsp |") != std::string::npos);
  check_usage_error(run_with(true, "\"seq\": 1024", "\"seq\": 1024, \"frames\": 3"),
                    "field \"frames\" must divide \"seq\" (1024 tokens are not 3 frames of equal size)");
  check_usage_error(run_with(true, "\"seq\": 1024", "\"seq\": 1024, \"frames\": 0"), "field \"frames\" must be a positive integer (got 0)");
}

TEST_CASE("loom plan with experts searches ep: the table shows ep, the experts' memory and the all-to-all volume, as loom::plan ranks them") {
  const std::string with = "\"global_batch\": 64, \"experts\": 8, \"top_k\": 2, \"moe_every\": 2, \"capacity_factor\": 1.25";
  result r = run_with(true, "\"global_batch\": 64", with);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("| rank | dp | ep | tp | pp |") != std::string::npos);
  CHECK(r.out.find("| experts (GiB) | all-to-all (GiB per step) |") != std::string::npos);
  r = run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --json --top 1000 --families 1f1b");
  REQUIRE(r.status == 0);
  const auto doc = nlohmann::json::parse(r.out);
  loom::plan_options o;
  o.families = {"1f1b"};
  const auto rep = loom::plan(loom::plan_io::read_model(tmp("m.json")).desc, loom::plan_io::read_cluster(tmp("c.json")).desc, o);
  REQUIRE(doc.at("ranking").size() == rep.ranked.size());
  bool some_ep = false;
  for (std::size_t i = 0; i < rep.ranked.size(); ++i) {
    auto const& x = doc.at("ranking")[i];
    auto const& y = rep.ranked[i];
    CHECK(x.at("ep").get<long long>() == y.config.ep);
    CHECK(x.at("all_to_all_bytes").get<double>() == doctest::Approx(y.all_to_all_bytes));
    CHECK(x.at("expert_bytes").get<double>() == doctest::Approx(y.expert_bytes));
    CHECK(8 % y.config.ep == 0);
    some_ep = some_ep || y.config.ep > 1;
  }
  CHECK(some_ep);
}

TEST_CASE("bad expert fields in the model file exit 2 with one line naming the field") {
  check_usage_error(run_with(true, "\"global_batch\": 64", "\"global_batch\": 64, \"top_k\": 2"),
                    "field \"top_k\" describes the experts: it needs \"experts\" (got 2)");
  check_usage_error(run_with(true, "\"global_batch\": 64", "\"global_batch\": 64, \"experts\": 4, \"top_k\": 5"),
                    "field \"top_k\" must be at most \"experts\" 4 (got 5)");
  check_usage_error(run_with(true, "\"global_batch\": 64", "\"global_batch\": 64, \"experts\": 0"), "field \"experts\" must be a positive integer (got 0)");
  check_usage_error(run_with(true, "\"global_batch\": 64", "\"global_batch\": 64, \"experts\": 4, \"capacity_factor\": -1"),
                    "field \"capacity_factor\" must be a number >= 0 (got -1)");
  check_usage_error(run_with(true, "\"global_batch\": 64", "\"global_batch\": 64, \"experts\": 4, \"moe_every\": 0"),
                    "field \"moe_every\" must be a positive integer (got 0)");
}

TEST_CASE("a bad value in the cluster file exits 2 with one line naming the field") {
  check_usage_error(run_with(false, "\"memory_gib\": 8", "\"memory_gib\": 0"),
                    "loom: cluster file " + tmp("c.json") + ": field \"memory_gib\" must be a number > 0 (got 0)");
  check_usage_error(run_with(false, "\"beta\": 5e-11", "\"beta\": -1"), "field \"inter.beta\" must be a number >= 0 (got -1)");
  check_usage_error(run_with(false, "\"achievable_fraction\": 0.5", "\"achievable_fraction\": 2"),
                    "field \"achievable_fraction\" must be at most 1");
  check_usage_error(run_with(false, "\"memory_gib\": 8", "\"memory_gib\": 8, \"reserved_gib\": 9"),
                    "field \"reserved_gib\" must be a number >= 0 and below \"memory_gib\" (got 9 GiB)");
  check_usage_error(run_with(false, "\"gpus\": 16", "\"gpus\": 18"), "field \"gpus\" must be a multiple of \"gpus_per_node\"");
  check_usage_error(run_with(false, "\"intra\": {\"alpha\": 5e-6, \"beta\": 5e-12}", "\"intra\": 3"), "field \"intra\" must be an object");
  check_usage_error(run_with(false, "\"alpha\": 5e-6,", "\"alpha\": 5e-6, \"gamma\": 1,"), "unknown field \"intra.gamma\"");
}

TEST_CASE("a missing file, malformed JSON and bad options exit 2 with one line") {
  check_usage_error(run("plan --model " + tmp("no-such.json") + " --cluster " + tmp("c.json")), "model file " + tmp("no-such.json") + ": cannot be read");
  write(tmp("bad.json"), "{\"layers\": 2,");
  write(tmp("c.json"), cluster_text);
  check_usage_error(run("plan --model " + tmp("bad.json") + " --cluster " + tmp("c.json")), "malformed JSON");
  write(tmp("arr.json"), "[1, 2]");
  check_usage_error(run("plan --model " + tmp("arr.json") + " --cluster " + tmp("c.json")), "must hold one JSON object");
  write(tmp("m.json"), model_text);
  check_usage_error(run("plan --model " + tmp("m.json")), "--cluster FILE is required");
  check_usage_error(run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --top 0"), "--top '0' must be >= 1");
  check_usage_error(run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --recompute some"), "--recompute 'some'");
  check_usage_error(run("plan --model " + tmp("m.json") + " --cluster " + tmp("c.json") + " --families 1f1b,nope"), "unknown schedule 'nope'");
}
