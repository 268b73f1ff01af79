// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the mesh layer: the parallelism dimensions `dp`, `tp`, `pp`, `sp`, the
//! `mesh` that composes them, and `mesh_comm`, which binds a mesh to a communicator and gives
//! each dimension its own counted communicator.

#include "loom/comm/counting.hpp"
#include "loom/mesh/grid_volume.hpp"
#include "loom/mesh/mesh.hpp"
#include "loom/mesh/mesh_comm.hpp"
