// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internal state of loom's CUDA/NCCL simulator (see include/loom/cudasim/sim.hpp for what it
// models). One process-wide `state` guarded by one mutex; one engine thread executes operations.
//
// Operations. Every asynchronous call becomes an `op` with predecessors (its stream's previous
// operation, awaited events, graph edges, the legacy stream's implicit ones). An op is ready when
// its predecessors are done; the engine picks a ready op at random (seeded), executes its payload
// and completes it. NCCL operations are *groups* of parts: a group becomes active when ready, a
// send/receive pair transfers when both groups are active, a collective runs when every rank's
// part is active, and a group is done when all its parts are.
//
// Happens-before. Agents are streams and graph lanes; each op has a vector clock `vc`: the join
// of its predecessors' end clocks, of the enqueuing host thread's clock, and its own tick on its
// agent. An NCCL group's end clock also joins its partners' start clocks (data flowed from them).
// Record r (agent a, tick t) happened before op o iff o.vc[a] >= t.
//
// Races. Per allocation, disjoint segments keep the last write and the reads since it (one per
// agent, FastTrack-style). An access that is not ordered after a conflicting one is a race.
//
// Stream memory operations (cuStreamWaitValue32 / cuStreamWriteValue32, through
// cudaGetDriverEntryPointByVersion). A value wait, once ready, compares the 32-bit word; if the
// condition does not hold it parks (state active) until a write-value, copy or memset that covers
// the word completes and makes it hold. Each word keeps the join of its writers' end clocks, and a
// satisfied wait joins it: the writer happened before the waiter's stream continues.
// Host hand-offs (`host_release` / `host_acquire`): a host-level release/acquire through a key,
// so a thread's later work is ordered after what the releasing thread had synchronised with.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "loom/cudasim/sim.hpp"
#include "tracking.hpp"

