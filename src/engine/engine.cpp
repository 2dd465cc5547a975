// The engine loop: schedule → execute → update, one batch per iteration.
#include "helios/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "engine/engine_impl.h"

namespace helios {

Engine::Engine(Model& model) : model_(model) {}

StatusOr<std::unique_ptr<Engine>> Engine::start(Model& model, const EngineOptions& options,
                                                MetricsRegistry* metrics) {
  if (options.n_kv_blocks <= 0) return invalid_argument("the engine needs at least one KV block");
  HELIOS_ASSIGN_OR_RETURN(auto storage, model.create_kv(options.n_kv_blocks, options.block_size, options.kv_type));
  std::unique_ptr<Engine> engine(new Engine(model));
  engine->impl_ = std::make_unique<Impl>(model, options, metrics, std::move(storage));
  Impl* impl = engine->impl_.get();
  if (options.n_swap_blocks > 0 && impl->swap_space.empty()) {
    return resource_exhausted("no host memory for the swap space of " + std::to_string(options.n_swap_blocks) +
                              " blocks; lower engine.swap_space");
  }
  impl->snapshot.kv_blocks_total = options.n_kv_blocks;
  impl->snapshot.kv_block_size = options.block_size;
  impl->snapshot.loaded_layers = model.n_layers_loaded();
  impl->snapshot.exit_layers = model.exit_layers();
  impl->snapshot.n_params = model.weights().n_params;
  impl->exit_layer_counts.assign(model.n_layers_loaded() + 1, 0);
  impl->snapshot.exit_layer_counts = impl->exit_layer_counts;
  impl->last_step_ns = Clock::now().time_since_epoch().count();
  // Before the loop starts, so that the first requests see a measured profile: the copy
  // bandwidth always, the forward time by batch tokens when configured.
  impl->profile_for_intercepts();
  impl->publish_queues();
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
    // Under the lock the loop extends the model under (extend_layers), so the rule is checked
    // against the depth and exits it will run at.
    HELIOS_RETURN_IF_ERROR(model_.check_exit_rule(request.exit));
    request.exit = model_.resolve_exit_rule(request.exit);
    if (impl_->stopping) return unavailable("the server is shutting down");
    if (!impl_->fault_reason.empty()) return internal_error(impl_->fault_reason);
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
    impl_->work.fetch_add(1, std::memory_order_relaxed);
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

Status Engine::resume(const std::string& client_id, std::vector<TokenId> appended, int32_t max_tokens) {
  if (appended.empty()) return invalid_argument("a resume needs at least one token to append");
  if (max_tokens < 1) return invalid_argument("max_tokens must be at least 1, got " + std::to_string(max_tokens));
  const int32_t n_vocab = model_.config().n_vocab;
  for (size_t i = 0; i < appended.size(); ++i) {
    if (appended[i] < 0 || appended[i] >= n_vocab) {
      return invalid_argument("token " + std::to_string(appended[i]) + " (index " + std::to_string(i) +
                              ") is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->client_ids.count(client_id)) return not_found("no live request '" + client_id + "'");
    if (!impl_->paused_clients.erase(client_id)) {
      return failed_precondition("request '" + client_id + "' is not paused: resume answers an intercept");
    }
    impl_->resumes.push_back({client_id, std::move(appended), max_tokens, false});
  }
  impl_->cv.notify_all();
  return ok_status();
}

Status Engine::end_paused(const std::string& client_id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->client_ids.count(client_id)) return not_found("no live request '" + client_id + "'");
    if (!impl_->paused_clients.erase(client_id)) {
      return failed_precondition("request '" + client_id + "' is not paused");
    }
    impl_->resumes.push_back({client_id, {}, 0, true});
  }
  impl_->cv.notify_all();
  return ok_status();
}

Status Engine::grow_kv(int32_t n_blocks) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) return unavailable("the server is shutting down");
    if (!impl_->fault_reason.empty()) return internal_error(impl_->fault_reason);
    const int32_t total = std::max(impl_->snapshot.kv_blocks_total, impl_->pending_kv_blocks);
    if (n_blocks < total) {
      return invalid_argument("the KV pool can only grow: it has (or is growing to) " + std::to_string(total) +
                              " blocks, asked for " + std::to_string(n_blocks));
    }
    if (n_blocks == total) return ok_status();
    impl_->pending_kv_blocks = n_blocks;
  }
  impl_->cv.notify_all();
  return ok_status();
}

size_t Engine::n_live() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->client_ids.size();
}

