# SPDX-FileCopyrightText: 2026 loom authors
# SPDX-License-Identifier: Apache-2.0
# Runs EXE and checks that every markdown table row it prints (a line starting with "|") appears
# verbatim in DOC (with ROWS, a regular expression: only the rows that match it), and with LINES
# (a regular expression) every other line that matches it too. Reports every missing line, then
# fails.
execute_process(COMMAND ${EXE} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} exited with ${rc}")
endif()
file(READ ${DOC} doc)
# Semicolons would split lines into list items, and square brackets would merge them: hide them
# while splitting.
string(REPLACE ";" "<loom-semicolon>" out "${out}")
string(REPLACE "[" "<loom-open>" out "${out}")
string(REPLACE "]" "<loom-close>" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
set(rows 0)
set(missing 0)
foreach(line IN LISTS lines)
  string(REPLACE "<loom-semicolon>" ";" line "${line}")
  string(REPLACE "<loom-open>" "[" line "${line}")
  string(REPLACE "<loom-close>" "]" line "${line}")
  if(line MATCHES "^\\|")
    if(DEFINED ROWS AND NOT line MATCHES "${ROWS}")
      continue()
    endif()
  elseif(NOT DEFINED LINES OR NOT line MATCHES "${LINES}")
    continue()
  endif()
  math(EXPR rows "${rows} + 1")
  string(FIND "${doc}" "${line}" at)
  if(at EQUAL -1)
    math(EXPR missing "${missing} + 1")
    message("not in ${DOC}: ${line}")
  endif()
endforeach()
if(rows EQUAL 0)
  message(FATAL_ERROR "${EXE} printed no table rows")
endif()
if(missing GREATER 0)
  message(FATAL_ERROR "${missing} of ${rows} table rows and checked lines are not in ${DOC}; regenerate them (commands in the document)")
endif()
message(STATUS "all ${rows} table rows and checked lines are in ${DOC}")
