// The engine loop: schedule → execute → update, one batch per iteration.
#include "helios/engine.h"

#include <algorithm>
#include <unordered_map>

#include "engine/live_request.h"
#include "engine/paged_kv_manager.h"

namespace helios {
namespace {

// Engine metrics, registered once per engine.
struct EngineMetrics {
  explicit EngineMetrics(MetricsRegistry& r)
      : running(r.gauge("helios_requests_running", "Requests with a sequence in the running batch")),
        waiting(r.gauge("helios_requests_waiting", "Requests queued for their first step or preempted")),
        kv_usage(r.gauge("helios_kv_cache_usage_ratio", "Fraction of KV cache blocks in use")),
        batch_size(r.gauge("helios_batch_size", "Sequences in the last step")),
        prompt_tokens(r.counter("helios_prompt_tokens_total", "Prompt tokens of finished requests")),
        generated_tokens(r.counter("helios_generation_tokens_total", "Generated tokens")),
        preemptions(r.counter("helios_preemptions_total", "Sequences preempted for KV cache space")),
        ttft(r.histogram("helios_time_to_first_token_seconds", "Time from arrival to the first token",
                         {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})),
        tpot(r.histogram("helios_time_per_output_token_seconds", "Mean time per generated token after the first",
                         {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1})),
        e2e(r.histogram("helios_e2e_request_latency_seconds", "Time from arrival to the last token",
                        {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120})),
        batch_hist(r.histogram("helios_batch_size_sequences", "Sequences per step",
                               {1, 2, 4, 8, 16, 32, 64, 128, 256})),
        exit_layer(r.histogram("helios_exit_layer", "Layer at which each generated token left the stack",
                               {1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64, 80})) {}
  Gauge *running, *waiting, *kv_usage, *batch_size;
  Counter *prompt_tokens, *generated_tokens, *preemptions;
  Histogram *ttft, *tpot, *e2e, *batch_hist, *exit_layer;

  Counter* finished(MetricsRegistry& r, const char* reason) {
    return r.counter("helios_requests_finished_total", "Finished requests by reason", {{"reason", reason}});
  }
};

const char* finish_name(GenerationFinish f) {
  switch (f) {
    case GenerationFinish::kStop: return "stop";
    case GenerationFinish::kEos: return "eos";
    case GenerationFinish::kLength: return "length";
    case GenerationFinish::kAborted: return "aborted";
    case GenerationFinish::kNone: break;
  }
  return "none";
}

}  // namespace

struct Engine::Impl {
  Impl(Model& m, const EngineOptions& o, MetricsRegistry* r, KvCacheStorage storage)
      : model(m), options(o), registry(r), kv(std::move(storage)),
        kv_manager(o.n_kv_blocks, o.block_size, o.n_swap_blocks),
        scheduler(o.scheduler, kv_manager),
        swap_space(static_cast<size_t>(o.n_swap_blocks) * kv.floats_per_block()) {
    if (registry) metrics = std::make_unique<EngineMetrics>(*registry);
  }

  void run();
  void admit_and_abort();
  void step();
  void copy_swaps(const SchedulerOutput& out);
  void end_request(RequestId id, GenerationUpdate final_update);
  // Queue lengths, KV use and counters: after every step, abort and finished request.
  void publish_queues();
  // A step's batch and rate, then publish_queues().
  void publish_step(const SchedulerOutput& out, double step_seconds);

  Model& model;
  EngineOptions options;
  MetricsRegistry* registry;
  std::unique_ptr<EngineMetrics> metrics;
  KvCacheStorage kv;
  PagedKvManager kv_manager;
  Scheduler scheduler;
  std::vector<float> swap_space;  // [n_swap_blocks, floats_per_block]

  // Shared with other threads, under mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::string stop_reason;
  std::deque<std::pair<GenerationRequest, std::shared_ptr<RequestStream>>> incoming;
  std::vector<std::pair<std::string, std::string>> aborts;  // client id, reason
  std::unordered_map<std::string, bool> client_ids;         // live client ids
  EngineStatus snapshot;
  int64_t requests_total = 0;

