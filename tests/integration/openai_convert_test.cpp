// The OpenAI API's JSON ↔ GenerateRequest / GenerationRequest (server/openai_convert.h), without a
// server: request checks naming the field, the shared validation's errors renamed, tool-call
// markup, and the response objects and stream chunks in OpenAI's shapes.
#include <gtest/gtest.h>

#include <memory>

#include "server/openai_convert.h"
#include "server/request_convert.h"
#include "server/served_model.h"
#include "test_paths.h"

namespace helios::server::openai {
namespace {

LimitsConfig limits() { return LimitsConfig{}; }

Request parse_ok(const std::string& body, Endpoint endpoint = Endpoint::kCompletions, uint64_t seed = 77) {
  auto r = parse_request(Json::parse(body), endpoint, limits(), seed);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " → " << dump(e->to_json());
    return Request{};
  }
  return std::get<Request>(r);
}

ApiError parse_error(const std::string& body, Endpoint endpoint = Endpoint::kCompletions) {
  auto r = parse_request(Json::parse(body), endpoint, limits(), 1);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << body << " was accepted";
  return ApiError{};
}

TEST(OpenAiConvert, CompletionsFieldsBecomeAGenerateRequest) {
  const Request r = parse_ok(R"({"model": "stories", "prompt": "Once upon", "max_tokens": 12, "temperature": 0.5,
                                 "top_p": 0.9, "seed": 42, "stop": "\n", "top_k": 40, "ignore_eos": true,
                                 "stream": true, "stream_options": {"include_usage": true}, "user": "u1"})");
  EXPECT_EQ(r.model, "stories");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.prompts.size(), 1u);
  const v1::GenerateRequest& g = r.prompts[0];
  EXPECT_EQ(g.text(), "Once upon");
  EXPECT_EQ(g.max_tokens(), 12);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_EQ(g.sampling().seed(), 42u);
  ASSERT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.stop(0), "\n");
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_FALSE(g.logprobs());
}

TEST(OpenAiConvert, OpenAiDefaults) {
  // Completions: temperature 1, top_p 1, a random seed, max_tokens 16 (OpenAI's defaults).
  Request r = parse_ok(R"({"prompt": "hi"})", Endpoint::kCompletions, 1234);
  EXPECT_FLOAT_EQ(r.prompts[0].sampling().temperature(), 1.0f);
  EXPECT_FLOAT_EQ(r.prompts[0].sampling().top_p(), 1.0f);
  EXPECT_EQ(r.prompts[0].sampling().seed(), 1234u);
  EXPECT_EQ(r.prompts[0].max_tokens(), kCompletionsDefaultMaxTokens);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  // Chat: the server's default (0 here: to_generation_request applies default_max_tokens).
  r = parse_ok(R"({"messages": [{"role": "user", "content": "hi"}]})", Endpoint::kChat);
  EXPECT_EQ(r.prompts[0].max_tokens(), 0);
  EXPECT_EQ(r.max_tokens_param, "max_tokens");
  r = parse_ok(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7, "max_tokens": 99})",
               Endpoint::kChat);
  EXPECT_EQ(r.prompts[0].max_tokens(), 7);
  EXPECT_EQ(r.max_tokens_param, "max_completion_tokens");
  // null means unset.
  r = parse_ok(R"({"prompt": "hi", "temperature": null, "stop": null, "seed": null, "n": null})");
  EXPECT_FLOAT_EQ(r.prompts[0].sampling().temperature(), 1.0f);
}

