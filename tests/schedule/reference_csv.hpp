// SPDX-FileCopyrightText: 2026 loom authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The data lines of a reference CSV in tests/schedule/data/ (every line but the empty ones and the
// '#' comments of its header), for the tests and doc tables that compare loom with a peer's code.
#include <fstream>
#include <string>
#include <vector>

namespace loom_ref {

//! The non-empty, non-comment lines of the file at `path` (empty when it cannot be read).
inline std::vector<std::string> data_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.push_back(line);
  return out;
}

}  // namespace loom_ref
