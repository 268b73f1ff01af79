// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Reading `loom plan`'s model and cluster files (JSON, nlohmann_json) and printing its table.
//! Shared by `tools/loom/plan.cpp` and `docs/plan-table.cpp`, so the document shows exactly what
//! the command prints. Every error is a `loom::config_error` of one line that names the file and
//! the field (`model file m.json: field "hidden" must be a positive integer (got -3)`); the CLI
//! turns it into exit status 2.
//!
//! Model file: `layers`, `hidden`, `heads`, `seq`, `vocab`, `global_batch` (positive integers),
//! optional `micro_batch` (1), `bytes_per_element` (2), `state_bytes_per_param` (16), `name`,
//! `comment`; for a mixture of experts `experts` (E), and with it optionally `top_k` (1),
//! `moe_every` (1) and `capacity_factor` (1; 0: no dropping); for a spatial-temporal model
//! `frames` (0: a sequence model; see `loom::model_desc::frames`). Cluster file: `gpus`, `gpus_per_node` (positive integers), `memory_gib`,
//! `peak_flops`, `achievable_fraction` (numbers > 0), `intra` and `inter` (objects with `alpha`
//! in seconds and `beta` in seconds per byte), optional `reserved_gib` (0: memory the model cannot
//! use), `host` (the same kind of object: each GPU's link to host memory, which `--offload` needs),
//! `name`, `comment`. Unknown fields are errors.

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/plan.hpp>

namespace loom::plan_io {

//! A model or cluster file as read: the description and its optional `name`.
template <class Desc>
struct named {
  Desc desc{};       //!< what the planner reads
  std::string name;  //!< the file's `name` (may be empty), for headings
};

namespace detail {

//! Parses `path` as one JSON object; throws `config_error` naming `what` ("model file") and the path.
inline nlohmann::json read_object(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(what + " " + path + ": cannot be read: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> keep from "parse error".
    if (auto at = msg.find("parse error"); at != std::string::npos) msg = msg.substr(at);
    for (char& c : msg)
      if (c == '\n') c = ' ';
    throw config_error(what + " " + path + ": malformed JSON: " + msg);
  }
  if (!j.is_object()) throw config_error(what + " " + path + ": must hold one JSON object");
  return j;
}

//! Reads the fields of one object, naming each in errors; `done()` rejects unknown fields.
struct fields {
  std::string where;   //!< "model file m.json"
  std::string prefix;  //!< "" or "intra."
  const nlohmann::json& j;            //!< the object read
  std::vector<std::string> seen{};    //!< the fields asked for so far (known fields)

  //! Throws: `<where>: field "<prefix><key>" <rule> (got <value as JSON>)`.
  [[noreturn]] void fail(const std::string& key, const std::string& rule, const nlohmann::json& v) const {
    throw config_error(where + ": field \"" + prefix + key + "\" " + rule + " (got " + v.dump() + ")");
  }
  //! The value of `key`, or null; marks `key` as known.
  const nlohmann::json* find(const std::string& key) {
    seen.push_back(key);
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  //! A JSON integer in [1, 2^53]; `fallback` when absent (an error without one).
  long long positive_int(const std::string& key, std::optional<long long> fallback = std::nullopt) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      throw config_error(where + ": field \"" + prefix + key + "\" is missing (a positive integer)");
    }
    if (v->is_number_unsigned() && v->get<unsigned long long>() > 0 && v->get<unsigned long long>() <= (1ULL << 53)) return v->get<long long>();
    if (v->is_number_integer() && v->get<long long>() > 0 && v->get<long long>() <= (1LL << 53)) return v->get<long long>();
    fail(key, "must be a positive integer", *v);
  }
  //! A finite JSON number >= 0 (> 0 when `positive`); `fallback` when absent (an error without one).
  double number(const std::string& key, bool positive, std::optional<double> fallback = std::nullopt) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      throw config_error(where + ": field \"" + prefix + key + "\" is missing (a number" + (positive ? " > 0)" : " >= 0)"));
    }
    if (!v->is_number()) fail(key, positive ? "must be a number > 0" : "must be a number >= 0", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < 0 || (positive && x == 0)) fail(key, positive ? "must be a number > 0" : "must be a number >= 0", *v);
    return x;
  }
  //! An optional string ("" when absent).
  std::string string(const std::string& key) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return {};
    if (!v->is_string()) fail(key, "must be a string", *v);
    return v->get<std::string>();
  }
  //! A required link object `{alpha, beta}` (no other fields).
  link_cost link(const std::string& key) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) throw config_error(where + ": field \"" + prefix + key + "\" is missing (an object with alpha and beta)");
    if (!v->is_object()) fail(key, "must be an object with alpha (s) and beta (s/byte)", *v);
    fields f{where, prefix + key + ".", *v};
    link_cost l{.alpha = f.number("alpha", false), .beta = f.number("beta", false)};
    f.done();
    return l;
  }
  //! Throws for the first field that no reader asked for.
  void done() const {
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool known = false;
      for (auto const& k : seen) known = known || k == it.key();
      if (!known) {
        std::string list;
        for (auto const& k : seen) list += (list.empty() ? "" : ", ") + k;
        throw config_error(where + ": unknown field \"" + prefix + it.key() + "\" (known: " + list + ")");
      }
    }
  }
};

}  // namespace detail

