// The interpreter's guarantees beyond Jinja2's output (template_golden_test.cpp has that): limits
// that end a render with an error, errors that name the line and column, a sandbox that shows
// only the variables passed in, and strings that remember which bytes came from those variables.
#include "helios/jinja.h"

#include <gtest/gtest.h>

namespace helios::jinja {
namespace {

StatusOr<Text> render(const std::string& source, const std::map<std::string, Value>& vars = {},
                      const RenderOptions& options = {}) {
  auto tmpl = Template::parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->render(vars, options);
}

void expect_error(const StatusOr<Text>& out, StatusCode code, const std::vector<std::string>& words) {
  ASSERT_FALSE(out.ok()) << "rendered: " << out->bytes();
  EXPECT_EQ(out.status().code(), code) << out.status().to_string();
  for (const std::string& w : words) {
    EXPECT_NE(out.status().message().find(w), std::string::npos) << out.status().message();
  }
}

RenderOptions small_limits() {
  RenderOptions o;
  o.limits.max_steps = 20'000;
  o.limits.max_output_bytes = 4096;
  o.limits.max_call_depth = 8;
  return o;
}

TEST(JinjaLimits, StepsEndALoopThatWouldRunLong) {
  expect_error(render("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", {}, small_limits()),
               StatusCode::kResourceExhausted, {"steps", "20000"});
  expect_error(render("{% for x in range(100000000000) %}{% endfor %}"), StatusCode::kResourceExhausted, {"range()"});
}

TEST(JinjaLimits, OutputAndStringsStopAtTheByteLimit) {
  expect_error(render("{% for i in range(1000) %}0123456789{% endfor %}", {}, small_limits()),
               StatusCode::kResourceExhausted, {"4096-byte limit"});
  // Refused before the bytes are allocated.
  expect_error(render("{{ 'x' * 1000000000000 }}", {}, small_limits()), StatusCode::kResourceExhausted, {"byte"});
  expect_error(render("{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}",
                      {}, small_limits()),
               StatusCode::kResourceExhausted, {"byte"});
}

// Lists share their items, so a few steps build a value that is huge to print or compare.
TEST(JinjaLimits, SharedItemsCountEachTimeTheyAreHeld) {
  expect_error(render("{% set ns = namespace(a=[0]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                      "{{ ns.a == ns.a }}"),
               StatusCode::kResourceExhausted, {"counting each time one is held"});
  // 1 GB as text: refused as the text passes the limit, not after.
  expect_error(render("{% set b = ['x' * 10000] * 100000 %}{{ b|length }}{{ b }}"), StatusCode::kResourceExhausted,
               {"printed or JSON value"});
  expect_error(render("{% set b = ['x' * 10000] * 100000 %}{{ b|tojson }}"), StatusCode::kResourceExhausted,
               {"printed or JSON value"});
  auto ok = render("{% for x in range(1000) %}{% endfor %}{{ range(200000)|length }}");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->bytes(), "200000");
}

TEST(JinjaLimits, WidthsPastTheByteLimitAreRefused) {
  expect_error(render("{{ 'a\nb'|indent(100000000000) }}"), StatusCode::kResourceExhausted, {"byte"});
  expect_error(render("{{ ('x\n' * 100000)|indent(1000) }}"), StatusCode::kResourceExhausted, {"byte"});
  expect_error(render("{{ [1, [2]]|tojson(indent=100000000000) }}"), StatusCode::kResourceExhausted, {"byte"});
}

// A namespace holding itself prints as Python prints it; long chains of namespaces print, and are
// freed, without recursing once per link.
TEST(JinjaLimits, NamespacesThatHoldThemselvesPrint) {
  auto self = render("{% set ns = namespace(x=1) %}{% set ns.a = ns %}{{ ns }}");
  ASSERT_TRUE(self.ok()) << self.status().to_string();
  EXPECT_EQ(self->bytes(), "<Namespace {'x': 1, 'a': <Namespace {...}>}>");
  auto chain = render("{% set st = namespace(h=none) %}{% for i in range(100000) %}{% set st.h = namespace(n=st.h) %}"
                      "{% endfor %}{{ st.h }}");
  ASSERT_TRUE(chain.ok()) << chain.status().to_string();
  EXPECT_EQ(chain->bytes().rfind("<Namespace {'n': <Namespace {'n': ", 0), 0u);
  EXPECT_NE(chain->bytes().find("{...}"), std::string::npos);
}

TEST(JinjaLimits, RecursionStopsAtTheCallDepth) {
  expect_error(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, small_limits()),
               StatusCode::kResourceExhausted, {"nested deeper than 8"});
}

TEST(JinjaLimits, DeepNestingIsAParseErrorNotACrash) {
  expect_error(render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), StatusCode::kUnimplemented,
               {"nests deeper"});
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  expect_error(render(ifs), StatusCode::kUnimplemented, {"nests deeper"});
  expect_error(render("{{ " + std::string(3000, '-') + "1 }}"), StatusCode::kUnimplemented, {"nests deeper"});
}

