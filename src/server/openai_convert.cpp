#include "server/openai_convert.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "helios/intercept.h"

namespace helios::server::openai {
namespace {

using Err = std::optional<ApiError>;

const char* json_type(const Json& j) {
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return "null";
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// A key of an object: null when absent or JSON null (OpenAI clients send null for "not set").
const Json* field(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

ApiError wrong_type(const std::string& param, const char* want, const Json& got) {
  return invalid_request(param, param + " must be " + want + ", got " + json_type(got));
}

Err read_bool(const Json& o, const char* key, const std::string& param, bool* out) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(param, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

Err read_int(const Json& o, const char* key, const std::string& param, int64_t* out, bool* given = nullptr) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {  // 2.0 is an integer too
      *out = static_cast<int64_t>(d);
      if (given) *given = true;
      return std::nullopt;
    }
  }
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    *out = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    *out = v->get<int64_t>();
  } else {
    return wrong_type(param, "an integer", *v);
  }
  if (given) *given = true;
  return std::nullopt;
}

Err read_number(const Json& o, const char* key, const std::string& param, double* out, bool* given = nullptr) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return wrong_type(param, "a number", *v);
  *out = v->get<double>();
  if (!std::isfinite(*out)) return invalid_request(param, param + " must be a finite number");
  if (given) *given = true;
  return std::nullopt;
}

Err read_string(const Json& o, const char* key, const std::string& param, std::string* out) {
  const Json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return wrong_type(param, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

int32_t clamp32(int64_t v) {
  return static_cast<int32_t>(std::max<int64_t>(INT32_MIN, std::min<int64_t>(INT32_MAX, v)));
}

// Fields OpenAI defines that Helios does not implement: refused when they ask for something.
Err check_unsupported(const Json& body, Endpoint endpoint) {
  bool echo = false;
  if (auto e = read_bool(body, "echo", "echo", &echo)) return e;
  if (echo) return invalid_request("echo", "echo is not supported by this server");
  if (endpoint == Endpoint::kCompletions) {
    std::string suffix;
    if (auto e = read_string(body, "suffix", "suffix", &suffix)) return e;
    if (!suffix.empty()) return invalid_request("suffix", "suffix is not supported by this server");
  }
  if (field(body, "functions") || field(body, "function_call")) {
    return invalid_request(field(body, "functions") ? "functions" : "function_call",
                           "the deprecated functions / function_call are not supported; use tools");
  }
  return std::nullopt;
}

// logit_bias: {"<token id>": bias in [-100, 100], ...}, the ids as strings (JSON keys are).
Err read_logit_bias(const Json& body, v1::SamplingParams* sampling) {
  const Json* bias = field(body, "logit_bias");
  if (!bias) return std::nullopt;
  if (!bias->is_object()) return wrong_type("logit_bias", "an object of token id -> bias", *bias);
  for (const auto& [key, value] : bias->items()) {
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX) {
      return invalid_request(param, param + ": logit_bias keys are token ids (non-negative integers, as strings)");
    }
    if (!value.is_number()) return wrong_type(param, "a number in [-100, 100]", value);
    const double v = value.get<double>();
    if (!(v >= -100 && v <= 100)) return invalid_request(param, param + " must be in [-100, 100], got " + num(v));
    (*sampling->mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(v);
  }
  return std::nullopt;
}

// response_format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
// "json_schema": {"name": ..., "schema": {...}, "strict": ...}}; the schema is checked (and
// compiled) by to_generation_request.
Err read_response_format(const Json& body, v1::ResponseFormat* out) {
  const Json* format = field(body, "response_format");
  if (!format) return std::nullopt;
  if (!format->is_object()) return wrong_type("response_format", "an object", *format);
  std::string type;
  if (auto e = read_string(*format, "type", "response_format.type", &type)) return e;
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    out->set_json_object(true);
    return std::nullopt;
  }
  if (type != "json_schema") {
    return invalid_request("response_format.type", "response_format.type must be text, json_object or json_schema, got '" +
                                                       type + "'");
  }
  const Json* spec = field(*format, "json_schema");
  if (!spec || !spec->is_object()) {
    return invalid_request("response_format.json_schema",
                           "response_format.json_schema must be an object with the schema in 'schema'");
  }
  const Json* schema = field(*spec, "schema");
  if (!schema || !(schema->is_object() || schema->is_boolean())) {
    return invalid_request("response_format.json_schema.schema",
                           "response_format.json_schema.schema must be a JSON schema (an object)");
  }
  out->set_json_schema(schema->dump());
  return std::nullopt;
}

// prompt: a string, a list of token ids, or a list of either (a batch).
Err read_prompts(const Json& body, std::vector<v1::GenerateRequest>* out) {
  const Json* p = field(body, "prompt");
  if (!p) return invalid_request("prompt", "prompt is required");
  auto add_text = [&](const Json& s) {
    out->emplace_back().set_text(s.get<std::string>());
  };
  auto add_ids = [&](const Json& list, const std::string& param) -> Err {
    v1::GenerateRequest& r = out->emplace_back();
    auto* ids = r.mutable_token_ids();
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& t = list[i];
      if (!t.is_number_integer()) {
        return invalid_request(param, param + "[" + std::to_string(i) + "] must be a token id (an integer), got " +
                                          json_type(t));
      }
      const int64_t id = t.get<int64_t>();
      ids->add_ids(clamp32(id));  // out of range: to_generation_request names it
    }
    if (list.empty()) return invalid_request(param, param + " is an empty list of token ids");
    return std::nullopt;
  };
  if (p->is_string()) {
    add_text(*p);
    return std::nullopt;
  }
  if (!p->is_array()) return wrong_type("prompt", "a string, a list of token ids, or a list of those", *p);
  if (p->empty()) return invalid_request("prompt", "prompt is an empty list");
  if ((*p)[0].is_number()) return add_ids(*p, "prompt");
  for (size_t i = 0; i < p->size(); ++i) {
    const Json& item = (*p)[i];
    const std::string param = "prompt[" + std::to_string(i) + "]";
    if (item.is_string()) {
      add_text(item);
    } else if (item.is_array()) {
      if (auto e = add_ids(item, param)) return e;
    } else {
      return invalid_request("prompt", param + " must be a string or a list of token ids, got " + json_type(item));
    }
  }
  return std::nullopt;
}

// A message's content: a string, or a list of text parts.
Err read_content(const Json& m, const std::string& param, bool may_be_null, std::string* out) {
  const Json* c = field(m, "content");
  if (!c) {
    if (may_be_null) return std::nullopt;
    return invalid_request(param, param + " is required for this role");
  }
  if (c->is_string()) {
    *out = c->get<std::string>();
    return std::nullopt;
  }
  if (!c->is_array()) return wrong_type(param, "a string or a list of content parts", *c);
  for (size_t i = 0; i < c->size(); ++i) {
    const Json& part = (*c)[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    const Json* type = part.is_object() ? field(part, "type") : nullptr;
    if (!type || !type->is_string()) return invalid_request(pp, pp + " must be an object with a \"type\"");
    const std::string t = type->get<std::string>();
    if (t != "text") return invalid_request(pp, pp + ".type is '" + t + "': only text parts are supported");
    const Json* text = field(part, "text");
    if (!text || !text->is_string()) return invalid_request(pp, pp + ".text must be a string");
    *out += text->get<std::string>();
  }
  return std::nullopt;
}

Err read_tool_calls(const Json& calls, const std::string& param, std::string* out) {
  if (!calls.is_array()) return wrong_type(param, "a list", calls);
  for (size_t i = 0; i < calls.size(); ++i) {
    const Json& c = calls[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    const Json* fn = c.is_object() ? field(c, "function") : nullptr;
    if (!fn || !fn->is_object()) return invalid_request(pp, pp + ".function must be an object");
    const Json* name = field(*fn, "name");
    if (!name || !name->is_string()) return invalid_request(pp, pp + ".function.name must be a string");
    const Json* args = field(*fn, "arguments");
    if (args && !args->is_string() && !args->is_object()) {
      return invalid_request(pp, pp + ".function.arguments must be a JSON string (or an object)");
    }
  }
  *out = calls.empty() ? "" : dump(calls);
  return std::nullopt;
}

Err read_messages(const Json& body, v1::GenerateRequest* out) {
  const Json* list = field(body, "messages");
  if (!list) return invalid_request("messages", "messages is required");
  if (!list->is_array()) return wrong_type("messages", "a list of messages", *list);
  if (list->empty()) return invalid_request("messages", "messages is empty");
  v1::Conversation* conv = out->mutable_conversation();
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& m = (*list)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return wrong_type(param, "an object", m);
    std::string role;
    if (auto e = read_string(m, "role", param + ".role", &role)) return e;
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return invalid_request(param + ".role", param + ".role is '" + role +
                                                  "'; valid: system, developer, user, assistant, tool");
    }
    v1::ChatMessage* msg = conv->add_messages();
    msg->set_role(role);
    std::string content;
    const Json* calls = field(m, "tool_calls");
    if (auto e = read_content(m, param + ".content", role == "assistant", &content)) return e;
    msg->set_content(content);
    if (calls) {
      if (role != "assistant") {
        return invalid_request(param + ".tool_calls", param + ".tool_calls is only for assistant messages");
      }
      std::string json;
      if (auto e = read_tool_calls(*calls, param + ".tool_calls", &json)) return e;
      msg->set_tool_calls_json(json);
    }
    if (role == "tool") {
      std::string id, name;
      if (auto e = read_string(m, "tool_call_id", param + ".tool_call_id", &id)) return e;
      if (auto e = read_string(m, "name", param + ".name", &name)) return e;
      msg->set_tool_call_id(id);
      msg->set_name(name);
    }
    // A participant's `name` on other roles has no place in a chat template: ignored, as vLLM does.
  }
  return std::nullopt;
}

// The grammar of a call of one tool (an entry of OpenAI's list): `{"name": <its name>,
// "arguments": <its parameters>}`. Its parameters' `$defs` go to the top, where their
// "#/$defs/..." references look; parameters JsonGrammar does not take leave any object.
std::shared_ptr<const JsonGrammar> call_grammar(const Json& tool) {
  const Json& fn = tool["function"];
  const Json* parameters = field(fn, "parameters");
  Json schema = {{"type", "object"}, {"required", {"name", "arguments"}}, {"additionalProperties", false}};
  auto with_arguments = [&](Json top, Json arguments) {
    for (const char* defs : {"$defs", "definitions"}) {
      if (arguments.contains(defs)) top[defs] = arguments[defs], arguments.erase(defs);
    }
    top["properties"] = {{"name", {{"const", fn["name"]}}}, {"arguments", std::move(arguments)}};
    return JsonGrammar::from_schema(top.dump());
  };
  if (parameters && parameters->is_object()) {
    if (auto g = with_arguments(schema, *parameters); g.ok()) return *g;
  }
  auto g = with_arguments(schema, {{"type", "object"}});
  return g.ok() ? *g : nullptr;
}

Err read_tools(const Json& body, Request* r) {
  const Json* tools = field(body, "tools");
  std::string choice = "auto", named;
  if (const Json* tc = field(body, "tool_choice")) {
    const Json* fn = tc->is_object() ? field(*tc, "function") : nullptr;
    const Json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    const Json* type = tc->is_object() ? field(*tc, "type") : nullptr;
    if (tc->is_string() && (*tc == "auto" || *tc == "none" || *tc == "required")) {
      choice = tc->get<std::string>();
    } else if (type && *type == "function" && name && name->is_string() && !name->get<std::string>().empty()) {
      choice = "named";
      named = name->get<std::string>();
    } else {
      return invalid_request("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or "
                                            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  const bool forced = choice == "required" || choice == "named";
  if (forced && (!tools || !tools->is_array() || tools->empty())) {
    return invalid_request("tool_choice", "tool_choice \"" + (named.empty() ? choice : named) +
                                              "\" needs tools: the request lists none");
  }
  if (!tools) return std::nullopt;
  if (!tools->is_array()) return wrong_type("tools", "a list of tools", *tools);
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string pp = "tools[" + std::to_string(i) + "]";
    const Json* type = t.is_object() ? field(t, "type") : nullptr;
    if (!type || !type->is_string() || type->get<std::string>() != "function") {
      return invalid_request(pp, pp + ".type must be \"function\"");
    }
    const Json* fn = field(t, "function");
    const Json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!name || !name->is_string() || name->get<std::string>().empty()) {
      return invalid_request(pp, pp + ".function.name must be a non-empty string");
    }
  }
  if (tools->empty() || choice == "none") return std::nullopt;  // the model sees no tools
  r->tools_json = dump(*tools);
  r->parse_tool_calls = true;
  for (const Json& t : *tools) r->tool_names.push_back(t["function"]["name"].get<std::string>());
  if (!named.empty() && std::find(r->tool_names.begin(), r->tool_names.end(), named) == r->tool_names.end()) {
    return invalid_request("tool_choice", "tool_choice names \"" + named + "\", which is not one of the request's tools");
  }
  r->tool_required = forced;
  r->forced_tool = named;
  if (forced) {
    std::set<std::string> seen;
    for (const Json& t : *tools) {
      const std::string name = t["function"]["name"].get<std::string>();
      if ((!named.empty() && name != named) || !seen.insert(name).second) continue;  // the first of a name
      if (auto g = call_grammar(t)) r->forced_call_grammars.push_back(std::move(g));
    }
    if (!r->forced_call_grammars.empty() && !JsonChoice(r->forced_call_grammars).advance(forced_call_start(*r))) {
      r->forced_call_grammars.clear();  // cannot happen for names JSON encodes; the call is then the model's
    }
  }
  return std::nullopt;
}

// helios: {"exit": {...}, "return_tokens": bool}.
Err read_helios(const Json& body, Request* r, v1::ExitOptions* exit) {
  const Json* h = field(body, "helios");
  if (!h) return std::nullopt;
  if (!h->is_object()) return wrong_type("helios", "an object", *h);
  for (const auto& [key, value] : h->items()) {
    if (key != "exit" && key != "return_tokens") {
      return invalid_request("helios." + key, "helios." + key + " is not a Helios option; valid: exit, return_tokens");
    }
  }
  if (auto e = read_bool(*h, "return_tokens", "helios.return_tokens", &r->return_tokens)) return e;
  const Json* x = field(*h, "exit");
  if (!x) return std::nullopt;
  if (!x->is_object()) return wrong_type("helios.exit", "an object", *x);
  static const std::set<std::string> kKeys = {"policy",       "threshold",   "depth",
                                              "measure",      "draft_tokens", "draft_vocab",
                                              "calibrated_thresholds"};
  for (const auto& [key, value] : x->items()) {
    if (!kKeys.count(key)) {
      return invalid_request("helios.exit." + key, "helios.exit." + key +
                                                       " is not an exit option; valid: policy, threshold, depth, "
                                                       "measure, draft_tokens, draft_vocab, "
                                                       "calibrated_thresholds");
    }
  }
  std::string s;
  if (auto e = read_string(*x, "policy", "helios.exit.policy", &s)) return e;
  exit->set_policy(s);
  s.clear();
  if (auto e = read_string(*x, "measure", "helios.exit.measure", &s)) return e;
  exit->set_measure(s);
  double threshold = 0;
  bool given = false;
  if (auto e = read_number(*x, "threshold", "helios.exit.threshold", &threshold, &given)) return e;
  if (given) {
    exit->set_threshold(static_cast<float>(threshold));
    exit->set_threshold_set(true);
  }
  int64_t v = 0;
  if (auto e = read_int(*x, "depth", "helios.exit.depth", &v)) return e;
  exit->set_depth(clamp32(v));
  v = 0;
  if (auto e = read_int(*x, "draft_tokens", "helios.exit.draft_tokens", &v)) return e;
  exit->set_draft_tokens(clamp32(v));
  v = 0;
  if (auto e = read_int(*x, "draft_vocab", "helios.exit.draft_vocab", &v)) return e;
  exit->set_draft_vocab(clamp32(v));
  bool calibrated = false;
  if (auto e = read_bool(*x, "calibrated_thresholds", "helios.exit.calibrated_thresholds", &calibrated)) return e;
  exit->set_calibrated_thresholds(calibrated);
  return std::nullopt;
}

// Everything but the prompt, shared by the prompts of one request.
Err read_common(const Json& body, Endpoint endpoint, const LimitsConfig& limits, uint64_t random_seed,
                Request* r, v1::GenerateRequest* shared) {
  if (auto e = read_string(body, "model", "model", &r->model)) return e;
  if (auto e = check_unsupported(body, endpoint)) return e;

  int64_t n = 1;
  if (auto e = read_int(body, "n", "n", &n)) return e;
  if (n < 1 || n > limits.max_n) {
    return invalid_request("n", "n must be in 1.." + std::to_string(limits.max_n) + " (the server's limits.max_n), got " +
                                    std::to_string(n));
  }
  r->n = static_cast<int32_t>(n);
  int64_t best_of = 0;
  bool best_of_given = false;
  if (auto e = read_int(body, "best_of", "best_of", &best_of, &best_of_given)) return e;
  if (best_of_given && best_of != 1 && best_of != n) {
    return invalid_request("best_of", "best_of is not supported by this server (only 1, or equal to n)");
  }

  if (auto e = read_bool(body, "stream", "stream", &r->stream)) return e;
  if (const Json* so = field(body, "stream_options")) {
    if (!r->stream) return invalid_request("stream_options", "stream_options is only allowed when stream is true");
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    if (auto e = read_bool(*so, "include_usage", "stream_options.include_usage", &r->include_usage)) return e;
  }

  // Sampling: OpenAI's defaults are temperature 1 and top_p 1, and a random seed.
  v1::SamplingParams* sampling = shared->mutable_sampling();
  double temperature = 1.0;
  if (auto e = read_number(body, "temperature", "temperature", &temperature)) return e;
  if (temperature > 2) return invalid_request("temperature", "temperature must be in [0, 2], got " + num(temperature));
  sampling->set_temperature(static_cast<float>(temperature));
  double top_p = 1.0;
  if (auto e = read_number(body, "top_p", "top_p", &top_p)) return e;
  if (!(top_p > 0)) return invalid_request("top_p", "top_p must be in (0, 1], got " + num(top_p));
  sampling->set_top_p(static_cast<float>(top_p));
  int64_t top_k = 0;  // vLLM's extra: -1 or 0 = off
  if (auto e = read_int(body, "top_k", "top_k", &top_k)) return e;
  sampling->set_top_k(top_k == -1 ? 0 : clamp32(top_k));
  double min_p = 0, repetition_penalty = 0;
  if (auto e = read_number(body, "min_p", "min_p", &min_p)) return e;
  sampling->set_min_p(static_cast<float>(min_p));
  if (auto e = read_number(body, "repetition_penalty", "repetition_penalty", &repetition_penalty)) return e;
  if (field(body, "repetition_penalty") && !(repetition_penalty > 0)) {
    return invalid_request("repetition_penalty", "repetition_penalty must be > 0 (1 = off), got " + num(repetition_penalty));
  }
  sampling->set_repetition_penalty(static_cast<float>(repetition_penalty));
  auto read_penalty = [&](const char* key, double* v) -> Err {
    if (auto e = read_number(body, key, key, v)) return e;
    if (!(*v >= -2 && *v <= 2)) return invalid_request(key, std::string(key) + " must be in [-2, 2], got " + num(*v));
    return std::nullopt;
  };
  double presence = 0, frequency = 0;
  if (auto e = read_penalty("presence_penalty", &presence)) return e;
  if (auto e = read_penalty("frequency_penalty", &frequency)) return e;
  sampling->set_presence_penalty(static_cast<float>(presence));
  sampling->set_frequency_penalty(static_cast<float>(frequency));
  if (auto e = read_logit_bias(body, sampling)) return e;
  int64_t seed = 0;
  bool seed_given = false;
  if (auto e = read_int(body, "seed", "seed", &seed, &seed_given)) return e;
  sampling->set_seed(seed_given ? static_cast<uint64_t>(seed) : random_seed);

  // max_tokens (chat: max_completion_tokens first).
  int64_t max_tokens = 0;
  bool max_given = false;
  if (endpoint == Endpoint::kChat && field(body, "max_completion_tokens")) r->max_tokens_param = "max_completion_tokens";
  if (auto e = read_int(body, r->max_tokens_param.c_str(), r->max_tokens_param, &max_tokens, &max_given)) return e;
  if (max_given && max_tokens < 1) {
    return invalid_request(r->max_tokens_param, r->max_tokens_param + " must be at least 1, got " + std::to_string(max_tokens));
  }
  if (!max_given && endpoint == Endpoint::kCompletions) {
    max_tokens = std::min(kCompletionsDefaultMaxTokens, limits.max_tokens);
  }
  shared->set_max_tokens(clamp32(max_tokens));  // 0: the server's default, or what the context leaves

  if (auto e = read_response_format(body, shared->mutable_response_format())) return e;
  if (!shared->response_format().has_json_object() && !shared->response_format().has_json_schema()) {
    shared->clear_response_format();
  }

  bool ignore_eos = false;  // vLLM's and llama.cpp's extra
  if (auto e = read_bool(body, "ignore_eos", "ignore_eos", &ignore_eos)) return e;
  shared->set_ignore_eos(ignore_eos);

  if (const Json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      shared->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) return wrong_type("stop", "a string or a list of strings", (*stop)[i]);
        shared->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or a list of strings", *stop);
    }
  }

