// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `loom::cudasim`: loom's strict simulator of the CUDA runtime and NCCL, for machines without a
//! GPU. Build loom with `-DLOOM_CUDA_RUNTIME=sim` and link `loom::cuda` / `loom::nccl`: programs
//! then link `loom_cudasim` (a small compiled library) instead of `libcudart` and `libnccl`. It
//! implements the public entry points loom's CUDA layer and its examples use, with the real
//! headers' signatures (`cuda_runtime_api.h`, `nccl.h`), so the same code runs here and on a GPU.
//!
//! What it models.
//! - Devices (8 by default, `LOOM_CUDASIM_DEVICES`), each with a memory budget; device and
//!   pinned allocations are host memory, so host code can run as "kernels".
//! - Streams as in-order queues, events (record/wait/synchronise/query/elapsed time), host
//!   functions, asynchronous copies and memsets, the legacy default stream's implicit
//!   synchronisation, stream-ordered allocation.
//! - Stream capture (global, thread-local and relaxed modes, fork/join through events, external
//!   event nodes) and graph instantiation and replay.
//! - NCCL: communicators of ranks that are threads of one process (`ncclGetUniqueId` +
//!   `ncclCommInitRank[Config]`, blocking and non-blocking), `ncclCommSplit`, groups, `ncclSend`
//!   and `ncclRecv` matched per peer in FIFO order, every collective (reductions in rank order,
//!   so results are bitwise reproducible), `ncclCommAbort`, asynchronous errors (and injected
//!   ones, `fail_nccl_after`).
//! - One engine thread runs the operations of every stream in a seeded random order among those
//!   whose dependencies are met, with seeded random delays, so a missing dependency also shows up
//!   as a wrong result.
//!
//! What it checks, stricter than CUDA.
//! - Races: every operation carries the device byte ranges it reads and writes (copies, memsets,
//!   NCCL buffers, and for kernels the ranges named by `begin_region` and, for kernels compiled
//!   with clang's load/store tracing (`loom_cuda_stage(target)` in CMake), the bytes they actually
//!   load and store, side streams included). Conflicting accesses of two
//!   operations that are not ordered by happens-before (stream order, events, host
//!   synchronisation, NCCL completion; vector clocks) are a race, found whatever order the
//!   operations ran in, and reported naming both operations (label and stream), the memory and
//!   the bytes. The happens-before relation depends on what was enqueued, not on timing.
//! - An instrumented kernel inside a region that touches bytes of an allocation the region
//!   declares parts of, outside those parts (`report_kind::undeclared`, policy
//!   `config::undeclared`): an off-by-one into a neighbour's slot.
//! - Use after free and accesses outside any allocation; capture-rule violations
//!   (synchronising or querying inside a capture, unjoined streams, isolation); CUDA calls from a
//!   host function; deadlocks (no operation can run, none ran or was enqueued for
//!   `deadlock_after`): every stuck operation is named with what it waits for; mismatched NCCL
//!   sizes and collectives.
//! - Device-memory accounting per device and per owner (the thread label, `name_thread`).
//!
//! What it does not model: kernels' speed and GPU occupancy, NCCL transports and their
//! bandwidth, unified memory, multi-process NCCL, peer-access topology, device-side code
//! (`<<<>>>` does not compile against it: kernels are host code launched with `launch`).
//!
//! A detected problem is a `report`. Races and use-after-free are returned as
//! `cudaErrorLaunchFailure` by the next host synchronisation that orders both operations (policy
//! `fail`, the default), with `detail()` holding the sentence; with policy `record` they are only
//! collected (`reports()`). Deadlocks make the stuck waits return `cudaErrorLaunchTimeout`.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace loom::cudasim {

//! What to do when a race or a use after free is found.
enum class race_policy : unsigned char {
  fail,    //!< report it and fail the host synchronisation that orders both operations
  record,  //!< only collect it (`reports()`)
};

//! Settings of the simulator (`configure`). Environment variables give the defaults:
//! `LOOM_CUDASIM_SEED`, `LOOM_CUDASIM_DELAYS` (0/1), `LOOM_CUDASIM_DEADLOCK_MS`,
//! `LOOM_CUDASIM_DEVICES`, `LOOM_CUDASIM_RACES` (fail/record), `LOOM_CUDASIM_REGIONS` (0/1),
//! `LOOM_CUDASIM_ACTUAL` (0/1), `LOOM_CUDASIM_UNDECLARED` (fail/record).
struct config {
  std::uint64_t seed = 1;                        //!< seeds the order and the delays
  bool delays = true;                            //!< random order and delays (false: FIFO, no sleep)
  double delay_probability = 0.2;                //!< chance of a delay before an operation
  std::chrono::microseconds max_delay{200};      //!< longest delay
  race_policy races = race_policy::fail;         //!< see `race_policy`
  std::chrono::milliseconds deadlock_after{3000};  //!< idle time with stuck work that is a deadlock
  bool trace = false;                            //!< keep the executed-operation trace
  int devices = 8;                               //!< simulated devices
  std::size_t device_memory = std::size_t{80} << 30;  //!< bytes per device
  //! Check the byte ranges `begin_region` declares for kernels (false: only copies, memsets,
  //! NCCL buffers and the actual accesses of instrumented kernels are checked).
  bool regions = true;
  //! Check the bytes instrumented kernels actually load and store (`loom_cuda_stage`, clang).
  bool actual_accesses = true;
  //! What to do when an instrumented kernel inside a region touches bytes of an allocation the
  //! region declares parts of, outside those parts ("which loom did not hand it").
  race_policy undeclared = race_policy::fail;
};

