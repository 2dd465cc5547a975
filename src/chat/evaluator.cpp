// The interpreter: runs a parsed template over the caller's variables, statement by statement,
// within the step, size and call-depth limits; Template::parse and Template::render.
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "chat/ast.h"
#include "chat/operators.h"
#include "chat/runtime.h"

namespace helios::jinja {
namespace {

// Variables of one scope. Loops make one per iteration and macros one per call; {% if %} none.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

class Macro;

// loop.index, loop.first, ... of one iteration.
class LoopState : public Object {
 public:
  LoopState(std::shared_ptr<const std::vector<Value>> items, size_t index0) : items_(std::move(items)), i_(index0) {}
  std::string type_name() const override { return "LoopContext"; }
  Value attribute(const std::string& name) const override {
    const auto n = static_cast<int64_t>(items_->size()), i = static_cast<int64_t>(i_);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(1);
    if (name == "depth0") return Value::integer(0);
    if (name == "previtem") return i > 0 ? (*items_)[i_ - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? (*items_)[i_ + 1] : Value::undefined("there is no next item");
    if (name == "cycle") {
      const size_t i = i_;
      return Value::object(std::make_shared<NativeFunction>("cycle", [i](Runtime&, const Args& args) {
        if (args.positional.empty()) unsupported("loop.cycle() needs at least one value");
        return args.positional[i % args.positional.size()];
      }));
    }
    return Object::attribute(name);
  }

 private:
  std::shared_ptr<const std::vector<Value>> items_;
  size_t i_;
};

enum class Flow { kNormal, kBreak, kContinue };

constexpr int kMaxValueDepth = 256;

class Evaluator final : public Runtime {
 public:
  Evaluator(const std::map<std::string, Value>& variables, const RenderOptions& options) : options_(options) {
    auto globals = std::make_shared<Frame>();
    for (auto& [name, value] : builtin_globals()) globals->vars[name] = value;
    for (const auto& [name, value] : variables) globals->vars[name] = value;
    root_ = std::make_shared<Frame>();
    root_->parent = std::move(globals);
  }
  // Cycles are broken first; the objects then go one by one (a long chain of namespaces, each
  // still held here, is never freed recursively).
  ~Evaluator() override {
    for (const auto& object : tracked_) object->drop_references();
  }

  Text run(const Body& body) {
    Text out;
    out_ = &out;
    exec_body(body, root_);
    return out;
  }

  // ---- Runtime ----
  void step() override {
    if (++steps_ > options_.limits.max_steps) {
      fail(StatusCode::kResourceExhausted,
           "the template ran more than " + std::to_string(options_.limits.max_steps) + " steps (limit)");
    }
  }
  void check_size(size_t n_bytes) override {
    if (n_bytes > options_.limits.max_output_bytes) {
      fail(StatusCode::kResourceExhausted, "the template built a string of " + std::to_string(n_bytes) +
                                               " bytes, more than the " +
                                               std::to_string(options_.limits.max_output_bytes) + "-byte limit");
    }
  }
  Value call(const Value& callee, const Args& args) override;
  void track(std::shared_ptr<Object> object) override {
    if (tracked_.size() >= prune_at_) {
      // Those only this list holds are garbage without a cycle: freed as the list grows.
      std::erase_if(tracked_, [](const std::shared_ptr<Object>& o) { return o.use_count() == 1; });
      prune_at_ = std::max<size_t>(1024, 2 * tracked_.size());
    }
    tracked_.push_back(std::move(object));
  }
  const RenderOptions& options() const override { return options_; }

  Text call_macro(const Macro& macro, const Args& args);

 private:
  friend class Macro;

  void emit(const Text& text) {
    out_->append(text);
    check_size(out_->size());
  }

