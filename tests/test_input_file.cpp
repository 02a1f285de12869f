// common/input_file.h (regular files only, bounded sizes, never blocking) and common/crc32c.h.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/crc32c.h"
#include "common/input_file.h"
#include "tests/support/bounded_call.h"
#include "tests/support/shell.h"

namespace fs = std::filesystem;
using zenflow::InputError;
using zenflow::test_support::call_within;
using zenflow::test_support::CallOutcome;
using zenflow::test_support::make_fifo;
using zenflow::test_support::write_file;

namespace {

// Under /tmp rather than the build tree: a Unix socket's path must fit in sun_path.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/zenflow-input-file-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    if (made == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// Each entry point on `path`, each bounded: all must refuse it the same way.
void expect_refused(const fs::path& path, const std::string& reason) {
  const std::string p = path.string();
  const std::string want = p + ": " + reason;
  const CallOutcome calls[] = {
      call_within([p] { zenflow::read_regular_file(p, 1 << 20, "a test file"); }),
      call_within([p] { ::close(zenflow::open_regular_file(p)); }),
      call_within([p] { zenflow::require_regular_file(p); }),
      call_within([p] { zenflow::checksum_file(p); }),
  };
  const char* names[] = {"read_regular_file", "open_regular_file", "require_regular_file", "checksum_file"};
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(calls[i].returned) << calls[i].message;
    EXPECT_TRUE(calls[i].input_error) << calls[i].message;
    EXPECT_EQ(calls[i].message, want);
  }
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen() & 0xFF);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------
// input_file.h

TEST(InputFile, ReadsARegularFileWholeAndReturnsABlockingCloseOnExecDescriptor) {
  TempDir dir;
  const std::string text = random_bytes(200'000, 1);  // several read() calls
  write_file(dir / "data.bin", text);
  EXPECT_EQ(zenflow::read_regular_file((dir / "data.bin").string(), -1, "a test file"), text);
  EXPECT_EQ(zenflow::read_regular_file((dir / "data.bin").string(), 200'000, "a test file"), text);
  write_file(dir / "empty", "");
  EXPECT_EQ(zenflow::read_regular_file((dir / "empty").string(), 0, "a test file"), "");

  const int fd = zenflow::open_regular_file((dir / "data.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "the caller gets ordinary blocking reads";
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  ::close(fd);
  EXPECT_NO_THROW(zenflow::require_regular_file((dir / "data.bin").string()));
}

TEST(InputFile, FifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const fs::path fifo = dir / "tokenizer.json";
  ASSERT_EQ(make_fifo(fifo), "");
  // No writer ever opens it: a blocking open() or read() would never return.
  expect_refused(fifo, "is a FIFO, expected a regular file");
}

TEST(InputFile, DirectoryIsRefusedByPath) {
  TempDir dir;
  fs::create_directory(dir / "config.json");
  expect_refused(dir / "config.json", "is a directory, expected a regular file");
}

TEST(InputFile, DevicesAreRefused) {
  expect_refused("/dev/null", "is a character device, expected a regular file");
  // /dev/zero would never end: it must be refused before any read.
  expect_refused("/dev/zero", "is a character device, expected a regular file");
}

TEST(InputFile, SocketIsRefused) {
  TempDir dir;
  const fs::path path = dir / "s";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  expect_refused(path, "is a socket, expected a regular file");
  ::close(fd);
}

TEST(InputFile, MissingFileAndBadPathsNameThePath) {
  TempDir dir;
  expect_refused(dir / "nope.json", "no such file or directory");
  write_file(dir / "file", "x");
  expect_refused(dir / "file" / "below", "a component of the path is not a directory");
  try {
    zenflow::read_regular_file("", 10, "a test file");
    ADD_FAILURE() << "an empty path was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "'': empty path");
  }
}

TEST(InputFile, PermissionDeniedIsNamed) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  write_file(dir / "secret", "x");
  fs::permissions(dir / "secret", fs::perms::none);
  try {
    zenflow::read_regular_file((dir / "secret").string(), 10, "a test file");
    ADD_FAILURE() << "an unreadable file was read";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "secret").string() + ": permission denied");
    EXPECT_EQ(e.path(), (dir / "secret").string());
  }
}

TEST(InputFile, FileOverTheLimitIsRefusedBeforeAnyRead) {
  TempDir dir;
  const fs::path big = dir / "config.json";
  write_file(big, "");
  fs::resize_file(big, 5 << 20);  // sparse: nothing is written
  const CallOutcome o =
      call_within([p = big.string()] { zenflow::read_regular_file(p, zenflow::kMaxConfigBytes, "a config.json"); });
  ASSERT_TRUE(o.returned) << o.message;
  EXPECT_TRUE(o.input_error) << o.message;
  EXPECT_EQ(o.message, big.string() + ": is 5 MiB, larger than the 4 MiB limit for a config.json");

  try {
    ::close(zenflow::open_regular_file(big.string(), (5 << 20) - 1, "a test file"));
    ADD_FAILURE() << "a file one byte over the limit was opened";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(big.string() + ": is 5 MiB, larger than the ", 0), 0u) << what;
    EXPECT_NE(what.find(" limit for a test file"), std::string::npos) << what;
  }
  // Exactly at the limit is allowed; no limit at all is -1.
  EXPECT_EQ(zenflow::read_regular_file(big.string(), 5 << 20, "a test file").size(), size_t{5} << 20);
  EXPECT_EQ(zenflow::read_regular_file(big.string(), -1, "a test file").size(), size_t{5} << 20);
  // checksum_file has no limit either.
  EXPECT_EQ(zenflow::checksum_file(big.string()).bytes, int64_t{5} << 20);
}

TEST(InputFile, SymlinkToARegularFileIsFollowed) {
  TempDir dir;
  write_file(dir / "real.json", "{}");
  fs::create_symlink(dir / "real.json", dir / "link.json");
  EXPECT_EQ(zenflow::read_regular_file((dir / "link.json").string(), 10, "a test file"), "{}");
  EXPECT_NO_THROW(zenflow::require_regular_file((dir / "link.json").string()));
  // The limit applies to the target, not to the link.
  try {
    zenflow::read_regular_file((dir / "link.json").string(), 1, "a test file");
    ADD_FAILURE() << "the link's target is over the limit";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "link.json").string() + ": is 2 bytes, larger than the 1 bytes limit for a test file");
  }
}