TEST(OpenAiConvert, PromptForms) {
  Request r = parse_ok(R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].token_ids().ids_size(), 3);
  r = parse_ok(R"({"prompt": ["a", "b"], "n": 2, "max_tokens": 3, "seed": 5})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.n_choices(), 4);
  EXPECT_EQ(r.prompts[1].text(), "b");
  EXPECT_EQ(r.prompts[1].max_tokens(), 3);  // every prompt gets the shared fields
  EXPECT_EQ(r.prompts[1].sampling().seed(), 5u);
  r = parse_ok(R"({"prompt": [[1, 2], [3]]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].token_ids().ids(0), 3);
  for (const char* bad : {R"({"prompt": []})", R"({"prompt": [1, "a"]})", R"({"prompt": ["a", 3]})",
                          R"({"prompt": {"text": "a"}})", R"({})", R"({"prompt": [[]]})"}) {
    const ApiError e = parse_error(bad);
    EXPECT_EQ(e.http_status, 400) << bad;
    EXPECT_EQ(e.param.rfind("prompt", 0), 0u) << bad << ": " << e.param;
  }
  EXPECT_EQ(parse_error(R"({"messages": []})").param, "messages");
  EXPECT_EQ(parse_error(R"({"prompt": "a"})", Endpoint::kChat).param, "prompt");
}

TEST(OpenAiConvert, RequestLevelErrorsNameTheParam) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "a", "n": 5})", "n"},  // limits.max_n is 4
      {R"({"prompt": "a", "n": 0})", "n"},
      {R"({"prompt": "a", "n": "2"})", "n"},
      {R"({"prompt": "a", "echo": true})", "echo"},
      {R"({"prompt": "a", "best_of": 3})", "best_of"},
      {R"({"prompt": "a", "suffix": "x"})", "suffix"},
      {R"({"prompt": "a", "logit_bias": {"x1": 5}})", "logit_bias.x1"},
      {R"({"prompt": "a", "logit_bias": {"-3": 5}})", "logit_bias.-3"},
      {R"({"prompt": "a", "logit_bias": {"7": 101}})", "logit_bias.7"},
      {R"({"prompt": "a", "logit_bias": {"7": "up"}})", "logit_bias.7"},
      {R"({"prompt": "a", "logit_bias": [5]})", "logit_bias"},
      {R"({"prompt": "a", "presence_penalty": 2.5})", "presence_penalty"},
      {R"({"prompt": "a", "frequency_penalty": -3})", "frequency_penalty"},
      {R"({"prompt": "a", "frequency_penalty": "x"})", "frequency_penalty"},
      {R"({"prompt": "a", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "a", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "a", "stop": 3})", "stop"},
      {R"({"prompt": "a", "stop": ["x", 1]})", "stop"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "a", "seed": "x"})", "seed"},
      {R"({"prompt": "a", "response_format": {"type": "xml"}})", "response_format.type"},
      {R"({"prompt": "a", "response_format": "json"})", "response_format"},
      {R"({"prompt": "a", "response_format": {"type": "json_schema"}})", "response_format.json_schema"},
      {R"({"prompt": "a", "helios": {"bogus": 1}})", "helios.bogus"},
      {R"({"prompt": "a", "helios": {"exit": {"policy": 3}}})", "helios.exit.policy"},
      {R"({"prompt": "a", "helios": {"exit": {"speed": 3}}})", "helios.exit.speed"},
      {R"({"prompt": "a", "helios": {"return_tokens": "yes"}})", "helios.return_tokens"},
  };
  for (const Case& c : cases) {
    const ApiError e = parse_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
  const ApiError e = parse_error(R"({"prompt": "a", "n": 9})");
  EXPECT_EQ(e.message, "n must be in 1..4 (the server's limits.max_n), got 9");
  const Json j = e.to_json();
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(dump(parse_error("[1]").to_json()).find("\"param\":null") != std::string::npos, true);
}

TEST(OpenAiConvert, PenaltiesAndLogitBiasReachTheSampling) {
  const Request r = parse_ok(
      R"({"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -1.25, "logit_bias": {"7": -100, "42": 3.5}})");
  const v1::SamplingParams& s = r.prompts.at(0).sampling();
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -1.25f);
  ASSERT_EQ(s.logit_bias().size(), 2u);
  EXPECT_FLOAT_EQ(s.logit_bias().at(7), -100.0f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(42), 3.5f);
  // What clients send by default is accepted as "off".
  const Request d = parse_ok(R"({"prompt": "a", "presence_penalty": 0, "frequency_penalty": null, "logit_bias": {}})");
  EXPECT_EQ(d.prompts.at(0).sampling().logit_bias().size(), 0u);
}

