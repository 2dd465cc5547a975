// helios complete / chat / status: clients of a running heliosd.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
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

Status fill_sampling(const Args& args, v1::GenerateRequest* req) {
  HELIOS_ASSIGN_OR_RETURN(int64_t max_tokens, args.integer("max-tokens"));
  HELIOS_ASSIGN_OR_RETURN(double temperature, args.number("temperature"));
  HELIOS_ASSIGN_OR_RETURN(int64_t top_k, args.integer("top-k"));
  HELIOS_ASSIGN_OR_RETURN(double top_p, args.number("top-p"));
  HELIOS_ASSIGN_OR_RETURN(int64_t seed, args.integer("seed"));
  req->set_max_tokens(static_cast<int32_t>(max_tokens));
  req->mutable_sampling()->set_temperature(static_cast<float>(temperature));
  req->mutable_sampling()->set_top_k(static_cast<int32_t>(top_k));
  req->mutable_sampling()->set_top_p(static_cast<float>(top_p));
  req->mutable_sampling()->set_seed(static_cast<uint64_t>(seed));
  req->set_model(args.str("model"));
  return ok_status();
}

void add_generation_options(Args& args) {
  args.option("model", "NAME", "model name (helios status lists them); default: the server's first")
      .option("max-tokens", "N", "generate at most N tokens; 0 = the server's default", "0")
      .option("temperature", "T", "sampling temperature; 0 = greedy", "0")
      .option("top-k", "K", "sample from the K most likely tokens; 0 = all", "0")
      .option("top-p", "P", "nucleus sampling mass; 0 or 1 = off", "0")
      .option("seed", "S", "random seed", "0");
}

// Streams one generation to stdout; returns the generated text through *text.
int stream_generation(const std::string& command, const Args& args, v1::Helios::Stub& stub,
                      const v1::GenerateRequest& req, std::string* text) {
  grpc::ClientContext ctx;
  prepare(args, &ctx);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  v1::GenerateResponse last;
  while (reader->Read(&resp)) {
    for (const auto& t : resp.tokens()) {
      std::fwrite(t.text().data(), 1, t.text().size(), stdout);
      *text += t.text();
    }
    std::fflush(stdout);
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = resp;
  }
  grpc::Status s = reader->Finish();
  std::fputc('\n', stdout);
  if (!s.ok()) return rpc_error(command, args, s);
  std::fprintf(stderr, "[%s: %d prompt + %d generated tokens, first token %.3f s, total %.3f s]\n",
               v1::FinishReason_Name(last.finish_reason()).c_str(), last.usage().prompt_tokens(),
               last.usage().completion_tokens(), last.timings().time_to_first_token_seconds(),
               last.timings().total_seconds());
  return 0;
}

}  // namespace

int cmd_complete(int argc, char** argv) {
  Args args("complete", "Sends one prompt to a running heliosd and streams the completion to stdout.");
  args.option("prompt", "TEXT", "the prompt (required)").option("chat", "", "treat the prompt as a user turn");
  add_generation_options(args);
  add_connection_options(args);
  args.example("helios complete --address localhost:50051 --prompt \"Once upon a time\" --max-tokens 64");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("complete", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("prompt")) return usage_error("complete", "--prompt TEXT is required (see --help)");
  v1::GenerateRequest req;
  req.set_text(args.str("prompt"));
  req.set_chat(args.has("chat"));
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
            "conversation is sent each turn. An empty line or end of input ends the chat.");
  args.option("system", "TEXT", "a system message to start the conversation with");
  add_generation_options(args);
  add_connection_options(args);
  args.example("helios chat --address localhost:50051 --temperature 0.7");
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

int cmd_status(int argc, char** argv) {
  Args args("status", "Shows a running heliosd's state, queues, KV cache use and models.");
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
  }
  return 0;
}

}  // namespace helios::cli
