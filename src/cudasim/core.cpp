// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The simulator's core: operations, the engine, happens-before clocks, the race detector, the
// deadlock detector, host waits and reports (see core.hpp).

#include "core.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace loom::cudasim::impl {

thread_local access_log* current_log = nullptr;
bool tracking_seen = false;

namespace {

thread_local host_thread tl_host;

std::uint64_t env_u64(const char* name, std::uint64_t dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  auto x = std::strtoull(v, &end, 10);
  return end != nullptr && *end == '\0' ? x : dflt;
}

std::string hex(std::uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, p);
  return buf;
}

}  // namespace

const char* kind_name(kind k) {
  switch (k) {
    case kind::kernel: return "kernel";
    case kind::host: return "host";
    case kind::copy: return "copy";
    case kind::memset: return "memset";
    case kind::record: return "record";
    case kind::wait: return "wait";
    case kind::nccl: return "nccl";
    case kind::marker: return "region";
    case kind::graph_end: return "graph";
    case kind::free_async: return "free";
    case kind::nop: return "nop";
    case kind::value_wait: return "wait value";
    case kind::value_write: return "write value";
  }
  return "?";
}

const char* call_name(nccl_call::type t) {
  switch (t) {
    case nccl_call::type::send: return "ncclSend";
    case nccl_call::type::recv: return "ncclRecv";
    case nccl_call::type::all_reduce: return "ncclAllReduce";
    case nccl_call::type::broadcast: return "ncclBroadcast";
    case nccl_call::type::reduce: return "ncclReduce";
    case nccl_call::type::all_gather: return "ncclAllGather";
    case nccl_call::type::reduce_scatter: return "ncclReduceScatter";
    case nccl_call::type::all_to_all: return "ncclAlltoAll";
  }
  return "nccl?";
}

std::string allocation::label() const {
  std::string s = name.empty() ? (pinned ? "pinned host memory " : "device memory ") + hex(base) : "'" + name + "'";
  s += " (" + std::to_string(size) + " bytes" + (pinned ? "" : ", device " + std::to_string(device)) +
       (owner.empty() ? "" : ", allocated by " + owner) + ")";
  return s;
}

state::state() {
  cfg.seed = env_u64("LOOM_CUDASIM_SEED", 1);
  cfg.delays = env_u64("LOOM_CUDASIM_DELAYS", 1) != 0;
  cfg.deadlock_after = std::chrono::milliseconds(env_u64("LOOM_CUDASIM_DEADLOCK_MS", 3000));
  cfg.devices = static_cast<int>(env_u64("LOOM_CUDASIM_DEVICES", 8));
  if (const char* r = std::getenv("LOOM_CUDASIM_RACES"); r != nullptr && std::string_view(r) == "record")
    cfg.races = race_policy::record;
  cfg.regions = env_u64("LOOM_CUDASIM_REGIONS", 1) != 0;
  cfg.actual_accesses = env_u64("LOOM_CUDASIM_ACTUAL", 1) != 0;
  if (const char* r = std::getenv("LOOM_CUDASIM_UNDECLARED"); r != nullptr && std::string_view(r) == "record")
    cfg.undeclared = race_policy::record;
  rng.seed(cfg.seed);
  device_use.resize(static_cast<std::size_t>(std::max(cfg.devices, 1)));
  legacy.resize(device_use.size(), nullptr);
}

state& S() {
  static state* s = new state;  // never destroyed: the engine thread may outlive static destructors
  return *s;
}

host_thread& H() { return tl_host; }

int new_agent() { return S().agents++; }

cudaError_t fail(cudaError_t e, std::string why) {
  auto& h = H();
  h.last_error = e;
  h.detail = std::move(why);
  return e;
}

void add_report(report_kind k, std::string text, std::string first, std::string second) {
  auto& s = S();
  s.reports.push_back({k, std::move(text), std::move(first), std::move(second)});
}

stream_state* legacy_stream(int device) {
  auto& s = S();
  auto& l = s.legacy[static_cast<std::size_t>(device)];
  if (l == nullptr) {
    l = new stream_state;
    l->id = s.stream_counter++;
    l->device = device;
    l->agent = new_agent();
    l->legacy = true;
    l->name = "legacy default stream (device " + std::to_string(device) + ")";
    s.streams.insert(l);
  }
  return l;
}

