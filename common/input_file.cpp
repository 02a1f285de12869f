// Safe reads of user-named files (see input_file.h).
#include "common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace zenflow {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  else if (v == static_cast<double>(static_cast<int64_t>(v)))
    std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(v), units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string describe_file_type(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    case S_IFREG: return "a regular file";
    default: return "not a regular file";
  }
}

namespace {

[[noreturn]] void throw_errno(const std::string& path, int err) {
  if (err == ENOENT) throw InputError(path, "no such file or directory");
  if (err == EACCES) throw InputError(path, "permission denied");
  if (err == ENOTDIR) throw InputError(path, "a component of the path is not a directory");
  if (err == ELOOP) throw InputError(path, "too many levels of symbolic links");
  if (err == ENAMETOOLONG) throw InputError(path, "path too long");
  throw InputError(path, std::strerror(err));
}

void check_stat(const std::string& path, const struct stat& st, int64_t max_bytes, const std::string& what) {
  if (!S_ISREG(st.st_mode)) throw InputError(path, "is " + describe_file_type(st.st_mode) + ", expected a regular file");
  if (max_bytes >= 0 && st.st_size > max_bytes)
    throw InputError(path, "is " + format_bytes(st.st_size) + ", larger than the " + format_bytes(max_bytes) +
                               " limit for " + what);
}

}  // namespace

void require_regular_file(const std::string& path) {
  if (path.empty()) throw InputError("''", "empty path");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw_errno(path, errno);
  check_stat(path, st, -1, "");
}

int open_regular_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  if (path.empty()) throw InputError("''", "empty path");
  // stat first: opening a FIFO or a device can block or have side effects.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw_errno(path, errno);
  check_stat(path, st, max_bytes, what);
  // O_NONBLOCK: if the path is swapped for a FIFO after the stat, open does not block.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw_errno(path, errno);
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_errno(path, err);
  }
  try {
    check_stat(path, st, max_bytes, what);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  const int fd = open_regular_file(path, max_bytes, what);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_errno(path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (max_bytes >= 0 && static_cast<int64_t>(out.size()) > max_bytes) {
      ::close(fd);
      throw InputError(path, "grew past the " + format_bytes(max_bytes) + " limit for " + what + " while being read");
    }
  }
  ::close(fd);
  return out;
}

}  // namespace zenflow
