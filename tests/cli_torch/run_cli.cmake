# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Runs the `loom` binary for one CLI test and checks its exit status and output.
#   LOOM            path of the binary
#   PRE             optional command run first ('^'-separated arguments), must exit 0
#   ARGS            the command under test ('^'-separated arguments)
#   EXIT            expected exit status
#   STDOUT          ';'-separated regular expressions stdout must match
#   NOT_STDOUT      a regular expression stdout must not match
#   STDERR          ';'-separated regular expressions stderr must match
#   ONE_LINE_STDERR if set, stderr must be exactly one line
#   COMPARE         optional second command ('^'-separated); both print JSON; then
#   EQUAL           ';'-separated members that must be equal in both JSON objects (a path
#                   into arrays as 'member:index')
#   NOT_WORSE       ';'-separated numeric members (paths as above) where ARGS' value <= COMPARE's
#   (STDOUT, STDERR, EQUAL and NOT_WORSE items are joined by "@@" on the command line.)
cmake_minimum_required(VERSION 3.25)

foreach(list_var STDOUT STDERR EQUAL NOT_WORSE)
  if(DEFINED ${list_var})
    string(REPLACE "@@" ";" ${list_var} "${${list_var}}")
  endif()
endforeach()

function(run_loom argstring out_var err_var rc_var)
  string(REPLACE "^" ";" args "${argstring}")
  execute_process(COMMAND ${LOOM} ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

if(DEFINED PRE AND NOT PRE STREQUAL "")
  run_loom("${PRE}" pre_out pre_err pre_rc)
  if(NOT pre_rc EQUAL 0)
    message(FATAL_ERROR "setup command `loom ${PRE}` exited ${pre_rc}: ${pre_err}")
  endif()
endif()

run_loom("${ARGS}" out err rc)
if(NOT rc STREQUAL "${EXIT}")
  message(FATAL_ERROR "`loom ${ARGS}` exited ${rc}, expected ${EXIT}\nstdout:\n${out}\nstderr:\n${err}")
endif()
foreach(re IN LISTS STDOUT)
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "stdout of `loom ${ARGS}` does not match '${re}':\n${out}")
  endif()
endforeach()
if(DEFINED NOT_STDOUT AND NOT NOT_STDOUT STREQUAL "" AND out MATCHES "${NOT_STDOUT}")
  message(FATAL_ERROR "stdout of `loom ${ARGS}` matches '${NOT_STDOUT}' but must not:\n${out}")
endif()
foreach(re IN LISTS STDERR)
  if(NOT err MATCHES "${re}")
    message(FATAL_ERROR "stderr of `loom ${ARGS}` does not match '${re}':\n${err}")
  endif()
endforeach()
if(ONE_LINE_STDERR)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines n)
  if(NOT n EQUAL 1 OR NOT err MATCHES "\n$")
    message(FATAL_ERROR "stderr of `loom ${ARGS}` is not exactly one line:\n${err}")
  endif()
endif()

if(DEFINED COMPARE AND NOT COMPARE STREQUAL "")
  run_loom("${COMPARE}" ref ref_err ref_rc)
  if(NOT ref_rc EQUAL 0)
    message(FATAL_ERROR "`loom ${COMPARE}` exited ${ref_rc}: ${ref_err}")
  endif()
  foreach(member IN LISTS EQUAL)
    string(REPLACE ":" ";" path "${member}")
    string(JSON a GET "${out}" ${path})
    string(JSON b GET "${ref}" ${path})
    if(NOT a STREQUAL b)
      message(FATAL_ERROR "member '${member}' differs:\n`loom ${ARGS}`: ${a}\n`loom ${COMPARE}`: ${b}")
    endif()
  endforeach()
  foreach(member IN LISTS NOT_WORSE)
    string(REPLACE ":" ";" path "${member}")
    string(JSON a GET "${out}" ${path})
    string(JSON b GET "${ref}" ${path})
    if(a GREATER b)
      message(FATAL_ERROR "member '${member}' is worse: `loom ${ARGS}` gives ${a}, `loom ${COMPARE}` gives ${b}")
    endif()
    message(STATUS "${member}: ${a} (loom ${ARGS}) <= ${b} (loom ${COMPARE})")
  endforeach()
endif()
