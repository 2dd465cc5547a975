// The OpenAI-compatible HTTP API of a HeliosServer in process (server.http_listen on port 0),
// driven by cpp-httplib's client: keys, the routes, SSE framing, a client that goes away
// mid-stream, the queue limit, the drain and TLS. tests/e2e/server/test_openai.py drives the real
// heliosd with the official openai client.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "helios/v1/helios.grpc.pb.h"
#include "server/helios_server.h"
#include "test_paths.h"

namespace helios {
namespace {

using nlohmann::json;

class OpenAiHttpTest : public ::testing::Test {
 protected:
  void start(const std::vector<std::string>& api_keys = {}, int queue_limit = 256, const std::string& tls_dir = "",
             bool load = true) {
    config_.server.listen = "127.0.0.1:0";
    config_.server.metrics_listen = "";
    config_.server.http_listen = "127.0.0.1:0";
    config_.server.http_threads = 8;
    config_.server.api_keys = api_keys;
    if (!tls_dir.empty()) {
      config_.server.tls_cert_path = tls_dir + "/cert.pem";
      config_.server.tls_key_path = tls_dir + "/key.pem";
    }
    config_.models.assign(1, ModelEntryConfig{});
    config_.models[0].name = "stories";
    config_.models[0].path = testing::stories260k_path();
    config_.engine.threads = 2;
    config_.engine.kv_cache_bytes = 8 << 20;
    config_.engine.queue_limit = queue_limit;
    auto server = server::HeliosServer::start(config_, metrics_);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    ASSERT_GT(server_->http_port(), 0);
    if (!load) return;
    std::vector<std::unique_ptr<server::ServedModel>> models;
    auto model = server::load_served_model(config_.models[0], config_.engine, 1, metrics_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    models.push_back(std::move(*model));
    server_->set_models(std::move(models));
    stub_ = v1::Helios::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                                   tls_dir.empty() ? grpc::InsecureChannelCredentials()
                                                                   : grpc::SslCredentials({})));
  }
  void TearDown() override {
    if (server_) server_->drain_and_stop(5);
  }
  std::unique_ptr<httplib::Client> client() {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->http_port());
    c->set_read_timeout(60);
    if (!key_.empty()) c->set_bearer_token_auth(key_);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body) {
    return client()->Post(path.c_str(), body.dump(), "application/json");
  }
  // A streaming POST: the body as it arrived; `stop_after` > 0 closes the connection after that
  // many bytes.
  std::string post_stream(const std::string& path, const json& body, size_t stop_after = 0, int* status = nullptr) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    if (!key_.empty()) req.set_header("Authorization", "Bearer " + key_);
    std::string got;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      got.append(data, n);
      return stop_after == 0 || got.size() < stop_after;
    };
    auto res = client()->send(req);
    if (status) *status = res ? res->status : -1;
    return got;
  }
  v1::ServerStatus grpc_status() {
    grpc::ClientContext ctx;
    v1::ServerStatus s;
    EXPECT_TRUE(stub_->GetServerStatus(&ctx, {}, &s).ok());
    return s;
  }

  HeliosConfig config_;
  MetricsRegistry metrics_;
  std::unique_ptr<server::HeliosServer> server_;
  std::unique_ptr<v1::Helios::Stub> stub_;
  std::string key_;
};

// The events of an SSE body: each "data: ..." payload, in order; the framing checked on the way.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << body.substr(at);
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    at = end + 2;
    if (event.rfind(": ", 0) == 0) continue;  // a comment (keep-alive)
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    out.push_back(event.substr(6));
  }
  return out;
}

TEST_F(OpenAiHttpTest, ServesTheRoutesWithTheApiKey) {
  start({"sekrit"});
  auto res = client()->Get("/health");  // no key needed, as gRPC health
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["status"], "serving");
  res = post("/v1/completions", {{"prompt", "Once"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
  key_ = "wrong";
  EXPECT_EQ(client()->Get("/v1/models")->status, 401);
  key_ = "sekrit";
  res = client()->Get("/v1/models");
  ASSERT_EQ(res->status, 200) << res->body;
  const json models = json::parse(res->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "stories");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(client()->Get("/v1/models/stories")->status, 200);
  EXPECT_EQ(client()->Get("/v1/models/nope")->status, 404);
  res = client()->Get("/v1/nothing");
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "unknown_route");
  res = client()->Post("/v1/completions", "{not json", "application/json");
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find("not JSON"), std::string::npos);
  // Valid JSON the parser cannot hold (a number past a double): a 400 as well, not a 500.
  res = client()->Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 1e999})", "application/json");
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find("not JSON"), std::string::npos);
  res = post("/v1/completions", {{"prompt", "Once"}, {"model", "nope"}});
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "model");
  res = post("/v1/completions", {{"prompt", "Once"}, {"top_p", 1.5}});
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "top_p");
}

