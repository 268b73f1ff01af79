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

# loom::cuda and loom::nccl: loom's CUDA layer (include/loom/cuda, the device flavour of the
# executor, the cuda_local and nccl communicators) over either the real CUDA runtime and NCCL or
# loom's own strict simulator of them (src/cudasim, include/loom/cudasim). LOOM_CUDA_RUNTIME picks
# what loom::cuda and loom::nccl link: `real`, `sim`, or `auto` (real when a GPU is usable at
# configure time). Both flavours are built whenever the toolkit is found (targets
# loom::cuda_sim / loom::nccl_sim and loom::cuda_real / loom::nccl_real), so one build tests the
# simulator and compiles (and, on a GPU, runs) the real path. The umbrella loom::loom does not
# link them: the simulator defines the CUDA runtime's symbols, so linking it is an explicit choice.
option(LOOM_ENABLE_CUDA "Provide loom::cuda and loom::nccl when the CUDA toolkit is found" ON)
# OFF: only the simulator flavour (host C++ only, any C++20 compiler), no nvcc. The clang presets
# use it: nvcc's host compiler is GCC, and a libc++ build cannot link libstdc++ objects.
option(LOOM_ENABLE_NVCC "Build the real-runtime flavour of loom::cuda (nvcc) when a working nvcc is found" ON)
set(LOOM_CUDA_RUNTIME "auto" CACHE STRING "What loom::cuda links: real, sim or auto")
set_property(CACHE LOOM_CUDA_RUNTIME PROPERTY STRINGS auto real sim)
set(LOOM_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures of loom's own kernels and the CUDA examples")
set(LOOM_WITH_CUDA OFF)
set(LOOM_WITH_NVCC OFF)
if(LOOM_ENABLE_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(LOOM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
    find_library(LOOM_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
    if(LOOM_NCCL_INCLUDE_DIR AND LOOM_NCCL_LIBRARY)
      set(LOOM_WITH_CUDA ON)
    else()
      message(STATUS "loom: CUDA ${CUDAToolkit_VERSION} found but not NCCL (nccl.h, libnccl); loom::cuda is not provided")
    endif()
  else()
    message(STATUS "loom: CUDA toolkit not found; loom::cuda and loom::nccl are not provided")
  endif()
endif()

if(LOOM_WITH_CUDA)
  # The simulator: a small compiled library that implements the CUDA runtime and NCCL entry points.
  add_library(loom_cudasim STATIC
    ${PROJECT_SOURCE_DIR}/src/cudasim/core.cpp ${PROJECT_SOURCE_DIR}/src/cudasim/runtime.cpp
    ${PROJECT_SOURCE_DIR}/src/cudasim/nccl.cpp ${PROJECT_SOURCE_DIR}/src/cudasim/extension.cpp)
  set_target_properties(loom_cudasim PROPERTIES EXPORT_NAME cudasim POSITION_INDEPENDENT_CODE ON)
  target_include_directories(loom_cudasim PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_include_directories(loom_cudasim SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS} ${LOOM_NCCL_INCLUDE_DIR})
  target_compile_features(loom_cudasim PUBLIC cxx_std_20)
  target_link_libraries(loom_cudasim PUBLIC Threads::Threads)
  target_compile_options(loom_cudasim PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra>)
  # Actual-access tracking: the callbacks of clang's load/store tracing, linked only into programs
  # with stages built by loom_cuda_stage(target) (cmake/loom_cuda_stage.cmake).
  add_library(loom_cudasim_tracking STATIC ${PROJECT_SOURCE_DIR}/src/cudasim/tracking.cpp)
  set_target_properties(loom_cudasim_tracking PROPERTIES EXPORT_NAME cudasim_tracking POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(loom_cudasim_tracking PUBLIC loom_cudasim)
  target_compile_options(loom_cudasim_tracking PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra>)
  add_library(loom::cudasim_tracking ALIAS loom_cudasim_tracking)
  include(${PROJECT_SOURCE_DIR}/cmake/loom_cuda_stage.cmake)

  add_library(loom_cuda_sim INTERFACE)
  target_link_libraries(loom_cuda_sim INTERFACE loom_core loom_cudasim)
  target_compile_definitions(loom_cuda_sim INTERFACE LOOM_HAS_CUDA=1 LOOM_CUDA_SIM=1)
  # NVTX 3's header-only implementation calls its injection through a table of function pointers
  # cast to one generic type, which clang's -fsanitize=function (part of -fsanitize=undefined
  # since clang 17) reports as a call through an incompatible function type: NVIDIA's code, not
  # loom's. The sanitizer presets compile the NVTX calls out of the simulator flavour (no profiler
  # runs in the simulator); a GPU build keeps them.
  option(LOOM_SIM_NVTX "Make NVTX calls in the simulator flavour of loom::cuda (off under the sanitizer presets)" ON)
  if(NOT LOOM_SIM_NVTX)
    target_compile_definitions(loom_cuda_sim INTERFACE LOOM_NO_NVTX=1)
  endif()
  add_library(loom_nccl_sim INTERFACE)
  target_link_libraries(loom_nccl_sim INTERFACE loom_cuda_sim)
  target_compile_definitions(loom_nccl_sim INTERFACE LOOM_HAS_NCCL=1)
  add_library(loom::cuda_sim ALIAS loom_cuda_sim)
  add_library(loom::nccl_sim ALIAS loom_nccl_sim)

  # The real runtime: libcudart and libnccl, and loom's own two kernels compiled by nvcc.
  include(CheckLanguage)
  if(LOOM_ENABLE_NVCC)
    check_language(CUDA)
  endif()
  if(LOOM_ENABLE_NVCC AND CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${LOOM_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    set(LOOM_WITH_NVCC ON)
    add_library(loom_cuda_kernels STATIC ${PROJECT_SOURCE_DIR}/src/cuda/kernels.cu)
    set_target_properties(loom_cuda_kernels PROPERTIES EXPORT_NAME cuda_kernels POSITION_INDEPENDENT_CODE ON)
    # CMake 3.25 does not know nvcc 13's C++20 dialect: pass it directly.
    target_compile_options(loom_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
    target_include_directories(loom_cuda_kernels PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(loom_cuda_kernels PUBLIC CUDA::cudart)
    target_include_directories(loom_cuda_kernels SYSTEM PUBLIC ${LOOM_NCCL_INCLUDE_DIR})
    add_library(loom_cuda_real INTERFACE)
    target_link_libraries(loom_cuda_real INTERFACE loom_core CUDA::cudart loom_cuda_kernels)
    target_include_directories(loom_cuda_real SYSTEM INTERFACE ${LOOM_NCCL_INCLUDE_DIR})
    target_compile_definitions(loom_cuda_real INTERFACE LOOM_HAS_CUDA=1)
    add_library(loom_nccl_real INTERFACE)
    target_link_libraries(loom_nccl_real INTERFACE loom_cuda_real ${LOOM_NCCL_LIBRARY})
    target_compile_definitions(loom_nccl_real INTERFACE LOOM_HAS_NCCL=1)
    add_library(loom::cuda_real ALIAS loom_cuda_real)
    add_library(loom::nccl_real ALIAS loom_nccl_real)
  else()
    message(STATUS "loom: no working nvcc; the real-runtime flavour of loom::cuda is not built")
  endif()

  # Is a CUDA device usable here? (cmake/has_gpu.cpp, run once at configure time.)
  set(loom_has_gpu OFF)
  if(LOOM_WITH_NVCC)
    try_run(loom_gpu_run loom_gpu_compiled ${PROJECT_BINARY_DIR}/loom-has-gpu ${PROJECT_SOURCE_DIR}/cmake/has_gpu.cpp
            LINK_LIBRARIES CUDA::cudart RUN_OUTPUT_VARIABLE loom_gpu_out)
    if(loom_gpu_compiled AND loom_gpu_run EQUAL 0)
      set(loom_has_gpu ON)
    endif()
  endif()
  # Which flavour loom::cuda / loom::nccl name.
  set(loom_cuda_choice ${LOOM_CUDA_RUNTIME})
  if(loom_cuda_choice STREQUAL "auto")
    set(loom_cuda_choice sim)
    if(loom_has_gpu)
      set(loom_cuda_choice real)
    endif()
  endif()
  if(loom_cuda_choice STREQUAL "real" AND NOT LOOM_WITH_NVCC)
    message(FATAL_ERROR "loom: LOOM_CUDA_RUNTIME=real needs a working nvcc (CMAKE_CUDA_COMPILER)")
  endif()
  if(NOT loom_cuda_choice MATCHES "^(real|sim)$")
    message(FATAL_ERROR "loom: LOOM_CUDA_RUNTIME must be auto, real or sim (got '${LOOM_CUDA_RUNTIME}')")
  endif()
  # loom's own programs against the real runtime (the `_gpu` twins: cuda_mlp_gpu, mesh_gpu,
  # test_cuda_layer_gpu, p2p_perf_gpu, moe_overlap_gpu) only run on a GPU, so by default (auto)
  # they are built where one is found or LOOM_CUDA_RUNTIME is real; ON builds them anyway (a
  # build machine without a GPU), OFF never. Without them an nvcc build still compiles every
  # header under nvcc (nvcc_all_headers), loom's and the examples' kernels (.cu), and one host
  # program against the real runtime (device_overhead_gpu).
  set(LOOM_GPU_PROGRAMS "auto" CACHE STRING "Build the _gpu twins of loom's programs: auto (where a GPU is found), ON or OFF")
  set_property(CACHE LOOM_GPU_PROGRAMS PROPERTY STRINGS auto ON OFF)
  set(LOOM_BUILD_GPU_PROGRAMS OFF)
  if(LOOM_WITH_NVCC)
    if(LOOM_GPU_PROGRAMS STREQUAL "auto")
      if(loom_has_gpu OR loom_cuda_choice STREQUAL "real")
        set(LOOM_BUILD_GPU_PROGRAMS ON)
      endif()
    elseif(LOOM_GPU_PROGRAMS)
      set(LOOM_BUILD_GPU_PROGRAMS ON)
    endif()
    if(NOT LOOM_BUILD_GPU_PROGRAMS)
      message(STATUS "loom: no CUDA device found (LOOM_GPU_PROGRAMS=${LOOM_GPU_PROGRAMS}); the _gpu programs are not built")
    endif()
  endif()
  set(LOOM_CUDA_RUNTIME_CHOSEN ${loom_cuda_choice})
  add_library(loom::cuda ALIAS loom_cuda_${loom_cuda_choice})
  add_library(loom::nccl ALIAS loom_nccl_${loom_cuda_choice})
  set_target_properties(loom_cuda_${loom_cuda_choice} PROPERTIES EXPORT_NAME cuda)
  set_target_properties(loom_nccl_${loom_cuda_choice} PROPERTIES EXPORT_NAME nccl)
  list(APPEND LOOM_EXPORTED_TARGETS loom_cuda_${loom_cuda_choice} loom_nccl_${loom_cuda_choice})
  if(loom_cuda_choice STREQUAL "sim")
    list(APPEND LOOM_EXPORTED_TARGETS loom_cudasim loom_cudasim_tracking)
  else()
    list(APPEND LOOM_EXPORTED_TARGETS loom_cuda_kernels)
  endif()
  message(STATUS "loom: CUDA ${CUDAToolkit_VERSION} with NCCL; loom::cuda and loom::nccl use the ${loom_cuda_choice} runtime")
endif()
