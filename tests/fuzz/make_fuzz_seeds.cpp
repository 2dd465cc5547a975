// Writes the generated seeds of tests/fuzz/corpus/ from the repository's real inputs: GGUF files
// made with the project's writers (a synthetic model, stories260K's tokenizer, a byte-level BPE
// tokenizer, an exit-heads sidecar), the configs in configs/, the chat templates and
// conversations of tests/data/chat_templates/ and tests/golden/data/smollm2_tokenize.json's
// texts, and serialized requests. Seeds it did not write (regression inputs) are left alone.
//   build-fuzz/tests/fuzz/make_fuzz_seeds tests/fuzz/corpus
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "fuzz_common.h"
#include "helios/early_exit.h"
#include "helios/gguf.h"
#include "helios/model_tools.h"
#include "helios/v1/helios.pb.h"
#include "tokenizer/unicode.h"

namespace helios::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path g_out;
int g_written = 0;

void write_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << bytes;
  ++g_written;
}

std::string gguf_bytes(const GgufWriter& w) {
  const std::vector<uint8_t> b = w.serialize();
  return std::string(b.begin(), b.end());
}

// ---- fuzz_gguf

void gguf_seeds() {
  const std::string tmp = temp_dir() + "/seed.gguf";
  SyntheticModelSpec f32;
  f32.n_layer = 1;
  f32.n_embd = 16;
  f32.n_head = 2;
  f32.n_head_kv = 1;
  f32.n_ff = 32;
  f32.n_vocab = 259;
  f32.n_ctx = 64;
  SyntheticModelSpec q8 = f32;  // separate LM head, NeoX RoPE
  q8.n_embd = 32;
  q8.n_ff = 64;
  q8.type = TensorType::kQ8_0;
  q8.tied_output = false;
  q8.rope_halves = true;
  for (const auto& [name, spec] : {std::pair{"synthetic-f32.gguf", f32}, std::pair{"synthetic-q8_0.gguf", q8}}) {
    if (const Status s = make_synthetic_model(spec, tmp); !s.ok()) die(s.to_string());
    write_seed("fuzz_gguf", name, read_file(tmp));
  }

  // stories260K's metadata alone: the SentencePiece vocabulary with scores and token types.
  auto stories = GgufFile::open(stories260k_gguf());
  if (!stories.ok()) die(stories.status().to_string());
  GgufWriter meta;
  for (const std::string& key : (*stories)->keys()) meta.set_value(key, *(*stories)->find(key));
  write_seed("fuzz_gguf", "stories260k-metadata.gguf", gguf_bytes(meta));

  // A byte-level BPE tokenizer: the 256 byte characters, merges, control tokens, a chat template.
  GgufWriter bpe;
  std::vector<std::string> tokens;
  std::vector<int32_t> kinds;
  for (int b = 0; b < 256; ++b) tokens.push_back(unicode::byte_to_char(static_cast<uint8_t>(b)));
  kinds.assign(256, 1);
  const std::vector<std::string> merges = {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w"};
  for (const std::string& m : merges) {
    tokens.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
    kinds.push_back(1);
  }
  for (const char* control : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(control);
    kinds.push_back(3);
  }
  bpe.set_string("general.architecture", "llama");
  bpe.set_string("tokenizer.ggml.model", "gpt2");
  bpe.set_string("tokenizer.ggml.pre", "smollm");
  bpe.set_string_array("tokenizer.ggml.tokens", tokens);
  bpe.set_int32_array("tokenizer.ggml.token_type", kinds);
  bpe.set_string_array("tokenizer.ggml.merges", merges);
  bpe.set_uint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokens.size() - 3));
  bpe.set_uint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokens.size() - 1));
  bpe.set_bool("tokenizer.ggml.add_bos_token", false);
  bpe.set_string("tokenizer.chat_template", read_file(source_dir() + "/tests/data/chat_templates/smollm2-135m-instruct.jinja"));
  write_seed("fuzz_gguf", "bpe-tokenizer.gguf", gguf_bytes(bpe));

  // An exit-heads sidecar: an adapter, probes and an agreement curve.
  ExitHeadSet set;
  set.model_name = "synthetic";
  set.n_layer = 4;
  set.n_embd = 8;
  ExitHeadParams h1;
  h1.layer = 1;
  h1.adapter_weight.assign(64, 0.125f);
  h1.adapter_bias.assign(8, 0.0f);
  h1.probe_weight.assign(8, 0.5f);
  h1.probe_bias = -1;
  h1.threshold = 0.8f;
  h1.curve_prob = {0.2f, 0.5f, 0.9f};
  h1.curve_agreement = {0.3f, 0.6f, 0.95f};
  ExitHeadParams h2;
  h2.layer = 2;
  h2.probe_weight.assign(8, -0.25f);
  set.heads = {h1, h2};
  if (const Status s = save_exit_heads(set, tmp); !s.ok()) die(s.to_string());
  write_seed("fuzz_gguf", "exit-heads.gguf", read_file(tmp));
}

