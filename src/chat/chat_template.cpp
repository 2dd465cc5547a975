// Chat prompts from the model's template: the conversation as the variables transformers passes
// (messages, tools, documents, add_generation_prompt, bos_token, eos_token), the render split into
// template text and conversation text, the fallback when the template cannot run, and the tokens.
#include "helios/chat_template.h"

namespace helios {
namespace {

using jinja::Text;
using jinja::Value;

std::string fallback_note(const TokenizerSpec& spec) {
  return std::string("; using the ") + chat_format_name(spec.chat) + " format recognised from " +
         (spec.chat_template.empty() ? "the vocabulary" : "its markers") + " instead";
}

// The special token's text, as the template's own text (it comes from the model, not the user).
Value token_text(const TokenizerSpec& spec, TokenId id) {
  if (id < 0 || static_cast<size_t>(id) >= spec.tokens.size()) return Value::string(Text());
  return Value::string(Text::literal(spec.tokens[id]));
}

StatusOr<Value> parse_json(const std::string& json, const std::string& what) {
  auto v = Value::from_json(json);
  if (!v.ok()) return invalid_argument(what + " is not valid JSON: " + v.status().message());
  return v;
}

// Tool calls as templates expect them: function.arguments an object. A JSON string holding an
// object (the OpenAI wire form) is parsed into it; anything else is passed as given.
Value normalize_tool_calls(const Value& calls) {
  if (calls.kind() != Value::Kind::kList) return calls;
  std::vector<Value> out;
  for (const Value& call : calls.as_list().items) {
    const Value* function = call.kind() == Value::Kind::kDict ? call.as_dict().find("function") : nullptr;
    const Value* args = function && function->kind() == Value::Kind::kDict ? function->as_dict().find("arguments") : nullptr;
    auto parsed = args && args->is_string() ? Value::from_json(args->as_string()) : StatusOr<Value>(Value());
    if (!parsed.ok() || parsed->kind() != Value::Kind::kDict) {
      out.push_back(call);
      continue;
    }
    auto replace = [](const Value& dict, const char* key, Value v) {
      std::vector<std::pair<Value, Value>> items = dict.as_dict().items;
      for (auto& [k, val] : items) {
        if (k.is_string() && k.as_string() == key) val = std::move(v);
      }
      return Value::dict(std::move(items));
    };
    out.push_back(replace(call, "function", replace(*function, "arguments", *parsed)));
  }
  return Value::list(std::move(out));
}

StatusOr<Value> message_value(const ChatMessage& m, size_t index) {
  std::vector<std::pair<Value, Value>> items;
  auto key = [](const char* k) { return Value::string(Text::literal(k)); };
  items.emplace_back(key("role"), Value::input_string(m.role));
  items.emplace_back(key("content"), Value::input_string(m.content));
  if (!m.tool_calls_json.empty()) {
    HELIOS_ASSIGN_OR_RETURN(Value calls, parse_json(m.tool_calls_json, "messages[" + std::to_string(index) + "].tool_calls"));
    items.emplace_back(key("tool_calls"), normalize_tool_calls(calls));
  }
  if (!m.tool_call_id.empty()) items.emplace_back(key("tool_call_id"), Value::input_string(m.tool_call_id));
  if (!m.name.empty()) items.emplace_back(key("name"), Value::input_string(m.name));
  return Value::dict(std::move(items));
}

}  // namespace

std::string ChatPrompt::text() const {
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

ChatFormatter::ChatFormatter(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  const TokenizerSpec& spec = tokenizer.spec();
  if (spec.chat_template.empty()) {
    problem_ = "the model has no chat template (tokenizer.chat_template)" + fallback_note(spec);
    return;
  }
  auto parsed = jinja::Template::parse(spec.chat_template);
  if (parsed.ok()) {
    template_ = std::move(*parsed);
  } else {
    problem_ = "its chat template cannot be run here (" + parsed.status().message() + ")" + fallback_note(spec);
  }
}

ChatPrompt ChatFormatter::fallback(const ChatRequest& request, const std::string& reason) const {
  ChatPrompt prompt = format_recognised_chat(tokenizer_.spec(), request);
  prompt.fallback_reason = reason;
  return prompt;
}

StatusOr<ChatPrompt> ChatFormatter::format(const ChatRequest& request, const jinja::RenderOptions& options) const {
  std::vector<Value> messages;
  for (size_t i = 0; i < request.messages.size(); ++i) {
    HELIOS_ASSIGN_OR_RETURN(Value m, message_value(request.messages[i], i));
    messages.push_back(std::move(m));
  }
  Value tools = Value::none();
  if (!request.tools_json.empty()) {
    HELIOS_ASSIGN_OR_RETURN(tools, parse_json(request.tools_json, "tools"));
  }
  if (!template_) return fallback(request, problem_);

  const TokenizerSpec& spec = tokenizer_.spec();
  const std::map<std::string, Value> variables = {
      {"messages", Value::list(std::move(messages))},
      {"tools", tools},
      {"documents", Value::none()},
      {"add_generation_prompt", Value::boolean(request.add_generation_prompt)},
      {"bos_token", token_text(spec, spec.bos_id)},
      {"eos_token", token_text(spec, spec.eos_id)},
  };
  auto rendered = template_->render(variables, options);
  if (!rendered.ok()) {
    if (rendered.status().code() != StatusCode::kUnimplemented) return rendered.status();
    return fallback(request, "its chat template failed on this conversation (" + rendered.status().message() + ")" +
                                 fallback_note(spec));
  }
  ChatPrompt prompt;
  for (auto& [bytes, from_input] : rendered->runs()) prompt.segments.push_back({std::move(bytes), !from_input});
  return prompt;
}

std::vector<TokenId> ChatFormatter::encode(const ChatPrompt& prompt) const {
  std::string text;
  ByteRanges template_ranges;
  for (const ChatSegment& s : prompt.segments) {
    if (s.from_template) template_ranges.emplace_back(text.size(), text.size() + s.text.size());
    text += s.text;
  }
  std::vector<TokenId> ids = tokenizer_.encode_with_special_ranges(text, /*add_special=*/true, template_ranges);
  const TokenId bos = tokenizer_.bos();
  if (tokenizer_.spec().add_bos && ids.size() >= 2 && ids[0] == bos && ids[1] == bos) ids.erase(ids.begin());
  return ids;
}

}  // namespace helios