stream_state* resolve_stream(cudaStream_t st, cudaError_t& err) {
  auto& s = S();
  err = cudaSuccess;
  if (st == nullptr || st == cudaStreamLegacy) return legacy_stream(H().device);
  if (st == cudaStreamPerThread) {
    auto& h = H();
    auto& p = h.per_thread_stream[h.device];
    if (p == nullptr) {
      p = new stream_state;
      p->id = s.stream_counter++;
      p->device = h.device;
      p->agent = new_agent();
      p->name = "per-thread default stream" + (h.name.empty() ? std::string() : " of " + h.name);
      s.streams.insert(p);
    }
    return p;
  }
  auto* p = reinterpret_cast<stream_state*>(st);
  if (!s.streams.contains(p)) {
    err = fail(cudaErrorInvalidResourceHandle, "stream " + hex(reinterpret_cast<std::uintptr_t>(st)) +
                                                   " is not a live stream (destroyed, or never created)");
    return nullptr;
  }
  return p;
}

std::string stream_label(cudaStream_t st) {
  cudaError_t e;
  auto* s = resolve_stream(st, e);
  return s != nullptr ? s->name : std::string("?");
}

allocation* find_alloc(const void* p) {
  auto& s = S();
  auto x = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.allocs.upper_bound(x);
  if (it == s.allocs.begin()) return nullptr;
  --it;
  if (x >= it->second.base && x < it->second.base + std::max<std::size_t>(it->second.size, 1)) return &it->second;
  return nullptr;
}

bool check_range(const void* p, std::size_t n, bool allow_host, std::string& why) {
  if (n == 0) return true;
  auto* a = find_alloc(p);
  if (a == nullptr) {
    if (allow_host) return true;
    why = "address " + hex(reinterpret_cast<std::uintptr_t>(p)) + " is not in any device allocation";
    return false;
  }
  if (a->freed) {
    why = "address " + hex(reinterpret_cast<std::uintptr_t>(p)) + " is in " + a->label() + ", which was freed";
    return false;
  }
  auto x = reinterpret_cast<std::uintptr_t>(p);
  if (x + n > a->base + a->size) {
    why = "bytes [" + std::to_string(x - a->base) + ", " + std::to_string(x - a->base + n) + ") run past the end of " + a->label();
    return false;
  }
  return true;
}

desc_ptr make_desc(stream_state& st, std::string label) {
  auto d = std::make_shared<op_desc>();
  d->label = std::move(label);
  d->stream = st.name;
  d->seq = ++st.seq;
  d->device = st.device;
  return d;
}

void wake_engine() { S().work_cv.notify_one(); }

void add_pred(const op_ptr& o, const op_ptr& p) {
  if (!p) return;
  if (p->state == op::st::done) {
    o->vc.join(p->vc);
    o->vc.join(p->extra);
    return;
  }
  p->succs.push_back(o);
  ++o->pending;
}

namespace {

void to_runnable(const op_ptr& o) {
  auto& s = S();
  o->state = op::st::ready;
  o->vc.set(o->agent, o->tick);
  s.runnable.push_back({o->k == kind::nccl ? item::type::activate : item::type::run, o, nullptr, nullptr});
  wake_engine();
}

}  // namespace

void make_ready_if(op_ptr o) {
  if (o->pending == 0 && o->state == op::st::waiting) to_runnable(o);
}

bool capture_forbids_unsafe(const char* call, cudaError_t& err) {
  auto& s = S();
  auto& h = H();
  for (auto* c : s.captures) {
    if (c->invalid) continue;
    const bool mine = c->thread == std::this_thread::get_id();
    const bool forbid = (c->mode == cudaStreamCaptureModeGlobal && (mine ? h.mode != cudaStreamCaptureModeRelaxed : true) &&
                         h.mode != cudaStreamCaptureModeRelaxed) ||
                        (c->mode == cudaStreamCaptureModeThreadLocal && mine && h.mode != cudaStreamCaptureModeRelaxed);
    if (forbid) {
      std::string why = std::string(call) + " is not allowed while stream '" + c->origin->name +
                        "' is capturing (a potentially unsafe call in " +
                        (c->mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local") + " capture mode)";
      invalidate_capture(c, why);
      add_report(report_kind::capture, why);
      err = fail(cudaErrorStreamCaptureUnsupported, why);
      return true;
    }
  }
  return false;
}

