// The model manager on real engines: candidates checked and selected, each chosen (candidate,
// depth) loaded as its own engine within the group's memory budget, tokens and finished requests
// fed back to the manager, engines released and their memory handed to the current pool.
#include "server/model_group.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "helios/gguf.h"
#include "helios/kv_cache.h"
#include "helios/model_config.h"
#include "helios/model_setup.h"

namespace helios::server {

// One repository model as the group knows it before loading it.
struct ModelGroup::Candidate {
  RepositoryModelConfig repo;
  CandidateModel info;          // what the manager decides from
  ModelConfig config;
  std::optional<ExitHeadSet> heads;  // for the agreement measure's curves
};

// One loaded (candidate, depth).
struct GroupEngine {
  size_t candidate = 0;
  int32_t depth = 0;
  std::shared_ptr<ServedModel> served;
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_block = 0;
  int32_t kv_blocks = 0;  // its pool, as asked for (a growth applies between steps)
  int64_t held_bytes() const { return weight_bytes + static_cast<int64_t>(kv_blocks) * kv_bytes_per_block; }
};

namespace {

constexpr size_t kDecisionLog = 100;
constexpr int32_t kBatchContext = 1024;  // the sequence length MemorySplit.max_batch counts in
constexpr int32_t kMinKvTokens = 2048;   // the smallest pool an engine gets, budget or not

std::string mib(int64_t bytes) { return fmt::format("{:.0f} MiB", static_cast<double>(bytes) / 1048576.0); }

// The KV element type the engine will pick (resolve_kv_type's rule) for sizing before loading.
int32_t kv_value_bytes(const EngineConfig& engine) {
  if (engine.kv_cache_type) return kernels::kv_type_bytes(*engine.kv_cache_type);
  return engine.backend == "cpu" ? 2 : 4;
}

}  // namespace

ModelGroup::ModelGroup(ModelGroupConfig config, const HeliosConfig& server_config, MetricsRegistry& metrics,
                       std::function<void(const std::string&)> on_fault, std::chrono::steady_clock::time_point started)
    : config_(std::move(config)), server_config_(server_config), metrics_(metrics), on_fault_(std::move(on_fault)),
      started_(started) {
  breaches_total_ = metrics_.counter("helios_confidence_breaches_total",
                                     "Generated tokens below the group's confidence threshold at the loaded depth",
                                     {{"group", config_.name}});
}

ModelGroup::~ModelGroup() {
  std::lock_guard<std::mutex> lock(mu_);
  engines_.clear();
}

StatusOr<std::unique_ptr<ModelGroup>> ModelGroup::create(const ModelGroupConfig& group, const HeliosConfig& config,
                                                         MetricsRegistry& metrics,
                                                         std::function<void(const std::string&)> on_fault,
                                                         std::chrono::steady_clock::time_point started,
                                                         BackendWrapper wrap_backend) {
  std::unique_ptr<ModelGroup> g(new ModelGroup(group, config, metrics, std::move(on_fault), started));
  g->wrap_backend_ = std::move(wrap_backend);
  const std::string where = "groups '" + group.name + "'";
  std::vector<const RepositoryModelConfig*> listed;
  for (const RepositoryModelConfig& m : config.model_repository) {
    const bool wanted = group.candidates.empty() ||
                        std::find(group.candidates.begin(), group.candidates.end(), m.model.name) != group.candidates.end();
    if (wanted) listed.push_back(&m);
  }
  if (listed.empty()) return invalid_argument(where + ": no candidates (model_repository is empty)");
  // One tokenizer: a request is tokenized once, whichever candidate serves it.
  for (size_t i = 1; i < listed.size(); ++i) {
    HELIOS_ASSIGN_OR_RETURN(std::string diff, tokenizer_difference(listed[0]->model.path, listed[i]->model.path));
    if (!diff.empty()) {
      return invalid_argument(where + ": candidates '" + listed[0]->model.name + "' and '" + listed[i]->model.name +
                              "' have different tokenizers (" + diff + "); a group's candidates must share one");
    }
  }
  std::vector<std::unique_ptr<Candidate>> all;
  int64_t largest = 0;
  for (const RepositoryModelConfig* m : listed) {
    auto c = std::make_unique<Candidate>();
    c->repo = *m;
    HELIOS_ASSIGN_OR_RETURN(auto file, GgufFile::open(m->model.path));
    HELIOS_ASSIGN_OR_RETURN(c->config, model_config_from_gguf(*file, m->model.rope_scaling));
    HELIOS_ASSIGN_OR_RETURN(c->info.footprint, model_footprint(m->model.path));
    if (!m->model.early_exit.heads_path.empty()) {
      auto heads = load_exit_heads(m->model.early_exit.heads_path, c->config);
      if (!heads.ok()) return invalid_argument(where + ": " + m->model.name + ": " + heads.status().message());
      c->heads = std::move(*heads);
    }
    // Exit points as setup_model would pick them: the listed ones, else the heads file's, else
    // every 4th layer.
    ExitPointsSpec spec = m->model.early_exit.exits;
    if (spec.layers.empty() && spec.every == 0) {
      if (c->heads) {
        for (const ExitHeadParams& h : c->heads->heads) {
          if (h.layer < c->config.n_layer) spec.layers.push_back(h.layer);
        }
      } else {
        spec.every = 4;
        spec.min_layer = 4;
      }
    }
    auto exits = resolve_exit_points(spec, c->config.n_layer);
    if (!exits.ok()) return invalid_argument(where + ": " + m->model.name + ": " + exits.status().message());
    c->info.name = m->model.name;
    c->info.exits = *exits;
    c->info.telemetry = m->telemetry;
    c->info.kv_bytes_per_token =
        2LL * c->config.n_layer * c->config.kv_dim() * kv_value_bytes(config.engine);
    largest = std::max(largest, c->info.footprint.total_bytes());
    all.push_back(std::move(c));
  }
  if (g->config_.memory_budget_bytes == 0) {
    g->config_.memory_budget_bytes = largest + (config.engine.kv_cache_bytes > 0 ? config.engine.kv_cache_bytes : 1LL << 30);
  }
  std::vector<CandidateModel> infos;
  for (const auto& c : all) infos.push_back(c->info);
  HELIOS_ASSIGN_OR_RETURN(std::vector<size_t> chosen,
                          select_candidates(infos, group.params.slo, group.top_k, g->config_.memory_budget_bytes,
                                            kMinKvTokens));
  std::vector<CandidateModel> ranked;
  for (size_t i : chosen) {
    ranked.push_back(all[i]->info);
    g->candidates_.push_back(std::move(all[i]));
  }
  std::string names;
  for (const CandidateModel& c : ranked) names += (names.empty() ? "" : ", ") + c.name;
  spdlog::info("{}: {} candidate(s) for {} within {}: {}", group.name, ranked.size(), slo_mode_name(group.params.slo),
               mib(g->config_.memory_budget_bytes), names);
  g->manager_ = std::make_unique<ModelManager>(std::move(ranked), group.params);
  std::lock_guard<std::mutex> lock(g->mu_);
  HELIOS_RETURN_IF_ERROR(g->load_target(g->manager_->current()));
  return g;
}

Status ModelGroup::load_target(const ServingTarget& target) {
  Candidate& c = *candidates_[target.candidate];
  const int32_t n_layers = c.info.footprint.n_layers();
  ModelEntryConfig entry = c.repo.model;
  EarlyExitConfig& ee = entry.early_exit;
  ee.load_layers = target.depth < n_layers ? target.depth : 0;
  ee.exits = ExitPointsSpec{};
  for (int32_t e : c.info.exits) {
    if (e < target.depth) ee.exits.layers.push_back(e);
  }
  // The manager decides the exit: every token of a prefix leaves at its depth, with its top-1
  // confidence there (the agreement curve, when the group asks for it, is applied here).
  ExitRule rule;
  if (target.depth < n_layers) {
    rule.policy = ExitPolicy::kFixedDepth;
    rule.depth = 0;  // the loaded depth
  }
  ee.default_rule = rule;
  ee.allow_request_override = false;

  // One budget: what is still resident, this prefix's weights, and the rest for its KV.
  int64_t held = 0;
  for (const auto& e : engines_) held += e->held_bytes();
  const int64_t weights = c.info.footprint.bytes_at_depth(target.depth);
  const int64_t per_token = 2LL * target.depth * c.config.kv_dim() * kv_value_bytes(server_config_.engine);
  int64_t kv = config_.memory_budget_bytes - held - weights;
  const int64_t floor = per_token * kMinKvTokens;
  if (kv < floor) {
    spdlog::warn("{}: {} MiB of the {} budget is left for {}'s KV after {} of weights and {} still held by draining "
                 "engines; giving it {} (the budget is exceeded until they drain)",
                 config_.name, kv / 1048576, mib(config_.memory_budget_bytes), c.info.name, mib(weights), mib(held),
                 mib(floor));
    kv = floor;
  }
  EngineConfig engine = server_config_.engine;
  engine.kv_cache_bytes = kv;
  const auto t0 = std::chrono::steady_clock::now();
  auto served = load_served_model(entry, engine, 1, metrics_, on_fault_, server_config_.intercepts, wrap_backend_);
  if (!served.ok()) {
    return Status(served.status().code(), config_.name + ": cannot load " + c.info.name + " at depth " +
                                              std::to_string(target.depth) + ": " + served.status().message());
  }
  auto ge = std::make_shared<GroupEngine>();
  ge->candidate = target.candidate;
  ge->depth = target.depth;
  ge->served = std::shared_ptr<ServedModel>(std::move(*served));
  ge->weight_bytes = ge->served->model->weights().n_bytes;
  auto kv_type = resolve_kv_type(engine, *ge->served->backend);
  ge->kv_bytes_per_block = KvCacheStorage::bytes_per_block(ge->served->model->kv_config(), engine.block_size,
                                                           kv_type.ok() ? *kv_type : kernels::KvType::kF32);
  const EngineStatus st = ge->served->engine->status();
  ge->kv_blocks = st.kv_blocks_total;
  spdlog::info("{}: loaded {} at {}/{} layers in {:.1f} s: weights {}, KV {} blocks ({}), budget {}", config_.name,
               c.info.name, target.depth, n_layers,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), mib(ge->weight_bytes),
               st.kv_blocks_total, mib(st.kv_blocks_total * ge->kv_bytes_per_block), mib(config_.memory_budget_bytes));
  engines_.insert(engines_.begin(), std::move(ge));
  metrics_.gauge("helios_loaded_layers", "Layers of each model resident (0: not loaded)", {{"model", c.info.name}})
      ->set(target.depth);
  return ok_status();
}