  // Runs `body` into a fresh buffer and returns what it wrote.
  Text capture(const Body& body, const std::shared_ptr<Frame>& frame) {
    Text buffer;
    Text* saved = out_;
    out_ = &buffer;
    try {
      exec_body(body, frame);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buffer;
  }

  Value lookup(const std::string& name, const Frame* frame) const {
    for (; frame; frame = frame->parent.get()) {
      auto it = frame->vars.find(name);
      if (it != frame->vars.end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  Flow exec_body(const Body& body, const std::shared_ptr<Frame>& frame) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, frame);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, const std::shared_ptr<Frame>& frame) {
    try {
      step();
      return exec_inner(s, frame);
    } catch (Error& e) {
      if (e.line == 0) {
        e.line = s.line;
        e.column = s.column;
      }
      throw;
    }
  }

  Flow exec_inner(const Stmt& s, const std::shared_ptr<Frame>& frame);
  Flow exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame);
  void exec_set(const Stmt& s, Frame& frame);
  void assign(const std::vector<std::string>& targets, const Value& v, Frame& frame);

  Value eval(const Expr& e, const Frame& frame) {
    try {
      step();
      Value v = eval_inner(e, frame);
      // Deeper values would make printing, comparing and freeing them recurse without bound.
      if (v.depth() > kMaxValueDepth) unsupported("lists and dicts nest deeper than " + std::to_string(kMaxValueDepth) + " levels");
      // A list that holds another twice, nested n times, is 2^n values to print or compare.
      if (v.parts() - 1 > options_.limits.max_steps) {
        fail(StatusCode::kResourceExhausted, "a list or dict of more than " + std::to_string(options_.limits.max_steps) +
                                                 " values, counting each time one is held (limit)");
      }
      return v;
    } catch (Error& err) {
      if (err.line == 0) {
        err.line = e.line;
        err.column = e.column;
      }
      throw;
    }
  }
  Value eval_inner(const Expr& e, const Frame& frame);
  Args eval_args(const Expr& e, size_t first, const Frame& frame) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], frame));
    for (const auto& [key, expr] : e.kwargs) args.keyword.emplace_back(key, eval(*expr, frame));
    return args;
  }
  Value eval_filter_chain(const Expr& e, const Value& input, const Frame& frame) {
    const Value subject = e.args[0] ? eval_filter_chain(*e.args[0], input, frame) : input;
    return apply_filter(*this, e.name, subject, eval_args(e, 1, frame));
  }
  Value eval_compare(const Expr& e, const Frame& frame);

  const RenderOptions& options_;
  std::shared_ptr<Frame> root_;
  Text* out_ = nullptr;
  int64_t steps_ = 0;
  int32_t call_depth_ = 0;
  int32_t loop_depth_ = 0;
  std::vector<std::shared_ptr<Object>> tracked_;  // see Runtime::track
  size_t prune_at_ = 1024;
};

class Macro : public Callable {
 public:
  Macro(const Stmt* stmt, std::shared_ptr<Frame> scope) : stmt_(stmt), scope_(std::move(scope)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + stmt_->targets[0] + "'>"; }
  Value call(Runtime& rt, const Args& args) override {
    return Value::string(static_cast<Evaluator&>(rt).call_macro(*this, args));
  }
  void drop_references() override { scope_.reset(); }
  const Stmt* stmt_;
  std::shared_ptr<Frame> scope_;
};

Value Evaluator::call(const Value& callee, const Args& args) {
  if (callee.kind() == Value::Kind::kObject && callee.as_object()->callable()) {
    return static_cast<Callable&>(*callee.as_object()).call(*this, args);
  }
  if (callee.is_undefined()) unsupported(callee.undefined_hint());
  unsupported("'" + type_name(callee) + "' object is not callable");
}

Text Evaluator::call_macro(const Macro& macro, const Args& args) {
  const Stmt& m = *macro.stmt_;
  const std::string& name = m.targets[0];
  if (call_depth_ >= options_.limits.max_call_depth) {
    fail(StatusCode::kResourceExhausted, "macro calls nested deeper than " +
                                             std::to_string(options_.limits.max_call_depth) + " (limit)");
  }
  if (args.positional.size() > m.params.size()) {
    unsupported("macro '" + name + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
  }
  auto frame = std::make_shared<Frame>();
  frame->parent = macro.scope_;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& [param, dflt] = m.params[i];
    if (i < args.positional.size()) frame->vars[param] = args.positional[i];
    else if (dflt) frame->vars[param] = eval(*dflt, *frame);
    else frame->vars[param] = Value::undefined("parameter '" + param + "' was not given");
  }
  for (const auto& [key, value] : args.keyword) {
    bool known = false;
    for (const auto& p : m.params) known = known || p.first == key;
    if (!known) unsupported("macro '" + name + "' has no parameter named '" + key + "'");
    frame->vars[key] = value;
  }
  ++call_depth_;
  const int32_t saved_loops = loop_depth_;
  loop_depth_ = 0;
  Text out;
  try {
    out = capture(m.body, frame);
  } catch (...) {
    --call_depth_;
    loop_depth_ = saved_loops;
    throw;
  }
  --call_depth_;
  loop_depth_ = saved_loops;
  return out;
}

