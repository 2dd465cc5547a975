// Operators as Python runs them on template values: attribute and item access, slicing,
// arithmetic, comparison and membership.
#pragma once

#include <string>

#include "chat/runtime.h"

namespace helios::jinja {

// obj.name: a dict's method or key, a string's method, an object's attribute; undefined when
// missing (an undefined obj fails, as Jinja's UndefinedError).
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: a dict key, a list or string index (negative from the end); falls back to
// get_attribute for string keys.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on lists, tuples and strings (by character); unset bounds are undefined.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Value negate(const Value& v);
// + - * / // % ** with Python's rules (int overflow fails; strings and lists concatenate and
// repeat within the size limit).
Value arithmetic(Runtime& rt, const std::string& op, const Value& a, const Value& b);
// == != < <= > >= in notin.
bool compare_op(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);

}  // namespace helios::jinja