void ModelGroup::extend_current_now(const ServingTarget& target) {
  // Now rather than at the next request: the requests in flight, whose tokens breached, carry
  // on at the new depth.
  if (engines_.empty()) return;
  GroupEngine& e = *engines_.front();
  if (e.candidate != target.candidate || e.depth >= target.depth) return;
  if (Status s = extend_in_place(e, target.depth); !s.ok()) {
    spdlog::error("{}: cannot extend {} to {} layers: {}", config_.name, candidates_[e.candidate]->info.name,
                  target.depth, s.message());
  }
}

Status ModelGroup::extend_in_place(GroupEngine& e, int32_t depth) {
  Candidate& c = *candidates_[e.candidate];
  const int32_t n_layers = c.info.footprint.n_layers();
  Model& model = *e.served->model;
  const auto t0 = std::chrono::steady_clock::now();
  LayerExtension ext;
  HELIOS_ASSIGN_OR_RETURN(ext.extra, model.load_layers_range(depth));  // here, while the engine runs
  for (int32_t x : c.info.exits) {
    if (x < depth) ext.exit_layers.push_back(x);
  }
  ext.heads = c.heads ? &*c.heads : nullptr;
  ext.kv = config_.extend_recompute ? ExtendKv::kRecompute : ExtendKv::kFillFromExitStates;
  // The pool pays for the new weights: the budget less every other engine and this one's weights.
  int64_t others = 0;
  for (const auto& o : engines_) {
    if (o.get() != &e) others += o->held_bytes();
  }
  const int64_t weights = e.weight_bytes + ext.extra.n_bytes;
  const int64_t per_token = 2LL * depth * c.config.kv_dim() * kv_value_bytes(server_config_.engine);
  ext.kv_bytes = std::max(config_.memory_budget_bytes - others - weights, per_token * kMinKvTokens);
  HELIOS_RETURN_IF_ERROR(e.served->engine->extend_layers(std::move(ext)));
  const EngineStatus st = e.served->engine->status();
  const int32_t old_depth = e.depth;
  e.depth = st.loaded_layers;
  e.weight_bytes = weights;
  auto kv_type = resolve_kv_type(server_config_.engine, *e.served->backend);
  e.kv_bytes_per_block = KvCacheStorage::bytes_per_block(model.kv_config(), server_config_.engine.block_size,
                                                         kv_type.ok() ? *kv_type : kernels::KvType::kF32);
  e.kv_blocks = st.kv_blocks_total;
  ExitRule& rule = e.served->default_exit;  // what new requests get (GroupRoute::exit, under mu_)
  rule = ExitRule{};
  if (e.depth < n_layers) {
    rule.policy = ExitPolicy::kFixedDepth;
    rule.depth = e.depth;
  }
  spdlog::info("{}: extended {} in place from {} to {}/{} layers in {:.2f} s ({} K/V): weights {}, KV {} blocks, "
               "running requests recomputed", config_.name, c.info.name, old_depth, e.depth, n_layers,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               config_.extend_recompute ? "recomputed" : "filled from exit states", mib(weights), e.kv_blocks);
  metrics_.gauge("helios_loaded_layers", "Layers of each model resident (0: not loaded)", {{"model", c.info.name}})
      ->set(e.depth);
  return ok_status();
}

