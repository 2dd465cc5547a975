// The engine loop: schedule → execute → update, one batch per iteration.
#include "helios/engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "engine/live_request.h"
#include "engine/paged_kv_manager.h"
#include "helios/generate.h"

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
                               {1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64, 80})),
        layers_per_token(r.histogram("helios_layers_computed_per_token",
                                     "Blocks computed for each generated token (self-speculative drafts included)",
                                     {1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64, 80, 128})),
        kv_fill_layers(r.counter("helios_kv_fill_layers_total",
                                 "Token-layers whose K/V was filled from an exit state")),
        draft_tokens(r.counter("helios_speculative_draft_tokens_total", "Self-speculative tokens drafted")),
        accepted_tokens(r.counter("helios_speculative_accepted_tokens_total",
                                  "Self-speculative drafts the full model confirmed")) {}
  Gauge *running, *waiting, *kv_usage, *batch_size;
  Counter *prompt_tokens, *generated_tokens, *preemptions;
  Histogram *ttft, *tpot, *e2e, *batch_hist, *exit_layer, *layers_per_token;
  Counter *kv_fill_layers, *draft_tokens, *accepted_tokens;

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
  // The step's sequences but self-speculative decodes, as one batch.
  void run_batch(const SchedulerOutput& out, const std::vector<size_t>& members);
  // Self-speculative decodes drafting at `draft_layer`: one round for all of them.
  void run_speculative(const SchedulerOutput& out, int32_t draft_layer, const std::vector<size_t>& members);
  // Samples a token from one row of raw logits (the sampler rewrites a copy).
  TokenId sample(LiveRequest& r, const float* raw, int32_t n_vocab, const std::vector<TokenId>& history);
  // Early-exit accounting of one generated token.
  void count_token(int32_t exit_layer, double layers_computed);
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
  std::vector<int64_t> exit_layer_counts;  // [n_layers_loaded + 1]
  int64_t layers_computed_total = 0, kv_fill_layers_total = 0, drafted_total = 0, accepted_total = 0;
  std::vector<float> sample_logits;  // [n_vocab] one row's logits, for the sampler to rewrite
};

Engine::Engine(Model& model) : model_(model) {}

StatusOr<std::unique_ptr<Engine>> Engine::start(Model& model, const EngineOptions& options,
                                                MetricsRegistry* metrics) {
  if (options.n_kv_blocks <= 0) return invalid_argument("the engine needs at least one KV block");
  HELIOS_ASSIGN_OR_RETURN(auto storage, KvCacheStorage::create(model.backend(), model.kv_config(),
                                                              options.n_kv_blocks, options.block_size));
  std::unique_ptr<Engine> engine(new Engine(model));
  engine->impl_ = std::make_unique<Impl>(model, options, metrics, std::move(storage));
  Impl* impl = engine->impl_.get();
  impl->snapshot.kv_blocks_total = options.n_kv_blocks;
  impl->snapshot.kv_block_size = options.block_size;
  impl->exit_layer_counts.assign(model.n_layers_loaded() + 1, 0);
  impl->snapshot.exit_layer_counts = impl->exit_layer_counts;
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
  HELIOS_RETURN_IF_ERROR(model_.check_exit_rule(request.exit));
  request.exit = model_.resolve_exit_rule(request.exit);
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

  // The blocks this plan holds are visible before any of its tokens reaches a client.
  publish_queues();
  // Self-speculative decodes run their own passes, grouped by draft exit; all else is one batch.
  std::vector<size_t> batched;
  std::map<int32_t, std::vector<size_t>> speculative;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSequence& s = out.seqs[i];
    LiveRequest& r = *live[s.id];
    if (!r.first_scheduled) r.first_scheduled = Clock::now();
    const ExitRule& rule = r.request.exit;
    if (rule.policy == ExitPolicy::kSelfSpeculative && s.samples && s.n_tokens == 1) {
      speculative[rule.depth].push_back(i);
    } else {
      batched.push_back(i);
    }
  }
  if (!batched.empty()) run_batch(out, batched);
  for (const auto& [draft_layer, members] : speculative) run_speculative(out, draft_layer, members);
  publish_step(out, std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count()));
}

void Engine::Impl::run_batch(const SchedulerOutput& out, const std::vector<size_t>& members) {
  ForwardBatch batch;
  for (size_t i : members) {
    const ScheduledSequence& s = out.seqs[i];
    const std::vector<TokenId>& tokens = *scheduler.tokens(s.id);
    SequenceBatchEntry e;
    e.tokens.assign(tokens.begin() + s.start_pos, tokens.begin() + s.start_pos + s.n_tokens);
    e.start_pos = s.start_pos;
    e.blocks = kv_manager.table(s.id);
    e.logits = s.samples ? LogitsWanted::kLast : LogitsWanted::kNone;
    e.exit = live[s.id]->request.exit;
    batch.seqs.push_back(std::move(e));
  }
  auto result = model.forward(batch, kv);
  if (!result.ok()) {
    for (size_t i : members) {
      end_request(out.seqs[i].id, live[out.seqs[i].id]->aborted("internal error: " + result.status().message()));
    }
    return;
  }
  ForwardResult& fr = *result;
  kv_fill_layers_total += fr.fill_rows;
  if (metrics) metrics->kv_fill_layers->inc(static_cast<double>(fr.fill_rows));
  for (size_t row = 0; row < fr.row_seq.size(); ++row) {
    const RequestId id = out.seqs[members[fr.row_seq[row]]].id;
    LiveRequest& r = *live[id];
    const float* raw = fr.row(row);
    const TokenId token = sample(r, raw, fr.n_vocab, *scheduler.tokens(id));
    scheduler.append_token(id, token);
    count_token(fr.row_exit_layer[row], fr.row_exit_layer[row]);
    GenerationUpdate u = r.on_token(token, raw, fr.n_vocab, fr.row_exit_layer[row], fr.row_confidence[row],
                                    model.tokenizer());
    if (u.finish != GenerationFinish::kNone) {
      end_request(id, std::move(u));
    } else {
      r.stream->push(std::move(u));
    }
  }
}