namespace loom::cudasim::impl {

using clock_tick = std::uint32_t;

//! A vector clock over agents (missing entries are 0).
struct vclock {
  std::vector<clock_tick> v;
  clock_tick at(int a) const { return static_cast<std::size_t>(a) < v.size() ? v[static_cast<std::size_t>(a)] : 0; }
  void set(int a, clock_tick t) {
    if (v.size() <= static_cast<std::size_t>(a)) v.resize(static_cast<std::size_t>(a) + 1, 0);
    v[static_cast<std::size_t>(a)] = t;
  }
  void join(const vclock& o) {
    if (v.size() < o.v.size()) v.resize(o.v.size(), 0);
    for (std::size_t i = 0; i < o.v.size(); ++i) v[i] = std::max(v[i], o.v[i]);
  }
};

//! What reports say about an operation.
struct op_desc {
  std::string label;   // "F mb3 s2", "ncclSend to rank 1", "cudaMemcpyAsync", ...
  std::string stream;  // the stream's name
  std::uint64_t seq = 0;
  int device = 0;
  std::string describe() const { return label + " on stream '" + stream + "'"; }
};
using desc_ptr = std::shared_ptr<const op_desc>;

enum class kind : unsigned char { kernel, host, copy, memset, record, wait, nccl, marker, graph_end, free_async, nop, value_wait, value_write };
const char* kind_name(kind k);

struct op;
using op_ptr = std::shared_ptr<op>;
struct stream_state;
struct event_state;
struct nccl_comm;
struct nccl_world;
struct coll_instance;

//! One byte range an op touches.
struct access_rec {
  std::uintptr_t lo = 0, hi = 0;
  bool write = false;
};

//! One send or receive of an NCCL group.
struct p2p_part {
  std::shared_ptr<nccl_comm> comm;
  int peer = 0;  // rank in comm
  bool send = false;
  void* buf = nullptr;
  std::size_t bytes = 0;
  p2p_part* partner = nullptr;
  op* owner = nullptr;
  bool done = false;
};

//! One rank's part of a collective.
struct coll_part {
  std::shared_ptr<coll_instance> inst;
  std::shared_ptr<nccl_comm> comm;
  void* out = nullptr;        // what this rank's part writes, checked when the collective runs
  std::size_t out_bytes = 0;
  int rank = 0;
  op* owner = nullptr;
  bool done = false;
};

//! A pending NCCL call before it is enqueued (also what a graph node keeps).
struct nccl_call {
  std::shared_ptr<nccl_comm> comm;
  enum class type : unsigned char { send, recv, all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all } t{};
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;  // elements (per rank for all_gather's input / reduce_scatter's output / all_to_all's block)
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  int peer_or_root = 0;
};
const char* call_name(nccl_call::type t);

struct op {
  kind k = kind::nop;
  desc_ptr desc;
  int device = 0;
  int agent = -1;
  clock_tick tick = 0;
  vclock vc;      // start clock
  vclock extra;   // joined into the end clock (NCCL partners)
  int pending = 0;
  std::vector<op_ptr> succs;
  std::vector<access_rec> acc;
  //! A kernel inside a region: what the region declares (for the undeclared-access check).
  std::shared_ptr<const std::vector<access_rec>> declared;
  enum class st : unsigned char { waiting, ready, running, active, done } state = st::waiting;
  bool stuck = false;    // named by the deadlock detector
  bool failed = false;   // NCCL part of an aborted communicator
  // payloads
  std::function<void()> fn;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  int value = 0;
  std::vector<std::unique_ptr<p2p_part>> p2p;
  std::vector<std::unique_ptr<coll_part>> coll;
  std::vector<nccl_call> calls;  // NCCL calls not yet posted (graph replay posts at launch)
  int parts_left = 0;
  event_state* timed_event = nullptr;  // record ops of timing events
  std::chrono::steady_clock::time_point when{};
  void* free_ptr = nullptr;  // free_async
  unsigned cond = 0;         // value_wait: CU_STREAM_WAIT_VALUE_* (GEQ, EQ, AND, NOR)
  std::uint32_t word = 0;    // value_wait / value_write: the operand
};

//! A graph node (a captured op).
struct node {
  kind k = kind::nop;
  desc_ptr desc;
  int device = 0;
  std::vector<int> deps;
  int lane = 0;
  std::uint64_t region = 0;  // ops of one region share a tick on replay
  std::vector<access_rec> acc;
  std::function<void()> fn;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  int value = 0;
  std::vector<nccl_call> calls;
  event_state* ext_event = nullptr;  // external record / wait node
  bool ext_record = false, ext_wait = false;
};

struct graph_state {
  std::vector<node> nodes;
  int lanes = 0;
};

struct exec_state {
  graph_state g;
  std::vector<int> lane_agents;
  std::vector<clock_tick> lane_counters;
  op_ptr last_end;
  int device = 0;
};

//! One stream capture sequence.
struct capture_session {
  std::unique_ptr<graph_state> graph = std::make_unique<graph_state>();
  stream_state* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalid = false;
  std::string why;
  unsigned long long id = 0;
  std::vector<stream_state*> streams;
};

struct stream_state {
  int id = 0;
  int device = 0;
  int agent = -1;
  clock_tick counter = 0;
  std::string name;
  unsigned flags = 0;  // cudaStreamNonBlocking
  bool legacy = false;
  op_ptr last;
  std::uint64_t seq = 0;
  capture_session* cap = nullptr;
  std::vector<int> cap_tail;
  int cap_lane = 0;
  // region
  bool in_region = false;
  bool region_ticked = false;
  std::uint64_t region_id = 0;
  desc_ptr region_desc;
  std::shared_ptr<const std::vector<access_rec>> region_declared;
  // The enclosing regions of a nested one (a stage call's region around its kernels' own),
  // restored by `end_region`.
  struct saved_region {
    bool ticked = false;
    std::uint64_t id = 0;
    desc_ptr desc;
    std::shared_ptr<const std::vector<access_rec>> declared;
  };
  std::vector<saved_region> outer_regions;
};

struct event_state {
  unsigned flags = 0;
  op_ptr rec;                         // latest record outside capture
  capture_session* cap = nullptr;     // latest record inside a capture
  std::vector<int> cap_nodes;
  std::chrono::steady_clock::time_point when{};
  bool recorded_time = false;
};

//! The bytes the simulator reserves for an allocation of `n` bytes (rounded up to 256, as CUDA's
//! alignment): the padding is nobody else's memory, so an access there is past the end.
inline std::size_t reserved_size(std::size_t n) { return (n + 255) / 256 * 256; }

struct allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device = 0;
  bool pinned = false;
  bool freed = false;
  std::string owner;
  std::string name;
  void* raw = nullptr;
  //! One access of a segment: by the op (agent, tick) described by `desc`.
  struct access_record {
    int agent = -1;
    clock_tick tick = 0;
    bool write = false;
    desc_ptr desc;
  };
  //! The last accesses of a byte range (oldest first, at most `history` of them).
  struct segment {
    std::uintptr_t hi = 0;
    std::deque<access_record> hist;
  };
  static constexpr std::size_t history = 64;
  std::map<std::uintptr_t, segment> shadow;
  std::string label() const;
};

