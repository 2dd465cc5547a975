// Python's string operations over UTF-8, for the interpreter: whitespace (str.isspace), strip,
// split, case mapping (full Unicode mappings, from ICU) and code-point slicing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "helios/jinja.h"

namespace helios::jinja::text {

bool is_space(uint32_t cp);  // Python's str.isspace for one character

// strip/lstrip/rstrip: `chars` null means whitespace, else any of its characters.
enum class Side { kLeft, kRight, kBoth };
Text strip(const Text& s, Side side, const std::string* chars);
// str.split(sep, maxsplit): `sep` null splits on runs of whitespace and drops empty pieces.
std::vector<Text> split(const Text& s, const std::string* sep, int64_t maxsplit);

// str.islower / str.isupper: at least one cased character, and every cased one in that case.
bool is_all_case(std::string_view s, bool lower);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title: a cased letter after an uncased one starts a word
std::string capitalize(std::string_view s);  // str.capitalize: first character title-cased, the rest lower

// Byte offsets of the code points of `s` (one past the last too): offsets[i] starts character i.
std::vector<size_t> char_offsets(std::string_view s);

}  // namespace helios::jinja::text
