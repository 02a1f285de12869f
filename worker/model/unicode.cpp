// Unicode classification and NFC over tables generated from Python's unicodedata.
#include "worker/model/unicode.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace zenflow::model::unicode {
namespace {

struct CodepointRange {
  char32_t lo, hi;
};
struct CombiningClassRange {
  char32_t lo, hi;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0: singleton
};
struct Composition {
  char32_t first, second, composite;
};

#include "worker/model/unicode_tables.inc"

constexpr uint8_t kLetterBit = kLetterClass, kNumberBit = kNumberClass, kSpaceBit = kSpaceClass;

bool in_ranges(const CodepointRange* begin, const CodepointRange* end, char32_t cp) {
  const CodepointRange* it =
      std::upper_bound(begin, end, cp, [](char32_t c, const CodepointRange& r) { return c < r.lo; });
  return it != begin && cp <= (it - 1)->hi;
}

bool is_white_space_property(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Class bits for the Basic Multilingual Plane; higher planes go to the range tables.
const std::vector<uint8_t>& bmp_classes() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x10000, 0);
    for (const auto& r : kLetterRanges)
      for (char32_t c = r.lo; c <= r.hi && c < 0x10000; ++c) t[c] |= kLetterBit;
    for (const auto& r : kNumberRanges)
      for (char32_t c = r.lo; c <= r.hi && c < 0x10000; ++c) t[c] |= kNumberBit;
    for (char32_t c = 0; c < 0x10000; ++c)
      if (is_white_space_property(c)) t[c] |= kSpaceBit;
    return t;
  }();
  return table;
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = std::end(kCombiningClasses);
  const auto* it = std::upper_bound(std::begin(kCombiningClasses), end, cp,
                                    [](char32_t c, const CombiningClassRange& r) { return c < r.lo; });
  if (it == std::begin(kCombiningClasses) || cp > (it - 1)->hi) return 0;
  return (it - 1)->ccc;
}

// Hangul syllable arithmetic (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

// Invalid bytes travel through normalization as 0x110000 + byte: combining class 0,
// no decomposition, no composition.
constexpr char32_t kRawByteBase = 0x110000;

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = std::end(kDecompositions);
  const auto* it = std::lower_bound(std::begin(kDecompositions), end, cp,
                                    [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of (first, second), or 0 when there is none.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount)
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount)
    return first + (second - kTBase);
  const auto* end = std::end(kCompositions);
  const auto* it = std::lower_bound(std::begin(kCompositions), end, std::make_pair(first, second),
                                    [](const Composition& c, const std::pair<char32_t, char32_t>& k) {
                                      return std::make_pair(c.first, c.second) < k;
                                    });
  if (it == end || it->first != first || it->second != second) return 0;
  return it->composite;
}

}  // namespace

std::size_t decode_utf8(std::string_view s, std::size_t i, char32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  std::size_t len;
  char32_t value, min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, value = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, value = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, value = b0 & 0x07, min = 0x10000;
  } else {
    *cp = kInvalid;
    return 1;
  }
  if (i + len > s.size()) {
    *cp = kInvalid;
    return 1;
  }
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *cp = kInvalid;
      return 1;
    }
    value = (value << 6) | (b & 0x3F);
  }
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    *cp = kInvalid;
    return 1;
  }
  *cp = value;
  return len;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const char* unicode_version() { return kTablesUnicodeVersion; }

bool is_letter(char32_t cp) {
  if (cp < 0x10000) return bmp_classes()[cp] & kLetterBit;
  return cp != kInvalid && in_ranges(std::begin(kLetterRanges), std::end(kLetterRanges), cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x10000) return bmp_classes()[cp] & kNumberBit;
  return cp != kInvalid && in_ranges(std::begin(kNumberRanges), std::end(kNumberRanges), cp);
}

bool is_whitespace(char32_t cp) { return cp < 0x10000 && (bmp_classes()[cp] & kSpaceBit); }

unsigned char classify(char32_t cp) {
  static const uint8_t* const bmp = bmp_classes().data();
  if (cp < 0x10000) return bmp[cp];
  if (cp == kInvalid) return 0;
  return (in_ranges(std::begin(kLetterRanges), std::end(kLetterRanges), cp) ? kLetterBit : 0) |
         (in_ranges(std::begin(kNumberRanges), std::end(kNumberRanges), cp) ? kNumberBit : 0);
}

std::string nfc(std::string_view text) {
  // Every code point below U+0300 is its own NFC form and none of them composes with
  // a following one below U+0300; such code points start with a byte below 0xCC.
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return std::string(text);

  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp;
    const std::size_t len = decode_utf8(text, i, &cp);
    if (cp == kInvalid)
      cps.push_back(kRawByteBase + static_cast<unsigned char>(text[i]));
    else
      decompose(cp, cps);
    i += len;
  }

  // Canonical ordering: stable sort each run of non-starters by combining class.
  for (std::size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }

  // Canonical composition: a character combines with the last starter unless a
  // character of the same or higher class (or a starter) stands between them.
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::ptrdiff_t starter = -1;
  int last_class = -1;
  for (char32_t cp : cps) {
    const int cls = combining_class(cp);
    // last_class == 0 means the starter is the last character written.
    if (starter >= 0 && cp < kRawByteBase && out[starter] < kRawByteBase &&
        (last_class < cls || last_class == 0)) {
      if (const char32_t c = compose(out[starter], cp)) {
        out[starter] = c;
        continue;
      }
    }
    if (cls == 0) starter = static_cast<std::ptrdiff_t>(out.size());
    last_class = cls;
    out.push_back(cp);
  }

  std::string result;
  result.reserve(text.size());
  for (char32_t cp : out) {
    if (cp >= kRawByteBase)
      result.push_back(static_cast<char>(cp - kRawByteBase));
    else
      append_utf8(result, cp);
  }
  return result;
}

}  // namespace zenflow::model::unicode
