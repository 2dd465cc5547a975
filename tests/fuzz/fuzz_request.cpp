// Bytes → the server's requests → its validation and conversion into the engine's request, for
// stories260K (with no chat template, and with Qwen2.5-Coder's, which writes tools and tool calls):
//   mode 0  a GenerateRequest (to_generation_request)
//   mode 1  a Session: SessionOpen (prepare_session), generated text through the intercept matcher
//           (the pause), then a SessionResume (to_resume_input, SessionTurns::resume); the text
//           also goes through the OpenAI API's tool-call parser
//   mode 2  an OpenAI /v1/completions body, mode 3 a /v1/chat/completions body (parse_request,
//           then to_generation_request for each prompt)
// A request the conversion accepts must be one the engine can run: a prompt of in-vocabulary
// tokens that fits the context with max_tokens, sampling that validates, an exit rule the model
// runs.
//
// Input: byte 0 = mode (bits 0-1), model (bit 2: with the chat template), exit config (bits 3-4:
// the default, a per-token default with allowed_policies and min_threshold, overrides off); then
// mode 0: the GenerateRequest; mode 1: u16 length + SessionOpen, u16 length + generated text,
// the SessionResume; modes 2-3: the JSON body.
#include <algorithm>
#include <cstring>
#include <string>

#include "fuzz_common.h"
#include "helios/backend.h"
#include "helios/gguf.h"
#include "helios/intercept.h"
#include "helios/model.h"
#include "server/openai_convert.h"
#include "server/request_convert.h"
#include "server/session.h"

namespace helios::fuzz {
namespace {

using server::RequestLimits;

// As a server with a 2048-token context (stories260K's own 512 is too short for a chat template's
// tool preamble in its tiny vocabulary); the conversion checks requests against this number.
constexpr int32_t kContextTokens = 2048;

// stories260K again, with tokenizer.chat_template set to `chat_template`.
std::string with_chat_template(const std::string& path, const std::string& chat_template) {
  auto file = GgufFile::open(path);
  if (!file.ok()) die(file.status().to_string());
  GgufWriter w;
  for (const std::string& key : (*file)->keys()) w.set_value(key, *(*file)->find(key));
  w.set_string("tokenizer.chat_template", chat_template);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    const Status s = w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    if (!s.ok()) die(s.to_string());
  }
  const std::string out = temp_dir() + "/stories260K-chat.gguf";
  const Status s = w.write(out);
  if (!s.ok()) die(s.to_string());
  return out;
}

struct Fixtures {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::unique_ptr<Model> models[2];
  EarlyExitConfig exit_configs[3];
};

const Fixtures& fixtures() {
  static const Fixtures* f = [] {
    auto* out = new Fixtures;
    const std::string plain = stories260k_gguf();
    const std::string chat = with_chat_template(
        plain, read_file(source_dir() + "/tests/data/chat_templates/qwen2.5-coder-0.5b-instruct.jinja"));
    int i = 0;
    for (const std::string& path : {plain, chat}) {
      auto m = Model::load(path, *out->backend);
      if (!m.ok()) die(m.status().to_string());
      const Status s = (*m)->set_exits({2, 3}, nullptr);
      if (!s.ok()) die(s.to_string());
      out->models[i++] = std::move(*m);
    }
    EarlyExitConfig& restricted = out->exit_configs[1];
    restricted.default_rule.policy = ExitPolicy::kPerToken;
    restricted.allowed_policies = {ExitPolicy::kFull, ExitPolicy::kPerToken, ExitPolicy::kFixedDepth};
    restricted.min_threshold = 0.5f;
    EarlyExitConfig& fixed = out->exit_configs[2];
    fixed.default_rule.policy = ExitPolicy::kPerToken;
    fixed.allow_request_override = false;
    return out;
  }();
  return *f;
}

// What an accepted request must be for the engine.
void check_request(const GenerationRequest& r, const Model& model, const RequestLimits& limits) {
  const int32_t n_vocab = model.config().n_vocab;
  if (r.prompt.empty()) die("an accepted request has no prompt");
  for (TokenId id : r.prompt) {
    if (id < 0 || id >= n_vocab) die("an accepted prompt has token " + std::to_string(id));
  }
  for (TokenId id : r.stop_token_ids) {
    if (id < 0 || id >= n_vocab) die("an accepted stop token is " + std::to_string(id));
  }
  if (r.max_tokens < 1 || r.max_tokens > limits.limits.max_tokens) {
    die("an accepted request has max_tokens " + std::to_string(r.max_tokens));
  }
  if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > limits.context_tokens) {
    die("an accepted request does not fit the context");
  }
  if (r.top_logprobs > 20) die("an accepted request has top_logprobs " + std::to_string(r.top_logprobs));
  if (const Status s = r.sampling.validate(); !s.ok()) die("accepted sampling does not validate: " + s.to_string());
  if (const Status s = model.check_exit_rule(r.exit); !s.ok()) {
    die("an accepted exit rule does not run: " + s.to_string());
  }
}

