// Template source -> tokens, with Jinja2's whitespace rules as transformers configures them:
// newlines normalized to "\n" and one trailing newline dropped; trim_blocks (the first newline
// after a block or comment tag goes); lstrip_blocks (spaces and tabs from the start of a line to
// a block or comment tag go); "-" on a tag strips all whitespace on that side, "+" keeps it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace helios::jinja {

enum class TokenType {
  kData,        // template text between tags (text: the bytes)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword (text)
  kString,      // string literal, escapes decoded (text)
  kInteger,     // (integer)
  kFloat,       // (number)
  kOperator,    // + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { } ; (text)
  kEnd,
};

struct Token {
  TokenType type;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  int line = 1;
  int column = 1;
};

// Throws Error (UNIMPLEMENTED, naming line and column) on malformed input.
std::vector<Token> lex(const std::string& source);

}  // namespace helios::jinja