void ModelGroup::apply(const std::optional<Decision>& d) {
  if (!d) return;
  const CandidateModel& m = manager_->candidates()[d->target.candidate];
  spdlog::info("{}: {} -> {} at {}/{} layers: {}", config_.name, decision_kind_name(d->kind), m.name, d->target.depth,
               m.footprint.n_layers(), d->reason);
  metrics_.counter("helios_manager_decisions_total", "Model manager decisions by kind",
                   {{"group", config_.name}, {"decision", decision_kind_name(d->kind)}})
      ->inc();
  DecisionRecord rec{*d, m.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()};
  decisions_.push_back(std::move(rec));
  if (decisions_.size() > kDecisionLog) decisions_.erase(decisions_.begin());
}

void ModelGroup::release_idle_engines(std::optional<ServingTarget> keep) {
  int64_t freed = 0;
  // The current engine stays unless another is about to become current (`keep`); so does any
  // engine with a live request.
  for (size_t i = 0; i < engines_.size();) {
    GroupEngine& e = *engines_[i];
    const bool kept = keep ? keep->candidate == e.candidate && keep->depth == e.depth : i == 0;
    if (kept || e.served->engine->n_live() > 0) {
      ++i;
      continue;
    }
    freed += e.held_bytes();
    const std::string name = candidates_[e.candidate]->info.name;
    spdlog::info("{}: released {} at {} layers: {} back to the pool", config_.name, name, e.depth, mib(e.held_bytes()));
    engines_.erase(engines_.begin() + static_cast<std::ptrdiff_t>(i));
    const bool still = std::any_of(engines_.begin(), engines_.end(), [&](const auto& o) {
      return candidates_[o->candidate]->info.name == name;
    });
    if (!still) metrics_.gauge("helios_loaded_layers", "Layers of each model resident (0: not loaded)", {{"model", name}})->set(0);
  }
  if (engines_.empty()) return;
  if (freed <= 0) return;
  // What the released engines held becomes KV blocks of the current one (or the one about to
  // be), within the budget.
  auto cur_it = std::find_if(engines_.begin(), engines_.end(), [&](const auto& e) {
    return keep && keep->candidate == e->candidate && keep->depth == e->depth;
  });
  GroupEngine& cur = cur_it == engines_.end() ? *engines_.front() : **cur_it;
  int64_t held = 0;
  for (const auto& e : engines_) held += e->held_bytes();
  const int64_t room = config_.memory_budget_bytes - held;
  const int32_t more = static_cast<int32_t>(std::max<int64_t>(0, room) / cur.kv_bytes_per_block);
  if (more <= 0) return;
  const int32_t total = cur.kv_blocks + more;
  if (Status s = cur.served->engine->grow_kv(total); !s.ok()) {
    spdlog::warn("{}: cannot grow the KV pool to {} blocks: {}", config_.name, total, s.message());
  } else {
    cur.kv_blocks = total;
    spdlog::info("{}: KV pool of {} grows by {} blocks to {}", config_.name, candidates_[cur.candidate]->info.name,
                 more, total);
  }
}

