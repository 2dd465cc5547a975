// Python's str operations over UTF-8 (see text_ops.h).
#include "chat/text_ops.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include "chat/value_ops.h"
#include "tokenizer/unicode.h"

namespace helios::jinja::text {
namespace {

std::vector<uint32_t> code_points(std::string_view s) { return unicode::decode(s); }

// ICU full case mapping of a whole string (UTF-8 -> UTF-16 -> mapped -> UTF-8).
template <typename MapFn>
std::string map_case(std::string_view s, MapFn fn) {
  std::u16string in;
  for (uint32_t cp : code_points(s)) {
    if (cp > 0xFFFF) {
      in += static_cast<char16_t>(0xD7C0 + (cp >> 10));
      in += static_cast<char16_t>(0xDC00 | (cp & 0x3FF));
    } else {
      in += static_cast<char16_t>(cp);
    }
  }
  std::u16string out(in.size() * 3 + 4, u'\0');
  UErrorCode status = U_ZERO_ERROR;
  const int32_t n = fn(out.data(), static_cast<int32_t>(out.size()), in.data(), static_cast<int32_t>(in.size()), &status);
  if (U_FAILURE(status)) return std::string(s);
  std::string utf8;
  for (int32_t i = 0; i < n; ++i) {
    uint32_t cp = out[i];
    if (cp >= 0xD800 && cp < 0xDC00 && i + 1 < n) cp = 0x10000 + ((cp - 0xD800) << 10) + (out[++i] - 0xDC00);
    unicode::append_utf8(cp, &utf8);
  }
  return utf8;
}

bool is_cased(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  return u_isULowercase(c) || u_isUUppercase(c) || u_istitle(c);
}

bool in_chars(uint32_t cp, const std::vector<uint32_t>& chars) {
  for (uint32_t c : chars) {
    if (c == cp) return true;
  }
  return false;
}

}  // namespace

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::vector<size_t> char_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    unicode::decode_one(s, &pos);
  }
  offsets.push_back(s.size());
  return offsets;
}

Text strip(const Text& s, Side side, const std::string* chars) {
  const std::vector<uint32_t> set = chars ? code_points(*chars) : std::vector<uint32_t>{};
  auto strippable = [&](uint32_t cp) { return chars ? in_chars(cp, set) : is_space(cp); };
  const std::string& b = s.bytes();
  const std::vector<size_t> offsets = char_offsets(b);
  const size_t n = offsets.size() - 1;
  size_t first = 0, last = n;  // characters [first, last) stay
  if (side != Side::kRight) {
    while (first < n) {
      size_t p = offsets[first];
      if (!strippable(unicode::decode_one(b, &p))) break;
      ++first;
    }
  }
  if (side != Side::kLeft) {
    while (last > first) {
      size_t p = offsets[last - 1];
      if (!strippable(unicode::decode_one(b, &p))) break;
      --last;
    }
  }
  return s.substr(offsets[first], offsets[last]);
}

std::vector<Text> split(const Text& s, const std::string* sep, int64_t maxsplit) {
  std::vector<Text> out;
  const std::string& b = s.bytes();
  if (sep) {
    if (sep->empty()) unsupported("split: empty separator");
    size_t start = 0;
    for (size_t found; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
                       (found = b.find(*sep, start)) != std::string::npos;) {
      out.push_back(s.substr(start, found));
      start = found + sep->size();
    }
    out.push_back(s.substr(start, b.size()));
    return out;
  }
  size_t pos = 0;
  auto space_at = [&](size_t p, size_t* next) {
    *next = p;
    return is_space(unicode::decode_one(b, next));
  };
  size_t next = 0;
  while (pos < b.size()) {
    while (pos < b.size() && space_at(pos, &next)) pos = next;
    if (pos >= b.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(s.substr(pos, b.size()));
      break;
    }
    size_t end = pos;
    while (end < b.size() && !space_at(end, &next)) end = next;
    out.push_back(s.substr(pos, end));
    pos = end;
  }
  return out;
}

bool is_all_case(std::string_view s, bool lower) {
  bool cased = false;
  for (uint32_t cp : code_points(s)) {
    const auto c = static_cast<UChar32>(cp);
    if (u_isUUppercase(c) || u_istitle(c)) {
      if (lower) return false;
      cased = true;
    } else if (u_isULowercase(c)) {
      if (!lower) return false;
      cased = true;
    }
  }
  return cased;
}

std::string upper(std::string_view s) {
  return map_case(s, [](UChar* d, int32_t dn, const UChar* src, int32_t sn, UErrorCode* e) {
    return u_strToUpper(d, dn, src, sn, "", e);
  });
}

std::string lower(std::string_view s) {
  return map_case(s, [](UChar* d, int32_t dn, const UChar* src, int32_t sn, UErrorCode* e) {
    return u_strToLower(d, dn, src, sn, "", e);
  });
}

std::string title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (uint32_t cp : code_points(s)) {
    const std::string one = unicode::to_utf8(cp);
    if (previous_cased) out += lower(one);
    else unicode::append_utf8(static_cast<uint32_t>(u_totitle(static_cast<UChar32>(cp))), &out);
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  if (cps.empty()) return {};
  std::string out;
  unicode::append_utf8(static_cast<uint32_t>(u_totitle(static_cast<UChar32>(cps[0]))), &out);
  size_t first_len = unicode::to_utf8(cps[0]).size();
  return out + lower(s.substr(std::min(first_len, s.size())));
}

}  // namespace helios::jinja::text
