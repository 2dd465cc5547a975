// Structured output: generated text held to JSON, or to a JSON schema, one byte at a time.
//
// A JsonGrammar is a schema compiled into nodes (object, array, string, number, integer, literal
// alternatives, unions told apart by their first character); a JsonMatcher walks one generation's
// text through it as a stack of frames, so that a sampler can ask whether a token's bytes may
// come next. Any order of properties is accepted, whitespace between tokens is bounded (a model
// cannot loop on blank lines), and the text ends when the top-level value does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "helios/status.h"

namespace helios {

class JsonGrammar {
 public:
  // Any JSON object: the OpenAI API's response_format {"type": "json_object"}.
  static std::shared_ptr<const JsonGrammar> any_object();
  // A JSON schema (its JSON text). Supported: type (one or a list), properties, required,
  // additionalProperties (false, true or a schema; unsaid, false where properties are listed,
  // as llama.cpp's grammars have it), items, minItems, maxItems, minLength,
  // maxLength, enum, const, anyOf/oneOf (alternatives a first character tells apart), $ref into
  // $defs/definitions (recursion included); annotations (title, description, default, examples,
  // format, ...) are ignored. Anything else is INVALID_ARGUMENT naming the keyword and where it is.
  static StatusOr<std::shared_ptr<const JsonGrammar>> from_schema(const std::string& schema_json);
  // from_schema, or where the schema is a top-level anyOf/oneOf whose alternatives no first
  // character tells apart (a union of object types, as pydantic writes Union[A, B]), one grammar
  // per alternative (with the top's $defs) for a JsonChoice. An alternative that does not compile
  // is the error.
  static StatusOr<std::vector<std::shared_ptr<const JsonGrammar>>> from_schema_choice(const std::string& schema_json);

  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kInteger, kLiterals, kUnion };
  static constexpr int32_t kNone = -1;
  struct Node {
    Kind kind = Kind::kUnion;
    // kObject: property names (JSON-encoded, without quotes) sorted bytewise, their value nodes,
    // which are required, and the node of any other property (kNone: no others).
    std::vector<std::string> keys;
    std::vector<int32_t> key_nodes;
    uint64_t required = 0;
    int32_t additional = kNone;
    // kArray
    int32_t items = kNone;
    int32_t min_items = 0, max_items = -1;  // -1: no bound
    // kString: characters (code points) at least / at most
    int32_t min_length = 0, max_length = -1;
    // kLiterals: the JSON texts of the allowed values (enum, const, true, false, null), sorted
    std::vector<std::string> literals;
    // kUnion: for each first byte, the alternative that starts with it (kNone: none)
    std::vector<int32_t> by_first_byte;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  int32_t root() const { return root_; }

 private:
  friend class JsonSchemaCompiler;
  std::vector<Node> nodes_;
  int32_t root_ = 0;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  // Feeds bytes; false when they cannot continue a valid text (the matcher is then unchanged).
  bool advance(std::string_view bytes);
  // Whether advance(bytes) would succeed, without changing anything.
  bool accepts(std::string_view bytes) const;
  // The text so far is a whole value: the generation may end here.
  bool complete() const;
  // Nothing may follow: the top-level value has closed.
  bool closed() const { return stack_.empty(); }

  // One level of the walk. Public for the implementation's helpers; callers need not look.
  struct Frame {
    enum Kind : uint8_t { kValue, kObject, kArray, kString, kKey, kNumber, kLiteral };
    Kind kind = kValue;
    uint8_t phase = 0;       // where inside the value
    uint8_t whitespace = 0;  // the current run of whitespace
    uint8_t escape = 0;      // strings: 0, or how far into an escape (1: after '\', 2-5: \u digits)
    uint8_t utf8_left = 0;   // strings: continuation bytes still due
    uint8_t utf8_lo = 0x80, utf8_hi = 0xBF;  // the range of the next continuation byte
    int32_t node = 0;
    int32_t count = 0;       // arrays: items; strings: characters; objects: the pending key
    int32_t lo = 0, hi = 0, pos = 0;  // literals and keys: alternatives still matching, bytes matched
    uint64_t used = 0;       // objects: properties given
  };

 private:
  bool feed(std::vector<Frame>& stack, unsigned char byte) const;
  std::shared_ptr<const JsonGrammar> grammar_;
  std::vector<Frame> stack_;
  mutable std::vector<Frame> scratch_;  // accepts() walks a copy
};

// Text held to any of several grammars (a union no first character tells apart, such as the calls
// of several tools, each an object): one matcher per grammar; bytes go to those that take them and
// the others drop out.
class JsonChoice {
 public:
  explicit JsonChoice(const std::vector<std::shared_ptr<const JsonGrammar>>& grammars);

  bool advance(std::string_view bytes);  // false (nothing changed) when no grammar takes them
  bool accepts(std::string_view bytes) const;
  bool complete() const;  // the text so far is a whole value of one of them
  bool closed() const;    // nothing may follow in any of them

 private:
  std::vector<JsonMatcher> alive_;
};

}  // namespace helios
