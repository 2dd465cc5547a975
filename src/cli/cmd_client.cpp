// helios complete / chat / status: clients of a running heliosd.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/calculator.h"
#include "helios/intercept.h"
#include "helios/v1/helios.grpc.pb.h"

namespace helios::cli {
namespace {

void add_connection_options(Args& args) {
  args.option("address", "HOST:PORT", "the heliosd to talk to", "localhost:50051")
      .option("tls-ca", "FILE", "use TLS, trusting this CA certificate (PEM)")
      .option("api-key", "KEY", "API key, sent as 'authorization: Bearer KEY'")
      .option("timeout", "SECONDS", "give up after this long", "600");
}

std::unique_ptr<v1::Helios::Stub> connect(const Args& args, std::string* error) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (args.has("tls-ca")) {
    std::ifstream in(args.str("tls-ca"));
    if (!in) {
      *error = "cannot read --tls-ca file '" + args.str("tls-ca") + "'";
      return nullptr;
    }
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    creds = grpc::SslCredentials(ssl);
  }
  return v1::Helios::NewStub(grpc::CreateChannel(args.str("address"), creds));
}

void prepare(const Args& args, grpc::ClientContext* ctx) {
  if (args.has("api-key")) ctx->AddMetadata("authorization", "Bearer " + args.str("api-key"));
  auto seconds = args.number("timeout");
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>((seconds.ok() ? *seconds : 600) * 1000)));
}

int rpc_error(const std::string& command, const Args& args, const grpc::Status& s) {
  std::string hint;
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) hint = " (is heliosd running at " + args.str("address") + "?)";
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) hint = " (pass --api-key)";
  std::fprintf(stderr, "helios %s: %s%s\n", command.c_str(), s.error_message().c_str(), hint.c_str());
  return 1;
}

// Unset flags stay 0/"": the server's default for the model (helios status shows it).
Status fill_exit_options(const Args& args, v1::ExitOptions* exit) {
  HELIOS_ASSIGN_OR_RETURN(int64_t depth, args.integer("depth"));
  HELIOS_ASSIGN_OR_RETURN(int64_t draft_tokens, args.integer("draft-tokens"));
  HELIOS_ASSIGN_OR_RETURN(int64_t draft_vocab, args.integer("draft-vocab"));
  exit->set_policy(args.str("policy"));
  exit->set_measure(args.str("measure"));
  exit->set_depth(static_cast<int32_t>(depth));
  exit->set_draft_tokens(static_cast<int32_t>(draft_tokens));
  exit->set_draft_vocab(static_cast<int32_t>(draft_vocab));
  if (args.str("threshold") == "calibrated") {
    exit->set_calibrated_thresholds(true);
  } else if (args.has("threshold")) {
    HELIOS_ASSIGN_OR_RETURN(double threshold, args.number("threshold"));
    exit->set_threshold(static_cast<float>(threshold));
    exit->set_threshold_set(true);  // 0 is a real threshold here
  }
  return ok_status();
}

Status fill_sampling(const Args& args, v1::GenerateRequest* req) {
  HELIOS_ASSIGN_OR_RETURN(int64_t max_tokens, args.integer("max-tokens"));
  HELIOS_ASSIGN_OR_RETURN(double temperature, args.number("temperature"));
  HELIOS_ASSIGN_OR_RETURN(int64_t top_k, args.integer("top-k"));
  HELIOS_ASSIGN_OR_RETURN(double top_p, args.number("top-p"));
  HELIOS_ASSIGN_OR_RETURN(double min_p, args.number("min-p"));
  HELIOS_ASSIGN_OR_RETURN(int64_t seed, args.integer("seed"));
  req->set_max_tokens(static_cast<int32_t>(max_tokens));
  req->mutable_sampling()->set_temperature(static_cast<float>(temperature));
  req->mutable_sampling()->set_top_k(static_cast<int32_t>(top_k));
  req->mutable_sampling()->set_top_p(static_cast<float>(top_p));
  req->mutable_sampling()->set_min_p(static_cast<float>(min_p));
  req->mutable_sampling()->set_seed(static_cast<uint64_t>(seed));
  req->set_model(args.str("model"));
  return fill_exit_options(args, req->mutable_exit());
}

