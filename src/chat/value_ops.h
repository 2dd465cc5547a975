// What the interpreter does with values, as Python does it: truth, equality, ordering, str(),
// repr(), iteration, length; plus interpreter objects and the error every operation throws.
#pragma once

#include <string>
#include <vector>

#include "helios/jinja.h"

namespace helios::jinja {

// Thrown inside the interpreter and turned into a Status by Template; `line` 0 means "not yet
// placed": the innermost node being run when it passes adds its position.
struct Error {
  StatusCode code;
  std::string message;
  int line = 0;
  int column = 0;
};
[[noreturn]] void fail(StatusCode code, std::string message);
// A template that cannot run here: an unsupported construct or a run-time failure.
[[noreturn]] void unsupported(std::string message);

// Namespaces, macros, loop state, bound methods, builtin functions.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  virtual Value attribute(const std::string& name) const;  // undefined when it has none
  virtual bool set_attribute(const std::string& name, Value value);  // only namespaces can
  virtual bool callable() const { return false; }
  virtual std::string repr() const { return "<" + type_name() + ">"; }
  // Drops what it refers to (Runtime::track): namespaces and macros can refer back to themselves.
  virtual void drop_references() {}
};

std::string type_name(const Value& v);  // Python's: 'str', 'int', 'list', 'dict', 'NoneType', ...
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// -1, 0 or 1; unorderable pairs (a string and a number, ...) fail as Python's TypeError does.
int compare(const Value& a, const Value& b);

// str(v): strings keep their bytes' origins; anything else is rendered as input text (a number or
// a list printed by the template is data, never a control token).
Text to_text(const Value& v);
std::string to_str(const Value& v);  // the bytes of to_text
std::string repr(const Value& v);
// No repr or JSON text is longer (a list holding one big value many times is cheap to build but
// not to print): longer ones fail with RESOURCE_EXHAUSTED as they pass it.
inline constexpr size_t kMaxTextBytes = Limits{}.max_output_bytes;
void check_text_size(size_t n_bytes);
std::string python_float_repr(double d);

// The items a for loop visits: a list's items, a dict's keys, a string's characters; undefined
// gives nothing. Anything else fails.
std::vector<Value> iterate(const Value& v);
int64_t length(const Value& v);

// JSON as Python's json.dumps(v, ensure_ascii=False, indent=indent, separators=...): indent < 0
// is None; the default separators are (", ", ": ") without indent and (",", ": ") with it.
std::string to_json(const Value& v, int indent, const std::string* item_separator = nullptr,
                    const std::string* key_separator = nullptr, bool sort_keys = false);

}  // namespace helios::jinja
