// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// `--costs FILE`: the JSON form of loom::cost_model (schema in docs/costs.md). Every field is
// checked by name; anything malformed is one line naming the file and the field, exit 2.
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "cli.hpp"

namespace loom::cli {

namespace {

using nlohmann::json;

struct cost_file_reader {
  std::string path;

  [[noreturn]] void fail(const std::string& why) const { throw usage_error("cost file '" + path + "': " + why); }

  // Rejects fields outside `known` (a typo must not silently fall back to a default).
  void only(const json& obj, const std::string& where, std::initializer_list<const char*> known) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool ok = false;
      for (const char* k : known) ok = ok || it.key() == k;
      if (ok) continue;
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      fail("unknown field " + where + (where.empty() ? "" : ".") + it.key() + " (known: " + list + ")");
    }
  }

  // `obj[key]` as a finite number >= 0 (`any_sign`: any finite number), or `fallback` when absent
  // and not `required`.
  double number(const json& obj, const std::string& where, const char* key, double fallback, bool required,
                bool any_sign = false) const {
    const std::string name = where + (where.empty() ? "" : ".") + key;
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) fail(name + " is missing");
      return fallback;
    }
    if (!it->is_number()) fail(name + " must be a number (got " + it->dump() + ")");
    const double v = it->get<double>();
    if (!std::isfinite(v)) fail(name + " must be a finite number (got " + it->dump() + ")");
    if (!any_sign && v < 0) fail(name + " must be >= 0 (got " + it->dump() + ")");
    return v;
  }

  const json& object(const json& obj, const std::string& name) const {
    if (!obj.is_object()) fail(name + " must be an object (got " + obj.dump() + ")");
    return obj;
  }

  loom::link_cost link(const json& obj, const std::string& name) const {
    object(obj, name);
    only(obj, name, {"alpha", "beta"});
    return {.alpha = number(obj, name, "alpha", 0, true), .beta = number(obj, name, "beta", 0, false)};
  }

  loom::cost_model read(const json& doc) const {
    object(doc, "the document");
    only(doc, "", {"stages", "links", "vocab", "ranks_per_node", "mem_w_ratio", "comment"});
    if (doc.contains("comment") && !doc["comment"].is_string()) fail("comment must be a string");
    loom::cost_model m;
    auto st = doc.find("stages");
    if (st == doc.end()) fail("stages is missing (a list of per-stage costs)");
    if (!st->is_array() || st->empty()) fail("stages must be a non-empty list (got " + st->dump().substr(0, 40) + ")");
    if (st->size() > static_cast<std::size_t>(loom::max_ranks) * max_chunks)
      fail("stages lists " + std::to_string(st->size()) + " stages; the limit is " +
           std::to_string(loom::max_ranks * max_chunks));
    for (std::size_t i = 0; i < st->size(); ++i) {
      const std::string name = "stages[" + std::to_string(i) + "]";
      const json& e = (*st)[i];
      object(e, name);
      only(e, name, {"f", "b", "w", "fb", "activation", "message_bytes", "param_bytes", "update", "activation_bytes"});
      loom::stage_cost c;
      c.f = number(e, name, "f", 0, true);
      c.b = number(e, name, "b", 0, true);
      c.w = number(e, name, "w", 0, true);
      c.fb = number(e, name, "fb", -1, false, true);
      c.activation = number(e, name, "activation", 1, false);
      c.message_bytes = number(e, name, "message_bytes", 0, false);
      c.param_bytes = number(e, name, "param_bytes", 0, false);
      c.update = number(e, name, "update", 0, false);
      c.activation_bytes = number(e, name, "activation_bytes", 0, false);
      m.stages.push_back(c);
    }
    if (auto l = doc.find("links"); l != doc.end()) {
      object(*l, "links");
      only(*l, "links", {"intra", "inter", "host"});
      if (l->contains("intra")) m.intra = link((*l)["intra"], "links.intra");
      m.inter = l->contains("inter") ? link((*l)["inter"], "links.inter") : m.intra;
      if (l->contains("host")) m.host = link((*l)["host"], "links.host");
    }
    if (auto v = doc.find("vocab"); v != doc.end()) {  // vocabulary parallelism: one pass on one rank's shard
      object(*v, "vocab");
      only(*v, "vocab", {"s", "t", "e"});
      m.vocab_s = number(*v, "vocab", "s", 0, false);
      m.vocab_t = number(*v, "vocab", "t", 0, false);
      m.vocab_e = number(*v, "vocab", "e", 0, false);
    }
    if (auto r = doc.find("ranks_per_node"); r != doc.end()) {
      if (!r->is_number_integer() || r->get<long long>() < 0 || r->get<long long>() > loom::max_ranks)
        fail("ranks_per_node must be an integer in [0, " + std::to_string(loom::max_ranks) + "] (got " + r->dump() + ")");
      m.ranks_per_node = r->get<int>();
    }
    m.mem_w_ratio = number(doc, "", "mem_w_ratio", 1, false);
    if (m.mem_w_ratio > 1) fail("mem_w_ratio must be in [0, 1] (got " + doc["mem_w_ratio"].dump() + ")");
    double work = 0;
    for (auto const& c : m.stages) work += c.f + c.b + c.w;
    if (!(work > 0)) fail("every stage's f, b and w are 0; at least one must be > 0");
    if (std::string rule = loom::detail::check_model(m); !rule.empty()) fail(rule);
    return m;
  }
};

}  // namespace

loom::cost_model read_cost_file(const std::string& path) {
  cost_file_reader r{path};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw usage_error("cannot read --costs '" + path + "': " + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  json doc;
  try {
    doc = json::parse(buf.str());
  } catch (const json::exception& e) {
    r.fail(std::string("not valid JSON: ") + e.what());
  }
  return r.read(doc);
}

}  // namespace loom::cli
