# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Compiles quick.cpp (the README's example) as a user would, with the bare command
# `CXX -std=c++20 [CXX_FLAGS] -I include quick.cpp` (no CMake, no extensions), then checks its
# output against the README like readme_check.cmake. Called by ctest with -P.
separate_arguments(flags UNIX_COMMAND "${CXX_FLAGS}")
execute_process(COMMAND ${CXX} -std=c++20 ${flags} -I${INCLUDE} ${SOURCE} -o ${OUT}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${CXX} -std=c++20 ${CXX_FLAGS} failed on ${SOURCE}:\n${err}")
endif()
message(STATUS "compiled by: ${CXX} -std=c++20 ${CXX_FLAGS}")
set(EXE ${OUT})
include(${CMAKE_CURRENT_LIST_DIR}/readme_check.cmake)
