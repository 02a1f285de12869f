// CRC32C (Castagnoli), the checksum of checkpoint manifests.
//
// Hardware CRC32 instructions (SSE4.2) when the CPU has them, a table-driven slicing-by-8
// fallback otherwise; both give identical values (CRC32C("123456789") == 0xE3069283).
// Thread-safety: all functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zenflow {

// Extends `crc` (0 for the start) by `n` bytes at `data`.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// The software implementation (for tests: the hardware path must agree with it).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

// Whether crc32c_extend uses the hardware instructions on this CPU.
bool crc32c_hardware();

struct FileChecksum {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Size and CRC32C of a regular file, read sequentially in large blocks. Throws
// InputError (common/input_file.h) naming the path when it cannot be read.
FileChecksum checksum_file(const std::string& path);

// "e3069283": the manifest's spelling.
std::string crc32c_hex(uint32_t crc);

}  // namespace zenflow
