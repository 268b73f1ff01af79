// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// PyTorch pipelining CSV import/export: the shared test vectors, round trips over every
// registered family, both spellings, both forms, and malformed files.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <loom/render/torch_csv.hpp>
#include <loom/schedule.hpp>


namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The PyTorch test vectors, copied into tests/interop/data/ from ../shared/interop/torch.
std::string vector_file(std::string_view name) {
  auto dir = std::filesystem::path(__FILE__).parent_path() / "data";
  return slurp((dir / std::string(name)).string());
}

// The non-empty cells of each line, split the plain way (the vectors have no quoting).
std::vector<std::vector<std::string>> cells_of(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    rows.emplace_back();
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ','))
      if (!cell.empty()) rows.back().push_back(cell);
  }
  return rows;
}

std::size_t count_of(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Everything a CSV carries: shape, stage -> rank, placement (on more than one rank, where loop
// and V coincide), programs.
void check_same(const loom::schedule& back, const loom::schedule& s) {
  CHECK(back.ranks == s.ranks);
  CHECK(back.microbatches == s.microbatches);
  CHECK(back.stages == s.stages);
  CHECK(back.directions == 1);
  CHECK(back.stage_to_rank == s.stage_to_rank);
  if (s.ranks > 1) {
    CHECK(back.placement == s.placement);
    CHECK(back.chunks == s.chunks);
  }
  CHECK(back.programs == s.programs);
}

}  // namespace

TEST_CASE("The shared DualPipeV vector imports as a valid 4-rank V schedule with overlapped pairs") {
  const std::string text = vector_file("dualpipev_4rank_10mb.csv");
  auto imp = loom::import_torch_csv(text);
  const loom::schedule& s = imp.sched;
  CHECK(s.ranks == 4);
  CHECK(s.stages == 8);
  CHECK(s.microbatches == 10);
  CHECK(s.placement == loom::placement_kind::v);
  CHECK(s.chunks == 2);
  for (int st = 0; st < 8; ++st) CHECK(s.stage_to_rank[static_cast<std::size_t>(st)] == (st < 4 ? st : 7 - st));
  CHECK(imp.spelling == loom::torch_spelling::current);
  CHECK(imp.form == loom::torch_csv_form::compute_only);
  std::size_t fb = 0, cells = 0;
  for (auto const& p : s.programs)
    for (auto const& a : p) fb += a.kind == loom::op::FB;
  for (auto const& row : cells_of(text)) cells += row.size();
  CHECK(fb == count_of(text, "OVERLAP_F_B"));
  CHECK(s.size() == cells);
  auto v = loom::validate(s);
  CHECK_MESSAGE(v.ok, v.message);
  for (auto k : {loom::costs{}, loom::costs{.f = 1, .b = 2, .w = 1, .c = 0.1}, loom::costs{.f = 1, .b = 1, .w = 1, .fb = 1.5}}) {
    auto sim = loom::simulate(s, k);
    REQUIRE_MESSAGE(sim.ok, sim.error);
    CHECK(sim.makespan > 0);
    CHECK(sim.bubble_rate >= 0);
    CHECK(sim.bubble_rate < 1);
    // Each rank runs 2 stages x 10 microbatches of q (f + b + w), q = 1/2; an overlapped pair
    // with a full backward costs q fb instead of q (f + b + w) when fb is given.
    for (std::size_t r = 0; r < 4; ++r) {
      int pairs = 0;
      for (auto const& a : s.programs[r]) pairs += a.kind == loom::op::FB && a.bkind == loom::op::BW;
      double expect = 2 * 10 * 0.5 * (k.f + k.b + k.w) + (k.fb >= 0 ? pairs * 0.5 * (k.fb - (k.f + k.b + k.w)) : 0);
      CHECK(sim.busy[r] == doctest::Approx(expect));
    }
  }
}

TEST_CASE("The shared ZB1P vector imports with the legacy spelling detected") {
  const std::string text = vector_file("zb1p_2rank_2stagep_compute.csv");
  auto imp = loom::import_torch_csv(text);
  const loom::schedule& s = imp.sched;
  CHECK(s.ranks == 2);
  CHECK(s.stages == 4);
  CHECK(s.microbatches == 8);
  CHECK(s.placement == loom::placement_kind::loop);
  CHECK(s.chunks == 2);
  CHECK(imp.spelling == loom::torch_spelling::legacy);
  CHECK(imp.idle_cells == 2);
  int b = 0, w = 0, bw = 0;
  for (auto const& p : s.programs)
    for (auto const& a : p) {
      b += a.kind == loom::op::B;
      w += a.kind == loom::op::W;
      bw += a.kind == loom::op::BW;
    }
  CHECK(b == 4 * 8);
  CHECK(w == 4 * 8);
  CHECK(bw == 0);
  auto v = loom::validate(s);
  CHECK_MESSAGE(v.ok, v.message);
  auto sim = loom::simulate(s);
  REQUIRE(sim.ok);
  // Unit costs: each rank runs 2 stages x 8 microbatches of q (f + b + w), q = 1/2.
  for (double busy : sim.busy) CHECK(busy == doctest::Approx(2 * 8 * 3 * 0.5));
  // A lowered copy is deadlock-free under tagless FIFO matching.
  auto lv = loom::validate(loom::lower(s));
  CHECK_MESSAGE(lv.ok, lv.message);

  SUBCASE("forcing the current spelling reads each B as a full backward, which the validator rejects") {
    auto cur = loom::read_torch_csv(text, {.spelling = loom::torch_spelling::current});
    auto cv = loom::validate(cur);
    CHECK_FALSE(cv.ok);
    CHECK(cv.message.find("both a fused BW and a split") != std::string::npos);
  }
  SUBCASE("forcing the legacy spelling reads the same schedule as detection") {
    CHECK(loom::read_torch_csv(text, {.spelling = loom::torch_spelling::legacy}).programs == s.programs);
  }
}

TEST_CASE("Writing an imported vector reproduces its compute actions cell for cell") {
  SUBCASE("DualPipeV, current spelling") {
    const std::string text = vector_file("dualpipev_4rank_10mb.csv");
    CHECK(cells_of(loom::write_torch_csv(loom::read_torch_csv(text))) == cells_of(text));
  }
  SUBCASE("ZB1P, legacy spelling written back as legacy") {
    const std::string text = vector_file("zb1p_2rank_2stagep_compute.csv");
    auto s = loom::read_torch_csv(text);
    CHECK(cells_of(loom::write_torch_csv(s, {.spelling = loom::torch_spelling::legacy})) == cells_of(text));
    // In the current spelling each legacy B becomes I, nothing else changes.
    std::string current = text;
    for (std::size_t i = 0; i < current.size(); ++i)
      if (current[i] == 'B') current[i] = 'I';
    CHECK(cells_of(loom::write_torch_csv(s)) == cells_of(current));
  }
}

TEST_CASE("Every registered one-direction family round-trips through the CSV in both forms and spellings") {
  const auto& reg = loom::default_registry();
  REQUIRE(!reg.entries().empty());
  int written = 0, refused = 0;
  for (auto const& e : reg.entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: the CSV cannot hold versions; vocabulary-parallel ones: nor the passes (both refused, tested)
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 2, 5, 8})
        for (int chunks : {0, 2, 3}) {
          loom::shape sh{.ranks = p, .microbatches = m, .chunks = chunks};
          if (!e.check(e.resolve(sh)).empty()) continue;
          CAPTURE(e.name);
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(chunks);
          loom::schedule s = e.make(sh);
          if (s.directions != 1 || s.param_copies != 1) {
            CHECK_THROWS_AS(loom::write_torch_csv(s), loom::schedule_error);
            ++refused;
            continue;
          }
          ++written;
          const std::string csv = loom::write_torch_csv(s);
          auto imp = loom::import_torch_csv(csv);
          CHECK(imp.form == loom::torch_csv_form::compute_only);
          check_same(imp.sched, s);
          CHECK(loom::validate(imp.sched).ok);
          // Legacy spelling, read back by detection.
          check_same(loom::read_torch_csv(loom::write_torch_csv(s, {.spelling = loom::torch_spelling::legacy})), s);
          // Lowered: the compute+comms form.
          loom::schedule low = loom::lower(s);
          auto limp = loom::import_torch_csv(loom::write_torch_csv(low));
          bool has_comm = false;
          for (auto const& prog : low.programs)
            for (auto const& a : prog) has_comm = has_comm || !loom::is_compute(a.kind);
          CHECK(limp.form == (has_comm ? loom::torch_csv_form::compute_comms : loom::torch_csv_form::compute_only));
          check_same(limp.sched, low);
        }
  }
  MESSAGE("round-tripped " << written << " schedules; refused " << refused << " bidirectional/replica ones");
  CHECK(written > 0);
}