void add_generation_options(Args& args) {
  args.option("model", "NAME", "model name (helios status lists them); default: the server's first")
      .option("max-tokens", "N", "generate at most N tokens; 0 = the server's default", "0")
      .option("temperature", "T", "sampling temperature; 0 = greedy (the default of complete; the defaults of these "
              "four " + std::string(kChatSamplingNote) + ")", "0")
      .option("top-k", "K", "sample from the K most likely tokens; 0 = all", "0")
      .option("top-p", "P", "nucleus sampling mass; 0 or 1 = off", "0")
      .option("min-p", "P", "drop tokens less likely than P x the most likely; 0 = off", "0")
      .option("seed", "S", "random seed", "0")
      .option("policy", "NAME",
              "early exit: full | per-token | batch-sync | fixed-depth | self-speculative; "
              "default: the model's")
      .option("threshold", "T", "early exit: leave at an exit when confidence >= T (0..1; 1 = never early); 'calibrated' = each exit's fitted threshold")
      .option("depth", "D", "early exit: fixed-depth exit layer, or self-speculative draft layer; 0 = the model's", "0")
      .option("measure", "NAME", "early exit: confidence measure top1 | margin | entropy | probe | saturation | agreement")
      .option("draft-tokens", "N", "early exit: self-speculative drafts per verification at most (1..16); 0 = the model's", "0")
      .option("draft-vocab", "N", "early exit: self-speculative drafts among the first N token ids (a multiple of 64); 0 = the model's", "0")
      .option("show-exits", "", "print each token's exit layer and confidence to stderr, then their mean");
}

// "[exits] ..." lines on stderr, after the text: one per token, then the mean exit layer.
void print_exits(const std::vector<v1::GeneratedToken>& tokens) {
  if (tokens.empty()) return;
  double layer_sum = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const v1::GeneratedToken& t = tokens[i];
    std::string text;
    for (char c : t.text()) text += c == '\n' ? std::string("\\n") : std::string(1, c);
    std::fprintf(stderr, "[exits] %4zu %-20s layer %3d  confidence %.3f\n", i, ("'" + text + "'").c_str(),
                 t.exit_layer(), t.confidence());
    layer_sum += t.exit_layer();
  }
  std::fprintf(stderr, "[exits] %zu tokens, mean exit layer %.2f\n", tokens.size(), layer_sum / tokens.size());
}

// Streams one generation to stdout; returns the generated text through *text.
int stream_generation(const std::string& command, const Args& args, v1::Helios::Stub& stub,
                      const v1::GenerateRequest& req, std::string* text) {
  grpc::ClientContext ctx;
  prepare(args, &ctx);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  v1::GenerateResponse last;
  std::vector<v1::GeneratedToken> tokens;  // for --show-exits
  while (reader->Read(&resp)) {
    for (const auto& t : resp.tokens()) {
      std::fwrite(t.text().data(), 1, t.text().size(), stdout);
      *text += t.text();
      if (args.has("show-exits")) tokens.push_back(t);
    }
    std::fflush(stdout);
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = resp;
  }
  grpc::Status s = reader->Finish();
  std::fputc('\n', stdout);
  if (!s.ok()) return rpc_error(command, args, s);
  print_exits(tokens);
  std::fprintf(stderr, "[%s: %d prompt + %d generated tokens, first token %.3f s, total %.3f s]\n",
               v1::FinishReason_Name(last.finish_reason()).c_str(), last.usage().prompt_tokens(),
               last.usage().completion_tokens(), last.timings().time_to_first_token_seconds(),
               last.timings().total_seconds());
  return 0;
}

