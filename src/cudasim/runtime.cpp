// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime entry points of loom's simulator, with the signatures of cuda_runtime_api.h.

#include <cstdlib>
#include <cstring>

#include <cuda.h>  // the driver API's types, for the stream memory operations (no libcuda is linked)

#include "core.hpp"

using namespace loom::cudasim::impl;
using loom::cudasim::report_kind;

namespace {

std::string hexp(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

//! Every entry point starts here: the lock, and the rule that host functions make no CUDA calls.
#define LOOM_SIM_ENTER(call)                                                                                        \
  auto& sim = S();                                                                                                 \
  std::unique_lock lk(sim.m);                                                                                      \
  if (H().in_host_fn)                                                                                              \
    return (add_report(report_kind::api, std::string(call) + " was called inside a kernel or host function run by the simulator (CUDA forbids CUDA calls there)"), \
            fail(cudaErrorNotPermitted, std::string(call) + " called inside a host function"));                  \
  (void)sim

#define LOOM_SIM_STREAM(var, handle)                                                                                \
  cudaError_t var##_err = cudaSuccess;                                                                             \
  stream_state* var = resolve_stream(handle, var##_err);                                                           \
  if (var == nullptr) return var##_err

event_state* resolve_event(cudaEvent_t e, cudaError_t& err) {
  auto* p = reinterpret_cast<event_state*>(e);
  err = cudaSuccess;
  if (e == nullptr || !S().events.contains(p)) {
    err = fail(cudaErrorInvalidResourceHandle, "event " + hexp(e) + " is not a live event");
    return nullptr;
  }
  return p;
}

bool stream_capture_violation(stream_state& st, const char* call, cudaError_t& err) {
  if (st.cap == nullptr) return false;
  std::string why = std::string(call) + " on stream '" + st.name + "', which is capturing into a graph (begun on stream '" +
                    st.cap->origin->name + "'): synchronising or querying inside a capture is not allowed";
  invalidate_capture(st.cap, why);
  add_report(report_kind::capture, why);
  err = fail(cudaErrorStreamCaptureUnsupported, why);
  return true;
}

std::vector<op_ptr> device_tails(int device) {
  std::vector<op_ptr> out;
  for (auto* s : S().streams)
    if (s->device == device && s->last) out.push_back(s->last);
  return out;
}

cudaError_t allocate(void** p, std::size_t size, bool pinned, const char* call) {
  auto& s = S();
  auto& h = H();
  if (p == nullptr) return fail(cudaErrorInvalidValue, std::string(call) + ": null output pointer");
  if (cudaError_t e; capture_forbids_unsafe(call, e)) return e;
  const int dev = h.device;
  if (!pinned && s.device_use[static_cast<std::size_t>(dev)].current + size > s.cfg.device_memory)
    return fail(cudaErrorMemoryAllocation, std::string(call) + " of " + std::to_string(size) + " bytes exceeds device " +
                                               std::to_string(dev) + "'s simulated memory (" + std::to_string(s.cfg.device_memory) + " bytes, " +
                                               std::to_string(s.device_use[static_cast<std::size_t>(dev)].current) + " in use)");
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  const std::size_t rounded = reserved_size(size);
  void* raw = std::aligned_alloc(256, rounded);
  if (raw == nullptr) return fail(cudaErrorMemoryAllocation, std::string(call) + ": the host is out of memory");
  allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(raw);
  a.size = size;
  a.device = dev;
  a.pinned = pinned;
  a.owner = h.name;
  a.raw = raw;
  // A freed allocation at the same address (released from quarantine) is forgotten.
  s.allocs.erase(a.base);
  s.allocs.emplace(a.base, std::move(a));
  if (!pinned) {
    auto& du = s.device_use[static_cast<std::size_t>(dev)];
    du.current += size;
    du.peak = std::max(du.peak, du.current);
    auto& ou = s.owner_uses[h.name];
    ou.current += size;
    ou.peak = std::max(ou.peak, ou.current);
  }
  *p = raw;
  return cudaSuccess;
}

//! Quarantine: freed memory is kept (so a later access is recognised) up to 64 MiB.
void release(allocation& a) {
  auto& s = S();
  a.freed = true;
  a.shadow.clear();
  if (!a.pinned) {
    s.device_use[static_cast<std::size_t>(a.device)].current -= a.size;
    auto ou = s.owner_uses.find(a.owner);
    if (ou != s.owner_uses.end()) ou->second.current -= a.size;
  }
  s.quarantine += a.size;
  s.quarantine_order.push_back(a.base);
  while (s.quarantine > (std::size_t{64} << 20) && !s.quarantine_order.empty()) {
    auto it = s.allocs.find(s.quarantine_order.front());
    s.quarantine_order.pop_front();
    if (it == s.allocs.end() || !it->second.freed) continue;
    s.quarantine -= it->second.size;
    std::free(it->second.raw);
    s.allocs.erase(it);
  }
}

cudaError_t deallocate(void* p, bool pinned, const char* call, std::unique_lock<std::mutex>& lk) {
  auto& s = S();
  if (p == nullptr) return cudaSuccess;
  if (cudaError_t e; capture_forbids_unsafe(call, e)) return e;
  auto it = s.allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.allocs.end() || it->second.pinned != pinned) {
    std::string why = std::string(call) + "(" + hexp(p) + "): not the start of a " + (pinned ? "pinned host" : "device") + " allocation";
    add_report(report_kind::bad_pointer, why);
    return fail(cudaErrorInvalidValue, why);
  }
  if (it->second.freed) {
    std::string why = std::string(call) + "(" + hexp(p) + "): " + it->second.label() + " was already freed (double free)";
    add_report(report_kind::use_after_free, why);
    return fail(cudaErrorInvalidValue, why);
  }
  // cudaFree synchronises the device: pending work that uses the memory finishes first.
  if (auto e = wait_ops(lk, device_tails(it->second.device), call); e != cudaSuccess) return e;
  it = s.allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it != s.allocs.end() && !it->second.freed) release(it->second);
  return cudaSuccess;
}

//! A copy's direction, checked against the allocations; fills the access records.
cudaError_t copy_op(op& o, void* dst, const void* src, std::size_t n, const char* call) {
  std::string why;
  const bool dst_dev = find_alloc(dst) != nullptr, src_dev = find_alloc(src) != nullptr;
  if (n > 0 && !dst_dev && !src_dev) {
    why = std::string(call) + ": neither " + hexp(dst) + " nor " + hexp(src) + " is device or pinned memory";
    add_report(report_kind::bad_pointer, why);
    return fail(cudaErrorInvalidValue, why);
  }
  if (!check_range(dst, n, true, why) || !check_range(src, n, true, why)) {
    add_report(report_kind::bad_pointer, std::string(call) + ": " + why);
    return fail(cudaErrorInvalidValue, std::string(call) + ": " + why);
  }
  o.k = kind::copy;
  o.dst = dst;
  o.src = src;
  o.bytes = n;
  auto s = reinterpret_cast<std::uintptr_t>(src), d = reinterpret_cast<std::uintptr_t>(dst);
  o.acc.push_back({s, s + n, false});
  o.acc.push_back({d, d + n, true});
  return cudaSuccess;
}

void fill_props(cudaDeviceProp* p, int d) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "loom cudasim device %d (no GPU)", d);
  p->totalGlobalMem = S().cfg.device_memory;
  p->sharedMemPerBlock = 48 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->maxThreadsPerMultiProcessor = 2048;
  p->unifiedAddressing = 1;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 2;
  p->pciDeviceID = d;
}

