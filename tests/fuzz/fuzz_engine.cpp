// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Fuzz target: generate -> validate -> lower -> validate -> simulate over every registered family,
// any shape (negative, zero, huge), any costs (0, negative, NaN, inf, huge), memory limits and
// placements. Each input must give a valid schedule of the requested ranks and microbatches (a
// family may record its chunks differently: hanayo's W waves are 2W stages per rank) and a
// finite simulation, or loom's own error with a message; never a crash, another exception, a
// hang, an invalid generated schedule or a silently changed shape. Bytes left over describe a
// stage- and link-resolved cost model (loom::cost_model: 1 to 8 pieces, any values), under which
// the family generates again (cost-aware families use it) and the schedule is simulated: again a
// valid schedule and a finite simulation, or loom's own error.
#include <cstddef>
#include <cstdint>

#include <loom/schedule.hpp>

#include "fuzz_bytes.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom_fuzz;
  static const loom::registry& reg = loom::default_registry();
  bytes in(data, size);
  auto const& e = reg.entries()[in.pick(reg.entries().size())];
  loom::shape sh{in.size_like(), in.size_like(), in.size_like()};
  loom::costs k{.f = in.real(), .b = in.real(), .w = in.real(), .c = in.real(), .fb = in.real(), .mem_w_ratio = in.real()};
  loom::generate_options o{.cost = k, .mem_limit = in.real(), .placement = static_cast<loom::placement_kind>(in.byte() % 6)};
  const bool with_options = in.byte() % 2 == 0;

  run_expecting_loom_errors([&] {
    loom::schedule s = with_options ? e.make(sh, o) : e.make(sh);
    // No silent clamp: the schedule has the shape asked for.
    const loom::shape want = e.resolve(sh);
    expect(s.ranks == want.ranks && s.microbatches == want.microbatches, "generated shape differs from the request", e.name);
    expect(static_cast<long long>(s.size()) <= loom::max_actions, "generated schedule exceeds loom::max_actions", e.name);
    auto v = loom::validate(s);
    expect(v.ok, "generated schedule is invalid", v.message);
    auto low = loom::lower(s);
    expect(static_cast<long long>(low.size()) <= loom::max_actions, "lowered schedule exceeds loom::max_actions", e.name);
    auto lv = loom::validate(low);
    expect(lv.ok, "lowered schedule is invalid", lv.message);
    auto sim = loom::simulate(s, k);
    expect(sim.ok, "a valid schedule does not simulate", sim.error);
    expect(loom::detail::finite(sim.makespan) && sim.makespan >= 0, "makespan is not a finite number >= 0", e.name);
    expect(sim.bubble_ratio >= -1e-9 && sim.bubble_ratio <= 1 + 1e-9, "bubble ratio outside [0, 1]", e.name);
    auto lsim = loom::simulate(low, k);
    const double diff = lsim.makespan - sim.makespan;
    expect(lsim.ok && diff <= 1e-9 * (1 + sim.makespan) && -diff <= 1e-9 * (1 + sim.makespan),
           "lowered schedule simulates to another makespan", e.name);
  });

  if (in.byte() == 0) return 0;  // no model described (inputs written before the model keep their meaning)
  loom::cost_model m;
  const int pieces = 1 + in.byte() % 8;
  for (int i = 0; i < pieces; ++i)
    m.stages.push_back({.f = in.real(), .b = in.real(), .w = in.real(), .fb = in.real(), .activation = in.real(),
                        .message_bytes = in.real(), .param_bytes = in.real()});
  m.intra = {.alpha = in.real(), .beta = in.real()};
  m.inter = {.alpha = in.real(), .beta = in.real()};
  m.ranks_per_node = in.size_like();
  m.mem_w_ratio = in.real();
  run_expecting_loom_errors([&] {
    loom::generate_options om = o;
    om.model = m;
    loom::schedule s = e.make(sh, om);
    auto v = loom::validate(s);
    expect(v.ok, "schedule generated under a cost model is invalid", v.message);
    auto sim = loom::simulate(s, m);
    expect(sim.ok, "a valid schedule does not simulate under a cost model", sim.error);
    expect(loom::detail::finite(sim.makespan) && sim.makespan >= 0, "makespan under a cost model is not a finite number >= 0", e.name);
    expect(sim.bubble_ratio >= -1e-9 && sim.bubble_ratio <= 1 + 1e-9, "bubble ratio under a cost model outside [0, 1]", e.name);
  });
  return 0;
}
