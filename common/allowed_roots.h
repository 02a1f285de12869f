// Allowed roots: the directories a worker lets the job specs it runs read or write
// (zenflow-worker --allowed-root; its work dir always among them). One rule, two places: the
// worker's ranks apply it to paths with their symlinks resolved (job_spec.h,
// check_allowed_roots), the coordinator's placement to the paths as written, because it
// cannot resolve a worker's symlinks (scheduler.h, WorkerView::allowed_roots). Header-only:
// the scheduler links nothing but itself.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace zenflow {

// What a worker may advertise at registration (RegisterWorkerRequest.allowed_roots).
constexpr size_t kMaxAllowedRoots = 64;
constexpr size_t kMaxAllowedRootBytes = 4096;

// Whether `path` is `root` or lies below it, compared component by component after lexical
// normalization: "/data" covers "/data", "/data/x" and "/data/x/../y", never "/database" nor
// "/data/../etc"; "/" covers every absolute path; a relative path is under no absolute root.
// No system call: the caller resolves symlinks first where it can.
inline bool path_within(const std::filesystem::path& path, const std::filesystem::path& root) {
  const std::filesystem::path p = path.lexically_normal(), r = root.lexically_normal();
  auto q = p.begin();
  for (auto it = r.begin(); it != r.end(); ++it, ++q) {
    if (it->empty()) continue;  // a trailing separator
    if (q == p.end() || *q != *it) return false;
  }
  return true;
}

// Whether `root` is in the form a worker advertises its roots in: absolute, in normal form
// (no "." or ".." component, no repeated or trailing '/', but for "/" itself), and without a
// ':' (the separator of ZENFLOW_ALLOWED_ROOTS, through which the agent hands them to its
// ranks). Length and printability are the caller's to check.
inline bool is_normal_root(const std::string& root) {
  const std::filesystem::path p(root);
  if (!p.is_absolute() || root.find(':') != std::string::npos) return false;
  if (root == "/") return true;
  return root.back() != '/' && p.lexically_normal().string() == root;
}

}  // namespace zenflow