//! Reads a model file (see the file comment); throws `config_error` naming the field.
inline named<model_desc> read_model(const std::string& path) {
  const nlohmann::json j = detail::read_object("model file", path);
  detail::fields f{"model file " + path, "", j};
  named<model_desc> out;
  out.name = f.string("name");
  f.string("comment");
  model_desc& m = out.desc;
  m.layers = f.positive_int("layers");
  m.hidden = f.positive_int("hidden");
  m.heads = f.positive_int("heads");
  m.seq = f.positive_int("seq");
  m.vocab = f.positive_int("vocab");
  m.global_batch = f.positive_int("global_batch");
  m.micro_batch = f.positive_int("micro_batch", 1);
  const long long bytes = f.positive_int("bytes_per_element", 2);
  if (bytes > 8) f.fail("bytes_per_element", "must be at most 8", j.at("bytes_per_element"));
  m.bytes_per_element = static_cast<int>(bytes);
  m.state_bytes_per_param = f.number("state_bytes_per_param", false, 16.0);
  m.experts = f.positive_int("experts", 0);
  const long long k = f.positive_int("top_k", 1);
  m.moe_every = f.positive_int("moe_every", 1);
  m.capacity_factor = f.number("capacity_factor", false, 1.0);
  m.frames = f.positive_int("frames", 0);
  if (m.experts == 0)
    for (const char* key : {"top_k", "moe_every", "capacity_factor"})
      if (j.contains(key)) f.fail(key, "describes the experts: it needs \"experts\"", j.at(key));
  if (k > m.experts && m.experts > 0) f.fail("top_k", "must be at most \"experts\" " + std::to_string(m.experts), j.at("top_k"));
  m.top_k = static_cast<int>(k);
  f.done();
  if (auto rule = loom::detail::check_model_desc(m); !rule.empty()) throw config_error("model file " + path + ": " + rule);
  return out;
}

//! Reads a cluster file (see the file comment); throws `config_error` naming the field.
inline named<cluster_desc> read_cluster(const std::string& path) {
  const nlohmann::json j = detail::read_object("cluster file", path);
  detail::fields f{"cluster file " + path, "", j};
  named<cluster_desc> out;
  out.name = f.string("name");
  f.string("comment");
  cluster_desc& c = out.desc;
  c.gpus = f.positive_int("gpus");
  c.gpus_per_node = f.positive_int("gpus_per_node");
  c.memory_bytes = f.number("memory_gib", true) * 1024.0 * 1024.0 * 1024.0;
  c.reserved_bytes = f.number("reserved_gib", false, 0.0) * 1024.0 * 1024.0 * 1024.0;
  c.peak_flops = f.number("peak_flops", true);
  c.achievable_fraction = f.number("achievable_fraction", true);
  if (c.achievable_fraction > 1) f.fail("achievable_fraction", "must be at most 1", j.at("achievable_fraction"));
  c.intra = f.link("intra");
  c.inter = f.link("inter");
  if (j.contains("host")) c.host = f.link("host");  // optional: each GPU's link to host memory (offload)
  else f.find("host");
  f.done();
  if (auto rule = loom::detail::check_cluster_desc(c); !rule.empty()) throw config_error("cluster file " + path + ": " + rule);
  return out;
}

//! The schedule column: the family, with the placement for a cost-aware family on V, and a
//! grouped family's group size and offloaded chunks (`group-interleaved-1f1b g=4 offload 1`).
inline std::string schedule_label(const plan_config& k) {
  std::string out = k.family + (k.v_placement && k.family == "zb-auto" ? " (v)" : "");
  if (k.group > 0) out += " g=" + std::to_string(k.group);
  if (k.offload_chunks > 0) out += " offload " + std::to_string(k.offload_chunks);
  return out;
}

//! The tp column: the degree, and a grid's kind and shape (`16 (2d 4x4)`).
inline std::string tp_label(const plan_config& k) {
  if (k.tp_grid == tp_kind::d1) return std::to_string(k.tp);
  return std::to_string(k.tp) + " (" + std::string(loom::detail::plan_grid(k).describe().view()) + ")";
}

//! The cp column: the degree and the kind (`8 ring`, `8 usp (ulysses 2)`; `1` without).
inline std::string cp_label(const plan_config& k) {
  if (k.cp == 1) return "1";
  std::string out = std::to_string(k.cp) + " " + to_string(k.cp_kind);
  if (k.cp_kind == context_kind::usp) out += " (ulysses " + std::to_string(k.cp_ulysses) + ")";
  return out;
}