StatusOr<GroupRoute> ModelGroup::route() {
  std::lock_guard<std::mutex> lock(mu_);
  // Not a structured binding: clang before 16 cannot capture one in the lambdas below.
  auto routed = manager_->route();
  const ServingTarget& target = routed.first;
  apply(routed.second);
  auto found = std::find_if(engines_.begin(), engines_.end(), [&](const auto& e) {
    return e->candidate == target.candidate && e->depth == target.depth;
  });
  // A deeper prefix of the model the current engine serves: that engine grows in place, its
  // requests carrying on.
  if (found == engines_.end() && !engines_.empty() && engines_.front()->candidate == target.candidate &&
      engines_.front()->depth < target.depth) {
    if (Status s = extend_in_place(*engines_.front(), target.depth); !s.ok()) {
      spdlog::error("{}: cannot extend {} to {} layers: {}", config_.name, candidates_[target.candidate]->info.name,
                    target.depth, s.message());
    }
    found = engines_.begin();
    if (engines_.front()->depth != target.depth) found = engines_.end();  // it failed: load instead
  }
  // Idle engines no longer chosen go first, so a new one gets their memory from the start.
  release_idle_engines(target);
  found = std::find_if(engines_.begin(), engines_.end(), [&](const auto& e) {
    return e->candidate == target.candidate && e->depth == target.depth;
  });
  if (found == engines_.end()) {
    if (Status s = load_target(target); !s.ok()) {
      // Keep serving on what is loaded; the manager's record follows what actually served.
      spdlog::error("{}", s.message());
      if (engines_.empty()) return s;
    }
  } else if (found != engines_.begin()) {
    std::rotate(engines_.begin(), found, found + 1);  // the current engine first
  }
  const std::shared_ptr<GroupEngine>& e = engines_.front();
  GroupRoute r;
  r.served = e->served;
  r.engine = e;
  r.target = {e->candidate, e->depth, target.observe && e->depth == candidates_[e->candidate]->info.footprint.n_layers()};
  r.observe = r.target.observe;
  r.exit = e->served->default_exit;
  r.record = std::make_shared<RequestRecord>();
  return r;
}