std::string join_ints(const google::protobuf::RepeatedField<int32_t>& values) {
  std::string out;
  for (int32_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out.empty() ? "none" : out;
}

// The early-exit lines of `helios status` for one model.
void print_model_exits(const v1::ModelInfo& m, const v1::ServerStatus& status) {
  const v1::ExitOptions& d = m.default_exit();
  std::printf("  early exit: exit points %s; default %s (measure %s, threshold %g, depth %d, draft %d); "
              "heads %s; request overrides %s\n",
              join_ints(m.exit_layers()).c_str(), d.policy().c_str(), d.measure().c_str(), d.threshold(),
              d.depth(), d.draft_tokens(), m.exit_heads_path().empty() ? "identity" : m.exit_heads_path().c_str(),
              m.exit_override_allowed() ? "allowed" : "refused");
  for (const auto& ms : status.models()) {
    if (ms.name() != m.name()) continue;
    const v1::EarlyExitStats& e = ms.early_exit();
    std::printf("  exits so far: %lld tokens, mean exit layer %.2f, %.2f layers computed per token, "
                "%lld KV layers filled",
                static_cast<long long>(ms.generated_tokens_total()), e.mean_exit_layer(), e.layers_per_token(),
                static_cast<long long>(e.kv_fill_layers_total()));
    if (e.draft_tokens_total() > 0) {
      std::printf(", %lld of %lld drafts accepted (%.1f%%)", static_cast<long long>(e.draft_tokens_accepted()),
                  static_cast<long long>(e.draft_tokens_total()), 100.0 * e.draft_acceptance_rate());
    }
    std::printf("\n");
    std::string counts;
    for (int layer = 0; layer < e.exit_layer_counts_size(); ++layer) {
      if (e.exit_layer_counts(layer) == 0) continue;
      char item[48];
      std::snprintf(item, sizeof item, " %d:%lld", layer, static_cast<long long>(e.exit_layer_counts(layer)));
      counts += item;
    }
    if (!counts.empty()) std::printf("  tokens by exit layer (layer:count):%s\n", counts.c_str());
  }
}

// --- helios chat --calculator: a session that pauses at each tool call and each end of turn.

constexpr const char* kCalculatorSystem =
    "You are a helpful assistant. You have a calculator tool for arithmetic: never compute by "
    "yourself, call the tool instead. To call it, write exactly\n"
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"(12 + 30) * 2\"}}\n</tool_call>\n"
    "with your expression (numbers, + - * / ^ and parentheses), then stop and wait: the result comes "
    "back in a tool response. Then answer the user with it.";

constexpr const char* kCalculatorTools =
    R"([{"type": "function", "function": {"name": "calculator", )"
    R"("description": "Evaluates an arithmetic expression: numbers, + - * / ^ (power) and parentheses.", )"
    R"("parameters": {"type": "object", "properties": {"expression": {"type": "string", )"
    R"("description": "the expression, e.g. (12 + 30) * 2"}}, "required": ["expression"]}}}])";

// The tool's answer to one call: the result, or "error: ..." (the model reads either).
std::string run_calculator(const v1::Intercept& call, std::string* expression) {
  if (!call.parse_error().empty()) return "error: the tool call is not valid JSON: " + call.parse_error();
  if (call.tool_name() != "calculator") return "error: there is no tool '" + call.tool_name() + "'; use calculator";
  const nlohmann::json arguments = nlohmann::json::parse(call.arguments_json(), nullptr, /*allow_exceptions=*/false);
  if (!arguments.is_object() || !arguments.contains("expression")) {
    return "error: the call has no \"expression\" argument";
  }
  const nlohmann::json& e = arguments["expression"];
  *expression = e.is_string() ? e.get<std::string>() : e.dump();
  auto value = evaluate_arithmetic(*expression);
  return value.ok() ? format_number(*value) : "error: " + value.status().message();
}

// A turn that is nothing but a call, written without the <tool_call> markup (small models do:
// Qwen2.5-Coder-0.5B answers with the bare {"name": ..., "arguments": ...}, or that in a ```json
// fence): the call, as the server would have parsed it.
bool bare_tool_call(const std::string& text, v1::Intercept* call) {
  std::string name, arguments;
  if (!parse_bare_tool_call(text, &name, &arguments)) return false;
  call->set_trigger("tool_call");
  call->set_tool_name(name);
  call->set_arguments_json(arguments);
  return true;
}

// One line from the human; false at the end of input or an empty line.
bool read_turn(bool interactive, std::string* line) {
  if (interactive) std::fputs("> ", stdout), std::fflush(stdout);
  return std::getline(std::cin, *line) && !line->empty();
}

int calculator_chat(const Args& args, v1::Helios::Stub& stub, v1::GenerateRequest request) {
  const bool interactive = ::isatty(STDIN_FILENO);
  std::string line;
  if (!read_turn(interactive, &line)) return 0;
  v1::SessionRequest open_message;
  v1::SessionOpen* open = open_message.mutable_open();
  v1::Conversation* conversation = request.mutable_conversation();
  auto* system = conversation->add_messages();
  system->set_role("system");
  system->set_content(args.has("system") ? args.str("system") : kCalculatorSystem);
  auto* user = conversation->add_messages();
  user->set_role("user");
  user->set_content(line);
  *open->mutable_request() = std::move(request);
  open->set_tools_json(kCalculatorTools);
  open->mutable_intercept()->set_tool_calls(true);
  open->mutable_intercept()->set_end_of_turn(true);
  open->mutable_intercept()->set_kind("math");

  grpc::ClientContext ctx;
  prepare(args, &ctx);
  auto stream = stub.Session(&ctx);
  bool writes_done = !stream->Write(open_message);  // a failed write: Finish says why
  v1::SessionResponse response, last;
  std::vector<v1::GeneratedToken> tokens;  // for --show-exits
  constexpr int kMaxCallsPerTurn = 4;
  int calls_this_turn = 0;
  while (stream->Read(&response)) {
    for (const auto& t : response.tokens()) {
      std::fwrite(t.text().data(), 1, t.text().size(), stdout);
      if (args.has("show-exits")) tokens.push_back(t);
    }
    std::fflush(stdout);
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = response;
    if (!response.has_intercept() || writes_done) continue;
    v1::SessionRequest next;
    v1::Intercept call = response.intercept();
    // A model that keeps calling (small ones do, on their own results) gets the human's turn after
    // kMaxCallsPerTurn calls in a row: a bare call then ends its turn, a marked-up one gets an error.
    const bool marked_up = call.trigger() == "tool_call";
    if (marked_up || (call.trigger() == "end_of_turn" && calls_this_turn < kMaxCallsPerTurn &&
                      bare_tool_call(call.text(), &call))) {
      std::string expression = call.text();
      const std::string result = ++calls_this_turn > kMaxCallsPerTurn
                                     ? "error: too many calculator calls in one turn; answer the user now"
                                     : run_calculator(call, &expression);
      std::printf("\n[calculator] %s = %s\n", expression.c_str(), result.c_str());
      v1::ToolResult* tool = next.mutable_resume()->mutable_tool_result();
      tool->set_content(result);
      tool->set_name("calculator");
    } else {  // the end of the model's turn: the human's next one
      std::fputc('\n', stdout);
      calls_this_turn = 0;
      if (read_turn(interactive, &line)) next.mutable_resume()->set_user_turn(line);
      else next.mutable_end();
    }
    std::fflush(stdout);
    if (!stream->Write(next)) break;
    if (next.has_end()) {
      stream->WritesDone();
      writes_done = true;
    }
  }
  if (!writes_done) stream->WritesDone();
  const grpc::Status s = stream->Finish();
  std::fputc('\n', stdout);
  if (!s.ok()) return rpc_error("chat", args, s);
  print_exits(tokens);
  std::fprintf(stderr, "[%s: %d prompt + %d generated tokens, %d segments, total %.3f s]\n",
               v1::FinishReason_Name(last.finish_reason()).c_str(), last.usage().prompt_tokens(),
               last.usage().completion_tokens(), last.segment() + 1, last.timings().total_seconds());
  return 0;
}

}  // namespace

