// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once

//! \file
//! What every fuzz target checks: an input gives a result or loom's own exception with a message
//! (`schedule_error` / `config_error`); anything else (another exception, an empty message, a
//! broken invariant) aborts, which libFuzzer reports as a crash with the input saved.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include <loom/schedule.hpp>

namespace loom_fuzz {

//! Stops the run with `why` (and the detail) on stderr: libFuzzer keeps the input as a crash.
[[noreturn]] inline void fail(std::string_view why, std::string_view detail = {}) {
  std::fprintf(stderr, "loom fuzz: %.*s%s%.*s\n", static_cast<int>(why.size()), why.data(), detail.empty() ? "" : ": ",
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

//! Fails unless `cond`.
inline void expect(bool cond, std::string_view why, std::string_view detail = {}) {
  if (!cond) fail(why, detail);
}

//! Runs `body`; loom's own errors must carry a message, every other exception fails the run.
template <class Body>
void run_expecting_loom_errors(Body&& body) {
  try {
    body();
  } catch (const loom::schedule_error& e) {
    expect(*e.what() != '\0', "schedule_error without a message");
  } catch (const loom::config_error& e) {
    expect(*e.what() != '\0', "config_error without a message");
  } catch (const std::exception& e) {
    fail("unexpected exception (not loom's own)", e.what());
  } catch (...) {
    fail("unexpected exception of unknown type");
  }
}

}  // namespace loom_fuzz