//! cuStreamWaitValue32 / cuStreamWriteValue32 (the driver API, reached through
//! cudaGetDriverEntryPointByVersion): a wait parks its stream until the word satisfies the
//! condition (see core.hpp); a write stores the word in stream order.
cudaError_t value_op(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned flags, bool wait) {
  const char* call = wait ? "cuStreamWaitValue32" : "cuStreamWriteValue32";
  LOOM_SIM_ENTER(call);
  LOOM_SIM_STREAM(st, reinterpret_cast<cudaStream_t>(stream));
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr));
  const unsigned allowed = wait ? (0x3u | static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH))
                                : static_cast<unsigned>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
  if ((flags & ~allowed) != 0) return fail(cudaErrorInvalidValue, std::string(call) + ": unknown flags " + std::to_string(flags));
  std::string why;
  if (addr % 4 != 0) why = "address " + hexp(p) + " is not 4-byte aligned";
  if (why.empty() && find_alloc(p) == nullptr) why = "address " + hexp(p) + " is not in any device or pinned allocation";
  if (why.empty() && !check_range(p, sizeof(cuuint32_t), true, why)) why = why.empty() ? "bad address" : why;
  if (!why.empty()) {
    add_report(report_kind::bad_pointer, std::string(call) + ": " + why);
    return fail(cudaErrorInvalidValue, std::string(call) + ": " + why);
  }
  if (st->cap != nullptr) {
    std::string w = std::string(call) + " on stream '" + st->name +
                    "', which is capturing: loom's simulator does not capture stream memory operations";
    invalidate_capture(st->cap, w);
    add_report(report_kind::capture, w);
    return fail(cudaErrorStreamCaptureUnsupported, w);
  }
  auto o = std::make_shared<op>();
  o->k = wait ? kind::value_wait : kind::value_write;
  o->desc = make_desc(*st, call);
  o->dst = p;
  o->word = value;
  o->cond = wait ? (flags & 0x3u) : 0u;
  return enqueue(*st, o);
}