//! A race or use-after-free found, waiting for a host synchronisation to report it.
struct finding {
  report r;
  int a_agent = -1;
  clock_tick a_tick = 0;
  int b_agent = -1;
  clock_tick b_tick = 0;
  std::string key;              // canonical order
  std::vector<int> reported_to;  // host threads that were told
};

struct nccl_world {
  int n = 0;
  std::vector<std::weak_ptr<nccl_comm>> ranks;
  std::map<std::pair<int, int>, std::deque<p2p_part*>> sends, recvs;  // (src, dst) unmatched
  std::map<std::uint64_t, std::shared_ptr<coll_instance>> colls;
  // split rendezvous: seq -> (rank -> color,key), and the results
  struct split_round {
    std::vector<std::pair<int, int>> ck;
    int arrived = 0;
    std::vector<std::shared_ptr<nccl_comm>> made;
    bool done = false;
  };
  std::map<std::uint64_t, split_round> splits;
  std::string name;
};

struct nccl_comm : std::enable_shared_from_this<nccl_comm> {
  std::shared_ptr<nccl_world> world;
  int rank = 0;
  int n = 0;
  int device = 0;
  bool ready = false;     // init finished
  bool aborted = false;
  bool destroyed = false;
  ncclResult_t async_error = ncclSuccess;
  std::uint64_t coll_seq = 0;
  std::uint64_t split_seq = 0;
  int fail_countdown = -1;
  ncclResult_t fail_with = ncclSuccess;
  bool broken = false;    // injected failure happened: parts never complete
};

struct coll_instance {
  nccl_call::type t{};
  std::weak_ptr<nccl_world> world;
  std::size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  int root = 0;
  int n = 0;
  std::vector<coll_part*> parts;  // by rank
  std::vector<const void*> in;
  std::vector<void*> out;
  int arrived = 0;
  int active = 0;
  bool mismatch = false;
  std::string why;
  bool ran = false;
};

//! A unit of work for the engine.
struct item {
  enum class type : unsigned char { run, activate, transfer, collective } t{};
  op_ptr o;
  p2p_part* send = nullptr;
  std::shared_ptr<coll_instance> coll;
};

struct host_thread {
  int id = -1;  // assigned on first use
  vclock vc;
  std::string name;
  int device = 0;
  std::string detail;
  cudaError_t last_error = cudaSuccess;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  bool in_host_fn = false;
  std::unordered_map<int, stream_state*> per_thread_stream;
};

struct owner_use {
  std::size_t current = 0, peak = 0;
};

struct state {
  std::mutex m;
  std::condition_variable work_cv;   // the engine waits here
  std::condition_variable done_cv;   // hosts wait here
  config cfg;
  std::mt19937_64 rng;
  std::thread engine;
  bool engine_started = false;