TEST_CASE("A bidirectional schedule is refused with the rule named") {
  loom::schedule s = loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2});
  s.directions = 2;
  s.stage_to_rank = {0, 1, 1, 0};
  s.mb_direction = {0, 1};
  try {
    (void)loom::write_torch_csv(s);
    FAIL("expected a schedule_error");
  } catch (const loom::schedule_error& e) {
    CHECK(std::string(e.what()).find("2 directions") != std::string::npos);
  }
}

TEST_CASE("A compute+comms file with FSDP and gradient-reduction actions imports, drops them and validates") {
  // 1F1B on two ranks, written the way PyTorch's compute_comms lowering writes it.
  const std::string text =
      "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD,0RESHARD\n"
      "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1RESHARD\n";
  auto imp = loom::import_torch_csv(text);
  CHECK(imp.form == loom::torch_csv_form::compute_comms);
  CHECK(imp.unshard_cells == 2);
  CHECK(imp.reshard_cells == 2);
  CHECK(imp.reduce_grad_cells == 2);
  const auto& s = imp.sched;
  REQUIRE(s.programs.size() == 2);
  CHECK(s.programs[0].size() == 8);
  CHECK(s.programs[1].size() == 8);
  // RECV_F of stage 1 receives what stage 0 produced; RECV_B of stage 0 what stage 1 produced.
  CHECK(s.programs[1][0] == loom::recv_from(0, loom::payload::activation, 0, 0));
  CHECK(s.programs[0][4] == loom::recv_from(1, loom::payload::gradient, 0, 1));
  CHECK(s.programs[0][1] == loom::send_to(1, loom::payload::activation, 0, 0));
  auto v = loom::validate(s);
  CHECK_MESSAGE(v.ok, v.message);

  SUBCASE("a receive posted before the matching send cannot complete and the validator says so") {
    const std::string bad =
        "0F0,0RECV_B0,0SEND_F0,0B0\n"
        "1RECV_F0,1F0,1B0,1SEND_B0\n";
    auto bv = loom::validate(loom::read_torch_csv(bad));
    CHECK_FALSE(bv.ok);
    CHECK(bv.message.find("deadlock") != std::string::npos);
  }
}