TEST_F(OpenAiHttpTest, WhileLoadingEverythingIs503) {
  start({}, 256, "", /*load=*/false);  // HTTP listens from the start, as gRPC does
  auto res = client()->Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["status"], "loading");
  res = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(res->status, 503);
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "loading");
  EXPECT_EQ(e["type"], "service_unavailable");
  EXPECT_NE(e["message"].get<std::string>().find("loading"), std::string::npos);
}

TEST_F(OpenAiHttpTest, StreamedAndWholeGreedyCompletionsAgree) {
  start();
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  auto res = post("/v1/completions", body);
  ASSERT_EQ(res->status, 200) << res->body;
  const json whole = json::parse(res->body);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 24);
  json sbody = body;
  sbody["stream"] = true;
  sbody["stream_options"] = {{"include_usage", true}};
  int status = 0;
  const std::string raw = post_stream("/v1/completions", sbody, 0, &status);
  EXPECT_EQ(status, 200);
  const auto events = sse_data(raw);
  ASSERT_GE(events.size(), 3u) << raw;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_EQ(chunk["id"], json::parse(events[0])["id"]);
    EXPECT_TRUE(chunk["usage"].is_null());
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 24);
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
}

TEST_F(OpenAiHttpTest, AClientThatGoesAwayMidStreamFreesItsKvBlocks) {
  start();
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    post_stream("/v1/completions", body, /*stop_after=*/600);
    done = true;
  });
  reader.join();
  ASSERT_TRUE(done);
  v1::ServerStatus st = grpc_status();
  for (int i = 0; i < 200 && (st.kv_blocks_used() > 0 || st.requests_running() > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = grpc_status();
  }
  EXPECT_EQ(st.kv_blocks_used(), 0) << st.DebugString();
  EXPECT_EQ(st.requests_running(), 0);
  EXPECT_LT(st.generated_tokens_total(), 400) << "aborted before the end";
}

TEST_F(OpenAiHttpTest, AFullQueueIs429) {
  start({}, /*queue_limit=*/1);
  std::promise<void> first_chunk;
  std::thread busy([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    bool told = false;
    size_t got = 0;
    req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
      got += n;
      if (!told) {
        first_chunk.set_value();
        told = true;
      }
      return got < 3000;
    };
    client()->send(req);
  });
  first_chunk.get_future().wait();
  auto res = post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}});
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "queue_full");
  busy.join();
}

TEST_F(OpenAiHttpTest, DrainFinishesOpenStreamsAndRefusesNewRequests) {
  start();
  std::promise<void> first_chunk;
  std::string raw;
  std::thread streaming([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    bool told = false;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      raw.append(d, n);
      if (!told) {
        first_chunk.set_value();
        told = true;
      }
      return true;
    };
    client()->send(req);
  });
  first_chunk.get_future().wait();
  std::thread drain([&] { server_->drain_and_stop(30); });
  // While it drains: 503 (and health 503) for new requests, until the port closes.
  int refused = 0;
  for (int i = 0; i < 100; ++i) {
    auto res = post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}});
    if (!res) break;  // the server has stopped listening
    if (res->status == 503) {
      ++refused;
      EXPECT_EQ(json::parse(res->body)["error"]["code"], "draining");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  streaming.join();
  drain.join();
  server_.reset();
  EXPECT_EQ(refused, 1);
  const auto events = sse_data(raw);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]") << "the open stream finished";
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
}

TEST_F(OpenAiHttpTest, ServesHttpsWithTheConfiguredCertificate) {
  const std::string dir = testing::temp_dir() + "/http-tls";
  std::filesystem::create_directories(dir);
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + dir +
                          "/key.pem -out " + dir + "/cert.pem > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  start({}, 256, dir);
  httplib::Client https("https://127.0.0.1:" + std::to_string(server_->http_port()));
  https.set_ca_cert_path((dir + "/cert.pem").c_str());
  auto res = https.Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 3}}.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 3);
  // Plain HTTP gets no answer from it.
  httplib::Client plain("127.0.0.1", server_->http_port());
  plain.set_read_timeout(2);
  auto p = plain.Get("/health");
  EXPECT_TRUE(!p || p->status != 200);
}

}  // namespace
}  // namespace helios