  // logprobs: completions an integer (the top alternatives), chat a boolean + top_logprobs.
  if (endpoint == Endpoint::kCompletions) {
    int64_t k = 0;
    bool given = false;
    if (auto e = read_int(body, "logprobs", "logprobs", &k, &given)) return e;
    if (given) {
      if (k < 0 || k > 20) return invalid_request("logprobs", "logprobs must be in 0..20, got " + std::to_string(k));
      r->logprobs = true;
      r->top_logprobs = static_cast<int32_t>(k);
    }
  } else {
    if (auto e = read_bool(body, "logprobs", "logprobs", &r->logprobs)) return e;
    int64_t k = 0;
    bool given = false;
    if (auto e = read_int(body, "top_logprobs", "top_logprobs", &k, &given)) return e;
    if (given && k > 0 && !r->logprobs) return invalid_request("top_logprobs", "top_logprobs needs logprobs: true");
    if (k < 0 || k > 20) return invalid_request("top_logprobs", "top_logprobs must be in 0..20, got " + std::to_string(k));
    r->top_logprobs = static_cast<int32_t>(k);
  }
  shared->set_logprobs(r->logprobs);
  shared->set_top_logprobs(r->top_logprobs);

  if (auto e = read_helios(body, r, shared->mutable_exit())) return e;
  return std::nullopt;
}

