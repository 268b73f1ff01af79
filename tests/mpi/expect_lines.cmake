# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Runs COMMAND (a ;-list) with a time limit and passes when its output holds at least COUNT
# lines matching PATTERN (used where the launcher's own exit status is not meaningful, e.g.
# after a rank was made to exit).
separate_arguments(cmd NATIVE_COMMAND "${COMMAND}")
execute_process(COMMAND ${cmd} OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${TIMEOUT} RESULT_VARIABLE rc)
message("${out}")
string(REGEX MATCHALL "${PATTERN}" hits "${out}")
list(LENGTH hits got)
if(got LESS COUNT)
  message(FATAL_ERROR "expected ${COUNT} lines matching '${PATTERN}', got ${got} (exit: ${rc})\n${err}")
endif()
message("found ${got} of ${COUNT} lines matching '${PATTERN}'")
