// Jinja's filters (`x | trim`, `x | tojson(indent=4)`, ...), as Jinja2 3.1 defines them, with
// transformers' tojson (json.dumps, non-ASCII kept).
#include <algorithm>
#include <cfenv>
#include <cmath>

#include "chat/operators.h"
#include "chat/runtime.h"
#include "chat/text_ops.h"
#include "tokenizer/unicode.h"

namespace helios::jinja {
namespace {

Text derived(const Value& source, std::string bytes) {
  const bool input = source.is_string() ? source.as_text().has_input() : true;
  return input ? Text::from_input(std::move(bytes)) : Text::literal(std::move(bytes));
}

bool flag(const Args& args, size_t index, const char* name, bool dflt) {
  const Value* v = args.get(index, name);
  return v ? truthy(*v) : dflt;
}

// Jinja's attribute getter: "a.b.0" looks each part up as an item, then as an attribute.
Value lookup_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (v.is_undefined()) return v;
    v = get_item(v, numeric ? Value::integer(std::stoll(part)) : Value::string(Text::literal(part)));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

// Sort and min/max key: strings compare case-insensitively unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(Text::literal(text::lower(v.as_string())));
  return v;
}

Value select_items(Runtime& rt, const Value& seq, const Args& args, bool by_attribute, bool keep_matching) {
  size_t next_arg = 0;
  std::string attribute;
  if (by_attribute) {
    const Value* a = args.get(0, nullptr);
    if (!a || !a->is_string()) unsupported("selectattr/rejectattr need an attribute name");
    attribute = a->as_string();
    next_arg = 1;
  }
  const Value* test = args.get(next_arg, nullptr);
  Args test_args;
  for (size_t i = next_arg + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  std::vector<Value> out;
  for (const Value& item : iterate(seq)) {
    rt.step();
    const Value subject = by_attribute ? lookup_path(item, attribute) : item;
    bool match;
    if (!test) match = truthy(subject);
    else if (test->is_string()) match = apply_test(rt, test->as_string(), subject, test_args);
    else unsupported("select: the test must be named by a string");
    if (match == keep_matching) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value map_items(Runtime& rt, const Value& seq, const Args& args) {
  std::vector<Value> out;
  if (const Value* attribute = args.get(99, "attribute")) {
    if (!attribute->is_string()) unsupported("map(attribute=...) needs a string");
    const Value* dflt = args.get(99, "default");
    for (const Value& item : iterate(seq)) {
      rt.step();
      Value v = lookup_path(item, attribute->as_string());
      if (v.is_undefined() && dflt) v = *dflt;
      out.push_back(std::move(v));
    }
    return Value::list(std::move(out));
  }
  const Value* filter = args.get(0, nullptr);
  if (!filter || !filter->is_string()) unsupported("map() needs a filter name or attribute=...");
  Args rest;
  for (size_t i = 1; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  for (const Value& item : iterate(seq)) {
    rt.step();
    out.push_back(apply_filter(rt, filter->as_string(), item, rest));
  }
  return Value::list(std::move(out));
}

std::vector<Value> sorted(std::vector<Value> items, bool case_sensitive, const Value* attribute) {
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const Value ka = sort_key(attribute ? lookup_path(a, attribute->as_string()) : a, case_sensitive);
    const Value kb = sort_key(attribute ? lookup_path(b, attribute->as_string()) : b, case_sensitive);
    return compare(ka, kb) < 0;
  });
  return items;
}

Value to_int(const Value& v, const Args& args) {
  const Value* dflt = args.get(0, "default");
  const Value fallback = dflt ? *dflt : Value::integer(0);
  switch (v.kind()) {
    case Value::Kind::kInt: return v;
    case Value::Kind::kBool: return Value::integer(v.as_bool());
    case Value::Kind::kFloat:
      if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) > 9.2e18) return fallback;
      return Value::integer(static_cast<int64_t>(v.as_float()));
    case Value::Kind::kString: {
      std::string s = text::strip(v.as_text(), text::Side::kBoth, nullptr).bytes();
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      const Value* base = args.get(1, "base");
      try {
        size_t used = 0;
        const int64_t i = std::stoll(s, &used, base && base->kind() == Value::Kind::kInt ? static_cast<int>(base->as_int()) : 10);
        if (used == s.size()) return Value::integer(i);
      } catch (...) {
      }
      try {
        size_t used = 0;
        const double d = std::stod(s, &used);
        if (used == s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
      } catch (...) {
      }
      return fallback;
    }
    default: return fallback;
  }
}

Value to_float(const Value& v, const Args& args) {
  const Value* dflt = args.get(0, "default");
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    const std::string s = text::strip(v.as_text(), text::Side::kBoth, nullptr).bytes();
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value::number(d);
    } catch (...) {
    }
  }
  return dflt ? *dflt : Value::number(0.0);
}