  int agents = 0;
  std::unordered_set<stream_state*> streams;
  std::vector<stream_state*> legacy;  // per device
  int stream_counter = 0;
  std::unordered_set<event_state*> events;
  // Destroyed events: graph nodes may still name them (external nodes), so they outlive
  // cudaEventDestroy, owned here until the simulator ends (a few dozen bytes each).
  std::vector<std::unique_ptr<event_state>> retired_events;
  std::unordered_set<graph_state*> graphs;
  std::unordered_set<exec_state*> execs;
  std::vector<capture_session*> captures;
  unsigned long long capture_ids = 0;
  std::uint64_t region_ids = 0;

  std::map<std::uintptr_t, allocation> allocs;
  std::size_t quarantine = 0;
  std::deque<std::uintptr_t> quarantine_order;
  std::vector<owner_use> device_use;
  std::map<std::string, owner_use, std::less<>> owner_uses;

  std::vector<item> runnable;
  std::unordered_set<op*> live_index;
  std::vector<op_ptr> live;  // pending ops (owned until done); compacted lazily
  std::size_t pending = 0;
  std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
  bool deadlocked = false;

  // Stream memory operations: parked value waits by word, and each word's writers' clocks.
  std::unordered_map<std::uintptr_t, std::vector<op_ptr>> value_waiters;
  std::unordered_map<std::uintptr_t, vclock> value_clocks;
  // Host hand-offs: the clock released through each key.
  std::unordered_map<std::uintptr_t, vclock> host_syncs;

  std::vector<report> reports;
  std::vector<finding> findings;
  std::vector<trace_entry> traces;
  std::size_t actual_accesses = 0;  // loads and stores of instrumented kernels recorded (tracking.hpp)

  std::unordered_map<nccl_comm*, std::shared_ptr<nccl_comm>> comms;
  std::map<std::string, std::shared_ptr<nccl_world>> inits;  // unique id -> world being formed
  std::uint64_t id_counter = 0;

  state();
};

state& S();
host_thread& H();  // the calling thread's record (requires the lock for shared parts)

// ---- helpers used across files (all called with S().m held) -------------------------------
int new_agent();
stream_state* resolve_stream(cudaStream_t s, cudaError_t& err);
stream_state* legacy_stream(int device);
std::string stream_label(cudaStream_t s);
allocation* find_alloc(const void* p);
bool check_range(const void* p, std::size_t n, bool allow_host, std::string& why);
desc_ptr make_desc(stream_state& s, std::string label);
// Enqueues `o` on `s` (or records it into `s`'s capture). Fills agent/tick/clock/preds.
// Returns an error code (capture violations) and sets the thread's detail.
cudaError_t enqueue(stream_state& s, op_ptr o, std::vector<op_ptr> extra_preds = {});
void add_pred(const op_ptr& o, const op_ptr& p);
void make_ready_if(op_ptr o);
void complete(op& o);
void wake_engine();
void start_engine();
// host waits
cudaError_t wait_ops(std::unique_lock<std::mutex>& lk, std::vector<op_ptr> ops, const char* call);
cudaError_t report_findings_for_host(const char* call);
void add_report(report_kind k, std::string text, std::string first = {}, std::string second = {});
cudaError_t fail(cudaError_t e, std::string why);  // sets thread's last error + detail
bool capture_forbids_unsafe(const char* call, cudaError_t& err);
void invalidate_capture(capture_session* c, std::string why);
void check_accesses(op& o);
void check_access(op& o, const access_rec& a);
void post_nccl_calls(op& o);
void nccl_activate(op& o);
void nccl_transfer(p2p_part* s);
void nccl_collective(const std::shared_ptr<coll_instance>& c);
std::string deadlock_text();
// Whether a value wait's condition holds for the word's current value.
bool value_condition(const op& o);

}  // namespace loom::cudasim::impl
