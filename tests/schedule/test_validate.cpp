// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// The validator rejects each broken rule with a message naming the rank, the position, the
// action and the rule, followed by the offending part of the grid.
#include <doctest/doctest.h>

#include <loom/schedule.hpp>

#include <algorithm>
#include <string>
#include <utility>

namespace {

loom::schedule base() { return loom::generate(loom::one_f_one_b{}, {.ranks = 3, .microbatches = 4}); }

std::string message_of(const loom::schedule& s) {
  auto v = loom::validate(s);
  REQUIRE_FALSE(v.ok);
  return v.message;
}

}  // namespace

TEST_CASE("a duplicated action is reported with both places") {
  auto s = base();
  s.programs[1].push_back(loom::backward(2, 1));
  auto m = message_of(s);
  CHECK(m.find("rank 1, position 8, action BW2@s1: duplicates BW of microbatch 2 stage 1, already at rank 1 position") != std::string::npos);
  CHECK(m.find("[BW2@s1]") != std::string::npos);  // the grid marks the action
}

TEST_CASE("an action on the wrong rank breaks the placement") {
  auto s = base();
  s.programs[0][0] = loom::forward(0, 2);
  CHECK(message_of(s).find("rank 0, position 0, action F0@s2: stage 2 of microbatch 0 is placed on rank 2, not here") != std::string::npos);
}

TEST_CASE("a missing backward or a missing W is reported") {
  auto s = base();
  s.programs[2].pop_back();  // last BW of rank 2
  CHECK(message_of(s).find("microbatch 3 stage 2 (rank 2) has no backward (B+W or BW)") != std::string::npos);
  auto z = loom::generate(loom::zb_h1{}, {.ranks = 2, .microbatches = 2});
  auto& p = z.programs[0];
  p.erase(std::find(p.begin(), p.end(), loom::backward_weight(1, 0)));
  CHECK(message_of(z).find("microbatch 1 stage 0 (rank 0) has a B but no W") != std::string::npos);
}

TEST_CASE("a backward before its forward on the same rank deadlocks and names the stuck actions") {
  auto s = base();
  std::swap(s.programs[2][0], s.programs[2][1]);  // BW0@s2 before F0@s2 on the last rank
  auto m = message_of(s);
  CHECK(m.find("deadlock:") != std::string::npos);
  CHECK(m.find("rank 2 is stuck at position 0 on BW0@s2, waiting for F0@s2 (rank 2)") != std::string::npos);
}

TEST_CASE("a cyclic wait across ranks is a deadlock") {
  // Rank 0 runs its first backward before the forward that feeds the last stage has run.
  auto s = loom::generate(loom::gpipe{}, {.ranks = 2, .microbatches = 2});
  s.programs[1] = {loom::backward(0, 1), loom::forward(0, 1), loom::forward(1, 1), loom::backward(1, 1)};
  auto m = message_of(s);
  CHECK(m.find("rank 1 is stuck at position 0 on BW0@s1") != std::string::npos);
}

TEST_CASE("lowered programs whose receives break FIFO order are rejected") {
  auto low = loom::lower(loom::generate(loom::gpipe{}, {.ranks = 2, .microbatches = 3}));
  REQUIRE(loom::validate(low).ok);
  auto& p = low.programs[1];
  // Swap the first two receives on rank 1 (activations of mb 0 and mb 1 from rank 0).
  auto first = std::find_if(p.begin(), p.end(), [](auto const& a) { return a.kind == loom::op::recv; });
  auto second = std::find_if(first + 1, p.end(), [](auto const& a) { return a.kind == loom::op::recv; });
  std::iter_swap(first, second);
  auto m = message_of(low);
  CHECK(m.find("the FIFO from rank 0 delivers the activation of mb 0 stage 0 here") != std::string::npos);
}

TEST_CASE("lowered programs that consume before receiving, or send before producing, are rejected") {
  auto low = loom::lower(loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2}));
  auto& p = low.programs[1];
  auto recv = std::find_if(p.begin(), p.end(), [](auto const& a) { return a.kind == loom::op::recv; });
  std::iter_swap(recv, recv + 1);  // F0@s1 before its receive
  CHECK(message_of(low).find("needs the activation of mb 0 stage 0 from rank 0 before receiving it") != std::string::npos);

  auto low2 = loom::lower(loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2}));
  auto& q = low2.programs[0];
  auto send = std::find_if(q.begin(), q.end(), [](auto const& a) { return a.kind == loom::op::send; });
  std::iter_swap(send, send - 1);  // send before the F that produces it
  CHECK(message_of(low2).find("sends an item before this rank has produced it") != std::string::npos);
}

TEST_CASE("a receive with no matching send is reported as a deadlock, an unreceived send as a leak") {
  auto low = loom::lower(loom::generate(loom::gpipe{}, {.ranks = 2, .microbatches = 1}));
  low.programs[1].insert(low.programs[1].begin(), loom::recv_from(0, loom::payload::activation, 0, 0));
  CHECK(message_of(low).find("deadlock: this receive never matches a send") != std::string::npos);

  // Rank 0's last action produces the input gradient of stage 0, which nobody consumes.
  auto low2 = loom::lower(loom::generate(loom::gpipe{}, {.ranks = 2, .microbatches = 1}));
  low2.programs[0].push_back(loom::send_to(1, loom::payload::gradient, 0, 0));
  CHECK(message_of(low2).find("sends to rank 1, but the item is consumed on no rank") != std::string::npos);
  // A receive by a rank that does not consume the item.
  auto low4 = loom::lower(loom::generate(loom::gpipe{}, {.ranks = 3, .microbatches = 1}));
  low4.programs[2].insert(low4.programs[2].begin(), loom::recv_from(0, loom::payload::activation, 0, 0));
  CHECK(message_of(low4).find("receives an item that goes from rank 0 to rank 1") != std::string::npos);

  auto low3 = loom::lower(loom::generate(loom::gpipe{}, {.ranks = 2, .microbatches = 1}));
  low3.programs[0].push_back(loom::send_to(1, loom::payload::activation, 0, 0));
  CHECK(message_of(low3).find("sends an item that was already sent") != std::string::npos);
}

TEST_CASE("a malformed placement is rejected before any replay") {
  auto s = base();
  s.stage_to_rank[1] = 7;
  CHECK(message_of(s) == "stage 1 of direction 0 is placed on rank 7, outside 0..2");
  auto t = base();
  t.programs.pop_back();
  CHECK(message_of(t) == "schedule has 2 programs for 3 ranks");
}

TEST_CASE("lowering inserts one send and one receive per cross-rank transfer, and none within a rank") {
  for (int p = 1; p <= 6; ++p)
    for (int v = 1; v <= 3; ++v) {
      auto s = loom::generate(loom::interleaved_1f1b{}, {.ranks = p, .microbatches = 2 * p, .chunks = v});
      auto low = loom::lower(s);
      std::size_t sends = 0, recvs = 0;
      for (auto const& prog : low.programs)
        for (auto const& a : prog) {
          sends += a.kind == loom::op::send;
          recvs += a.kind == loom::op::recv;
        }
      // Each microbatch crosses every stage boundary forward and backward; a boundary crosses
      // ranks unless p = 1.
      std::size_t expected = p == 1 ? 0 : static_cast<std::size_t>(2 * (s.stages - 1) * s.microbatches);
      CHECK(sends == expected);
      CHECK(recvs == expected);
      CHECK(low.size() == s.size() + sends + recvs);
    }
}
