// Recursive removal of a directory tree, without std::filesystem::remove_all.
//
// PyTorch wheels export their own copy of libstdc++'s std::filesystem::remove_all, and a
// process linking that LibTorch binds to it and crashes in it (seen on the GPU host:
// SIGSEGV at address 0 inside libtorch.so). Everything in zenflow removes trees through
// this function instead. Header-only so that every library can use it.
#pragma once

#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace zenflow {

namespace detail {
inline int remove_tree_entry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}
}  // namespace detail

// Removes `path` and everything below it (links are removed, not followed). A missing
// path is not an error. Returns false and sets `ec` on failure.
inline bool remove_tree(const std::filesystem::path& path, std::error_code& ec) {
  ec.clear();
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return errno == ENOENT;
  }
  if (::nftw(path.c_str(), detail::remove_tree_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    ec.assign(errno ? errno : EIO, std::generic_category());
    return false;
  }
  return true;
}

// Throwing variant: std::filesystem::filesystem_error naming the path.
inline void remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  if (!remove_tree(path, ec)) throw std::filesystem::filesystem_error("remove_tree", path, ec);
}

}  // namespace zenflow
