// The README's walk-through as a user types it: every `./build/bin/zenflow ...` line of its
// ```sh blocks, in order, in a scratch directory (the current directory of each), with
// ./build/bin/zenflow this build's binary and examples/ the source tree's. Lines that need
// what a scratch directory cannot give (a running service, a placeholder to fill in, a
// process in the background, `zenflow up`, a benchmark's minutes) are skipped and listed
// with the reason. Each line run must exit 0; the checkpoints must land under the scratch
// directory, and the source tree must get no runs/ of its own.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const std::string kSource = ZENFLOW_SOURCE_DIR;
const std::string kBinary = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";
const std::string kPrefix = "./build/bin/zenflow ";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The commands of the README's ```sh blocks, in order: continuation lines (ending in `\`)
// joined, blank lines and comment lines dropped.
std::vector<std::string> sh_commands(const std::string& markdown) {
  std::vector<std::string> out;
  std::istringstream in(markdown);
  bool in_sh = false;
  std::string pending;
  for (std::string line; std::getline(in, line);) {
    const std::string t = trim(line);
    if (t.rfind("```", 0) == 0) {
      in_sh = !in_sh && t == "```sh";
      pending.clear();
      continue;
    }
    if (!in_sh) continue;
    if (!pending.empty()) {
      pending += " " + t;
    } else if (t.empty() || t[0] == '#') {
      continue;
    } else {
      pending = t;
    }
    if (!pending.empty() && pending.back() == '\\') {
      pending.pop_back();
      pending = trim(pending);
      continue;
    }
    out.push_back(pending);
    pending.clear();
  }
  return out;
}

// Why `command` (a line that starts with ./build/bin/zenflow) cannot run in a scratch
// directory, or "" when it can.
std::string skip_reason(const std::string& command) {
  const std::string code = trim(command.substr(0, command.find(" #")));  // the comment is not the command
  if (code.back() == '&' && code.find("&&") != code.size() - 2) return "runs in the background (&)";
  // Each command of the line (`a; b`, `a && b`) by its verb.
  std::string separated = code;
  for (size_t at = separated.find("&&"); at != std::string::npos; at = separated.find("&&", at)) separated.replace(at, 2, ";");
  std::istringstream parts(separated);
  static const std::set<std::string> service = {"submit", "jobs", "status", "watch", "logs", "cancel", "workers"};
  for (std::string part; std::getline(parts, part, ';');) {
    std::istringstream words(part);
    std::string program, verb;
    words >> program >> verb;
    if (verb == "up") return "zenflow up runs the service until Ctrl-C";
    if (service.count(verb)) return "needs a running service";
    if (verb == "bench") return "a benchmark (minutes; zenflow bench has tests of its own)";
  }
  if (code.find("--coordinator") != std::string::npos) return "needs a running service";
  for (const char* placeholder : {"HOST:PORT", "PORT", "JOB_ID", "RUN_DIR", "JOB.yaml"})
    if (code.find(placeholder) != std::string::npos) return std::string("placeholder ") + placeholder;
  return "";
}

// The line as this build runs it: the built binary, the source tree's examples/.
std::string localized(const std::string& command) {
  std::string out = command;
  for (size_t at = out.find(kPrefix); at != std::string::npos; at = out.find(kPrefix, at + kBinary.size()))
    out.replace(at, kPrefix.size() - 1, kBinary);
  for (size_t at = out.find(" examples/"); at != std::string::npos; at = out.find(" examples/", at + 1))
    out.replace(at + 1, 0, kSource + "/");
  return out;
}

// Every entry under `dir` (relative), or {} when it does not exist.
std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.insert(fs::relative(it->path(), dir).string());
  return out;
}

}  // namespace

