// JSON in (the caller's tools and tool calls, as values) and out (tojson, as Python's json.dumps).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "chat/value_ops.h"

namespace helios::jinja {
namespace {

using Json = nlohmann::ordered_json;  // keeps the keys in the order the text gives them

Value from_json_value(const Json& j, int depth) {
  if (depth > 256) unsupported("JSON nested more than 256 levels");
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case Json::value_t::number_float: return Value::number(j.get<double>());
    case Json::value_t::string: return Value::input_string(j.get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      for (const Json& item : j) items.push_back(from_json_value(item, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      for (auto it = j.begin(); it != j.end(); ++it) {
        items.emplace_back(Value::input_string(it.key()), from_json_value(it.value(), depth + 1));
      }
      return Value::dict(std::move(items));
    }
    default: unsupported("JSON value of an unsupported type");
  }
}

void append_json_string(const std::string& s, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    // A run that needs no escaping goes in at once: a template can print megabytes.
    size_t run = i;
    while (run < s.size() && static_cast<unsigned char>(s[run]) >= 0x20 && s[run] != '"' && s[run] != '\\') ++run;
    if (run > i) {
      out->append(s, i, run - i);
      i = run;
      if (i == s.size()) break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

std::string json_number(const Value& v) {
  if (v.kind() == Value::Kind::kInt) return std::to_string(v.as_int());
  const double d = v.as_float();
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return python_float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString: return k.as_string();
    case Value::Kind::kBool: return k.as_bool() ? "true" : "false";
    case Value::Kind::kNone: return "null";
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return json_number(k);
    default: unsupported("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

struct JsonWriter {
  int indent;
  std::string item_sep, key_sep;
  bool sort_keys;
  std::string out;

  void newline(int level) {
    check_text_size(out.size() + 1 + static_cast<size_t>(indent) * level);
    out += '\n';
    out.append(static_cast<size_t>(indent) * level, ' ');
  }

  void write(const Value& v, int level) {
    if (level > 256) unsupported("tojson: value nested more than 256 levels");
    check_text_size(out.size());
    switch (v.kind()) {
      case Value::Kind::kNone: out += "null"; return;
      case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::kInt:
      case Value::Kind::kFloat: out += json_number(v); return;
      case Value::Kind::kString: append_json_string(v.as_string(), &out); return;
      case Value::Kind::kList: {
        const auto& items = v.as_list().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent >= 0) newline(level + 1);
          write(items[i], level + 1);
        }
        if (indent >= 0) newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& [k, val] : v.as_dict().items) items.emplace_back(json_key(k), &val);
        if (sort_keys) {
          std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        if (items.empty()) {
          out += "{}";
          return;
        }
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent >= 0) newline(level + 1);
          append_json_string(items[i].first, &out);
          out += key_sep;
          write(*items[i].second, level + 1);
        }
        if (indent >= 0) newline(level);
        out += '}';
        return;
      }
      default: unsupported("Object of type " + type_name(v) + " is not JSON serializable");
    }
  }
};

}  // namespace

StatusOr<Value> Value::from_json(std::string_view json) {
  Json parsed = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return invalid_argument("not valid JSON: " + std::string(json.substr(0, 80)));
  try {
    return from_json_value(parsed, 0);
  } catch (const Error& e) {
    return Status(e.code, e.message);
  }
}

std::string to_json(const Value& v, int indent, const std::string* item_separator,
                    const std::string* key_separator, bool sort_keys) {
  JsonWriter w{indent, item_separator ? *item_separator : (indent >= 0 ? "," : ", "),
               key_separator ? *key_separator : ": ", sort_keys, {}};
  w.write(v, 0);
  return std::move(w.out);
}

}  // namespace helios::jinja