int cmd_complete(int argc, char** argv) {
  Args args("complete", "Sends one prompt to a running heliosd and streams the completion to stdout.");
  args.option("prompt", "TEXT", "the prompt (required)").option("chat", "", "treat the prompt as a user turn");
  add_generation_options(args);
  add_connection_options(args);
  args.example("helios complete --address localhost:50051 --prompt \"Once upon a time\" --max-tokens 64");
  args.example("helios complete --prompt \"Once upon a time\" --policy per-token --threshold 0.8 --show-exits");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("complete", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("prompt")) return usage_error("complete", "--prompt TEXT is required (see --help)");
  v1::GenerateRequest req;
  req.set_text(args.str("prompt"));
  req.set_chat(args.has("chat"));
  if (args.has("chat")) use_chat_sampling_defaults(args);
  if (Status s = fill_sampling(args, &req); !s.ok()) return usage_error("complete", s.message());
  std::string error;
  auto stub = connect(args, &error);
  if (!stub) return usage_error("complete", error);
  std::string text;
  return stream_generation("complete", args, *stub, req, &text);
}

int cmd_chat(int argc, char** argv) {
  Args args("chat",
            "Chats with a model on a running heliosd: type a message, read the reply; the whole\n"
            "conversation is sent each turn. An empty line or end of input ends the chat.\n\n"
            "--calculator chats in one Session instead (the Session RPC: a generation that pauses and\n"
            "resumes in place, README: sessions and intercepts): the model is told it has a\n"
            "`calculator` tool ({\"expression\": \"...\"}, + - * / ^ and parentheses). When it writes a\n"
            "<tool_call> (or ends its turn with nothing but the call's JSON, as small models do), the\n"
            "generation pauses, helios evaluates the expression here, prints\n"
            "'[calculator] EXPR = RESULT' and resumes it with the result as the tool's turn; when the model\n"
            "ends its turn, the generation pauses for your next line and resumes with it, its context\n"
            "(KV) held by the server's hold policy meanwhile instead of sent again. --timeout bounds the\n"
            "whole session.");
  args.option("system", "TEXT", "a system message to start the conversation with (--calculator: instead of the one "
              "that explains the tool)")
      .option("calculator", "", "one Session with a calculator tool: tool calls and your turns resume it in place");
  add_generation_options(args);
  add_connection_options(args);
  use_chat_sampling_defaults(args);
  args.example("helios chat --address localhost:50051");
  args.example("helios chat --temperature 0 --seed 1   # greedy instead of llama.cpp's chat sampling");
  args.example("helios chat --policy fixed-depth --depth 16");
  args.example("helios chat --calculator --temperature 0   # then: What is 12.5% of 3,480 plus 17?");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("chat", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  std::string error;
  auto stub = connect(args, &error);
  if (!stub) return usage_error("chat", error);
  v1::GenerateRequest req;
  if (Status s = fill_sampling(args, &req); !s.ok()) return usage_error("chat", s.message());
  if (args.has("calculator")) return calculator_chat(args, *stub, std::move(req));
  v1::Conversation* conversation = req.mutable_conversation();
  if (args.has("system")) {
    auto* m = conversation->add_messages();
    m->set_role("system");
    m->set_content(args.str("system"));
  }
  const bool interactive = ::isatty(STDIN_FILENO);
  std::string line;
  for (;;) {
    if (interactive) std::fputs("> ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line) || line.empty()) break;
    auto* user = conversation->add_messages();
    user->set_role("user");
    user->set_content(line);
    std::string reply;
    if (int rc = stream_generation("chat", args, *stub, req, &reply); rc != 0) return rc;
    auto* assistant = conversation->add_messages();
    assistant->set_role("assistant");
    assistant->set_content(reply);
  }
  return 0;
}

// The model manager's view of one group: what it serves, the PHT, CBC, memory, decisions.
void print_group(const v1::GroupStatus& g) {
  std::printf("group %s (slo %s): %s, serving %s at %d/%d layers; candidates:", g.name().c_str(), g.slo().c_str(),
              g.phase().c_str(), g.model().c_str(), g.loaded_depth(), g.n_layers());
  for (const auto& c : g.candidates()) std::printf(" %s", c.c_str());
  std::printf("\n  %lld requests, %lld since the last evaluation (RI %d); CBC %d of the last %d tokens below %.2f "
              "(CBCmax %d)\n",
              static_cast<long long>(g.requests_total()), static_cast<long long>(g.requests_since_evaluation()),
              g.reassess_every(), g.confidence_breaches(), g.cbc_window(), g.threshold(), g.cbc_max());
  const auto& m = g.memory();
  std::printf("  memory: budget %.0f MiB = weights %.0f MiB + KV %.0f MiB (+ %.0f MiB free); pool %d blocks of %d "
              "tokens: %d sequences of %d tokens\n",
              m.budget_bytes() / 1048576.0, m.weight_bytes() / 1048576.0, m.kv_bytes() / 1048576.0,
              std::max<int64_t>(0, m.budget_bytes() - m.weight_bytes() - m.kv_bytes()) / 1048576.0, m.kv_blocks(),
              m.kv_block_size(), m.max_batch(), m.batch_context());
  for (const auto& e : g.engines()) {
    std::printf("  engine %s at %d layers: %d running, %d waiting, KV %d/%d blocks, weights %.0f MiB, %lld tokens\n",
                e.model().c_str(), e.loaded_depth(), e.running(), e.waiting(), e.kv_blocks_used(), e.kv_blocks_total(),
                e.weight_bytes() / 1048576.0, static_cast<long long>(e.generated_tokens_total()));
  }
  std::printf("  performance history (PHT):\n    %-16s %5s %5s %7s %8s %8s %9s %7s %9s  exit profile (share left by)\n",
              "model", "depth", "reqs", "tokens", "tok/s", "TTFT s", "TPOT ms", "ppl", "mJ/token");
  for (const auto& r : g.performance_history()) {
    std::printf("    %-16s %5d %5lld %7lld %8.1f %8.3f %9.2f %7.2f %9.2f ", r.model().c_str(), r.depth(),
                static_cast<long long>(r.requests()), static_cast<long long>(r.tokens()), r.throughput_tok_s(),
                r.mean_ttft_seconds(), 1000 * r.mean_tpot_seconds(), r.perplexity(), 1000 * r.joules_per_token());
    for (int i = 0; i < r.exit_layers_size() && i < r.leave_share_size(); ++i) {
      std::printf(" %d:%.0f%%", r.exit_layers(i), 100 * r.leave_share(i));
    }
    std::printf("\n");
  }
  std::printf("  decisions (latest last):\n");
  for (const auto& d : g.decisions()) {
    std::printf("    %7.1f s  %-8s %s at %d layers: %s\n", d.at_seconds(), d.decision().c_str(), d.model().c_str(),
                d.loaded_depth(), d.reason().c_str());
  }
}

// Sessions of one model: paused now, intercepts so far, hold decisions and the waste behind them.
void print_intercepts(const v1::InterceptStatus& i) {
  if (i.intercepts_total() == 0 && i.paused() == 0) return;
  std::printf("intercepts on %s: %lld so far, %d paused now (KV %.1f MiB on device, %.1f MiB on host); "
              "default hold %s\n",
              i.model().c_str(), static_cast<long long>(i.intercepts_total()), i.paused(),
              i.paused_kv_bytes() / 1048576.0, i.swapped_kv_bytes() / 1048576.0, i.default_hold().c_str());
  std::string decisions;
  for (const auto& d : i.decisions()) {
    decisions += " " + d.policy() + "/" + d.decision() + ":" + std::to_string(d.count());
  }
  if (!decisions.empty()) std::printf("  hold decisions (policy/decision:count):%s\n", decisions.c_str());
  const double pool = i.kv_byte_seconds() > 0 ? i.kv_byte_seconds() : 1;
  std::printf("  waste (MiB·s): preserve %.1f, recompute %.1f, swap %.1f = %.2f%% of the KV pool's %.1f; "
              "forward %.2f s, of it recompute %.2f s; saturation %d tokens\n",
              i.waste_preserve_byte_seconds() / 1048576.0, i.waste_recompute_byte_seconds() / 1048576.0,
              i.waste_swap_byte_seconds() / 1048576.0,
              100.0 * (i.waste_preserve_byte_seconds() + i.waste_recompute_byte_seconds() + i.waste_swap_byte_seconds()) /
                  pool,
              i.kv_byte_seconds() / 1048576.0, i.forward_seconds(), i.recompute_seconds(), i.saturation_tokens());
}

int cmd_status(int argc, char** argv) {
  Args args("status",
            "Shows a running heliosd's state, queues, KV cache use and models, with each model's\n"
            "early exit: exit points, default rule, and where its generated tokens left the stack; and\n"
            "each model group's manager: the candidates, the Performance History Table, the chosen\n"
            "model and depth, the confidence breach counter, the memory split and the decisions; and\n"
            "each model's sessions (intercepts): paused now, hold decisions and the waste.");
  add_connection_options(args);
  args.example("helios status --address localhost:50051");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("status", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  std::string error;
  auto stub = connect(args, &error);
  if (!stub) return usage_error("status", error);
  v1::ServerStatus status;
  {
    grpc::ClientContext ctx;
    prepare(args, &ctx);
    if (grpc::Status s = stub->GetServerStatus(&ctx, {}, &status); !s.ok()) return rpc_error("status", args, s);
  }
  v1::ListModelsResponse models;
  {
    grpc::ClientContext ctx;
    prepare(args, &ctx);
    if (grpc::Status s = stub->ListModels(&ctx, {}, &models); !s.ok()) return rpc_error("status", args, s);
  }
  std::printf("state: %s, up %.0f s\n", status.state().c_str(), status.uptime_seconds());
  std::printf("requests: %d running, %d waiting, %d swapped; %lld served, %lld tokens generated\n",
              status.requests_running(), status.requests_waiting(), status.requests_swapped(),
              static_cast<long long>(status.requests_total()), static_cast<long long>(status.generated_tokens_total()));
  std::printf("KV cache: %d of %d blocks used (%d tokens each); last step: %d sequences, %d tokens; "
              "%.1f steps/s; %lld preemptions\n",
              status.kv_blocks_used(), status.kv_blocks_total(), status.kv_block_size(), status.batch_size(),
              status.batch_tokens(), status.steps_per_second(), static_cast<long long>(status.preemptions()));
  for (const auto& m : models.models()) {
    std::printf("model %s: %s, %d layers (%d loaded), %.1fM parameters, context %d, on %s\n", m.name().c_str(),
                m.architecture().c_str(), m.n_layers(), m.loaded_layers(), m.n_parameters() / 1e6,
                m.context_length(), m.backend().c_str());
    print_model_exits(m, status);
    for (const auto& ms : status.models()) {
      if (ms.name() != m.name() || !ms.prefix_cache().enabled()) continue;
      const v1::PrefixCacheStatus& c = ms.prefix_cache();
      std::printf("  prefix cache: %d blocks cached; %lld of %lld prompt tokens found (%.0f%%); %lld evictions\n",
                  c.cached_blocks(), static_cast<long long>(c.hit_tokens()), static_cast<long long>(c.query_tokens()),
                  100.0 * c.hit_rate(), static_cast<long long>(c.evictions()));
    }
  }
  for (const auto& g : status.groups()) print_group(g);
  for (const auto& i : status.intercepts()) print_intercepts(i);
  return 0;
}

}  // namespace helios::cli
