// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the `loom` command line, in process. The input is the argument list (NUL-separated
// words) and, after an empty word, the contents of the file `in.csv` that the arguments may name
// (`--torch-csv in.csv`). The run happens in a private temporary directory, and every '/' in a
// word becomes '_', so no file outside it is read or written. Every input must exit 0, or exit 2
// with exactly one line on stderr starting "loom: ", or exit 1 with one line saying the (imported)
// schedule is not valid (docs/cli.md); an internal error, running out of memory or anything else
// fails.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_bytes.hpp"
#include "fuzz_support.hpp"

#define main loom_cli_main
#include "../../tools/loom/main.cpp"
#undef main

namespace {

// The private working directory, made once per process.
const std::string& sandbox() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/loom-fuzz-cli-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    if (d == nullptr || ::chdir(d) != 0) loom_fuzz::fail("cannot make the sandbox directory");
    return std::string(d);
  }();
  return dir;
}

std::string slurp(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs loom_cli_main with stdout to /dev/null and stderr to a file; returns (code, stderr).
std::pair<int, std::string> run(std::vector<std::string> words) {
  std::vector<char*> argv;
  std::string prog = "loom";
  argv.push_back(prog.data());
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const int out = ::dup(1), err = ::dup(2);
  const int null = ::open("/dev/null", O_WRONLY);
  const int errf = ::open(".loom-fuzz-stderr", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out < 0 || err < 0 || null < 0 || errf < 0) loom_fuzz::fail("cannot redirect the standard streams");
  ::dup2(null, 1);
  ::dup2(errf, 2);
  std::clearerr(stdout);
  const int code = loom_cli_main(static_cast<int>(argv.size()) - 1, argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  std::clearerr(stdout);
  ::dup2(out, 1);
  ::dup2(err, 2);
  ::close(out);
  ::close(err);
  ::close(null);
  ::close(errf);
  return {code, slurp(".loom-fuzz-stderr")};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom_fuzz;
  (void)sandbox();
  bytes in(data, size);
  std::vector<std::string> words;
  while (!in.empty() && words.size() < 24) {
    std::string w(in.token(256));
    if (w.empty()) break;
    for (char& c : w)
      if (c == '/') c = '_';
    words.push_back(std::move(w));
  }
  {
    std::ofstream f("in.csv", std::ios::binary | std::ios::trunc);
    std::string_view rest = in.rest();
    f.write(rest.data(), static_cast<std::streamsize>(rest.size()));
  }
  auto [code, err] = run(words);
  std::string shown;
  for (auto const& w : words) shown += w + ' ';
  if (code == 0) return 0;
  // Exit 1 is documented for a well-formed input whose schedule is invalid (an imported one);
  // an internal error or running out of memory is a finding.
  const bool invalid_schedule = code == 1 && err.rfind("loom: schedule '", 0) == 0 && err.find("' is not valid: ") != std::string::npos;
  expect(code == 2 || invalid_schedule, "exit status is neither 0, 2, nor 1 for an invalid schedule", shown + "| " + err);
  expect(err.rfind("loom: ", 0) == 0, "stderr does not start with 'loom: '", shown + "| " + err);
  expect(!err.empty() && err.back() == '\n' && err.find('\n') == err.size() - 1, "stderr is not exactly one line",
         shown + "| " + err);
  return 0;
}
