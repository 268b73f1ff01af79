# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# loom_cuda_stage(<target>): compiles <target>'s sources (a user's stage kernels built for loom's
# CUDA simulator) with clang's load/store tracing and links the callbacks
# (loom::cudasim_tracking), so that the simulator's race detector checks the bytes the kernels
# actually load and store, on whatever stream they run, besides the regions loom declares for a
# stage call (docs/cuda.md, "Actual accesses"). Other compilers have no such tracing: the target is
# left as it is (declared regions only), said once at configure time.
function(loom_cuda_stage target)
  if(NOT TARGET loom::cudasim_tracking)
    return()  # an installation without the simulator: nothing to trace for
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE -fsanitize-coverage=trace-pc-guard,trace-loads,trace-stores)
    target_link_libraries(${target} PUBLIC loom::cudasim_tracking)
    target_compile_definitions(${target} PUBLIC LOOM_ACTUAL_ACCESSES=1)
  else()
    get_property(said GLOBAL PROPERTY LOOM_CUDA_STAGE_SAID)
    if(NOT said)
      message(STATUS "loom: ${CMAKE_CXX_COMPILER_ID} has no load/store tracing; targets given to loom_cuda_stage() keep "
                     "the simulator's declared regions only (build with clang to check kernels' actual accesses)")
      set_property(GLOBAL PROPERTY LOOM_CUDA_STAGE_SAID ON)
    endif()
  endif()
endfunction()