float ModelGroup::confidence_of(size_t candidate, int32_t layer, float top1_prob) const {
  const Candidate& c = *candidates_[candidate];
  if (config_.measure != ConfidenceMeasure::kAgreement || !c.heads) return top1_prob;
  const ExitHeadParams* head = c.heads->find(layer);
  return head ? agreement_confidence(*head, top1_prob) : top1_prob;
}

void ModelGroup::on_update(const GroupRoute& route, const GenerationUpdate& update) {
  std::lock_guard<std::mutex> lock(mu_);
  const Candidate& c = *candidates_[route.target.candidate];
  const int32_t n_layers = c.info.footprint.n_layers();
  const double batch = std::max(1, route.served->engine->status().batch_size);
  RequestRecord& rec = *route.record;
  for (const TokenEvent& ev : update.tokens) {
    rec.sum_logprob += ev.logprob;
    if (route.observe && !ev.observed.empty()) {
      std::vector<float> conf(ev.observed.size());
      for (size_t i = 0; i < conf.size() && i < c.info.exits.size(); ++i) {
        conf[i] = confidence_of(route.target.candidate, c.info.exits[i], ev.observed[i].top1_prob);
      }
      rec.exit_confidence.push_back(std::move(conf));
    }
    const float conf = confidence_of(route.target.candidate, route.target.depth, ev.confidence);
    const bool counted = !manager_->evaluating() && route.target == manager_->current() && route.target.depth < n_layers;
    if (counted && conf < config_.params.threshold) breaches_total_->inc();
    const std::optional<Decision> d = manager_->on_token(route.target, conf, batch);
    apply(d);
    if (d && d->kind == DecisionKind::kExtend) extend_current_now(d->target);
  }
  if (update.finish != FinishReason::kNone) {
    rec.completion_tokens = update.completion_tokens;
    rec.ttft_s = update.ttft_seconds;
    rec.decode_s = std::max(0.0, update.total_seconds - update.ttft_seconds);
    apply(manager_->on_finished(route.target, rec, batch));
    release_idle_engines();
  }
}