TEST(InputFile, SymlinkToAFifoOrNowhereIsRefused) {
  TempDir dir;
  ASSERT_EQ(make_fifo(dir / "fifo"), "");
  fs::create_symlink(dir / "fifo", dir / "model.safetensors");
  expect_refused(dir / "model.safetensors", "is a FIFO, expected a regular file");
  fs::create_symlink(dir / "gone", dir / "dangling");
  expect_refused(dir / "dangling", "no such file or directory");
  fs::create_symlink("/dev/zero", dir / "zero");
  expect_refused(dir / "zero", "is a character device, expected a regular file");
}

TEST(InputFile, FormatBytesAndFileTypes) {
  EXPECT_EQ(zenflow::format_bytes(0), "0 bytes");
  EXPECT_EQ(zenflow::format_bytes(1023), "1023 bytes");
  EXPECT_EQ(zenflow::format_bytes(1024), "1 KiB");
  EXPECT_EQ(zenflow::format_bytes(zenflow::kMaxTokenizerBytes), "64 MiB");
  EXPECT_EQ(zenflow::format_bytes(3'435'973'837), "3.2 GiB");
  EXPECT_EQ(zenflow::describe_file_type(S_IFDIR | 0755), "a directory");
  EXPECT_EQ(zenflow::describe_file_type(S_IFBLK), "a block device");
  EXPECT_EQ(zenflow::describe_file_type(S_IFREG | 0644), "a regular file");
}

// ---------------------------------------------------------------------------------
// crc32c.h

TEST(Crc32c, KnownVectors) {
  const std::string check = "123456789";
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  // The check value of the CRC-32C catalogue, and RFC 3720 (iSCSI) appendix B.4.
  const std::pair<const std::string*, uint32_t> vectors[] = {
      {&check, 0xe3069283u}, {&zeros, 0x8a9136aau},     {&ones, 0x62a8ab43u},
      {&ascending, 0x46dd794eu}, {&descending, 0x113fdb5cu},
  };
  for (const auto& [data, want] : vectors) {
    EXPECT_EQ(zenflow::crc32c(data->data(), data->size()), want) << zenflow::crc32c_hex(want);
    EXPECT_EQ(zenflow::crc32c_extend_portable(0, data->data(), data->size()), want) << zenflow::crc32c_hex(want);
  }
  EXPECT_EQ(zenflow::crc32c("", 0), 0u);
  EXPECT_EQ(zenflow::crc32c(nullptr, 0), 0u);
  EXPECT_EQ(zenflow::crc32c_extend_portable(0, nullptr, 0), 0u);
  EXPECT_EQ(zenflow::crc32c_extend(0x12345678u, nullptr, 0), 0x12345678u);
  EXPECT_EQ(zenflow::crc32c_hex(0xe3069283u), "e3069283");
  EXPECT_EQ(zenflow::crc32c_hex(1), "00000001");
}

TEST(Crc32c, HardwarePathEqualsPortableOverLengthsAndAlignments) {
  std::cout << "crc32c_hardware() = " << zenflow::crc32c_hardware() << "\n";
  const std::string buf = random_bytes(70'000, 7);
  std::mt19937 gen(11);
  int compared = 0;
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      const char* p = buf.data() + offset;
      ASSERT_EQ(zenflow::crc32c(p, n), zenflow::crc32c_extend_portable(0, p, n))
          << "offset " << offset << ", length " << n;
      ++compared;
    }
    for (size_t n : {4095, 4096, 4097, 65536, 69'000}) {
      const uint32_t seed = static_cast<uint32_t>(gen());  // a non-zero starting crc too
      ASSERT_EQ(zenflow::crc32c_extend(seed, buf.data() + offset, n),
                zenflow::crc32c_extend_portable(seed, buf.data() + offset, n))
          << "offset " << offset << ", length " << n;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 16 * (301 + 5));
}

TEST(Crc32c, ExtendOverSplitBuffersEqualsOneCall) {
  const std::string buf = random_bytes(10'000, 3);
  const uint32_t whole = zenflow::crc32c(buf.data(), buf.size());
  std::mt19937 gen(5);
  for (int trial = 0; trial < 200; ++trial) {
    // Up to 5 pieces at random cuts, alternating the two implementations.
    std::vector<size_t> cuts = {0, buf.size()};
    const int pieces = 1 + static_cast<int>(gen() % 5);
    for (int k = 1; k < pieces; ++k) cuts.push_back(gen() % (buf.size() + 1));
    std::sort(cuts.begin(), cuts.end());
    uint32_t crc = 0;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const char* p = buf.data() + cuts[k];
      const size_t n = cuts[k + 1] - cuts[k];
      crc = k % 2 ? zenflow::crc32c_extend_portable(crc, p, n) : zenflow::crc32c_extend(crc, p, n);
    }
    ASSERT_EQ(crc, whole) << "trial " << trial;
  }
  // Byte by byte.
  uint32_t crc = 0;
  for (char c : buf) crc = zenflow::crc32c_extend(crc, &c, 1);
  EXPECT_EQ(crc, whole);
}

TEST(Crc32c, ChecksumFileEqualsTheBytes) {
  TempDir dir;
  // Larger than checksum_file's 4 MiB block, and not a multiple of it.
  const std::string bytes = random_bytes((9 << 20) + 123, 9);
  write_file(dir / "shard.safetensors", bytes);
  const zenflow::FileChecksum sum = zenflow::checksum_file((dir / "shard.safetensors").string());
  EXPECT_EQ(sum.bytes, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(sum.crc32c, zenflow::crc32c(bytes.data(), bytes.size()));
  EXPECT_EQ(sum.crc32c, zenflow::crc32c_extend_portable(0, bytes.data(), bytes.size()));

  write_file(dir / "empty", "");
  const zenflow::FileChecksum empty = zenflow::checksum_file((dir / "empty").string());
  EXPECT_EQ(empty.bytes, 0);
  EXPECT_EQ(empty.crc32c, 0u);
  write_file(dir / "check", "123456789");
  EXPECT_EQ(zenflow::checksum_file((dir / "check").string()).crc32c, 0xe3069283u);
}