void invalidate_capture(capture_session* c, std::string why) {
  if (!c->invalid) {
    c->invalid = true;
    c->why = std::move(why);
  }
}

cudaError_t enqueue(stream_state& st, op_ptr o, std::vector<op_ptr> extra_preds) {
  auto& s = S();
  auto& h = H();
  o->device = st.device;
  if (!o->desc) o->desc = make_desc(st, kind_name(o->k));
  if (st.in_region && o->k == kind::kernel) o->declared = st.region_declared;
  if (st.in_region) {
    // The operations of a region are one logical operation: one tick, the region's label.
    auto d = std::make_shared<op_desc>(*o->desc);
    d->label = st.region_desc->label + (o->k == kind::kernel || o->k == kind::marker ? "" : " / " + o->desc->label);
    o->desc = d;
  }
  if (st.legacy) {
    for (auto* c : s.captures)
      if (!c->invalid) {
        std::string why = "work on the legacy default stream while stream '" + c->origin->name +
                          "' is capturing (it would synchronise implicitly with the capture)";
        invalidate_capture(c, why);
        add_report(report_kind::capture, why, o->desc->describe());
        return fail(cudaErrorStreamCaptureImplicit, why);
      }
  }
  if (st.cap != nullptr) {
    auto* c = st.cap;
    if (c->invalid) return fail(cudaErrorStreamCaptureInvalidated, "the capture was invalidated: " + c->why);
    if (!extra_preds.empty()) {
      std::string why = o->desc->describe() + " depends on work outside the capture of stream '" + c->origin->name + "'";
      invalidate_capture(c, why);
      add_report(report_kind::capture, why);
      return fail(cudaErrorStreamCaptureIsolation, why);
    }
    node n;
    n.k = o->k;
    n.desc = o->desc;
    n.device = st.device;
    n.deps = st.cap_tail;
    n.lane = st.cap_lane;
    n.region = st.in_region ? st.region_id : 0;
    n.acc = std::move(o->acc);
    n.fn = std::move(o->fn);
    n.dst = o->dst;
    n.src = o->src;
    n.bytes = o->bytes;
    n.value = o->value;
    n.calls = std::move(o->calls);
    c->graph->nodes.push_back(std::move(n));
    st.cap_tail = {static_cast<int>(c->graph->nodes.size()) - 1};
    return cudaSuccess;
  }
  o->agent = st.agent;
  if (st.in_region && st.region_ticked) {
    o->tick = st.counter;
  } else {
    o->tick = ++st.counter;
    if (st.in_region) st.region_ticked = true;
  }
  o->vc.join(h.vc);
  add_pred(o, st.last);
  if (st.legacy) {
    for (auto* other : s.streams)
      if (other != &st && other->device == st.device && !other->legacy && (other->flags & cudaStreamNonBlocking) == 0)
        add_pred(o, other->last);
  } else if ((st.flags & cudaStreamNonBlocking) == 0) {
    auto* l = s.legacy[static_cast<std::size_t>(st.device)];
    if (l != nullptr) add_pred(o, l->last);
  }
  for (auto& p : extra_preds) add_pred(o, p);
  st.last = o;
  s.live.push_back(o);
  ++s.pending;
  s.last_progress = std::chrono::steady_clock::now();
  if (o->k == kind::nccl) post_nccl_calls(*o);
  make_ready_if(o);
  start_engine();
  return cudaSuccess;
}

// ---- race detector --------------------------------------------------------------------------

namespace {

bool hb(int agent, clock_tick tick, const op& o) { return o.vc.at(agent) >= tick; }

std::string op_key(const op_desc& d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "#%012" PRIu64, d.seq);
  return d.stream + buf;
}

