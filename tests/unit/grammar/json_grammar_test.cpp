#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "helios/gguf.h"
#include "helios/json_grammar.h"
#include "helios/output.h"
#include "test_paths.h"

namespace helios {
namespace {

using Json = nlohmann::json;

std::shared_ptr<const JsonGrammar> schema(const std::string& text) {
  auto g = JsonGrammar::from_schema(text);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

// Whole text: accepted byte by byte and complete at the end.
bool valid(const std::shared_ptr<const JsonGrammar>& g, const std::string& text) {
  JsonMatcher m(g);
  return m.advance(text) && m.complete();
}

TEST(JsonGrammar, AnyObjectTakesJsonObjectsOnly) {
  const auto g = JsonGrammar::any_object();
  EXPECT_TRUE(valid(g, R"({"a": [1, -2.5e-3, "x\u00e9\n", true, null, {}], "b": {"c": []}})"));
  EXPECT_TRUE(valid(g, "{\n  \"k\": \"caf\xC3\xA9\"\n}"));
  EXPECT_TRUE(valid(g, "  {}"));
  for (const char* bad : {"[1]", "\"s\"", "{\"a\" 1}", "{'a': 1}", "{\"a\": 01}", "{\"a\": 1,}", "{\"a\": 1.}",
                          "{\"a\": tru}", "{\"a\": \"\x01\"}", "{\"a\": \"\\x\"}", "{\"a\": \"\xC0\xAF\"}",
                          "{\"a\": \"\xED\xA0\x80\"}", "{} ", "{}{}", "{\"a\": -}"}) {
    EXPECT_FALSE(valid(g, bad)) << bad;
  }
  JsonMatcher m(g);
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.advance("{\"a\": 1"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accepts("}"));
  EXPECT_FALSE(m.closed());  // accepts() looked, without moving
  EXPECT_FALSE(m.advance("]"));
  EXPECT_TRUE(m.advance("}"));
  EXPECT_TRUE(m.closed());
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.accepts(" "));  // nothing after the value
}

TEST(JsonGrammar, WhitespaceRunsAreBounded) {
  const auto g = JsonGrammar::any_object();
  EXPECT_TRUE(valid(g, "{" + std::string(40, ' ') + "}"));
  EXPECT_FALSE(valid(g, "{" + std::string(41, ' ') + "}"));
  EXPECT_TRUE(valid(g, "{" + std::string(30, '\n') + "\"a\":" + std::string(30, ' ') + "1}"));
}

// Random edits of random JSON, against nlohmann's parser as the reference: the matcher takes
// exactly the texts that are a JSON object (less the whitespace bound and trailing whitespace).
TEST(JsonGrammar, AgreesWithAJsonParserOnEditedText) {
  std::mt19937 rng(7);
  std::function<Json(int)> random_value = [&](int depth) -> Json {
    switch (rng() % (depth > 3 ? 5 : 7)) {
      case 0: return static_cast<int>(rng() % 2000) - 1000;
      case 1: return std::ldexp(static_cast<double>(rng() % 100000), -static_cast<int>(rng() % 20));
      case 2: {
        static const char* const pieces[] = {"a", "b", "\"", "\\", "\n", "\xC3\xA9"};
        std::string s;
        for (int i = 1 + rng() % 4; i > 0; --i) s += pieces[rng() % 6];
        return s;
      }
      case 3: return rng() % 2 == 0;
      case 4: return nullptr;
      case 5: {
        Json a = Json::array();
        for (int i = rng() % 4; i > 0; --i) a.push_back(random_value(depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = rng() % 4; i > 0; --i) o[std::string(1, "kxy"[rng() % 3])] = random_value(depth + 1);
        return o;
      }
    }
  };
  const std::string alphabet = "{}[],:\" \n-0123456789.eE+tfnulrs\\";
  const auto g = JsonGrammar::any_object();
  int valid_seen = 0, invalid_seen = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Json o = Json::object();
    o["r"] = random_value(0);
    std::string text = o.dump(trial % 3 == 0 ? -1 : 2);
    const int edits = trial % 4;
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t at = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: text.erase(at, 1); break;
        case 1: text.insert(at, 1, c); break;
        default: text[at] = c;
      }
    }
    bool reference = Json::accept(text);
    if (reference) {
      const Json parsed = Json::parse(text);
      reference = parsed.is_object() && !text.empty() && text.find_last_not_of(" \n\t\r") == text.size() - 1;
    }
    const bool long_ws = text.find(std::string(41, ' ')) != std::string::npos;
    // JSON's grammar puts no bound on an exponent, but nlohmann refuses a number past a double's
    // range ("1E3125"), which Python's json reads as inf: no reference there.
    static const std::regex huge_exponent("[0-9][eE][+-]?0*[0-9]{3,}");
    if (long_ws || std::regex_search(text, huge_exponent)) continue;
    EXPECT_EQ(valid(g, text), reference) << text;
    (reference ? valid_seen : invalid_seen)++;
  }
  EXPECT_GT(valid_seen, 500);
  EXPECT_GT(invalid_seen, 500);
}

