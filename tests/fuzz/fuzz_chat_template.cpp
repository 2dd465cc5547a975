// Bytes → a Jinja chat template and a JSON context → parse and render with the interpreter, and
// the same template as a model's through ChatFormatter (messages, tools, the prompt's tokens).
// The interpreter promises that a render ends: within its step, output and call-depth limits,
// with an error past them, never a hang, a crash or unbounded memory (the fuzzer's -timeout and
// -rss_limit_mb see those).
//
// Input: the template, a NUL byte, then the context: a JSON object whose keys become the
// template's variables (messages, tools, add_generation_prompt, bos_token, ...). Without a NUL or
// a JSON object there, a one-message conversation.
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <string>

#include "fuzz_common.h"
#include "helios/chat_template.h"
#include "helios/jinja.h"

namespace helios::fuzz {
namespace {

using jinja::Value;

constexpr std::string_view kDefaultContext =
    R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true,
        "bos_token": "<s>", "eos_token": "</s>"})";

// Smaller than the defaults so that a run takes milliseconds; a template whose cost grows faster
// than its steps and output (a string copied at every step, say) still shows as a timeout.
jinja::RenderOptions render_options() {
  jinja::RenderOptions o;
  o.limits.max_steps = 200'000;
  o.limits.max_output_bytes = 1 << 20;
  o.now = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));
  return o;
}

void check_text(const jinja::Text& text, const jinja::RenderOptions& options) {
  if (text.size() > options.limits.max_output_bytes) die("a render passed the output limit");
  size_t last_end = 0;
  for (const auto& r : text.input_ranges()) {
    if (r.begin >= r.end || r.end > text.size() || (last_end && r.begin <= last_end)) {
      die("input ranges are not sorted, disjoint and inside the text");
    }
    last_end = r.end;
  }
}

// The context as a ChatRequest, as the server builds one from a conversation.
ChatRequest chat_request(const nlohmann::json& context) {
  ChatRequest request;
  const auto str = [](const nlohmann::json& j, const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (auto it = context.find("messages"); it != context.end() && it->is_array()) {
    for (const auto& m : *it) {
      if (!m.is_object()) continue;
      ChatMessage message(str(m, "role"), str(m, "content"));
      if (auto calls = m.find("tool_calls"); calls != m.end()) message.tool_calls_json = calls->dump();
      message.tool_call_id = str(m, "tool_call_id");
      message.name = str(m, "name");
      request.messages.push_back(std::move(message));
    }
  }
  if (auto it = context.find("tools"); it != context.end() && !it->is_null()) request.tools_json = it->dump();
  if (auto it = context.find("add_generation_prompt"); it != context.end() && it->is_boolean()) {
    request.add_generation_prompt = it->get<bool>();
  }
  return request;
}

void run(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto [source, context_text] = split_input(input, std::string_view("\0", 1));
  auto context_value = Value::from_json(context_text);
  if (!context_value.ok() || context_value->kind() != Value::Kind::kDict) {
    context_text = kDefaultContext;
    context_value = Value::from_json(context_text);
  }
  const jinja::RenderOptions options = render_options();

  // The interpreter alone, on any variables.
  auto tmpl = jinja::Template::parse(source);
  if (tmpl.ok()) {
    std::map<std::string, Value> variables;
    for (const auto& [key, value] : context_value->as_dict().items) {
      if (key.is_string()) variables[key.as_string()] = value;
    }
    auto text = tmpl->render(variables, options);
    if (text.ok()) check_text(*text, options);
  }

  // As a model's template: the conversation's messages and tools, then the prompt's tokens.
  static const std::unique_ptr<Tokenizer> stories = load_tokenizer(stories260k_gguf());
  TokenizerSpec spec = stories->spec();
  spec.chat_template = std::string(source);
  auto tok = Tokenizer::create(std::move(spec));
  if (!tok.ok()) die(tok.status().to_string());
  const nlohmann::json context = nlohmann::json::parse(context_text, nullptr, /*allow_exceptions=*/false);
  if (!context.is_object()) return;
  const ChatFormatter formatter(**tok);
  auto prompt = formatter.format(chat_request(context), options);
  if (!prompt.ok()) return;
  for (TokenId id : formatter.encode(*prompt)) {
    if (id < 0 || id >= (*tok)->n_vocab()) die("a prompt token is outside the vocabulary");
  }
}

}  // namespace
}  // namespace helios::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  helios::fuzz::run(data, size);
  return 0;
}