TEST(OpenAiConvert, ChatMessagesToolsAndLogprobs) {
  const Request r = parse_ok(R"({
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
      {"role": "assistant", "content": null,
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22 C"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "logprobs": true, "top_logprobs": 3, "n": 2, "helios": {"return_tokens": true,
    "exit": {"policy": "per-token", "threshold": 0, "depth": 3, "measure": "margin", "draft_tokens": 2,
             "draft_vocab": 4096, "calibrated_thresholds": true}}})",
                             Endpoint::kChat);
  ASSERT_EQ(r.prompts.size(), 1u);
  const v1::GenerateRequest& g = r.prompts[0];
  ASSERT_EQ(g.conversation().messages_size(), 4);
  EXPECT_EQ(g.conversation().messages(0).role(), "system");
  EXPECT_EQ(g.conversation().messages(1).content(), "Weather in Paris?");
  EXPECT_EQ(g.conversation().messages(1).name(), "");  // a participant name is not a tool's
  EXPECT_NE(g.conversation().messages(2).tool_calls_json().find("get_weather"), std::string::npos);
  EXPECT_EQ(g.conversation().messages(3).tool_call_id(), "call_1");
  EXPECT_EQ(g.conversation().messages(3).name(), "get_weather");
  EXPECT_TRUE(r.parse_tool_calls);
  EXPECT_NE(r.tools_json.find("get_weather"), std::string::npos);
  EXPECT_TRUE(g.logprobs());
  EXPECT_EQ(g.top_logprobs(), 3);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.return_tokens);
  EXPECT_EQ(g.exit().policy(), "per-token");
  EXPECT_TRUE(g.exit().threshold_set());  // an explicit 0
  EXPECT_EQ(g.exit().threshold(), 0.0f);
  EXPECT_EQ(g.exit().depth(), 3);
  EXPECT_EQ(g.exit().measure(), "margin");
  EXPECT_EQ(g.exit().draft_tokens(), 2);
  EXPECT_EQ(g.exit().draft_vocab(), 4096);
  EXPECT_TRUE(g.exit().calibrated_thresholds());

  // top_logprobs 0 without logprobs (some clients send it): nothing asked.
  EXPECT_FALSE(parse_ok(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 0})", Endpoint::kChat)
                   .prompts[0]
                   .logprobs());
  // tool_choice none: the model sees no tools and nothing is parsed.
  const Request none = parse_ok(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
                                    "tools": [{"type": "function", "function": {"name": "f"}}]})",
                                Endpoint::kChat);
  EXPECT_FALSE(none.parse_tool_calls);
  EXPECT_EQ(none.tools_json, "");

  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]})", "messages[1].role"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})", "messages[0].tool_calls[0]"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 30})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},  // no tools
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "any",
           "tools": [{"type": "function", "function": {"name": "f"}}]})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "g"}},
           "tools": [{"type": "function", "function": {"name": "f"}}]})", "tool_choice"},  // not a listed tool
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function"},
           "tools": [{"type": "function", "function": {"name": "f"}}]})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "functions": []})", "functions"},
  };
  for (const Case& c : cases) {
    const ApiError e = parse_error(c.body, Endpoint::kChat);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
  }
}

TEST(OpenAiConvert, SharedValidationErrorsAreRenamed) {
  Request completions = parse_ok(R"({"prompt": "a"})");
  Request chat = parse_ok(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5})",
                          Endpoint::kChat);
  struct Case {
    const Request* request;
    const char* grpc_message;
    const char* message;
    const char* param;
  };
  const Case cases[] = {
      {&completions, "sampling.top_k must be >= 0 (0 = off), got -3", "top_k must be >= 0 (0 = off), got -3", "top_k"},
      {&completions, "exit.policy: 'batch-sync' is not allowed on this server; allowed: full",
       "helios.exit.policy: 'batch-sync' is not allowed on this server; allowed: full", "helios.exit.policy"},
      {&completions, "text has 5000 tokens, above the server's limit of 4096",
       "prompt has 5000 tokens, above the server's limit of 4096", "prompt"},
      {&chat, "text has 5000 tokens, above the server's limit of 4096",
       "messages has 5000 tokens, above the server's limit of 4096", "messages"},
      {&completions, "token_ids[2] = 900 is outside the vocabulary (0..511)",
       "prompt[2] = 900 is outside the vocabulary (0..511)", "prompt"},
      {&chat, "conversation.messages[1].role is 'x'; valid: ...", "messages[1].role is 'x'; valid: ...",
       "messages[1].role"},
      {&completions, "max_tokens is 9999, above the server's limit of 2048",
       "max_tokens is 9999, above the server's limit of 2048", "max_tokens"},
      {&chat, "max_tokens is 9999, above the server's limit of 2048",
       "max_completion_tokens is 9999, above the server's limit of 2048", "max_completion_tokens"},
      {&completions, "top_logprobs must be in 0..20, got 30", "logprobs must be in 0..20, got 30", "logprobs"},
      {&completions, "stop[1] is empty", "stop[1] is empty", "stop"},
      {&chat, "tools_json needs a conversation", "tools needs a conversation", "tools"},
  };
  for (const Case& c : cases) {
    const ApiError e = from_conversion_error(invalid_argument(c.grpc_message), *c.request);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.message, c.message);
    EXPECT_EQ(e.param, c.param) << c.grpc_message;
  }
  // Not every conversion error is the client's field.
  const ApiError busy = from_conversion_error(resource_exhausted("the chat template ran too long"), chat);
  EXPECT_EQ(busy.http_status, 429);
}

