// The engine's state, shared by the loop (engine.cpp) and step execution (execute.cpp).
// Internal to src/engine/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/engine_metrics.h"
#include "engine/live_request.h"
#include "engine/paged_kv_manager.h"
#include "helios/engine.h"

namespace helios {

struct Engine::Impl {
  Impl(Model& m, const EngineOptions& o, MetricsRegistry* r, KvCacheStorage storage)
      : model(m), options(o), registry(r), kv(std::move(storage)),
        kv_manager(o.n_kv_blocks, o.block_size, o.n_swap_blocks, o.prefix_caching),
        scheduler(o.scheduler, kv_manager),
        swap_space(&m.backend(), static_cast<size_t>(o.n_swap_blocks) * kv.words_per_block()) {
    if (registry) metrics = std::make_unique<EngineMetrics>(*registry);
    if (metrics) metrics->kv_blocks_total->add(o.n_kv_blocks);
  }
  ~Impl() {
    if (metrics) metrics->kv_blocks_total->add(-kv_manager.n_blocks());
  }

  // --- The loop (engine.cpp)
  void run();
  void admit_and_abort();
  // Engine::grow_kv's request, between steps: no pass holds a view of the old storage. A failure
  // is logged and the engine goes on with the pool it has.
  void apply_kv_growth();
  // Engine::extend_layers' request, between steps (layer_extension.cpp): applies it and answers
  // the waiting caller.
  void apply_layer_extension();
  Status extend_layers(LayerExtension& extension);
  // The steps of extend_layers() (layer_extension.cpp).
  Status check_rules_after(const LayerExtension& extension, int32_t new_depth,
                           const std::vector<GenerationRequest*>& requests) const;
  // A KV pool of n_blocks for `kv_config`, the old one freed first to keep the peak low.
  Status remake_kv(const ModelConfig& kv_config, int32_t n_blocks);
  void adopt_new_depth(int32_t old_depth, ExtendKv kv_mode, int32_t n_blocks);
  void step();
  // After a step: the full blocks it completed join the prefix cache where every token of theirs
  // ran the whole loaded stack.
  void publish_prefix_blocks(const SchedulerOutput& out);
  // Preemption's and the swap policy's copies, before the step; timed (a swap stall).
  void copy_swaps(const SchedulerOutput& out);

  // --- Intercepts (intercepts.cpp)
  // Start-up profile of the forward time by batch tokens and of the device ↔ host copy bandwidth.
  void profile_for_intercepts();
  // Resumes and ends of paused requests, queued by Engine::resume()/end_paused().
  void apply_resumes();
  // A request whose token paused it after its step: held by its policy, then the client hears.
  void pause_request(RequestId id, LiveRequest& r, GenerationUpdate update);
  // Min-waste's decisions for this step's paused requests (swap-outs go to `async_out`), and the
  // step's budgets for the scheduler.
  StepBudgets plan_paused(std::vector<BlockCopy>* async_out);
  // The copies that run beside the step (a copy thread), and waiting for them after it.
  void start_async_copies(std::vector<BlockCopy> out, std::vector<BlockCopy> in);
  void finish_async_copies();
  // Waste of paused KV (held × time) up to now; call before anything changes what they hold.
  void account_paused(Clock::time_point now);
  // A step's recompute share, its time into the forward profile.
  void account_step(const SchedulerOutput& out, double step_seconds);
  // How the pause of a request ends up held (preserve | swap | discard | evict), counted.
  void count_hold(const LiveRequest& r, RequestId id);
  int64_t block_bytes() const { return kv.words_per_block() * 4; }
  int64_t running_kv_bytes() const;
  void end_request(RequestId id, GenerationUpdate final_update);
  // Ends every live request, and every submitted one not yet admitted, with `reason`.
  void end_all(const std::string& reason, StatusCode code);
  // A backend error: every live request fails with it and the engine takes no more work.
  void fault(const Status& error);
  // Queue lengths, KV use and counters: after every step, abort and finished request.
  void publish_queues();
  // A step's batch and rate, then publish_queues().
  void publish_step(const SchedulerOutput& out, double step_seconds);

  // --- Running a step's plan (execute.cpp); false after a backend error (fault() was called)
  // The step's sequences but self-speculative decodes with a lookahead, as one batch.
  bool run_batch(const SchedulerOutput& out, const std::vector<size_t>& members);
  // Self-speculative decodes drafting at `draft_layer`: one round for all of them.
  bool run_speculative(const SchedulerOutput& out, int32_t draft_layer, const std::vector<size_t>& members);
  // Early-exit accounting of one generated token.
  void count_token(int32_t exit_layer, double layers_computed);

  Model& model;
  EngineOptions options;
  MetricsRegistry* registry;
  std::unique_ptr<EngineMetrics> metrics;
  KvCacheStorage kv;
  PagedKvManager kv_manager;
  Scheduler scheduler;
  HostBuffer swap_space;  // [n_swap_blocks, words_per_block], pinned where the backend pins

  // Shared with other threads, under mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::string stop_reason;
  std::string fault_reason;  // set once, by fault()
  std::deque<std::pair<GenerationRequest, std::shared_ptr<RequestStream>>> incoming;
  std::vector<std::pair<std::string, std::string>> aborts;  // client id, reason
  int32_t pending_kv_blocks = 0;                            // grow_kv's total not yet applied; 0: none
  struct PendingExtension {
    LayerExtension extension;
    std::promise<Status> done;  // set by the loop; extend_layers waits on it
  };
  std::unique_ptr<PendingExtension> pending_extension;      // extend_layers' request; null: none
  std::unordered_map<std::string, bool> client_ids;         // live client ids
  struct PendingResume {
    std::string client_id;
    std::vector<TokenId> tokens;
    int32_t max_tokens = 0;
    bool end = false;
  };
  std::vector<PendingResume> resumes;                       // Engine::resume()/end_paused()
  std::unordered_set<std::string> paused_clients;           // paused and not yet resumed
  EngineStatus snapshot;
  int64_t requests_total = 0;
  // Engine::progress(), read without mu. `work` is written under mu (submit, publish_queues).
  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> last_step_ns{0};  // steady_clock ticks since its epoch
  std::atomic<int32_t> work{0};

  // Loop thread only.
  RequestId next_id = 1;
  std::unordered_map<RequestId, std::unique_ptr<LiveRequest>> live;
  std::unordered_map<std::string, RequestId> id_of_client;
  std::thread thread;
  double steps_per_second = 0;
  int64_t generated_total = 0;
  std::vector<int64_t> exit_layer_counts;  // [n_layers_loaded + 1]
  int64_t layers_computed_total = 0, kv_fill_layers_total = 0, drafted_total = 0, accepted_total = 0;
  // Intercepts: the waste model (profile, bandwidth, M), the counters, the copies in flight.
  WasteModel waste;
  InterceptStats intercept_stats;
  Clock::time_point last_account = Clock::now();
  int32_t last_batch_tokens = 1;
  std::vector<BlockCopy> async_out, async_in;
  std::future<void> copies_in_flight;
  double published_waste[3] = {0, 0, 0};  // preserve, recompute, swap: what the counters have
  PrefixCacheStats published_cache;       // what the prefix cache counters have
  GraphCounters published_graphs;         // what the step-graph counters have
};

}  // namespace helios