struct Rename {
  std::string_view grpc;  // a prefix of to_generation_request's field names
  std::string_view completions, chat;
};

}  // namespace

Json ApiError::to_json() const {
  Json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return Json{{"error", e}};
}

ApiError invalid_request(std::string param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError error_from_status(StatusCode code, const std::string& message) {
  ApiError e;
  e.message = message;
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      e.http_status = 400;
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.code = "model_not_found";
      e.param = "model";
      break;
    case StatusCode::kAlreadyExists:
      e.http_status = 409;
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_exceeded";
      e.code = "queue_full";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      break;
  }
  return e;
}

std::variant<Request, ApiError> parse_request(const Json& body, Endpoint endpoint, const LimitsConfig& limits,
                                              uint64_t random_seed) {
  if (!body.is_object()) return invalid_request("", std::string("the request body must be a JSON object, got ") + json_type(body));
  Request r;
  r.endpoint = endpoint;
  v1::GenerateRequest shared;
  if (auto e = read_common(body, endpoint, limits, random_seed, &r, &shared)) return *e;
  if (endpoint == Endpoint::kCompletions) {
    if (field(body, "messages")) return invalid_request("messages", "messages is for /v1/chat/completions; send prompt");
    std::vector<v1::GenerateRequest> prompts;
    if (auto e = read_prompts(body, &prompts)) return *e;
    for (v1::GenerateRequest& p : prompts) {
      v1::GenerateRequest merged = shared;
      merged.MergeFrom(p);  // the prompt (a oneof) onto the shared fields
      r.prompts.push_back(std::move(merged));
    }
    if (r.n_choices() > kMaxChoicesPerRequest) {
      return invalid_request("prompt", std::to_string(r.prompts.size()) + " prompts × n = " + std::to_string(r.n) +
                                           " make " + std::to_string(r.n_choices()) +
                                           " choices; at most " + std::to_string(kMaxChoicesPerRequest) +
                                           " per request");
    }
  } else {
    if (field(body, "prompt")) return invalid_request("prompt", "prompt is for /v1/completions; send messages");
    if (auto e = read_tools(body, &r)) return *e;
    if (r.tool_required && shared.has_response_format()) {
      return invalid_request("response_format", "response_format and a forced tool_choice both hold the reply to a "
                                                "shape: send one (the call's arguments follow the tool's parameters)");
    }
    if (auto e = read_messages(body, &shared)) return *e;
    r.prompts.push_back(std::move(shared));
  }
  return r;
}

