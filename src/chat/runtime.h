// What filters, tests, methods and builtin functions see of a render in progress: the call
// arguments, the step and size budget, calls back into the interpreter (map('upper'), macros).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "chat/value_ops.h"

namespace helios::jinja {

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index`, or the keyword `name`; null when neither was given.
  const Value* get(size_t index, const char* name) const;
  size_t size() const { return positional.size() + keyword.size(); }
  // Fails naming `what` when more than `n_max` arguments (or an unknown keyword) were given.
  void check(const char* what, size_t n_max, std::initializer_list<const char*> keywords = {}) const;
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual void step() = 0;                         // one unit of work; fails past the step limit
  virtual void check_size(size_t n_bytes) = 0;     // fails when a string would pass the output limit
  virtual Value call(const Value& callee, const Args& args) = 0;
  // An object that may end up in a reference cycle (a namespace holding itself, a macro stored in
  // the scope it captures): its references are dropped when the render ends, so the cycle is freed.
  virtual void track(std::shared_ptr<Object> object) = 0;
  virtual const RenderOptions& options() const = 0;
};

class Callable : public Object {
 public:
  bool callable() const override { return true; }
  virtual Value call(Runtime& rt, const Args& args) = 0;
};

// A function written in C++ (builtins, loop.cycle).
class NativeFunction : public Callable {
 public:
  using Fn = std::function<Value(Runtime&, const Args&)>;
  NativeFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return "<built-in function " + name_ + ">"; }
  Value call(Runtime& rt, const Args& args) override { return fn_(rt, args); }

 private:
  std::string name_;
  Fn fn_;
};

// The value's method `name` (str.strip, dict.items, ...) bound to it, or undefined when it has none.
Value bound_method(const Value& receiver, const std::string& name);
Value call_method(Runtime& rt, const Value& receiver, const std::string& name, const Args& args);

Value apply_filter(Runtime& rt, const std::string& name, const Value& subject, const Args& args);
bool apply_test(Runtime& rt, const std::string& name, const Value& subject, const Args& args);

// range, namespace, dict, raise_exception, strftime_now: the globals every template sees.
std::vector<std::pair<std::string, Value>> builtin_globals();

}  // namespace helios::jinja
