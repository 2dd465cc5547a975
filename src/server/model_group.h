// A model group: one name clients ask for, served by the model manager (helios/model_manager.h)
// from candidates of the model repository that share one tokenizer. The manager decides; this
// carries it out on real engines: each (candidate, loaded depth) it chooses is a ServedModel of
// its own, loaded with only that prefix of layers, its KV pool sized from the group's one memory
// budget less the weights it keeps resident.
//
// Transitions. A new target is loaded by the request that first goes to it (others wait for the
// load); from then on new requests go there. Requests in flight finish where they started: their
// K/V lives in that engine, and re-prefilling them elsewhere would cost more than the few tokens
// they have left. An engine no longer chosen is released when its last request leaves, and its
// memory (weights and KV) grows the current engine's pool.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "helios/config.h"
#include "helios/early_exit.h"
#include "helios/metrics.h"
#include "helios/model_manager.h"
#include "server/served_model.h"

namespace helios::server {

struct GroupEngine;

// What one request of the group was routed to: hold it until the request ends.
struct GroupRoute {
  std::shared_ptr<ServedModel> served;  // submit here
  ServingTarget target;                 // what the manager records it under
  ExitRule exit;                        // the rule to run it with
  bool observe = false;                 // GenerationRequest::observe_exits
  std::shared_ptr<GroupEngine> engine;
  std::shared_ptr<RequestRecord> record;  // what on_update gathers for the manager
};

// The decision log kept for status (the latest 100).
struct DecisionRecord {
  Decision decision;
  std::string model;
  double at_seconds = 0;
};

struct GroupMemory {
  int64_t budget_bytes = 0, weight_bytes = 0, kv_bytes = 0;
  int32_t kv_blocks = 0, kv_block_size = 0, max_batch = 0, batch_context = 0;
};

struct LoadedEngineStatus {
  std::string model;
  int32_t depth = 0;
  EngineStatus engine;
  int64_t weight_bytes = 0;
};

struct GroupStatusSnapshot {
  std::string name;
  ManagerParams params;
  bool evaluating = true;
  std::string model;
  int32_t depth = 0, n_layers = 0;
  std::vector<std::string> candidates;
  std::vector<PhtRow> pht;
  int32_t breaches = 0;
  int64_t requests_total = 0, requests_since_evaluation = 0;
  GroupMemory memory;
  std::vector<DecisionRecord> decisions;
  std::vector<LoadedEngineStatus> engines;  // current first
};

class ModelGroup {
 public:
  // Checks the candidates' tokenizers (INVALID_ARGUMENT naming both files when two differ),
  // selects the Top-K and loads the first to evaluate. `started` is the server's start, for the
  // decision log's times. `wrap_backend` wraps the backend of every engine the group loads (as
  // load_served_model's: fault injection in tests).
  static StatusOr<std::unique_ptr<ModelGroup>> create(const ModelGroupConfig& group, const HeliosConfig& config,
                                                      MetricsRegistry& metrics,
                                                      std::function<void(const std::string&)> on_fault,
                                                      std::chrono::steady_clock::time_point started,
                                                      BackendWrapper wrap_backend = {});
  ~ModelGroup();

  const std::string& name() const { return config_.name; }
  // Where the next request goes, loading its target first if the manager just chose a new one.
  StatusOr<GroupRoute> route();
  // Every update of a routed request, in order (tokens, then the last one with its finish).
  void on_update(const GroupRoute& route, const GenerationUpdate& update);
  // Ends every live request of every engine.
  void abort_all(const std::string& reason);
  bool abort(const std::string& client_id);
  size_t n_live() const;
  GroupStatusSnapshot status() const;
  // An engine that serves this group now (the current one): for Tokenize, Detokenize, ModelInfo.
  std::shared_ptr<ServedModel> current() const;
  // Each loaded engine's progress, named "group/model@depth", for the liveness watchdog; nullopt
  // while the group is busy (loading or extending a model), so the watchdog never waits on it.
  std::optional<std::vector<std::pair<std::string, EngineProgress>>> engine_progress() const;

 private:
  ModelGroup(ModelGroupConfig config, const HeliosConfig& server_config, MetricsRegistry& metrics,
             std::function<void(const std::string&)> on_fault, std::chrono::steady_clock::time_point started);
  Status load_target(const ServingTarget& target);  // under mu_
  // Makes the engine serve `depth` layers of its model (Engine::extend_layers). Under mu_.
  Status extend_in_place(GroupEngine& e, int32_t depth);
  void extend_current_now(const ServingTarget& target);  // an extend decision's target, if current
  void apply(const std::optional<Decision>& d);      // under mu_
  // Releases engines other than the current one (and `keep`) that have no live request, and
  // grows the current pool by what they held. Under mu_.
  void release_idle_engines(std::optional<ServingTarget> keep = std::nullopt);
  float confidence_of(size_t candidate, int32_t layer, float top1_prob) const;
  GroupMemory memory_locked() const;

  struct Candidate;
  ModelGroupConfig config_;
  const HeliosConfig& server_config_;
  MetricsRegistry& metrics_;
  std::function<void(const std::string&)> on_fault_;
  BackendWrapper wrap_backend_;
  std::chrono::steady_clock::time_point started_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Candidate>> candidates_;
  std::unique_ptr<ModelManager> manager_;
  std::vector<std::shared_ptr<GroupEngine>> engines_;  // engines_[0] is the current one
  std::vector<DecisionRecord> decisions_;
  Counter* breaches_total_ = nullptr;
};

}  // namespace helios::server
