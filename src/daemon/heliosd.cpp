// heliosd: the Helios server daemon. Wiring only: read the config, start the gRPC server and the
// metrics endpoint, load the models, serve until SIGTERM/SIGINT, drain, exit 0.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/cpu_check.h"
#include "helios/config.h"
#include "helios/metrics.h"
#include "server/helios_server.h"
#include "server/model_group.h"
#if defined(HELIOS_FAULT_INJECTION)
#include "backend/fault_backend.h"
#endif

namespace {

constexpr const char* kUsage =
    "usage: heliosd --config FILE\n"
    "       heliosd --check-config FILE\n\n"
    "Serves LLM generation over gRPC (service helios.v1.Helios, plus grpc.health.v1 and server\n"
    "reflection) with continuous batching, and with server.http_listen the OpenAI-compatible HTTP\n"
    "API (/v1/completions, /v1/chat/completions, /v1/models, /health), configured by one YAML\n"
    "file. configs/default.yaml lists every key with its default; configs/cpu-dev.yaml is a\n"
    "small setup for trying it out, and configs/early-exit-cpu.yaml the same with per-token early\n"
    "exit (models[].early_exit).\n\n"
    "options:\n"
    "  --config FILE         start the server with this configuration\n"
    "  --check-config FILE   validate the configuration and exit (0 when it is valid)\n"
    "  -h, --help            show this help\n\n"
    "signals: SIGTERM or SIGINT drain the server: health turns NOT_SERVING, new calls get\n"
    "UNAVAILABLE, running requests get server.drain_timeout_s to finish, then it exits 0.\n\n"
    "example:\n"
    "  heliosd --config configs/default.yaml\n"
    "  helios status --address localhost:50051\n";

// "%*" in a pattern: the message as the inside of a JSON string.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            dest.append(std::string_view(buf));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonEscapedMessage>(); }
};