// ---- fuzz_tokenizer: flags byte (vocabulary, add_special, parse_special, ranges, any ids), text

void tokenizer_seeds() {
  const json cases = json::parse(read_file(source_dir() + "/tests/golden/data/smollm2_tokenize.json"))["cases"];
  std::set<std::string> texts;
  for (const json& c : cases) texts.insert(c["text"].get<std::string>());
  int i = 0;
  for (const std::string& text : texts) {
    // Each text for stories260K and for SmolLM2 under one of the four pre-tokenizers, in turn.
    const uint8_t spm = static_cast<uint8_t>((i % 2 ? 8 : 0) | (i % 3 == 0 ? 32 : 0));
    const uint8_t bpe = static_cast<uint8_t>((2 + i % 4) | (i % 2 ? 16 : 0) | (i % 5 == 0 ? 64 : 0));
    write_seed("fuzz_tokenizer", "spm-" + std::to_string(i), std::string(1, static_cast<char>(spm)) + text);
    write_seed("fuzz_tokenizer", "bpe-" + std::to_string(i), std::string(1, static_cast<char>(bpe)) + text);
    ++i;
  }
}

// ---- fuzz_config

void config_seeds() {
  for (const auto& entry : fs::directory_iterator(source_dir() + "/configs")) {
    if (entry.path().extension() == ".yaml") {
      write_seed("fuzz_config", entry.path().filename().string(), read_file(entry.path().string()));
    }
  }
}

// ---- fuzz_chat_template: template, NUL, context

void chat_template_seeds() {
  const std::string dir = source_dir() + "/tests/data/chat_templates/";
  const json features = json::parse(read_file(dir + "features.json"))["cases"];
  for (const json& c : features) {
    write_seed("fuzz_chat_template", "feature-" + c["name"].get<std::string>(),
               c["template"].get<std::string>() + std::string(1, '\0') + c["variables"].dump());
  }
  // Four conversations per model template (the tool ones among them) keep the corpus small.
  const json goldens = json::parse(read_file(dir + "goldens.json"));
  std::map<std::string, std::set<std::string>> taken;
  int i = 0;
  for (const json& c : goldens["cases"]) {
    std::set<std::string>& conversations = taken[c["template"].get<std::string>()];
    const std::string conversation = c["conversation"].get<std::string>();
    const bool tools = conversation.rfind("tool", 0) == 0;
    if (conversations.count(conversation) || (conversations.size() >= 2 && !tools) || conversations.size() >= 4) continue;
    conversations.insert(conversation);
    json context = goldens["conversations"][c["conversation"].get<std::string>()];
    for (const char* key : {"add_generation_prompt", "bos_token", "eos_token"}) {
      if (c.contains(key)) context[key] = c[key];
    }
    const std::string name = c["template"].get<std::string>();
    write_seed("fuzz_chat_template", "golden-" + std::to_string(i++) + "-" + name,
               read_file(dir + name + ".jinja") + std::string(1, '\0') + context.dump());
  }
}

// ---- fuzz_request: mode byte, then the message(s)

std::string with_mode(uint8_t mode, const std::string& bytes) { return std::string(1, static_cast<char>(mode)) + bytes; }

std::string framed(const std::string& part) {
  const auto n = static_cast<uint16_t>(part.size());
  return std::string{static_cast<char>(n & 0xff), static_cast<char>(n >> 8)} + part;
}

constexpr uint8_t kChatModel = 4, kRestrictedExits = 8, kFixedExits = 16;

v1::ChatMessage* add_message(v1::Conversation* c, const std::string& role, const std::string& content) {
  v1::ChatMessage* m = c->add_messages();
  m->set_role(role);
  m->set_content(content);
  return m;
}

