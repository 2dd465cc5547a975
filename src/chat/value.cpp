// Values and texts: construction, where each byte came from, and Python's truth, equality,
// ordering, str() and repr() over them.
#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/value_ops.h"
#include "tokenizer/unicode.h"

namespace helios::jinja {

// ---- Text ---------------------------------------------------------------------------------------

Text Text::literal(std::string bytes) {
  Text t;
  t.bytes_ = std::move(bytes);
  return t;
}

Text Text::from_input(std::string bytes) {
  Text t;
  t.bytes_ = std::move(bytes);
  t.mark_input(0, t.bytes_.size());
  return t;
}

void Text::mark_input(size_t begin, size_t end) {
  if (begin >= end) return;
  if (!input_.empty() && input_.back().end >= begin) {
    input_.back().end = std::max(input_.back().end, end);
  } else {
    input_.push_back({begin, end});
  }
}

void Text::append(const Text& other) {
  const size_t base = bytes_.size();
  bytes_ += other.bytes_;
  for (const Range& r : other.input_) mark_input(base + r.begin, base + r.end);
}

void Text::append_literal(std::string_view bytes) { bytes_.append(bytes); }

void Text::append_input(std::string_view bytes) {
  const size_t base = bytes_.size();
  bytes_.append(bytes);
  mark_input(base, bytes_.size());
}

Text Text::substr(size_t begin, size_t end) const {
  end = std::min(end, bytes_.size());
  begin = std::min(begin, end);
  Text t;
  t.bytes_ = bytes_.substr(begin, end - begin);
  for (const Range& r : input_) {
    const size_t b = std::max(r.begin, begin), e = std::min(r.end, end);
    if (b < e) t.mark_input(b - begin, e - begin);
  }
  return t;
}

std::vector<std::pair<std::string, bool>> Text::runs() const {
  std::vector<std::pair<std::string, bool>> out;
  size_t pos = 0;
  for (const Range& r : input_) {
    if (r.begin > pos) out.emplace_back(bytes_.substr(pos, r.begin - pos), false);
    out.emplace_back(bytes_.substr(r.begin, r.end - r.begin), true);
    pos = r.end;
  }
  if (pos < bytes_.size()) out.emplace_back(bytes_.substr(pos), false);
  return out;
}

// ---- Value --------------------------------------------------------------------------------------

const Value* Value::Dict::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Value::Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

template <typename T>
Value Value::of(T x) {
  Value v;
  v.v_ = std::move(x);
  return v;
}

Value Value::undefined(std::string hint) { return of(Undefined{std::make_shared<const std::string>(std::move(hint))}); }
Value Value::none() { return of(None{}); }
Value Value::boolean(bool b) { return of(b); }
Value Value::integer(int64_t i) { return of(i); }
Value Value::number(double d) { return of(d); }
Value Value::string(Text text) { return of(std::make_shared<const Text>(std::move(text))); }
Value Value::object(std::shared_ptr<Object> object) { return of(std::move(object)); }

namespace {
// Saturating: a value doubled 64 times must not wrap around to a small count.
int64_t add_parts(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
}  // namespace

Value Value::list(std::vector<Value> items, bool tuple) {
  int depth = 1;
  int64_t n_parts = 1;
  for (const Value& item : items) {
    depth = std::max(depth, item.depth() + 1);
    n_parts = add_parts(n_parts, item.parts());
  }
  return of(std::make_shared<const List>(List{std::move(items), tuple, depth, n_parts}));
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  int depth = 1;
  int64_t n_parts = 1;
  for (const auto& [k, item] : items) {
    depth = std::max(depth, item.depth() + 1);
    n_parts = add_parts(n_parts, add_parts(k.parts(), item.parts()));
  }
  return of(std::make_shared<const Dict>(Dict{std::move(items), depth, n_parts}));
}

int Value::depth() const {
  if (kind() == Kind::kList) return as_list().depth;
  if (kind() == Kind::kDict) return as_dict().depth;
  return 0;
}

int64_t Value::parts() const {
  if (kind() == Kind::kList) return as_list().n_parts;
  if (kind() == Kind::kDict) return as_dict().n_parts;
  return 1;
}

double Value::as_double() const {
  switch (kind()) {
    case Kind::kBool: return as_bool() ? 1.0 : 0.0;
    case Kind::kInt: return static_cast<double>(as_int());
    case Kind::kFloat: return as_float();
    default: return 0.0;
  }
}

const std::string& Value::undefined_hint() const {
  static const std::string kNone;
  const auto& u = std::get<Undefined>(v_);
  return u.hint ? *u.hint : kNone;
}

// ---- errors and objects ---------------------------------------------------------------------------

void fail(StatusCode code, std::string message) { throw Error{code, std::move(message)}; }
void unsupported(std::string message) { fail(StatusCode::kUnimplemented, std::move(message)); }

Value Object::attribute(const std::string& name) const {
  return Value::undefined("'" + type_name() + "' object has no attribute '" + name + "'");
}
bool Object::set_attribute(const std::string&, Value) { return false; }

// ---- Python semantics -------------------------------------------------------------------------------

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return v.as_list().tuple ? "tuple" : "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kObject: return v.as_object()->type_name();
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_float() != 0.0;
    case Value::Kind::kString: return !v.as_string().empty();
    case Value::Kind::kList: return !v.as_list().items.empty();
    case Value::Kind::kDict: return !v.as_dict().items.empty();
    case Value::Kind::kObject: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) {
      const int64_t x = a.kind() == Value::Kind::kBool ? a.as_bool() : a.as_int();
      const int64_t y = b.kind() == Value::Kind::kBool ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kObject: return a.as_object() == b.as_object();
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 bytes sort as code points
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList &&
      a.as_list().tuple == b.as_list().tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  unsupported("'<' is not supported between '" + type_name(a) + "' and '" + type_name(b) + "'");
}

// repr(float): the shortest digits that read back the same, fixed notation for exponents -4..15.
std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX"
  const size_t e_pos = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string sign, digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (sci[i] == '-') sign = "-";
    else if (sci[i] != '.') digits += sci[i];
  }
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + mantissa + exp_buf;
}