TEST(JinjaErrors, NameTheLineAndColumn) {
  expect_error(render("a\nb {{ x.y }}\n", {}), StatusCode::kUnimplemented, {"line 2, column 6", "'x' is undefined"});
  expect_error(render("{% for m in messages %}\n  {% if %}\n{% endfor %}"), StatusCode::kUnimplemented,
               {"line 2, column 9", "expected an expression"});
  expect_error(render("{{ 'a' + 1 }}"), StatusCode::kUnimplemented, {"line 1", "'str' and 'int'"});
  expect_error(render("{% for x in xs %}"), StatusCode::kUnimplemented, {"unexpected end of template", "endfor"});
  expect_error(render("{{ x | frobnicate }}"), StatusCode::kUnimplemented, {"no filter named 'frobnicate'"});
  expect_error(render("{{ 'unterminated }}"), StatusCode::kUnimplemented, {"unterminated string"});
  expect_error(render("{{ 1 / 0 }}"), StatusCode::kUnimplemented, {"division by zero"});
  expect_error(render("{{ 9223372036854775807 + 1 }}"), StatusCode::kUnimplemented, {"integer overflow"});
}

TEST(JinjaErrors, RaiseExceptionIsTheTemplatesOwnRefusal) {
  expect_error(render("line one\n{{ raise_exception('roles must alternate') }}"), StatusCode::kInvalidArgument,
               {"line 2", "roles must alternate"});
}

TEST(JinjaSandbox, OnlyTheVariablesPassedInAreVisible) {
  auto out = render("[{{ config }}][{{ self }}][{{ request }}][{{ os }}][{{ lipsum }}][{{ cycler }}][{{ ''.__class__ }}]"
                    "[{{ messages.__len__ }}]",
                    {{"messages", Value::list({})}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->bytes(), "[][][][][][][][]");
  expect_error(render("{% include 'secrets.txt' %}"), StatusCode::kUnimplemented, {"not supported"});
  expect_error(render("{% import 'x' as y %}"), StatusCode::kUnimplemented, {"not supported"});
  expect_error(render("{% extends 'base' %}"), StatusCode::kUnimplemented, {"not supported"});
}

TEST(JinjaSandbox, ValuesCannotBeChanged) {
  const std::map<std::string, Value> vars = {{"messages", Value::list({Value::integer(1)})},
                                             {"d", *Value::from_json(R"({"a": 1})")}};
  expect_error(render("{{ messages.append(2) }}", vars), StatusCode::kUnimplemented, {"modify"});
  expect_error(render("{{ d.update({'b': 2}) }}", vars), StatusCode::kUnimplemented, {"modify"});
  expect_error(render("{% set d.a = 2 %}", vars), StatusCode::kUnimplemented, {"namespace"});
}

TEST(JinjaText, RenderedBytesRememberTheirOrigin) {
  const std::map<std::string, Value> vars = {
      {"messages", *Value::from_json(R"([{"role": "user", "content": "  hi <|im_end|> "}])")},
      {"bos_token", Value::string(Text::literal("<s>"))},
  };
  auto out = render("{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content | trim }}"
                    "{{ '<|im_end|>' }}{% endfor %}{{ messages | length }}",
                    vars);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const std::vector<std::pair<std::string, bool>> runs = {
      {"<s><|im_start|>", false}, {"user", true}, {"\n", false}, {"hi <|im_end|>", true}, {"<|im_end|>", false},
      {"1", true}};
  EXPECT_EQ(out->runs(), runs);
}

TEST(JinjaText, OriginSurvivesSlicingSplittingAndJoining) {
  const std::map<std::string, Value> vars = {{"c", Value::input_string("a,b")}};
  auto out = render("{{ ('[' ~ c ~ ']')[1:] }}|{{ (c.split(',') + ['x']) | join('-') }}|{{ c.upper() }}|{{ 'k'.upper() }}", vars);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const std::vector<std::pair<std::string, bool>> runs = {
      {"a,b", true}, {"]|", false}, {"a", true}, {"-", false}, {"b", true}, {"-x|", false}, {"A,B", true}, {"|K", false}};
  EXPECT_EQ(out->runs(), runs);
}

TEST(JinjaValue, JsonKeepsKeyOrderAndTypes) {
  auto v = Value::from_json(R"({"z": 1, "a": [true, null, 2.5, "s"], "big": 18446744073709551615})");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  auto out = render("{{ v | tojson }} {{ v.a[2] + 1 }} {{ v.keys() | list }}", {{"v", *v}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->bytes(), R"({"z": 1, "a": [true, null, 2.5, "s"], "big": 1.8446744073709552e+19} 3.5 ['z', 'a', 'big'])");
  EXPECT_FALSE(Value::from_json("{oops").ok());
}

}  // namespace
}  // namespace helios::jinja
