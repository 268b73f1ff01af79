// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The NCCL entry points of loom's simulator, with the signatures of nccl.h: communicators of
// ranks that are threads of one process, groups, point-to-point matched per peer in FIFO order,
// collectives reduced in rank order, split, abort, asynchronous errors.

#include <algorithm>
#include <cstring>
#include <random>
#include <unistd.h>

#include "core.hpp"

using namespace loom::cudasim::impl;
using loom::cudasim::report_kind;

namespace {

thread_local int group_depth = 0;
thread_local std::vector<std::pair<cudaStream_t, nccl_call>> group_calls;
thread_local std::string nccl_detail;

ncclResult_t nfail(ncclResult_t r, std::string why) {
  nccl_detail = why;
  H().detail = std::move(why);
  return r;
}

std::size_t dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

std::shared_ptr<nccl_comm> resolve(ncclComm_t c, const char* call, ncclResult_t& r) {
  auto& s = S();
  auto it = s.comms.find(reinterpret_cast<nccl_comm*>(c));
  r = ncclSuccess;
  if (c == nullptr || it == s.comms.end()) {
    r = nfail(ncclInvalidArgument, std::string(call) + ": not a live communicator (never created, destroyed or aborted)");
    return nullptr;
  }
  return it->second;
}

// ---- half-precision arithmetic (reductions of ncclFloat16 / ncclBfloat16 go through float) ---

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      int e = -1;
      std::uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  int exp = static_cast<int>((x >> 23) & 0xffu) - 127 + 15;
  std::uint32_t man = x & 0x7fffffu;
  if (((x >> 23) & 0xffu) == 0xffu) return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0));
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t h = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(exp) << 10) | (man >> 13);
  const std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

float bf16_to_float(std::uint16_t b) {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

template <class T>
T apply(ncclRedOp_t op, T a, T b) {
  switch (op) {
    case ncclSum:
    case ncclAvg: return static_cast<T>(a + b);
    case ncclProd: return static_cast<T>(a * b);
    case ncclMax: return a < b ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return static_cast<T>(a + b);
  }
}

//! Element `i` of rank `k`'s contribution, reduced over ranks in rank order, for type T.
template <class T, class Load, class Store>
void reduce_into(const coll_instance& c, std::size_t count, std::size_t in_offset, void* out, Load load, Store store) {
  for (std::size_t i = 0; i < count; ++i) {
    auto acc = load(c.in[0], in_offset + i);
    for (int k = 1; k < c.n; ++k) acc = apply(c.red, acc, load(c.in[static_cast<std::size_t>(k)], in_offset + i));
    if (c.red == ncclAvg) acc = static_cast<decltype(acc)>(acc / static_cast<decltype(acc)>(c.n));
    store(out, i, acc);
  }
}

template <class T>
void reduce_typed(const coll_instance& c, std::size_t count, std::size_t in_offset, void* out) {
  auto load = [](const void* p, std::size_t i) {
    T v;
    std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
    return v;
  };
  auto store = [](void* p, std::size_t i, T v) { std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T)); };
  reduce_into<T>(c, count, in_offset, out, load, store);
}

template <bool Bf>
void reduce_half(const coll_instance& c, std::size_t count, std::size_t in_offset, void* out) {
  auto load = [](const void* p, std::size_t i) {
    std::uint16_t v;
    std::memcpy(&v, static_cast<const char*>(p) + i * 2, 2);
    return Bf ? bf16_to_float(v) : half_to_float(v);
  };
  auto store = [](void* p, std::size_t i, float v) {
    std::uint16_t h = Bf ? float_to_bf16(v) : float_to_half(v);
    std::memcpy(static_cast<char*>(p) + i * 2, &h, 2);
  };
  reduce_into<float>(c, count, in_offset, out, load, store);
}

