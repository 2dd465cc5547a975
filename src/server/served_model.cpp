// One configured model made ready to serve: set up from its early_exit section (the library's
// setup_model), its engine sized and started (plan_engine). Logging only beyond those.
#include <spdlog/spdlog.h>

#include "helios/chat_template.h"
#include "helios/model_setup.h"
#include "server/exit_options.h"
#include "server/served_model.h"

namespace helios::server {
namespace {

ModelSetupOptions setup_options(const ModelEntryConfig& entry) {
  const EarlyExitConfig& ee = entry.early_exit;
  ModelSetupOptions o;
  o.path = entry.path;
  o.rope_scaling = entry.rope_scaling;
  o.load_layers = ee.load_layers;
  o.exits = ee.exits;
  o.heads_path = ee.heads_path;
  o.default_rule = ee.default_rule;
  o.names.load_layers = "early_exit.load_layers";
  o.names.exits = "early_exit.exits";
  o.names.heads = "early_exit.heads";
  o.names.rule_prefix = "early_exit.";
  o.names.exits_hint = kConfigExitsHint;
  return o;
}

void log_exits(const ServedModel& served) {
  const EarlyExitConfig& ee = served.entry.early_exit;
  const Model& model = *served.model;
  std::string listed;
  for (int32_t layer : model.exit_layers()) listed += (listed.empty() ? "" : ", ") + std::to_string(layer);
  const ExitRule& rule = served.default_exit;
  spdlog::info("{}: {} of {} layers loaded; exit points [{}]; heads {}; default policy {} (measure {}, "
               "threshold {:g}, depth {}); request overrides {}",
               served.entry.name, model.n_layers_loaded(), model.config().n_layer, listed,
               ee.heads_path.empty() ? "identity (logit lens)" : ee.heads_path,
               exit_policy_name(rule.policy), confidence_measure_name(rule.measure), rule.threshold,
               rule.depth, ee.allow_request_override ? "allowed" : "refused");
}

}  // namespace

StatusOr<std::unique_ptr<ServedModel>> load_served_model(const ModelEntryConfig& entry, const EngineConfig& engine,
                                                         size_t n_models, MetricsRegistry& metrics,
                                                         std::function<void(const std::string&)> on_fault,
                                                         const InterceptConfig& intercepts,
                                                         const BackendWrapper& wrap_backend) {
  auto served = std::make_unique<ServedModel>();
  served->entry = entry;
  const int32_t ranks = engine.tensor_parallel;
  const int threads = ranks > 1 ? rank_threads(engine.threads, ranks) : engine.threads;
  HELIOS_ASSIGN_OR_RETURN(served->backend, make_backend(rank_backend_name(engine.backend, 0), threads));
  served->backend->set_graphs(engine.cuda_graphs);
  if (wrap_backend) served->backend = wrap_backend(std::move(served->backend));
  ModelSetupOptions options = setup_options(entry);
  options.tensor_parallel = ranks;
  options.make_rank_backend = [backend = engine.backend, threads](int32_t rank) {
    return make_backend(rank_backend_name(backend, rank), threads);
  };
  int last_percent = -1;
  options.progress = [&](int done, int total) {
    const int percent = 100 * done / total;
    if (percent / 25 != last_percent / 25) spdlog::info("loading {}: {}%", entry.name, percent);
    last_percent = percent;
  };
  HELIOS_ASSIGN_OR_RETURN(ModelSetup setup, setup_model(*served->backend, options));
  if (!setup.warning.empty()) spdlog::warn("{}: {}", entry.name, setup.warning);
  served->model = std::move(setup.model);
  served->default_exit = setup.default_rule;
  log_exits(*served);
  if (const ChatFormatter chat(served->model->tokenizer()); !chat.template_problem().empty()) {
    spdlog::warn("{}: chat prompts: {}", entry.name, chat.template_problem());
  }

  const Model& model = *served->model;
  const ModelConfig& c = model.config();
  HELIOS_ASSIGN_OR_RETURN(EngineOptions engine_options, plan_engine(engine, *served->model, n_models, entry.name, intercepts));
  engine_options.on_fault = std::move(on_fault);
  const int64_t kv_bytes = static_cast<int64_t>(engine_options.n_kv_blocks) *
                           KvCacheStorage::bytes_per_block(model.kv_config(), engine_options.block_size,
                                                                           engine_options.kv_type);
  served->context_tokens = static_cast<int32_t>(std::min<int64_t>(
      c.n_ctx_train, static_cast<int64_t>(engine_options.n_kv_blocks) * engine_options.block_size));
  spdlog::info("{}: {} layers, {:.1f}M parameters on {}; KV cache {} blocks × {} tokens ({:.0f} MiB, {}), "
               "context {} tokens", entry.name, c.n_layer, model.weights().n_params / 1e6,
               served->backend->name() + (ranks > 1 ? " and " + std::to_string(ranks - 1) + " more (" +
                                                          std::to_string(ranks) + " tensor-parallel ranks)" : ""),
               engine_options.n_kv_blocks, engine_options.block_size,
               static_cast<double>(kv_bytes) / 1048576.0,
               kernels::kv_type_name(engine_options.kv_type), served->context_tokens);
  if (const RopeScaling& r = c.rope_scaling; r.type != "none") {
    spdlog::info("{}: rope scaling {} by {:g} ({}); the model serves up to {} tokens", entry.name, r.type, r.factor,
                 entry.rope_scaling ? "set in the config" : "from the file", c.n_ctx_train);
  }
  HELIOS_ASSIGN_OR_RETURN(served->engine, Engine::start(*served->model, engine_options, &metrics));
  return served;
}

}  // namespace helios::server