std::string Engine::fault() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->fault_reason;
}

EngineStatus Engine::status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->snapshot;
}

EngineProgress Engine::progress() const {
  EngineProgress p;
  p.steps = impl_->steps_done.load(std::memory_order_acquire);
  p.last_step = Clock::time_point(Clock::duration(impl_->last_step_ns.load(std::memory_order_acquire)));
  p.work = impl_->work.load(std::memory_order_relaxed);
  return p;
}

// ---------------------------------------------------------------------------------------------
// The loop

void Engine::Impl::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] {
        return stopping || !incoming.empty() || !aborts.empty() || !resumes.empty() || pending_kv_blocks > 0 ||
               pending_extension || scheduler.has_work();
      });
      if (stopping) break;
    }
    account_paused(Clock::now());  // before anything changes what paused requests hold
    apply_kv_growth();  // first, so this step's admissions already see the larger pool
    admit_and_abort();
    apply_resumes();
    apply_layer_extension();  // after admission: the requests it holds follow the new depth
    if (scheduler.has_work()) {
      step();
    } else {
      publish_queues();  // idle: queues and KV use after aborts
    }
  }
  // Shutdown: every live request ends with an explicit reason, and an extension still waiting
  // hears it was not applied.
  finish_async_copies();
  end_all(stop_reason, StatusCode::kUnavailable);
  std::unique_ptr<PendingExtension> unapplied;
  {
    std::lock_guard<std::mutex> lock(mu);
    unapplied.swap(pending_extension);
  }
  if (unapplied) unapplied->done.set_value(unavailable(stop_reason));
}

void Engine::Impl::end_all(const std::string& reason, StatusCode code) {
  std::vector<RequestId> ids;
  for (const auto& [id, unused] : live) ids.push_back(id);
  for (RequestId id : ids) end_request(id, live[id]->aborted(reason, code));
  // Submitted but not yet admitted: they never reach the scheduler.
  std::deque<std::pair<GenerationRequest, std::shared_ptr<RequestStream>>> queued;
  {
    std::lock_guard<std::mutex> lock(mu);
    queued.swap(incoming);
    for (const auto& [request, stream] : queued) client_ids.erase(request.client_id);
    work.fetch_sub(static_cast<int32_t>(queued.size()), std::memory_order_relaxed);
  }
  for (auto& [request, stream] : queued) {
    GenerationUpdate u;
    u.finish = FinishReason::kAborted;
    u.error = reason;
    u.error_code = code;
    stream->push(std::move(u));
  }
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
    const ExitRule& rule = request.exit;
    int32_t lookahead = exit_policy_traits(rule.policy).drafts ? rule.draft_tokens : 0;
    if (lookahead > 0 && rule.depth == model.n_layers_loaded()) lookahead = 1;  // the lookahead head drafts one
    scheduler.add({id, request.prompt, request.max_tokens, lookahead});
    live[id] = std::make_unique<LiveRequest>(std::move(request), std::move(stream), model);
  }
  for (const auto& [client_id, reason] : to_abort) {
    auto it = id_of_client.find(client_id);
    if (it != id_of_client.end() && live.count(it->second)) {
      end_request(it->second, live[it->second]->aborted(reason));
    }
  }
}

void Engine::Impl::apply_kv_growth() {
  int32_t target = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::swap(target, pending_kv_blocks);
  }
  const int32_t before = kv_manager.n_blocks();
  if (target <= before) return;
  if (Status st = kv.grow(target); !st.ok()) {
    spdlog::error("the KV pool stays at {} blocks: growing it to {} failed: {}", before, target, st.message());
    return;
  }
  kv_manager.grow_device(target);
  // The gauge before the snapshot: whoever sees the new total in status() sees it counted.
  if (metrics) metrics->kv_blocks_total->add(target - before);
  {
    std::lock_guard<std::mutex> lock(mu);
    snapshot.kv_blocks_total = target;
  }
  publish_queues();
  spdlog::info("the KV pool grew from {} to {} blocks", before, target);
}