void Engine::Impl::run_speculative(const SchedulerOutput& out, int32_t draft_layer,
                                   const std::vector<size_t>& members) {
  std::vector<SpeculativeSeq> round;
  // Drafted tokens count against the step's token budget (the scheduler counted one per sequence).
  int32_t budget = options.scheduler.max_batched_tokens - out.n_batched_tokens;
  for (size_t i : members) {
    const ScheduledSequence& s = out.seqs[i];
    const LiveRequest& r = *live[s.id];
    // Never draft past max_tokens; the drafted positions need KV blocks, and without free ones
    // this round drafts nothing (a plain decode in two halves).
    int32_t n_draft = std::max(0, std::min({r.request.exit.draft_tokens, r.request.max_tokens - r.n_generated - 1, budget}));
    if (n_draft > 0 && !kv_manager.reserve(s.id, s.start_pos + 1 + n_draft)) n_draft = 0;
    budget -= n_draft;
    SpeculativeSeq seq;
    seq.table = kv_manager.table(s.id);
    seq.input = (*scheduler.tokens(s.id))[s.start_pos];
    seq.position = s.start_pos;
    seq.n_draft = n_draft;
    round.push_back(std::move(seq));
  }
  ForwardResult fr;
  SpeculativeWork work;
  if (Status st = speculative_round(model, kv, draft_layer, round, &fr, &work); !st.ok()) {
    for (size_t i : members) end_request(out.seqs[i].id, live[out.seqs[i].id]->aborted("internal error: " + st.message()));
    return;
  }
  for (size_t j = 0; j < members.size(); ++j) {
    const RequestId id = out.seqs[members[j]].id;
    const SpeculativeSeq& seq = round[j];
    LiveRequest& r = *live[id];
    std::vector<TokenId> history = *scheduler.tokens(id);
    std::vector<TokenId> emitted;
    std::vector<TokenEvent> events;
    GenerationUpdate last;
    const int32_t accepted = take_speculated(seq, [&](int32_t row, TokenId* token) {
      *token = sample(r, fr.row(row), fr.n_vocab, history);
      history.push_back(*token);
      emitted.push_back(*token);
      last = r.on_token(*token, fr.row(row), fr.n_vocab, fr.row_exit_layer[row], fr.row_confidence[row],
                        model.tokenizer());
      events.insert(events.end(), last.tokens.begin(), last.tokens.end());
      return last.finish == GenerationFinish::kNone;
    });
    scheduler.append_speculated(id, emitted);
    // Every drafted input ran the whole stack once: draft blocks, then verify blocks.
    const double layers_each = static_cast<double>(seq.n_draft + 1) * model.n_layers_loaded() / emitted.size();
    for (const TokenEvent& ev : events) count_token(ev.exit_layer, layers_each);
    drafted_total += seq.n_draft;
    accepted_total += accepted;
    if (metrics) {
      metrics->draft_tokens->inc(seq.n_draft);
      metrics->accepted_tokens->inc(accepted);
    }
    last.tokens = std::move(events);
    if (last.finish != GenerationFinish::kNone) {
      end_request(id, std::move(last));
    } else {
      r.stream->push(std::move(last));
    }
  }
}

TokenId Engine::Impl::sample(LiveRequest& r, const float* raw, int32_t n_vocab, const std::vector<TokenId>& history) {
  sample_logits.assign(raw, raw + n_vocab);
  return r.sampler.sample(sample_logits.data(), n_vocab, history);
}

void Engine::Impl::count_token(int32_t exit_layer, double layers_computed) {
  ++generated_total;
  if (exit_layer >= 0 && exit_layer < static_cast<int32_t>(exit_layer_counts.size())) ++exit_layer_counts[exit_layer];
  layers_computed_total += static_cast<int64_t>(std::lround(layers_computed));
  if (metrics) {
    metrics->generated_tokens->inc();
    metrics->exit_layer->observe(exit_layer);
    metrics->layers_per_token->observe(layers_computed);
  }
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
    snapshot.exit_layer_counts = exit_layer_counts;
    snapshot.layers_computed_total = layers_computed_total;
    snapshot.kv_fill_layers_total = kv_fill_layers_total;
    snapshot.draft_tokens_total = drafted_total;
    snapshot.draft_tokens_accepted = accepted_total;
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