namespace {

bool printable_in_repr(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED: case U_LINE_SEPARATOR: case U_PARAGRAPH_SEPARATOR: case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0; pos < s.size();) {
    // A run of printable ASCII that needs no escaping goes in at once: a template can print megabytes.
    size_t run = pos;
    while (run < s.size() && s[run] >= 0x20 && s[run] < 0x7f && s[run] != '\\' && s[run] != quote) ++run;
    if (run > pos) {
      out.append(s, pos, run - pos);
      pos = run;
      continue;
    }
    const uint32_t cp = unicode::decode_one(s, &pos);
    char buf[16];
    if (cp == '\\') out += "\\\\";
    else if (cp == static_cast<uint32_t>(quote)) out += std::string("\\") + quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (printable_in_repr(cp)) unicode::append_utf8(cp, &out);
    else {
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    }
  }
  return out + quote;
}

}  // namespace

void check_text_size(size_t n_bytes) {
  if (n_bytes > kMaxTextBytes) {
    fail(StatusCode::kResourceExhausted,
         "a printed or JSON value passed " + std::to_string(kMaxTextBytes) + " bytes (limit)");
  }
}

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString: return string_repr(v.as_string());
    case Value::Kind::kList: {
      const auto& list = v.as_list();
      std::string out = list.tuple ? "(" : "[";
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i) out += ", ";
        out += repr(list.items[i]);
        check_text_size(out.size());
      }
      if (list.tuple && list.items.size() == 1) out += ",";
      return out + (list.tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(val);
        check_text_size(out.size());
      }
      return out + "}";
    }
    case Value::Kind::kObject: return v.as_object()->repr();
    default: return to_str(v);
  }
}

Text to_text(const Value& v) {
  if (v.is_string()) return v.as_text();
  return Text::from_input(to_str(v));
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return python_float_repr(v.as_float());
    case Value::Kind::kString: return v.as_string();
    default: return repr(v);
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, val] : v.as_dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const Text& text = v.as_text();
      for (size_t pos = 0; pos < text.size();) {
        const size_t start = pos;
        unicode::decode_one(text.bytes(), &pos);
        chars.push_back(Value::string(text.substr(start, pos)));
      }
      return chars;
    }
    default: unsupported("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: {
      int64_t n = 0;
      for (size_t pos = 0; pos < v.as_string().size(); ++n) unicode::decode_one(v.as_string(), &pos);
      return n;
    }
    case Value::Kind::kList: return static_cast<int64_t>(v.as_list().items.size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.as_dict().items.size());
    default: unsupported("object of type '" + type_name(v) + "' has no len()");
  }
}

}  // namespace helios::jinja