void setup_logging(const helios::LoggingConfig& logging) {
  auto logger = spdlog::stderr_color_mt("heliosd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(logging.level));
  if (logging.format == helios::LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","message":"%*"})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
}

// Without API keys, anyone who can reach a non-loopback listener can use the server.
void warn_if_open_to_network(const helios::ServerConfig& server) {
  if (!server.api_keys.empty()) return;
  const std::vector<std::string> exposed = helios::network_listeners(server);
  if (exposed.empty()) return;
  std::string listeners;
  for (const std::string& l : exposed) listeners += (listeners.empty() ? "" : ", ") + l;
  spdlog::warn("open to the network without API keys ({}): anyone who can connect may use this server; "
               "set server.api_keys or listen on 127.0.0.1 (loopback)",
               listeners);
}

}  // namespace

int main(int argc, char** argv) {
  if (!helios::check_cpu_features("heliosd")) return 1;
  std::string config_path;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((arg == "--config" || arg == "--check-config") && i + 1 < argc) {
      config_path = argv[++i];
      check_only = arg == "--check-config";
    } else {
      std::fprintf(stderr, "heliosd: unknown or incomplete argument '%s' (see heliosd --help)\n", arg.c_str());
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "heliosd: --config FILE is required (see heliosd --help)\n");
    return 2;
  }
  auto config = helios::load_config(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "heliosd: %s\n", config.status().message().c_str());
    return 2;
  }
  if (check_only) {
    std::printf("%s: valid (%zu model%s%s, listen %s)\n", config_path.c_str(), config->models.size(),
                config->models.size() == 1 ? "" : "s",
                config->groups.empty() ? ""
                                       : (", " + std::to_string(config->groups.size()) + " group" +
                                          (config->groups.size() == 1 ? "" : "s") + " over " +
                                          std::to_string(config->model_repository.size()) + " repository models")
                                             .c_str(),
                config->server.listen.c_str());
    return 0;
  }

  // Test builds: HELIOS_FAULTS makes the backend of every model and group engine fail on purpose
  // (backend/fault_backend.h).
  helios::server::BackendWrapper wrap_backend;
  std::function<void()> arm_faults;
  std::string faults_warning;
  if (const char* spec = std::getenv("HELIOS_FAULTS"); spec && *spec) {
#if defined(HELIOS_FAULT_INJECTION)
    auto plan = helios::parse_fault_plan(spec);
    if (!plan.ok()) {
      std::fprintf(stderr, "heliosd: HELIOS_FAULTS='%s': %s\n", spec, plan.status().message().c_str());
      return 2;
    }
    faults_warning = "FAULT INJECTION ACTIVE (HELIOS_FAULTS='" + std::string(spec) + "': " + plan->describe() +
                     "): this server fails on purpose; it is for tests, never for serving";
    auto trigger = std::make_shared<helios::FaultTrigger>();
    wrap_backend = [plan = *plan, trigger](std::unique_ptr<helios::Backend> b) {
      return helios::make_fault_backend(std::move(b), plan, trigger);
    };
    arm_faults = [trigger] { trigger->armed = true; };
#else
    faults_warning = "HELIOS_FAULTS is set but this heliosd has no fault injection (built with "
                     "HELIOS_FAULT_INJECTION=OFF): ignored";
#endif
  }

  // Signals are taken by one thread with sigwait(); block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  setup_logging(config->logging);
  if (!faults_warning.empty()) spdlog::warn("{}", faults_warning);
  warn_if_open_to_network(config->server);
  helios::MetricsRegistry metrics;
  std::unique_ptr<helios::MetricsHttpServer> metrics_server;
  if (!config->server.metrics_listen.empty()) {
    auto started = helios::MetricsHttpServer::start(config->server.metrics_listen, metrics);
    if (!started.ok()) {
      spdlog::error("metrics endpoint: {}", started.status().message());
      return 1;
    }
    metrics_server = std::move(*started);
    spdlog::info("metrics on http://{}/metrics", config->server.metrics_listen);
  }
  auto server = helios::server::HeliosServer::start(*config, metrics);
  if (!server.ok()) {
    spdlog::error("{}", server.status().message());
    return 1;
  }
  spdlog::info("listening on {} (port {}); loading {} model(s) and {} group(s)", config->server.listen,
               (*server)->port(), config->models.size(), config->groups.size());
  const auto started = std::chrono::steady_clock::now();

  std::vector<std::unique_ptr<helios::server::ServedModel>> models;
  for (const auto& entry : config->models) {
    helios::server::HeliosServer* srv = server->get();
    auto served = helios::server::load_served_model(
        entry, config->engine, config->models.size(), metrics,
        [srv, name = entry.name](const std::string& error) { srv->report_fault(name, error); }, config->intercepts,
        wrap_backend);
    if (!served.ok()) {
      spdlog::error("cannot load model '{}': {}", entry.name, served.status().message());
      (*server)->drain_and_stop(0);
      return 1;
    }
    models.push_back(std::move(*served));
  }
  std::vector<std::unique_ptr<helios::server::ModelGroup>> groups;
  for (const auto& group : config->groups) {
    helios::server::HeliosServer* srv = server->get();
    auto loaded = helios::server::ModelGroup::create(
        group, *config, metrics,
        [srv, name = group.name](const std::string& error) { srv->report_fault(name, error); }, started,
        wrap_backend);
    if (!loaded.ok()) {
      spdlog::error("cannot start group '{}': {}", group.name, loaded.status().message());
      (*server)->drain_and_stop(0);
      return 1;
    }
    groups.push_back(std::move(*loaded));
  }
  if (arm_faults) arm_faults();  // loading and start-up profiles are done: count from here
  (*server)->set_models(std::move(models), std::move(groups));
  spdlog::info("serving");

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received {}: draining", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->drain_and_stop(config->server.drain_timeout_s);
  spdlog::info("stopped");
  return 0;
}
