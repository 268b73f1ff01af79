// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The compile-time workflow: define a schedule family of your own, check its validity, bubble
// and memory with static_assert, pick the best of several families for given costs and a memory
// cap during compilation, then render the winner and its rivals.
#include <cstdio>
#include <string_view>
#include <tuple>

#include <loom/render.hpp>
#include <loom/schedule.hpp>

// A user family: "eager 1F1B" warms every rank up with `Cap` forwards (1F1B uses p-1-r), trading
// activation memory for an earlier steady state on the first ranks. Any m >= 1; Cap >= p-1.
template <int Cap>
struct eager_1f1b {
  static constexpr std::string_view name = "eager-1f1b";
  static constexpr std::string_view summary = "1F1B with a fixed warm-up of Cap forwards on every rank";
  constexpr loom::text check(loom::shape s) const {
    if (auto rule = loom::detail::check_basic(name, s, 1); !rule.empty()) return rule;
    if (Cap < s.ranks - 1) return "eager-1f1b needs Cap >= ranks-1 (got Cap=" + loom::detail::to_text(Cap) + ")";
    return {};
  }
  constexpr loom::schedule generate(loom::shape s) const {
    auto out = loom::make_schedule(name, s, s.ranks, loom::placement_kind::loop);
    for (int r = 0; r < s.ranks; ++r) {
      auto& p = out.programs[static_cast<std::size_t>(r)];
      int nf = 0;
      for (; nf < Cap && nf < s.microbatches; ++nf) p.push_back(loom::forward(nf, r));
      for (int i = 0; i < s.microbatches; ++i) {
        if (nf < s.microbatches) p.push_back(loom::forward(nf++, r));
        p.push_back(loom::backward(i, r));
      }
    }
    return out;
  }
};
static_assert(loom::schedule_family<eager_1f1b<4>>);

constexpr loom::shape shape{.ranks = 4, .microbatches = 8};
constexpr loom::costs cost{.f = 1, .b = 2, .w = 1};  // backward = B + W = twice the forward

// Validity (including deadlock-freedom after lowering), bubble and memory, all at compile time.
constexpr auto eager = loom::summarize(eager_1f1b<4>{}, shape, cost);
static_assert(eager.valid);
static_assert(eager.peak_activation == 5);  // Cap + 1 activations live on rank 0
// Eager warm-up is not free: the last rank's extra forwards delay every backward behind it, so
// the bubble is far larger than 1F1B's.
static_assert(eager.bubble_time > 2 * loom::summarize(loom::one_f_one_b{}, shape, cost).bubble_time);
// A shape the family cannot run would not compile:
//   loom::static_schedule<eager_1f1b<1>, shape> s;   // error: ... "eager-1f1b needs Cap >= ranks-1 (got Cap=1)"

// Pick the family with the lowest bubble rate whose peak activation fits a memory cap.
template <class... F>
constexpr std::string_view best_under(double mem_cap) {
  std::string_view best = "none";
  double best_rate = 2;
  auto consider = [&](auto family) {
    auto m = loom::summarize(family, shape, cost);
    if (m.valid && m.peak_activation <= mem_cap && m.bubble_rate < best_rate) {
      best_rate = m.bubble_rate;
      best = decltype(family)::name;
    }
  };
  (consider(F{}), ...);
  return best;
}
using candidates = std::tuple<loom::gpipe, loom::one_f_one_b, eager_1f1b<4>, loom::zb_h1, loom::zb_h2>;
constexpr auto best_at = [](double cap) {
  return [cap]<class... F>(std::tuple<F...>*) { return best_under<F...>(cap); }(static_cast<candidates*>(nullptr));
};
static_assert(best_at(4) == "zb-h1");   // within 1F1B's memory, ZB-H1 wins
static_assert(best_at(7) == "zb-h2");   // with 2p-1 activations, ZB-H2 wins
static_assert(best_at(3) == "none");    // nothing runs 4 ranks in 3 activations

// The winner's rank-0 program, as a compile-time array the executor can specialise on.
using winner = loom::static_schedule<loom::zb_h2, shape>;
static_assert(winner::program<0>.size() == 3 * shape.microbatches);

int main() {
  std::printf("best family for %d ranks x %d microbatches, f=%g b=%g w=%g: cap 4 -> %s, cap 7 -> %s\n\n", shape.ranks,
              shape.microbatches, cost.f, cost.b, cost.w, best_at(4).data(), best_at(7).data());
  auto show = [](auto family) {
    auto s = loom::generate(family, shape);
    auto sim = loom::simulate(s, cost);
    std::printf("%s\npeak activation per rank:", loom::render_ascii(s, sim, {.legend = false}).c_str());
    for (double p : sim.peak_activation) std::printf(" %g", p);
    std::printf("\n\n");
  };
  show(loom::one_f_one_b{});
  show(eager_1f1b<4>{});
  show(loom::zb_h1{});
  show(loom::zb_h2{});
}
