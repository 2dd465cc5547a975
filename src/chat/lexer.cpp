// The template lexer: Jinja2's rules for tags, whitespace control and literals (see lexer.h).
#include "chat/lexer.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "chat/text_ops.h"
#include "chat/value_ops.h"
#include "tokenizer/unicode.h"

namespace helios::jinja {
namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// "\r\n" and "\r" become "\n"; one trailing newline is dropped (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's str.rstrip() (all Unicode whitespace).
std::string rstrip(const std::string& s) {
  return text::strip(Text::literal(s), text::Side::kRight, nullptr).bytes();
}

bool all_space(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    if (!text::is_space(unicode::decode_one(s, &pos))) return false;
  }
  return true;
}

void append_code_point(uint32_t cp, std::string* out) { unicode::append_utf8(cp, out); }

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t open = find_opener(pos_);
      if (open == std::string::npos) {
        emit_data(src_.substr(pos_));
        break;
      }
      lex_tag(open);
    }
    tokens_.push_back(make(TokenType::kEnd, src_.size()));
    return std::move(tokens_);
  }

 private:
  size_t find_opener(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  [[noreturn]] void error(size_t at, const std::string& message) const {
    int line = 1, column = 1;
    position(at, &line, &column);
    throw Error{StatusCode::kUnimplemented, message, line, column};
  }

  void position(size_t at, int* line, int* column) const {
    at = std::min(at, src_.size());
    const auto next = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    *line = static_cast<int>(next - line_starts_.begin());
    *column = static_cast<int>(at - *(next - 1)) + 1;
  }

  Token make(TokenType type, size_t at, std::string text = {}) const {
    Token t{type, std::move(text)};
    position(at, &t.line, &t.column);
    return t;
  }

  void emit_data(std::string data) {
    if (!data.empty()) tokens_.push_back(make(TokenType::kData, data_start_, std::move(data)));
  }

  // Data before a tag, with the tag's left-side whitespace rule applied.
  void emit_data_before(size_t open, char sign, bool lstrip_applies) {
    data_start_ = pos_;
    std::string data = src_.substr(pos_, open - pos_);
    if (sign == '-') {
      data = rstrip(data);
    } else if (sign != '+' && lstrip_applies) {
      const size_t nl = data.rfind('\n');
      const size_t line_begin = nl == std::string::npos ? 0 : nl + 1;
      if ((line_begin > 0 || line_starting_) && all_space(std::string_view(data).substr(line_begin))) {
        data.resize(line_begin);
      }
    }
    emit_data(std::move(data));
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    return p;
  }

  // The end of a block or comment tag at `p` ("%}" / "#}", with its sign before it); returns
  // the position after it and what trim_blocks / "-" consume.
  size_t block_end(size_t p, bool minus, bool plus) const {
    size_t after = p + 2;
    if (minus) return skip_space(after);
    if (!plus && after < src_.size() && src_[after] == '\n') ++after;  // trim_blocks
    return after;
  }

  void lex_tag(size_t open) {
    const char kind = src_[open + 1];
    const char sign = open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+') ? src_[open + 2] : 0;
    const size_t body = open + 2 + (sign ? 1 : 0);
    if (kind == '%' && lex_raw(open, sign, body)) return;
    emit_data_before(open, sign, kind != '{');
    if (kind == '#') {
      const size_t close = src_.find("#}", body);
      if (close == std::string::npos) error(open, "missing end of comment tag");
      const bool minus = close > body && src_[close - 1] == '-';
      const bool plus = close > body && src_[close - 1] == '+';
      pos_ = block_end(close, minus, plus);
      line_starting_ = src_[pos_ - 1] == '\n';
      return;
    }
    tokens_.push_back(make(kind == '{' ? TokenType::kVarBegin : TokenType::kBlockBegin, open));
    pos_ = body;
    lex_inside(kind == '{', open);
  }

  // {% raw %}...{% endraw %}: the text between is data, untouched.
  bool lex_raw(size_t open, char sign, size_t body) {
    size_t p = skip_space(body);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p = skip_space(p + 3);
    size_t content;
    if (src_.compare(p, 3, "-%}") == 0) content = skip_space(p + 3);
    else if (src_.compare(p, 2, "%}") == 0) content = p + 2;
    else return false;
    emit_data_before(open, sign, true);
    line_starting_ = src_[content - 1] == '\n';
    for (size_t q = find_opener(content); q != std::string::npos; q = find_opener(q + 1)) {
      if (src_[q + 1] != '%') continue;
      const char end_sign = q + 2 < src_.size() && (src_[q + 2] == '-' || src_[q + 2] == '+') ? src_[q + 2] : 0;
      size_t r = skip_space(q + 2 + (end_sign ? 1 : 0));
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r = skip_space(r + 6);
      const bool plus = src_.compare(r, 3, "+%}") == 0, minus = src_.compare(r, 3, "-%}") == 0;
      if (!plus && !minus && src_.compare(r, 2, "%}") != 0) continue;
      pos_ = content;
      emit_data_before(q, end_sign, true);
      pos_ = block_end(r + (plus || minus ? 1 : 0), minus, plus);
      line_starting_ = src_[pos_ - 1] == '\n';
      return true;
    }
    error(open, "missing end of raw directive");
  }

  void lex_inside(bool variable, size_t open) {
    std::vector<char> balance;
    while (true) {
      if (pos_ >= src_.size()) error(open, std::string("unexpected end of template, expected '") + (variable ? "}}" : "%}") + "'");
      if (balance.empty() && lex_tag_end(variable)) return;
      const char c = src_[pos_];
      if (is_ascii_space(c)) {
        ++pos_;
      } else if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t end = pos_;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        tokens_.push_back(make(TokenType::kName, pos_, src_.substr(pos_, end - pos_)));
        pos_ = end;
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(&balance);
      }
    }
  }

  bool lex_tag_end(bool variable) {
    const char* close = variable ? "}}" : "%}";
    const bool minus = src_.compare(pos_, 3, std::string("-") + close) == 0;
    const bool plus = !variable && src_.compare(pos_, 3, std::string("+") + close) == 0;
    if (!minus && !plus && src_.compare(pos_, 2, close) != 0) return false;
    const size_t at = pos_ + (minus || plus ? 1 : 0);
    tokens_.push_back(make(variable ? TokenType::kVarEnd : TokenType::kBlockEnd, pos_));
    if (variable) pos_ = minus ? skip_space(at + 2) : at + 2;  // no trim_blocks after }}
    else pos_ = block_end(at, minus, plus);
    line_starting_ = src_[pos_ - 1] == '\n';
    return true;
  }

  size_t digits(size_t p, bool (*ok)(char)) const {
    // (\d+_)*\d+ : underscores only between digits
    size_t q = p;
    while (q < src_.size() && (ok(src_[q]) || (src_[q] == '_' && q > p && q + 1 < src_.size() && ok(src_[q + 1])))) ++q;
    return q;
  }

  void lex_number() {
    const size_t start = pos_;
    auto keep = [&](size_t a, size_t b) {
      std::string s;
      for (size_t i = a; i < b; ++i) {
        if (src_[i] != '_') s += src_[i];
      }
      return s;
    };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() && std::string("xXoObB").find(src_[pos_ + 1]) != std::string::npos) {
      const char base_char = static_cast<char>(std::tolower(src_[pos_ + 1]));
      const int base = base_char == 'x' ? 16 : (base_char == 'o' ? 8 : 2);
      size_t end = pos_ + 2;
      while (end < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      Token t = make(TokenType::kInteger, start);
      try {
        t.integer = std::stoll(keep(pos_ + 2, end), nullptr, base);
      } catch (...) {
        error(start, "integer literal out of range");
      }
      tokens_.push_back(std::move(t));
      pos_ = end;
      return;
    }
    size_t end = digits(pos_, is_digit);
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      end = digits(end + 1, is_digit);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        end = digits(e, is_digit);
        is_float = true;
      }
    }
    Token t = make(is_float ? TokenType::kFloat : TokenType::kInteger, start);
    try {
      if (is_float) t.number = std::stod(keep(start, end));
      else t.integer = std::stoll(keep(start, end));
    } catch (...) {
      error(start, "number literal out of range");
    }
    tokens_.push_back(std::move(t));
    pos_ = end;
  }

  // Python string escapes (the literal is decoded as "unicode-escape").
  void lex_string(char quote) {
    const size_t start = pos_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) error(start, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) error(start, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': case 'u': case 'U': {
          const size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          if (p + n > src_.size()) error(start, "truncated \\" + std::string(1, e) + " escape");
          const std::string hex = src_.substr(p, n);
          if (!std::all_of(hex.begin(), hex.end(), [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); })) {
            error(start, "truncated \\" + std::string(1, e) + " escape");
          }
          const unsigned long cp = std::stoul(hex, nullptr, 16);
          if (cp > unicode::kMaxCodePoint) error(start, "illegal Unicode character in escape");
          append_code_point(static_cast<uint32_t>(cp), &out);
          p += n;
          break;
        }
        case 'N': error(start, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k, ++p) cp = cp * 8 + (src_[p] - '0');
            append_code_point(cp, &out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(make(TokenType::kString, start, std::move(out)));
    pos_ = p + 1;
  }

  void lex_operator(std::vector<char>* balance) {
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back(make(TokenType::kOperator, pos_, op));
        pos_ += 2;
        return;
      }
    }
    const char c = src_[pos_];
    if (std::string("+-/*%~[](){}<>=.:|,;").find(c) == std::string::npos) {
      error(pos_, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') balance->push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    if (c == ')' || c == ']' || c == '}') {
      if (balance->empty()) error(pos_, std::string("unexpected '") + c + "'");
      if (balance->back() != c) error(pos_, std::string("unexpected '") + c + "', expected '" + balance->back() + "'");
      balance->pop_back();
    }
    tokens_.push_back(make(TokenType::kOperator, pos_, std::string(1, c)));
    ++pos_;
  }

  std::string src_;
  std::vector<size_t> line_starts_;  // byte offset of each line's first character
  size_t pos_ = 0;
  size_t data_start_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace helios::jinja