TEST(OpenAiConvert, ErrorStatusesMapToHttp) {
  EXPECT_EQ(error_from_status(StatusCode::kInvalidArgument, "x").http_status, 400);
  const ApiError nf = error_from_status(StatusCode::kNotFound, "unknown model 'x'");
  EXPECT_EQ(nf.http_status, 404);
  EXPECT_EQ(nf.param, "model");
  EXPECT_EQ(nf.code, "model_not_found");
  EXPECT_EQ(error_from_status(StatusCode::kResourceExhausted, "full").http_status, 429);
  EXPECT_EQ(error_from_status(StatusCode::kUnavailable, "draining").http_status, 503);
  EXPECT_EQ(error_from_status(StatusCode::kInternal, "cuda").http_status, 500);
}

// The conversion against a real model: the OpenAI body, through to_generation_request.
class OpenAiConvertModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelEntryConfig entry;
    entry.name = "stories";
    entry.path = testing::stories260k_path();
    EngineConfig engine;
    engine.threads = 1;
    engine.kv_cache_bytes = 4 << 20;
    auto m = load_served_model(entry, engine, 1, metrics_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    served_ = std::move(*m).release();
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  StatusOr<GenerationRequest> convert(const Request& r, size_t prompt = 0) {
    const RequestLimits l{limits(), served_->context_tokens, served_->entry.early_exit};
    return to_generation_request(r.prompts[prompt], *served_->model, l, r.tools_json);
  }
  static MetricsRegistry metrics_;
  static ServedModel* served_;
};
MetricsRegistry OpenAiConvertModel::metrics_;
ServedModel* OpenAiConvertModel::served_ = nullptr;

TEST_F(OpenAiConvertModel, BodiesBecomeEngineRequests) {
  auto g = convert(parse_ok(R"({"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0, "stop": ["\n", "."],
                               "logprobs": 2, "seed": 3})"));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->prompt, served_->model->tokenizer().encode("Once upon a time", true, false));
  EXPECT_EQ(g->max_tokens, 9);
  EXPECT_EQ(g->stop, (std::vector<std::string>{"\n", "."}));
  EXPECT_EQ(g->top_logprobs, 2);
  EXPECT_EQ(g->sampling.seed, 3u);
  EXPECT_EQ(g->sampling.temperature, 0.0f);
  // A chat conversation goes through the chat template (stories has none: the plain fallback).
  g = convert(parse_ok(R"({"messages": [{"role": "user", "content": "Hello"}]})", Endpoint::kChat));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_FALSE(g->prompt.empty());
  EXPECT_EQ(g->max_tokens, limits().default_max_tokens);
  EXPECT_EQ(g->top_logprobs, -1);
  // A request's exit rule is the gRPC one's, checked the same way.
  const Request bad_exit = parse_ok(R"({"prompt": "a", "helios": {"exit": {"policy": "turbo"}}})");
  g = convert(bad_exit);
  ASSERT_FALSE(g.ok());
  ApiError e = from_conversion_error(g.status(), bad_exit);
  EXPECT_EQ(e.param, "helios.exit.policy");
  EXPECT_EQ(e.message.rfind("helios.exit.policy: unknown policy 'turbo'", 0), 0u) << e.message;
  // Token ids outside the vocabulary, max_tokens over the context.
  const Request bad_ids = parse_ok(R"({"prompt": [1, 2, 900]})");
  e = from_conversion_error(convert(bad_ids).status(), bad_ids);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.message.rfind("prompt[2] = 900 is outside the vocabulary", 0), 0u) << e.message;
  const Request too_long = parse_ok(R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 600})",
                                    Endpoint::kChat);
  e = from_conversion_error(convert(too_long).status(), too_long);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("exceed the context of 512 tokens"), std::string::npos) << e.message;
  const Request negative_temperature = parse_ok(R"({"prompt": "a", "temperature": -1})");
  e = from_conversion_error(convert(negative_temperature).status(), negative_temperature);
  EXPECT_EQ(e.param, "temperature");
  EXPECT_EQ(e.message, "temperature must be a finite number >= 0, got -1");
}