ApiError from_conversion_error(const Status& status, const Request& request) {
  const bool chat = request.endpoint == Endpoint::kChat;
  const std::string prompt = chat ? "messages" : "prompt";
  const Rename renames[] = {
      {"sampling.", "", ""},
      {"exit.", "helios.exit.", "helios.exit."},
      {"conversation.messages", "messages", "messages"},
      {"token_ids", "prompt", "prompt"},
      {"text", "prompt", "messages"},
      {"tools_json", "tools", "tools"},
      {"top_logprobs", "logprobs", "top_logprobs"},
      {"max_tokens", request.max_tokens_param, request.max_tokens_param},
      {"response_format.json_schema", "response_format.json_schema.schema", "response_format.json_schema.schema"},
  };
  const std::string& message = status.message();
  ApiError e = error_from_status(status.code(), message);
  // The field is the message's first word ("sampling.top_p must ...", "exit.policy: ...").
  const size_t end = message.find_first_of(" :");
  std::string field_name = message.substr(0, end);
  for (const Rename& rn : renames) {
    if (field_name.rfind(rn.grpc, 0) != 0) continue;
    const std::string_view to = chat ? rn.chat : rn.completions;
    std::string renamed = std::string(to) + field_name.substr(rn.grpc.size());
    // token_ids[3] → prompt[3] only for one prompt; a batch's prompt index is not known here.
    e.message = renamed + (end == std::string::npos ? "" : message.substr(end));
    field_name = renamed;
    break;
  }
  if (e.http_status == 400) {
    // param: the field without an index into a list of strings (stop[1] → stop), as OpenAI names it.
    std::string param = field_name;
    if (param.rfind("stop[", 0) == 0) param = "stop";
    if (param.rfind("prompt[", 0) == 0) param = "prompt";
    if (param == "input" || param.empty()) param = prompt;
    e.param = param;
  }
  return e;
}