TEST(JsonGrammar, SchemaObjectsNeedTheirPropertiesAndOnlyThose) {
  const auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                            "nick": {"type": "string"}}, "required": ["name", "age"], "additionalProperties": false})");
  EXPECT_TRUE(valid(g, R"({"name": "Ada", "age": 36})"));
  EXPECT_TRUE(valid(g, R"({"age": 36, "nick": "A", "name": "Ada"})"));  // any order
  EXPECT_FALSE(valid(g, R"({"name": "Ada"})"));                        // age is required
  EXPECT_FALSE(valid(g, R"({"name": "Ada", "age": 36.5})"));           // an integer
  EXPECT_FALSE(valid(g, R"({"name": "Ada", "age": 1, "name": "B"})"));  // no property twice
  JsonMatcher m(g);
  EXPECT_TRUE(m.advance("{\"na"));
  EXPECT_FALSE(m.accepts("x"));  // no property starts "nax"
  EXPECT_TRUE(m.advance("me\": \"Ada\", \"age\": 3"));
  EXPECT_FALSE(m.accepts(", \"age\""));
  EXPECT_FALSE(m.accepts(", \"name\""));
  EXPECT_TRUE(m.accepts(", \"nick\""));
  EXPECT_FALSE(m.accepts(", \"other\""));
  // Unsaid, listed properties are the only ones (as llama.cpp's grammars have it), even when a
  // required name is not among them; without properties, any keys.
  const auto closed = schema(R"({"properties": {"a": {"type": "integer"}}, "required": ["a", "b"]})");
  EXPECT_TRUE(valid(closed, R"({"a": 1, "b": [true]})"));
  EXPECT_FALSE(valid(closed, R"({"a": 1, "b": 2, "c": 3})"));
  EXPECT_TRUE(valid(schema(R"({"properties": {}})"), "{}"));
  EXPECT_FALSE(valid(schema(R"({"properties": {}})"), R"({"x": 1})"));
  EXPECT_TRUE(valid(schema(R"({"type": "object"})"), R"({"x": {"y": [1]}})"));
  EXPECT_TRUE(valid(schema(R"({"properties": {"a": {}}, "additionalProperties": true})"), R"({"a": 1, "x": 2})"));
  // Open objects take any other name too, with its schema.
  const auto open = schema(R"({"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}})");
  EXPECT_TRUE(valid(open, R"({"b": "x", "a": 1, "ab": "y"})"));
  EXPECT_FALSE(valid(open, R"({"b": 1})"));
  EXPECT_FALSE(valid(open, R"({"a": "x"})"));
}

TEST(JsonGrammar, SchemaScalarsArraysAndEnums) {
  const auto g = schema(R"({"type": "array", "items": {"enum": ["red", "green", 1, 10, null]}, "minItems": 1, "maxItems": 2})");
  EXPECT_TRUE(valid(g, R"(["red", 10])"));
  EXPECT_TRUE(valid(g, R"([null])"));
  EXPECT_FALSE(valid(g, "[]"));
  EXPECT_FALSE(valid(g, R"(["red", 1, 1])"));
  EXPECT_FALSE(valid(g, R"(["blue"])"));
  EXPECT_FALSE(valid(g, R"([100])"));
  const auto s = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(valid(s, "\"\xC3\xA9t\xC3\xA9\""));  // three characters in five bytes
  EXPECT_TRUE(valid(s, R"("\n\u0041")"));           // escapes are one character each
  EXPECT_FALSE(valid(s, R"("abcd")"));
  EXPECT_FALSE(valid(s, R"("a")"));
  const auto n = schema(R"({"type": "number"})");
  EXPECT_TRUE(valid(n, "-0.5e+3"));
  JsonMatcher top(n);
  EXPECT_TRUE(top.advance("12"));
  EXPECT_TRUE(top.complete());  // a top-level number may end here, or go on
  EXPECT_FALSE(top.closed());
  EXPECT_TRUE(top.accepts("3"));
  EXPECT_TRUE(valid(schema(R"({"type": "boolean"})"), "false"));
  EXPECT_TRUE(valid(schema(R"({"const": {"a": [1]}})"), R"({"a":[1]})"));
}

