// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! `mesh_example::launch` for the kernels of `kernels.hpp` over float (and `loom::block_transpose`,
//! the MoE model's layout changes): `loom::cuda::for_each` of
//! the item function object on the stream (a grid-stride kernel under nvcc, a host loop in
//! stream order under loom's simulator). Included once by `device_kernels.cu` (nvcc) and once by
//! `device_kernels_sim.cpp` (host compiler, simulator).

#include <loom/cuda/launch.cuh>

#include <loom/exec/moe_math.hpp>  // loom::block_transpose (the MoE model's layout changes)

#include "kernels.hpp"  // the item functions (device.hpp declares launch; nvcc compiles only these)

namespace mesh_example {

//! Declared in `device.hpp`.
template <class F>
void launch(cudaStream_t stream, std::size_t n, const F& f, const char* label) {
  loom::cuda::for_each(stream, n, f, label);
}

#define MESH_EXAMPLE_LAUNCH(F) template void launch<kernels::F<float>>(cudaStream_t, std::size_t, const kernels::F<float>&, const char*);
MESH_EXAMPLE_LAUNCH(ln_forward_row)
MESH_EXAMPLE_LAUNCH(ln_backward_input_row)
MESH_EXAMPLE_LAUNCH(ln_backward_weight_col)
MESH_EXAMPLE_LAUNCH(loss_row)
MESH_EXAMPLE_LAUNCH(loss_backward_elem)
MESH_EXAMPLE_LAUNCH(embed_elem)
MESH_EXAMPLE_LAUNCH(embed_backward_col)
MESH_EXAMPLE_LAUNCH(position_elem)
MESH_EXAMPLE_LAUNCH(position_backward_col)
MESH_EXAMPLE_LAUNCH(add_elem)
MESH_EXAMPLE_LAUNCH(mul_elem)
MESH_EXAMPLE_LAUNCH(scale_elem)
MESH_EXAMPLE_LAUNCH(tanh_elem)
MESH_EXAMPLE_LAUNCH(tanh_grad_elem)
MESH_EXAMPLE_LAUNCH(qkv_layout_elem)
#undef MESH_EXAMPLE_LAUNCH
template void launch<loom::block_transpose<float>>(cudaStream_t, std::size_t, const loom::block_transpose<float>&, const char*);

}  // namespace mesh_example