// ---------------------------------------------------------------------------------------------

std::string forced_call_start(const Request& request) {
  if (!request.tool_required) return "";
  return request.forced_tool.empty() ? "{\"name\": \""
                                     : "{\"name\": " + Json(request.forced_tool).dump() + ", \"arguments\": ";
}

std::string forced_reply_prefix(const Request& request, const std::string& chat_template,
                                const std::string& tool_call_open) {
  const std::string call = forced_call_start(request);
  if (call.empty() || chat_template.find(tool_call_open) == std::string::npos) return call;
  return tool_call_open + "\n" + call;
}

ToolCallParser::ToolCallParser(std::vector<std::string> tool_names, std::string open, std::string close)
    : tool_names_(std::move(tool_names)), open_(std::move(open)), close_(std::move(close)) {}

void ToolCallParser::take_call(const std::string& body, std::string* content, bool closed) {
  ToolCall call;
  std::string error;
  if (parse_tool_call(body, &call.name, &call.arguments, &error)) {
    call.id = random_id("call_");
    calls_.push_back(std::move(call));
  } else {
    *content += open_ + body + (closed ? close_ : "");
  }
}

bool ToolCallParser::take_bare_calls(const std::string& text) {
  const auto calls = parse_bare_tool_calls(text);
  if (calls.empty()) return false;
  for (const auto& [name, arguments] : calls) {
    if (!tool_names_.empty() && std::find(tool_names_.begin(), tool_names_.end(), name) == tool_names_.end()) {
      return false;
    }
  }
  for (const auto& [name, arguments] : calls) calls_.push_back({random_id("call_"), name, arguments});
  return true;
}

