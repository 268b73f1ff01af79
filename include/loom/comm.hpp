// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! Umbrella header of the communication layer available to a host compiler with no extra
//! dependency: the `communicator` concept, the `threads` backend, the counting adaptor and the
//! rank-ordered sums. The MPI backend needs `<mpi.h>` and is included on its own as
//! "loom/comm/mpi.hpp" (CMake target loom::mpi).

#include "loom/comm/communicator.hpp"
#include "loom/comm/counting.hpp"
#include "loom/comm/ordered.hpp"
#include "loom/comm/threads.hpp"
