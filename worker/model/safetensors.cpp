// safetensors reading (mmap + header validation), sharded indexes and atomic writing.
#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/input_file.h"
#include "common/json_error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

namespace zenflow::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Same bound as the reference implementation: a header is metadata, not data.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DtypeSpec {
  const char* name;
  std::size_t size;
  at::ScalarType type;  // Undefined: no ScalarType in LibTorch 1.13
};

constexpr DtypeSpec kDtypes[] = {
    {"F64", 8, at::kDouble},
    {"F32", 4, at::kFloat},
    {"F16", 2, at::kHalf},
    {"BF16", 2, at::kBFloat16},
    {"I64", 8, at::kLong},
    {"I32", 4, at::kInt},
    {"I16", 2, at::kShort},
    {"I8", 1, at::kChar},
    {"U8", 1, at::kByte},
    {"BOOL", 1, at::kBool},
    {"U64", 8, at::ScalarType::Undefined},
    {"U32", 4, at::ScalarType::Undefined},
    {"U16", 2, at::ScalarType::Undefined},
    {"F8_E4M3", 1, at::ScalarType::Undefined},
    {"F8_E5M2", 1, at::ScalarType::Undefined},
};

const DtypeSpec* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::size_t dtype_size(const std::string& name) { return find_dtype(name)->size; }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

// Why the shard name `name` from an index would leave the index's directory, or "" when
// it stays inside. Lexical on purpose: the Hugging Face cache links a snapshot's files to
// blobs elsewhere, so a symlink inside the directory is a file of the model.
std::string escapes_directory(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name.find('\0') != std::string::npos) return "contains a NUL byte";
  const fs::path p(name);
  if (p.is_absolute() || p.has_root_path()) return "is an absolute path";
  for (const fs::path& part : p)
    if (part == "..") return "has a '..' component";
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------------
// Reading

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = open_regular_file(path);  // no size limit: weights are mapped, not read
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    fail(path, "cannot stat: " + err);
  }
  const auto file_size = static_cast<std::size_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length (truncated?)");
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->addr = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string mmap_err = errno_text();
  ::close(fd);
  if (mapping->addr == MAP_FAILED) {
    mapping->addr = nullptr;
    fail(path, "mmap failed: " + mmap_err);
  }
  mapping->size = file_size;
  mapping_ = mapping;
  const auto* base = static_cast<const uint8_t*>(mapping->addr);

  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(kMaxHeaderBytes) + "-byte limit (corrupt file?)");
  if (header_len > file_size - 8)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(file_size - 8) + " bytes after it (truncated?)");
  const std::size_t data_start = 8 + header_len;
  const std::size_t data_size = file_size - data_start;

  json header;
  try {
    header = json::parse(base + 8, base + data_start);
  } catch (const json::parse_error& e) {
    fail(path, "header is not valid JSON: " + json_error_text(e));
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  struct Span {
    std::size_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(path, "__metadata__[\"" + m.key() + "\"] is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object()) fail(path, where + ": entry is not an object");
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) fail(path, where + ": missing or non-string dtype");
    const DtypeSpec* spec = find_dtype(dt->get<std::string>());
    if (!spec) fail(path, where + ": unknown dtype " + dt->dump());
    SafetensorsEntry e;
    e.dtype_name = spec->name;
    e.dtype = spec->type;

    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) fail(path, where + ": missing or non-array shape");
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) fail(path, where + ": shape " + sh->dump() + " has a non-natural size");
      const uint64_t size = d.get<uint64_t>();
      if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path, where + ": shape " + sh->dump() + " is too large");
      e.shape.push_back(static_cast<int64_t>(size));
      if (size != 0 && numel > std::numeric_limits<uint64_t>::max() / size) overflow = true;
      numel *= size;
    }
    if (overflow || numel > std::numeric_limits<uint64_t>::max() / spec->size)
      fail(path, where + ": shape " + sh->dump() + " is too large");

    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail(path, where + ": data_offsets must be [begin, end] of natural numbers");
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end) fail(path, where + ": data_offsets " + off->dump() + " end before they begin");
    if (end - begin != numel * spec->size)
      fail(path, where + ": shape " + shape_string(e.shape) + " of " + spec->name + " needs " +
                     std::to_string(numel * spec->size) + " bytes but data_offsets " + off->dump() +
                     " span " + std::to_string(end - begin));
    if (end > data_size)
      fail(path, where + ": data_offsets " + off->dump() + " run past the " + std::to_string(data_size) +
                     "-byte data region (truncated?)");
    e.begin = data_start + begin;
    e.end = data_start + end;
    auto [slot, inserted] = entries_.emplace(name, std::move(e));
    spans.push_back(Span{begin, end, &slot->first});
  }

  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t expected = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    if (s.begin < expected)
      fail(path, "tensor '" + *s.name + "' (data bytes " + std::to_string(s.begin) + ".." +
                     std::to_string(s.end) + ") overlaps tensor '" + *previous + "' (ending at " +
                     std::to_string(expected) + ")");
    if (s.begin > expected)
      fail(path, "data bytes " + std::to_string(expected) + ".." + std::to_string(s.begin) +
                     " before tensor '" + *s.name + "' belong to no tensor");
    expected = s.end;
    previous = s.name;
    names_.push_back(*s.name);
  }
  if (expected != data_size)
    fail(path, "the data region has " + std::to_string(data_size - expected) +
                   " trailing bytes that belong to no tensor");
}

