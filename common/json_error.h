// What a JSON parse error says, without the bytes it read.
//
// nlohmann's parse_error quotes what it read ("...invalid literal; last read: 'root:x'"),
// and the file may be one the job may not read back (a spec that names /etc/shadow as its
// tokenizer): an error zenflow prints or uploads keeps the position and the reason only.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace zenflow {

// "parse error at line 1, column 2: syntax error while parsing value - invalid literal"
inline std::string json_error_text(const nlohmann::json::parse_error& e) {
  std::string m = e.what();
  if (const size_t quoted = m.find("; last read:"); quoted != std::string::npos) m.erase(quoted);
  if (m.rfind("[json.exception.", 0) == 0)
    if (const size_t end = m.find("] "); end != std::string::npos) m.erase(0, end + 2);
  return m;
}

}  // namespace zenflow
