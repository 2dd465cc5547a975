// Every class of config error: the message names FILE:LINE:COLUMN (1-based), the key path, the
// bad value and what would be valid. with_model() prepends three lines, so sections start at line 4.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace helios::testing {
namespace {

// ---- YAML syntax, empty files, top level ----

TEST(ConfigErrors, SyntaxErrorHasLineAndColumn) {
  EXPECT_EQ(config_error("engine:\n  block_size: 16\n   threads: 2\n"),
            "cfg.yaml:3:11: invalid YAML: illegal map value");
  EXPECT_TRUE(starts_with(config_error("models: [1, 2\n"), "cfg.yaml:2:1: invalid YAML: "));
}

TEST(ConfigErrors, TabIndentationIsASyntaxError) {
  EXPECT_TRUE(starts_with(config_error("server:\n\tlisten: x\n"), "cfg.yaml:2:"));
}

TEST(ConfigErrors, EmptyFileSaysModelsAreNeeded) {
  for (const char* text : {"", "\n\n", "# just a comment\n", "---\n"}) {
    const std::string error = config_error(text);
    EXPECT_TRUE(starts_with(error, "cfg.yaml:1:1: models: missing; the file is empty"))
        << "text: '" << text << "'";
    EXPECT_TRUE(contains(error, "- name: smollm2-135m"));
  }
}

TEST(ConfigErrors, MissingModels) {
  EXPECT_TRUE(starts_with(config_error("engine:\n  threads: 2\n"),
              "cfg.yaml:1:1: models: missing; a config needs at least one model"));
}

TEST(ConfigErrors, MoreThanOneDocument) {
  EXPECT_TRUE(starts_with(config_error(with_model("---\nengine: {}\n")),
              "cfg.yaml:5:1: invalid YAML: a config is one YAML document, but this "
                         "file has 2"));
}

// yaml-cpp's LoadAll never returns on these (it reads the same empty document over and over).
TEST(ConfigErrors, StrayCommaIsASyntaxError) {
  EXPECT_EQ(config_error(","), "cfg.yaml:1:1: invalid YAML: ',' outside a flow collection ([...] or {...})");
  EXPECT_TRUE(starts_with(config_error("[a], b\n"), "cfg.yaml:1:4: invalid YAML: ',' outside a flow collection"));
  EXPECT_TRUE(contains(config_error(with_model("---\n, x\n")), "invalid YAML: ',' outside a flow collection"));
}

TEST(ConfigErrors, TopLevelMustBeAMap) {
  EXPECT_EQ(config_error("- a\n- b\n"),
            "cfg.yaml:1:1: (top level): expected a map of keys (server, models, model_repository, groups, "
            "engine, limits, logging, intercepts), got a list");
}

// ---- unknown and repeated keys ----

TEST(ConfigErrors, UnknownKeySuggestsTheClosest) {
  EXPECT_EQ(config_error(with_model("engine:\n  threads: 2\n  blok_size: 16\n")),
            "cfg.yaml:6:3: engine.blok_size: unknown key; did you mean 'block_size'? Valid "
            "'engine' keys: backend, threads, tensor_parallel, kv_cache, kv_cache_type, block_size, "
            "max_batched_tokens, "
            "max_seqs, queue_limit, preemption, swap_space, prefix_caching, device_sampling, cuda_graphs");
}

TEST(ConfigErrors, UnknownTopLevelKey) {
  EXPECT_TRUE(starts_with(config_error(with_model("enigne:\n  threads: 2\n")),
              "cfg.yaml:4:1: enigne: unknown key; did you mean 'engine'? Valid "
                         "top-level keys: server, models, model_repository, groups, engine, limits, logging"));
}

TEST(ConfigErrors, UnknownKeyNamedLikeTheStructField) {
  EXPECT_TRUE(starts_with(config_error(with_model("engine:\n  kv_cache_bytes: 1GiB\n")),
              "cfg.yaml:5:3: engine.kv_cache_bytes: unknown key; did you mean "
                         "'kv_cache'?"));
}

TEST(ConfigErrors, UnknownKeyWithNothingClose) {
  const std::string error = config_error(with_model("logging:\n  colour: yes\n"));
  EXPECT_EQ(error,
            "cfg.yaml:5:3: logging.colour: unknown key; valid 'logging' keys: level, format");
}

TEST(ConfigErrors, UnknownKeyInNestedSections) {
  EXPECT_TRUE(starts_with(config_error(with_model("server:\n  tls:\n    certificate: a.pem\n")),
              "cfg.yaml:6:5: server.tls.certificate: unknown key; did you mean "
                         "'cert'?"));
  EXPECT_TRUE(starts_with(config_error("models:\n  - name: m\n    file: /m.gguf\n"),
              "cfg.yaml:3:5: models[0].file: unknown key"));
}

TEST(ConfigErrors, RepeatedKey) {
  EXPECT_EQ(config_error(with_model("engine:\n  threads: 2\n  threads: 4\n")),
            "cfg.yaml:6:3: engine.threads: given twice (first at line 5); give each key once");
}

// ---- wrong types ----

TEST(ConfigErrors, StringWhereIntegerExpected) {
  EXPECT_EQ(config_error(with_model("engine:\n  block_size: sixteen\n")),
            "cfg.yaml:5:15: engine.block_size: expected an integer, got 'sixteen'");
}

TEST(ConfigErrors, QuotedNumberIsAString) {
  EXPECT_EQ(config_error(with_model("engine:\n  max_seqs: \"8\"\n")),
            "cfg.yaml:5:13: engine.max_seqs: expected an integer, got the quoted string '8'; "
            "write it without quotes");
}

TEST(ConfigErrors, FractionWhereIntegerExpected) {
  EXPECT_EQ(config_error(with_model("limits:\n  max_tokens: 1.5\n")),
            "cfg.yaml:5:15: limits.max_tokens: expected an integer, got '1.5'");
}

TEST(ConfigErrors, IntegerBeyond32Bits) {
  EXPECT_EQ(config_error(with_model("engine:\n  queue_limit: 3000000000\n")),
            "cfg.yaml:5:16: engine.queue_limit: must be between -2147483648 and 2147483647, got "
            "3000000000");
}

TEST(ConfigErrors, MapWhereListExpected) {
  EXPECT_TRUE(starts_with(config_error("models:\n  name: m\n  path: /m.gguf\n"),
              "cfg.yaml:2:3: models: expected a list of {name, path} maps, got a map"));
  EXPECT_EQ(config_error(with_model("server:\n  api_keys: {a: b}\n")),
            "cfg.yaml:5:13: server.api_keys: expected a list of strings, got a map");
}

TEST(ConfigErrors, ListWhereMapExpected) {
  EXPECT_EQ(config_error(with_model("engine:\n  - threads: 2\n")),
            "cfg.yaml:5:3: engine: expected a map of keys (backend, threads, tensor_parallel, kv_cache, kv_cache_type, "
            "block_size, max_batched_tokens, max_seqs, queue_limit, preemption, swap_space, prefix_caching, device_sampling, "
            "cuda_graphs), got a list");
}

TEST(ConfigErrors, MapWhereScalarExpected) {
  EXPECT_EQ(config_error(with_model("server:\n  listen: {host: a}\n")),
            "cfg.yaml:5:11: server.listen: expected a string, got a map");
  EXPECT_EQ(config_error(with_model("server:\n  api_keys: [abc, [x]]\n")),
            "cfg.yaml:5:19: server.api_keys[1]: expected a string, got a list");
}

TEST(ConfigErrors, EmptyValuePointsAtTheKey) {
  EXPECT_EQ(config_error(with_model("logging:\n  level:\n  format: text\n")),
            "cfg.yaml:5:3: logging.level: expected a string, got no value");
}

TEST(ConfigErrors, NumberWhereNumberExpected) {
  EXPECT_EQ(config_error(with_model("server:\n  drain_timeout_s: soon\n")),
            "cfg.yaml:5:20: server.drain_timeout_s: expected a number, got 'soon'");
  EXPECT_EQ(config_error(with_model("server:\n  drain_timeout_s: -1\n")),
            "cfg.yaml:5:20: server.drain_timeout_s: must be at least 0 seconds, got -1");
  EXPECT_EQ(config_error(with_model("server:\n  liveness_timeout_s: -5\n")),
            "cfg.yaml:5:23: server.liveness_timeout_s: must be in 0..86400 seconds (0 = no liveness watchdog), "
            "got -5");
  EXPECT_EQ(config_error(with_model("server:\n  liveness_timeout_s: 1e9\n")),
            "cfg.yaml:5:23: server.liveness_timeout_s: must be in 0..86400 seconds (0 = no liveness watchdog), "
            "got 1e9");
}

// ---- models ----

TEST(ConfigErrors, ModelsEmptyOrNull) {
  EXPECT_TRUE(starts_with(config_error("models: []\n"),
              "cfg.yaml:1:9: models: is empty; a config needs at least one model"));
  EXPECT_TRUE(starts_with(config_error("models:\nengine: {}\n"),
              "cfg.yaml:1:1: models: has no value; a config needs at least one model"));
}

TEST(ConfigErrors, ModelEntryNeedsNameAndPath) {
  EXPECT_TRUE(starts_with(config_error("models:\n  - name: m\n"),
              "cfg.yaml:2:5: models[0].path: missing; every model needs a name"));
  EXPECT_EQ(config_error("models:\n  - /m.gguf\n"),
            "cfg.yaml:2:5: models[0]: expected a map with keys name and path, got '/m.gguf'");
  EXPECT_EQ(config_error("models:\n  - name: ''\n    path: /m.gguf\n"),
            "cfg.yaml:2:11: models[0].name: must be a non-empty name without spaces, e.g. "
            "smollm2-135m, got ''");
}

TEST(ConfigErrors, ModelNamesAreUnique) {
  EXPECT_EQ(config_error("models:\n  - {name: a, path: /a.gguf}\n  - {name: b, path: /b.gguf}\n"
                         "  - {name: a, path: /c.gguf}\n"),
            "cfg.yaml:4:12: models[2].name: 'a' is already the name of models[0]; model names "
            "must be unique");
}

// ---- server ----

TEST(ConfigErrors, ListenMustBeHostPort) {
  for (const char* bad : {"50051", "localhost", ":50051", "host:", "host:http", "host:65536",
                          "::1:50051", "[::1]", "[zz]:1", "a b:1"}) {
    const std::string error =
        config_error(with_model(std::string("server:\n  listen: '") + bad + "'\n"));
    EXPECT_TRUE(starts_with(error, "cfg.yaml:5:11: server.listen: ")) << bad;
    EXPECT_TRUE(contains(error, std::string("got '") + bad + "'")) << bad;
  }
  EXPECT_EQ(config_error(with_model("server:\n  listen: 50051\n")),
            "cfg.yaml:5:11: server.listen: expected HOST:PORT with PORT 0..65535 (0 = any free "
            "port), e.g. 0.0.0.0:50051, localhost:9090 or [::]:50051, got '50051'");
  EXPECT_TRUE(contains(config_error(with_model("server:\n  listen: '::1:50051'\n")),
              "an IPv6 host needs brackets, e.g. [::1]:50051"));
}

TEST(ConfigErrors, ListenAcceptsGoodAddresses) {
  for (const char* good : {"0.0.0.0:50051", "localhost:1", "[::]:50051", "[::1]:0",
                           "my-host.example.com:65535", "127.0.0.1:8080"}) {
    EXPECT_EQ(config_error(with_model(std::string("server:\n  listen: '") + good + "'\n")), "")
        << good;
  }
}

TEST(ConfigErrors, MetricsListen) {
  EXPECT_TRUE(starts_with(config_error(with_model("server:\n  metrics_listen: 9090\n")),
              "cfg.yaml:5:19: server.metrics_listen: expected HOST:PORT"));
  EXPECT_EQ(config_error(with_model("server:\n  listen: 0.0.0.0:1\n  metrics_listen: 0.0.0.0:1\n")),
            "cfg.yaml:6:19: server.metrics_listen: is the same address as server.listen "
            "('0.0.0.0:1'); give it another port");
  EXPECT_EQ(config_error(with_model("server:\n  metrics_listen: ''\n")), "");
}

TEST(ConfigErrors, HttpListen) {
  EXPECT_TRUE(starts_with(config_error(with_model("server:\n  http_listen: 8000\n")),
                          "cfg.yaml:5:16: server.http_listen: expected HOST:PORT"));
  EXPECT_TRUE(contains(config_error(with_model("server:\n  http_listen: 8000\n")),
                       "or \"\" for no HTTP (OpenAI) API, got '8000'"));
  EXPECT_EQ(config_error(with_model("server:\n  listen: 0.0.0.0:1\n  http_listen: 0.0.0.0:1\n")),
            "cfg.yaml:6:16: server.http_listen: is the same address as server.listen ('0.0.0.0:1'); "
            "give it another port");
  EXPECT_EQ(config_error(with_model("server:\n  metrics_listen: 127.0.0.1:9\n  http_listen: 127.0.0.1:9\n")),
            "cfg.yaml:6:16: server.http_listen: is the same address as server.metrics_listen "
            "('127.0.0.1:9'); give it another port");
  // Port 0 (any free port) twice is fine; "" is off.
  EXPECT_EQ(config_error(with_model("server:\n  listen: 127.0.0.1:0\n  http_listen: 127.0.0.1:0\n")), "");
  EXPECT_EQ(config_error(with_model("server:\n  http_listen: ''\n")), "");
  StatusOr<HeliosConfig> parsed = parse_config(with_model("server:\n  http_listen: '[::1]:8080'\n"), "cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->server.http_listen, "[::1]:8080");
}

TEST(ConfigErrors, HttpThreads) {
  EXPECT_EQ(config_error(with_model("server:\n  http_threads: 1\n")),
            "cfg.yaml:5:17: server.http_threads: must be in 2..1024 (each open HTTP connection holds "
            "one), got 1");
  EXPECT_TRUE(starts_with(config_error(with_model("server:\n  http_threads: many\n")),
                          "cfg.yaml:5:17: server.http_threads:"));
  StatusOr<HeliosConfig> parsed = parse_config(with_model("server:\n  http_threads: 8\n"), "cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->server.http_threads, 8);
}

TEST(ConfigErrors, MaxN) {
  EXPECT_EQ(config_error(with_model("limits:\n  max_n: 0\n")),
            "cfg.yaml:5:10: limits.max_n: must be at least 1, got 0");
  EXPECT_EQ(config_error(with_model("limits:\n  max_n: 129\n")),
            "cfg.yaml:5:10: limits.max_n: must be at most 128 (each choice is one request in the "
            "queue), got 129");
  StatusOr<HeliosConfig> parsed = parse_config(with_model("limits:\n  max_n: 8\n"), "cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->limits.max_n, 8);
}

TEST(ConfigErrors, TlsCertWithoutKey) {
  EXPECT_EQ(config_error(with_model("server:\n  tls:\n    cert: a.pem\n")),
            "cfg.yaml:6:11: server.tls.cert: is set but server.tls.key is not; set both (TLS on) "
            "or neither (plaintext)");
  EXPECT_EQ(config_error(with_model("server:\n  tls: {key: k.pem}\n")),
            "cfg.yaml:5:14: server.tls.key: is set but server.tls.cert is not; set both (TLS on) "
            "or neither (plaintext)");
}

TEST(ConfigErrors, ApiKeysMustBePrintable) {
  EXPECT_TRUE(starts_with(config_error(with_model("server:\n  api_keys: [good, 'has space']\n")),
              "cfg.yaml:5:20: server.api_keys[1]: must be a non-empty string"));
  EXPECT_TRUE(starts_with(config_error(with_model("server:\n  api_keys:\n    - ''\n")),
              "cfg.yaml:6:7: server.api_keys[0]: must be a non-empty string"));
}

// ---- engine ----

TEST(ConfigErrors, BackendNotKnown) {
  EXPECT_EQ(config_error(with_model("engine:\n  backend: gpu\n")),
            "cfg.yaml:5:12: engine.backend: must be one of cpu, cuda, got 'gpu'");
  EXPECT_EQ(config_error(with_model("engine:\n  backend: CUDA\n")),
            "cfg.yaml:5:12: engine.backend: must be one of cpu, cuda, got 'CUDA'; did you mean "
            "'cuda'?");
  EXPECT_EQ(config_error(with_model("engine:\n  backend: cdua\n")),
            "cfg.yaml:5:12: engine.backend: must be one of cpu, cuda, got 'cdua'; did you mean "
            "'cuda'?");
}

TEST(ConfigErrors, ThreadsNotNegative) {
  EXPECT_EQ(config_error(with_model("engine:\n  threads: -1\n")),
            "cfg.yaml:5:12: engine.threads: must be at least 0 (0 = one per core), got -1");
}

TEST(ConfigErrors, BlockSizePowerOfTwo) {
  EXPECT_EQ(config_error(with_model("engine:\n  block_size: 12\n")),
            "cfg.yaml:5:15: engine.block_size: must be a power of two between 1 and 256, got 12");
  for (const char* bad : {"0", "-16", "512", "100"}) {
    EXPECT_TRUE(starts_with(config_error(with_model(std::string("engine:\n  block_size: ") + bad + "\n")),
                "cfg.yaml:5:15: engine.block_size: must be a power of two"))
        << bad;
  }
  for (const char* good : {"1", "2", "32", "256"}) {
    EXPECT_EQ(config_error(with_model(std::string("engine:\n  block_size: ") + good + "\n")), "")
        << good;
  }
}

TEST(ConfigErrors, SchedulerLimits) {
  EXPECT_EQ(config_error(with_model("engine:\n  max_seqs: 0\n")),
            "cfg.yaml:5:13: engine.max_seqs: must be at least 1, got 0");
  EXPECT_EQ(config_error(with_model("engine:\n  max_batched_tokens: 0\n")),
            "cfg.yaml:5:23: engine.max_batched_tokens: must be at least 1, got 0");
  EXPECT_EQ(config_error(with_model("engine:\n  queue_limit: 0\n")),
            "cfg.yaml:5:16: engine.queue_limit: must be at least 1, got 0");
}

TEST(ConfigErrors, BatchedTokensCoverMaxSeqs) {
  EXPECT_EQ(config_error(with_model("engine:\n  max_batched_tokens: 32\n  max_seqs: 64\n")),
            "cfg.yaml:5:23: engine.max_batched_tokens: max_batched_tokens (32) is smaller than "
            "max_seqs (64); each sequence decodes one token per step, so raise "
            "max_batched_tokens or lower max_seqs");
  // Only max_seqs given: the error points at it.
  EXPECT_TRUE(starts_with(config_error(with_model("engine:\n  max_seqs: 1000\n")),
              "cfg.yaml:5:13: engine.max_seqs: max_batched_tokens (512) is smaller"));
}

TEST(ConfigErrors, KvCacheSizeOrPercentage) {
  const std::string help =
      "expected a size such as 2GiB or 1073741824 (bytes), or a percentage of memory such as 25% "
      "(more than 0%, at most 100%)";
  EXPECT_EQ(config_error(with_model("engine:\n  kv_cache: 150%\n")),
            "cfg.yaml:5:13: engine.kv_cache: " + help + ", got '150%'");
  EXPECT_EQ(config_error(with_model("engine:\n  kv_cache: 0%\n")),
            "cfg.yaml:5:13: engine.kv_cache: " + help + ", got '0%'");
  EXPECT_EQ(config_error(with_model("engine:\n  kv_cache: 2 GB of RAM\n")),
            "cfg.yaml:5:13: engine.kv_cache: " + help + ", got '2 GB of RAM'");
  EXPECT_EQ(config_error(with_model("engine:\n  kv_cache: 0.25\n")),
            "cfg.yaml:5:13: engine.kv_cache: " + help + ", got '0.25'");
  EXPECT_EQ(config_error(with_model("engine:\n  kv_cache: 0\n")),
            "cfg.yaml:5:13: engine.kv_cache: must be more than 0 bytes; " + help + ", got '0'");
  EXPECT_EQ(config_error(with_model("engine:\n  kv_cache: [1]\n")),
            "cfg.yaml:5:13: engine.kv_cache: " + help + ", got a list");
}

TEST(ConfigErrors, PreemptionMode) {
  EXPECT_EQ(config_error(with_model("engine:\n  preemption: evict\n")),
            "cfg.yaml:5:15: engine.preemption: must be one of recompute, swap, got 'evict'");
  EXPECT_EQ(config_error(with_model("engine:\n  preemption: swap\n  swap_space: 0\n")),
            "cfg.yaml:6:15: engine.swap_space: preemption: swap needs swap_space of more than 0 "
            "bytes, got 0; set swap_space (e.g. 1GiB) or use preemption: recompute");
}

TEST(ConfigErrors, SwapSpaceSize) {
  EXPECT_TRUE(starts_with(config_error(with_model("engine:\n  swap_space: 1 gigabyte\n")),
              "cfg.yaml:5:15: engine.swap_space: '1 gigabyte' is not a size: expected "
                         "a number of bytes"));
}

// ---- limits ----

TEST(ConfigErrors, LimitsAtLeastOne) {
  EXPECT_EQ(config_error(with_model("limits:\n  max_prompt_tokens: 0\n")),
            "cfg.yaml:5:22: limits.max_prompt_tokens: must be at least 1, got 0");
  EXPECT_EQ(config_error(with_model("limits:\n  max_tokens: -5\n")),
            "cfg.yaml:5:15: limits.max_tokens: must be at least 1, got -5");
}

TEST(ConfigErrors, DefaultMaxTokensAtMostMaxTokens) {
  EXPECT_EQ(config_error(with_model("limits:\n  max_tokens: 100\n  default_max_tokens: 200\n")),
            "cfg.yaml:6:23: limits.default_max_tokens: default_max_tokens (200) is larger than "
            "max_tokens (100); default_max_tokens must be at most max_tokens");
  // Only max_tokens given, below the default of default_max_tokens (256): points at max_tokens.
  EXPECT_TRUE(starts_with(config_error(with_model("limits:\n  max_tokens: 100\n")),
              "cfg.yaml:5:15: limits.max_tokens: default_max_tokens (256) is larger"));
}

// ---- logging ----

TEST(ConfigErrors, LogLevelAndFormat) {
  EXPECT_EQ(config_error(with_model("logging:\n  level: warning\n")),
            "cfg.yaml:5:10: logging.level: must be one of trace, debug, info, warn, error, got "
            "'warning'; did you mean 'warn'?");
  EXPECT_EQ(config_error(with_model("logging:\n  format: xml\n")),
            "cfg.yaml:5:11: logging.format: must be one of text, json, got 'xml'");
}

}  // namespace
}  // namespace helios::testing