void reduce(const coll_instance& c, std::size_t count, std::size_t in_offset, void* out) {
  switch (c.dtype) {
    case ncclInt8: reduce_typed<std::int8_t>(c, count, in_offset, out); break;
    case ncclUint8: reduce_typed<std::uint8_t>(c, count, in_offset, out); break;
    case ncclInt32: reduce_typed<std::int32_t>(c, count, in_offset, out); break;
    case ncclUint32: reduce_typed<std::uint32_t>(c, count, in_offset, out); break;
    case ncclInt64: reduce_typed<std::int64_t>(c, count, in_offset, out); break;
    case ncclUint64: reduce_typed<std::uint64_t>(c, count, in_offset, out); break;
    case ncclFloat32: reduce_typed<float>(c, count, in_offset, out); break;
    case ncclFloat64: reduce_typed<double>(c, count, in_offset, out); break;
    case ncclFloat16: reduce_half<false>(c, count, in_offset, out); break;
    case ncclBfloat16: reduce_half<true>(c, count, in_offset, out); break;
    default: break;
  }
}

//! Bytes read from `in` and written to `out` by one rank's part of a collective.
std::pair<std::size_t, std::size_t> coll_bytes(const nccl_call& c, int n, int rank) {
  const std::size_t e = dtype_size(c.dtype), k = c.count * e, nn = static_cast<std::size_t>(n);
  switch (c.t) {
    case nccl_call::type::all_reduce: return {k, k};
    case nccl_call::type::broadcast: return {rank == c.peer_or_root ? k : 0, k};
    case nccl_call::type::reduce: return {k, rank == c.peer_or_root ? k : 0};
    case nccl_call::type::all_gather: return {k, k * nn};
    case nccl_call::type::reduce_scatter: return {k * nn, k};
    case nccl_call::type::all_to_all: return {k * nn, k * nn};
    default: return {k, k};
  }
}

std::string describe_call(const nccl_call& c) {
  std::string s = call_name(c.t);
  if (c.t == nccl_call::type::send) s += " to rank " + std::to_string(c.peer_or_root);
  else if (c.t == nccl_call::type::recv) s += " from rank " + std::to_string(c.peer_or_root);
  return s;
}

//! Validates and queues (or, outside a group, issues) one call.
ncclResult_t submit(nccl_call call, cudaStream_t stream, const char* name) {
  auto& s = S();
  std::unique_lock lk(s.m);
  if (H().in_host_fn) return nfail(ncclInvalidUsage, std::string(name) + " called inside a host function");
  ncclResult_t r;
  auto comm = resolve(reinterpret_cast<ncclComm_t>(call.comm.get()), name, r);
  if (!comm) return r;
  if (!comm->ready) return nfail(ncclInvalidUsage, std::string(name) + ": the communicator's initialisation has not completed");
  if (comm->aborted) return nfail(ncclInvalidUsage, std::string(name) + ": the communicator was aborted");
  const std::size_t e = dtype_size(call.dtype);
  if (e == 0) return nfail(ncclInvalidArgument, std::string(name) + ": unsupported data type");
  if ((call.t == nccl_call::type::send || call.t == nccl_call::type::recv) && (call.peer_or_root < 0 || call.peer_or_root >= comm->n))
    return nfail(ncclInvalidArgument, std::string(name) + ": peer " + std::to_string(call.peer_or_root) + " is not a rank of the " +
                                          std::to_string(comm->n) + "-rank communicator");
  cudaError_t serr;
  auto* st = resolve_stream(stream, serr);
  if (st == nullptr) return nfail(ncclInvalidArgument, std::string(name) + ": invalid stream");
  if (st->device != comm->device)
    return nfail(ncclInvalidUsage, std::string(name) + ": the stream is on device " + std::to_string(st->device) +
                                       " but the communicator's rank uses device " + std::to_string(comm->device));
  auto [in_b, out_b] = coll_bytes(call, comm->n, comm->rank);
  if (call.t == nccl_call::type::send) out_b = 0;
  if (call.t == nccl_call::type::recv) in_b = 0;
  std::string why;
  if ((in_b && !check_range(call.in, in_b, false, why)) || (out_b && !check_range(call.out, out_b, false, why))) {
    add_report(report_kind::bad_pointer, std::string(name) + ": " + why);
    return nfail(ncclInvalidArgument, std::string(name) + ": " + why);
  }
  group_calls.emplace_back(stream, std::move(call));
  return ncclSuccess;
}

