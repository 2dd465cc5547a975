// Code-point helpers for the tokenizers: UTF-8 decoding and encoding that never read past the
// end of their input, Unicode categories (from ICU) and GPT-2's byte <-> character mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace helios::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// The length a lead byte announces: 1 for ASCII and for bytes that cannot start a sequence.
// Same table as llama.cpp's unicode_len_utf8, which SentencePiece splitting relies on.
size_t sequence_length(uint8_t lead);

// Decodes the code point at `text[*pos]` and moves `*pos` past it. A byte that does not start a
// complete sequence gives U+FFFD and moves one byte, as llama.cpp does. Like llama.cpp, overlong
// forms and surrogates are accepted (only the continuation bytes are checked), so tokenization
// agrees with it on such input; values above U+10FFFF are rejected.
uint32_t decode_one(std::string_view text, size_t* pos);
std::vector<uint32_t> decode(std::string_view text);

// Appends the UTF-8 form of `cp`; values above U+10FFFF are written as U+FFFD.
void append_utf8(uint32_t cp, std::string* out);
std::string to_utf8(uint32_t cp);

// Strict validation (no overlongs, surrogates or values past U+10FFFF), for text we hand out.
enum class Utf8State { kComplete, kTruncated, kInvalid };
struct Utf8Scan {
  Utf8State state;
  size_t length;  // kComplete: the sequence; kTruncated: bytes present; kInvalid: bytes to skip
};
Utf8Scan scan_strict(std::string_view text, size_t pos);
// `text` with every malformed sequence (a truncated one at the end too) replaced by U+FFFD.
std::string sanitize_utf8(std::string_view text);

// Categories as the pre-tokenizer regexes use them: \p{L}, \p{N} and \s.
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_whitespace(uint32_t cp);

// GPT-2's bytes_to_unicode: every byte maps to a printable character, so that byte-level BPE
// vocabularies can be stored as text. Printable Latin-1 bytes map to themselves.
const std::string& byte_to_char(uint8_t byte);
// The byte a mapped character stands for, or -1 if `cp` is not one of the 256 characters.
int char_to_byte(uint32_t cp);
// Maps every byte of `bytes` (the UTF-8 of a pre-tokenized word) to its character.
std::string bytes_to_chars(std::string_view bytes);

}  // namespace helios::unicode