//! The driver's code for a runtime one: equal for every code `value_op` returns.
CUresult as_driver(cudaError_t e) {
  static_assert(int{cudaErrorInvalidValue} == int{CUDA_ERROR_INVALID_VALUE} &&
                int{cudaErrorInvalidResourceHandle} == int{CUDA_ERROR_INVALID_HANDLE} &&
                int{cudaErrorNotPermitted} == int{CUDA_ERROR_NOT_PERMITTED} &&
                int{cudaErrorStreamCaptureUnsupported} == int{CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED} &&
                int{cudaSuccess} == int{CUDA_SUCCESS});
  return static_cast<CUresult>(static_cast<int>(e));
}

CUresult CUDAAPI sim_wait_value32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return as_driver(value_op(stream, addr, value, flags, true));
}
CUresult CUDAAPI sim_write_value32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return as_driver(value_op(stream, addr, value, flags, false));
}

}  // namespace

extern "C" {

// ---- errors --------------------------------------------------------------------------------

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  switch (static_cast<int>(e)) {
    case 0: return "cudaSuccess";
#define LOOM_CUDASIM_ERROR(name, value) \
  case value: return #name;
#include "error_names.inc"
#undef LOOM_CUDASIM_ERROR
  }
  return "cudaErrorUnknownCode";
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    default: return cudaGetErrorName(e);
  }
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  auto& h = H();
  auto e = h.last_error;
  h.last_error = cudaSuccess;
  return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return H().last_error; }

// ---- devices -------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  LOOM_SIM_ENTER("cudaGetDeviceCount");
  if (count == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null pointer");
  *count = sim.cfg.devices;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  LOOM_SIM_ENTER("cudaSetDevice");
  if (device < 0 || device >= sim.cfg.devices)
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): the simulator has devices 0.." +
                                            std::to_string(sim.cfg.devices - 1));
  H().device = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDevice: null pointer");
  *device = H().device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  LOOM_SIM_ENTER("cudaGetDeviceProperties");
  if (prop == nullptr || device < 0 || device >= sim.cfg.devices) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: bad device");
  fill_props(prop, device);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  LOOM_SIM_ENTER("cudaDeviceGetAttribute");
  if (value == nullptr || device < 0 || device >= sim.cfg.devices) return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: bad device");
  cudaDeviceProp p;
  fill_props(&p, device);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  LOOM_SIM_ENTER("cudaMemGetInfo");
  const auto& du = sim.device_use[static_cast<std::size_t>(H().device)];
  if (free_bytes != nullptr) *free_bytes = sim.cfg.device_memory - du.current;
  if (total != nullptr) *total = sim.cfg.device_memory;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  LOOM_SIM_ENTER("cudaDeviceSynchronize");
  if (cudaError_t e; capture_forbids_unsafe("cudaDeviceSynchronize", e)) return e;
  return wait_ops(lk, device_tails(H().device), "cudaDeviceSynchronize");
}

cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  LOOM_SIM_ENTER("cudaDeviceCanAccessPeer");
  if (can == nullptr) return fail(cudaErrorInvalidValue, "cudaDeviceCanAccessPeer: null pointer");
  *can = device != peer && device >= 0 && peer >= 0 && device < sim.cfg.devices && peer < sim.cfg.devices;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int, unsigned int) { return cudaSuccess; }