TEST(Readme, TheSectionsCommandsAreFound) {
  const std::vector<std::string> commands = sh_commands(read_file(kSource + "/README.md"));
  int zenflow_lines = 0;
  for (const std::string& c : commands) zenflow_lines += c.rfind(kPrefix, 0) == 0 ? 1 : 0;
  EXPECT_GE(zenflow_lines, 10);
  // Continuations are joined: the optimizer-node example is one command.
  bool joined = false;
  for (const std::string& c : commands)
    joined |= c.find("optimizer.host.addresses=[127.0.0.1:PORT]' --set optimizer.host.token_file=node.token") !=
              std::string::npos;
  EXPECT_TRUE(joined);
  EXPECT_EQ(skip_reason("./build/bin/zenflow run examples/tiny.yaml --metrics-port 9400 &"),
            "runs in the background (&)");
  EXPECT_EQ(skip_reason("./build/bin/zenflow run examples/tiny.yaml   # a comment & more"), "");
  EXPECT_EQ(skip_reason("./build/bin/zenflow jobs; ./build/bin/zenflow workers"), "needs a running service");
  EXPECT_EQ(skip_reason("./build/bin/zenflow report x && ./build/bin/zenflow status j-1"), "needs a running service");
  EXPECT_EQ(localized("./build/bin/zenflow a; ./build/bin/zenflow b"), kBinary + " a; " + kBinary + " b");
  EXPECT_EQ(localized("./build/bin/zenflow run examples/tiny.yaml --fresh"),
            kBinary + " run " + kSource + "/examples/tiny.yaml --fresh");
}

TEST(Readme, TheWalkThroughRunsInOrderInAScratchDirectory) {
  const fs::path scratch =
      fs::temp_directory_path() / ("zenflow-readme-" + std::to_string(::getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path logs = scratch / ".logs";
  fs::create_directories(logs);
  const std::set<std::string> source_runs = entries(kSource + "/runs"),
                              example_runs = entries(kSource + "/examples/runs");

  const std::vector<std::string> commands = sh_commands(read_file(kSource + "/README.md"));
  const auto t0 = std::chrono::steady_clock::now();
  int ran = 0, n = 0;
  for (const std::string& command : commands) {
    if (command.rfind(kPrefix, 0) != 0) continue;  // not a zenflow line: install, build, curl, docker, ...
    ++n;
    const std::string why = skip_reason(command);
    if (!why.empty()) {
      std::printf("[ SKIPPED  ] %s\n             (%s)\n", command.c_str(), why.c_str());
      continue;
    }
    const fs::path script = logs / ("line-" + std::to_string(n) + ".sh"), log = logs / ("line-" + std::to_string(n) + ".log");
    std::ofstream(script) << "cd '" << scratch.string() << "' || exit 99\n" << localized(command) << "\n";
    const auto t = std::chrono::steady_clock::now();
    const int status = std::system(("bash '" + script.string() + "' > '" + log.string() + "' 2>&1").c_str());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    std::printf("[ RAN      ] %s\n             (%.1f s, exit %d)\n", command.c_str(), seconds,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    std::fflush(stdout);
    ++ran;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << command << "\nfailed in " << scratch << ":\n" << read_file(log);
  }
  std::printf("[ README   ] %d lines run in %.0f s\n", ran,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_GE(ran, 6);
  // The checkpoints are the scratch directory's, and the source tree got none.
  bool any_step = false;
  for (const std::string& e : entries(scratch / "runs" / "tiny-demo")) any_step |= e.rfind("step-", 0) == 0;
  EXPECT_TRUE(any_step) << "no checkpoint under " << scratch / "runs" / "tiny-demo";
  EXPECT_TRUE(fs::exists(scratch / "runs" / "tiny-demo" / "profile.yaml"));
  EXPECT_EQ(entries(kSource + "/runs"), source_runs) << "the walk-through wrote into " << kSource << "/runs";
  EXPECT_EQ(entries(kSource + "/examples/runs"), example_runs);
  if (!HasFailure()) fs::remove_all(scratch);
}