void Engine::Impl::step() {
  const auto t0 = Clock::now();
  std::vector<BlockCopy> paused_out;
  const StepBudgets budgets = plan_paused(&paused_out);
  const SchedulerOutput out = scheduler.schedule(budgets);
  for (const RefusedRequest& refused : out.refused) {
    end_request(refused.id, live[refused.id]->aborted(refused.reason, StatusCode::kResourceExhausted));
  }
  for (RequestId id : out.evicted) live[id]->evicted = true;
  copy_swaps(out);
  // Paused KV leaving and resumed KV coming back, beside this step's forward pass.
  start_async_copies(std::move(paused_out), out.async_swap_in);
  if (out.empty()) {
    finish_async_copies();
    return;
  }

  // The blocks this plan holds are visible before any of its tokens reaches a client.
  publish_queues();
  // Self-speculative decodes with drafts run their own rounds, grouped by draft exit; all else
  // (a decode the budget left no drafts is a plain full-depth decode) is one batch.
  std::vector<size_t> batched;
  std::map<int32_t, std::vector<size_t>> speculative;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSequence& s = out.seqs[i];
    LiveRequest& r = *live[s.id];
    if (!r.first_scheduled) r.first_scheduled = Clock::now();
    if (s.n_lookahead > 0) {
      speculative[r.request.exit.depth].push_back(i);
    } else {
      batched.push_back(i);
    }
  }
  const auto t_forward = Clock::now();
  bool ok = batched.empty() || run_batch(out, batched);
  for (const auto& [draft_layer, members] : speculative) {
    if (ok) ok = run_speculative(out, draft_layer, members);
  }
  const double forward_seconds = std::max(1e-9, std::chrono::duration<double>(Clock::now() - t_forward).count());
  finish_async_copies();
  if (!ok) return;
  publish_prefix_blocks(out);
  account_step(out, forward_seconds);
  const double step_seconds = std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count());
  publish_step(out, step_seconds);
  if (spdlog::should_log(spdlog::level::debug)) {
    int32_t n_decode = 0;
    for (const ScheduledSequence& s : out.seqs) n_decode += s.n_tokens == 1 && s.samples;
    spdlog::debug("step: {} sequences ({} decodes), {} tokens, {} waiting; forward {:.1f} ms of {:.1f} ms",
                  out.seqs.size(), n_decode, out.n_batched_tokens, scheduler.n_waiting(), forward_seconds * 1e3,
                  step_seconds * 1e3);
  }
  last_step_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
  steps_done.fetch_add(1, std::memory_order_release);
}

void Engine::Impl::publish_prefix_blocks(const SchedulerOutput& out) {
  const int32_t depth = model.n_layers_loaded();
  for (const ScheduledSequence& s : out.seqs) {
    auto it = live.find(s.id);
    if (it == live.end() || s.n_lookahead > 0) continue;  // ended, or drafted (not a plain pass)
    const LiveRequest& r = *it->second;
    // A drafting request's generated rows ran speculative rounds: only its prompt is published.
    const bool drafts = exit_policy_traits(r.request.exit.policy).drafts;
    kv_manager.publish_blocks(s.id, *scheduler.tokens(s.id), s.start_pos + s.n_tokens, [&](int32_t p) {
      const int32_t exit = p < static_cast<int32_t>(r.exit_layer_at.size()) ? r.exit_layer_at[p] : 0;
      return exit == 0 || (!drafts && exit >= depth);  // 0: a prompt row, which ran the whole stack
    });
  }
}

void Engine::Impl::copy_swaps(const SchedulerOutput& out) {
  if (out.swap_out.empty() && out.swap_in.empty()) return;
  const auto t0 = Clock::now();
  const int64_t n = kv.words_per_block();
  for (const BlockCopy& c : out.swap_out) kv.read_block(c.from_block, swap_space.get() + c.to_block * n);
  for (const BlockCopy& c : out.swap_in) kv.write_block(c.to_block, swap_space.get() + c.from_block * n);
  // Every running request waits for these copies: the swap stall of the paper's equation 3.
  intercept_stats.waste_swap += std::chrono::duration<double>(Clock::now() - t0).count() * running_kv_bytes();
}

void Engine::Impl::end_request(RequestId id, GenerationUpdate final_update) {
  auto it = live.find(id);
  if (it == live.end()) return;
  LiveRequest& r = *it->second;
  if (r.paused) count_hold(r, id);  // before its blocks go: they say how it was held
  scheduler.abort(id);  // releases its blocks; a no-op when the scheduler already forgot it
  if (metrics) {
    metrics->finished(*registry, finish_reason_name(final_update.finish))->inc();
    metrics->prompt_tokens->inc(static_cast<double>(r.request.prompt.size()));
    if (r.first_token) {
      metrics->ttft->observe(final_update.ttft_seconds);
      if (r.n_generated() > 1) {
        metrics->tpot->observe((final_update.total_seconds - final_update.ttft_seconds) / (r.n_generated() - 1));
      }
    }
    metrics->e2e->observe(final_update.total_seconds);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    client_ids.erase(r.request.client_id);
    paused_clients.erase(r.request.client_id);
  }
  // Published before the client hears of the end, so a status read after it shows this request
  // counted and its blocks free.
  publish_queues();
  r.stream->push(std::move(final_update));
  id_of_client.erase(r.request.client_id);
  live.erase(it);
}

