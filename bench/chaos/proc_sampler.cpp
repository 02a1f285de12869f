// /proc sampling of rank processes (proc_sampler.h).
#include "bench/chaos/proc_sampler.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace zenflow::chaos {
namespace {

// The whole of a /proc file ("" when it cannot be read: the process is gone).
std::string read_proc_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

std::optional<RankProcess> rank_from_environ(int pid, std::string_view env) {
  std::optional<std::string> job, attempt;
  size_t at = 0;
  while (at < env.size()) {
    size_t end = env.find('\0', at);
    if (end == std::string_view::npos) end = env.size();
    const std::string_view kv = env.substr(at, end - at);
    if (kv.rfind("ZENFLOW_JOB_ID=", 0) == 0) job = std::string(kv.substr(15));
    if (kv.rfind("ZENFLOW_ATTEMPT=", 0) == 0) attempt = std::string(kv.substr(16));
    at = end + 1;
  }
  if (!job || job->empty() || !attempt || attempt->empty() ||
      attempt->find_first_not_of("0123456789") != std::string::npos || attempt->size() > 18)
    return std::nullopt;
  RankProcess p;
  p.pid = pid;
  p.job_id = *job;
  p.attempt = std::strtoll(attempt->c_str(), nullptr, 10);
  return p;
}

char state_from_stat(std::string_view stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size() || stat[close + 1] != ' ') return '?';
  return stat[close + 2];
}

std::vector<RankProcess> sample_rank_processes(const std::string& marker) {
  std::vector<RankProcess> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  const std::string self = std::to_string(::getpid());
  while (const dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos || name == self) continue;
    const std::string base = "/proc/" + name;
    const std::string cmdline = read_proc_file(base + "/cmdline");
    if (cmdline.find(marker) == std::string::npos) continue;
    std::optional<RankProcess> p =
        rank_from_environ(std::atoi(name.c_str()), read_proc_file(base + "/environ"));
    if (!p) continue;
    const std::string stat = read_proc_file(base + "/stat");
    if (stat.empty()) continue;  // gone between the reads
    p->state = state_from_stat(stat);
    out.push_back(*p);
  }
  ::closedir(proc);
  return out;
}

}  // namespace zenflow::chaos