  // Loop thread only.
  RequestId next_id = 1;
  std::unordered_map<RequestId, std::unique_ptr<LiveRequest>> live;
  std::unordered_map<std::string, RequestId> id_of_client;
  std::thread thread;
  double steps_per_second = 0;
  int64_t generated_total = 0;
  std::vector<float> sample_logits;  // [n_vocab] one row's logits, for the sampler to rewrite
};

Engine::Engine(Model& model) : model_(model) {}

StatusOr<std::unique_ptr<Engine>> Engine::start(Model& model, const EngineOptions& options,
                                                MetricsRegistry* metrics) {
  if (options.n_kv_blocks <= 0) return invalid_argument("the engine needs at least one KV block");
  HELIOS_ASSIGN_OR_RETURN(auto storage, KvCacheStorage::create(model.backend(), model.config(),
                                                              options.n_kv_blocks, options.block_size));
  std::unique_ptr<Engine> engine(new Engine(model));
  engine->impl_ = std::make_unique<Impl>(model, options, metrics, std::move(storage));
  Impl* impl = engine->impl_.get();
  impl->snapshot.kv_blocks_total = options.n_kv_blocks;
  impl->snapshot.kv_block_size = options.block_size;
  impl->thread = std::thread([impl] { impl->run(); });
  return engine;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    if (impl_->stop_reason.empty()) impl_->stop_reason = "the server is shutting down";
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

bool Engine::has_capacity() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int32_t>(impl_->client_ids.size()) < impl_->options.queue_limit;
}

StatusOr<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest request) {
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) return unavailable("the server is shutting down");
    if (static_cast<int32_t>(impl_->client_ids.size()) >= impl_->options.queue_limit) {
      return resource_exhausted("the request queue is full (" + std::to_string(impl_->options.queue_limit) +
                                " requests); retry later");
    }
    if (impl_->client_ids.count(request.client_id)) {
      return already_exists("request id '" + request.client_id + "' is already in use");
    }
    impl_->client_ids[request.client_id] = true;
    ++impl_->requests_total;
    impl_->incoming.emplace_back(std::move(request), stream);
  }
  impl_->cv.notify_all();
  return stream;
}

bool Engine::abort(const std::string& client_id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->client_ids.count(client_id)) return false;
    impl_->aborts.emplace_back(client_id, reason);
  }
  impl_->cv.notify_all();
  return true;
}

void Engine::abort_all(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& [id, unused] : impl_->client_ids) impl_->aborts.emplace_back(id, reason);
  }
  impl_->cv.notify_all();
}

size_t Engine::n_live() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->client_ids.size();
}

EngineStatus Engine::status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->snapshot;
}

// ---------------------------------------------------------------------------------------------
// The loop

void Engine::Impl::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stopping || !incoming.empty() || !aborts.empty() || scheduler.has_work(); });
      if (stopping) break;
    }
    admit_and_abort();
    if (scheduler.has_work()) {
      step();
    } else {
      publish_queues();  // idle: queues and KV use after aborts
    }
  }
  // Shutdown: every live request ends with an explicit reason.
  std::vector<RequestId> ids;
  for (const auto& [id, unused] : live) ids.push_back(id);
  for (RequestId id : ids) end_request(id, live[id]->aborted(stop_reason));
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [request, stream] : incoming) {
    GenerationUpdate u;
    u.finish = GenerationFinish::kAborted;
    u.error = stop_reason;
    stream->push(std::move(u));
  }
  incoming.clear();
  client_ids.clear();
}

void Engine::Impl::admit_and_abort() {
  std::deque<std::pair<GenerationRequest, std::shared_ptr<RequestStream>>> arrived;
  std::vector<std::pair<std::string, std::string>> to_abort;
  {
    std::lock_guard<std::mutex> lock(mu);
    arrived.swap(incoming);
    to_abort.swap(aborts);
  }
  for (auto& [request, stream] : arrived) {
    const RequestId id = next_id++;
    id_of_client[request.client_id] = id;
    scheduler.add({id, request.prompt, request.max_tokens});
    live[id] = std::make_unique<LiveRequest>(std::move(request), std::move(stream), model.tokenizer());
  }
  for (const auto& [client_id, reason] : to_abort) {
    auto it = id_of_client.find(client_id);
    if (it != id_of_client.end() && live.count(it->second)) {
      end_request(it->second, live[it->second]->aborted(reason));
    }
  }
}