TEST(JsonGrammar, UnionsRefsAndRecursion) {
  const auto nullable = schema(R"({"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "integer"}, {"type": "number"}]})");
  EXPECT_TRUE(valid(nullable, "\"x\""));
  EXPECT_TRUE(valid(nullable, "null"));
  EXPECT_TRUE(valid(nullable, "2.5"));
  EXPECT_TRUE(valid(schema(R"({"type": ["array", "null"], "items": {"type": "integer"}})"), "[1, 2]"));
  const auto tree = schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(valid(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
  EXPECT_FALSE(valid(tree, R"({"v": 1, "kids": [{"w": 2}]})"));
}

// Found by fuzz_json_grammar: a schema holding a number past a double's range made the parser
// throw out of from_schema.
// A union no first character tells apart (two objects) is a JsonChoice: each alternative walks
// the text and drops out when it cannot take it; the text is whole when one of them is.
TEST(JsonGrammar, AChoiceFollowsWhicheverGrammarsStillMatch) {
  const auto a = schema(R"({"type": "object", "properties": {"k": {"const": "a"}, "n": {"type": "integer"}},
                           "required": ["k", "n"], "additionalProperties": false})");
  const auto b = schema(R"({"type": "object", "properties": {"k": {"const": "b"}, "s": {"type": "string"}},
                           "required": ["k"], "additionalProperties": false})");
  auto whole = [&](const std::string& text) {
    JsonChoice c({a, b});
    return c.advance(text) && c.complete();
  };
  EXPECT_TRUE(whole(R"({"k": "a", "n": 3})"));
  EXPECT_TRUE(whole(R"({"k": "b", "s": "x"})"));
  EXPECT_TRUE(whole(R"({"s": "x", "k": "b"})"));   // b's keys first: only b is left
  EXPECT_FALSE(whole(R"({"k": "a", "s": "x"})"));  // a's key, b's property
  EXPECT_FALSE(whole(R"({"k": "a"})"));            // a needs n
  JsonChoice c({a, b});
  EXPECT_TRUE(c.advance(R"({"k": ")"));
  EXPECT_TRUE(c.accepts("a") && c.accepts("b"));
  EXPECT_FALSE(c.advance("c"));                    // neither: nothing changes
  EXPECT_TRUE(c.advance(R"(b"})"));
  EXPECT_TRUE(c.closed());
  EXPECT_TRUE(c.complete());
}

// A top-level union of object types (pydantic's Union[A, B]) is a choice of one grammar each,
// with the top's $defs; anything else no first character tells apart stays an error.
TEST(JsonGrammar, ATopLevelUnionOfObjectsIsAChoice) {
  const std::string union_schema = R"({"title": "Shape", "anyOf": [{"$ref": "#/$defs/Circle"}, {"$ref": "#/$defs/Square"}],
      "$defs": {"Circle": {"type": "object", "properties": {"r": {"type": "number"}}, "required": ["r"]},
                "Square": {"type": "object", "properties": {"side": {"type": "integer"}}, "required": ["side"]}}})";
  EXPECT_FALSE(JsonGrammar::from_schema(union_schema).ok());
  auto grammars = JsonGrammar::from_schema_choice(union_schema);
  ASSERT_TRUE(grammars.ok()) << grammars.status().to_string();
  ASSERT_EQ(grammars->size(), 2u);
  auto whole = [&](const std::string& text) {
    JsonChoice c(*grammars);
    return c.advance(text) && c.complete();
  };
  EXPECT_TRUE(whole(R"({"r": 1.5})"));
  EXPECT_TRUE(whole(R"({"side": 2})"));
  EXPECT_FALSE(whole(R"({"r": 1, "side": 2})"));
  EXPECT_FALSE(whole(R"({"side": 2.5})"));
  // One that compiles whole is one grammar; a nested union, or a top-level one beside other
  // constraints, is the error it was.
  EXPECT_EQ(JsonGrammar::from_schema_choice(R"({"anyOf": [{"type": "string"}, {"type": "object"}]})")->size(), 1u);
  for (const std::string bad : {R"({"type": "object", "properties": {"x": {"anyOf": [{"type": "object"}, {"type": "object"}]}}})",
                                R"({"anyOf": [{"type": "object"}, {"type": "object"}], "minProperties": 1})",
                                R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {"minimum": 1}}}]})"}) {
    const auto g = JsonGrammar::from_schema_choice(bad);
    ASSERT_FALSE(g.ok()) << bad;
    EXPECT_EQ(g.status().message(), JsonGrammar::from_schema(bad).status().message()) << bad;
  }
}