Flow Evaluator::exec_inner(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  switch (s.kind) {
    case Stmt::Kind::kData: emit(s.text); return Flow::kNormal;
    case Stmt::Kind::kPrint: emit(to_text(eval(*s.expr, *frame))); return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (const auto& [cond, body] : s.branches) {
        if (truthy(eval(*cond, *frame))) return exec_body(body, frame);
      }
      return exec_body(s.else_body, frame);
    case Stmt::Kind::kFor: return exec_for(s, frame);
    case Stmt::Kind::kSet: exec_set(s, *frame); return Flow::kNormal;
    case Stmt::Kind::kSetBlock: frame->vars[s.targets[0]] = Value::string(capture(s.body, frame)); return Flow::kNormal;
    case Stmt::Kind::kMacro: {
      auto macro = std::make_shared<Macro>(&s, frame);  // the frame holds it: a cycle
      track(macro);
      frame->vars[s.targets[0]] = Value::object(std::move(macro));
      return Flow::kNormal;
    }
    case Stmt::Kind::kFilterBlock: {
      const Value body = Value::string(capture(s.body, frame));
      emit(to_text(eval_filter_chain(*s.expr, body, *frame)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kWith: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      for (const auto& [name, expr] : s.params) inner->vars[name] = eval(*expr, *frame);
      return exec_body(s.body, inner);
    }
    case Stmt::Kind::kScope: return exec_body(s.body, frame);
    case Stmt::Kind::kBreak:
    case Stmt::Kind::kContinue:
      if (loop_depth_ == 0) unsupported("'{% break %}' and '{% continue %}' must be inside a for loop");
      return s.kind == Stmt::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
  }
  return Flow::kNormal;
}

void Evaluator::assign(const std::vector<std::string>& targets, const Value& v, Frame& frame) {
  if (targets.size() == 1) {
    frame.vars[targets[0]] = v;
    return;
  }
  const std::vector<Value> items = iterate(v);
  if (items.size() != targets.size()) {
    unsupported("cannot unpack " + std::to_string(items.size()) + " values into " +
                std::to_string(targets.size()) + " names");
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
}

void Evaluator::exec_set(const Stmt& s, Frame& frame) {
  const Value v = eval(*s.expr, frame);
  if (s.ns_attr.empty()) {
    assign(s.targets, v, frame);
    return;
  }
  const Value ns = lookup(s.targets[0], &frame);
  if (ns.kind() != Value::Kind::kObject || !ns.as_object()->set_attribute(s.ns_attr, v)) {
    unsupported("cannot assign attribute '" + s.ns_attr + "' on '" + s.targets[0] + "': not a namespace()");
  }
}

Flow Evaluator::exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  std::vector<Value> items = iterate(eval(*s.expr, *frame));
  if (s.cond) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      step();
      Frame probe;
      probe.parent = frame;
      assign(s.targets, item, probe);
      if (truthy(eval(*s.cond, probe))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    exec_body(s.else_body, inner);
    return Flow::kNormal;
  }
  auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
  ++loop_depth_;
  for (size_t i = 0; i < shared->size(); ++i) {
    step();
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    assign(s.targets, (*shared)[i], *inner);
    inner->vars["loop"] = Value::object(std::make_shared<LoopState>(shared, i));
    Flow flow;
    try {
      flow = exec_body(s.body, inner);
    } catch (...) {
      --loop_depth_;
      throw;
    }
    if (flow == Flow::kBreak) break;
  }
  --loop_depth_;
  return Flow::kNormal;
}

Value Evaluator::eval_compare(const Expr& e, const Frame& frame) {
  Value left = eval(*e.args[0], frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1], frame);
    if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Evaluator::eval_inner(const Expr& e, const Frame& frame) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return lookup(e.name, &frame);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const auto& a : e.args) items.push_back(eval(*a, frame));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      std::vector<std::pair<Value, Value>> items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value key = eval(*e.args[i], frame);
        if (key.kind() == Value::Kind::kList || key.kind() == Value::Kind::kDict || key.is_undefined()) {
          unsupported("unhashable type: '" + type_name(key) + "'");
        }
        Value value = eval(*e.args[i + 1], frame);
        bool replaced = false;
        for (auto& [k, v] : items) {
          if (equals(k, key)) {
            v = value;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(std::move(key), std::move(value));
      }
      return Value::dict(std::move(items));
    }
    case Expr::Kind::kGetAttr: return get_attribute(eval(*e.args[0], frame), e.name);
    case Expr::Kind::kGetItem: return get_item(eval(*e.args[0], frame), eval(*e.args[1], frame));
    case Expr::Kind::kSlice: {
      Value bounds[3];
      for (int i = 0; i < 3; ++i) {
        if (e.args[i + 1]) bounds[i] = eval(*e.args[i + 1], frame);
      }
      return slice(eval(*e.args[0], frame), bounds[0], bounds[1], bounds[2]);
    }
    case Expr::Kind::kCall: {
      const Expr& callee = *e.args[0];
      if (callee.kind == Expr::Kind::kGetAttr) {
        const Value receiver = eval(*callee.args[0], frame);
        const Value method = bound_method(receiver, callee.name);
        if (!method.is_undefined()) return call_method(*this, receiver, callee.name, eval_args(e, 1, frame));
        return call(get_attribute(receiver, callee.name), eval_args(e, 1, frame));
      }
      const Value fn = eval(callee, frame);
      return call(fn, eval_args(e, 1, frame));
    }
    case Expr::Kind::kFilter: return apply_filter(*this, e.name, eval(*e.args[0], frame), eval_args(e, 1, frame));
    case Expr::Kind::kTest: {
      const bool r = apply_test(*this, e.name, eval(*e.args[0], frame), eval_args(e, 1, frame));
      return Value::boolean(r != e.negated);
    }
    case Expr::Kind::kNot: return Value::boolean(!truthy(eval(*e.args[0], frame)));
    case Expr::Kind::kNeg: return negate(eval(*e.args[0], frame));
    case Expr::Kind::kPos: {
      Value v = eval(*e.args[0], frame);
      if (!v.is_number()) unsupported("bad operand type for unary +: '" + type_name(v) + "'");
      return v.kind() == Value::Kind::kBool ? Value::integer(v.as_bool()) : v;
    }
    case Expr::Kind::kBinary: {
      const Value a = eval(*e.args[0], frame);
      const Value b = eval(*e.args[1], frame);
      return arithmetic(*this, e.name, a, b);
    }
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? eval(*e.args[1], frame) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? a : eval(*e.args[1], frame);
    }
    case Expr::Kind::kConcat: {
      Text out;
      for (const auto& a : e.args) {
        out.append(to_text(eval(*a, frame)));
        check_size(out.size());
      }
      return Value::string(std::move(out));
    }
    case Expr::Kind::kCompare: return eval_compare(e, frame);
    case Expr::Kind::kCondExpr:
      if (truthy(eval(*e.args[1], frame))) return eval(*e.args[0], frame);
      return e.args[2] ? eval(*e.args[2], frame) : Value::undefined("the condition was false and there is no else");
  }
  return Value();
}

Status to_status(const Error& e) {
  std::string where = e.line > 0 ? "line " + std::to_string(e.line) + ", column " + std::to_string(e.column) + ": " : "";
  return Status(e.code, "chat template " + where + e.message);
}

}  // namespace

StatusOr<Template> Template::parse(std::string_view source) {
  try {
    auto program = std::make_shared<detail::Program>(parse_program(std::string(source)));
    return Template(std::move(program));
  } catch (const Error& e) {
    return to_status(e);
  }
}

StatusOr<Text> Template::render(const std::map<std::string, Value>& variables, const RenderOptions& options) const {
  try {
    Evaluator evaluator(variables, options);
    return evaluator.run(program_->body);
  } catch (const Error& e) {
    return to_status(e);
  }
}

}  // namespace helios::jinja