TEST_F(OpenAiConvertModel, ResponsesHaveOpenAiShapes) {
  const Tokenizer& tok = served_->model->tokenizer();
  const Request r = parse_ok(R"({"prompt": "a", "logprobs": 2, "helios": {"return_tokens": true}})");
  const ResponseWriter w(r, "cmpl-1", 1700000000, "stories", tok);
  ChoiceOutput c;
  c.index = 0;
  c.text = " upon a";
  c.model = "stories";
  c.finish_reason = "length";
  TokenEvent t1;
  t1.id = tok.encode(" upon", false, false).at(0);
  t1.text = " upon";
  t1.logprob = -0.5f;
  t1.top_logprobs = {{t1.id, -0.5f}, {5, -2.0f}};
  t1.exit_layer = 5;
  t1.loaded_layers = 5;
  t1.confidence = 0.6f;
  c.tokens = {t1, t1};
  const Json resp = w.response({c}, Usage{4, 2});
  EXPECT_EQ(resp["id"], "cmpl-1");
  EXPECT_EQ(resp["object"], "text_completion");
  EXPECT_EQ(resp["created"], 1700000000);
  EXPECT_EQ(resp["model"], "stories");
  EXPECT_EQ(resp["usage"], (Json{{"prompt_tokens", 4}, {"completion_tokens", 2}, {"total_tokens", 6}}));
  const Json& choice = resp["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["text"], " upon a");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["logprobs"]["tokens"][0], tok.token_to_piece(t1.id, true));
  EXPECT_FLOAT_EQ(choice["logprobs"]["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_EQ(choice["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(choice["logprobs"]["text_offset"], (Json{0, 5}));
  EXPECT_EQ(choice["helios"]["tokens"][0]["exit_layer"], 5);
  EXPECT_EQ(choice["helios"]["tokens"][0]["model"], "stories");
  EXPECT_EQ(choice["helios"]["tokens"][0]["loaded_depth"], 5);
  // Stream chunks: the same choice shape, "usage": null with include_usage, a last usage chunk.
  const Request sr = parse_ok(R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": true}})");
  const ResponseWriter sw(sr, "cmpl-2", 1, "stories", tok);
  c.finish_reason.clear();
  const Json chunk = sw.chunk({c});
  EXPECT_TRUE(chunk["usage"].is_null());
  EXPECT_TRUE(chunk.contains("usage"));
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(chunk["choices"][0].contains("helios"));
  const Json last = sw.usage_chunk(Usage{1, 2});
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["total_tokens"], 3);
  EXPECT_EQ(sse_event(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // Invalid UTF-8 (a token that splits a character) is replaced, not thrown on.
  EXPECT_EQ(dump(Json("a\xF0\x9F")), "\"a\xEF\xBF\xBD\"");
}

TEST_F(OpenAiConvertModel, ChatResponsesAndChunks) {
  const Tokenizer& tok = served_->model->tokenizer();
  const Request r = parse_ok(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1})",
                             Endpoint::kChat);
  const ResponseWriter w(r, "chatcmpl-1", 1, "stories", tok);
  ChoiceOutput c;
  c.text = "\n";
  c.tool_calls = {ToolCall{"call_a", "get_weather", R"({"city":"Paris"})"}};
  c.finish_reason = "tool_calls";
  TokenEvent t;
  t.id = 5;
  t.logprob = -1;
  t.top_logprobs = {{5, -1.0f}, {6, -2.0f}};
  c.tokens = {t};
  const Json resp = w.response({c}, Usage{});
  EXPECT_EQ(resp["object"], "chat.completion");
  const Json& m = resp["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null()) << "only a call (and white space): content null";
  EXPECT_EQ(m["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "tool_calls");
  const Json& lp = resp["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], tok.token_to_piece(5, true));
  EXPECT_EQ(lp["top_logprobs"].size(), 1u);
  EXPECT_TRUE(lp["bytes"].is_array());
  // Chunks: the first carries the role; tool calls carry their index.
  ChoiceOutput first;
  first.first = true;
  first.text = "Hi";
  Json chunk = w.chunk({first});
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_FALSE(chunk.contains("usage"));
  EXPECT_EQ(chunk["choices"][0]["delta"], (Json{{"role", "assistant"}, {"content", "Hi"}}));
  c.text.clear();
  chunk = w.chunk({c});
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("role"));
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
}

TEST(OpenAiConvert, FinishReasons) {
  EXPECT_EQ(finish_reason_name(FinishReason::kEos, false), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::kStop, false), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength, false), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::kEos, true), "tool_calls");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength, true), "length");
}