void race(allocation& a, std::uintptr_t lo, std::uintptr_t hi, int a_agent, clock_tick a_tick, const desc_ptr& first,
          bool first_write, const op& second, bool second_write) {
  auto& s = S();
  // One finding per pair of operations.
  for (auto& f : s.findings)
    if (f.a_agent == a_agent && f.a_tick == a_tick && f.b_agent == second.agent && f.b_tick == second.tick) return;
  std::string range = "bytes [" + std::to_string(lo - a.base) + ", " + std::to_string(hi - a.base) + ") of " + a.label();
  // Named in a canonical order (stream name, then position on it), not in execution order, so the
  // sentence is the same whatever order the operations ran in.
  auto ka = op_key(*first), kb = op_key(*second.desc);
  const op_desc* x = first.get();
  const op_desc* y = second.desc.get();
  bool xw = first_write, yw = second_write;
  if (kb < ka) {
    std::swap(x, y);
    std::swap(xw, yw);
  }
  std::string text = "race: " + x->describe() + (xw ? " writes " : " reads ") + range + " and " + y->describe() +
                     (yw ? " writes them" : " reads them") +
                     ", and neither is ordered before the other (no stream order, event, host synchronisation or NCCL "
                     "completion between them)";
  finding f;
  f.r = {report_kind::race, std::move(text), x->describe(), y->describe()};
  f.a_agent = a_agent;
  f.a_tick = a_tick;
  f.b_agent = second.agent;
  f.b_tick = second.tick;
  f.key = std::min(ka, kb) + "|" + std::max(ka, kb);
  s.findings.push_back(std::move(f));
}

void access_segments(allocation& a, std::uintptr_t lo, std::uintptr_t hi, bool write, op& o) {
  auto& sh = a.shadow;
  // Split so that [lo, hi) is covered exactly by segments.
  auto split_at = [&](std::uintptr_t x) {
    auto it = sh.upper_bound(x);
    if (it == sh.begin()) return;
    --it;
    if (it->first < x && x < it->second.hi) {
      auto seg = it->second;
      it->second.hi = x;
      sh.emplace(x, std::move(seg));
    }
  };
  split_at(lo);
  split_at(hi);
  // Fill gaps with empty segments.
  std::uintptr_t cur = lo;
  auto it = sh.lower_bound(lo);
  while (cur < hi) {
    if (it == sh.end() || it->first > cur) {
      std::uintptr_t end = it == sh.end() ? hi : std::min(hi, it->first);
      allocation::segment seg;
      seg.hi = end;
      it = sh.emplace(cur, std::move(seg)).first;
    }
    cur = it->second.hi;
    ++it;
  }
  // Every earlier conflicting access of the segment that is not ordered before this one races
  // with it (all pairs, not only the last write: the findings do not depend on execution order).
  for (auto i = sh.lower_bound(lo); i != sh.end() && i->first < hi; ++i) {
    auto& seg = i->second;
    for (auto const& r : seg.hist) {
      if (!(r.write || write) || (r.agent == o.agent && r.tick == o.tick)) continue;
      if (!hb(r.agent, r.tick, o)) race(a, i->first, seg.hi, r.agent, r.tick, r.desc, r.write, o, write);
    }
    bool merged = false;
    for (auto& r : seg.hist)
      if (r.agent == o.agent && r.tick == o.tick) {
        r.write = r.write || write;
        merged = true;
      }
    if (!merged) seg.hist.push_back({o.agent, o.tick, write, o.desc});
    if (seg.hist.size() > allocation::history) seg.hist.pop_front();
  }
}

}  // namespace

void check_access(op& o, const access_rec& acc) {
  auto& s = S();
  if (acc.hi <= acc.lo) return;
  auto* a = find_alloc(reinterpret_cast<const void*>(acc.lo));
  if (a == nullptr) return;  // pageable host memory: not tracked
  if (a->freed) {
    finding f;
    std::string text = "use after free: " + o.desc->describe() + (acc.write ? " writes " : " reads ") + "bytes [" +
                       std::to_string(acc.lo - a->base) + ", " + std::to_string(acc.hi - a->base) + ") of " + a->label();
    f.r = {report_kind::use_after_free, std::move(text), o.desc->describe(), {}};
    f.a_agent = o.agent;
    f.a_tick = o.tick;
    f.b_agent = o.agent;
    f.b_tick = o.tick;
    f.key = op_key(*o.desc);
    s.findings.push_back(std::move(f));
    return;
  }
  access_segments(*a, acc.lo, std::min(acc.hi, a->base + a->size), acc.write, o);
}

void check_accesses(op& o) {
  for (auto const& acc : o.acc) check_access(o, acc);
}

