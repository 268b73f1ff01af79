# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Runs EXE (a list: the program and its arguments) and checks that its output is FILE, byte for
# byte. For generated figures (docs/img/*.svg) that must be the current program's output.
execute_process(COMMAND ${EXE} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} exited with ${rc}")
endif()
file(READ ${FILE} want)
if(NOT out STREQUAL want)
  string(LENGTH "${out}" got_n)
  string(LENGTH "${want}" want_n)
  message(FATAL_ERROR "${FILE} (${want_n} bytes) is not the output of ${EXE} (${got_n} bytes); regenerate it (command in its "
                      "program's comment)")
endif()
message(STATUS "${FILE} is the current output")
