// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! The definitions of `cuda_mlp::stage`: each layer's work is a few `loom::cuda::for_each`
//! launches of the `math.hpp` functors on the stage's stream (kernels on a GPU, host loops under
//! loom's simulator). On a GPU the loss terms are a `thrust::transform` on the stream
//! (`thrust::cuda::par_nosync.on(stream)`: no synchronisation) and, with block reductions, the
//! bias gradient is a CUB `BlockReduce` over the samples. Included once by `stage.cu` (nvcc) and
//! once by `stage_sim.cpp` (host compiler, simulator).

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <loom/cuda/annotate.hpp>
#include <loom/cuda/error.hpp>
#include <loom/cuda/launch.cuh>

#if defined(__CUDACC__)
#include <cub/block/block_reduce.cuh>
#endif

#include "math.hpp"
#include "stage.hpp"

namespace cuda_mlp {

#if defined(__CUDACC__)
namespace detail {
//! One block per output o: gb[o] += sum over samples of dz[k, o] (CUB block reduction).
template <int Threads>
__global__ void bias_grad_block(const float* dz, float* gb, unsigned out, unsigned samples) {
  using reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename reduce::TempStorage tmp;
  const unsigned o = blockIdx.x;
  float v = 0.0f;
  for (unsigned k = threadIdx.x; k < samples; k += Threads) v += dz[k * out + o];
  const float sum = reduce(tmp).Sum(v);
  if (threadIdx.x == 0) gb[o] += sum;
}
}  // namespace detail
#endif

stage::stage(const quickstart::mlp_spec& m, int first, int last, bool is_last, const float* targets, bool block_reductions)
    : m_(&m), first_(first), last_(last), is_last_(is_last), targets_(targets), block_reductions_(block_reductions) {
  if (first < 0 || last > m.layers() || first >= last)
    throw std::invalid_argument("cuda_mlp::stage: a stage needs at least one layer of the model (layers " + std::to_string(first) +
                                ".." + std::to_string(last) + " of " + std::to_string(m.layers()) + ")");
  std::vector<float> host;
  std::size_t act = 0;
  for (int l = first; l < last; ++l) {
    offsets_.push_back(host.size());
    auto p = float_params(m, l);
    host.insert(host.end(), p.begin(), p.end());
    act_offsets_.push_back(act);
    act += static_cast<std::size_t>(m.samples) * m.width(l + 1);
  }
  act_total_ = act;
  params_ = loom::cuda::device_buffer<float>(host.size());
  grad_ = loom::cuda::device_buffer<float>(host.size());
  loom::cuda::copy_to_device(params_.span(), std::span<const float>(host));
  LOOM_CUDA_TRY(cudaMemset(grad_.data(), 0, grad_.bytes()));
}

std::size_t stage::input_size() const { return static_cast<std::size_t>(m_->samples) * m_->width(first_); }
std::size_t stage::output_size() const { return static_cast<std::size_t>(m_->samples) * m_->width(last_); }
std::size_t stage::stash_size() const { return 2 * act_total_; }
std::size_t stage::final_size() const { return static_cast<std::size_t>(m_->samples) * m_->width(m_->layers()); }

void stage::forward(const loom::stage_context& c, loom::forward_buffers<float> b) {
  if (c.microbatch == fail_on) throw std::runtime_error("injected failure");
  if (hang_ms > 0 && c.microbatch == 0) std::this_thread::sleep_for(std::chrono::milliseconds(hang_ms));
  cudaStream_t s = c.stream;
  last_stream_ = s;
  const auto n = static_cast<unsigned>(m_->samples);
  const float* x = b.input.data();
  cudaStream_t k = s;  // where the layers run
  if (side_stream != 0) {
    side& sd = side_state();
    if (side_stream == 1) {  // after the compute stream's work so far (the input is there)
      sd.in.record(loom::cuda::stream_ref(s));
      LOOM_CUDA_TRY(cudaStreamWaitEvent(sd.s.get(), sd.in.get(), 0));
    }
    k = sd.s.get();
  }
  for (int l = first_; l < last_; ++l) {
    float* y = b.stash.data() + act_offsets_[idx(l)];
    const auto in = static_cast<unsigned>(m_->width(l)), out = static_cast<unsigned>(m_->width(l + 1));
    loom::cuda::for_each(k, std::size_t{n} * out,
                         layer_forward{params_.data() + offsets_[idx(l)], x, y, in, out, l + 1 < m_->layers()}, "layer forward");
    x = y;
  }
  if (side_stream == 1) {  // the compute stream continues after the layers
    side& sd = side_state();
    sd.out.record(loom::cuda::stream_ref(k));
    LOOM_CUDA_TRY(cudaStreamWaitEvent(s, sd.out.get(), 0));
  }
  if (is_last_) {
    const float* t = targets_ + static_cast<std::size_t>(c.microbatch) * final_size();
    float* terms = b.output.data();
    const std::size_t fin = final_size();
#if defined(__CUDACC__)
    thrust::transform(thrust::cuda::par_nosync.on(s), x, x + fin, t, terms, loss_term{});
    LOOM_CUDA_TRY(cudaGetLastError());
#else
    loom::cuda::for_each(s, 1, [=](std::size_t) { thrust::transform(thrust::cpp::par, x, x + fin, t, terms, loss_term{}); }, "loss terms");
#endif
  } else {
    LOOM_CUDA_TRY(cudaMemcpyAsync(b.output.data(), x, output_size() * sizeof(float), cudaMemcpyDeviceToDevice, s));
  }
  if (write_past_output) loom::cuda::for_each(s, 1, poke{b.output.data() + b.output.size()}, "write past output");
  if (write_freed) {
    void* gone = nullptr;
    LOOM_CUDA_TRY(cudaMalloc(&gone, sizeof(float)));
    LOOM_CUDA_TRY(cudaFree(gone));
    loom::cuda::for_each(s, 1, poke{static_cast<float*>(gone)}, "write freed");
  }
  if (sync_in_forward) LOOM_CUDA_TRY(cudaStreamSynchronize(s));
}

stage::side& stage::side_state() {
  if (!side_) {
    side_ = std::make_shared<side>(side{loom::cuda::stream(), loom::cuda::event(), loom::cuda::event()});
    loom::cuda::name_stream(side_->s.get(), "side stream of layers " + std::to_string(first_) + ".." + std::to_string(last_));
  }
  return *side_;
}

void stage::backward_input(const loom::stage_context& c, loom::backward_buffers<float> b) {
  cudaStream_t s = c.stream;
  last_stream_ = s;
  const auto n = static_cast<unsigned>(m_->samples);
  float* dz_base = b.stash.data() + act_total_;
  float* g = dz_base + act_offsets_[idx(last_ - 1)];
  if (is_last_) {
    const float* y = b.stash.data() + act_offsets_[idx(last_ - 1)];
    const float* t = targets_ + static_cast<std::size_t>(c.microbatch) * final_size();
    loom::cuda::for_each(s, final_size(), loss_grad{b.output_grad.data(), y, t, g}, "loss gradient");
  } else {
    LOOM_CUDA_TRY(cudaMemcpyAsync(g, b.output_grad.data(), output_size() * sizeof(float), cudaMemcpyDeviceToDevice, s));
  }
  for (int l = last_ - 1; l >= first_; --l) {
    const float* y = b.stash.data() + act_offsets_[idx(l)];
    float* dz = dz_base + act_offsets_[idx(l)];
    const auto in = static_cast<unsigned>(m_->width(l)), out = static_cast<unsigned>(m_->width(l + 1));
    if (l + 1 < m_->layers()) loom::cuda::for_each(s, std::size_t{n} * out, activation_backward{y, dz}, "activation backward");
    float* gx = l > first_ ? dz_base + act_offsets_[idx(l - 1)] : b.input_grad.data();
    loom::cuda::for_each(s, std::size_t{n} * in, input_grad{params_.data() + offsets_[idx(l)], dz, gx, in, out}, "input gradient");
  }
}

void stage::backward_weight(const loom::stage_context& c, loom::weight_buffers<float> b) {
  cudaStream_t s = c.stream;
  last_stream_ = s;
  const auto n = static_cast<unsigned>(m_->samples);
  const float* dz_base = b.stash.data() + act_total_;
  for (int l = first_; l < last_; ++l) {
    const float* x = l == first_ ? b.input.data() : b.stash.data() + act_offsets_[idx(l - 1)];
    const auto in = static_cast<unsigned>(m_->width(l)), out = static_cast<unsigned>(m_->width(l + 1));
    float* g = b.weight_grad.data() + offsets_[idx(l)];
    const float* dz = dz_base + act_offsets_[idx(l)];
#if defined(__CUDACC__)
    if (block_reductions_) {
      loom::cuda::for_each(s, std::size_t{out} * in, weight_grad_add{x, dz, g, in, out, n}, "weight gradient");
      detail::bias_grad_block<128><<<out, 128, 0, s>>>(dz, g + std::size_t{out} * in, out, n);
      LOOM_CUDA_TRY(cudaGetLastError());
      continue;
    }
#endif
    loom::cuda::for_each(s, std::size_t{out} * in + out, weight_grad_add{x, dz, g, in, out, n}, "weight gradient");
  }
}

void stage::backward(const loom::stage_context& c, loom::backward_buffers<float> b) {
  backward_input(c, b);
  backward_weight(c, {b.input, b.stash, b.weight_grad});
}

void stage::update() {
  if (last_stream_ == nullptr) return;
  cudaStream_t u = update_unordered ? side_state().s.get() : last_stream_;
  loom::cuda::for_each(u, params_.size(), sgd{params_.data(), grad_.data(), static_cast<float>(m_->lr)}, "sgd");
}

void stage::update(const loom::update_context& u) {
  last_stream_ = u.stream;
  update();
}

void stage::release_params() {
  float* p = params_.release();
  if (p == nullptr) return;
  if (last_stream_ != nullptr) LOOM_CUDA_TRY(cudaFreeAsync(p, last_stream_));
  else LOOM_CUDA_TRY(cudaFree(p));
}

void stage::acquire_params() {
  if (params_.size() == 0) params_ = loom::cuda::device_buffer<float>(grad_.size());
}

std::vector<float> stage::layer_params(int l) const {
  if (last_stream_ != nullptr) LOOM_CUDA_TRY(cudaStreamSynchronize(last_stream_));
  std::vector<float> out(m_->params(l));
  LOOM_CUDA_TRY(cudaMemcpy(out.data(), params_.data() + offsets_[idx(l)], out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace cuda_mlp