namespace {

//! The parts of [lo, hi) not covered by the declared ranges of `o` that may cover this access
//! (a write by declared writes, a read by any); empty when none of them touches allocation `a`
//! (the kernel's own memory, which loom did not hand it and does not judge).
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> undeclared_parts(const op& o, const allocation& a, std::uintptr_t lo,
                                                                        std::uintptr_t hi, bool write) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> cover, out;
  bool touches = false;
  for (auto const& d : *o.declared) {
    if (d.hi <= a.base || d.lo >= a.base + a.size) continue;
    touches = true;
    if (write && !d.write) continue;
    cover.emplace_back(std::max(d.lo, lo), std::min(d.hi, hi));
  }
  if (!touches) return out;
  std::sort(cover.begin(), cover.end());
  std::uintptr_t cur = lo;
  for (auto [clo, chi] : cover) {
    if (chi <= clo) continue;
    if (clo > cur) out.emplace_back(cur, clo);
    cur = std::max(cur, chi);
  }
  if (cur < hi) out.emplace_back(cur, hi);
  return out;
}

//! What `o`'s region declares of allocation `a`, for the report ("bytes [x, y) read, ...").
std::string declared_of(const op& o, const allocation& a) {
  std::string out;
  for (auto const& d : *o.declared) {
    if (d.hi <= a.base || d.lo >= a.base + a.size) continue;
    if (!out.empty()) out += ", ";
    out += "bytes [" + std::to_string(std::max(d.lo, a.base) - a.base) + ", " + std::to_string(std::min(d.hi, a.base + a.size) - a.base) +
           (d.write ? ") to write" : ") to read");
  }
  return out;
}

//! A finding about one operation's own access (at most one of each kind per operation):
//! "<kind>: <op> wrote|read bytes [lo, hi) <where>".
void own_access(op& o, report_kind k, const allocation& a, std::uintptr_t lo, std::uintptr_t hi, bool write, const std::string& where) {
  auto& s = S();
  for (auto const& f : s.findings)
    if (f.r.kind == k && f.a_agent == o.agent && f.a_tick == o.tick) return;
  finding f;
  std::string text = std::string(to_string(k)) + ": " + o.desc->describe() + (write ? " wrote" : " read") + " bytes [" +
                     std::to_string(lo - a.base) + ", " + std::to_string(hi - a.base) + ") " + where;
  f.r = {k, std::move(text), o.desc->describe(), {}};
  f.a_agent = f.b_agent = o.agent;
  f.a_tick = f.b_tick = o.tick;
  f.key = op_key(*o.desc);
  s.findings.push_back(std::move(f));
}

void undeclared(op& o, const allocation& a, std::uintptr_t lo, std::uintptr_t hi, bool write) {
  own_access(o, report_kind::undeclared, a, lo, hi, write,
             "of " + a.label() + ", which loom did not hand it (of that memory, its region hands it " + declared_of(o, a) + ")");
}

//! An instrumented access past the end of allocation `a` (inside the padding the simulator
//! rounds allocations up with, so it is not some other memory): a bad pointer.
void past_the_end(op& o, const allocation& a, std::uintptr_t lo, std::uintptr_t hi, bool write) {
  own_access(o, report_kind::bad_pointer, a, lo, hi, write, "past the end of " + a.label());
}

//! Checks the ranges an instrumented payload touched (merged), allocation by allocation.
void check_actual(op& o, access_log& log) {
  auto& s = S();
  s.actual_accesses += log.accesses;
  log.finish();
  for (bool write : {false, true})
    for (auto const& r : write ? log.writes : log.reads) {
      std::uintptr_t lo = r.lo;
      while (lo < r.hi) {
        auto it = s.allocs.upper_bound(lo);
        if (it != s.allocs.begin()) {
          auto prev = std::prev(it);
          const allocation& p = prev->second;
          const std::uintptr_t reserved_end = p.base + reserved_size(p.size);
          if (lo < p.base + p.size) {
            it = prev;
          } else if (lo < reserved_end) {  // the allocation's own padding
            past_the_end(o, p, lo, std::min(r.hi, reserved_end), write);
            lo = std::min(r.hi, reserved_end);
            continue;
          }
        }
        if (it == s.allocs.end() || it->second.base >= r.hi) break;  // the rest is host memory
        allocation& a = it->second;
        lo = std::max(lo, a.base);
        const std::uintptr_t hi = std::min(r.hi, a.base + a.size);
        if (o.declared && !a.freed)
          if (auto parts = undeclared_parts(o, a, lo, hi, write); !parts.empty())  // the first is reported
            undeclared(o, a, parts.front().first, parts.front().second, write);
        check_access(o, {lo, hi, write});
        lo = hi;
      }
    }
}

}  // namespace