// Feeds `text` one piece of `step` bytes at a time; the content released and the calls.
std::pair<std::string, std::vector<ToolCall>> parse_in_steps(const std::string& text, size_t step) {
  ToolCallParser p;
  std::string content;
  for (size_t i = 0; i < text.size(); i += step) content += p.feed(text.substr(i, step));
  content += p.finish();
  return {content, p.calls()};
}

TEST(OpenAiConvert, ToolCallMarkupBecomesCallsWhateverTheChunking) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}</tool_call> done <tool";
  for (size_t step : {1u, 2u, 3u, 7u, 1000u}) {
    const auto [content, calls] = parse_in_steps(text, step);
    EXPECT_EQ(content, "Let me check.\n\n done <tool") << step;
    ASSERT_EQ(calls.size(), 2u) << step;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(Json::parse(calls[0].arguments), (Json{{"city", "Paris"}}));
    EXPECT_EQ(calls[1].name, "time");
    EXPECT_EQ(Json::parse(calls[1].arguments), (Json{{"tz", "CET"}}));  // a JSON string of an object
    EXPECT_EQ(calls[0].id.rfind("call_", 0), 0u);
    EXPECT_NE(calls[0].id, calls[1].id);
  }
  // Text is released as soon as it cannot start the tag.
  ToolCallParser p;
  EXPECT_EQ(p.feed("Hello <to"), "Hello ");
  EXPECT_EQ(p.feed("day"), "<today");
  // A body that is not a call stays content, markup and all; an unclosed one at the end too.
  auto [content, calls] = parse_in_steps("a<tool_call>not json</tool_call>b", 4);
  EXPECT_EQ(content, "a<tool_call>not json</tool_call>b");
  EXPECT_TRUE(calls.empty());
  std::tie(content, calls) = parse_in_steps("x<tool_call>{\"name\": \"f\", \"argu", 5);
  EXPECT_EQ(content, "x<tool_call>{\"name\": \"f\", \"argu");
  EXPECT_TRUE(calls.empty());
  // An unclosed call that parses (the model ended its turn before the close) is a call.
  std::tie(content, calls) = parse_in_steps("<tool_call>{\"name\": \"f\"}", 3);
  EXPECT_EQ(content, "");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, "{}");
}