void Engine::Impl::fault(const Status& error) {
  // A device error poisons whatever the device holds: no request may get another token from it.
  const std::string reason = "internal error: " + error.message();
  {
    std::lock_guard<std::mutex> lock(mu);  // from now on submit() refuses
    if (fault_reason.empty()) fault_reason = reason;
  }
  // Reported before any client hears of it, so a health check after a failed call sees it.
  if (options.on_fault) options.on_fault(reason);
  end_all(reason, StatusCode::kInternal);
}

void Engine::Impl::publish_queues() {
  int64_t paused_device = 0, paused_host = 0;
  for (const PausedSequence& p : scheduler.paused()) {
    paused_device += p.device_blocks;
    paused_host += p.host_blocks;
  }
  intercept_stats.paused = static_cast<int32_t>(scheduler.n_paused());
  intercept_stats.paused_kv_bytes = paused_device * block_bytes();
  intercept_stats.swapped_kv_bytes = paused_host * block_bytes();
  intercept_stats.saturation_tokens = waste.forward.points().empty() ? 0 : waste.forward.saturation_tokens();
  intercept_stats.forward_profile = waste.forward.points();
  if (metrics) {
    metrics->paused->set(static_cast<double>(intercept_stats.paused));
    metrics->paused_kv_bytes->set(static_cast<double>(intercept_stats.paused_kv_bytes));
    const double totals[] = {intercept_stats.waste_preserve, intercept_stats.waste_recompute, intercept_stats.waste_swap};
    const char* causes[] = {"preserve", "recompute", "swap"};
    for (int i = 0; i < 3; ++i) {
      if (totals[i] > published_waste[i]) metrics->waste(*registry, causes[i])->inc(totals[i] - published_waste[i]);
      published_waste[i] = totals[i];
    }
    const PrefixCacheStats cache = kv_manager.prefix_cache_stats();
    metrics->cache_hit_tokens->inc(static_cast<double>(cache.hit_tokens - published_cache.hit_tokens));
    metrics->cache_query_tokens->inc(static_cast<double>(cache.query_tokens - published_cache.query_tokens));
    metrics->cache_hit_blocks->inc(static_cast<double>(cache.hit_blocks - published_cache.hit_blocks));
    metrics->cache_query_blocks->inc(static_cast<double>(cache.query_blocks - published_cache.query_blocks));
    metrics->cache_evictions->inc(static_cast<double>(cache.evictions - published_cache.evictions));
    metrics->cached_blocks->set(cache.cached_blocks);
    published_cache = cache;
    const GraphCounters graphs = model.backend().graph_counters();
    metrics->steps_replayed->inc(static_cast<double>(graphs.replayed - published_graphs.replayed));
    metrics->steps_captured->inc(static_cast<double>(graphs.captured - published_graphs.captured));
    metrics->steps_op_by_op->inc(static_cast<double>(graphs.run - published_graphs.run));
    published_graphs = graphs;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    snapshot.waiting = static_cast<int32_t>(scheduler.n_waiting());
    snapshot.running = static_cast<int32_t>(scheduler.n_running());
    snapshot.swapped = static_cast<int32_t>(scheduler.n_swapped());
    work.store(snapshot.waiting + snapshot.running + snapshot.swapped + static_cast<int32_t>(incoming.size()),
               std::memory_order_relaxed);
    snapshot.kv_blocks_used = kv_manager.n_used_blocks();
    snapshot.preemptions = scheduler.n_preemptions();
    snapshot.requests_total = requests_total;
    snapshot.generated_tokens_total = generated_total;
    snapshot.exit_layer_counts = exit_layer_counts;
    snapshot.layers_computed_total = layers_computed_total;
    snapshot.kv_fill_layers_total = kv_fill_layers_total;
    snapshot.draft_tokens_total = drafted_total;
    snapshot.draft_tokens_accepted = accepted_total;
    snapshot.intercepts = intercept_stats;
    snapshot.prefix_cache = kv_manager.prefix_cache_stats();
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