void request_seeds() {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic",
           "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
           "required": ["expression"]}}}])";
  {
    v1::GenerateRequest r;
    r.set_model("stories260k");
    r.set_text("Once upon a time");
    r.set_max_tokens(32);
    r.add_stop("\n\n");
    r.set_logprobs(true);
    r.set_top_logprobs(5);
    auto* s = r.mutable_sampling();
    s->set_temperature(0.8f);
    s->set_top_k(40);
    s->set_top_p(0.95f);
    s->set_min_p(0.05f);
    s->set_seed(42);
    r.mutable_exit()->set_policy("per-token");
    r.mutable_exit()->set_threshold(0.8f);
    write_seed("fuzz_request", "generate-text", with_mode(0, r.SerializeAsString()));
    r.mutable_exit()->set_policy("batch-sync");
    write_seed("fuzz_request", "generate-text-restricted", with_mode(kRestrictedExits, r.SerializeAsString()));
  }
  {
    v1::GenerateRequest r;
    for (int id : {1, 403, 407, 261, 378}) r.mutable_token_ids()->add_ids(id);
    r.add_stop_token_ids(2);
    r.set_ignore_eos(true);
    r.mutable_exit()->set_policy("fixed-depth");
    r.mutable_exit()->set_depth(2);
    write_seed("fuzz_request", "generate-token-ids", with_mode(0, r.SerializeAsString()));
    write_seed("fuzz_request", "generate-token-ids-fixed", with_mode(kFixedExits, r.SerializeAsString()));
  }
  {
    v1::GenerateRequest r;
    auto* c = r.mutable_conversation();
    add_message(c, "system", "You are a helpful assistant.");
    add_message(c, "user", "What is 2+2?");
    add_message(c, "assistant", "")->set_tool_calls_json(
        R"([{"type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"2+2\"}"}}])");
    v1::ChatMessage* tool = add_message(c, "tool", "4");
    tool->set_name("calculator");
    tool->set_tool_call_id("call_1");
    r.mutable_exit()->set_policy("self-speculative");
    r.mutable_exit()->set_depth(2);
    r.mutable_exit()->set_draft_tokens(4);
    r.set_max_tokens(64);
    write_seed("fuzz_request", "generate-conversation", with_mode(kChatModel, r.SerializeAsString()));
    write_seed("fuzz_request", "generate-conversation-fallback", with_mode(0, r.SerializeAsString()));
  }
  {
    v1::GenerateRequest r;
    r.set_text("Tell me a story <|im_end|>");
    r.set_chat(true);
    r.mutable_sampling()->set_repetition_penalty(1.1f);
    write_seed("fuzz_request", "generate-chat-text", with_mode(kChatModel, r.SerializeAsString()));
  }
  {
    v1::SessionOpen open;
    add_message(open.mutable_request()->mutable_conversation(), "user", "What is 17 * 23? Use the calculator.");
    open.mutable_request()->set_max_tokens(48);
    open.mutable_intercept()->set_tool_calls(true);
    open.mutable_intercept()->set_hold("min-waste");
    open.mutable_intercept()->set_kind("math");
    open.set_tools_json(tools);
    v1::SessionResume resume;
    resume.mutable_tool_result()->set_content("391");
    resume.mutable_tool_result()->set_name("calculator");
    const std::string generated =
        "Let me compute it.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17 * 23\"}}\n</tool_call>";
    write_seed("fuzz_request", "session-tool-call",
               with_mode(1 | kChatModel, framed(open.SerializeAsString()) + framed(generated) + resume.SerializeAsString()));
    open.mutable_intercept()->set_tool_calls(false);
    open.mutable_intercept()->set_end_of_turn(true);
    open.mutable_intercept()->set_hold("preserve");
    resume.Clear();
    resume.set_user_turn("And then?");
    write_seed("fuzz_request", "session-end-of-turn",
               with_mode(1 | kChatModel, framed(open.SerializeAsString()) + framed("It was a sunny day.</s>") +
                                             resume.SerializeAsString()));
  }
  {
    v1::SessionOpen open;
    open.mutable_request()->set_text("Q: what is the capital of France?\nAnswer:");
    open.mutable_intercept()->add_triggers("Search[");
    open.mutable_intercept()->add_trigger_token_ids(13);
    open.mutable_intercept()->set_hold("swap");
    open.mutable_intercept()->set_on_length(true);
    v1::SessionResume resume;
    resume.set_text("Paris]\n");
    resume.set_max_tokens(16);
    write_seed("fuzz_request", "session-trigger",
               with_mode(1, framed(open.SerializeAsString()) + framed(" Search[capital of France") + resume.SerializeAsString()));
    resume.Clear();
    for (int id : {365, 261}) resume.mutable_token_ids()->add_ids(id);
    write_seed("fuzz_request", "session-token-ids",
               with_mode(1 | kFixedExits, framed(open.SerializeAsString()) + framed(" Search[x") + resume.SerializeAsString()));
  }
  write_seed("fuzz_request", "openai-completions",
             with_mode(2, R"({"model": "stories260k", "prompt": ["Once upon a time", "The dog"], "max_tokens": 16,
                "temperature": 0.7, "top_p": 0.9, "stop": ["\n"], "logprobs": 2, "n": 2, "seed": 5, "echo": false,
                "helios": {"exit": {"policy": "per-token", "threshold": 0.5}, "return_tokens": true}})"));
  write_seed("fuzz_request", "openai-chat",
             with_mode(3 | kChatModel,
                       R"({"model": "stories260k", "messages": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 17 * 23?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                  "function": {"name": "calculator", "arguments": "{\"expression\": \"17 * 23\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "391"}],
                "tools": )" + tools + R"(, "tool_choice": "auto", "max_completion_tokens": 32, "stream": true,
                "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3})"));
}

}  // namespace
}  // namespace helios::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  helios::fuzz::g_out = argv[1];
  helios::fuzz::gguf_seeds();
  helios::fuzz::tokenizer_seeds();
  helios::fuzz::config_seeds();
  helios::fuzz::chat_template_seeds();
  helios::fuzz::request_seeds();
  std::printf("make_fuzz_seeds: wrote %d seeds under %s\n", helios::fuzz::g_written, argv[1]);
  return 0;
}
