// The daemon's configuration: one YAML file → typed, validated structs. Loaded and checked once,
// at start; passed around as const. Every key, its default and its meaning is documented in
// configs/default.yaml.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "helios/early_exit.h"
#include "helios/intercept.h"
#include "helios/model_config.h"
#include "helios/model_manager.h"
#include "helios/status.h"
#include "kernels/kernels.h"

namespace helios {

enum class PreemptionMode { kRecompute, kSwap };
enum class LogFormat { kText, kJson };

// models[].early_exit: where a model's tokens may leave the layer stack, the rule requests get by
// default, and how far a request may change it (GenerateRequest.exit).
struct EarlyExitConfig {
  ExitRule default_rule;                    // depth 0 = resolved when the model loads (see default.yaml)
  ExitPointsSpec exits;                     // resolved against the model's depth when it loads
  std::string heads_path;                   // sidecar GGUF from `helios calibrate`; "" = identity heads
  int32_t load_layers = 0;                  // load only the first N blocks; 0 = all
  bool allow_request_override = true;       // requests may change policy/threshold/depth/measure
  std::vector<ExitPolicy> allowed_policies; // non-empty: the only policies a request may pick
  float min_threshold = 0.0f;               // requests may not ask for a lower threshold
};

struct ModelEntryConfig {
  std::string name;          // what clients ask for; unique
  std::string path;          // GGUF file
  std::optional<RopeScaling> rope_scaling;  // replaces the file's: e.g. YaRN for a longer context
  EarlyExitConfig early_exit;
};

// model_repository[]: a model the manager may choose, with what is known about it.
struct RepositoryModelConfig {
  ModelEntryConfig model;    // name, path, early_exit (exit points, heads)
  ModelTelemetry telemetry;  // measured (`helios eval`) or given; 0 = unknown
};

// groups[]: one name clients ask for, served by the model manager from repository candidates
// that share one tokenizer.
struct ModelGroupConfig {
  std::string name;
  std::vector<std::string> candidates;  // repository names; empty = the whole repository
  int32_t top_k = 3;                    // candidates kept after ranking by the SLO (step 1)
  // Weights + KV cache of the group; 0 = the largest candidate's weights + engine.kv_cache's share.
  int64_t memory_budget_bytes = 0;
  ConfidenceMeasure measure = ConfidenceMeasure::kTop1Prob;  // top1 | agreement
  // Extending the served prefix in place: earlier tokens' K/V at the new layers filled from their
  // exit states (cheap) or recomputed through them (exact).
  bool extend_recompute = false;
  ManagerParams params;                 // slo, evaluation_requests, threshold, prefix_coverage, CBC, RI
};

struct ServerConfig {
  std::string listen = "127.0.0.1:50051";  // gRPC address; loopback unless configured otherwise
  std::string metrics_listen = "127.0.0.1:9090";  // Prometheus /metrics over HTTP; "" = off
  // OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health);
  // "" = off. Off when the key is absent; configs/default.yaml turns it on at 127.0.0.1:8000.
  std::string http_listen;
  int32_t http_threads = 64;               // HTTP worker threads: each open connection (a stream) holds one
  std::string tls_cert_path;               // PEM; TLS is on when both cert and key are set
  std::string tls_key_path;
  std::vector<std::string> api_keys;       // non-empty: calls must send "authorization: Bearer <key>"
  double drain_timeout_s = 30.0;           // on SIGTERM: how long in-flight streams may finish
  // A model with work and no engine step completed for this long turns health NOT_SERVING until
  // its steps resume; 0 = no watchdog.
  double liveness_timeout_s = 60.0;
};

struct EngineConfig {
  std::string backend = "cpu";             // cpu | cuda
  int32_t threads = 0;                     // CPU threads; 0 = one per core
  // Ranks each model is split over (tensor parallelism): on cuda, devices cuda:0..N-1 through
  // NCCL; on cpu, N ranks in the process sharing `threads` (for testing the split, not for speed).
  int32_t tensor_parallel = 1;
  int64_t kv_cache_bytes = 0;              // KV cache size; 0 = use kv_cache_fraction
  double kv_cache_fraction = 0.25;         // of physical memory (cpu) or free device memory (cuda)
  int32_t block_size = 16;                 // tokens per KV block
  // KV cache element type; unset ("auto") = f16 where the backend has it (the CPU), else f32.
  std::optional<kernels::KvType> kv_cache_type;
  int32_t max_batched_tokens = 512;        // tokens (prefill chunks + decodes) per step
  int32_t max_seqs = 64;                   // sequences per step
  int32_t queue_limit = 256;               // requests in the server (queued or running); more get RESOURCE_EXHAUSTED
  PreemptionMode preemption = PreemptionMode::kRecompute;
  // Share the K/V of full blocks of identical prefixes between requests and keep them after
  // they end, until blocks run out (helios/prefix_cache.h).
  bool prefix_caching = true;
  int64_t swap_space_bytes = 1LL << 30;    // host memory for swapped-out KV blocks (preemption: swap; paused KV)
  // Sampled tokens drawn where the logits are (EngineOptions::device_sampling); unset ("auto") =
  // on for a backend with memory of its own (CUDA), off on the CPU, where the rows are already here.
  std::optional<bool> device_sampling;
  // Decode steps replayed as CUDA graphs (Backend::set_graphs); no effect on the CPU.
  bool cuda_graphs = true;
};

struct LimitsConfig {
  int32_t max_tokens = 2048;               // per request, generated
  int32_t default_max_tokens = 256;        // when a request does not say
  int32_t max_prompt_tokens = 4096;        // per request
  int32_t max_n = 4;                       // OpenAI API: choices per request (`n`), at most
};

struct LoggingConfig {
  std::string level = "info";              // trace | debug | info | warn | error
  LogFormat format = LogFormat::kText;
};

struct HeliosConfig {
  ServerConfig server;
  std::vector<ModelEntryConfig> models;    // at least one model or group
  std::vector<RepositoryModelConfig> model_repository;
  std::vector<ModelGroupConfig> groups;
  EngineConfig engine;
  LimitsConfig limits;
  LoggingConfig logging;
  InterceptConfig intercepts;
};

// Parses and validates. Errors read "FILE:LINE:COLUMN: KEY: what is wrong; what would be valid",
// e.g. "cfg.yaml:7:15: engine.block_size: must be a power of two between 1 and 256, got 12".
// Unknown keys, wrong types and out-of-range values are all errors (INVALID_ARGUMENT).
StatusOr<HeliosConfig> parse_config(const std::string& yaml_text, const std::string& file_name);
StatusOr<HeliosConfig> load_config(const std::string& path);  // NOT_FOUND if unreadable

// "512MiB", "2GB", "1073741824" → bytes.
StatusOr<int64_t> parse_byte_size(const std::string& text);

// Whether only this machine can connect to a listener on `address` (HOST:PORT): HOST is 127.x.x.x,
// [::1], an IPv4-mapped 127.x.x.x or localhost. Wildcards (0.0.0.0, [::]), other addresses and
// other host names (they may resolve to anything) are reachable from the network.
bool is_loopback_address(std::string_view address);

// The listeners that are on (gRPC, HTTP, metrics) and reachable from the network, each as
// "server.listen 0.0.0.0:50051"; empty when every one is loopback or off.
std::vector<std::string> network_listeners(const ServerConfig& server);

}  // namespace helios