Value round_value(const Value& v, const Args& args) {
  if (!v.is_number()) unsupported("round needs a number");
  const Value* precision = args.get(0, "precision");
  const Value* method = args.get(1, "method");
  const int64_t p = precision && precision->kind() == Value::Kind::kInt ? precision->as_int() : 0;
  const std::string m = method && method->is_string() ? method->as_string() : "common";
  const double scale = std::pow(10.0, static_cast<double>(p));
  const double x = v.as_double() * scale;
  double r;
  if (m == "ceil") r = std::ceil(x);
  else if (m == "floor") r = std::floor(x);
  else if (m == "common") r = std::nearbyint(x);  // Python's round(): halves to even
  else unsupported("round: method must be 'common', 'ceil' or 'floor'");
  return Value::number(r / scale);
}

Value indent(Runtime& rt, const Value& v, const Args& args) {
  const Value* width = args.get(0, "width");
  const size_t n_spaces = width && width->kind() == Value::Kind::kInt ? static_cast<size_t>(std::max<int64_t>(0, width->as_int())) : 4;
  if (!(width && width->is_string())) rt.check_size(n_spaces);
  const std::string pad = width && width->is_string() ? width->as_string() : std::string(n_spaces, ' ');
  const bool first = flag(args, 1, "first", false), blank = flag(args, 2, "blank", false);
  const std::string s = to_str(v);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = s.find('\n', start)) != std::string::npos; start = nl + 1) lines.push_back(s.substr(start, nl - start));
  lines.push_back(s.substr(start));
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n" + ((blank || !lines[i].empty()) ? pad + lines[i] : lines[i]);
    rt.check_size(out.size());
  }
  if (first) out = pad + out;
  rt.check_size(out.size());
  return Value::string(derived(v, std::move(out)));
}

Value jinja_title(const Value& v) {
  // Words start after any of "-", whitespace, "(", "{", "[", "<": each piece is upper(first) + lower(rest).
  const std::string s = to_str(v);
  std::string out;
  bool word_start = true;
  for (size_t pos = 0; pos < s.size();) {
    const size_t at = pos;
    const uint32_t cp = unicode::decode_one(s, &pos);
    const std::string ch = s.substr(at, pos - at);
    const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || text::is_space(cp);
    out += sep ? ch : (word_start ? text::upper(ch) : text::lower(ch));
    word_start = sep;
  }
  return Value::string(derived(v, std::move(out)));
}

Value escape_html(const Value& v) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::string(derived(v, std::move(out)));
}

Value tojson(Runtime& rt, const Value& v, const Args& args) {
  args.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (flag(args, 99, "ensure_ascii", false)) unsupported("tojson(ensure_ascii=true) is not supported");
  const Value* indent_v = args.get(0, "indent");
  const int64_t indent_arg = indent_v && indent_v->kind() == Value::Kind::kInt ? indent_v->as_int() : -1;
  check_text_size(static_cast<size_t>(std::max<int64_t>(indent_arg, 0)));  // so it fits an int, too
  const int indent_n = static_cast<int>(std::max<int64_t>(indent_arg, -1));
  std::string item_sep, key_sep;
  const Value* seps = args.get(99, "separators");
  if (seps && seps->kind() == Value::Kind::kList && seps->as_list().items.size() == 2) {
    item_sep = to_str(seps->as_list().items[0]);
    key_sep = to_str(seps->as_list().items[1]);
  }
  const bool have_seps = seps && !seps->is_none();
  std::string json = to_json(v, indent_n, have_seps ? &item_sep : nullptr, have_seps ? &key_sep : nullptr,
                             flag(args, 99, "sort_keys", false));
  rt.check_size(json.size());
  return Value::string(Text::from_input(std::move(json)));
}

Value sequence_end(const Value& v, bool first) {
  if (v.is_string()) {
    const std::vector<size_t> offsets = text::char_offsets(v.as_string());
    if (offsets.size() < 2) return Value::undefined("no first item, sequence was empty");
    const size_t i = first ? 0 : offsets.size() - 2;
    return Value::string(v.as_text().substr(offsets[i], offsets[i + 1]));
  }
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined(first ? "no first item, sequence was empty" : "no last item, sequence was empty");
  return first ? items.front() : items.back();
}

}  // namespace