TEST(OpenAiConvert, BareToolCallsOfSmallModels) {
  auto run = [](const std::string& text, size_t step, std::vector<std::string> names = {"get_weather"}) {
    ToolCallParser p(std::move(names));
    std::string content;
    for (size_t i = 0; i < text.size(); i += step) content += p.feed(text.substr(i, step));
    content += p.finish();
    return std::make_pair(content, p.calls());
  };
  for (size_t step : {1u, 4u, 100u}) {
    auto [content, calls] = run("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", step);
    EXPECT_EQ(content, "") << step;
    ASSERT_EQ(calls.size(), 1u) << step;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(Json::parse(calls[0].arguments), (Json{{"city", "Paris"}}));
    std::tie(content, calls) = run("\n```json\n{\"name\": \"get_weather\", \"arguments\": {}}\n```\n", step);
    EXPECT_EQ(content, "") << step;
    ASSERT_EQ(calls.size(), 1u) << step;
    // Not a call: an unknown tool, JSON that is not a call, more than the call: content, whole.
    for (const std::string text : {"{\"name\": \"other\", \"arguments\": {}}", "{\"a\": 1}",
                                   "{\"name\": \"get_weather\", \"arguments\": {}} and more", "``x", "  hi"}) {
      std::tie(content, calls) = run(text, step);
      EXPECT_EQ(content, text) << step;
      EXPECT_TRUE(calls.empty()) << text;
    }
  }
  // Any name goes when the request's tools are not known.
  EXPECT_EQ(run("{\"name\": \"x\", \"arguments\": {}}", 3, {}).second.size(), 1u);
  // Several calls: one after another, or a list; Llama 3's "parameters" for "arguments". All
  // calls or none: a part that is not one leaves the whole turn content.
  const std::vector<std::string> names = {"get_weather", "get_time"};
  for (size_t step : {1u, 7u, 1000u}) {
    for (const std::string text :
         {std::string(R"({"name": "get_weather", "arguments": {"city": "Paris"}})") + "\n" +
              R"({"name": "get_time", "arguments": {"zone": "CET"}})",
          std::string(R"([{"name": "get_weather", "parameters": {"city": "Paris"}}, )") +
              R"({"name": "get_time", "arguments": "{\"zone\": \"CET\"}"}])",
          std::string("```json\n") + R"({"name": "get_weather", "parameters": {"city": "Paris"}},)" + "\n" +
              R"({"name": "get_time", "parameters": {"zone": "CET"}})" + "\n```"}) {
      auto [content, calls] = run(text, step, names);
      EXPECT_EQ(content, "") << text;
      ASSERT_EQ(calls.size(), 2u) << text;
      EXPECT_EQ(calls[0].name, "get_weather");
      EXPECT_EQ(Json::parse(calls[0].arguments), (Json{{"city", "Paris"}}));
      EXPECT_EQ(calls[1].name, "get_time");
      EXPECT_EQ(Json::parse(calls[1].arguments), (Json{{"zone", "CET"}}));
      EXPECT_NE(calls[0].id, calls[1].id);
    }
    for (const std::string text : {R"({"name": "get_weather", "arguments": {}} {"a": 1})",
                                   R"([{"name": "get_weather", "arguments": {}}, 3])", R"([])", R"([1, 2])",
                                   R"({"name": "get_weather", "arguments": {}} {"name": "other", "arguments": {}})",
                                   R"({"name": "get_weather", "arguments": {"s": "}{"}} {"name": "get_time")"}) {
      auto [content, calls] = run(text, step, names);
      EXPECT_EQ(content, text) << step;
      EXPECT_TRUE(calls.empty()) << text;
    }
  }
  // Braces inside strings do not end a call.
  const auto braces = run(R"({"name": "get_time", "arguments": {"s": "}{\"}"}} {"name": "get_time", "arguments": {}})",
                          5, names);
  ASSERT_EQ(braces.second.size(), 2u) << braces.first;
  EXPECT_EQ(Json::parse(braces.second[0].arguments), (Json{{"s", "}{\"}"}}));
}

TEST(OpenAiConvert, ForcedToolChoiceStartsTheReplyAsACall) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather"}},
                                         {"type": "function", "function": {"name": "time"}}])";
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string qwen_template = "... <tool_call>\n{\"name\": <function-name>, ...} </tool_call> ...";
  const Request required = parse_ok("{" + msgs + ", " + tools + R"(, "tool_choice": "required"})", Endpoint::kChat);
  EXPECT_TRUE(required.tool_required);
  EXPECT_EQ(forced_reply_prefix(required, qwen_template), "<tool_call>\n{\"name\": \"");
  EXPECT_EQ(forced_reply_prefix(required, "{{ messages }}"), "{\"name\": \"");  // no markup: bare JSON
  const Request named = parse_ok(
      "{" + msgs + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "time"}}})", Endpoint::kChat);
  EXPECT_EQ(named.forced_tool, "time");
  EXPECT_EQ(forced_reply_prefix(named, qwen_template), "<tool_call>\n{\"name\": \"time\", \"arguments\": ");
  EXPECT_EQ(forced_reply_prefix(parse_ok("{" + msgs + ", " + tools + "}", Endpoint::kChat), qwen_template), "");
  // The parser reads the prefix and the model's continuation as one call, in either form.
  for (const auto& [prefix, reply] : std::vector<std::pair<std::string, std::string>>{
           {forced_reply_prefix(named, qwen_template), "{\"tz\": \"CET\"}}\n</tool_call>"},
           {forced_reply_prefix(named, ""), "{\"tz\": \"CET\"}}"},
           {forced_reply_prefix(required, qwen_template), "time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>"}}) {
    ToolCallParser p(named.tool_names);
    std::string content = p.feed(prefix);
    for (char ch : reply) content += p.feed(std::string(1, ch));
    content += p.finish();
    EXPECT_EQ(content, "") << prefix;
    ASSERT_EQ(p.calls().size(), 1u) << prefix;
    EXPECT_EQ(p.calls()[0].name, "time");
    EXPECT_EQ(Json::parse(p.calls()[0].arguments), (Json{{"tz", "CET"}}));
  }
}

