// The TCP sockets a process listens on, read from /proc, for tests that check where a
// component (UCX's own transports above all) opens a port.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace zenflow::test_support {

// The address of every TCP socket a process (this one, or the PID given) listens on
// ("127.0.0.1:PORT").
inline std::vector<std::string> listening_sockets(const std::string& pid = "self") {
  const std::string proc = "/proc/" + pid;
  std::set<std::string> inodes;
  if (DIR* d = opendir((proc + "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      char link[64] = {};
      const std::string path = proc + "/fd/" + e->d_name;
      if (readlink(path.c_str(), link, sizeof link - 1) > 0 && std::strncmp(link, "socket:[", 8) == 0)
        inodes.insert(std::string(link + 8, std::strlen(link) - 9));
    }
    closedir(d);
  }
  std::vector<std::string> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      const size_t colon = local.find(':');
      const std::string hex_ip = local.substr(0, colon);
      const int port = std::stoi(local.substr(colon + 1), nullptr, 16);
      std::string ip;
      if (hex_ip.size() == 8) {  // little-endian IPv4
        const unsigned v = static_cast<unsigned>(std::stoul(hex_ip, nullptr, 16));
        ip = std::to_string(v & 0xff) + "." + std::to_string((v >> 8) & 0xff) + "." +
             std::to_string((v >> 16) & 0xff) + "." + std::to_string(v >> 24);
      } else {
        ip = hex_ip == "00000000000000000000000001000000" ? "::1" : "[" + hex_ip + "]";
      }
      out.push_back(ip + ":" + std::to_string(port));
    }
  }
  return out;
}

// Whether this host has an IPv4 address other than loopback (else "only on lo" checks nothing).
inline bool has_non_loopback_ipv4() {
  ifaddrs* ifs = nullptr;
  bool found = false;
  if (getifaddrs(&ifs) != 0) return false;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr != htonl(INADDR_LOOPBACK))
      found = true;
  freeifaddrs(ifs);
  return found;
}

// One IPv4 address of this host other than loopback ("" when none).
inline std::string non_loopback_ipv4() {
  ifaddrs* ifs = nullptr;
  std::string out;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr != htonl(INADDR_LOOPBACK)) {
      char text[INET_ADDRSTRLEN] = {};
      if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) out = text;
    }
  freeifaddrs(ifs);
  return out;
}

}  // namespace zenflow::test_support
