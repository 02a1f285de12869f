// Text from elsewhere, made safe to print on a terminal: what a rank printed, a worker's
// name or GPU model, an error a server sent. A terminal obeys what it is sent, so bytes a
// job or a worker chose could otherwise clear the admin's screen (ESC [2J), retitle the
// window (OSC 0), write the clipboard (OSC 52) or reorder what is read (bidi overrides).
//
// Escaped, visibly: C0 controls except newline and tab (ESC is \x1b, CR \x0d), DEL, the C1
// controls U+0080-U+009F (\u009b), the bidi embeddings, overrides and isolates
// (U+202A-U+202E, U+2066-U+2069), and bytes that are not UTF-8 (\xNN). Everything else,
// other scripts and emoji included, is printed as it is. Applied whether stdout is a
// terminal or a pipe (`less -R` turns a pipe back into a terminal).
#pragma once

#include <string>
#include <string_view>

namespace zenflow {

// `s` escaped as above, as one piece (a sequence cut at its end is escaped as bytes).
std::string terminal_safe(std::string_view s);

// The same over a stream of chunks (a log followed as it grows): a UTF-8 sequence cut by a
// chunk's end is held until the next chunk completes it, so it is neither escaped by
// mistake nor printed half.
class TerminalSafeStream {
 public:
  // The printable text of `chunk`, after what was held from the last one.
  std::string feed(std::string_view chunk);
  // What is still held (an incomplete sequence at the very end), escaped.
  std::string finish();

 private:
  std::string held_;
};

}  // namespace zenflow