// ---- streams -------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
  LOOM_SIM_ENTER("cudaStreamCreateWithFlags");
  if (out == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
  auto* st = new stream_state;
  st->id = sim.stream_counter++;
  st->device = H().device;
  st->agent = new_agent();
  st->flags = flags;
  st->name = "stream " + std::to_string(st->id) + " (device " + std::to_string(st->device) + ")";
  sim.streams.insert(st);
  *out = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* out, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(out, flags);
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaStreamDestroy");
  LOOM_SIM_STREAM(st, stream);
  if (st->legacy || stream == cudaStreamPerThread) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: a default stream cannot be destroyed");
  if (st->cap != nullptr) {
    std::string why = "cudaStreamDestroy of stream '" + st->name + "' while it is capturing";
    invalidate_capture(st->cap, why);
    add_report(report_kind::capture, why);
    return fail(cudaErrorStreamCaptureUnsupported, why);
  }
  sim.streams.erase(st);
  delete st;  // pending operations keep running: they do not refer to the stream
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaStreamSynchronize");
  LOOM_SIM_STREAM(st, stream);
  if (cudaError_t e; stream_capture_violation(*st, "cudaStreamSynchronize", e) || capture_forbids_unsafe("cudaStreamSynchronize", e)) return e;
  return wait_ops(lk, {st->last}, "cudaStreamSynchronize");
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaStreamQuery");
  LOOM_SIM_STREAM(st, stream);
  if (cudaError_t e; stream_capture_violation(*st, "cudaStreamQuery", e)) return e;
  if (st->last && st->last->state != op::st::done) {
    if (st->last->stuck) return wait_ops(lk, {st->last}, "cudaStreamQuery");
    return cudaErrorNotReady;
  }
  if (st->last) H().vc.join(st->last->vc);
  return report_findings_for_host("cudaStreamQuery");
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  LOOM_SIM_ENTER("cudaStreamWaitEvent");
  LOOM_SIM_STREAM(st, stream);
  cudaError_t err;
  auto* ev = resolve_event(event, err);
  if (ev == nullptr) return err;
  if (st->cap != nullptr) {
    auto* c = st->cap;
    if (c->invalid) return fail(cudaErrorStreamCaptureInvalidated, "the capture was invalidated: " + c->why);
    if ((flags & cudaEventWaitExternal) != 0) {
      node n;
      n.k = kind::wait;
      n.desc = make_desc(*st, "cudaStreamWaitEvent (external)");
      n.device = st->device;
      n.deps = st->cap_tail;
      n.lane = st->cap_lane;
      n.ext_event = ev;
      n.ext_wait = true;
      c->graph->nodes.push_back(std::move(n));
      st->cap_tail = {static_cast<int>(c->graph->nodes.size()) - 1};
      return cudaSuccess;
    }
    if (ev->cap == c) {
      for (int x : ev->cap_nodes)
        if (std::find(st->cap_tail.begin(), st->cap_tail.end(), x) == st->cap_tail.end()) st->cap_tail.push_back(x);
      return cudaSuccess;
    }
    std::string why = "stream '" + st->name + "' (capturing) waits on an event recorded " +
                      (ev->cap != nullptr ? std::string("in another capture") : std::string("outside the capture")) +
                      " (use cudaEventWaitExternal for an external dependency)";
    invalidate_capture(c, why);
    add_report(report_kind::capture, why);
    return fail(ev->cap != nullptr ? cudaErrorStreamCaptureMerge : cudaErrorStreamCaptureIsolation, why);
  }
  if (ev->cap != nullptr && !ev->cap->invalid) {
    // Fork: the stream joins the capture the event was recorded in.
    auto* c = ev->cap;
    st->cap = c;
    st->cap_tail = ev->cap_nodes;
    st->cap_lane = c->graph->lanes++;
    c->streams.push_back(st);
    return cudaSuccess;
  }
  if (!ev->rec) return cudaSuccess;  // never recorded: no dependency, as in CUDA
  auto o = std::make_shared<op>();
  o->k = kind::wait;
  o->desc = make_desc(*st, "cudaStreamWaitEvent");
  return enqueue(*st, o, {ev->rec});
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  LOOM_SIM_ENTER("cudaLaunchHostFunc");
  LOOM_SIM_STREAM(st, stream);
  if (fn == nullptr) return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc: null function");
  auto o = std::make_shared<op>();
  o->k = kind::host;
  o->desc = make_desc(*st, "cudaLaunchHostFunc");
  o->fn = [fn, data] { fn(data); };
  return enqueue(*st, o);
}

