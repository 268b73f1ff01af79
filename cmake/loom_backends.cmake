# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Optional backends, included by the top-level CMakeLists.txt. Each one found adds its target
# to LOOM_EXPORTED_TARGETS and links it into the umbrella loom::loom.

# loom::mpi: the MPI communicator (include/loom/comm/mpi.hpp).
set(LOOM_WITH_MPI OFF)
if(LOOM_ENABLE_MPI)
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    add_library(loom_mpi INTERFACE)
    add_library(loom::mpi ALIAS loom_mpi)
    set_target_properties(loom_mpi PROPERTIES EXPORT_NAME mpi)
    target_link_libraries(loom_mpi INTERFACE loom_core MPI::MPI_CXX)
    # The deprecated MPI C++ bindings are never used; skipping them keeps -Wpedantic quiet.
    target_compile_definitions(loom_mpi INTERFACE LOOM_HAS_MPI=1 OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
    target_link_libraries(loom_loom INTERFACE loom_mpi)
    list(APPEND LOOM_EXPORTED_TARGETS loom_mpi)
    set(LOOM_WITH_MPI ON)
    message(STATUS "loom: MPI ${MPI_CXX_VERSION} found; providing loom::mpi")
  else()
    message(STATUS "loom: MPI not found; loom::mpi is not provided")
  endif()
endif()