TEST_CASE("PyTorch 2.15's completion points are read, checked against the operation they complete, and dropped") {
  // 1F1B on two ranks as PyTorch 2.15's lowering writes it: every send has a wait (a forward
  // send's right after the local backward that proves it was received, the rest at the end), and
  // every REDUCE_GRAD its WAIT_REDUCE_GRAD.
  const std::string text =
      "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n"
      "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
  auto imp = loom::import_torch_csv(text);
  CHECK(imp.form == loom::torch_csv_form::compute_comms);
  CHECK(imp.sends == 4);
  CHECK(imp.wait_send_cells == 4);
  CHECK(imp.unwaited_sends == 0);
  CHECK(imp.reduce_grad_cells == 2);
  CHECK(imp.wait_reduce_grad_cells == 2);
  CHECK(imp.unwaited_reduce_grads == 0);
  // The waits leave no trace in the schedule: it is the one without them.
  const std::string without =
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
  auto plain = loom::import_torch_csv(without);
  CHECK(imp.sched.programs == plain.sched.programs);
  CHECK(plain.unwaited_sends == 4);
  CHECK(plain.wait_send_cells == 0);
  auto v = loom::validate(imp.sched);
  CHECK_MESSAGE(v.ok, v.message);

  SUBCASE("a send waited for later than PyTorch would, or a reduction never waited for, still reads and is counted") {
    auto late = loom::import_torch_csv(
        "0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0WAIT_SEND_F0\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n");
    CHECK(late.unwaited_sends == 1);
    CHECK(late.unwaited_reduce_grads == 1);
    CHECK(late.wait_send_cells == 1);
  }
}

