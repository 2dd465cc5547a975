// Tokens -> statements and expressions, by Jinja2's grammar and operator precedence (lowest
// first): x if c else y, or, and, not, comparisons (== != < <= > >= in, not in), + -, ~, * / // %,
// **, unary - +, then postfix (.attr [index] (call)) and filters / tests (| f, is t).
#include <algorithm>
#include <set>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "chat/value_ops.h"

namespace helios::jinja {
namespace {

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  detail::Program program() {
    detail::Program p;
    p.body = body({});
    return p;
  }

 private:
  using EndNames = std::vector<std::string>;

  // ---- token helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool at_op(const char* op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool at_name(const char* name) const { return cur().type == TokenType::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void error(const Token& at, const std::string& message) const {
    throw Error{StatusCode::kUnimplemented, message, at.line, at.column};
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kEnd: return "end of template";
      case TokenType::kVarEnd: return "'}}'";
      case TokenType::kBlockEnd: return "'%}'";
      case TokenType::kData: return "template text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur(), std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) error(cur(), "expected a name, got " + describe(cur()));
    std::string name = cur().text;
    next();
    return name;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) error(cur(), "expected '%}', got " + describe(cur()));
    next();
  }
  void expect_end_tag(const char* name) {
    if (!skip_name(name)) error(cur(), std::string("expected '") + name + "', got " + describe(cur()));
    expect_block_end();
  }
  struct Nest {
    Parser& p;
    Nest(Parser& parser, const Token& at) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.error(at, "template nests deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nest() { --p.depth_; }
  };

  template <typename T>
  std::unique_ptr<T> node(typename T::Kind kind, const Token& at) {
    auto n = std::make_unique<T>();
    n->kind = kind;
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  // ---- statements ----

  // Statements up to a {% name %} whose name is in `ends`; returns with that name current.
  Body body(const EndNames& ends) {
    Nest nest(*this, cur());
    Body out;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEnd) {
        if (!ends.empty()) {
          std::string expected;
          for (const std::string& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
          error(t, "unexpected end of template, expected " + expected);
        }
        return out;
      }
      if (t.type == TokenType::kData) {
        auto s = node<Stmt>(Stmt::Kind::kData, t);
        s->text = Text::literal(t.text);
        out.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::kVarBegin) {
        auto s = node<Stmt>(Stmt::Kind::kPrint, t);
        next();
        s->expr = tuple(true, false);
        if (cur().type != TokenType::kVarEnd) error(cur(), "expected '}}', got " + describe(cur()));
        next();
        out.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        if (peek().type == TokenType::kName && std::find(ends.begin(), ends.end(), peek().text) != ends.end()) {
          next();
          return out;
        }
        next();
        out.push_back(statement());
      } else {
        error(t, "unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Stmt> statement() {
    const Token at = cur();
    if (at.type != TokenType::kName) error(at, "expected a tag name, got " + describe(at));
    const std::string& tag = at.text;
    if (tag == "if") return if_stmt();
    if (tag == "for") return for_stmt();
    if (tag == "set") return set_stmt();
    if (tag == "macro") return macro_stmt();
    if (tag == "filter") return filter_stmt();
    if (tag == "with") return with_stmt();
    if (tag == "generation") {
      next();
      expect_block_end();
      auto s = node<Stmt>(Stmt::Kind::kScope, at);
      s->body = body({"endgeneration"});
      expect_end_tag("endgeneration");
      return s;
    }
    if (tag == "break" || tag == "continue") {
      next();
      expect_block_end();
      return node<Stmt>(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, at);
    }
    static const std::set<std::string> kUnsupported = {"call", "block", "extends", "include", "import",
                                                       "from", "autoescape", "do", "trans"};
    if (kUnsupported.count(tag)) error(at, "'{% " + tag + " %}' is not supported");
    error(at, "unknown tag '" + tag + "'");
  }

  std::unique_ptr<Stmt> if_stmt() {
    auto s = node<Stmt>(Stmt::Kind::kIf, cur());
    next();
    while (true) {
      ExprPtr cond = tuple(false, false);
      expect_block_end();
      Body b = body({"endif", "elif", "else"});
      s->branches.emplace_back(std::move(cond), std::move(b));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        expect_block_end();
        s->else_body = body({"endif"});
      }
      break;
    }
    expect_end_tag("endif");
    return s;
  }

  std::vector<std::string> names_until(const char* end) {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    if (end && !at_name(end)) error(cur(), std::string("expected '") + end + "', got " + describe(cur()));
    return names;
  }

  std::unique_ptr<Stmt> for_stmt() {
    auto s = node<Stmt>(Stmt::Kind::kFor, cur());
    next();
    s->targets = names_until("in");
    next();
    s->expr = tuple(false, false, "recursive");
    if (skip_name("if")) s->cond = expression(true);
    if (at_name("recursive")) error(cur(), "recursive loops are not supported");
    expect_block_end();
    s->body = body({"endfor", "else"});
    if (skip_name("else")) {
      expect_block_end();
      s->else_body = body({"endfor"});
    }
    expect_end_tag("endfor");
    return s;
  }

  std::unique_ptr<Stmt> set_stmt() {
    const Token at = cur();
    next();
    std::vector<std::string> targets;
    std::string attr;
    targets.push_back(expect_name());
    if (skip_op(".")) {
      attr = expect_name();
    } else {
      while (skip_op(",")) targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      auto s = node<Stmt>(Stmt::Kind::kSet, at);
      s->targets = std::move(targets);
      s->ns_attr = std::move(attr);
      s->expr = tuple(true, false);
      expect_block_end();
      return s;
    }
    if (!attr.empty() || targets.size() != 1) error(cur(), "expected '=' in set");
    if (at_op("|")) error(cur(), "filters on {% set %} blocks are not supported");
    expect_block_end();
    auto s = node<Stmt>(Stmt::Kind::kSetBlock, at);
    s->targets = std::move(targets);
    s->body = body({"endset"});
    expect_end_tag("endset");
    return s;
  }

  std::unique_ptr<Stmt> macro_stmt() {
    auto s = node<Stmt>(Stmt::Kind::kMacro, cur());
    next();
    s->targets.push_back(expect_name());
    expect_op("(");
    while (!at_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (at_op(")")) break;
      std::string name = expect_name();
      ExprPtr dflt = skip_op("=") ? expression(true) : nullptr;
      if (!dflt && !s->params.empty() && s->params.back().second) error(cur(), "non-default argument follows default argument");
      s->params.emplace_back(std::move(name), std::move(dflt));
    }
    next();
    expect_block_end();
    s->body = body({"endmacro"});
    expect_end_tag("endmacro");
    return s;
  }

  std::unique_ptr<Stmt> filter_stmt() {
    auto s = node<Stmt>(Stmt::Kind::kFilterBlock, cur());
    next();
    ExprPtr chain;
    do {
      chain = filter(std::move(chain));
    } while (skip_op("|"));
    s->expr = std::move(chain);
    expect_block_end();
    s->body = body({"endfilter"});
    expect_end_tag("endfilter");
    return s;
  }

  std::unique_ptr<Stmt> with_stmt() {
    auto s = node<Stmt>(Stmt::Kind::kWith, cur());
    next();
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->params.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->params.emplace_back(std::move(name), expression(true));
    }
    expect_block_end();
    s->body = body({"endwith"});
    expect_end_tag("endwith");
    return s;
  }

  // ---- expressions ----

  bool tuple_end(const char* extra_end) const {
    const TokenType ty = cur().type;
    return ty == TokenType::kVarEnd || ty == TokenType::kBlockEnd || ty == TokenType::kEnd || at_op(")") ||
           (extra_end && at_name(extra_end));
  }

  // Comma-separated expressions: one gives itself, several (or a trailing comma) a tuple.
  ExprPtr tuple(bool with_condexpr, bool explicit_parentheses, const char* extra_end = nullptr) {
    const Token at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      items.push_back(expression(with_condexpr));
      if (at_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) error(cur(), "expected an expression, got " + describe(cur()));
    }
    auto e = node<Expr>(Expr::Kind::kTuple, at);
    e->args = std::move(items);
    return e;
  }

  ExprPtr expression(bool with_condexpr) {
    Nest nest(*this, cur());
    if (!with_condexpr) return or_expr();
    ExprPtr e = or_expr();
    while (at_name("if")) {
      auto c = node<Expr>(Expr::Kind::kCondExpr, cur());
      next();
      ExprPtr cond = or_expr();
      ExprPtr otherwise = skip_name("else") ? expression(true) : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr left, ExprPtr right, const Token& at, std::string op = {}) {
    auto e = node<Expr>(kind, at);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr left = and_expr();
    while (at_name("or")) {
      const Token at = cur();
      next();
      left = binary(Expr::Kind::kOr, std::move(left), and_expr(), at);
    }
    return left;
  }

  ExprPtr and_expr() {
    ExprPtr left = not_expr();
    while (at_name("and")) {
      const Token at = cur();
      next();
      left = binary(Expr::Kind::kAnd, std::move(left), not_expr(), at);
    }
    return left;
  }

  ExprPtr not_expr() {
    if (at_name("not")) {
      Nest nest(*this, cur());
      auto e = node<Expr>(Expr::Kind::kNot, cur());
      next();
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }

  ExprPtr compare() {
    const Token at = cur();
    ExprPtr first = math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    static const std::set<std::string> kOps = {"==", "!=", "<", "<=", ">", ">="};
    while (true) {
      if (cur().type == TokenType::kOperator && kOps.count(cur().text)) {
        ops.push_back(cur().text);
        next();
      } else if (at_name("in")) {
        ops.push_back("in");
        next();
      } else if (at_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(math1());
    }
    if (ops.empty()) return first;
    auto e = node<Expr>(Expr::Kind::kCompare, at);
    e->args.push_back(std::move(first));
    for (ExprPtr& o : operands) e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr math1() {
    ExprPtr left = concat();
    while (at_op("+") || at_op("-")) {
      const Token at = cur();
      next();
      left = binary(Expr::Kind::kBinary, std::move(left), concat(), at, at.text);
    }
    return left;
  }

  ExprPtr concat() {
    const Token at = cur();
    ExprPtr first = math2();
    if (!at_op("~")) return first;
    auto e = node<Expr>(Expr::Kind::kConcat, at);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(math2());
    return e;
  }

  ExprPtr math2() {
    ExprPtr left = pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token at = cur();
      next();
      left = binary(Expr::Kind::kBinary, std::move(left), pow(), at, at.text);
    }
    return left;
  }

  ExprPtr pow() {
    ExprPtr left = unary(true);
    while (at_op("**")) {
      const Token at = cur();
      next();
      left = binary(Expr::Kind::kBinary, std::move(left), unary(true), at, "**");
    }
    return left;
  }

  ExprPtr unary(bool with_filter) {
    Nest nest(*this, cur());
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      e = node<Expr>(at_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur());
      next();
      e->args.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(Value v, const Token& at) {
    auto e = node<Expr>(Expr::Kind::kLiteral, at);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr primary() {
    const Token at = cur();
    switch (at.type) {
      case TokenType::kName: {
        next();
        if (at.text == "true" || at.text == "True") return literal(Value::boolean(true), at);
        if (at.text == "false" || at.text == "False") return literal(Value::boolean(false), at);
        if (at.text == "none" || at.text == "None") return literal(Value::none(), at);
        auto e = node<Expr>(Expr::Kind::kName, at);
        e->name = at.text;
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) {
          s += cur().text;
          next();
        }
        return literal(Value::string(Text::literal(std::move(s))), at);
      }
      case TokenType::kInteger: next(); return literal(Value::integer(at.integer), at);
      case TokenType::kFloat: next(); return literal(Value::number(at.number), at);
      default: break;
    }
    if (skip_op("(")) {
      ExprPtr e = tuple(true, true);
      expect_op(")");
      return e;
    }
    if (at_op("[") || at_op("{")) {
      const bool is_dict = at_op("{");
      const char* close = is_dict ? "}" : "]";
      auto e = node<Expr>(is_dict ? Expr::Kind::kDict : Expr::Kind::kList, at);
      next();
      while (!at_op(close)) {
        if (!e->args.empty()) expect_op(",");
        if (at_op(close)) break;
        e->args.push_back(expression(true));
        if (is_dict) {
          expect_op(":");
          e->args.push_back(expression(true));
        }
      }
      next();
      return e;
    }
    error(at, "unexpected " + describe(at));
  }

  // Postfix nodes carry the position of the expression they apply to ("x" in "x.y[0]").
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      Token at = cur();
      at.line = e->line;
      at.column = e->column;
      if (skip_op(".")) {
        if (cur().type == TokenType::kInteger) {
          auto g = node<Expr>(Expr::Kind::kGetItem, at);
          g->args.push_back(std::move(e));
          g->args.push_back(literal(Value::integer(cur().integer), cur()));
          next();
          e = std::move(g);
        } else {
          auto g = node<Expr>(Expr::Kind::kGetAttr, at);
          g->name = expect_name();
          g->args.push_back(std::move(e));
          e = std::move(g);
        }
      } else if (skip_op("[")) {
        e = subscript(std::move(e), at);
      } else if (at_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr object, const Token& at) {
    ExprPtr bound[3];
    int n_bounds = 1;
    if (!at_op(":")) bound[0] = expression(true);
    if (skip_op(":")) {
      n_bounds = 2;
      if (!at_op("]") && !at_op(":")) bound[1] = expression(true);
      if (skip_op(":")) {
        n_bounds = 3;
        if (!at_op("]")) bound[2] = expression(true);
      }
    }
    if (at_op(",")) error(cur(), "tuple subscripts are not supported");
    expect_op("]");
    if (n_bounds == 1) {
      auto g = node<Expr>(Expr::Kind::kGetItem, at);
      g->args.push_back(std::move(object));
      g->args.push_back(std::move(bound[0]));
      return g;
    }
    auto s = node<Expr>(Expr::Kind::kSlice, at);
    s->args.push_back(std::move(object));
    for (ExprPtr& b : bound) s->args.push_back(std::move(b));
    return s;
  }

  void call_args(Expr* e) {
    expect_op("(");
    while (!at_op(")")) {
      if (n_call_args_ > 0) {
        expect_op(",");
        if (at_op(")")) break;
      }
      if (at_op("*") || at_op("**")) error(cur(), "*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        e->kwargs.emplace_back(std::move(key), expression(true));
      } else {
        if (!e->kwargs.empty()) error(cur(), "positional argument follows keyword argument");
        e->args.push_back(expression(true));
      }
      ++n_call_args_;
    }
    next();
  }

  void parse_call_args(Expr* e) {
    const int saved = n_call_args_;
    n_call_args_ = 0;
    call_args(e);
    n_call_args_ = saved;
  }

  ExprPtr call(ExprPtr callee) {
    auto c = node<Expr>(Expr::Kind::kCall, cur());
    c->args.push_back(std::move(callee));
    parse_call_args(c.get());
    return c;
  }

  ExprPtr filter(ExprPtr subject) {
    auto f = node<Expr>(Expr::Kind::kFilter, cur());
    f->name = expect_name();
    if (at_op(".")) error(cur(), "dotted filter names are not supported");
    f->args.push_back(std::move(subject));
    if (at_op("(")) parse_call_args(f.get());
    return f;
  }

  ExprPtr filter_expr(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        e = filter(std::move(e));
      } else if (at_name("is")) {
        auto t = node<Expr>(Expr::Kind::kTest, cur());
        next();
        t->negated = skip_name("not");
        t->name = expect_name();
        t->args.push_back(std::move(e));
        const TokenType ty = cur().type;
        if (at_op("(")) {
          parse_call_args(t.get());
        } else if ((ty == TokenType::kName || ty == TokenType::kString || ty == TokenType::kInteger ||
                    ty == TokenType::kFloat || at_op("[") || at_op("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and")) {
          if (at_name("is")) error(cur(), "tests cannot be chained with 'is'");
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (at_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int n_call_args_ = 0;
};

}  // namespace

detail::Program parse_program(const std::string& source) { return Parser(lex(source)).program(); }

}  // namespace helios::jinja
