// heliosd's service in process on a real port, driven by the generated C++ client: batching
// invariance, cancellation, validation and authentication.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/generic/generic_stub.h>

#include "helios/model_tools.h"
#include "helios/v1/helios.grpc.pb.h"
#include "server/helios_server.h"
#include "test_paths.h"
#include "unit/model_setup/limited_backend.h"

namespace helios {
namespace {

std::string stories_model() {
  static const std::string path = [] {
    const std::string dir = testing::test_data_dir() + "/stories260K/";
    const std::string out = testing::temp_dir() + "/stories260K.gguf";
    EXPECT_TRUE(convert_llama2c(dir + "stories260K.bin", dir + "tok512.bin", out).ok());
    return out;
  }();
  return path;
}

class ServerTest : public ::testing::Test {
 protected:
  void start(const std::vector<std::string>& api_keys = {}, int n_models = 1,
             const std::string& tls_dir = "") {
    config_.server.listen = "127.0.0.1:0";
    config_.server.metrics_listen = "";
    config_.server.api_keys = api_keys;
    config_.models.assign(n_models, ModelEntryConfig{});
    for (int i = 0; i < n_models; ++i) {
      config_.models[i].name = i == 0 ? "stories" : "stories-2";
      config_.models[i].path = stories_model();
    }
    if (!tls_dir.empty()) {
      config_.server.tls_cert_path = tls_dir + "/cert.pem";
      config_.server.tls_key_path = tls_dir + "/key.pem";
    }
    config_.engine.threads = 2;
    config_.engine.kv_cache_bytes = 8 << 20;
    config_.engine.max_seqs = 64;
    config_.engine.max_batched_tokens = 256;
    auto server = server::HeliosServer::start(config_, metrics_);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    std::vector<std::unique_ptr<server::ServedModel>> models;
    for (const auto& entry : config_.models) {
      auto model = server::load_served_model(entry, config_.engine, config_.models.size(), metrics_);
      ASSERT_TRUE(model.ok()) << model.status().to_string();
      models.push_back(std::move(*model));
    }
    server_->set_models(std::move(models));
    stub_ = v1::Helios::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                                   grpc::InsecureChannelCredentials()));
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (server_) server_->drain_and_stop(5);
  }

  // Runs a greedy generation; returns the token ids (and the status through *status).
  std::vector<int32_t> generate(const std::string& text, int max_tokens, grpc::Status* status,
                                const std::string& api_key = "") {
    grpc::ClientContext ctx;
    if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
    v1::GenerateRequest req;
    req.set_text(text);
    req.set_max_tokens(max_tokens);
    req.set_ignore_eos(true);
    auto reader = stub_->Generate(&ctx, req);
    std::vector<int32_t> ids;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      for (const auto& t : resp.tokens()) ids.push_back(t.token_id());
    }
    *status = reader->Finish();
    return ids;
  }

  v1::ServerStatus server_status() {
    grpc::ClientContext ctx;
    v1::ServerStatus s;
    EXPECT_TRUE(stub_->GetServerStatus(&ctx, {}, &s).ok());
    return s;
  }

  HeliosConfig config_;
  std::string address_;
  MetricsRegistry metrics_;
  std::unique_ptr<server::HeliosServer> server_;
  std::unique_ptr<v1::Helios::Stub> stub_;
};

TEST_F(ServerTest, GreedyOutputIsTheSameAloneAndInABatchOf32) {
  start();
  const std::vector<std::string> prompts = {"Once upon a time", "The cat", "Lily went to the park",
                                            "One day, a big dog", "Tom had a red ball"};
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    grpc::Status s;
    alone.push_back(generate(p, 24, &s));
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(alone.back().size(), 24u);
  }
  std::vector<std::vector<int32_t>> batched(32);
  std::vector<grpc::Status> statuses(32);
  std::vector<std::thread> clients;
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&, i] { batched[i] = generate(prompts[i % prompts.size()], 24, &statuses[i]); });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(batched[i], alone[i % prompts.size()]) << "request " << i;
  }
  const v1::ServerStatus status = server_status();
  EXPECT_EQ(status.kv_blocks_used(), 0) << "every finished request released its blocks";
  EXPECT_EQ(status.generated_tokens_total(), (5 + 32) * 24) << "counted before the final messages";
}

TEST_F(ServerTest, CancellingAStreamFreesItsBlocks) {
  start();
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.set_max_tokens(400);
  req.set_ignore_eos(true);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_GT(server_status().kv_blocks_used(), 0);
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 100 && server_status().kv_blocks_used() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const v1::ServerStatus st = server_status();
  EXPECT_EQ(st.kv_blocks_used(), 0) << st.DebugString();
}