const SafetensorsEntry& SafetensorsFile::info(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw std::out_of_range(path_ + ": no tensor named '" + name + "'");
  return it->second;
}

std::pair<const uint8_t*, std::size_t> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = info(name);
  return {mapped_data() + e.begin, e.end - e.begin};
}

const uint8_t* SafetensorsFile::mapped_data() const { return static_cast<const uint8_t*>(mapping_->addr); }

std::size_t SafetensorsFile::mapped_size() const { return mapping_->size; }

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = info(name);
  if (e.dtype == at::ScalarType::Undefined)
    fail(path_, "tensor '" + name + "' has dtype " + e.dtype_name + ", which has no LibTorch type here");
  const auto options = at::TensorOptions().dtype(e.dtype).device(at::kCPU);
  const std::size_t elem = dtype_size(e.dtype_name);
  void* data = const_cast<uint8_t*>(mapped_data() + e.begin);
  if (e.begin == e.end) return at::empty(e.shape, options);
  if (reinterpret_cast<std::uintptr_t>(data) % elem != 0) {
    at::Tensor copy = at::empty(e.shape, options);
    std::memcpy(copy.data_ptr(), data, e.end - e.begin);
    return copy;
  }
  std::shared_ptr<const Mapping> keep = mapping_;
  return at::from_blob(
      data, e.shape, [keep](void*) {}, options);
}

SafetensorsIndex::SafetensorsIndex(const std::string& path) {
  std::error_code ec;
  fs::path index_path;
  if (fs::is_directory(path, ec)) {
    const fs::path single = fs::path(path) / "model.safetensors";
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single, ec)) {
      path_ = single.string();
    } else if (fs::exists(index, ec)) {
      index_path = index;
    } else {
      fail(path, "no model.safetensors or model.safetensors.index.json in this directory");
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    index_path = path;
  } else {
    path_ = path;
  }

  if (index_path.empty()) {
    shards_.emplace_back(path_);
    for (const std::string& name : shards_[0].names()) shard_of_[name] = 0;
    return;
  }

  path_ = index_path.string();
  const std::string text = read_regular_file(path_, kMaxIndexBytes, "a safetensors index");
  json index;
  try {
    index = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(path_, "not valid JSON: " + json_error_text(e));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(path_, "no \"weight_map\" object");
  std::map<std::string, std::size_t> shard_number;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(path_, "weight_map[\"" + it.key() + "\"] is not a file name");
    const std::string shard = it.value().get<std::string>();
    auto found = shard_number.find(shard);
    if (found == shard_number.end()) {
      if (const std::string why = escapes_directory(shard); !why.empty())
        throw InputError(path_, "weight_map[\"" + it.key() + "\"] = " + json(shard).dump() + " " + why +
                                    "; a shard must be a file inside the model directory");
      const std::string shard_path = (index_path.parent_path() / shard).string();
      if (!fs::exists(shard_path, ec))
        fail(path_, "shard '" + shard + "' (holding tensor '" + it.key() + "') is missing: " + shard_path);
      shards_.emplace_back(shard_path);
      found = shard_number.emplace(shard, shards_.size() - 1).first;
    }
    if (!shards_[found->second].contains(it.key()))
      fail(path_, "tensor '" + it.key() + "' is mapped to shard '" + shard + "', which has no such tensor");
    shard_of_[it.key()] = found->second;
  }
}

std::vector<std::string> SafetensorsIndex::names() const {
  std::vector<std::string> out;
  out.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

const SafetensorsFile& SafetensorsIndex::file_of(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) throw std::out_of_range(path_ + ": no tensor named '" + name + "'");
  return shards_[it->second];
}

// ---------------------------------------------------------------------------------
// Writing

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.type == dtype && dtype != at::ScalarType::Undefined) return d.name;
  throw std::invalid_argument(std::string("safetensors has no dtype for ") + c10::toString(dtype));
}

namespace {

// Owns the temporary file until commit(): on any exception it is closed and removed.
class TempFile {
 public:
  explicit TempFile(std::string final_path) : final_(std::move(final_path)), tmp_(final_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(final_, "cannot create " + tmp_ + ": " + errno_text());
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<std::size_t>(size, std::size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(final_, "write to " + tmp_ + " failed: " + errno_text());
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail(final_, "fsync of " + tmp_ + " failed: " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(final_, "close of " + tmp_ + " failed: " + errno_text());
    if (::rename(tmp_.c_str(), final_.c_str()) != 0)
      fail(final_, "rename from " + tmp_ + " failed: " + errno_text());
    committed_ = true;
    // Make the rename itself durable.
    std::string dir = fs::path(final_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string final_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  std::size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail(path, "a tensor has an empty name");
    if (name == "__metadata__") fail(path, "\"__metadata__\" cannot name a tensor");
    if (!seen.insert(name).second) fail(path, "tensor '" + name + "' appears twice");
    if (!t.defined()) fail(path, "tensor '" + name + "' is undefined");
    std::string dtype;
    try {
      dtype = safetensors_dtype_name(t.scalar_type());
    } catch (const std::invalid_argument& e) {
      fail(path, "tensor '" + name + "': " + e.what());
    }
    const std::size_t nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  TempFile out(path);
  out.write(&header_len, 8);
  out.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    const at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
    out.write(c.data_ptr(), static_cast<std::size_t>(c.numel()) * c.element_size());
  }
  out.commit();
}

}  // namespace zenflow::model
