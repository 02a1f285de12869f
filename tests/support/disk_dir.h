// A fresh directory under the build directory, removed when the test ends. Not /tmp: that
// may be a tmpfs, where an fsync costs nothing and commit timings would mean nothing.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>

#include "common/remove_tree.h"

namespace zenflow::test_support {

class DiskDir {
 public:
  // `tag` names it: BINARY_DIR/TAG.XXXXXX.
  explicit DiskDir(const std::string& tag) {
    std::string pattern = std::string(ZENFLOW_BINARY_DIR) + "/" + tag + ".XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    path_ = pattern;
  }
  ~DiskDir() {
    std::error_code ec;
    zenflow::remove_tree(path_, ec);
  }
  DiskDir(const DiskDir&) = delete;
  DiskDir& operator=(const DiskDir&) = delete;
  const std::string& path() const { return path_; }
  std::string db() const { return path_ + "/coordinator.db"; }

 private:
  std::string path_;
};

}  // namespace zenflow::test_support