TEST_CASE("The lowered form carries a wait for every send and a REDUCE_GRAD per stage, where PyTorch's lowering puts them") {
  // Checked from the written cells alone, over every family the CSV can hold.
  const auto& reg = loom::default_registry();
  int files = 0;
  for (auto const& e : reg.entries()) {
    if (e.multi_step || e.vocab) continue;  // asynchronous families: the CSV cannot hold versions; vocabulary-parallel ones: nor the passes (both refused, tested)
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 3, 8})
        for (int chunks : {0, 2}) {
          loom::shape sh{.ranks = p, .microbatches = m, .chunks = chunks};
          if (!e.check(e.resolve(sh)).empty()) continue;
          loom::schedule s = e.make(sh);
          if (s.directions != 1 || s.param_copies != 1) continue;
          CAPTURE(e.name);
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(chunks);
          ++files;
          const std::string csv = loom::write_torch_csv(s, {.form = loom::torch_csv_form::compute_comms});
          // The same file as writing the lowered schedule (one rank has nothing to lower).
          if (p > 1) CHECK(csv == loom::write_torch_csv(loom::lower(s)));
          auto rows = cells_of(csv);
          REQUIRE(static_cast<int>(rows.size()) == p);
          for (std::size_t r = 0; r < rows.size(); ++r) {
            const auto& row = rows[r];
            auto find = [&](const std::string& cell) {
              for (std::size_t i = 0; i < row.size(); ++i)
                if (row[i] == cell) return static_cast<long>(i);
              return -1L;
            };
            auto count = [&](const std::string& cell) {
              long n = 0;
              for (auto const& c : row) n += c == cell;
              return n;
            };
            // The backwards of each (stage, mb) on this line, by cell text prefix.
            for (std::size_t i = 0; i < row.size(); ++i) {
              const std::string& c = row[i];
              auto at = c.find("SEND_");
              if (at == std::string::npos || c.find("WAIT_") != std::string::npos) continue;
              const std::string stage = c.substr(0, at), mb = c.substr(at + 6);
              const std::string wait = stage + "WAIT_" + c.substr(at);
              CHECK_MESSAGE(count(wait) == 1, wait);
              const long w = find(wait);
              CHECK_MESSAGE(w > static_cast<long>(i), wait);
              if (c[at + 5] == 'F') {
                // Right after this line's backward of (stage, mb), if it has one; else at the end.
                long back = -1;
                for (std::size_t j = 0; j < row.size(); ++j) {
                  const std::string& b = row[j];
                  for (const std::string& k : {stage + "B" + mb, stage + "I" + mb})
                    if (b == k || b.find(";" + k + ")") != std::string::npos) back = static_cast<long>(j);
                }
                if (back >= 0) CHECK_MESSAGE(w == back + 1, wait);
                else
                  for (std::size_t j = static_cast<std::size_t>(w); j < row.size(); ++j)
                    CHECK_MESSAGE(row[j].find("WAIT_SEND") != std::string::npos, wait << " is followed by " << row[j]);
              } else {
                for (std::size_t j = static_cast<std::size_t>(w); j < row.size(); ++j)
                  CHECK_MESSAGE(row[j].find("WAIT_SEND") != std::string::npos, wait << " is followed by " << row[j]);
              }
            }
            // One REDUCE_GRAD per stage of the line, right after the sends of its last B or W,
            // and its wait right after it.
            for (int st = 0; st < s.stages; ++st) {
              if (s.stage_to_rank[static_cast<std::size_t>(st)] != static_cast<int>(r)) continue;
              const std::string red = std::to_string(st) + "REDUCE_GRAD";
              REQUIRE_MESSAGE(count(red) == 1, red);
              const long at = find(red);
              CHECK(row[static_cast<std::size_t>(at + 1)] == std::to_string(st) + "WAIT_REDUCE_GRAD");
              long last = -1;
              for (std::size_t j = 0; j < row.size(); ++j) {
                const std::string& b = row[j];
                for (int mb = 0; mb < m; ++mb)
                  for (const std::string& k : {std::to_string(st) + "B" + std::to_string(mb), std::to_string(st) + "W" + std::to_string(mb)})
                    if (b == k || b.find(";" + k + ")") != std::string::npos) last = static_cast<long>(j);
              }
              REQUIRE(last >= 0);
              CHECK(at > last);
              for (long j = last + 1; j < at; ++j)
                CHECK_MESSAGE(row[static_cast<std::size_t>(j)].find("SEND_") != std::string::npos, row[static_cast<std::size_t>(j)]);
            }
          }
          // Read back, the file is the lowered schedule; without waits it has none and the same schedule.
          auto imp = loom::import_torch_csv(csv);
          CHECK(imp.unwaited_sends == 0);
          CHECK(imp.unwaited_reduce_grads == 0);
          check_same(imp.sched, loom::lower(s));
          const std::string old = loom::write_torch_csv(s, {.form = loom::torch_csv_form::compute_comms, .waits = false});
          CHECK(old.find("WAIT_") == std::string::npos);
          CHECK(count_of(old, "REDUCE_GRAD") == static_cast<std::size_t>(s.stages));
          check_same(loom::read_torch_csv(old), loom::lower(s));
        }
  }
  CHECK(files > 100);
}