std::string ToolCallParser::feed(std::string_view text) {
  if (start_ == Start::kText) return feed_markup(text);
  pending_.append(text);
  if (start_ == Start::kBare) return "";
  const size_t first = pending_.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";  // only white space so far: undecided
  const std::string_view rest = std::string_view(pending_).substr(first);
  const bool json = rest.front() == '{' || rest.front() == '[';  // a call, or a list of them
  if (json || (rest.size() >= 3 ? rest.substr(0, 3) == "```" : std::string_view("```").starts_with(rest))) {
    if (json || rest.size() >= 3) start_ = Start::kBare;
    return "";  // a bare call, perhaps: held to the end
  }
  start_ = Start::kText;
  std::string held;
  held.swap(pending_);
  return feed_markup(held);
}

std::string ToolCallParser::feed_markup(std::string_view text) {
  pending_.append(text);
  std::string content;
  for (;;) {
    if (!inside_) {
      const size_t at = pending_.find(open_);
      if (at != std::string::npos) {
        content += pending_.substr(0, at);
        pending_.erase(0, at + open_.size());
        inside_ = true;
        continue;
      }
      // Hold back the longest tail that may still become the opening tag.
      size_t keep = 0;
      for (size_t k = std::min(open_.size() - 1, pending_.size()); k > 0; --k) {
        if (pending_.compare(pending_.size() - k, k, open_, 0, k) == 0) {
          keep = k;
          break;
        }
      }
      content += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return content;
    }
    const size_t at = pending_.find(close_);
    if (at == std::string::npos) return content;
    take_call(pending_.substr(0, at), &content, /*closed=*/true);
    pending_.erase(0, at + close_.size());
    inside_ = false;
  }
}

