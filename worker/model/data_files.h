// The files a data directory contributes to a dataset (text, jsonl and token datasets).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace zenflow::model {

// The regular files directly inside `dir` (symlinks followed), sorted by file name.
// Everything else is skipped without being opened: subdirectories (not recursed into),
// FIFOs, sockets, devices and dangling symlinks, so that a stray entry can neither block
// a run nor be mistaken for data. Each file is still opened through common/input_file.h,
// which refuses it if it was swapped for something else after the listing. Throws
// InputError naming `dir` when it cannot be listed.
std::vector<std::filesystem::path> data_directory_files(const std::string& dir);

}  // namespace zenflow::model
