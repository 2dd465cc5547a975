// Methods of strings, dicts and lists (what the immutable sandbox allows), namespaces, and the
// builtin globals: range, namespace, dict, raise_exception, strftime_now.
#include <unicode/uchar.h>

#include <ctime>
#include <set>

#include "chat/runtime.h"
#include "chat/text_ops.h"
#include "tokenizer/unicode.h"

namespace helios::jinja {

const Value* Args::get(size_t index, const char* name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keyword) {
    if (name && key == name) return &value;
  }
  return nullptr;
}

void Args::check(const char* what, size_t n_max, std::initializer_list<const char*> keywords) const {
  if (positional.size() > n_max) {
    unsupported(std::string(what) + " takes at most " + std::to_string(n_max) + " argument(s), got " +
                std::to_string(positional.size()));
  }
  for (const auto& [key, value] : keyword) {
    bool known = false;
    for (const char* k : keywords) known = known || key == k;
    if (!known) unsupported(std::string(what) + " got an unexpected keyword argument '" + key + "'");
  }
}

namespace {

class BoundMethod : public Callable {
 public:
  BoundMethod(Value receiver, std::string name) : receiver_(std::move(receiver)), name_(std::move(name)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return "<built-in method " + name_ + ">"; }
  Value call(Runtime& rt, const Args& args) override { return call_method(rt, receiver_, name_, args); }

 private:
  Value receiver_;
  std::string name_;
};

constexpr int kMaxReprDepth = 64;

class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  Value attribute(const std::string& name) const override {
    for (const auto& [k, v] : attrs_) {
      if (k == name) return v;
    }
    return Object::attribute(name);
  }
  bool set_attribute(const std::string& name, Value value) override {
    for (auto& [k, v] : attrs_) {
      if (k == name) {
        v = std::move(value);
        return true;
      }
    }
    attrs_.emplace_back(name, std::move(value));
    return true;
  }
  // A namespace can hold itself (ns.a = ns) or a chain of others: inside itself, or nested
  // deeper than kMaxReprDepth, it prints as Python prints a container inside itself.
  std::string repr() const override {
    static thread_local int depth = 0;
    if (printing_ || depth >= kMaxReprDepth) return "<Namespace {...}>";
    std::vector<std::pair<Value, Value>> items;
    for (const auto& [k, v] : attrs_) items.emplace_back(Value::string(Text::literal(k)), v);
    struct Printing {
      explicit Printing(bool* flag) : flag_(flag) {
        *flag_ = true;
        ++depth;
      }
      ~Printing() {
        *flag_ = false;
        --depth;
      }
      bool* flag_;
    } printing(&printing_);
    return "<Namespace " + jinja::repr(Value::dict(std::move(items))) + ">";
  }
  void drop_references() override { attrs_.clear(); }

 private:
  std::vector<std::pair<std::string, Value>> attrs_;
  mutable bool printing_ = false;  // inside its own repr()
};

const std::set<std::string> kStringMethods = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper", "lower", "replace", "title",
    "capitalize", "find", "count", "join", "isalpha", "isdigit", "isspace", "isalnum", "islower", "isupper"};
const std::set<std::string> kDictMethods = {"get", "items", "keys", "values", "copy"};
const std::set<std::string> kListMethods = {"index", "count", "copy"};
// Methods that would change a value: the immutable sandbox refuses them, as transformers' does.
const std::set<std::string> kMutating = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear",
                                         "update", "setdefault", "popitem"};

const std::string& string_arg(const Args& args, size_t i, const char* name, const char* what) {
  const Value* v = args.get(i, name);
  if (!v || !v->is_string()) unsupported(std::string(what) + ": argument " + std::to_string(i + 1) + " must be a string");
  return v->as_string();
}

Text derived(const Text& source, std::string bytes) {
  return source.has_input() ? Text::from_input(std::move(bytes)) : Text::literal(std::move(bytes));
}

int64_t char_index(const std::string& s, size_t byte_offset) {
  int64_t n = 0;
  for (size_t pos = 0; pos < byte_offset;) {
    unicode::decode_one(s, &pos);
    ++n;
  }
  return n;
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  for (size_t pos = 0; pos < s.size();) {
    if (!pred(static_cast<UChar32>(unicode::decode_one(s, &pos)))) return false;
  }
  return true;
}

Value replace(Runtime& rt, const Text& s, const std::string& old, const Text& with, int64_t count) {
  Text out;
  const std::string& b = s.bytes();
  size_t pos = 0;
  int64_t done = 0;
  if (old.empty()) {
    const std::vector<size_t> offsets = text::char_offsets(b);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(with);
        ++done;
      }
      out.append(s.substr(offsets[i], offsets[i + 1]));
      rt.check_size(out.size());
    }
    if (count < 0 || done < count) out.append(with);
    return Value::string(std::move(out));
  }
  for (size_t found; (count < 0 || done < count) && (found = b.find(old, pos)) != std::string::npos; ++done) {
    out.append(s.substr(pos, found));
    out.append(with);
    rt.check_size(out.size());
    pos = found + old.size();
  }
  out.append(s.substr(pos, b.size()));
  return Value::string(std::move(out));
}