TEST_F(ServerTest, BadParametersAreInvalidArgumentNamingTheField) {
  start();
  struct Case {
    const char* field;
    std::function<void(v1::GenerateRequest*)> set;
  };
  const std::vector<Case> cases = {
      {"temperature", [](auto* r) { r->mutable_sampling()->set_temperature(-1); }},
      {"temperature", [](auto* r) { r->mutable_sampling()->set_temperature(NAN); }},
      {"top_p", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); }},
      {"top_k", [](auto* r) { r->mutable_sampling()->set_top_k(-3); }},
      {"max_tokens", [](auto* r) { r->set_max_tokens(-1); }},
      {"max_tokens", [](auto* r) { r->set_max_tokens(100000); }},
      {"stop_token_ids", [](auto* r) { r->add_stop_token_ids(99999); }},
      {"token_ids", [](auto* r) { r->mutable_token_ids()->add_ids(512); }},
      {"text", [](auto* r) { r->set_text(""); }},
  };
  for (const auto& c : cases) {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.set_text("hello");
    c.set(&req);
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(s.error_message().find(c.field), std::string::npos) << s.error_message();
  }
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_text("hello");
  req.set_model("no-such-model");
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, DefaultMaxTokensShrinksToTheContextLeft) {
  start();  // stories260K: a 512-token context; the default max_tokens is 256
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  v1::TokenIds* ids = req.mutable_token_ids();
  for (int i = 0; i < 500; ++i) ids->add_ids(1 + i % 400);
  req.set_ignore_eos(true);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp, last;
  while (reader->Read(&resp)) last = resp;
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(last.usage().completion_tokens(), 12);
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST_F(ServerTest, ApiKeyIsRequiredWhenConfigured) {
  start({"s3cret"});
  grpc::Status s;
  generate("Once", 4, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  generate("Once", 4, &s, "wrong");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(generate("Once", 4, &s, "s3cret").size(), 4u);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(ServerTest, ServesOverTlsWithTheConfiguredCertificate) {
  const std::string dir = testing::temp_dir() + "/tls";
  std::filesystem::create_directories(dir);
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + dir +
                          "/key.pem -out " + dir + "/cert.pem > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  start({}, 1, dir);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read_text(dir + "/cert.pem");
  auto secure = v1::Helios::NewStub(grpc::CreateChannel(address_, grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  v1::ListModelsResponse models;
  const grpc::Status s = secure->ListModels(&ctx, {}, &models);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(models.models_size(), 1);
  // A plaintext client cannot talk to it.
  grpc::ClientContext plain_ctx;
  plain_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  EXPECT_FALSE(stub_->ListModels(&plain_ctx, {}, &models).ok());
}

TEST_F(ServerTest, RequestIdsAreUniqueAcrossModels) {
  start({}, 2);
  grpc::ClientContext first_ctx;
  v1::GenerateRequest first;
  first.set_request_id("same-id");
  first.set_model("stories");
  first.set_text("Once upon a time");
  first.set_max_tokens(400);
  first.set_ignore_eos(true);
  auto reader = stub_->Generate(&first_ctx, first);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // the first request is live

  grpc::ClientContext second_ctx;
  v1::GenerateRequest second = first;
  second.set_model("stories-2");
  auto second_reader = stub_->Generate(&second_ctx, second);
  while (second_reader->Read(&resp)) {
  }
  EXPECT_EQ(second_reader->Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  first_ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  reader->Finish();
}

// grpc.health.v1.Health/Check for the whole server, through a generic stub (the request is the
// empty message; the response's field 1 is the status: 1 SERVING, 2 NOT_SERVING).
int health_status(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok) && ok);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
}

TEST_F(ServerTest, ADeviceFaultFailsRequestsWithInternalAndTurnsHealthNotServing) {
  config_.server.listen = "127.0.0.1:0";
  config_.server.metrics_listen = "";
  auto started = server::HeliosServer::start(config_, metrics_);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  server_ = std::move(*started);
  // A model on a backend whose device can be made to fail, wired as heliosd wires it.
  auto served = std::make_unique<server::ServedModel>();
  served->entry.name = "stories";
  auto backend = std::make_unique<testing::LimitedBackend>(size_t{1} << 30);
  testing::LimitedBackend* device = backend.get();
  served->backend = std::move(backend);
  auto model = Model::load(stories_model(), *served->backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  served->model = std::move(*model);
  served->context_tokens = 512;
  EngineOptions options;
  options.n_kv_blocks = 64;
  server::HeliosServer* srv = server_.get();
  options.on_fault = [srv](const std::string& error) { srv->report_fault("stories", error); };
  auto engine = Engine::start(*served->model, options, nullptr);
  ASSERT_TRUE(engine.ok());
  served->engine = std::move(*engine);
  std::vector<std::unique_ptr<server::ServedModel>> models;
  models.push_back(std::move(served));
  server_->set_models(std::move(models));
  address_ = "127.0.0.1:" + std::to_string(server_->port());
  stub_ = v1::Helios::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));

  grpc::Status s;
  EXPECT_EQ(generate("Once upon a time", 8, &s).size(), 8u);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(health_status(address_), 1);

  device->fail_after_matmuls(40);  // a few passes into the next request
  const std::vector<int32_t> ids = generate("Lily and Tom", 64, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(s.error_message().find("injected device fault in matmul"), std::string::npos) << s.error_message();
  EXPECT_LT(ids.size(), 64u);
  EXPECT_EQ(health_status(address_), 2) << "NOT_SERVING after a device fault";
  generate("One day", 8, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << "a faulted engine takes no more work";
}

}  // namespace
}  // namespace helios
