#include "metrics/text_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace helios::metrics_text {

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integers up to 2^53 are exact in a double; print them without a fraction or exponent.
  constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53
  if (std::fabs(v) <= kMaxExactInteger && v == std::trunc(v)) {
    return std::to_string(static_cast<int64_t>(v));  // also turns -0.0 into "0"
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  return std::string(buf, res.ptr);
}

std::string escape_label_value(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {
bool is_alpha_(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

bool valid_metric_name(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = is_alpha_(c) || c == ':' || (i > 0 && is_digit(c));
    if (!ok) return false;
  }
  return true;
}

bool valid_label_name(std::string_view s) {
  if (s.empty() || s.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (!(is_alpha_(c) || (i > 0 && is_digit(c)))) return false;
  }
  return true;
}

std::string render_labels(const MetricLabels& labels, std::string_view extra) {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) out += ',';
    first = false;
    out += key;
    out += "=\"";
    out += escape_label_value(value);
    out += '"';
  }
  if (!extra.empty()) {
    if (!first) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

}  // namespace helios::metrics_text