TEST_CASE("A lowered schedule asked for in the compute-only form is refused") {
  auto low = loom::lower(loom::generate(loom::one_f_one_b{}, {.ranks = 2, .microbatches = 2}));
  CHECK_THROWS_WITH_AS(loom::write_torch_csv(low, {.form = loom::torch_csv_form::compute_only}),
                       doctest::Contains("compute_only form cannot hold"), loom::schedule_error);
}

TEST_CASE("A well-formed file that is not a valid schedule imports but fails validation") {
  // Stage 1's backward of microbatch 0 is missing.
  auto s = loom::read_torch_csv("0F0,0B0\n1F0\n");
  CHECK_FALSE(loom::validate(s).ok);
}

TEST_CASE("Line endings, spaces and quoting are read the way Python's csv module writes them") {
  const std::string plain = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  const auto ref = loom::read_torch_csv(plain);
  CHECK(loom::read_torch_csv("0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n").programs == ref.programs);
  CHECK(loom::read_torch_csv("0F0, 0F1 ,0B0,\"0B1\"\n1F0,1B0,1F1,1B1").programs == ref.programs);
  CHECK(loom::read_torch_csv(",0F0,,0F1,0B0,0B1,\n1F0,1B0,1F1,1B1\n").programs == ref.programs);
  // A blank line is an idle rank, as csv.reader yields an empty row for it.
  CHECK(loom::read_torch_csv("0F0,0B0\n\n").ranks == 2);
}

