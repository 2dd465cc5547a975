#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <set>

namespace helios::unicode {
namespace {

TEST(Utf8Decode, DecodesOneToFourByteSequences) {
  EXPECT_EQ(decode("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            (std::vector<uint32_t>{'a', 0xE9, 0x20AC, 0x1F600}));
}

TEST(Utf8Decode, MalformedBytesBecomeOneReplacementEachAsInLlamaCpp) {
  // Stray continuation byte, a lead byte with no continuation, F8..FF, and a truncated tail.
  EXPECT_EQ(decode("\x80" "a\xC3" "b\xFF\xE2\x82"),
            (std::vector<uint32_t>{kReplacementChar, 'a', kReplacementChar, 'b', kReplacementChar,
                                   kReplacementChar, kReplacementChar}));
}

TEST(Utf8Decode, NeverReadsPastTheView) {
  // The euro sign's third byte is outside the view: it must not be used.
  const std::string buffer = "\xE2\x82\xAC";
  const std::string_view view(buffer.data(), 2);
  size_t pos = 0;
  EXPECT_EQ(decode_one(view, &pos), kReplacementChar);
  EXPECT_EQ(pos, 1u);
}

TEST(Utf8Decode, RejectsValuesPastU10FFFF) {
  size_t pos = 0;
  EXPECT_EQ(decode_one("\xF7\xBF\xBF\xBF", &pos), kReplacementChar);  // would be U+1FFFFF
  EXPECT_EQ(pos, 1u);
}

TEST(Utf8Encode, RoundTripsThroughDecode) {
  for (uint32_t cp : {0x0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    EXPECT_EQ(decode(to_utf8(cp)), std::vector<uint32_t>{cp}) << cp;
  }
  EXPECT_EQ(to_utf8(0x110000), "\xEF\xBF\xBD");
}

TEST(Utf8Strict, ClassifiesCompleteTruncatedAndInvalid) {
  EXPECT_EQ(scan_strict("\xE2\x82\xAC", 0).state, Utf8State::kComplete);
  EXPECT_EQ(scan_strict("\xE2\x82", 0).state, Utf8State::kTruncated);
  EXPECT_EQ(scan_strict("\xC0\x80", 0).state, Utf8State::kInvalid);      // overlong NUL
  EXPECT_EQ(scan_strict("\xED\xA0\x80", 0).state, Utf8State::kInvalid);  // surrogate
  EXPECT_EQ(scan_strict("\xF4\x90\x80\x80", 0).state, Utf8State::kInvalid);  // > U+10FFFF
  EXPECT_EQ(scan_strict("\xE2(", 0).state, Utf8State::kInvalid);
}

TEST(Utf8Strict, SanitizeReplacesEachMalformedSequence) {
  EXPECT_EQ(sanitize_utf8("ok\xC3\xA9"), "ok\xC3\xA9");
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  // A valid-so-far prefix cut by another character is one malformed sequence.
  EXPECT_EQ(sanitize_utf8("\xE2\x82" "x"), "\xEF\xBF\xBD" "x");
  EXPECT_EQ(sanitize_utf8("x\xF0\x9F\x98"), "x\xEF\xBF\xBD");
}

TEST(Categories, LettersNumbersAndWhitespace) {
  EXPECT_TRUE(is_letter('a'));
  EXPECT_TRUE(is_letter(0xE9));    // é
  EXPECT_TRUE(is_letter(0x4E2D));  // 中
  EXPECT_FALSE(is_letter(0x301));  // combining acute accent (Mn)
  EXPECT_FALSE(is_letter('1'));
  EXPECT_TRUE(is_number('7'));
  EXPECT_TRUE(is_number(0x663));   // Arabic-Indic digit three (Nd)
  EXPECT_TRUE(is_number(0x216B));  // Roman numeral twelve (Nl)
  EXPECT_TRUE(is_number(0xBD));    // ½ (No)
  EXPECT_FALSE(is_number('x'));
  for (uint32_t cp : {0x20u, 0x09u, 0x0Au, 0x0Du, 0x85u, 0xA0u, 0x2009u, 0x3000u}) {
    EXPECT_TRUE(is_whitespace(cp)) << cp;
  }
  EXPECT_FALSE(is_whitespace(0x200B));  // zero-width space is a format character, not \s
  EXPECT_FALSE(is_whitespace('a'));
}

TEST(ByteMap, MatchesGpt2BytesToUnicode) {
  EXPECT_EQ(byte_to_char(' '), "\xC4\xA0");   // Ġ (U+0120)
  EXPECT_EQ(byte_to_char('\n'), "\xC4\x8A");  // Ċ (U+010A)
  EXPECT_EQ(byte_to_char('a'), "a");
  EXPECT_EQ(byte_to_char(0xE9), "\xC3\xA9");  // printable Latin-1 maps to itself
  EXPECT_EQ(byte_to_char(0xAD), "\xC5\x83");  // soft hyphen is the last remapped byte: U+0143
  std::set<std::string> distinct;
  for (int b = 0; b < 256; ++b) {
    const std::string& c = byte_to_char(static_cast<uint8_t>(b));
    distinct.insert(c);
    const std::vector<uint32_t> cps = decode(c);
    ASSERT_EQ(cps.size(), 1u);
    EXPECT_EQ(char_to_byte(cps[0]), b);
  }
  EXPECT_EQ(distinct.size(), 256u);
  EXPECT_EQ(char_to_byte(0x20), -1);  // a raw space is not a mapped character
  EXPECT_EQ(char_to_byte(0x4E2D), -1);
  EXPECT_EQ(bytes_to_chars("a b"), "a\xC4\xA0" "b");
}

}  // namespace
}  // namespace helios::unicode
