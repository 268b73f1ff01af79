// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// When a test case ends: "SKIPPED: <reason>" (ctest's skip expression for the gpu tests) only if
// it skipped device parts and ran none; "not run here: <reason>" if it ran some, so that a run
// that exercised cuda_local is passed or failed on its merits, not reported skipped.
#include <doctest/doctest.h>

#include <iostream>
#include <set>
#include <string>

#include "device_support.hpp"

namespace {

struct device_skips : doctest::IReporter {
  explicit device_skips(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { loom_device_test::parts() = {}; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {
    auto const& p = loom_device_test::parts();
    std::set<std::string> said;
    for (auto const& why : p.missing)
      if (said.insert(why).second) std::cout << (p.ran == 0 ? "SKIPPED: " : "not run here: ") << why << "\n";
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("device_skips", 1, device_skips);

}  // namespace
