#include "common/calculator.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace helios {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  StatusOr<double> parse() {
    if (at_end()) return invalid_argument("the expression is empty");
    HELIOS_ASSIGN_OR_RETURN(double v, expression());
    if (!at_end()) return invalid_argument(unexpected());
    if (!std::isfinite(v)) return invalid_argument("the result is not a finite number");
    return v;
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n')) ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ >= text_.size();
  }
  // The next character (after spaces), or '\0' at the end.
  char peek() { return at_end() ? '\0' : text_[pos_]; }
  bool take(std::string_view token) {
    skip_space();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  std::string unexpected() {
    if (at_end()) return "the expression ends too early";
    return "unexpected '" + std::string(1, text_[pos_]) + "' at " + std::to_string(pos_ + 1);
  }

  // expression := term (('+' | '-') term)*
  StatusOr<double> expression() {
    HELIOS_ASSIGN_OR_RETURN(double v, term());
    for (;;) {
      if (take("+")) {
        HELIOS_ASSIGN_OR_RETURN(double r, term());
        v += r;
      } else if (take("-")) {
        HELIOS_ASSIGN_OR_RETURN(double r, term());
        v -= r;
      } else {
        return v;
      }
    }
  }
  // term := unary (('*' | '/') unary)*    ('**' is power, not two products)
  StatusOr<double> term() {
    HELIOS_ASSIGN_OR_RETURN(double v, unary());
    for (;;) {
      skip_space();
      if (text_.substr(pos_, 2) != "**" && take("*")) {
        HELIOS_ASSIGN_OR_RETURN(double r, unary());
        v *= r;
      } else if (take("/")) {
        HELIOS_ASSIGN_OR_RETURN(double r, unary());
        if (r == 0) return invalid_argument("division by zero");
        v /= r;
      } else {
        return v;
      }
    }
  }
  // unary := ('-' | '+') unary | power
  StatusOr<double> unary() {
    if (++depth_ > 200) return invalid_argument("the expression nests too deeply");
    StatusOr<double> v = take("-") ? negate(unary()) : take("+") ? unary() : power();
    --depth_;
    return v;
  }
  static StatusOr<double> negate(StatusOr<double> v) {
    if (!v.ok()) return v;
    return -*v;
  }
  // power := primary (('^' | '**') unary)?
  StatusOr<double> power() {
    HELIOS_ASSIGN_OR_RETURN(double base, primary());
    if (take("^") || take("**")) {
      HELIOS_ASSIGN_OR_RETURN(double exponent, unary());
      const double v = std::pow(base, exponent);
      if (std::isnan(v)) return invalid_argument("the power has no real value");
      return v;
    }
    return base;
  }
  // primary := number | '(' expression ')'
  StatusOr<double> primary() {
    if (take("(")) {
      HELIOS_ASSIGN_OR_RETURN(double v, expression());
      if (!take(")")) return invalid_argument(at_end() ? "a '(' is never closed" : unexpected());
      return v;
    }
    return number();
  }
  StatusOr<double> number() {
    skip_space();
    std::string digits;
    size_t p = pos_;
    auto digit = [&](size_t i) { return i < text_.size() && text_[i] >= '0' && text_[i] <= '9'; };
    auto separator = [&](size_t i) {  // 1,000: a comma with exactly three digits after it
      return i < text_.size() && text_[i] == ',' && i > pos_ && digit(i - 1) && digit(i + 1) && digit(i + 2) &&
             digit(i + 3) && !digit(i + 4);
    };
    while (digit(p) || separator(p)) {
      if (text_[p] != ',') digits += text_[p];
      ++p;
    }
    if (p < text_.size() && text_[p] == '.') {
      digits += text_[p++];
      while (digit(p)) digits += text_[p++];
    }
    if (digits.empty() || digits == ".") return invalid_argument(unexpected());
    if (p < text_.size() && (text_[p] == 'e' || text_[p] == 'E')) {
      size_t q = p + 1;
      if (q < text_.size() && (text_[q] == '+' || text_[q] == '-')) ++q;
      if (digit(q)) {
        digits += text_.substr(p, q - p);
        p = q;
        while (digit(p)) digits += text_[p++];
      }
    }
    pos_ = p;
    return std::strtod(digits.c_str(), nullptr);
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<double> evaluate_arithmetic(std::string_view expression) { return Parser(expression).parse(); }

std::string format_number(double value) {
  char buf[64];
  if (value == 0) return "0";  // -0 too
  if (std::fabs(value) < 1e15 && value == std::floor(value)) {
    std::snprintf(buf, sizeof buf, "%.0f", value);
  } else {
    std::snprintf(buf, sizeof buf, "%.12g", value);
  }
  return buf;
}

}  // namespace helios