//! The markdown table `loom plan` prints: the first `top` ranked configurations.
inline std::string table(const plan_report& rep, std::size_t top) {
  if (rep.moe) {  // with experts: the ep degree, the all-to-all volume and the experts' state
    std::string out =
        "| rank | dp | ep | tp | pp | sp | recompute | schedule | chunks | microbatches | step (s) | pipeline (s) | dp all-reduce (s) "
        "| bubble | memory (GiB) | experts (GiB) | all-to-all (GiB per step) | TFLOP/s per GPU |\n"
        "|---:|---:|---:|---:|---:|:--|:--|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    char buf[512];
    constexpr double gib = 1024.0 * 1024.0 * 1024.0;
    for (std::size_t i = 0; i < rep.ranked.size() && i < top; ++i) {
      const plan_result& r = rep.ranked[i];
      const plan_config& k = r.config;
      std::snprintf(buf, sizeof buf,
                    "| %zu | %lld | %lld | %lld | %lld | %s | %s | %s | %d | %lld | %.2f | %.2f | %.3f | %.3f | %.1f | %.1f | %.1f | %.0f |\n", i + 1,
                    k.dp, k.ep, k.tp, k.pp, k.sp ? "on" : "off", to_string(k.recompute), schedule_label(k).c_str(), k.chunks, k.microbatches,
                    r.step_time, r.pipeline_time, r.dp_time, r.bubble, r.memory_bytes / gib, r.expert_bytes / gib, r.all_to_all_bytes / gib,
                    r.flops_per_gpu / 1e12);
      out += buf;
    }
    return out;
  }
  // With context parallelism searched: a cp column after dp.
  std::string out = rep.context ? "| rank | dp | cp | tp | pp | sp | recompute | schedule | chunks | microbatches | step (s) | pipeline (s) | dp all-reduce (s) "
                                  "| bubble | memory (GiB) | TFLOP/s per GPU |\n"
                                  "|---:|---:|:--|---:|---:|:--|:--|:--|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                                : "| rank | dp | tp | pp | sp | recompute | schedule | chunks | microbatches | step (s) | pipeline (s) | dp all-reduce (s) "
                                  "| bubble | memory (GiB) | TFLOP/s per GPU |\n"
                                  "|---:|---:|---:|---:|:--|:--|:--|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (std::size_t i = 0; i < rep.ranked.size() && i < top; ++i) {
    const plan_result& r = rep.ranked[i];
    const plan_config& k = r.config;
    const std::string dp = rep.context ? std::to_string(k.dp) + " | " + cp_label(k) : std::to_string(k.dp);
    std::snprintf(buf, sizeof buf, "| %zu | %s | %s | %lld | %s | %s | %s | %d | %lld | %.2f | %.2f | %.3f | %.3f | %.1f | %.0f |\n",
                  i + 1, dp.c_str(), tp_label(k).c_str(), k.pp, k.sp ? "on" : "off", to_string(k.recompute), schedule_label(k).c_str(), k.chunks,
                  k.microbatches, r.step_time, r.pipeline_time, r.dp_time, r.bubble, r.memory_bytes / (1024.0 * 1024.0 * 1024.0),
                  r.flops_per_gpu / 1e12);
    out += buf;
  }
  return out;
}

//! One ranked configuration as JSON (times in seconds, memory in bytes).
inline nlohmann::json to_json(const plan_result& r, std::size_t rank) {
  const plan_config& k = r.config;
  return {{"rank", rank},
          {"dp", k.dp},
          {"tp", k.tp},
          {"tp_kind", std::string(to_string(k.tp_grid))},
          {"tp_depth", k.tp_depth},
          {"cp", k.cp},
          {"cp_kind", to_string(k.cp_kind)},
          {"cp_ulysses", k.cp_ulysses},
          {"pp", k.pp},
          {"sp", k.sp},
          {"recompute", to_string(k.recompute)},
          {"schedule", k.family},
          {"placement", k.v_placement ? "v" : "loop"},
          {"chunks", k.chunks},
          {"group", k.group},
          {"offload_chunks", k.offload_chunks},
          {"microbatches", k.microbatches},
          {"step_time", r.step_time},
          {"pipeline_time", r.pipeline_time},
          {"dp_time", r.dp_time},
          {"bubble", r.bubble},
          {"memory_bytes", r.memory_bytes},
          {"state_bytes", r.state_bytes},
          {"activation_bytes", r.activation_bytes},
          {"flops_per_gpu", r.flops_per_gpu},
          {"ep", k.ep},
          {"expert_bytes", r.expert_bytes},
          {"all_to_all_bytes", r.all_to_all_bytes}};
}

}  // namespace loom::plan_io
