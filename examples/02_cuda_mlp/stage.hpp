// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `cuda_mlp::stage`: layers [first, last) of the quickstart's MLP in fp32 as one pipeline stage
//! (a `loom::split_stage`) whose work is CUDA kernels enqueued on the stream loom hands it
//! (`stage_context::stream`). The kernels' per-element math is `math.hpp`; they are defined in
//! `stage_impl.cuh`, compiled by nvcc for a GPU (`stage.cu`) and by the host compiler against
//! loom's CUDA simulator (`stage_sim.cpp`), where the simulator runs them on the host in stream
//! order. This header needs only the CUDA runtime's declarations.
//!
//! Buffers: input (samples x in features), output (samples x out features; on the model's last
//! layer the per-element loss terms 0.5 (y - t)^2, which loom sums in order into the loss),
//! stash (the layers' outputs, then their dz), weight gradient (every layer's W then b).

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include <loom/cuda/buffer.hpp>
#include <loom/cuda/stream.hpp>
#include <loom/stage/stage.hpp>

#include "../01_quickstart/mlp.hpp"

namespace cuda_mlp {

//! Initial fp32 parameters of layer `l` (the quickstart's, rounded to float).
inline std::vector<float> float_params(const quickstart::mlp_spec& m, int l) {
  auto d = quickstart::initial_params(m, l);
  return {d.begin(), d.end()};
}

//! The batch of step `step` in fp32 (the quickstart's values, rounded to float).
struct batch {
  std::vector<float> inputs, targets;
};
inline batch float_batch(const quickstart::mlp_spec& m, int microbatches, int step) {
  auto d = quickstart::make_batch(m, microbatches, step);
  return {{d.inputs.begin(), d.inputs.end()}, {d.targets.begin(), d.targets.end()}};
}

//! Layers [first, last) of `m` on the device (see the file comment). Its parameters live on the
//! device that is current when it is built. `targets` (device memory, every microbatch's targets)
//! is read by the stage holding the model's last layer.
class stage {
 public:
  using value_type = float;  //!< fp32 throughout

  //! The stage; `block_reductions` sums the bias gradient over samples with a CUB block reduction
  //! on a GPU (a different summation order: for the default mode, not the deterministic one).
  stage(const quickstart::mlp_spec& m, int first, int last, bool is_last, const float* targets, bool block_reductions = false);

  std::size_t input_size() const;   //!< samples x first layer's inputs
  std::size_t output_size() const;  //!< samples x last layer's outputs
  std::size_t stash_size() const;   //!< 2 x the layers' outputs
  std::span<float> weight_grad() { return grad_.span(); }  //!< the accumulator (device memory)
  std::span<float> params() { return params_.span(); }     //!< the parameters (device memory), laid out as weight_grad()

  void forward(const loom::stage_context& c, loom::forward_buffers<float> b);            //!< enqueues the forward
  void backward_input(const loom::stage_context& c, loom::backward_buffers<float> b);    //!< enqueues B
  void backward_weight(const loom::stage_context& c, loom::weight_buffers<float> b);     //!< enqueues W
  void backward(const loom::stage_context& c, loom::backward_buffers<float> b);          //!< enqueues B then W
  void update();  //!< SGD on the stream of the last call (after every rank agreed)
  //! Asynchronous schedules (`loom::versioned_stage`): the same SGD on the update's stream.
  void update(const loom::update_context& u);
  //! The parameters every call reads (device memory; loom loads a version into them).
  std::span<float> weights() { return params_.span(); }
  //! Gives up the parameters' device memory (ZeRO-3, `loom::releasable_stage`), freed in the
  //! order of the stream of the last call: `params()` is empty until `acquire_params()`.
  void release_params();
  //! Device memory for the parameters again (contents unspecified: the reducer fills them).
  void acquire_params();

  //! Parameters of model layer `l` (synchronous copy to the host).
  std::vector<float> layer_params(int l) const;
  int first_layer() const { return first_; }  //!< first model layer
  int last_layer() const { return last_; }    //!< one past the last model layer

  int fail_on = -1;            //!< forward throws for this microbatch (fault tests)
  bool sync_in_forward = false;  //!< forward synchronises its stream (capture-rule fault test)
  int hang_ms = 0;             //!< forward of microbatch 0 blocks the host this long (hang test)
  // Tests of the race detector's actual-access tracking (simulator, loom_cuda_stage under clang):
  int side_stream = 0;             //!< forward runs its layers on a stream of its own: 1 ordered by events, 2 without waits (broken)
  bool write_past_output = false;  //!< forward also writes one element past its output slot (broken)
  bool update_unordered = false;   //!< update() runs on a stream of its own without waiting for the compute stream (broken)
  bool write_freed = false;        //!< forward also writes to device memory it has just freed (broken)

 private:
  std::size_t idx(int l) const { return static_cast<std::size_t>(l - first_); }
  std::size_t final_size() const;
  const quickstart::mlp_spec* m_;
  int first_, last_;
  bool is_last_;
  const float* targets_;
  [[maybe_unused]] bool block_reductions_;  // read by the GPU build only (CUB block reductions)
  std::vector<std::size_t> offsets_, act_offsets_;
  std::size_t act_total_ = 0;
  loom::cuda::device_buffer<float> params_, grad_;
  cudaStream_t last_stream_ = nullptr;
  struct side {  // side_stream / update_unordered: the stage's own stream and its two events
    loom::cuda::stream s;
    loom::cuda::event in, out;
  };
  std::shared_ptr<side> side_;
  side& side_state();
};

static_assert(loom::split_stage<stage>);
static_assert(loom::updatable_stage<stage>);
static_assert(loom::versioned_stage<stage>);

}  // namespace cuda_mlp
