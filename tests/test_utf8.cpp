// common/utf8.h: what reaches a protobuf string field is valid UTF-8.
#include "common/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace zenflow {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

TEST(Utf8, ValidTextComesBackUnchanged) {
  for (const std::string& s : {std::string(), std::string("plain ascii \t\n"), std::string("caf\xC3\xA9 \xE2\x82\xAC"),
                              std::string("\xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"), std::string("nul\0inside", 10)}) {
    EXPECT_EQ(valid_utf8(s), s);
    EXPECT_TRUE(is_valid_utf8(s));
  }
}

TEST(Utf8, EachInvalidByteBecomesOneReplacementCharacter) {
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"\xFF", kReplacement},                                   // never valid
      {"a\x80z", "a" + kReplacement + "z"},                     // stray continuation byte
      {"\xC3", kReplacement},                                   // truncated at the end
      {"\xC3(", kReplacement + "("},                            // bad continuation
      {"\xC0\xAF", kReplacement + kReplacement},                // overlong '/'
      {"\xE0\x80\xAF", kReplacement + kReplacement + kReplacement},  // overlong, 3 bytes
      {"\xED\xA0\x80", kReplacement + kReplacement + kReplacement},  // a surrogate
      {"\xF4\x90\x80\x80", std::string() + kReplacement + kReplacement + kReplacement + kReplacement},  // > U+10FFFF
      {"\xF5\x80", kReplacement + kReplacement},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(valid_utf8(c.in), c.out);
    EXPECT_FALSE(is_valid_utf8(c.in));
    EXPECT_TRUE(is_valid_utf8(valid_utf8(c.in)));
  }
}

TEST(Utf8, APrefixNeverCutsASequence) {
  const std::string s = "ab\xE2\x82\xAC" "cd";  // a, b, euro (3 bytes), c, d
  EXPECT_EQ(utf8_prefix(s, 2), "ab");
  EXPECT_EQ(utf8_prefix(s, 3), "ab");
  EXPECT_EQ(utf8_prefix(s, 4), "ab");
  EXPECT_EQ(utf8_prefix(s, 5), "ab\xE2\x82\xAC");
  EXPECT_EQ(utf8_prefix(s, 100), s);
  EXPECT_EQ(utf8_prefix(s, 0), "");
}

}  // namespace
}  // namespace zenflow