// A 2-rank 1F1B schedule imported and checked during constant evaluation.
static_assert(loom::validate(loom::read_torch_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")).ok);
static_assert(loom::read_torch_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n").placement == loom::placement_kind::loop);
static_assert(loom::write_torch_csv(loom::read_torch_csv("0F0,0I0,0W0\n")) == "0F0,0I0,0W0\n");
// PyTorch 2.15's completion points, read and written during constant evaluation.
static_assert(loom::import_torch_csv("0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n").wait_send_cells == 2);
static_assert(loom::write_torch_csv(loom::read_torch_csv("0F0,0B0\n"), {.form = loom::torch_csv_form::compute_comms}) ==
              "0F0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n");

TEST_CASE("Malformed files name the line, the cell and the reason") {
  struct bad_case {
    const char* text;
    int line;
    int column;
    const char* cell;
    const char* reason;
  };
  const bad_case cases[] = {
      {"0F0,0X1\n", 1, 2, "0X1", "unknown action type \"X\""},
      {"0F0\n1F0,F1\n", 2, 2, "F1", "does not start with a stage index"},
      {"0F0,0F\n", 1, 2, "0F", "has no microbatch index"},
      {"0F0,0F1x\n", 1, 2, "0F1x", "unexpected text \"x\""},
      {"0f0\n", 1, 1, "0f0", "no action type"},
      {"0F0,1F0\n1F1\n", 2, 1, "1F1", "stage 1 appears on rank 1 (line 2) and on rank 0 (line 1, cell 2 \"1F0\")"},
      {"0F0,2F0,0B0,2B0\n", 1, 2, "2F0", "stage 1 appears on no line"},
      {"0F0,(0F1;1B0\n", 1, 2, "(0F1;1B0", "without a closing"},
      {"0F0,(0F1;1W0)OVERLAP_F_B\n", 1, 2, "(0F1;1W0)OVERLAP_F_B", "may only hold F, I or B"},
      {"(0F0;1F1)OVERLAP_F_B\n", 1, 1, "(0F0;1F1)OVERLAP_F_B", "exactly one forward and one backward"},
      {"(0F0;1B0)OVERLAP\n", 1, 1, "(0F0;1B0)OVERLAP", "must end in OVERLAP_F_B"},
      {"", 1, 1, "", "the file is empty"},
      {",,\n", 1, 1, "", "no compute action"},
      {"0F0,0F1,0B0,0W0,0I1,0W1\n", 1, 3, "0B0", "line 1, cell 5 \"0I1\" uses I"},
      {"0F0,0SEND_F0\n", 1, 2, "0SEND_F0", "names its receiving stage 1, outside the stages 0..0"},
      {"0F0,0SEND_F0,1F0\n", 1, 2, "0SEND_F0", "on the same rank 0"},
      {"0F0,1RECV_B0\n1F0\n", 2, 1, "1F0", "on rank 0 (line 1, cell 2 \"1RECV_B0\")"},
      {"0F0\n1F0,1B0,1RECV_B0\n", 2, 3, "1RECV_B0", "names its sending stage 2, outside"},
      {"0F0,99999999F0\n", 1, 2, "99999999F0", "exceeds loom's limit"},
      {"0F0,\"0B0\n1F0\n", 1, 2, "0B0", "unterminated quoted cell"},
      {"0F0,0WAIT_SEND_F0,0SEND_F0\n1F0\n", 1, 2, "0WAIT_SEND_F0", "waits for 0SEND_F0, which line 1 issues only later, at cell 3 \"0SEND_F0\""},
      {"0F0,0SEND_F0\n1F0,1WAIT_SEND_F0\n", 2, 2, "1WAIT_SEND_F0", "waits for 1SEND_F0, which line 2 does not issue"},
      {"0F0,0SEND_F0,0WAIT_SEND_F0,0WAIT_SEND_F0\n1F0\n", 1, 4, "0WAIT_SEND_F0", "already completed at cell 3"},
      {"0F0,0SEND_F0,0WAIT_SEND_B0\n1F0\n", 1, 3, "0WAIT_SEND_B0", "waits for 0SEND_B0"},
      {"0F0,0SEND_F0,0SEND_F0\n1F0\n", 1, 3, "0SEND_F0", "a second time (first at cell 2"},
      {"0F0,0WAIT_SEND_F\n", 1, 2, "0WAIT_SEND_F", "action WAIT_SEND_F of stage 0 has no microbatch index"},
      {"0F0,0B0,0WAIT_REDUCE_GRAD,0REDUCE_GRAD\n", 1, 3, "0WAIT_REDUCE_GRAD", "waits for 0REDUCE_GRAD, which line 1 issues only later"},
      {"0F0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0WAIT_REDUCE_GRAD\n", 1, 5, "0WAIT_REDUCE_GRAD", "waits a second time"},
      {"0F0,0F1,0B0,0REDUCE_GRAD,0B1\n", 1, 4, "0REDUCE_GRAD", "before its backward at cell 5 \"0B1\""},
      {"0F0,0I0,0REDUCE_GRAD,0W0\n", 1, 3, "0REDUCE_GRAD", "before its backward at cell 4 \"0W0\""},
      {"0F0,0B0,0REDUCE_GRAD,0REDUCE_GRAD\n", 1, 4, "0REDUCE_GRAD", "a second time"},
      {"0F0,0WAIT_SEND_X0\n", 1, 2, "0WAIT_SEND_X0", "unknown action type \"WAIT_SEND_X\" (expected F, I, B, W, SEND_F, RECV_F, SEND_B, RECV_B, WAIT_SEND_F"},
  };
  for (auto const& c : cases) {
    CAPTURE(c.text);
    std::string what;
    try {
      (void)loom::read_torch_csv(c.text);
    } catch (const loom::schedule_error& e) {
      what = e.what();
    }
    REQUIRE_MESSAGE(!what.empty(), "no error for " << c.text);
    const std::string where = "line " + std::to_string(c.line) + ", cell " + std::to_string(c.column) + " \"" + c.cell + "\": ";
    CHECK_MESSAGE(what.find(where) != std::string::npos, what);
    CHECK_MESSAGE(what.find(c.reason) != std::string::npos, what);
    CHECK(what.find('\n') == std::string::npos);
  }
}

TEST_CASE("An asynchronous schedule is refused by the CSV writer: PyTorch's format has no weight versions") {
  const auto s = loom::default_registry().at("pipedream").make({.ranks = 2, .microbatches = 2, .chunks = 0, .steps = 3});
  CHECK_THROWS_WITH_AS(loom::write_torch_csv(s), doctest::Contains("spans 3 steps with weight versions"), loom::schedule_error);
}