//! Issues the calls of the finished group: one NCCL operation per stream.
ncclResult_t flush_group() {
  auto calls = std::move(group_calls);
  group_calls.clear();
  auto& s = S();
  std::unique_lock lk(s.m);
  std::vector<cudaStream_t> order;
  for (auto& c : calls)
    if (std::find(order.begin(), order.end(), c.first) == order.end()) order.push_back(c.first);
  for (auto stream : order) {
    cudaError_t serr;
    auto* st = resolve_stream(stream, serr);
    if (st == nullptr) return nfail(ncclInvalidArgument, "ncclGroupEnd: a stream of the group was destroyed");
    auto o = std::make_shared<op>();
    o->k = kind::nccl;
    std::string label;
    for (auto& [cs, c] : calls) {
      if (cs != stream) continue;
      label += (label.empty() ? "" : ", ") + describe_call(c);
      auto [in_b, out_b] = coll_bytes(c, c.comm->n, c.comm->rank);
      if (c.t == nccl_call::type::send) out_b = 0;
      if (c.t == nccl_call::type::recv) in_b = 0;
      // Reads are checked when the group starts; writes when the data arrives (`nccl_transfer`,
      // `nccl_collective`), ordered after the operations that sent it.
      auto in = reinterpret_cast<std::uintptr_t>(c.in);
      (void)out_b;
      if (in_b) o->acc.push_back({in, in + in_b, false});
      o->calls.push_back(c);
    }
    if (o->calls.size() > 1) label = "ncclGroup{" + label + "}";
    o->desc = make_desc(*st, label);
    if (auto e = enqueue(*st, o); e != cudaSuccess) return nfail(ncclInvalidUsage, "NCCL call on stream '" + st->name + "': " + H().detail);
  }
  return ncclSuccess;
}

ncclResult_t issue(nccl_call call, cudaStream_t stream, const char* name) {
  if (auto r = submit(std::move(call), stream, name); r != ncclSuccess) return r;
  if (group_depth > 0) return ncclSuccess;
  return flush_group();
}

void part_done(p2p_part& p) {
  p.done = true;
  auto& c = *p.comm;
  if (c.fail_countdown > 0 && --c.fail_countdown == 0) {
    c.broken = true;
    c.async_error = c.fail_with;
  }
  if (--p.owner->parts_left == 0) complete(*p.owner);
}

void coll_part_done(coll_part& p, nccl_comm& c) {
  p.done = true;
  if (c.fail_countdown > 0 && --c.fail_countdown == 0) {
    c.broken = true;
    c.async_error = c.fail_with;
  }
  if (--p.owner->parts_left == 0) complete(*p.owner);
}

std::shared_ptr<nccl_comm> make_comm(const std::shared_ptr<nccl_world>& w, int rank, int device) {
  auto c = std::make_shared<nccl_comm>();
  c->world = w;
  c->rank = rank;
  c->n = w->n;
  c->device = device;
  return c;
}

//! Every rank of a world has a distinct device (as NCCL requires).
void finish_world(nccl_world& w) {
  std::map<int, int> seen;
  std::string dup;
  for (int r = 0; r < w.n; ++r) {
    auto c = w.ranks[static_cast<std::size_t>(r)].lock();
    if (!c) continue;
    auto [it, fresh] = seen.emplace(c->device, r);
    if (!fresh && dup.empty())
      dup = "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " of a communicator use the same device " +
            std::to_string(c->device) + " (NCCL needs one device per rank: call cudaSetDevice before ncclCommInitRank)";
  }
  for (int r = 0; r < w.n; ++r)
    if (auto c = w.ranks[static_cast<std::size_t>(r)].lock()) {
      c->ready = true;
      if (!dup.empty()) {
        c->async_error = ncclInvalidUsage;
        c->aborted = true;
      }
    }
  if (!dup.empty()) add_report(report_kind::nccl, dup);
  S().done_cv.notify_all();
}

}  // namespace

