// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// loom's own entry points into the simulator (include/loom/cudasim/sim.hpp): settings, reports,
// memory accounting, the trace, regions and kernels, names, fault injection.

#include "core.hpp"

namespace loom::cudasim {

using namespace impl;

namespace {

//! Waits until nothing runs (stuck operations of a detected deadlock do not count).
void wait_idle(std::unique_lock<std::mutex>& lk) {
  auto& s = S();
  for (;;) {
    bool busy = false;
    for (auto& o : s.live)
      if (o->state != op::st::done && !o->stuck) busy = true;
    if (!busy) return;
    s.done_cv.wait_for(lk, std::chrono::milliseconds(50));
  }
}

stream_state* stream_or_report(cudaStream_t st, const char* call) {
  cudaError_t e;
  auto* s = resolve_stream(st, e);
  if (s == nullptr) add_report(report_kind::api, std::string(call) + ": " + H().detail);
  return s;
}

}  // namespace

std::string_view to_string(report_kind k) {
  switch (k) {
    case report_kind::race: return "race";
    case report_kind::use_after_free: return "use after free";
    case report_kind::bad_pointer: return "bad pointer";
    case report_kind::deadlock: return "deadlock";
    case report_kind::capture: return "capture";
    case report_kind::nccl: return "nccl";
    case report_kind::api: return "api";
    case report_kind::undeclared: return "undeclared access";
  }
  return "?";
}

void configure(const config& c) {
  auto& s = S();
  std::unique_lock lk(s.m);
  wait_idle(lk);
  const int devices = s.cfg.devices;
  s.cfg = c;
  s.cfg.devices = std::max(devices, 1);  // the device count is fixed when the process starts
  s.rng.seed(c.seed);
  s.reports.clear();
  s.findings.clear();
  s.traces.clear();
  s.actual_accesses = 0;
  s.deadlocked = false;
  for (auto& [base, a] : s.allocs) a.shadow.clear();
  for (auto& d : s.device_use) d.peak = d.current;
  for (auto& [name, u] : s.owner_uses) u.peak = u.current;
}

config current_config() {
  auto& s = S();
  std::lock_guard lk(s.m);
  return s.cfg;
}

void reseed(std::uint64_t seed) {
  auto c = current_config();
  c.seed = seed;
  configure(c);
}

std::vector<report> reports() {
  auto& s = S();
  std::lock_guard lk(s.m);
  auto out = s.reports;
  std::vector<const finding*> fs;
  for (auto& f : s.findings) fs.push_back(&f);
  std::sort(fs.begin(), fs.end(), [](const finding* a, const finding* b) { return a->key < b->key; });
  for (auto* f : fs) out.push_back(f->r);
  return out;
}

std::string detail() { return H().detail; }

void host_release(const void* key) {
  auto& s = S();
  std::lock_guard lk(s.m);
  s.host_syncs[reinterpret_cast<std::uintptr_t>(key)].join(H().vc);
}

void host_acquire(const void* key) {
  auto& s = S();
  std::lock_guard lk(s.m);
  if (auto it = s.host_syncs.find(reinterpret_cast<std::uintptr_t>(key)); it != s.host_syncs.end()) H().vc.join(it->second);
}

memory_use device_memory(int device) {
  auto& s = S();
  std::lock_guard lk(s.m);
  if (device < 0 || static_cast<std::size_t>(device) >= s.device_use.size()) return {};
  return {s.device_use[static_cast<std::size_t>(device)].current, s.device_use[static_cast<std::size_t>(device)].peak};
}

memory_use owner_memory(std::string_view owner) {
  auto& s = S();
  std::lock_guard lk(s.m);
  auto it = s.owner_uses.find(owner);
  if (it == s.owner_uses.end()) return {};
  return {it->second.current, it->second.peak};
}

void reset_peaks() {
  auto& s = S();
  std::lock_guard lk(s.m);
  for (auto& d : s.device_use) d.peak = d.current;
  for (auto& [name, u] : s.owner_uses) u.peak = u.current;
}

std::vector<trace_entry> trace() {
  auto& s = S();
  std::lock_guard lk(s.m);
  return s.traces;
}

void begin_region(cudaStream_t stream, std::string_view label, std::span<const access> accesses) {
  auto& s = S();
  std::lock_guard lk(s.m);
  auto* st = stream_or_report(stream, "begin_region");
  if (st == nullptr) return;
  // A region inside a region (a stage call's kernels declaring their own bytes inside the call's
  // region): the inner one names and declares its operations until it ends, then the outer resumes.
  if (st->in_region) st->outer_regions.push_back({st->region_ticked, st->region_id, st->region_desc, st->region_declared});
  st->in_region = false;
  auto o = std::make_shared<op>();
  o->k = kind::marker;
  o->desc = make_desc(*st, std::string(label));
  for (auto const& a : accesses) {
    if (!s.cfg.regions) break;  // declared regions switched off: the region only names its kernels
    std::string why;
    if (!check_range(a.ptr, a.bytes, false, why)) {
      add_report(report_kind::bad_pointer, std::string(label) + " on stream '" + st->name + "' " + (a.write ? "writes " : "reads ") + why);
      continue;
    }
    auto x = reinterpret_cast<std::uintptr_t>(a.ptr);
    o->acc.push_back({x, x + a.bytes, a.write});
  }
  st->in_region = true;
  st->region_ticked = false;
  st->region_id = ++s.region_ids;
  st->region_desc = o->desc;
  st->region_declared = std::make_shared<const std::vector<access_rec>>(o->acc);
  if (auto e = enqueue(*st, o); e != cudaSuccess) add_report(report_kind::api, "begin_region(" + std::string(label) + "): " + H().detail);
}

void end_region(cudaStream_t stream) {
  auto& s = S();
  std::lock_guard lk(s.m);
  auto* st = stream_or_report(stream, "end_region");
  if (st == nullptr) return;
  if (!st->outer_regions.empty()) {  // back to the enclosing region
    auto outer = std::move(st->outer_regions.back());
    st->outer_regions.pop_back();
    st->in_region = true;
    st->region_ticked = outer.ticked;
    st->region_id = outer.id;
    st->region_desc = std::move(outer.desc);
    st->region_declared = std::move(outer.declared);
    return;
  }
  st->in_region = false;
  st->region_ticked = false;
  st->region_declared.reset();
}

void launch(cudaStream_t stream, std::string_view label, std::function<void()> fn) {
  auto& s = S();
  std::lock_guard lk(s.m);
  if (H().in_host_fn) {
    add_report(report_kind::api, "launch(" + std::string(label) + ") inside a kernel or host function");
    return;
  }
  auto* st = stream_or_report(stream, "launch");
  if (st == nullptr) return;
  auto o = std::make_shared<op>();
  o->k = kind::kernel;
  o->desc = make_desc(*st, std::string(label));
  o->fn = std::move(fn);
  if (auto e = enqueue(*st, o); e != cudaSuccess) H().last_error = e;
}

void name_stream(cudaStream_t stream, std::string_view name) {
  auto& s = S();
  std::lock_guard lk(s.m);
  if (auto* st = stream_or_report(stream, "name_stream")) st->name = std::string(name);
}

void name_memory(const void* ptr, std::string_view name) {
  auto& s = S();
  std::lock_guard lk(s.m);
  if (auto* a = find_alloc(ptr)) a->name = std::string(name);
}

void name_thread(std::string_view name) { H().name = std::string(name); }

void fail_nccl_after(ncclComm_t comm, int operations, ncclResult_t error) {
  auto& s = S();
  std::lock_guard lk(s.m);
  auto it = s.comms.find(reinterpret_cast<nccl_comm*>(comm));
  if (it == s.comms.end()) return;
  it->second->fail_countdown = operations;
  it->second->fail_with = error;
  if (operations <= 0) {
    it->second->broken = true;
    it->second->async_error = error;
  }
}

std::size_t pending_operations() {
  auto& s = S();
  std::lock_guard lk(s.m);
  return s.pending;
}

bool actual_accesses_linked() { return tracking_seen; }

std::size_t actual_accesses_seen() {
  auto& s = S();
  std::lock_guard lk(s.m);
  return s.actual_accesses;
}

}  // namespace loom::cudasim
