// A sandboxed Jinja interpreter for chat templates: the subset of Jinja2 that GGUF and Hugging
// Face chat templates use, rendered as transformers renders them (trim_blocks, lstrip_blocks,
// loop controls, tojson as json.dumps, raise_exception, strftime_now).
//
// A template sees only the variables passed to render() and a few builtins (range, namespace,
// dict, raise_exception, strftime_now); nothing else of the process. Every render is bounded in
// steps, output bytes and call depth; going past a bound is an error, never a hang or a crash.
//
// Strings remember where their bytes came from: the template's own text (its data and string
// literals) or the caller's variables. The rendered output keeps that split, so the caller can
// let only template text become control tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "helios/status.h"

namespace helios::jinja {

// A string and the byte ranges [begin, end) of it that came from the caller's variables; every
// other byte was written by the template itself. Ranges are sorted, disjoint and not adjacent.
class Text {
 public:
  struct Range {
    size_t begin, end;
  };
  Text() = default;
  static Text literal(std::string bytes);     // written by the template
  static Text from_input(std::string bytes);  // copied from a variable

  const std::string& bytes() const { return bytes_; }
  const std::vector<Range>& input_ranges() const { return input_; }
  size_t size() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }
  bool has_input() const { return !input_.empty(); }

  void append(const Text& other);
  void append_literal(std::string_view bytes);
  void append_input(std::string_view bytes);
  Text substr(size_t begin, size_t end) const;  // byte offsets, clamped
  // Runs of bytes with one origin, in order: (bytes, from_input).
  std::vector<std::pair<std::string, bool>> runs() const;

 private:
  void mark_input(size_t begin, size_t end);
  std::string bytes_;
  std::vector<Range> input_;
};

class Object;  // callables, namespaces, loop state: defined by the interpreter

// A Jinja value: JSON's types (none, bool, int, float, string, list, dict with insertion order)
// plus undefined, tuples (lists that print as tuples) and interpreter objects.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject };
  struct List {
    std::vector<Value> items;
    bool tuple = false;
    int depth = 1;        // 1 + the deepest item's depth
    int64_t n_parts = 1;  // 1 + its items' n_parts: what a walk over it visits (see parts())
  };
  struct Dict {
    std::vector<std::pair<Value, Value>> items;  // keys are strings or numbers, in insertion order
    int depth = 1;
    int64_t n_parts = 1;
    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint);  // `hint` names what was missing, for errors
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(Text text);
  static Value input_string(std::string s) { return string(Text::from_input(std::move(s))); }
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> items);
  static Value object(std::shared_ptr<Object> object);
  // JSON text as a value whose strings (keys too) all come from the caller.
  static StatusOr<Value> from_json(std::string_view json);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_number() const { return kind() == Kind::kInt || kind() == Kind::kFloat || kind() == Kind::kBool; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  double as_double() const;  // any number (bools count as 0/1)
  const Text& as_text() const { return *std::get<std::shared_ptr<const Text>>(v_); }
  const std::string& as_string() const { return as_text().bytes(); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(v_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(v_); }
  const std::shared_ptr<Object>& as_object() const { return std::get<std::shared_ptr<Object>>(v_); }
  const std::string& undefined_hint() const;
  int depth() const;  // how deeply lists and dicts nest in it: 0 for anything else
  // The values in it, itself included, each counted as often as it is held: what printing or
  // comparing it visits. Lists share their items, so [x, x] doubles it at the cost of one list.
  int64_t parts() const;

 private:
  struct Undefined {
    std::shared_ptr<const std::string> hint;
  };
  struct None {};
  template <typename T>
  static Value of(T x);
  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const Text>,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Object>>
      v_;
};

struct Limits {
  int64_t max_steps = 5'000'000;          // nodes evaluated and loop iterations
  size_t max_output_bytes = 16 << 20;     // the rendered text, and any one string built on the way
  int32_t max_call_depth = 64;            // nested macro calls
};

struct RenderOptions {
  Limits limits;
  // What strftime_now formats (local time); tests pin it.
  std::chrono::system_clock::time_point now = std::chrono::system_clock::now();
};

namespace detail {
struct Program;
}

// A parsed template. Errors (parse and render) are Status values whose message names the template
// line and column. The codes say why:
//   UNIMPLEMENTED       the template uses something this interpreter does not run, or fails at
//                       run time (a type error, an undefined value's attribute, ...)
//   INVALID_ARGUMENT    the template itself refused the input: raise_exception(message)
//   RESOURCE_EXHAUSTED  a limit was reached (steps, output bytes, call depth)
class Template {
 public:
  static StatusOr<Template> parse(std::string_view source);
  StatusOr<Text> render(const std::map<std::string, Value>& variables,
                        const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const detail::Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const detail::Program> program_;
};

}  // namespace helios::jinja
