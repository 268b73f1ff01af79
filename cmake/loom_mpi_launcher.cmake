# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# loom_mpi_launcher(<launcher-var> <env-var>): the mpiexec command (a list) for multi-process tests
# and the environment they run in (every multi-process test of tests/ and examples/ uses it). Open MPI refuses to run as root and to place more processes
# than cores unless told; tests run as root in containers on 2 cores. Its launcher's options
# differ from MPICH's, so they are added only for it.
function(loom_mpi_launcher launcher_var env_var)
  set(launcher ${MPIEXEC_EXECUTABLE} ${MPIEXEC_PREFLAGS})
  set(env)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE version ERROR_QUIET)
  if(version MATCHES "Open MPI|OpenRTE")
    list(APPEND launcher --oversubscribe --allow-run-as-root)
    set(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1)
  endif()
  # Open MPI does not free its own allocations at MPI_Finalize (many from components it loads and
  # unloads, so LeakSanitizer's stacks cannot even name them): the sanitizer presets check
  # multi-process tests for every error but leaks.
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*address")
    list(APPEND env "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0")
  endif()
  set(${launcher_var} ${launcher} PARENT_SCOPE)
  set(${env_var} ${env} PARENT_SCOPE)
endfunction()
