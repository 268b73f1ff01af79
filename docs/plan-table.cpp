// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Prints docs/plan.md's tables: `loom plan` on three published Megatron-LM layouts (the model and
// cluster files in docs/plan/), once with everything loom searches and once restricted to what
// Megatron-LM offered in 2021 (full recomputation, no sequence parallelism, 1F1B and interleaved
// 1F1B), and where the published (dp, tp, pp) lands in each ranking. The ranking tables are
// exactly what `loom plan --top 5` prints (tools/loom/plan_io.hpp formats both). Then a GPT 70B
// shape (docs/plan/gpt-70b.model.json) on 64 GPUs with three vocabularies, planned without and
// with vocabulary parallelism, and on the same GPUs with PCIe host links
// (docs/plan/selene-64-host.cluster.json) without and with PipeOffload (`--offload`), with the
// chosen layout at each number of offloaded chunks. Last, a mixture of experts of Switch-Large's layer shape
// (docs/plan/switch-large-moe.model.json) on the same 64 GPUs: `loom plan`'s table, and the best
// configuration for each expert-parallel degree ep. Then the GPT 70B shape again with 4 to 32
// sequences per microbatch, where the tensor-parallel grids apply: the fastest configuration of
// each tensor-parallel kind, and `loom plan`'s table at 16. Last, that shape at 8192 to 131072
// tokens (2M tokens per step) with context parallelism: the fastest configuration of each kind,
// and `loom plan --context-parallel`'s table at 32768. Then a spatial-temporal model
// (docs/plan/st-dit.model.json) at 256 to 4096 patches per frame, DSP among the kinds, and the
// table at 1024.
//   g++ -std=c++20 -O2 -Iinclude -Itools/loom -DLOOM_SOURCE_DIR='"."' docs/plan-table.cpp -o /tmp/plan-table && /tmp/plan-table
#include <cstdio>
#include <string>

#include "plan_io.hpp"

namespace {

struct study {
  const char* model;
  const char* cluster;
  long long dp, tp, pp;  // the published layout
};

// Where the published layout first appears in `rep`, as a table cell.
std::string published_cell(const loom::plan_report& rep, const study& s) {
  for (std::size_t i = 0; i < rep.ranked.size(); ++i) {
    const auto& r = rep.ranked[i];
    if (r.config.dp == s.dp && r.config.tp == s.tp && r.config.pp == s.pp) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "rank %zu of %zu: %s, recompute %s, SP %s, %.2f s, %.0f TFLOP/s (first: %.2f s, %+.1f%%)", i + 1,
                    rep.ranked.size(), loom::plan_io::schedule_label(r.config).c_str(), loom::to_string(r.config.recompute),
                    r.config.sp ? "on" : "off", r.step_time, r.flops_per_gpu / 1e12, rep.ranked[0].step_time,
                    100 * (r.step_time / rep.ranked[0].step_time - 1));
      return buf;
    }
  }
  return "does not fit";
}

// The fastest configuration of `rep` that `keep` accepts, or null.
template <class Keep>
const loom::plan_result* fastest(const loom::plan_report& rep, Keep keep) {
  for (const auto& r : rep.ranked)
    if (keep(r.config)) return &r;
  return nullptr;
}

// The two cells of a per-kind table for `best` (null: nothing of the kind), its degrees given
// as `layout`, and "(fastest)" when it leads `rep`.
void print_best(const loom::plan_report& rep, const loom::plan_result* best, const std::string& layout) {
  if (best == nullptr) {
    std::printf(" none fits or divides | |");
    return;
  }
  const auto& k = best->config;
  std::printf(" (%s) %s, recompute %s%s | %.2f%s |", layout.c_str(), loom::plan_io::schedule_label(k).c_str(), loom::to_string(k.recompute),
              k.sp ? ", SP" : "", best->step_time, best == &rep.ranked[0] ? " (fastest)" : "");
}

// The two cells of the per-kind table of context parallelism: the fastest configuration of `rep`
// whose cp kind is `kind`.
void print_kind(const loom::plan_report& rep, loom::context_kind kind) {
  const loom::plan_result* best = fastest(rep, [&](const loom::plan_config& k) { return k.cp_kind == kind; });
  print_best(rep, best,
             best == nullptr ? ""
                             : std::to_string(best->config.dp) + ", " + loom::plan_io::cp_label(best->config) + ", " +
                                   std::to_string(best->config.tp) + ", " + std::to_string(best->config.pp));
}

}  // namespace

