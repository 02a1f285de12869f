// The safetensors format: validated, memory-mapped reading; atomic writing; sharded model directories.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
// {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the data region; offsets are relative to it.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zenflow::model {

// One tensor's entry in a safetensors header.
struct SafetensorsEntry {
  std::string dtype_name;  // as written: "F32", "BF16", "U16", ...
  // at::ScalarType::Undefined for dtypes LibTorch cannot represent in every version
  // this builds against (U16, U32, U64, F8_E4M3, F8_E5M2): read those with bytes().
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> shape;
  std::size_t begin = 0;  // byte range in the file (absolute, not data-relative)
  std::size_t end = 0;
};

// A .safetensors file mapped read-only (mmap, PROT_READ, MAP_PRIVATE). The
// constructor validates the whole header before anything is handed out, so a
// truncated or corrupt file is an exception, never a crash or a partial read:
// header length within the file, JSON an object, known dtypes, shapes of
// non-negative sizes whose byte size equals their data_offsets span, and the spans,
// ordered by offset, tiling the data region exactly (no overlap, gap or tail).
// (A file truncated by someone else *after* it was mapped can still raise SIGBUS.)
//
// Copies share the mapping. All methods are const and thread-safe.
class SafetensorsFile {
 public:
  // Throws std::runtime_error naming `path` and the problem.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in data order (by offset).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws std::out_of_range naming the file and the tensor when absent.
  const SafetensorsEntry& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A CPU tensor over the mapped bytes, without copying; it keeps the mapping alive
  // after this object is gone. The memory is read-only: writing to it (in place ops,
  // copy_ into it) kills the process with SIGSEGV, so clone() before modifying. A
  // tensor whose offset is not a multiple of its element size is returned as an
  // aligned copy instead. Throws std::runtime_error for dtypes with no ScalarType,
  // std::out_of_range for an absent name.
  at::Tensor tensor(const std::string& name) const;

  // The raw little-endian bytes of a tensor, valid while this object or any tensor
  // from it lives.
  std::pair<const uint8_t*, std::size_t> bytes(const std::string& name) const;

  // The whole mapping (for checks that a tensor points into it).
  const uint8_t* mapped_data() const;
  std::size_t mapped_size() const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  std::unordered_map<std::string, SafetensorsEntry> entries_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// A model directory's weights: DIR/model.safetensors, or else the shards listed in
// DIR/model.safetensors.index.json ({"weight_map": {tensor: shard file}}). `path` may
// also name a .safetensors file or an index .json directly. Every shard is opened and
// validated up front, and every tensor in the weight map must exist in its shard. A
// shard name must stay inside the index's directory (no absolute path, no '..'), and
// every file must be a regular file (common/input_file.h: a FIFO is refused, not opened).
// Throws std::runtime_error naming the file (and the shard or tensor) on any problem.
// Thread-safe, like SafetensorsFile.
class SafetensorsIndex {
 public:
  explicit SafetensorsIndex(const std::string& path);

  // All tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  // The file holding `name`; throws std::out_of_range naming the index when absent.
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& info(const std::string& name) const { return file_of(name).info(name); }
  at::Tensor tensor(const std::string& name) const { return file_of(name).tensor(name); }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  // The index file, or the single .safetensors file.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<SafetensorsFile> shards_;
  std::unordered_map<std::string, std::size_t> shard_of_;
};

// The safetensors dtype name of a ScalarType ("F32", ...); throws std::invalid_argument
// for types the format (or this writer) has no name for.
std::string safetensors_dtype_name(at::ScalarType dtype);

// Writes `tensors` in the given order and dtypes (each copied to contiguous CPU
// memory one at a time) with an optional __metadata__ map. The header is padded with
// spaces to a multiple of 8 bytes so the data region is 8-byte aligned. Written to
// `path` + ".tmp", fsync'd, renamed over `path` (atomic), and the directory fsync'd.
// Throws std::runtime_error naming the path (the .tmp file is removed) for I/O
// errors, duplicate or empty names, the name "__metadata__", or an unsupported dtype.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace zenflow::model
