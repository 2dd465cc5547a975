// Python's operators over template values (see operators.h).
#include "chat/operators.h"

#include <cmath>
#include <algorithm>
#include <optional>

#include "chat/text_ops.h"

namespace helios::jinja {
namespace {

int64_t as_index_int(const Value& v, const char* what) {
  if (v.kind() == Value::Kind::kInt) return v.as_int();
  if (v.kind() == Value::Kind::kBool) return v.as_bool();
  unsupported(std::string(what) + " must be an integer, not '" + type_name(v) + "'");
}

bool is_integral(const Value& v) { return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool; }
int64_t int_of(const Value& v) { return v.kind() == Value::Kind::kBool ? v.as_bool() : v.as_int(); }

[[noreturn]] void operand_error(const std::string& op, const Value& a, const Value& b) {
  unsupported("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value repeat(Runtime& rt, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const Text& t = seq.as_text();
    rt.check_size(t.size() * static_cast<size_t>(n));
    Text out;
    for (int64_t i = 0; i < n; ++i) out.append(t);
    return Value::string(std::move(out));
  }
  const auto& list = seq.as_list();
  rt.check_size(list.items.size() * static_cast<size_t>(n));
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), list.items.begin(), list.items.end());
  return Value::list(std::move(out), list.tuple);
}

[[noreturn]] void overflow() { unsupported("integer overflow (values past 64 bits are not supported)"); }

int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
int64_t sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

Value int_power(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) result = mul(result, base);
    exp >>= 1;
    if (exp > 0) base = mul(base, base);
  }
  return Value::integer(result);
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: unsupported(obj.undefined_hint().empty() ? "undefined value has no attribute '" + name + "'"
                                                                       : obj.undefined_hint());
    case Value::Kind::kDict: {
      const Value method = bound_method(obj, name);
      if (!method.is_undefined()) return method;
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::kObject: return obj.as_object()->attribute(name);
    default: {
      const Value method = bound_method(obj, name);
      if (!method.is_undefined()) return method;
      return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
    }
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: unsupported(obj.undefined_hint().empty() ? "undefined value has no items" : obj.undefined_hint());
    case Value::Kind::kDict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (is_integral(key)) {
        int64_t i = int_of(key);
        if (obj.kind() == Value::Kind::kList) {
          const auto& items = obj.as_list().items;
          const auto n = static_cast<int64_t>(items.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
          return Value::undefined(type_name(obj) + " index " + std::to_string(int_of(key)) + " out of range");
        }
        const std::vector<size_t> offsets = text::char_offsets(obj.as_string());
        const auto n = static_cast<int64_t>(offsets.size()) - 1;
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::string(obj.as_text().substr(offsets[i], offsets[i + 1]));
        return Value::undefined("string index " + std::to_string(int_of(key)) + " out of range");
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value::undefined("'" + type_name(obj) + " object' has no element " + repr(key));
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.kind() != Value::Kind::kList && !obj.is_string()) {
    if (obj.is_undefined()) unsupported(obj.undefined_hint());
    unsupported("'" + type_name(obj) + "' object is not subscriptable");
  }
  const bool is_string = obj.is_string();
  const std::vector<size_t> offsets = is_string ? text::char_offsets(obj.as_string()) : std::vector<size_t>{};
  const int64_t n = is_string ? static_cast<int64_t>(offsets.size()) - 1 : static_cast<int64_t>(obj.as_list().items.size());
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return as_index_int(v, what);
  };
  const int64_t step = bound(step_v, "slice step").value_or(1);
  if (step == 0) unsupported("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> b, int64_t dflt) {
    if (!b) return dflt;
    int64_t i = *b < 0 ? *b + n : *b;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = adjust(bound(start_v, "slice start"), step > 0 ? 0 : n - 1);
  const int64_t stop = adjust(bound(stop_v, "slice stop"), step > 0 ? n : -1);
  std::vector<int64_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(i);
  if (is_string) {
    const Text& t = obj.as_text();
    if (step == 1) return Value::string(picked.empty() ? Text() : t.substr(offsets[start], offsets[stop]));
    Text out;
    for (int64_t i : picked) out.append(t.substr(offsets[i], offsets[i + 1]));
    return Value::string(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i : picked) out.push_back(obj.as_list().items[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.as_list().tuple);
}

Value negate(const Value& v) {
  if (is_integral(v)) return Value::integer(sub(0, int_of(v)));
  if (v.kind() == Value::Kind::kFloat) return Value::number(-v.as_float());
  unsupported("bad operand type for unary -: '" + type_name(v) + "'");
}

Value arithmetic(Runtime& rt, const std::string& op, const Value& a, const Value& b) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      rt.check_size(a.as_string().size() + b.as_string().size());
      Text out = a.as_text();
      out.append(b.as_text());
      return Value::string(std::move(out));
    }
    if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList && a.as_list().tuple == b.as_list().tuple) {
      std::vector<Value> out = a.as_list().items;
      out.insert(out.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(out), a.as_list().tuple);
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.kind() == Value::Kind::kList) && is_integral(b)) return repeat(rt, a, int_of(b));
    if ((b.is_string() || b.kind() == Value::Kind::kList) && is_integral(a)) return repeat(rt, b, int_of(a));
  }
  if (op == "%" && a.is_string()) unsupported("string formatting with '%' is not supported");
  if (!a.is_number() || !b.is_number()) operand_error(op, a, b);

  if (is_integral(a) && is_integral(b)) {
    const int64_t x = int_of(a), y = int_of(b);
    if (op == "+") return Value::integer(add(x, y));
    if (op == "-") return Value::integer(sub(x, y));
    if (op == "*") return Value::integer(mul(x, y));
    if (op == "/") {
      if (y == 0) unsupported("division by zero");
      return Value::number(static_cast<double>(x) / static_cast<double>(y));
    }
    if (op == "//" || op == "%") {
      if (y == 0) unsupported("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) overflow();
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y >= 0) return int_power(x, y);
      if (x == 0) unsupported("0 cannot be raised to a negative power");
      return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "/" || op == "//" || op == "%") {
    if (y == 0) unsupported("float division by zero");
    if (op == "/") return Value::number(x / y);
    if (op == "//") return Value::number(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::number(m);
  }
  if (op == "**") {
    if (x == 0 && y < 0) unsupported("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(x, y));
  }
  operand_error(op, a, b);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) unsupported("'in <string>' requires string as left operand, not " + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list().items) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict: return container.as_dict().find(item) != nullptr;
    default: unsupported("argument of type '" + type_name(container) + "' is not iterable");
  }
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  const int c = compare(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

}  // namespace helios::jinja
