// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The memory a rank's pipeline allocates, as a formula: `loom::pipeline_device_bytes` adds, for
//! every virtual stage of the rank, its slots in the buffer plan (`loom/stage/buffer_plan.hpp`)
//! times the stage's sizes, plus the loss terms, the loss seed and the discarded input gradient,
//! which is what the device flavour of `loom::pipeline` allocates at construction (the stages'
//! own parameters and gradients are theirs). `loom::data_parallel::memory()` gives the reducer's
//! part (`loom/exec/data_parallel.hpp`). The simulator's device-memory accounting equals the sum
//! (`tests/cuda_layer/device_memory_test.cpp`); `docs/cuda.md`, "Device memory", states the
//! formulas.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/schedule/lower.hpp"
#include "loom/schedule/schedule.hpp"
#include "loom/stage/buffer_plan.hpp"

namespace loom {

//! The sizes of one virtual stage, in elements.
struct stage_sizes {
  std::size_t input = 0;    //!< `input_size()`
  std::size_t output = 0;   //!< `output_size()`
  std::size_t stash = 0;    //!< `stash_size()`
  std::size_t weights = 0;  //!< `weight_grad().size()`
};

//! The most bytes of loss terms the device flavour keeps until a step's end.
inline constexpr std::size_t device_max_kept_loss_bytes = std::size_t{1} << 20;

//! Loss-term buffers of the device flavour: one per microbatch, unless they would take more than
//! `device_max_kept_loss_bytes`, then one for all.
constexpr std::size_t device_loss_buffers(std::size_t microbatches, std::size_t loss_width, std::size_t element_bytes) {
  return microbatches * loss_width * element_bytes <= device_max_kept_loss_bytes ? microbatches : 1;
}

//! Bytes the device flavour of `loom::pipeline` allocates on `rank` for schedule `s`, elements of
//! `element_bytes`, `sizes_of(stage_id) -> stage_sizes` giving each virtual stage's sizes:
//! - per local virtual stage, `input` slots x input size, `stash` slots x stash size, `grad`
//!   slots x output size, one buffer per activation send (output size) and per gradient send
//!   (input size), and in deterministic mode `wgrad` scratch slots x weights;
//! - on two-direction schedules, the other copy's gradient of each stage held on another rank
//!   (`copy_recv` buffers in deterministic mode, one otherwise) x weights;
//! - the last stage's loss terms (`device_loss_buffers` of the widest last-stage output), the loss
//!   seed (one output) and the first stage's discarded input gradient (one input);
//! - from the first step on, `channel_bytes` per channel into the rank (`incoming_channels`): what
//!   the communicator allocates per channel it opens (`cuda_local::comm::channel_bytes`, its
//!   mailbox of device flags; 0 for `nccl`, whose channels are NCCL communicators whose buffers
//!   are NCCL's).
//! The directed channels the device flavour of `loom::pipeline` opens (collectively, at its first
//! step) for a lowered schedule: one per send of every rank's program (repeats included), and both
//! directions between the two copies of a stage on two-direction schedules.
inline std::vector<channel> device_channels(const schedule& lowered) {
  std::vector<channel> chans;
  for (std::size_t r = 0; r < lowered.programs.size(); ++r)
    for (auto const& a : lowered.programs[r])
      if (a.kind == op::send) chans.push_back({static_cast<int>(r), a.peer});
  if (lowered.directions == 2)
    for (int st = 0; st < lowered.stages; ++st) {
      const int a = lowered.stage_to_rank[static_cast<std::size_t>(st)],
                b = lowered.stage_to_rank[static_cast<std::size_t>(lowered.stages + st)];
      if (a != b) {
        chans.push_back({a, b});
        chans.push_back({b, a});
      }
    }
  return chans;
}

namespace detail {
//! Distinct ranks with a channel into `rank` among `chans`.
inline int channels_into(const std::vector<channel>& chans, int ranks, int rank) {
  std::vector<char> from(static_cast<std::size_t>(ranks), 0);
  for (auto const& c : chans)
    if (c.to == rank && c.from != rank) from[static_cast<std::size_t>(c.from)] = 1;
  int n = 0;
  for (char f : from) n += f;
  return n;
}
}  // namespace detail

//! The channels into `rank` the device flavour opens for schedule `s` (`device_channels` of `s`
//! lowered, counted once per sending rank).
inline int incoming_channels(const schedule& s, int rank) { return detail::channels_into(device_channels(lower(s)), s.ranks, rank); }

template <class Sizes>
std::size_t pipeline_device_bytes(const schedule& s, int rank, Sizes&& sizes_of, bool deterministic, std::size_t element_bytes,
                                  std::size_t channel_bytes = 0) {
  const schedule low = lower(s);
  const auto plan = plan_buffers(low, rank);
  std::size_t elems = 0, out_last = 0, in_first = 0;
  for (auto const& l : plan.local) {
    const stage_sizes z = sizes_of(l.id);
    const auto n = [](int k) { return static_cast<std::size_t>(k); };
    elems += n(l.input) * z.input + n(l.stash) * z.stash + n(l.grad) * z.output + n(l.send_act) * z.output +
             n(l.send_grad) * z.input + (deterministic ? n(l.wgrad) * z.weights : 0);
    const int twin = s.directions == 2 ? s.stage_to_rank[static_cast<std::size_t>((1 - l.id.direction) * s.stages + l.id.stage)] : -1;
    if (twin >= 0 && twin != rank) elems += (deterministic ? n(l.copy_recv) : 1) * z.weights;
    if (l.id.stage == s.stages - 1) out_last = std::max(out_last, z.output);
    if (l.id.stage == 0) in_first = std::max(in_first, z.input);
  }
  const std::size_t loss = device_loss_buffers(static_cast<std::size_t>(s.microbatches), out_last, element_bytes);
  return (elems + (loss + 1) * out_last + in_first) * element_bytes + static_cast<std::size_t>(detail::channels_into(device_channels(low), s.ranks, rank)) * channel_bytes;
}

}  // namespace loom