Value apply_filter(Runtime& rt, const std::string& name, const Value& v, const Args& args) {
  if (name == "default" || name == "d") {
    const bool boolean = flag(args, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !truthy(v))) {
      const Value* dflt = args.get(0, "default_value");
      return dflt ? *dflt : Value::string(Text());
    }
    return v;
  }
  if (name == "trim") {
    const Value* chars = args.get(0, "chars");
    return Value::string(text::strip(to_text(v), text::Side::kBoth, chars && chars->is_string() ? &chars->as_string() : nullptr));
  }
  if (name == "safe" || name == "string") return v.is_string() ? v : Value::string(to_text(v));
  if (name == "upper") return Value::string(derived(v, text::upper(to_str(v))));
  if (name == "lower") return Value::string(derived(v, text::lower(to_str(v))));
  if (name == "capitalize") return Value::string(derived(v, text::capitalize(to_str(v))));
  if (name == "title") return jinja_title(v);
  if (name == "escape" || name == "e") return escape_html(v);
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "tojson") return tojson(rt, v, args);
  if (name == "first" || name == "last") return sequence_end(v, name == "first");
  if (name == "list") return Value::list(iterate(v));
  if (name == "int") return to_int(v, args);
  if (name == "float") return to_float(v, args);
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::number(std::fabs(v.as_float()));
    if (!v.is_number()) unsupported("bad operand type for abs(): '" + type_name(v) + "'");
    return v.as_double() < 0 ? negate(v) : (v.kind() == Value::Kind::kBool ? Value::integer(v.as_bool()) : v);
  }
  if (name == "round") return round_value(v, args);
  if (name == "indent") return indent(rt, v, args);
  if (name == "replace") {
    const Value* old = args.get(0, "old");
    const Value* with = args.get(1, "new");
    if (!old || !with || !old->is_string() || !with->is_string()) unsupported("replace needs two strings");
    Args method_args;
    method_args.positional = {*old, *with};
    if (const Value* count = args.get(2, "count"); count && !count->is_none()) method_args.positional.push_back(*count);
    return call_method(rt, Value::string(to_text(v)), "replace", method_args);
  }
  if (name == "join") {
    const Value* sep = args.get(0, "d");
    const Value* attribute = args.get(1, "attribute");
    Text out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      rt.step();
      if (!first && sep) out.append(to_text(*sep));
      first = false;
      out.append(to_text(attribute ? lookup_path(item, to_str(*attribute)) : item));
      rt.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (v.kind() != Value::Kind::kDict) unsupported("can only get item pairs from a mapping");
    std::vector<Value> out;
    for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::list({k, val}, true));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    if (v.kind() != Value::Kind::kDict) unsupported("dictsort needs a mapping");
    const bool case_sensitive = flag(args, 0, "case_sensitive", false);
    const Value* by = args.get(1, "by");
    const bool by_value = by && by->is_string() && by->as_string() == "value";
    std::vector<Value> pairs;
    for (const auto& [k, val] : v.as_dict().items) pairs.push_back(Value::list({k, val}, true));
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
      const size_t i = by_value ? 1 : 0;
      return compare(sort_key(a.as_list().items[i], case_sensitive), sort_key(b.as_list().items[i], case_sensitive)) < 0;
    });
    if (flag(args, 2, "reverse", false)) std::reverse(pairs.begin(), pairs.end());
    return Value::list(std::move(pairs));
  }
  if (name == "sort") {
    const Value* attribute = args.get(2, "attribute");
    std::vector<Value> out = sorted(iterate(v), flag(args, 1, "case_sensitive", false), attribute && attribute->is_string() ? attribute : nullptr);
    if (flag(args, 0, "reverse", false)) std::reverse(out.begin(), out.end());
    return Value::list(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<Value> chars = iterate(v);
      Text out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(it->as_text());
      return Value::string(std::move(out));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "unique" || name == "min" || name == "max") {
    const bool case_sensitive = flag(args, 0, "case_sensitive", false);
    const Value* attribute = args.get(1, "attribute");
    auto key = [&](const Value& item) {
      return sort_key(attribute && attribute->is_string() ? lookup_path(item, attribute->as_string()) : item, case_sensitive);
    };
    const std::vector<Value> items = iterate(v);
    if (name == "unique") {
      std::vector<Value> out, seen;
      for (const Value& item : items) {
        const Value k = key(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value::list(std::move(out));
    }
    if (items.empty()) return Value::undefined("no " + name + " item, sequence was empty");
    const Value* best = &items[0];
    for (const Value& item : items) {
      const int c = compare(key(item), key(*best));
      if (name == "min" ? c < 0 : c > 0) best = &item;
    }
    return *best;
  }
  if (name == "sum") {
    const Value* attribute = args.get(0, "attribute");
    const Value* start = args.get(1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const Value& item : iterate(v)) total = arithmetic(rt, "+", total, attribute ? lookup_path(item, to_str(*attribute)) : item);
    return total;
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    const std::string s = to_str(v);
    for (size_t pos = 0; pos < s.size();) {
      const uint32_t cp = unicode::decode_one(s, &pos);
      const bool word = cp == '_' || unicode::is_letter(cp) || unicode::is_number(cp);
      if (word && !in_word) ++n;
      in_word = word;
    }
    return Value::integer(n);
  }
  if (name == "map") return map_items(rt, v, args);
  if (name == "select" || name == "reject") return select_items(rt, v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_items(rt, v, args, true, name == "selectattr");
  unsupported("no filter named '" + name + "'");
}

}  // namespace helios::jinja
