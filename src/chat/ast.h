// The parsed form of a template: expressions and statements, each with its line and column.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "helios/jinja.h"

namespace helios::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using Kwargs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items
    kDict,      // args: key, value, key, value, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], each bound may be null
    kCall,      // args[0](args[1:], kwargs)
    kFilter,    // args[0] | name(args[1:], kwargs); args[0] null in {% filter %}
    kTest,      // args[0] is [not] name(args[1:], kwargs)
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] name args[1]: + - * / // % **
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kConcat,    // args[0] ~ args[1] ~ ...
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0, column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  Kwargs kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kData,         // text
    kPrint,        // {{ expr }}
    kIf,           // branches (cond, body)..., else_body
    kFor,          // for targets in expr [if cond]: body, else_body
    kSet,          // set targets = expr; with ns_attr: set targets[0].ns_attr = expr
    kSetBlock,     // set targets[0]: body
    kMacro,        // macro targets[0](params): body
    kFilterBlock,  // filter expr (a kFilter with no subject): body
    kWith,         // with params: body
    kScope,        // a body run as is ({% generation %})
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0, column = 0;
  Text text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  std::string ns_attr;
  Kwargs params;  // macro parameters (default may be null), with-assignments
};

namespace detail {
struct Program {
  Body body;
};
}  // namespace detail

// Throws Error (UNIMPLEMENTED, with line and column) for a template it cannot parse.
detail::Program parse_program(const std::string& source);

}  // namespace helios::jinja