int main() {
  const study studies[] = {{"gpt-310b", "selene-1920", 15, 8, 16}, {"mt-nlg-530b", "selene-2520", 9, 8, 35}, {"gpt-1t", "selene-3072", 6, 8, 64}};
  std::string summary =
      "| model | GPUs | published (dp, tp, pp) | in loom's full search | in the 2021-feature search | 2021 features, 18 bytes/parameter |\n"
      "|:--|---:|:--|:--|:--|:--|\n";
  std::string tables;
  for (const study& s : studies) {
    const std::string dir = std::string(LOOM_SOURCE_DIR) + "/docs/plan/";
    const auto m = loom::plan_io::read_model(dir + s.model + ".model.json");
    const auto c = loom::plan_io::read_cluster(dir + s.cluster + ".cluster.json");
    const loom::plan_report full = loom::plan(m.desc, c.desc);
    loom::plan_options o2021;
    o2021.families = {"1f1b", "interleaved-1f1b"};
    o2021.recompute = {loom::recompute_kind::full};
    o2021.sp_on = false;
    const loom::plan_report old = loom::plan(m.desc, c.desc, o2021);
    // Megatron-LM's fp32 gradient buffer (bf16 forces it): 18 bytes of model state per parameter.
    loom::model_desc m18 = m.desc;
    m18.state_bytes_per_param = 18;
    const loom::plan_report old18 = loom::plan(m18, c.desc, o2021);
    summary += "| " + m.name + " | " + std::to_string(c.desc.gpus) + " | (" + std::to_string(s.dp) + ", " + std::to_string(s.tp) + ", " +
               std::to_string(s.pp) + ") | " + published_cell(full, s) + " | " + published_cell(old, s) + " | " +
               published_cell(old18, s) + " |\n";
    tables += "\n" + m.name + ", full search (`loom plan --model docs/plan/" + s.model + ".model.json --cluster docs/plan/" + s.cluster +
              ".cluster.json`):\n\n" + loom::plan_io::table(full, 5);
    tables += "\n" + m.name + ", 2021 features (`... --recompute full --sp off --families 1f1b,interleaved-1f1b`):\n\n" +
              loom::plan_io::table(old, 5);
    tables += "\n" + m.name + ", 2021 features, `\"state_bytes_per_param\": 18` in the model file:\n\n" + loom::plan_io::table(old18, 3);
  }
  std::printf("%s%s", summary.c_str(), tables.c_str());
  // Vocabulary parallelism: the same model with three vocabularies, planned without and with the
  // vocabulary-parallel families (the schedules searched are narrowed to four cheap ones, so
  // that this program stays quick; the cost-aware auto-schedulers are left out).
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/docs/plan/";
  const auto m = loom::plan_io::read_model(dir + "gpt-70b.model.json");
  const auto c = loom::plan_io::read_cluster(dir + "selene-64.cluster.json");
  loom::plan_options without;
  without.families = {"1f1b", "interleaved-1f1b", "zb-h1", "v-half"};
  loom::plan_options with = without;
  for (auto const& f : loom::detail::plan_vocab_families) with.families.emplace_back(f.name);
  auto cell = [](const loom::plan_result& r) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "(%lld, %lld, %lld) %s, %d chunk%s, recompute %s, SP %s | %.2f | %.1f", r.config.dp, r.config.tp,
                  r.config.pp, loom::plan_io::schedule_label(r.config).c_str(), r.config.chunks, r.config.chunks == 1 ? "" : "s",
                  loom::to_string(r.config.recompute), r.config.sp ? "on" : "off", r.step_time, r.memory_bytes / (1024.0 * 1024 * 1024));
    return std::string(buf);
  };
  std::printf("\n| vocabulary | best without vocabulary parallelism (dp, tp, pp) | step (s) | memory (GiB) | best with it | step (s) | "
              "memory (GiB) | step time |\n|---:|:--|---:|---:|:--|---:|---:|---:|\n");
  for (long long vocab : {32000LL, 128256LL, 256000LL}) {
    loom::model_desc d = m.desc;
    d.vocab = vocab;
    const loom::plan_report a = loom::plan(d, c.desc, without), b = loom::plan(d, c.desc, with);
    std::printf("| %lld | %s | %s | %+.1f%% |\n", vocab, cell(a.ranked.at(0)).c_str(), cell(b.ranked.at(0)).c_str(),
                100 * (b.ranked.at(0).step_time / a.ranked.at(0).step_time - 1));
  }
  // Offload (PipeOffload): the same model on the same GPUs with PCIe links to host memory
  // (docs/plan/selene-64-host.cluster.json), the four families above with selective recomputation,
  // without and with --offload; then the layout offload picks with each number of offloaded chunks.
  {
    const auto ch = loom::plan_io::read_cluster(dir + "selene-64-host.cluster.json");
    loom::plan_options oo = without;
    oo.recompute = {loom::recompute_kind::selective};
    const loom::plan_report plain = loom::plan(m.desc, ch.desc, oo);
    oo.offload = true;
    const loom::plan_report off = loom::plan(m.desc, ch.desc, oo);
    std::printf("\n| search | best (dp, tp, pp) | step (s) | memory (GiB) |\n|:--|:--|---:|---:|\n");
    std::printf("| without offload | %s |\n| with `--offload` | %s |\n", cell(plain.ranked.at(0)).c_str(), cell(off.ranked.at(0)).c_str());
    std::printf("\n%s", loom::plan_io::table(off, 5).c_str());
    loom::plan_config k = off.ranked.at(0).config;
    const loom::schedule s = loom::default_registry().at(k.family).make(
        {.ranks = static_cast<int>(k.pp), .microbatches = static_cast<int>(k.microbatches), .chunks = k.chunks, .group = k.group});
    std::printf("\n| offloaded chunks | step (s) | pipeline (s) | activations (GiB) | memory (GiB) | fits in %.0f GiB |\n|---:|---:|---:|---:|---:|:--|\n",
                ch.desc.usable_bytes() / (1024.0 * 1024 * 1024));
    for (int n = 0; n <= k.chunks; ++n) {
      k.offload_chunks = n;
      loom::schedule with = s;
      if (n > 0) {
        const loom::offload_plan op = loom::detail::plan_offload_for(m.desc, ch.desc, k, s);
        if (!op.ok) {
          std::printf("| %d | refused: %s | | | | |\n", n, std::string(op.error.view()).c_str());
          continue;
        }
        with = loom::with_offload(s, op);
      }
      const loom::plan_result r = loom::evaluate_plan(m.desc, ch.desc, k, with);
      constexpr double gib = 1024.0 * 1024.0 * 1024.0;
      std::printf("| %d | %.2f | %.2f | %.1f | %.1f | %s |\n", n, r.step_time, r.pipeline_time, r.activation_bytes / gib, r.memory_bytes / gib,
                  r.fits ? "yes" : "no");
    }
  }
  // Mixture of experts: the ranking, and the fastest configuration of each ep (the search's
  // families narrowed to three, so that this program stays quick).
  const auto moe = loom::plan_io::read_model(dir + "switch-large-moe.model.json");
  loom::plan_options mo;
  mo.families = {"1f1b", "zb-h1", "interleaved-1f1b"};
  const loom::plan_report mrep = loom::plan(moe.desc, c.desc, mo);
  std::printf("\n%s", loom::plan_io::table(mrep, 5).c_str());
  std::printf("\n| ep | fastest (dp, tp, pp) | schedule | step (s) | dp all-reduce (s) | memory (GiB) | experts (GiB) | all-to-all (GiB per step) |\n"
              "|---:|:--|:--|---:|---:|---:|---:|---:|\n");
  for (long long ep = 1; ep <= moe.desc.experts; ep *= 2) {
    const loom::plan_result* best = fastest(mrep, [&](const loom::plan_config& k) { return k.ep == ep; });
    if (best == nullptr) {
      std::printf("| %lld | nothing fits or divides | | | | | | |\n", ep);
      continue;
    }
    const auto& k = best->config;
    constexpr double gib = 1024.0 * 1024.0 * 1024.0;
    std::printf("| %lld | (%lld, %lld, %lld) | %s, recompute %s | %.3f | %.3f | %.1f | %.1f | %.2f |\n", ep, k.dp, k.tp, k.pp,
                loom::plan_io::schedule_label(k).c_str(), loom::to_string(k.recompute), best->step_time, best->dp_time, best->memory_bytes / gib,
                best->expert_bytes / gib, best->all_to_all_bytes / gib);
  }
  // Tensor-parallel grids: the fastest configuration of each kind per microbatch size (a grid
  // needs whole sequences per member, so it appears from 4 sequences per microbatch on).
  loom::plan_options go;
  go.families = {"1f1b", "interleaved-1f1b", "zb-h1"};
  std::printf("\n| sequences per microbatch | 1D (dp, tp, pp) | step (s) | 2D | step (s) | 2.5D | step (s) | 3D | step (s) |\n"
              "|---:|:--|---:|:--|---:|:--|---:|:--|---:|\n");
  loom::plan_report g16;
  for (long long mb : {1LL, 4LL, 8LL, 16LL, 32LL}) {
    loom::model_desc d = m.desc;
    d.micro_batch = mb;
    const loom::plan_report rep = loom::plan(d, c.desc, go);
    if (mb == 16) g16 = rep;
    std::printf("| %lld |", mb);
    for (loom::tp_kind kind : {loom::tp_kind::d1, loom::tp_kind::d2, loom::tp_kind::d2_5, loom::tp_kind::d3}) {
      const loom::plan_result* best = fastest(rep, [&](const loom::plan_config& k) { return k.tp_grid == kind; });
      print_best(rep, best,
                 best == nullptr ? "" : std::to_string(best->config.dp) + ", " + loom::plan_io::tp_label(best->config) + ", " + std::to_string(best->config.pp));
    }
    std::printf("\n");
  }
  std::printf("\n%s", loom::plan_io::table(g16, 8).c_str());
  // Context parallelism: the fastest configuration of each kind per sequence length, the tokens
  // per step held at 512 x 4096.
  loom::plan_options co = go;
  co.context = true;
  std::printf("\n| sequence | sequences per step | no cp (dp, cp, tp, pp) | step (s) | Ulysses | step (s) | ring attention | step (s) | USP | step (s) "
              "| TokenRing | step (s) |\n|---:|---:|:--|---:|:--|---:|:--|---:|:--|---:|:--|---:|\n");
  loom::plan_report c32;
  for (long long seq : {8192LL, 16384LL, 32768LL}) {
    loom::model_desc d = m.desc;
    d.seq = seq;
    d.global_batch = 512 * 4096 / seq;
    const loom::plan_report rep = loom::plan(d, c.desc, co);
    if (seq == 32768) c32 = rep;
    std::printf("| %lld | %lld |", seq, d.global_batch);
    for (loom::context_kind kind : {loom::context_kind::none, loom::context_kind::ulysses, loom::context_kind::ring, loom::context_kind::usp,
                                    loom::context_kind::tokenring})
      print_kind(rep, kind);
    std::printf("\n");
  }
  std::printf("\n%s", loom::plan_io::table(c32, 6).c_str());
  // A spatial-temporal model (docs/plan/st-dit.model.json) at 256, 1024 and 4096 patches per
  // frame, 64 frames, the tokens per step held at 128 x 65536: the fastest of each kind, DSP too.
  const auto st = loom::plan_io::read_model(dir + "st-dit.model.json");
  std::printf("\n| patches per frame | sequence | sequences per step | no cp (dp, cp, tp, pp) | step (s) | Ulysses | step (s) | ring attention "
              "| step (s) | USP | step (s) | TokenRing | step (s) | DSP | step (s) |\n"
              "|---:|---:|---:|:--|---:|:--|---:|:--|---:|:--|---:|:--|---:|:--|---:|\n");
  loom::plan_report st1024;
  for (long long patches : {256LL, 1024LL, 4096LL}) {
    loom::model_desc d = st.desc;
    d.seq = d.frames * patches;
    d.global_batch = 128 * 65536 / d.seq;
    const loom::plan_report rep = loom::plan(d, c.desc, co);
    if (patches == 1024) st1024 = rep;
    std::printf("| %lld | %lld | %lld |", patches, d.seq, d.global_batch);
    for (loom::context_kind kind : {loom::context_kind::none, loom::context_kind::ulysses, loom::context_kind::ring, loom::context_kind::usp,
                                    loom::context_kind::tokenring, loom::context_kind::dsp})
      print_kind(rep, kind);
    std::printf("\n");
  }
  std::printf("\n%s", loom::plan_io::table(st1024, 6).c_str());
}
