#include "server/issued_ids.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "server/store.h"

namespace zenflow::server {
namespace {

constexpr const char* kHeader = "zenflow-coordinator issued ids v1";

void sync_fd(int fd, const std::string& what) {
  if (::fsync(fd) != 0) throw StoreError(what + ": fsync: " + std::strerror(errno));
}

}  // namespace

IssuedIds::IssuedIds(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_);
  if (!in) {
    if (errno == ENOENT) return;
    throw StoreError(path_ + ": cannot read: " + std::strerror(errno));
  }
  std::string header;
  std::getline(in, header);
  if (header != kHeader) throw StoreError(path_ + ": not a file of issued ids (first line \"" + header + "\")");
  std::map<std::string, int64_t*> fields = {{"starts", &marks_.starts},
                                            {"job_seq_ceiling", &marks_.job_seq_ceiling},
                                            {"job_seq_issued", &marks_.job_seq_issued},
                                            {"incarnation_ceiling", &marks_.incarnation_ceiling}};
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    auto it = fields.find(key);
    if (it == fields.end()) throw StoreError(path_ + ": unknown field \"" + key + "\"");
    *it->second = value;
  }
  if (!in.eof()) throw StoreError(path_ + ": malformed (a field without an integer value)");
}

void IssuedIds::write(const IssuedMarks& m) {
  std::ostringstream text;
  text << kHeader << "\nstarts " << m.starts << "\njob_seq_ceiling " << m.job_seq_ceiling << "\njob_seq_issued "
       << m.job_seq_issued << "\nincarnation_ceiling " << m.incarnation_ceiling << "\n";
  const std::string data = text.str();
  const std::string tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw StoreError(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw StoreError(tmp + ": cannot write: " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  try {
    sync_fd(fd, tmp);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0)
    throw StoreError(path_ + ": cannot replace: " + std::strerror(errno));
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw StoreError(dir + ": cannot open to sync: " + std::strerror(errno));
  try {
    sync_fd(dfd, dir);
  } catch (...) {
    ::close(dfd);
    throw;
  }
  ::close(dfd);
  marks_ = m;
}

}  // namespace zenflow::server