Value string_method(Runtime& rt, const Text& s, const std::string& name, const Args& args) {
  const std::string& b = s.bytes();
  if (name == "startswith" || name == "endswith") {
    args.check(name.c_str(), 1);
    const Value* arg = args.get(0, nullptr);
    if (!arg) unsupported(name + "() takes exactly one argument");
    std::vector<Value> options = arg->kind() == Value::Kind::kList ? arg->as_list().items : std::vector<Value>{*arg};
    for (const Value& o : options) {
      if (!o.is_string()) unsupported(name + ": arguments must be strings");
      const std::string& p = o.as_string();
      if (p.size() > b.size()) continue;
      if (name == "startswith" ? b.compare(0, p.size(), p) == 0 : b.compare(b.size() - p.size(), p.size(), p) == 0) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    args.check(name.c_str(), 1);
    const Value* chars = args.get(0, nullptr);
    const std::string* set = chars && chars->is_string() ? &chars->as_string() : nullptr;
    const text::Side side = name == "strip" ? text::Side::kBoth : (name == "lstrip" ? text::Side::kLeft : text::Side::kRight);
    return Value::string(text::strip(s, side, set));
  }
  if (name == "split") {
    args.check("split", 2, {"sep", "maxsplit"});
    const Value* sep = args.get(0, "sep");
    const Value* maxsplit = args.get(1, "maxsplit");
    const std::string* sep_str = sep && sep->is_string() ? &sep->as_string() : nullptr;
    std::vector<Value> pieces;
    for (Text& piece : text::split(s, sep_str, maxsplit && maxsplit->kind() == Value::Kind::kInt ? maxsplit->as_int() : -1)) {
      pieces.push_back(Value::string(std::move(piece)));
    }
    return Value::list(std::move(pieces));
  }
  if (name == "upper") return Value::string(derived(s, text::upper(b)));
  if (name == "lower") return Value::string(derived(s, text::lower(b)));
  if (name == "title") return Value::string(derived(s, text::title(b)));
  if (name == "capitalize") return Value::string(derived(s, text::capitalize(b)));
  if (name == "replace") {
    args.check("replace", 3, {"count"});
    const std::string& old = string_arg(args, 0, nullptr, "replace");
    const Value* with = args.get(1, nullptr);
    if (!with || !with->is_string()) unsupported("replace: argument 2 must be a string");
    const Value* count = args.get(2, "count");
    return replace(rt, s, old, with->as_text(), count && count->kind() == Value::Kind::kInt ? count->as_int() : -1);
  }
  if (name == "find") {
    const size_t at = b.find(string_arg(args, 0, nullptr, "find"));
    return Value::integer(at == std::string::npos ? -1 : char_index(b, at));
  }
  if (name == "count") {
    const std::string& sub = string_arg(args, 0, nullptr, "count");
    if (sub.empty()) return Value::integer(char_index(b, b.size()) + 1);
    int64_t n = 0;
    for (size_t at = b.find(sub); at != std::string::npos; at = b.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = args.get(0, nullptr);
    if (!items) unsupported("join() takes exactly one argument");
    Text out;
    bool first = true;
    for (const Value& item : iterate(*items)) {
      if (!item.is_string()) unsupported("sequence item: expected str instance, " + type_name(item) + " found");
      if (!first) out.append(s);
      first = false;
      out.append(item.as_text());
      rt.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "isalpha") return Value::boolean(all_chars(b, [](UChar32 c) { return u_isalpha(c) != 0; }));
  if (name == "isdigit") return Value::boolean(all_chars(b, [](UChar32 c) { return u_isdigit(c) != 0; }));
  if (name == "isalnum") return Value::boolean(all_chars(b, [](UChar32 c) { return u_isalnum(c) != 0; }));
  if (name == "isspace") return Value::boolean(all_chars(b, [](UChar32 c) { return text::is_space(static_cast<uint32_t>(c)); }));
  if (name == "islower") return Value::boolean(text::is_all_case(b, true));
  if (name == "isupper") return Value::boolean(text::is_all_case(b, false));
  unsupported("'str' object has no method '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name, const Args& args) {
  const auto& items = d.as_dict().items;
  if (name == "get") {
    args.check("get", 2);
    const Value* key = args.get(0, nullptr);
    if (!key) unsupported("get() needs a key");
    if (const Value* v = d.as_dict().find(*key)) return *v;
    const Value* dflt = args.get(1, nullptr);
    return dflt ? *dflt : Value::none();
  }
  if (name == "copy") return d;
  std::vector<Value> out;
  for (const auto& [k, v] : items) {
    if (name == "keys") out.push_back(k);
    else if (name == "values") out.push_back(v);
    else out.push_back(Value::list({k, v}, /*tuple=*/true));
  }
  return Value::list(std::move(out));
}

Value list_method(const Value& l, const std::string& name, const Args& args) {
  if (name == "copy") return l;
  const Value* x = args.get(0, nullptr);
  if (!x) unsupported(name + "() takes exactly one argument");
  const auto& items = l.as_list().items;
  int64_t n = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!equals(items[i], *x)) continue;
    if (name == "index") return Value::integer(static_cast<int64_t>(i));
    ++n;
  }
  if (name == "index") unsupported(repr(*x) + " is not in list");
  return Value::integer(n);
}

Value range(Runtime& rt, const Args& args) {
  args.check("range", 3);
  std::vector<int64_t> a;
  for (const Value& v : args.positional) {
    if (v.kind() != Value::Kind::kInt) unsupported("range() arguments must be integers");
    a.push_back(v.as_int());
  }
  if (a.empty()) unsupported("range expected at least 1 argument");
  const int64_t start = a.size() > 1 ? a[0] : 0, stop = a.size() > 1 ? a[1] : a[0], step = a.size() > 2 ? a[2] : 1;
  if (step == 0) unsupported("range() arg 3 must not be zero");
  const long double count = step > 0 ? (static_cast<long double>(stop) - start) / step : (static_cast<long double>(start) - stop) / -step;
  if (count > static_cast<long double>(rt.options().limits.max_steps)) {
    fail(StatusCode::kResourceExhausted, "range() of more than " + std::to_string(rt.options().limits.max_steps) + " items (limit)");
  }
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    rt.step();
    out.push_back(Value::integer(i));
  }
  return Value::list(std::move(out));
}

Value strftime_now(Runtime& rt, const Args& args) {
  args.check("strftime_now", 1);
  const Value* fmt = args.get(0, nullptr);
  if (!fmt || !fmt->is_string()) unsupported("strftime_now() needs a format string");
  if (fmt->as_string().size() > 256) unsupported("strftime_now(): format longer than 256 bytes");
  const std::time_t t = std::chrono::system_clock::to_time_t(rt.options().now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[1024];
  const size_t n = std::strftime(buf, sizeof buf, fmt->as_string().c_str(), &tm);
  return Value::string(Text::literal(std::string(buf, n)));
}

}  // namespace

Value bound_method(const Value& receiver, const std::string& name) {
  bool known = false;
  switch (receiver.kind()) {
    case Value::Kind::kString: known = kStringMethods.count(name) > 0; break;
    case Value::Kind::kDict: known = kDictMethods.count(name) || kMutating.count(name); break;
    case Value::Kind::kList: known = kListMethods.count(name) || kMutating.count(name); break;
    default: break;
  }
  if (!known) return Value();
  return Value::object(std::make_shared<BoundMethod>(receiver, name));
}

Value call_method(Runtime& rt, const Value& receiver, const std::string& name, const Args& args) {
  if (kMutating.count(name) && (receiver.kind() == Value::Kind::kDict || receiver.kind() == Value::Kind::kList)) {
    unsupported("'" + type_name(receiver) + "." + name + "' would modify a value, which the sandbox does not allow");
  }
  switch (receiver.kind()) {
    case Value::Kind::kString: return string_method(rt, receiver.as_text(), name, args);
    case Value::Kind::kDict: return dict_method(receiver, name, args);
    case Value::Kind::kList: return list_method(receiver, name, args);
    default: unsupported("'" + type_name(receiver) + "' object has no method '" + name + "'");
  }
}

std::vector<std::pair<std::string, Value>> builtin_globals() {
  auto fn = [](const char* name, NativeFunction::Fn f) {
    return std::make_pair(std::string(name), Value::object(std::make_shared<NativeFunction>(name, std::move(f))));
  };
  return {
      fn("range", range),
      fn("namespace", [](Runtime& rt, const Args& args) {
        auto ns = std::make_shared<Namespace>();
        rt.track(ns);
        if (const Value* init = args.get(0, nullptr); init && init->kind() == Value::Kind::kDict) {
          for (const auto& [k, v] : init->as_dict().items) ns->set_attribute(to_str(k), v);
        }
        for (const auto& [k, v] : args.keyword) ns->set_attribute(k, v);
        return Value::object(ns);
      }),
      fn("dict", [](Runtime&, const Args& args) {
        if (!args.positional.empty()) unsupported("dict() takes keyword arguments only");
        std::vector<std::pair<Value, Value>> items;
        for (const auto& [k, v] : args.keyword) items.emplace_back(Value::string(Text::literal(k)), v);
        return Value::dict(std::move(items));
      }),
      fn("raise_exception", [](Runtime&, const Args& args) -> Value {
        const Value* message = args.get(0, nullptr);
        fail(StatusCode::kInvalidArgument, message ? to_str(*message) : "raise_exception() called");
      }),
      fn("strftime_now", strftime_now),
  };
}

}  // namespace helios::jinja
