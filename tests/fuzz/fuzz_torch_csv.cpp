// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the PyTorch pipelining CSV reader (loom/render/torch_csv.hpp). The first byte picks
// the spelling, the rest is the file. A file gives a schedule or one `schedule_error` line; an
// imported schedule is then validated, lowered when valid, simulated and written back, and a
// valid one must read back to the same programs.
#include <cstddef>
#include <cstdint>

#include <loom/render/torch_csv.hpp>
#include <loom/schedule.hpp>

#include "fuzz_bytes.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom_fuzz;
  bytes in(data, size);
  const auto spelling = static_cast<loom::torch_spelling>(in.byte() % 3);
  const std::string_view csv = in.rest();
  run_expecting_loom_errors([&] {
    loom::torch_csv_import imp;
    try {
      imp = loom::import_torch_csv(csv, {.spelling = spelling, .name = "fuzz"});
    } catch (const loom::schedule_error& e) {
      std::string_view what = e.what();
      expect(!what.empty() && what.find('\n') == std::string_view::npos, "torch csv error is not one line", what);
      return;
    }
    const loom::schedule& s = imp.sched;
    auto v = loom::validate(s);
    auto sim = loom::simulate(s);
    expect(sim.ok || !v.ok, "a valid imported schedule does not simulate", sim.error);
    if (!v.ok) return;
    bool lowered = false;
    for (auto const& p : s.programs)
      for (auto const& a : p) lowered = lowered || !loom::is_compute(a.kind);
    if (!lowered) expect(loom::validate(loom::lower(s)).ok, "lowering a valid import breaks it", s.name);
    // Written back in the spelling it was read in, it reads back to the same programs.
    const loom::text out = loom::write_torch_csv(s, {.spelling = imp.spelling});
    auto again = loom::import_torch_csv(out, {.spelling = imp.spelling, .name = "fuzz"});
    expect(again.sched.programs == s.programs, "write then read changes the programs", out);
  });
  return 0;
}