//! Waits until no operation is pending, then applies `c`, clears reports, trace and race
//! history, and resets the memory peaks to the current use. Allocations, streams, events and
//! communicators survive.
void configure(const config& c);
//! The settings in use.
config current_config();
//! `configure(current_config())` with a new seed.
void reseed(std::uint64_t seed);

//! Kinds of findings.
enum class report_kind : unsigned char { race, use_after_free, bad_pointer, deadlock, capture, nccl, api, undeclared };
//! Name of a report kind ("race", ...).
std::string_view to_string(report_kind k);

//! One finding of the simulator.
struct report {
  report_kind kind = report_kind::api;
  std::string text;    //!< the whole sentence
  std::string first;   //!< the first operation ("F mb3 s2 on stream 'r2 compute'"), if any
  std::string second;  //!< the second operation, if any
};
//! Every finding since the last `configure`.
std::vector<report> reports();
//! The sentence explaining this thread's last failed simulator call (CUDA or NCCL), or "".
std::string detail();

//! Bytes allocated (device memory) now and at the peak since the last `configure`/`reset_peaks`.
struct memory_use {
  std::size_t current = 0;  //!< bytes allocated now
  std::size_t peak = 0;     //!< largest `current` seen
};
//! Device memory of device `device`.
memory_use device_memory(int device);
//! Device memory allocated by threads labelled `owner` (`name_thread`), over all devices.
memory_use owner_memory(std::string_view owner);
//! Sets every peak to the current use.
void reset_peaks();

//! One executed operation (`config::trace`).
struct trace_entry {
  std::string kind;    //!< "kernel", "copy", "memset", "host", "record", "wait", "nccl", ...
  std::string label;   //!< the region's label or the call ("ncclSend", ...)
  std::string stream;  //!< the stream's name
  int device = 0;      //!< the device
};
//! The executed operations in execution order since the last `configure`.
std::vector<trace_entry> trace();

//! A device byte range an operation reads or writes.
struct access {
  const void* ptr = nullptr;  //!< first byte
  std::size_t bytes = 0;      //!< length
  bool write = false;         //!< written (else read)
};
//! Opens a region on `stream`: the operations enqueued on it until `end_region` form one logical
//! operation named `label` that reads and writes `accesses` (what a kernel touches; the race
//! detector checks them). Regions nest: one opened inside another (a kernel's own region inside a
//! stage call's) names and declares its operations until it closes, then the enclosing one resumes.
void begin_region(cudaStream_t stream, std::string_view label, std::span<const access> accesses);
//! Closes the innermost region opened on `stream`.
void end_region(cudaStream_t stream);
//! Enqueues `fn` on `stream` as a kernel: run by the simulator in stream order, captured into
//! graphs (the graph keeps a copy of `fn`). Its accesses are those of the enclosing region.
void launch(cudaStream_t stream, std::string_view label, std::function<void()> fn);
//! Names a stream in reports and traces.
void name_stream(cudaStream_t stream, std::string_view name);
//! Names the memory starting at `ptr` (an allocation) in reports.
void name_memory(const void* ptr, std::string_view name);
//! Labels the calling thread: reports mention it and its allocations count for `owner_memory`.
void name_thread(std::string_view name);

//! A host-level hand-off through `key` (an address): the calling thread publishes what it has
//! synchronised with so far (every operation it waited for, and what it acquired). The race
//! detector cannot see host synchronisation between threads (an atomic flag, a mutex), so code
//! that hands work between host threads tells it: `host_release` before publishing, `host_acquire`
//! after observing. Operations the acquiring thread enqueues afterwards are ordered after them.
void host_release(const void* key);
//! The other half of `host_release`: the calling thread acquires what was released through `key`.
void host_acquire(const void* key);

//! After `operations` more NCCL operations of `comm` complete, `comm` reports `error` from
//! `ncclCommGetAsyncError` and its later operations never complete (until it is aborted):
//! an injected asynchronous NCCL failure.
void fail_nccl_after(ncclComm_t comm, int operations, ncclResult_t error);

//! Number of operations enqueued and not finished, on every device.
std::size_t pending_operations();

//! Whether code instrumented for actual-access tracking is linked into this program (a stage
//! built with `loom_cuda_stage(target)` under clang; see `docs/cuda.md`, "Actual accesses").
bool actual_accesses_linked();
//! Device-memory loads and stores of instrumented kernels recorded since the last `configure`.
std::size_t actual_accesses_seen();

}  // namespace loom::cudasim
