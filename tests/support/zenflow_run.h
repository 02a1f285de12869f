// Test helper: `zenflow run SPEC --json` with N local ranks, read back as JSON.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/shell.h"

namespace zenflow::test_support {

// Runs `zenflow run SPEC --quiet --json --nproc N FLAGS`; returns rank 0's summary, with
// its exit status in "exit" and its standard error in "stderr" (SPEC.stderr keeps it).
inline nlohmann::json run_json(const std::string& spec_path, int nproc, const std::string& flags) {
  const std::string err = spec_path + ".stderr";
  const std::string cmd = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow run " + spec_path +
                          " --quiet --json --nproc " + std::to_string(nproc) + " " + flags + " 2>" + err;
  std::string out;
  const int rc = run(cmd, &out);
  nlohmann::json j = rc == 0 ? nlohmann::json::parse(out) : nlohmann::json::object();
  j["exit"] = rc;
  std::ifstream in(err);
  j["stderr"] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return j;
}

}  // namespace zenflow::test_support