cudaError_t report_findings_for_host(const char* call) {
  auto& s = S();
  auto& h = H();
  if (s.findings.empty()) return cudaSuccess;
  if (h.id < 0) h.id = static_cast<int>(++s.id_counter);
  // The findings whose two operations this thread's synchronisation now orders before it (its
  // causal past, a set that does not depend on timing), not yet reported to this thread: report
  // the first in canonical order.
  const finding* best = nullptr;
  for (auto& f : s.findings) {
    if (h.vc.at(f.a_agent) < f.a_tick || h.vc.at(f.b_agent) < f.b_tick) continue;
    if (std::find(f.reported_to.begin(), f.reported_to.end(), h.id) != f.reported_to.end()) continue;
    f.reported_to.push_back(h.id);
    const race_policy policy = f.r.kind == report_kind::undeclared ? s.cfg.undeclared : s.cfg.races;
    if (policy == race_policy::record) continue;
    if (best == nullptr || f.key < best->key) best = &f;
  }
  if (best == nullptr) return cudaSuccess;
  return fail(cudaErrorLaunchFailure, best->r.text + " (found by the simulator's race detector; reported to " + call +
                                          "; every finding is in loom::cudasim::reports())");
}

// ---- completion and the engine ---------------------------------------------------------------

bool value_condition(const op& o) {
  std::uint32_t v = 0;
  std::memcpy(&v, o.dst, sizeof v);
  switch (o.cond) {
    case 0x1: return v == o.word;                                          // EQ
    case 0x2: return (v & o.word) != 0;                                    // AND
    case 0x3: return ~(v | o.word) != 0;                                   // NOR
    default: return static_cast<std::int32_t>(v - o.word) >= 0;           // GEQ (cyclic, as CUDA)
  }
}

namespace {

//! After `w` (a write-value, copy or memset) completed: completes the parked value waits on the
//! words it wrote whose condition now holds; they join the writers' clocks.
void wake_value_waiters(op& w) {
  auto& s = S();
  const auto lo = reinterpret_cast<std::uintptr_t>(w.dst);
  const auto hi = lo + (w.k == kind::value_write ? sizeof(std::uint32_t) : w.bytes);
  std::vector<op_ptr> ready;
  for (auto it = s.value_waiters.begin(); it != s.value_waiters.end();) {
    if (it->first < lo || it->first >= hi) {
      ++it;
      continue;
    }
    auto& clk = s.value_clocks[it->first];
    if (w.k != kind::value_write) clk.join(w.vc);
    std::erase_if(it->second, [&](const op_ptr& p) {
      if (!value_condition(*p)) return false;
      p->extra.join(clk);
      ready.push_back(p);
      return true;
    });
    it = it->second.empty() ? s.value_waiters.erase(it) : std::next(it);
  }
  for (auto& p : ready) complete(*p);
}

}  // namespace

void complete(op& o) {
  auto& s = S();
  o.state = op::st::done;
  o.vc.join(o.extra);
  o.extra.v.clear();
  if (s.cfg.trace) s.traces.push_back({kind_name(o.k), o.desc->label, o.desc->stream, o.device});
  for (auto& succ : o.succs) {
    succ->vc.join(o.vc);
    if (--succ->pending == 0 && succ->state == op::st::waiting) to_runnable(succ);
  }
  o.succs.clear();
  o.fn = nullptr;
  --s.pending;
  if (o.k == kind::value_write) s.value_clocks[reinterpret_cast<std::uintptr_t>(o.dst)].join(o.vc);
  if (!s.value_waiters.empty() && (o.k == kind::value_write || o.k == kind::copy || o.k == kind::memset)) wake_value_waiters(o);
  s.last_progress = std::chrono::steady_clock::now();
  if (s.deadlocked) s.deadlocked = false;
  if (o.k == kind::free_async && o.free_ptr != nullptr) {
    auto it = s.allocs.find(reinterpret_cast<std::uintptr_t>(o.free_ptr));
    if (it != s.allocs.end() && !it->second.freed) {
      it->second.freed = true;
      auto& du = s.device_use[static_cast<std::size_t>(it->second.device)];
      du.current -= it->second.size;
      auto ou = s.owner_uses.find(it->second.owner);
      if (ou != s.owner_uses.end()) ou->second.current -= it->second.size;
    }
  }
  s.done_cv.notify_all();
  if (s.live.size() > 64 && s.pending * 2 < s.live.size())
    std::erase_if(s.live, [](const op_ptr& p) { return p->state == op::st::done; });
}

