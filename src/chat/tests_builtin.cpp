// Jinja's tests (`x is defined`, `x is equalto y`, ...), as Jinja2 3.1 defines them.
#include "chat/operators.h"
#include "chat/runtime.h"
#include "chat/text_ops.h"

namespace helios::jinja {
namespace {

const Value& arg(const Args& args, const std::string& test) {
  const Value* v = args.get(0, nullptr);
  if (!v) unsupported("test '" + test + "' needs an argument");
  return *v;
}

bool is_integral(const Value& v) { return v.kind() == Value::Kind::kInt; }

}  // namespace

bool apply_test(Runtime& rt, const std::string& name, const Value& v, const Args& args) {
  using K = Value::Kind;
  const K k = v.kind();
  if (name == "defined") return k != K::kUndefined;
  if (name == "undefined") return k == K::kUndefined;
  if (name == "none") return k == K::kNone;
  if (name == "boolean") return k == K::kBool;
  if (name == "true") return k == K::kBool && v.as_bool();
  if (name == "false") return k == K::kBool && !v.as_bool();
  if (name == "integer") return k == K::kInt;
  if (name == "float") return k == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return k == K::kString;
  if (name == "mapping") return k == K::kDict;
  if (name == "iterable") return k == K::kUndefined || k == K::kString || k == K::kList || k == K::kDict;
  if (name == "sequence") return k == K::kUndefined || k == K::kString || k == K::kList || k == K::kDict;
  if (name == "callable") return k == K::kObject && v.as_object()->callable();
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && text::is_all_case(v.as_string(), true);
  if (name == "upper") return v.is_string() && text::is_all_case(v.as_string(), false);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!is_integral(v) && k != K::kBool) unsupported("test '" + name + "' needs an integer, got '" + type_name(v) + "'");
    const int64_t i = k == K::kBool ? v.as_bool() : v.as_int();
    if (name == "odd") return i % 2 != 0;
    if (name == "even") return i % 2 == 0;
    const Value& d = arg(args, name);
    if (d.kind() != K::kInt || d.as_int() == 0) unsupported("divisibleby needs a non-zero integer");
    return i % d.as_int() == 0;
  }
  if (name == "==" || name == "eq" || name == "equalto") return equals(v, arg(args, name));
  if (name == "!=" || name == "ne") return !equals(v, arg(args, name));
  if (name == "<" || name == "lt" || name == "lessthan") return compare(v, arg(args, name)) < 0;
  if (name == "<=" || name == "le") return compare(v, arg(args, name)) <= 0;
  if (name == ">" || name == "gt" || name == "greaterthan") return compare(v, arg(args, name)) > 0;
  if (name == ">=" || name == "ge") return compare(v, arg(args, name)) >= 0;
  if (name == "in") return contains(arg(args, name), v);
  if (name == "sameas") {
    const Value& other = arg(args, name);
    if (v.kind() != other.kind()) return false;
    if (k == K::kNone || k == K::kUndefined) return true;
    if (k == K::kBool) return v.as_bool() == other.as_bool();
    if (k == K::kObject) return v.as_object() == other.as_object();
    return false;
  }
  (void)rt;
  unsupported("no test named '" + name + "'");
}

}  // namespace helios::jinja