TEST(JsonGrammar, ASchemaWithANumberPastADoubleIsRefused) {
  auto g = JsonGrammar::from_schema(R"({"type": "array", "maxItems": 44444444400E72258667541})");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("not JSON"), std::string::npos) << g.status().message();
}

TEST(JsonGrammar, RefusesWhatItCannotHoldToByName) {
  struct Case {
    const char* schema;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"type": "string", "pattern": "a+"})", "'pattern'"},
           {R"({"properties": {"x": {"type": "integer", "minimum": 0}}})", "#/properties/x: 'minimum'"},
           {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})", "start with '{'"},
           {R"({"type": "colour"})", "unknown type 'colour'"},
           {R"({"$ref": "#/$defs/missing"})", "does not name"},
           {R"({"$ref": "http://example.com/s.json"})", "only references inside the schema"},
           {R"({"type": "object", "required": ["a"], "additionalProperties": false})", "'a' is required"},
           {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems is more than maxItems"},
           {"{not json", "not JSON"},
       }) {
    auto g = JsonGrammar::from_schema(c.schema);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.says), std::string::npos) << g.status().message();
  }
}

// The output path under a grammar, on SmolLM2's real vocabulary: whatever the logits say, the
// text is valid JSON of the schema, and it ends when the value closes.
TEST(JsonGrammar, RequestOutputHoldsRandomLogitsToTheSchema) {
  const std::string path = testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << "no model at " << path << ": run scripts/fetch_model.sh";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto spec = tokenizer_spec_from_gguf(**file);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto tok = Tokenizer::create(std::move(*spec));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto g = schema(R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 6},
      "b": {"type": "integer"}, "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
      "required": ["a", "b", "c"], "additionalProperties": false})");
  const int32_t n_vocab = (*tok)->n_vocab();
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  for (int run = 0; run < 8; ++run) {
    // Runs 6 and 7 start past a prefix already written (OutputOptions::json_prefix): the text is
    // its continuation.
    const std::string prefix = run < 6 ? "" : run == 6 ? R"({"b": )" : R"({"c": [true], "a": ")";
    OutputOptions opt;
    opt.max_tokens = 400;
    opt.json_grammars = {g};
    opt.json_prefix = prefix;
    opt.sampling.temperature = run % 3 == 0 ? 0.0f : 1.0f;
    opt.sampling.top_p = run % 2 == 0 ? 1.0f : 0.9f;
    opt.sampling.seed = run;
    RequestOutput out(**tok, opt);
    std::vector<TokenId> history = {1};
    std::string text = prefix;
    std::vector<float> logits(n_vocab);
    while (out.finish() == FinishReason::kNone) {
      for (float& l : logits) l = noise(rng);
      logits[(*tok)->eos()] = 50;  // the model wants to stop at once: it may not until the JSON is whole
      const TokenEvent ev = out.take(logits.data(), n_vocab, history, 0, 0);
      history.push_back(ev.id);
      text += ev.text;
    }
    ASSERT_TRUE(out.finish() == FinishReason::kEos || out.finish() == FinishReason::kStop) << text;
    ASSERT_TRUE(Json::accept(text)) << text;
    const Json j = Json::parse(text);
    EXPECT_TRUE(j.is_object() && j.size() == 3) << text;
    EXPECT_TRUE(j["a"].is_string() && j["a"].get<std::string>().size() <= 24) << text;
    EXPECT_TRUE(j["b"].is_number_integer()) << text;
    EXPECT_TRUE(j["c"].is_array() && j["c"].size() <= 3) << text;
    for (const Json& x : j["c"]) EXPECT_TRUE(x.is_boolean()) << text;
  }
  // A prefix the grammar refuses leaves the text free rather than stuck.
  OutputOptions opt;
  opt.json_grammars = {g};
  opt.json_prefix = "[";
  opt.max_tokens = 3;
  RequestOutput out(**tok, opt);
  std::vector<float> logits(n_vocab, 0.0f);
  logits[(*tok)->eos()] = 50;
  EXPECT_EQ(out.take(logits.data(), n_vocab, {1}, 0, 0).id, (*tok)->eos());
}

}  // namespace
}  // namespace helios
