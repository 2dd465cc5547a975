#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <array>

namespace helios::unicode {

namespace {

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// Continuation bytes the strict decoder accepts right after `lead` (Unicode Table 3-7).
void second_byte_range(uint8_t lead, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead == 0xE0) *lo = 0xA0;  // no overlong 3-byte forms
  if (lead == 0xED) *hi = 0x9F;  // no surrogates
  if (lead == 0xF0) *lo = 0x90;  // no overlong 4-byte forms
  if (lead == 0xF4) *hi = 0x8F;  // nothing past U+10FFFF
}

size_t strict_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation byte, C0/C1 (always overlong) or F5..FF
}

struct ByteMap {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 0x144> to_byte;  // mapped characters are all below U+0144
};

ByteMap build_byte_map() {
  ByteMap map;
  map.to_byte.fill(-1);
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : 256u + next_extra++;
    map.to_char[b] = to_utf8(cp);
    map.to_byte[cp] = static_cast<int16_t>(b);
  }
  return map;
}

const ByteMap& byte_map() {
  static const ByteMap map = build_byte_map();
  return map;
}

}  // namespace

size_t sequence_length(uint8_t lead) {
  static constexpr size_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

uint32_t decode_one(std::string_view text, size_t* pos) {
  const size_t start = *pos;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[start + i]); };
  const uint8_t lead = byte(0);
  size_t length = 0;
  uint32_t cp = 0;
  if (lead < 0x80) {
    length = 1;
    cp = lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    cp = lead & 0x07;
  }
  bool valid = length > 0 && start + length <= text.size();
  for (size_t i = 1; valid && i < length; ++i) {
    valid = is_continuation(byte(i));
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  if (!valid || cp > kMaxCodePoint) {
    *pos = start + 1;
    return kReplacementChar;
  }
  *pos = start + length;
  return cp;
}

std::vector<uint32_t> decode(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) cps.push_back(decode_one(text, &pos));
  return cps;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp > kMaxCodePoint) cp = kReplacementChar;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(uint32_t cp) {
  std::string out;
  append_utf8(cp, &out);
  return out;
}

Utf8Scan scan_strict(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const size_t length = strict_length(byte(0));
  if (length == 0) return {Utf8State::kInvalid, 1};
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= text.size()) return {Utf8State::kTruncated, i};
    uint8_t lo = 0x80, hi = 0xBF;
    if (i == 1) second_byte_range(byte(0), &lo, &hi);
    // A maximal valid prefix counts as one malformed sequence (one U+FFFD), as Unicode advises.
    if (byte(i) < lo || byte(i) > hi) return {Utf8State::kInvalid, i};
  }
  return {Utf8State::kComplete, length};
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Scan scan = scan_strict(text, pos);
    if (scan.state == Utf8State::kComplete) {
      out.append(text.substr(pos, scan.length));
    } else {
      append_utf8(kReplacementChar, &out);
    }
    pos += scan.length;
  }
  return out;
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_L_MASK) != 0;
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return u_isUWhiteSpace(static_cast<UChar32>(cp)) != 0;
}

const std::string& byte_to_char(uint8_t byte) { return byte_map().to_char[byte]; }

int char_to_byte(uint32_t cp) {
  const auto& to_byte = byte_map().to_byte;
  return cp < to_byte.size() ? to_byte[cp] : -1;
}

std::string bytes_to_chars(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_to_char(static_cast<uint8_t>(c));
  return out;
}

}  // namespace helios::unicode