// The forced call goes on from the prefix held to the tools: a name of theirs, and arguments of
// that tool's parameters schema.
TEST(OpenAiConvert, ForcedToolChoiceHoldsTheReplyToAValidCall) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "time"}}])";
  // Whether the reply `rest` may follow the request's prefix, and whether it closes the call there.
  auto check = [](const Request& r, const std::string& rest) {
    JsonChoice m(r.forced_call_grammars);
    EXPECT_TRUE(m.advance(forced_call_start(r)));
    const bool taken = m.advance(rest);
    return std::make_pair(taken, m.closed());
  };
  const Request required = parse_ok("{" + msgs + ", " + tools + R"(, "tool_choice": "required"})", Endpoint::kChat);
  ASSERT_EQ(required.forced_call_grammars.size(), 2u);
  EXPECT_EQ(check(required, R"(time", "arguments": {"tz": "CET"}})"), std::make_pair(true, true));  // no parameters
  EXPECT_EQ(check(required, R"(get_weather", "arguments": {"city": "Rome"}})"), std::make_pair(true, true));
  EXPECT_FALSE(check(required, R"(get_weather", "arguments": {}})").first) << "the named tool's parameters";
  EXPECT_FALSE(check(required, R"(get_weather", "arguments": {"tz")").first) << "not the other tool's";
  EXPECT_FALSE(check(required, R"(chemo)").first) << "a name that is not a tool's";
  EXPECT_FALSE(check(required, R"(time", "arguments": 5)").first) << "arguments are an object";
  EXPECT_FALSE(check(required, R"(time", "arguments": {}, "x")").first) << "no other key";
  EXPECT_FALSE(check(required, R"(time"})").first) << "the arguments are required";

  const Request named = parse_ok(
      "{" + msgs + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})",
      Endpoint::kChat);
  ASSERT_EQ(named.forced_call_grammars.size(), 1u);
  EXPECT_EQ(check(named, R"({"city": "Paris", "unit": "C"}})"), std::make_pair(true, true));
  EXPECT_FALSE(check(named, R"({"city": 5)").first) << "the parameter's type";
  EXPECT_FALSE(check(named, R"({"unit": "K")").first) << "the parameter's enum";
  EXPECT_FALSE(check(named, R"({"unit": "C"})").first) << "city is required";
  EXPECT_FALSE(check(named, R"({"city": "Paris", "x")").first) << "the declared parameters only";
  // One tool and tool_choice required: its parameters too.
  const Request only = parse_ok("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
      "additionalProperties": false}}}], "tool_choice": "required"})", Endpoint::kChat);
  EXPECT_EQ(check(only, R"(f", "arguments": {"n": 3}})"), std::make_pair(true, true));
  EXPECT_FALSE(check(only, R"(f", "arguments": {"n": 3.5)").first);
  // References into $defs resolve from the call's top, where their $defs go.
  const Request refs = parse_ok("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
                     "type": "object", "properties": {"at": {"$ref": "#/$defs/pt"}}, "required": ["at"]}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}})", Endpoint::kChat);
  EXPECT_EQ(check(refs, R"({"at": {"x": 1.5}}})"), std::make_pair(true, true));
  EXPECT_FALSE(check(refs, R"({"at": {"x": 1.5, "y")").first) << "closed through the reference too";
  EXPECT_FALSE(check(refs, R"({"at": {"x": "one")").first) << "x is a number, by the reference";
  // A parameters schema JsonGrammar does not take (pattern): the arguments are any object.
  const Request loose = parse_ok("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}}}],
      "tool_choice": "required"})", Endpoint::kChat);
  EXPECT_EQ(check(loose, R"(f", "arguments": {"id": 7}})"), std::make_pair(true, true));
  EXPECT_FALSE(check(loose, R"(f", "arguments": [)").first);
  // Nothing forced: no grammar. Both a forced call and a response_format: one too many.
  EXPECT_TRUE(parse_ok("{" + msgs + ", " + tools + "}", Endpoint::kChat).forced_call_grammars.empty());
  EXPECT_EQ(parse_error("{" + msgs + ", " + tools + R"(, "tool_choice": "required",
                        "response_format": {"type": "json_object"}})", Endpoint::kChat).param,
            "response_format");
}

TEST(OpenAiConvert, RandomIds) {
  const std::string a = random_id("chatcmpl-"), b = random_id("chatcmpl-");
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace helios::server::openai