// ---- capture -------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  LOOM_SIM_ENTER("cudaStreamBeginCapture");
  LOOM_SIM_STREAM(st, stream);
  if (st->legacy) return fail(cudaErrorStreamCaptureUnsupported, "the legacy default stream cannot be captured");
  if (st->cap != nullptr) return fail(cudaErrorIllegalState, "stream '" + st->name + "' is already capturing");
  auto* c = new capture_session;
  c->origin = st;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->id = ++sim.capture_ids;
  c->graph->lanes = 1;
  c->streams.push_back(st);
  st->cap = c;
  st->cap_tail.clear();
  st->cap_lane = 0;
  sim.captures.push_back(c);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  LOOM_SIM_ENTER("cudaStreamEndCapture");
  LOOM_SIM_STREAM(st, stream);
  if (graph == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: null output pointer");
  auto* c = st->cap;
  if (c == nullptr) return fail(cudaErrorIllegalState, "cudaStreamEndCapture: stream '" + st->name + "' is not capturing");
  if (c->origin != st) {
    std::string why = "cudaStreamEndCapture on stream '" + st->name + "', but the capture began on stream '" + c->origin->name + "'";
    invalidate_capture(c, why);
    add_report(report_kind::capture, why);
    return fail(cudaErrorStreamCaptureUnmatched, why);
  }
  if (c->mode == cudaStreamCaptureModeThreadLocal && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture from another thread than the one that began a thread-local capture");
  // Every forked stream must have joined back: its last nodes are ancestors of the origin's.
  std::vector<char> anc(c->graph->nodes.size(), 0);
  std::vector<int> todo = st->cap_tail;
  while (!todo.empty()) {
    int x = todo.back();
    todo.pop_back();
    if (anc[static_cast<std::size_t>(x)]) continue;
    anc[static_cast<std::size_t>(x)] = 1;
    for (int d : c->graph->nodes[static_cast<std::size_t>(x)].deps) todo.push_back(d);
  }
  std::string unjoined;
  for (auto* other : c->streams) {
    if (other == st) continue;
    for (int x : other->cap_tail)
      if (!anc[static_cast<std::size_t>(x)]) {
        unjoined += (unjoined.empty() ? "'" : ", '") + other->name + "'";
        break;
      }
  }
  for (auto* other : c->streams) {
    other->cap = nullptr;
    other->cap_tail.clear();
  }
  for (auto* e : sim.events)
    if (e->cap == c) {
      e->cap = nullptr;
      e->cap_nodes.clear();
    }
  std::erase(sim.captures, c);
  std::unique_ptr<capture_session> owned(c);
  if (c->invalid) return fail(cudaErrorStreamCaptureInvalidated, "the capture begun on stream '" + st->name + "' was invalidated: " + c->why);
  if (!unjoined.empty()) {
    std::string why = "cudaStreamEndCapture on stream '" + st->name + "': stream(s) " + unjoined +
                      " forked into the capture but never joined back (record an event on them and wait on it from the origin stream)";
    add_report(report_kind::capture, why);
    return fail(cudaErrorStreamCaptureUnjoined, why);
  }
  auto* g = c->graph.release();
  sim.graphs.insert(g);
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  LOOM_SIM_ENTER("cudaStreamIsCapturing");
  LOOM_SIM_STREAM(st, stream);
  if (status == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: null pointer");
  *status = st->cap == nullptr ? cudaStreamCaptureStatusNone
                               : st->cap->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id,
                                               cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                               size_t* ndeps) {
  LOOM_SIM_ENTER("cudaStreamGetCaptureInfo");
  LOOM_SIM_STREAM(st, stream);
  if (status == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamGetCaptureInfo: null pointer");
  *status = st->cap == nullptr ? cudaStreamCaptureStatusNone
                               : st->cap->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  if (id != nullptr) *id = st->cap != nullptr ? st->cap->id : 0;
  if (graph != nullptr) *graph = nullptr;
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (ndeps != nullptr) *ndeps = st->cap != nullptr ? st->cap_tail.size() : 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: null pointer");
  std::swap(*mode, H().mode);
  return cudaSuccess;
}

// ---- graphs --------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  LOOM_SIM_ENTER("cudaGraphInstantiate");
  auto* g = reinterpret_cast<graph_state*>(graph);
  if (exec == nullptr || !sim.graphs.contains(g)) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: not a live graph");
  auto* x = new exec_state;
  x->g = *g;
  x->device = H().device;
  for (int i = 0; i < std::max(g->lanes, 1); ++i) x->lane_agents.push_back(new_agent());
  x->lane_counters.assign(x->lane_agents.size(), 0);
  sim.execs.insert(x);
  *exec = reinterpret_cast<cudaGraphExec_t>(x);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaGraphLaunch");
  LOOM_SIM_STREAM(st, stream);
  auto* x = reinterpret_cast<exec_state*>(exec);
  if (!sim.execs.contains(x)) return fail(cudaErrorInvalidValue, "cudaGraphLaunch: not a live executable graph");
  if (st->cap != nullptr) return fail(cudaErrorNotSupported, "cudaGraphLaunch inside a capture is not supported by loom's simulator");
  auto& h = H();
  const auto n = x->g.nodes.size();
  std::vector<op_ptr> ops(n);
  std::vector<clock_tick> lane_tick(x->lane_agents.size(), 0);
  std::vector<std::uint64_t> lane_region(x->lane_agents.size(), 0);
  // Each lane's ticks continue from the previous launch (launches of one graph are serialised).
  for (std::size_t i = 0; i < n; ++i) {
    const node& nd = x->g.nodes[i];
    auto o = std::make_shared<op>();
    o->k = nd.k;
    auto d = std::make_shared<op_desc>(*nd.desc);
    d->stream = nd.desc->stream + " (graph replay)";
    d->seq = nd.desc->seq;
    o->desc = d;
    o->device = nd.device;
    const auto lane = static_cast<std::size_t>(nd.lane);
    o->agent = x->lane_agents[lane];
    auto& counter = x->lane_counters[lane];
    if (nd.region != 0 && nd.region == lane_region[lane] && lane_tick[lane] != 0) {
      o->tick = lane_tick[lane];
    } else {
      o->tick = ++counter;
      lane_tick[lane] = o->tick;
      lane_region[lane] = nd.region;
    }
    o->acc = nd.acc;
    o->fn = nd.fn;
    o->dst = nd.dst;
    o->src = nd.src;
    o->bytes = nd.bytes;
    o->value = nd.value;
    o->calls = nd.calls;
    o->vc.join(h.vc);
    if (nd.deps.empty()) {
      add_pred(o, st->last);
      add_pred(o, x->last_end);
    }
    for (int dep : nd.deps) add_pred(o, ops[static_cast<std::size_t>(dep)]);
    if (nd.ext_wait && nd.ext_event->rec) add_pred(o, nd.ext_event->rec);
    if (nd.ext_record) nd.ext_event->rec = o;
    ops[i] = o;
    sim.live.push_back(o);
    ++sim.pending;
    if (o->k == kind::nccl) post_nccl_calls(*o);
  }
  auto end = std::make_shared<op>();
  end->k = kind::graph_end;
  end->desc = make_desc(*st, "cudaGraphLaunch");
  end->agent = st->agent;
  end->tick = ++st->counter;
  end->vc.join(h.vc);
  add_pred(end, st->last);
  add_pred(end, x->last_end);
  for (auto& o : ops) add_pred(end, o);
  st->last = end;
  x->last_end = end;
  sim.live.push_back(end);
  ++sim.pending;
  sim.last_progress = std::chrono::steady_clock::now();
  for (auto& o : ops) make_ready_if(o);
  make_ready_if(end);
  start_engine();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t exec) {
  LOOM_SIM_ENTER("cudaGraphExecDestroy");
  auto* x = reinterpret_cast<exec_state*>(exec);
  if (!sim.execs.erase(x)) return fail(cudaErrorInvalidValue, "cudaGraphExecDestroy: not a live executable graph");
  delete x;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  LOOM_SIM_ENTER("cudaGraphDestroy");
  auto* g = reinterpret_cast<graph_state*>(graph);
  if (!sim.graphs.erase(g)) return fail(cudaErrorInvalidValue, "cudaGraphDestroy: not a live graph");
  delete g;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  LOOM_SIM_ENTER("cudaGraphGetNodes");
  auto* g = reinterpret_cast<graph_state*>(graph);
  if (count == nullptr || !sim.graphs.contains(g)) return fail(cudaErrorInvalidValue, "cudaGraphGetNodes: not a live graph");
  if (nodes != nullptr)
    for (std::size_t i = 0; i < std::min(*count, g->nodes.size()); ++i) nodes[i] = reinterpret_cast<cudaGraphNode_t>(&g->nodes[i]);
  *count = g->nodes.size();
  return cudaSuccess;
}

// ---- events --------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  LOOM_SIM_ENTER("cudaEventCreateWithFlags");
  if (event == nullptr) return fail(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
  auto* e = new event_state;
  e->flags = flags;
  sim.events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  LOOM_SIM_ENTER("cudaEventDestroy");
  cudaError_t err;
  auto* e = resolve_event(event, err);
  if (e == nullptr) return err;
  sim.events.erase(e);
  // Graph nodes may still name it (external nodes): keep the object (owned by the simulator
  // from now on), forget its record.
  e->rec.reset();
  sim.retired_events.emplace_back(e);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  LOOM_SIM_ENTER("cudaEventRecord");
  LOOM_SIM_STREAM(st, stream);
  cudaError_t err;
  auto* e = resolve_event(event, err);
  if (e == nullptr) return err;
  if (st->cap != nullptr) {
    auto* c = st->cap;
    if (c->invalid) return fail(cudaErrorStreamCaptureInvalidated, "the capture was invalidated: " + c->why);
    if ((flags & cudaEventRecordExternal) != 0) {
      node n;
      n.k = kind::record;
      n.desc = make_desc(*st, "cudaEventRecord (external)");
      n.device = st->device;
      n.deps = st->cap_tail;
      n.lane = st->cap_lane;
      n.ext_event = e;
      n.ext_record = true;
      c->graph->nodes.push_back(std::move(n));
      st->cap_tail = {static_cast<int>(c->graph->nodes.size()) - 1};
      return cudaSuccess;
    }
    e->cap = c;
    e->cap_nodes = st->cap_tail;
    e->rec.reset();
    return cudaSuccess;
  }
  auto o = std::make_shared<op>();
  o->k = kind::record;
  o->desc = make_desc(*st, "cudaEventRecord");
  if ((e->flags & cudaEventDisableTiming) == 0) o->timed_event = e;
  if (auto r = enqueue(*st, o); r != cudaSuccess) return r;
  e->rec = o;
  e->cap = nullptr;
  e->recorded_time = false;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) { return cudaEventRecordWithFlags(event, stream, 0); }

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  LOOM_SIM_ENTER("cudaEventSynchronize");
  cudaError_t err;
  auto* e = resolve_event(event, err);
  if (e == nullptr) return err;
  if (e->cap != nullptr) {
    std::string why = "cudaEventSynchronize on an event recorded inside a capture (begun on stream '" + e->cap->origin->name + "')";
    invalidate_capture(e->cap, why);
    add_report(report_kind::capture, why);
    return fail(cudaErrorStreamCaptureUnsupported, why);
  }
  if (capture_forbids_unsafe("cudaEventSynchronize", err)) return err;
  return wait_ops(lk, {e->rec}, "cudaEventSynchronize");
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  LOOM_SIM_ENTER("cudaEventQuery");
  cudaError_t err;
  auto* e = resolve_event(event, err);
  if (e == nullptr) return err;
  if (e->cap != nullptr) {
    std::string why = "cudaEventQuery on an event recorded inside a capture (begun on stream '" + e->cap->origin->name + "')";
    invalidate_capture(e->cap, why);
    add_report(report_kind::capture, why);
    return fail(cudaErrorStreamCaptureUnsupported, why);
  }
  if (e->rec && e->rec->state != op::st::done) {
    if (e->rec->stuck) return wait_ops(lk, {e->rec}, "cudaEventQuery");
    return cudaErrorNotReady;
  }
  if (e->rec) H().vc.join(e->rec->vc);
  return report_findings_for_host("cudaEventQuery");
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  LOOM_SIM_ENTER("cudaEventElapsedTime");
  cudaError_t err;
  auto* a = resolve_event(start, err);
  if (a == nullptr) return err;
  auto* b = resolve_event(end, err);
  if (b == nullptr) return err;
  if (ms == nullptr) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null pointer");
  if ((a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!a->rec || !b->rec) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  if (a->rec->state != op::st::done || b->rec->state != op::st::done) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

// ---- memory --------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaMalloc(void** p, size_t size) {
  LOOM_SIM_ENTER("cudaMalloc");
  return allocate(p, size, false, "cudaMalloc");
}

cudaError_t CUDARTAPI cudaFree(void* p) {
  LOOM_SIM_ENTER("cudaFree");
  return deallocate(p, false, "cudaFree", lk);
}

cudaError_t CUDARTAPI cudaMallocHost(void** p, size_t size) {
  LOOM_SIM_ENTER("cudaMallocHost");
  return allocate(p, size, true, "cudaMallocHost");
}

cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t size, unsigned int) {
  LOOM_SIM_ENTER("cudaHostAlloc");
  return allocate(p, size, true, "cudaHostAlloc");
}

cudaError_t CUDARTAPI cudaFreeHost(void* p) {
  LOOM_SIM_ENTER("cudaFreeHost");
  return deallocate(p, true, "cudaFreeHost", lk);
}

cudaError_t CUDARTAPI cudaMallocAsync(void** p, size_t size, cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaMallocAsync");
  LOOM_SIM_STREAM(st, stream);
  (void)st;
  return allocate(p, size, false, "cudaMallocAsync");
}

cudaError_t CUDARTAPI cudaFreeAsync(void* p, cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaFreeAsync");
  LOOM_SIM_STREAM(st, stream);
  if (p == nullptr) return cudaSuccess;
  auto it = sim.allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == sim.allocs.end() || it->second.freed || it->second.pinned)
    return fail(cudaErrorInvalidValue, "cudaFreeAsync(" + hexp(p) + "): not a live device allocation");
  auto o = std::make_shared<op>();
  o->k = kind::free_async;
  o->desc = make_desc(*st, "cudaFreeAsync");
  o->free_ptr = p;
  return enqueue(*st, o);
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaMemcpyAsync");
  LOOM_SIM_STREAM(st, stream);
  auto o = std::make_shared<op>();
  if (auto e = copy_op(*o, dst, src, n, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  o->desc = make_desc(*st, "cudaMemcpyAsync");
  return enqueue(*st, o);
}

cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t n, cudaStream_t stream) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream);
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  LOOM_SIM_ENTER("cudaMemcpy");
  if (cudaError_t e; capture_forbids_unsafe("cudaMemcpy", e)) return e;
  auto* st = legacy_stream(H().device);
  auto o = std::make_shared<op>();
  if (auto e = copy_op(*o, dst, src, n, "cudaMemcpy"); e != cudaSuccess) return e;
  o->desc = make_desc(*st, "cudaMemcpy");
  if (auto e = enqueue(*st, o); e != cudaSuccess) return e;
  return wait_ops(lk, {o}, "cudaMemcpy");
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  LOOM_SIM_ENTER("cudaMemsetAsync");
  LOOM_SIM_STREAM(st, stream);
  std::string why;
  if (!check_range(p, n, false, why)) {
    add_report(report_kind::bad_pointer, "cudaMemsetAsync: " + why);
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync: " + why);
  }
  auto o = std::make_shared<op>();
  o->k = kind::memset;
  o->desc = make_desc(*st, "cudaMemsetAsync");
  o->dst = p;
  o->value = value;
  o->bytes = n;
  auto x = reinterpret_cast<std::uintptr_t>(p);
  o->acc.push_back({x, x + n, true});
  return enqueue(*st, o);
}

cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t n) {
  {
    auto& sim = S();
    std::unique_lock lk(sim.m);
    if (cudaError_t e; capture_forbids_unsafe("cudaMemset", e)) return e;
  }
  if (auto e = cudaMemsetAsync(p, value, n, nullptr); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  LOOM_SIM_ENTER("cudaPointerGetAttributes");
  if (attr == nullptr) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes: null pointer");
  std::memset(attr, 0, sizeof *attr);
  auto* a = find_alloc(p);
  if (a == nullptr || a->freed) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(p);
    return cudaSuccess;
  }
  attr->type = a->pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  attr->device = a->device;
  attr->devicePointer = const_cast<void*>(p);
  attr->hostPointer = a->pinned ? const_cast<void*>(p) : nullptr;
  return cudaSuccess;
}

// ---- the driver API's entry points ---------------------------------------------------------

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                       unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  (void)flags;
  if (symbol == nullptr || funcPtr == nullptr)
    return fail(cudaErrorInvalidValue, "cudaGetDriverEntryPointByVersion: null symbol or output");
  void* f = nullptr;
  // The simulator provides the stream memory operations (their v2 form, CUDA >= 12.0).
  if (cudaVersion >= 12000 && std::strcmp(symbol, "cuStreamWaitValue32") == 0) f = reinterpret_cast<void*>(&sim_wait_value32);
  if (cudaVersion >= 12000 && std::strcmp(symbol, "cuStreamWriteValue32") == 0) f = reinterpret_cast<void*>(&sim_write_value32);
  *funcPtr = f;
  if (status != nullptr) *status = f != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  if (f == nullptr && status == nullptr)
    return fail(cudaErrorSymbolNotFound, std::string("cudaGetDriverEntryPointByVersion: the simulator has no driver entry point '") + symbol + "'");
  return cudaSuccess;
}

}  // extern "C"
