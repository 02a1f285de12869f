// Listing a data directory (see data_files.h).
#include "worker/model/data_files.h"

#include <algorithm>
#include <system_error>

#include "common/input_file.h"

namespace zenflow::model {

std::vector<std::filesystem::path> data_directory_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw InputError(dir, "cannot list the directory: " + ec.message());
  std::vector<fs::path> files;
  for (const fs::directory_iterator end; it != end;) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) files.push_back(it->path());
    it.increment(ec);
    if (ec) throw InputError(dir, "cannot list the directory: " + ec.message());
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return files;
}

}  // namespace zenflow::model