void ModelGroup::abort_all(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : engines_) e->served->engine->abort_all(reason);
}

bool ModelGroup::abort(const std::string& client_id) {
  std::lock_guard<std::mutex> lock(mu_);
  bool found = false;
  for (const auto& e : engines_) found = e->served->engine->abort(client_id) || found;
  return found;
}

size_t ModelGroup::n_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& e : engines_) n += e->served->engine->n_live();
  return n;
}

std::shared_ptr<ServedModel> ModelGroup::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engines_.empty() ? nullptr : engines_.front()->served;
}

GroupMemory ModelGroup::memory_locked() const {
  GroupMemory m;
  m.budget_bytes = config_.memory_budget_bytes;
  for (const auto& e : engines_) {
    m.weight_bytes += e->weight_bytes;
    m.kv_bytes += static_cast<int64_t>(e->kv_blocks) * e->kv_bytes_per_block;
  }
  if (!engines_.empty()) {
    const EngineStatus st = engines_.front()->served->engine->status();
    m.kv_blocks = engines_.front()->kv_blocks;
    m.kv_block_size = st.kv_block_size;
    m.batch_context = kBatchContext;
    if (st.kv_block_size > 0) m.max_batch = m.kv_blocks / blocks_for_tokens(kBatchContext, st.kv_block_size);
  }
  return m;
}

GroupStatusSnapshot ModelGroup::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  GroupStatusSnapshot s;
  s.name = config_.name;
  s.params = config_.params;
  s.evaluating = manager_->evaluating();
  const ServingTarget& cur = manager_->current();
  const CandidateModel& m = manager_->candidates()[cur.candidate];
  s.model = m.name;
  s.depth = cur.depth;
  s.n_layers = m.footprint.n_layers();
  for (const CandidateModel& c : manager_->candidates()) s.candidates.push_back(c.name);
  s.pht = manager_->history().rows();
  s.breaches = manager_->breaches().breaches();
  s.requests_total = manager_->requests_routed();
  s.requests_since_evaluation = manager_->requests_since_evaluation();
  s.memory = memory_locked();
  s.decisions = decisions_;
  for (const auto& e : engines_) {
    s.engines.push_back({candidates_[e->candidate]->info.name, e->depth, e->served->engine->status(), e->weight_bytes});
  }
  return s;
}

std::optional<std::vector<std::pair<std::string, EngineProgress>>> ModelGroup::engine_progress() const {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;
  std::vector<std::pair<std::string, EngineProgress>> out;
  for (const auto& e : engines_) {
    out.emplace_back(config_.name + "/" + candidates_[e->candidate]->info.name + "@" + std::to_string(e->depth),
                     e->served->engine->progress());
  }
  return out;
}

}  // namespace helios::server