// Reads a u16 little-endian length and that many bytes (fewer at the end).
std::string_view take(std::string_view* in) {
  if (in->size() < 2) {
    *in = {};
    return {};
  }
  const size_t n = std::min<size_t>(static_cast<uint8_t>((*in)[0]) | static_cast<uint8_t>((*in)[1]) << 8, in->size() - 2);
  const std::string_view out = in->substr(2, n);
  in->remove_prefix(2 + n);
  return out;
}

void run_generate(std::string_view in, const Model& model, const RequestLimits& limits) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(in.data(), static_cast<int>(in.size()))) return;
  auto converted = server::to_generation_request(request, model, limits);
  if (converted.ok()) check_request(*converted, model, limits);
}

void run_session(std::string_view in, const Model& model, const RequestLimits& limits) {
  v1::SessionOpen open;
  const std::string_view open_bytes = take(&in);
  if (!open.ParseFromArray(open_bytes.data(), static_cast<int>(open_bytes.size()))) return;
  const std::string generated(take(&in));
  v1::SessionResume resume;
  const bool has_resume = resume.ParseFromArray(in.data(), static_cast<int>(in.size()));

  auto prepared = server::prepare_session(open, model, limits);
  if (!prepared.ok()) return;
  check_request(prepared->request, model, limits);
  const Tokenizer& tok = model.tokenizer();
  for (TokenId id : prepared->request.intercept.triggers.token_ids) {
    if (id < 0 || id >= tok.n_vocab()) die("an accepted trigger token is " + std::to_string(id));
  }

  // The generation: its tokens' text through the matcher, as the engine runs it, to the first pause.
  const InterceptTriggers& triggers = prepared->request.intercept.triggers;
  if (triggers.any()) {
    InterceptMatcher matcher(triggers);
    StreamDecoder decoder(tok);
    for (TokenId id : tok.encode(generated, /*add_special=*/false, /*parse_special=*/true)) {
      const std::string text = decoder.push(id);
      prepared->turns->add_generated(text);
      std::optional<InterceptEvent> event = matcher.push(id, text, tok.is_end_of_generation(id));
      if (!event) continue;
      if (event->trigger == "end_of_turn" || event->trigger == "token") event->matched = tok.token_to_piece(id, true);
      event->index = 1;
      prepared->turns->on_pause(*event);
      break;
    }
  }
  if (has_resume) {
    auto input = server::to_resume_input(resume);
    if (input.ok()) {
      auto ids = prepared->turns->resume(*input);
      if (ids.ok()) {
        if (ids->empty()) die("a resume was accepted without tokens");
        for (TokenId id : *ids) {
          if (id < 0 || id >= tok.n_vocab()) die("a resume gave token " + std::to_string(id));
        }
      }
    }
  }

  // The same text as the OpenAI API's tool-call parser sees it, in pieces.
  server::openai::ToolCallParser parser;
  for (size_t at = 0; at < generated.size(); at += 7) (void)parser.feed(std::string_view(generated).substr(at, 7));
  (void)parser.finish();
}

void run_openai(std::string_view in, server::openai::Endpoint endpoint, const Model& model,
                const RequestLimits& limits) {
  const auto body = server::openai::Json::parse(in.begin(), in.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return;
  auto parsed = server::openai::parse_request(body, endpoint, limits.limits, /*random_seed=*/7);
  auto* request = std::get_if<server::openai::Request>(&parsed);
  if (!request) return;
  if (request->n_choices() > server::openai::kMaxChoicesPerRequest) die("an accepted request has too many choices");
  for (const v1::GenerateRequest& prompt : request->prompts) {
    auto converted = server::to_generation_request(prompt, model, limits, request->tools_json);
    if (converted.ok()) {
      check_request(*converted, model, limits);
    } else {
      (void)server::openai::from_conversion_error(converted.status(), *request);
    }
  }
}

void run(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  const Fixtures& f = fixtures();
  const Model& model = *f.models[(flags >> 2) & 1];
  const RequestLimits limits{LimitsConfig{}, kContextTokens, f.exit_configs[((flags >> 3) & 3) % 3]};
  switch (flags & 3) {
    case 0: run_generate(in, model, limits); break;
    case 1: run_session(in, model, limits); break;
    case 2: run_openai(in, server::openai::Endpoint::kCompletions, model, limits); break;
    default: run_openai(in, server::openai::Endpoint::kChat, model, limits); break;
  }
}

}  // namespace
}  // namespace helios::fuzz

// The fixtures load before the first input, outside its time limit (-timeout): loading a real
// vocabulary under ASan takes seconds, more on a busy machine.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  helios::fuzz::fixtures();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  helios::fuzz::run(data, size);
  return 0;
}
