// Reading the files a user points zenflow at, safely: regular files only, bounded sizes.
//
// Every file zenflow reads (job specs, config.json, tokenizer files, shard indexes,
// trainer.json, data files, safetensors) goes through these functions, so a FIFO, a
// device, a socket or a directory given where a file is expected is refused at once with
// its path (never blocks: FIFOs are opened non-blocking and refused after fstat), and a
// file larger than the limit for its kind is refused naming the limit — before anything
// is read. Errors are InputError, whose message starts with the path.
// Thread-safety: all functions are reentrant.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zenflow {

// Bad input: a file that is missing, not a regular file, too large or unreadable. The
// message is "<path>: <reason>" (e.g. "/data/x: is a FIFO, expected a regular file").
class InputError : public std::runtime_error {
 public:
  InputError(const std::string& path, const std::string& reason)
      : std::runtime_error(path + ": " + reason), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Size limits for the small files zenflow parses whole.
constexpr int64_t kMaxSpecBytes = 1 << 20;                // job spec YAML
constexpr int64_t kMaxConfigBytes = 4 << 20;              // config.json, tokenizer_config.json, manifest.json
constexpr int64_t kMaxIndexBytes = 16 << 20;              // model.safetensors.index.json
constexpr int64_t kMaxTokenizerBytes = 64 << 20;          // tokenizer.json, vocab.json, merges.txt
constexpr int64_t kMaxTrainerStateBytes = 256ll << 20;    // trainer.json (holds the loss history)

// "1 MiB", "64 MiB", "3.2 GiB": for messages.
std::string format_bytes(int64_t bytes);

// What kind of file system object `path` is, for messages: "a directory", "a FIFO",
// "a socket", "a character device", "a block device", "a symbolic link", "a regular file".
std::string describe_file_type(unsigned mode);

// Opens `path` for reading (following symlinks) and checks it is a regular file of at most
// `max_bytes` (< 0: no limit). Returns the open file descriptor (O_CLOEXEC, blocking mode
// restored); the caller closes it. Throws InputError: "no such file or directory",
// "is a FIFO, expected a regular file", "is 70 MiB, larger than the 64 MiB limit for <what>",
// "permission denied", … `what` names the kind of file for the limit message
// ("a job spec", "a tokenizer file").
int open_regular_file(const std::string& path, int64_t max_bytes = -1, const std::string& what = "this file");

// Reads a whole regular file (open_regular_file's checks, then a bounded read: a file that
// grows past the limit while being read is refused too).
std::string read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what);

// Throws InputError unless `path` is a regular file (following symlinks); never opens it.
void require_regular_file(const std::string& path);

}  // namespace zenflow