std::string ToolCallParser::finish() {
  std::string content;
  if (start_ != Start::kText) {  // held: a bare call, or text that was never decided
    std::string held;
    held.swap(pending_);
    start_ = Start::kText;
    if (take_bare_calls(held)) return "";
    content = feed_markup(held);
  }
  if (inside_) {
    take_call(pending_, &content, /*closed=*/false);  // a model that ended its turn before the close
  } else {
    content += pending_;
  }
  pending_.clear();
  inside_ = false;
  return content;
}

// ---------------------------------------------------------------------------------------------

std::string finish_reason_name(FinishReason reason, bool called_tools) {
  if (called_tools && reason != FinishReason::kLength) return "tool_calls";
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kNone: return "";
    default: return "stop";  // a stop string or token, the end of the turn (EOS)
  }
}

ResponseWriter::ResponseWriter(const Request& request, std::string id, int64_t created, std::string model,
                               const Tokenizer& tokenizer)
    : request_(request), id_(std::move(id)), created_(created), model_(std::move(model)), tokenizer_(tokenizer) {}

Json ResponseWriter::base(const char* object) const {
  return Json{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

Json usage_json(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {

Json bytes_of(const std::string& s) {
  Json out = Json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

Json helios_tokens(const ChoiceOutput& c) {
  Json tokens = Json::array();
  for (const TokenEvent& t : c.tokens) {
    tokens.push_back(Json{{"id", t.id},
                          {"exit_layer", t.exit_layer},
                          {"confidence", t.confidence},
                          {"model", c.model},
                          {"loaded_depth", t.loaded_layers}});
  }
  return Json{{"tokens", std::move(tokens)}};
}

}  // namespace

Json ResponseWriter::logprobs_json(const ChoiceOutput& c) const {
  if (!request_.logprobs) return nullptr;
  auto piece = [&](TokenId id) { return tokenizer_.token_to_piece(id, true); };
  if (request_.endpoint == Endpoint::kChat) {
    Json content = Json::array();
    for (const TokenEvent& t : c.tokens) {
      const std::string p = piece(t.id);
      Json top = Json::array();
      for (const auto& [id, lp] : t.top_logprobs) {
        if (static_cast<int32_t>(top.size()) >= request_.top_logprobs) break;
        const std::string tp = piece(id);
        top.push_back(Json{{"token", tp}, {"logprob", lp}, {"bytes", bytes_of(tp)}});
      }
      content.push_back(Json{{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}, {"top_logprobs", top}});
    }
    return Json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  int64_t offset = c.text_offset;
  for (const TokenEvent& t : c.tokens) {
    tokens.push_back(piece(t.id));
    token_logprobs.push_back(t.logprob);
    Json alternatives = Json::object();
    for (const auto& [id, lp] : t.top_logprobs) {
      if (static_cast<int32_t>(alternatives.size()) >= request_.top_logprobs) break;
      alternatives[valid_utf8(piece(id))] = lp;
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.text.size());
  }
  return Json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", request_.top_logprobs > 0 ? top : Json(nullptr)},
              {"text_offset", offsets}};
}

Json ResponseWriter::choice_json(const ChoiceOutput& c, bool stream) const {
  Json choice = {{"index", c.index}};
  if (request_.endpoint == Endpoint::kCompletions) {
    choice["text"] = c.text;
  } else {
    Json message = Json::object();
    if (!stream || c.first) message["role"] = "assistant";
    Json calls = Json::array();
    for (size_t i = 0; i < c.tool_calls.size(); ++i) {
      const ToolCall& t = c.tool_calls[i];
      Json call = {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
      if (stream) call["index"] = static_cast<int64_t>(i);
      calls.push_back(std::move(call));
    }
    if (stream) {
      if (c.first || !c.text.empty()) message["content"] = c.text;
      if (!calls.empty()) message["tool_calls"] = std::move(calls);
      choice["delta"] = std::move(message);
    } else {
      // Only calls (and white space around them): content null, as OpenAI sends it.
      const bool blank = c.text.find_first_not_of(" \t\r\n") == std::string::npos;
      message["content"] = !calls.empty() && blank ? Json(nullptr) : Json(c.text);
      if (!calls.empty()) message["tool_calls"] = std::move(calls);
      message["refusal"] = nullptr;
      choice["message"] = std::move(message);
    }
  }
  choice["logprobs"] = logprobs_json(c);
  choice["finish_reason"] = c.finish_reason.empty() ? Json(nullptr) : Json(c.finish_reason);
  if (request_.return_tokens) choice["helios"] = helios_tokens(c);
  return choice;
}

Json ResponseWriter::response(const std::vector<ChoiceOutput>& choices, const Usage& usage) const {
  Json out = base(request_.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion");
  Json list = Json::array();
  for (const ChoiceOutput& c : choices) list.push_back(choice_json(c, false));
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

Json ResponseWriter::chunk(const std::vector<ChoiceOutput>& choices) const {
  Json out = base(request_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  Json list = Json::array();
  for (const ChoiceOutput& c : choices) list.push_back(choice_json(c, true));
  out["choices"] = std::move(list);
  if (request_.include_usage) out["usage"] = nullptr;
  return out;
}

Json ResponseWriter::usage_chunk(const Usage& usage) const {
  Json out = base(request_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = Json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse_event(const Json& j) { return "data: " + dump(j) + "\n\n"; }

std::string random_id(std::string_view prefix, size_t n) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof kChars - 2);
  std::string out(prefix);
  for (size_t i = 0; i < n; ++i) out += kChars[pick(rng)];
  return out;
}

}  // namespace helios::server::openai