namespace loom::cudasim::impl {

void post_nccl_calls(op& o) {
  auto calls = std::move(o.calls);
  o.calls.clear();
  for (auto& c : calls) {
    auto& comm = c.comm;
    auto& w = *comm->world;
    if (c.t == nccl_call::type::send || c.t == nccl_call::type::recv) {
      auto p = std::make_unique<p2p_part>();
      p->comm = comm;
      p->peer = c.peer_or_root;
      p->send = c.t == nccl_call::type::send;
      p->buf = p->send ? const_cast<void*>(c.in) : c.out;
      p->bytes = c.count * dtype_size(c.dtype);
      p->owner = &o;
      const std::pair<int, int> key = p->send ? std::pair{comm->rank, p->peer} : std::pair{p->peer, comm->rank};
      auto& mine = p->send ? w.sends[key] : w.recvs[key];
      auto& theirs = p->send ? w.recvs[key] : w.sends[key];
      if (!theirs.empty()) {
        p->partner = theirs.front();
        theirs.front()->partner = p.get();
        theirs.pop_front();
      } else {
        mine.push_back(p.get());
      }
      o.p2p.push_back(std::move(p));
    } else {
      const std::uint64_t seq = comm->coll_seq++;
      auto& inst = w.colls[seq];
      if (!inst) {
        inst = std::make_shared<coll_instance>();
        inst->t = c.t;
        inst->world = comm->world;
        inst->count = c.count;
        inst->dtype = c.dtype;
        inst->red = c.red;
        inst->root = c.peer_or_root;
        inst->n = comm->n;
        inst->parts.assign(static_cast<std::size_t>(comm->n), nullptr);
        inst->in.assign(static_cast<std::size_t>(comm->n), nullptr);
        inst->out.assign(static_cast<std::size_t>(comm->n), nullptr);
      } else if (inst->t != c.t || inst->count != c.count || inst->dtype != c.dtype || inst->red != c.red ||
                 inst->root != c.peer_or_root) {
        inst->mismatch = true;
        inst->why = "collective #" + std::to_string(seq) + " of a communicator: rank " + std::to_string(comm->rank) + " called " +
                    call_name(c.t) + " with " + std::to_string(c.count) + " elements but an earlier rank called " +
                    call_name(inst->t) + " with " + std::to_string(inst->count) +
                    " (every rank must issue the same collectives in the same order)";
      }
      auto p = std::make_unique<coll_part>();
      p->inst = inst;
      p->comm = comm;
      p->out = c.out;
      p->out_bytes = coll_bytes(c, comm->n, comm->rank).second;
      p->rank = comm->rank;
      p->owner = &o;
      inst->parts[static_cast<std::size_t>(comm->rank)] = p.get();
      inst->in[static_cast<std::size_t>(comm->rank)] = c.in;
      inst->out[static_cast<std::size_t>(comm->rank)] = c.out;
      if (++inst->arrived == inst->n) w.colls.erase(seq);
      o.coll.push_back(std::move(p));
    }
  }
  o.parts_left = static_cast<int>(o.p2p.size() + o.coll.size());
}

void nccl_activate(op& o) {
  auto& s = S();
  o.state = op::st::active;
  check_accesses(o);
  if (o.parts_left == 0) {
    complete(o);
    return;
  }
  std::vector<p2p_part*> fail_now;
  for (auto& p : o.p2p) {
    if (p->comm->aborted) {
      fail_now.push_back(p.get());
      continue;
    }
    if (p->partner != nullptr && p->partner->owner->state == op::st::active && !p->partner->done)
      s.runnable.push_back({item::type::transfer, nullptr, p->send ? p.get() : p->partner, nullptr});
  }
  std::vector<coll_part*> coll_fail;
  for (auto& p : o.coll) {
    if (p->comm->aborted) {
      coll_fail.push_back(p.get());
      continue;
    }
    if (++p->inst->active == p->inst->n) s.runnable.push_back({item::type::collective, nullptr, nullptr, p->inst});
  }
  for (auto* p : fail_now) {
    p->owner->failed = true;
    part_done(*p);
  }
  for (auto* p : coll_fail) {
    p->owner->failed = true;
    coll_part_done(*p, *p->comm);
  }
}

void nccl_transfer(p2p_part* snd) {
  p2p_part* rcv = snd->partner;
  if (snd->done || rcv == nullptr || rcv->done) return;
  if (snd->comm->broken || rcv->comm->broken || snd->comm->aborted || rcv->comm->aborted) return;
  if (snd->bytes != rcv->bytes) {
    std::string why = "ncclSend of " + std::to_string(snd->bytes) + " bytes by rank " + std::to_string(snd->comm->rank) + " (" +
                      snd->owner->desc->describe() + ") matched ncclRecv of " + std::to_string(rcv->bytes) + " bytes on rank " +
                      std::to_string(rcv->comm->rank) + " (" + rcv->owner->desc->describe() +
                      "): sends and receives are matched per peer in FIFO order and must have equal sizes";
    add_report(report_kind::nccl, why, snd->owner->desc->describe(), rcv->owner->desc->describe());
    snd->comm->async_error = rcv->comm->async_error = ncclInvalidUsage;
    snd->comm->broken = rcv->comm->broken = true;
    return;
  }
  // The receive writes once the sender's data arrives: after everything ordered before the send.
  rcv->owner->vc.join(snd->owner->vc);
  const auto dst = reinterpret_cast<std::uintptr_t>(rcv->buf);
  check_access(*rcv->owner, {dst, dst + rcv->bytes, true});
  if (snd->bytes) std::memcpy(rcv->buf, snd->buf, snd->bytes);
  part_done(*snd);
  part_done(*rcv);
}

void nccl_collective(const std::shared_ptr<coll_instance>& c) {
  if (c->ran) return;
  c->ran = true;
  std::vector<std::shared_ptr<nccl_comm>> comms;
  for (auto* p : c->parts) comms.push_back(p->comm);
  for (auto& cm : comms)
    if (cm->aborted || cm->broken) {
      c->ran = false;  // an aborted or failed rank: the collective never completes for the others
      return;
    }
  if (c->mismatch) {
    add_report(report_kind::nccl, c->why);
    for (auto& cm : comms)
      if (cm) {
        cm->async_error = ncclInvalidUsage;
        cm->broken = true;
      }
    return;
  }
  const std::size_t e = dtype_size(c->dtype), k = c->count * e, n = static_cast<std::size_t>(c->n);
  // Results go to scratch first: buffers may alias (in-place collectives).
  std::vector<std::vector<char>> res(n);
  switch (c->t) {
    case nccl_call::type::all_reduce: {
      std::vector<char> r(k);
      reduce(*c, c->count, 0, r.data());
      for (std::size_t i = 0; i < n; ++i) res[i] = r;
      break;
    }
    case nccl_call::type::reduce: {
      res[static_cast<std::size_t>(c->root)].resize(k);
      reduce(*c, c->count, 0, res[static_cast<std::size_t>(c->root)].data());
      break;
    }
    case nccl_call::type::broadcast: {
      const char* src = static_cast<const char*>(c->in[static_cast<std::size_t>(c->root)]);
      for (std::size_t i = 0; i < n; ++i) res[i].assign(src, src + k);
      break;
    }
    case nccl_call::type::all_gather: {
      std::vector<char> r(k * n);
      for (std::size_t j = 0; j < n; ++j) std::memcpy(r.data() + j * k, c->in[j], k);
      for (std::size_t i = 0; i < n; ++i) res[i] = r;
      break;
    }
    case nccl_call::type::reduce_scatter: {
      for (std::size_t i = 0; i < n; ++i) {
        res[i].resize(k);
        reduce(*c, c->count, i * c->count, res[i].data());
      }
      break;
    }
    case nccl_call::type::all_to_all: {
      for (std::size_t i = 0; i < n; ++i) {
        res[i].resize(k * n);
        for (std::size_t j = 0; j < n; ++j) std::memcpy(res[i].data() + j * k, static_cast<const char*>(c->in[j]) + i * k, k);
      }
      break;
    }
    default: break;
  }
  vclock all;
  for (auto* p : c->parts) all.join(p->owner->vc);
  for (auto* p : c->parts) {
    // Each rank's output is written once every rank's input is there.
    p->owner->vc.join(all);
    const auto dst = reinterpret_cast<std::uintptr_t>(p->out);
    if (p->out_bytes) check_access(*p->owner, {dst, dst + p->out_bytes, true});
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!res[i].empty()) std::memcpy(c->out[i], res[i].data(), res[i].size());
  for (std::size_t i = 0; i < n; ++i) {
    auto* p = c->parts[i];
    coll_part_done(*p, *comms[i]);
  }
}

}  // namespace loom::cudasim::impl

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return nccl_detail.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  auto& s = S();
  std::unique_lock lk(s.m);
  std::memset(id->internal, 0, sizeof id->internal);
  std::random_device rd;
  const std::uint64_t words[4] = {0x6c6f6f6d73696dULL /* "loomsim" */, ++s.id_counter, static_cast<std::uint64_t>(::getpid()),
                                  (static_cast<std::uint64_t>(rd()) << 32) ^ rd()};
  std::memcpy(id->internal, words, sizeof words);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  auto& s = S();
  std::unique_lock lk(s.m);
  if (out == nullptr || nranks < 1 || rank < 0 || rank >= nranks)
    return nfail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " is out of range");
  const std::string key(id.internal, sizeof id.internal);
  auto& w = s.inits[key];
  if (!w) {
    w = std::make_shared<nccl_world>();
    w->n = nranks;
    w->ranks.resize(static_cast<std::size_t>(nranks));
    w->name = "comm" + std::to_string(s.comms.size());
  }
  auto world = w;
  if (world->n != nranks)
    return nfail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " says " + std::to_string(nranks) +
                                          " ranks but another rank said " + std::to_string(world->n));
  if (!world->ranks[static_cast<std::size_t>(rank)].expired())
    return nfail(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " joined the same unique id twice");
  auto c = make_comm(world, rank, H().device);
  world->ranks[static_cast<std::size_t>(rank)] = c;
  s.comms[c.get()] = c;
  *out = reinterpret_cast<ncclComm_t>(c.get());
  int joined = 0;
  for (auto& r : world->ranks) joined += r.expired() ? 0 : 1;
  if (joined == world->n) {
    s.inits.erase(key);
    finish_world(*world);
  }
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) return c->ready ? ncclSuccess : ncclInProgress;
  const auto deadline = std::chrono::steady_clock::now() + s.cfg.deadlock_after;
  while (!c->ready)
    if (s.done_cv.wait_until(lk, deadline) == std::cv_status::timeout && !c->ready)
      return nfail(ncclSystemError, "ncclCommInitRank: rank " + std::to_string(rank) + " waited " + std::to_string(s.cfg.deadlock_after.count()) +
                                        " ms for the other ranks of the communicator to join (only " + std::to_string(joined) + " of " +
                                        std::to_string(nranks) + " had)");
  return c->async_error == ncclSuccess ? ncclSuccess : nfail(c->async_error, H().detail);
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  auto& s = S();
  std::unique_lock lk(s.m);
  if (comms == nullptr || ndev < 1) return nfail(ncclInvalidArgument, "ncclCommInitAll: bad arguments");
  auto w = std::make_shared<nccl_world>();
  w->n = ndev;
  w->ranks.resize(static_cast<std::size_t>(ndev));
  for (int r = 0; r < ndev; ++r) {
    auto c = make_comm(w, r, devlist != nullptr ? devlist[r] : r);
    w->ranks[static_cast<std::size_t>(r)] = c;
    s.comms[c.get()] = c;
    comms[r] = reinterpret_cast<ncclComm_t>(c.get());
  }
  finish_world(*w);
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  auto& s = S();
  std::unique_lock lk(s.m);
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommSplit", r);
  if (!c) return r;
  if (newcomm == nullptr) return nfail(ncclInvalidArgument, "ncclCommSplit: null output pointer");
  if (c->aborted) return nfail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
  auto w = c->world;
  const std::uint64_t seq = c->split_seq++;
  auto& round = w->splits[seq];
  if (round.ck.empty()) round.ck.assign(static_cast<std::size_t>(w->n), {NCCL_SPLIT_NOCOLOR, 0});
  round.ck[static_cast<std::size_t>(c->rank)] = {color, key};
  if (++round.arrived == w->n) {
    round.made.assign(static_cast<std::size_t>(w->n), nullptr);
    std::map<int, std::vector<int>> by_color;
    for (int x = 0; x < w->n; ++x)
      if (round.ck[static_cast<std::size_t>(x)].first != NCCL_SPLIT_NOCOLOR) by_color[round.ck[static_cast<std::size_t>(x)].first].push_back(x);
    for (auto& [col, members] : by_color) {
      // By key, ties by rank (NCCL's rule); std::sort with the tie-break, as libstdc++ 12's
      // std::stable_sort warns under clang.
      std::sort(members.begin(), members.end(), [&](int a, int b) {
        auto ka = round.ck[static_cast<std::size_t>(a)].second, kb = round.ck[static_cast<std::size_t>(b)].second;
        return ka != kb ? ka < kb : a < b;
      });
      auto nw = std::make_shared<nccl_world>();
      nw->n = static_cast<int>(members.size());
      nw->ranks.resize(members.size());
      nw->name = w->name + "/split" + std::to_string(seq) + "." + std::to_string(col);
      for (std::size_t i = 0; i < members.size(); ++i) {
        auto old = w->ranks[static_cast<std::size_t>(members[i])].lock();
        auto nc = make_comm(nw, static_cast<int>(i), old ? old->device : 0);
        nw->ranks[i] = nc;
        round.made[static_cast<std::size_t>(members[i])] = nc;
      }
      finish_world(*nw);
    }
    round.done = true;
    s.done_cv.notify_all();
  }
  const auto deadline = std::chrono::steady_clock::now() + s.cfg.deadlock_after;
  while (!round.done)
    if (s.done_cv.wait_until(lk, deadline) == std::cv_status::timeout && !round.done)
      return nfail(ncclSystemError, "ncclCommSplit: rank " + std::to_string(c->rank) + " waited " + std::to_string(s.cfg.deadlock_after.count()) +
                                        " ms for the other ranks to call ncclCommSplit (" + std::to_string(round.arrived) + " of " +
                                        std::to_string(w->n) + " did)");
  auto nc = round.made[static_cast<std::size_t>(c->rank)];
  if (nc) s.comms[nc.get()] = nc;
  *newcomm = nc ? reinterpret_cast<ncclComm_t>(nc.get()) : nullptr;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  auto& s = S();
  std::unique_lock lk(s.m);
  if (comm == nullptr) return ncclSuccess;
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommAbort", r);
  if (!c) return r;
  c->aborted = true;
  auto& w = *c->world;
  for (auto* q : {&w.sends, &w.recvs})
    for (auto& [key, dq] : *q) std::erase_if(dq, [&](p2p_part* p) { return p->comm == c; });
  // Pending operations of this rank on the communicator end now (failed).
  std::vector<op_ptr> touched;
  for (auto& o : s.live) {
    if (o->state == op::st::done) continue;
    bool mine = false;
    for (auto& p : o->p2p) mine = mine || p->comm == c;
    for (auto& p : o->coll) mine = mine || p->comm == c;
    if (mine) touched.push_back(o);
  }
  for (auto& o : touched) {
    o->failed = true;
    if (o->state != op::st::active) {
      // Not started yet: it will fail as soon as it activates (its parts see the abort).
      continue;
    }
    for (auto& p : o->p2p)
      if (!p->done && p->comm == c) part_done(*p);
    for (auto& p : o->coll)
      if (!p->done && p->comm == c) coll_part_done(*p, *c);
  }
  s.comms.erase(c.get());
  s.done_cv.notify_all();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto& s = S();
  std::unique_lock lk(s.m);
  if (comm == nullptr) return ncclSuccess;
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommDestroy", r);
  if (!c) return r;
  c->destroyed = true;
  s.comms.erase(c.get());
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  auto& s = S();
  std::unique_lock lk(s.m);
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommFinalize", r);
  return c ? ncclSuccess : r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  auto& s = S();
  std::unique_lock lk(s.m);
  if (err == nullptr) return ncclInvalidArgument;
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommGetAsyncError", r);
  if (!c) return r;
  *err = !c->ready ? ncclInProgress : c->async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  auto& s = S();
  std::unique_lock lk(s.m);
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommCount", r);
  if (!c) return r;
  *count = c->n;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  auto& s = S();
  std::unique_lock lk(s.m);
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommUserRank", r);
  if (!c) return r;
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  auto& s = S();
  std::unique_lock lk(s.m);
  ncclResult_t r;
  auto c = resolve(comm, "ncclCommCuDevice", r);
  if (!c) return r;
  *device = c->device;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return nfail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  return flush_group();
}

}  // extern "C" (the helpers below return C++ types)
namespace {
std::shared_ptr<nccl_comm> comm_ptr(ncclComm_t c) {
  auto& s = S();
  std::unique_lock lk(s.m);
  auto it = s.comms.find(reinterpret_cast<nccl_comm*>(c));
  return it == s.comms.end() ? nullptr : it->second;
}
ncclResult_t bad_comm(const char* call) { return nfail(ncclInvalidArgument, std::string(call) + ": not a live communicator"); }
}  // namespace
extern "C" {

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclSend");
  return issue({c, nccl_call::type::send, buf, nullptr, count, t, ncclSum, peer}, stream, "ncclSend");
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclRecv");
  return issue({c, nccl_call::type::recv, nullptr, buf, count, t, ncclSum, peer}, stream, "ncclRecv");
}

ncclResult_t ncclAllReduce(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclAllReduce");
  return issue({c, nccl_call::type::all_reduce, in, out, count, t, op, 0}, stream, "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void* in, void* out, size_t count, ncclDataType_t t, int root, ncclComm_t comm, cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclBroadcast");
  return issue({c, nccl_call::type::broadcast, in, out, count, t, ncclSum, root}, stream, "ncclBroadcast");
}

ncclResult_t ncclReduce(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclReduce");
  return issue({c, nccl_call::type::reduce, in, out, count, t, op, root}, stream, "ncclReduce");
}

ncclResult_t ncclAllGather(const void* in, void* out, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclAllGather");
  return issue({c, nccl_call::type::all_gather, in, out, count, t, ncclSum, 0}, stream, "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclReduceScatter");
  return issue({c, nccl_call::type::reduce_scatter, in, out, count, t, op, 0}, stream, "ncclReduceScatter");
}

ncclResult_t ncclAlltoAll(const void* in, void* out, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t stream) {
  auto c = comm_ptr(comm);
  if (!c) return bad_comm("ncclAlltoAll");
  return issue({c, nccl_call::type::all_to_all, in, out, count, t, ncclSum, 0}, stream, "ncclAlltoAll");
}

}  // extern "C"