std::string deadlock_text() {
  auto& s = S();
  std::ostringstream out;
  out << "deadlock: no operation can run and none ran or was enqueued for " << s.cfg.deadlock_after.count()
      << " ms; stuck operations:";
  int shown = 0;
  // Only the first pending operation of each stream: the rest wait behind it.
  std::set<std::string> streams_seen;
  for (auto& p : s.live) {
    if (p->state == op::st::done) continue;
    if (!streams_seen.insert(p->desc->stream).second) continue;
    if (++shown > 24) {
      out << "\n  ...";
      break;
    }
    out << "\n  " << p->desc->describe();
    if (p->state == op::st::active && p->k == kind::value_wait) {
      std::uint32_t v = 0;
      std::memcpy(&v, p->dst, sizeof v);
      static const char* const conds[] = {">=", "==", "to share a bit with", "to miss a bit of"};
      const auto* a = find_alloc(p->dst);
      out << ": waits for the 32-bit word at " << (a != nullptr ? a->label() : hex(reinterpret_cast<std::uintptr_t>(p->dst)))
          << (a != nullptr ? " + " + std::to_string(reinterpret_cast<std::uintptr_t>(p->dst) - a->base) : std::string())
          << " to be " << conds[p->cond & 3u] << " " << p->word << " (it is " << v << ")";
    } else if (p->state == op::st::active) {
      bool any = false;
      for (auto& part : p->p2p) {
        if (part->done) continue;
        any = true;
        const int me = part->comm->rank;
        if (part->comm->broken) {
          out << ": its communicator failed (injected NCCL error)";
        } else if (part->partner == nullptr) {
          out << ": " << (part->send ? "ncclSend to rank " : "ncclRecv from rank ") << part->peer << " (rank " << me
              << " of " << part->comm->n << ") has no matching " << (part->send ? "ncclRecv" : "ncclSend")
              << " posted by rank " << part->peer;
        } else {
          out << ": " << (part->send ? "ncclSend to rank " : "ncclRecv from rank ") << part->peer
              << " waits for its matching operation " << part->partner->owner->desc->describe() << " to start";
        }
      }
      for (auto& part : p->coll) {
        if (part->done) continue;
        any = true;
        out << ": " << call_name(part->inst->t) << " waits for " << (part->inst->n - part->inst->active) << " of "
            << part->inst->n << " ranks";
      }
      if (!any) out << ": active";
    } else {
      out << " waits for " << p->pending << " earlier operation(s)";
      // Name the predecessors that are not done: search the live ops whose successors hold p.
      int named = 0;
      for (auto& q : s.live) {
        if (q->state == op::st::done) continue;
        for (auto& succ : q->succs)
          if (succ.get() == p.get() && named < 3) {
            out << (named++ ? ", " : " (") << q->desc->describe();
          }
      }
      if (named) out << ")";
    }
  }
  return out.str();
}