void Engine::Impl::step() {
  const auto t0 = Clock::now();
  const SchedulerOutput out = scheduler.schedule();
  copy_swaps(out);
  if (out.empty()) {
    // Nothing fits although requests wait: the oldest cannot ever get its blocks (requests are
    // validated against the cache size, so this means a bug); fail it rather than spin.
    if (scheduler.n_running() == 0 && scheduler.n_waiting() > 0 && !live.empty()) {
      RequestId oldest = live.begin()->first;
      for (const auto& [id, unused] : live) oldest = std::min(oldest, id);
      end_request(oldest, live[oldest]->aborted("the KV cache cannot hold this request"));
    }
    return;
  }

  ForwardBatch batch;
  for (const ScheduledSequence& s : out.seqs) {
    const std::vector<TokenId>& tokens = *scheduler.tokens(s.id);
    LiveRequest& r = *live[s.id];
    if (!r.first_scheduled) r.first_scheduled = Clock::now();
    batch.seqs.push_back({std::vector<TokenId>(tokens.begin() + s.start_pos, tokens.begin() + s.start_pos + s.n_tokens),
                          s.start_pos, kv_manager.table(s.id),
                          s.samples ? LogitsWanted::kLast : LogitsWanted::kNone});
  }
  auto result = model.forward(batch, kv);
  if (!result.ok()) {
    for (const ScheduledSequence& s : out.seqs) {
      end_request(s.id, live[s.id]->aborted("internal error: " + result.status().message()));
    }
    return;
  }
  ForwardResult& fr = *result;
  const int32_t exit_layer = model.n_layers_loaded();
  for (size_t row = 0; row < fr.row_seq.size(); ++row) {
    const RequestId id = out.seqs[fr.row_seq[row]].id;
    LiveRequest& r = *live[id];
    const float* raw = fr.row(row);
    sample_logits.assign(raw, raw + fr.n_vocab);  // the sampler rewrites its copy
    const TokenId token = r.sampler.sample(sample_logits.data(), fr.n_vocab, *scheduler.tokens(id));
    scheduler.append_token(id, token);
    ++generated_total;
    GenerationUpdate u = r.on_token(token, raw, fr.n_vocab, exit_layer, model.tokenizer());
    if (metrics) {
      metrics->generated_tokens->inc();
      metrics->exit_layer->observe(exit_layer);
    }
    if (u.finish != GenerationFinish::kNone) {
      end_request(id, std::move(u));
    } else {
      r.stream->push(std::move(u));
    }
  }
  publish_step(out, std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count()));
}

void Engine::Impl::copy_swaps(const SchedulerOutput& out) {
  const int64_t n = kv.floats_per_block();
  for (const BlockCopy& c : out.swap_out) kv.read_block(c.from_block, swap_space.data() + c.to_block * n);
  for (const BlockCopy& c : out.swap_in) kv.write_block(c.to_block, swap_space.data() + c.from_block * n);
}

void Engine::Impl::end_request(RequestId id, GenerationUpdate final_update) {
  auto it = live.find(id);
  if (it == live.end()) return;
  LiveRequest& r = *it->second;
  scheduler.abort(id);  // releases its blocks; a no-op when the scheduler already forgot it
  if (metrics) {
    metrics->finished(*registry, finish_name(final_update.finish))->inc();
    metrics->prompt_tokens->inc(static_cast<double>(r.request.prompt.size()));
    if (r.first_token) {
      metrics->ttft->observe(final_update.ttft_seconds);
      if (r.n_generated > 1) {
        metrics->tpot->observe((final_update.total_seconds - final_update.ttft_seconds) / (r.n_generated - 1));
      }
    }
    metrics->e2e->observe(final_update.total_seconds);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    client_ids.erase(r.request.client_id);
  }
  // Published before the client hears of the end, so a status read after it shows this request
  // counted and its blocks free.
  publish_queues();
  r.stream->push(std::move(final_update));
  id_of_client.erase(r.request.client_id);
  live.erase(it);
}

void Engine::Impl::publish_queues() {
  {
    std::lock_guard<std::mutex> lock(mu);
    snapshot.waiting = static_cast<int32_t>(scheduler.n_waiting());
    snapshot.running = static_cast<int32_t>(scheduler.n_running());
    snapshot.swapped = static_cast<int32_t>(scheduler.n_swapped());
    snapshot.kv_blocks_used = kv_manager.n_used_blocks();
    snapshot.preemptions = scheduler.n_preemptions();
    snapshot.requests_total = requests_total;
    snapshot.generated_tokens_total = generated_total;
  }
  if (metrics) {
    metrics->running->set(static_cast<double>(scheduler.n_running()));
    metrics->waiting->set(static_cast<double>(scheduler.n_waiting() + scheduler.n_swapped()));
    metrics->kv_usage->set(static_cast<double>(kv_manager.n_used_blocks()) / kv_manager.n_blocks());
  }
}

void Engine::Impl::publish_step(const SchedulerOutput& out, double step_seconds) {
  const double rate = 1.0 / step_seconds;
  steps_per_second = steps_per_second == 0 ? rate : 0.9 * steps_per_second + 0.1 * rate;
  {
    std::lock_guard<std::mutex> lock(mu);
    snapshot.batch_size = static_cast<int32_t>(out.seqs.size());
    snapshot.batch_tokens = out.n_batched_tokens;
    snapshot.steps_per_second = steps_per_second;
  }
  publish_queues();
  if (metrics) {
    metrics->batch_size->set(static_cast<double>(out.seqs.size()));
    metrics->batch_hist->observe(static_cast<double>(out.seqs.size()));
    if (!out.preempted.empty()) metrics->preemptions->inc(static_cast<double>(out.preempted.size()));
  }
}

}  // namespace helios