namespace {

void run_payload(op& o) {
  switch (o.k) {
    case kind::kernel:
    case kind::host:
      if (o.fn) {
        auto& h = H();
        h.in_host_fn = true;
        try {
          o.fn();
        } catch (const std::exception& e) {
          std::lock_guard lk(S().m);
          add_report(report_kind::api, std::string("a kernel or host function threw: ") + e.what(), o.desc->describe());
        } catch (...) {
          std::lock_guard lk(S().m);
          add_report(report_kind::api, "a kernel or host function threw", o.desc->describe());
        }
        h.in_host_fn = false;
      }
      break;
    case kind::copy:
      if (o.bytes) std::memmove(o.dst, o.src, o.bytes);
      break;
    case kind::memset:
      if (o.bytes) std::memset(o.dst, o.value, o.bytes);
      break;
    case kind::record:
      o.when = std::chrono::steady_clock::now();
      break;
    case kind::value_write:
      std::memcpy(o.dst, &o.word, sizeof o.word);
      break;
    default:
      break;
  }
}

void engine_loop() {
  auto& s = S();
  std::unique_lock lk(s.m);
  for (;;) {
    if (s.runnable.empty()) {
      if (s.pending > 0 && !s.deadlocked) {
        auto deadline = s.last_progress + s.cfg.deadlock_after;
        if (std::chrono::steady_clock::now() >= deadline) {
          s.deadlocked = true;
          std::string text = deadlock_text();
          for (auto& p : s.live)
            if (p->state != op::st::done) p->stuck = true;
          add_report(report_kind::deadlock, text);
          s.done_cv.notify_all();
          continue;
        }
        s.work_cv.wait_until(lk, deadline);
      } else {
        s.work_cv.wait(lk);
      }
      continue;
    }
    std::size_t pick = 0;
    if (s.cfg.delays && s.runnable.size() > 1) pick = std::uniform_int_distribution<std::size_t>(0, s.runnable.size() - 1)(s.rng);
    item it = std::move(s.runnable[pick]);
    s.runnable[pick] = std::move(s.runnable.back());
    s.runnable.pop_back();
    bool delay = s.cfg.delays && std::uniform_real_distribution<double>(0, 1)(s.rng) < s.cfg.delay_probability;
    auto delay_us = delay ? std::uniform_int_distribution<long>(0, s.cfg.max_delay.count())(s.rng) : 0;
    switch (it.t) {
      case item::type::run: {
        op& o = *it.o;
        if (o.k == kind::value_wait) {
          // No payload: done when the word satisfies the condition, else parked until a write.
          const auto addr = reinterpret_cast<std::uintptr_t>(o.dst);
          if (value_condition(o)) {
            if (auto c = s.value_clocks.find(addr); c != s.value_clocks.end()) o.extra.join(c->second);
            complete(o);
          } else {
            o.state = op::st::active;
            s.value_waiters[addr].push_back(it.o);
          }
          break;
        }
        o.state = op::st::running;
        check_accesses(o);
        std::optional<access_log> log;
        if (s.cfg.actual_accesses && tracking_seen && (o.k == kind::kernel || o.k == kind::host) && !s.allocs.empty()) {
          log.emplace();
          log->lo_bound = s.allocs.begin()->first;
          const auto& last = std::prev(s.allocs.end())->second;
          log->hi_bound = last.base + last.size;
        }
        lk.unlock();
        if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        current_log = log ? &*log : nullptr;
        run_payload(o);
        current_log = nullptr;
        lk.lock();
        if (log) check_actual(o, *log);
        if (o.k == kind::record && o.timed_event != nullptr) {
          o.timed_event->when = o.when;
          o.timed_event->recorded_time = true;
        }
        complete(o);
        break;
      }
      case item::type::activate:
        if (delay_us) {
          lk.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          lk.lock();
        }
        nccl_activate(*it.o);
        break;
      case item::type::transfer:
        nccl_transfer(it.send);
        break;
      case item::type::collective:
        nccl_collective(it.coll);
        break;
    }
  }
}

}  // namespace

void start_engine() {
  auto& s = S();
  if (s.engine_started) return;
  s.engine_started = true;
  s.engine = std::thread(engine_loop);
  s.engine.detach();
}

cudaError_t wait_ops(std::unique_lock<std::mutex>& lk, std::vector<op_ptr> ops, const char* call) {
  auto& s = S();
  auto& h = H();
  for (;;) {
    bool all = true, stuck = false;
    for (auto& o : ops) {
      if (!o) continue;
      if (o->state != op::st::done) all = false;
      if (o->stuck && o->state != op::st::done) stuck = true;
    }
    if (all) break;
    if (stuck) {
      std::string text = s.reports.empty() ? std::string("deadlock") : s.reports.back().text;
      for (auto it = s.reports.rbegin(); it != s.reports.rend(); ++it)
        if (it->kind == report_kind::deadlock) {
          text = it->text;
          break;
        }
      return fail(cudaErrorLaunchTimeout, std::string(call) + " waits for work that can never finish: " + text);
    }
    s.done_cv.wait(lk);
  }
  for (auto& o : ops)
    if (o) h.vc.join(o->vc);
  return report_findings_for_host(call);
}

}  // namespace loom::cudasim::impl
