// Intercepts in the engine loop: pausing a request after its step, holding its KV by its policy
// (min-waste decides per step from the waste model), the copies that run beside the step, resumes
// and ends, and the waste accounting (memory × time, by cause).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/engine_impl.h"

namespace helios {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int32_t blocks_for(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

}  // namespace

void Engine::Impl::profile_for_intercepts() {
  const int32_t bs = options.block_size;
  waste.kv_bytes_per_token = block_bytes() / bs;

  // Copy bandwidth: a few blocks to host and back, best of three.
  const int32_t n_copy = std::min(kv_manager.n_blocks(), 16);
  const int64_t words = kv.words_per_block();
  std::vector<float> host(static_cast<size_t>(n_copy) * words);
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    for (int32_t b = 0; b < n_copy; ++b) kv.read_block(b, host.data() + b * words);
    for (int32_t b = 0; b < n_copy; ++b) kv.write_block(b, host.data() + b * words);
    best = std::min(best, seconds_between(t0, Clock::now()));
  }
  if (best > 0) waste.copy_bytes_per_second = 2.0 * n_copy * block_bytes() / best;

  // Forward time by tokens: one sequence of n tokens over the first blocks (no request holds any
  // yet), best of two, doubling n while a pass takes under a second.
  const int32_t capacity = kv_manager.n_blocks() * bs;
  const int32_t max_tokens = std::min(options.scheduler.max_batched_tokens, capacity);
  BlockTable table;
  for (int32_t b = 0; b < blocks_for(max_tokens, bs); ++b) table.block_ids.push_back(b);
  const int32_t n_vocab = model.config().n_vocab;
  double spent = 0;
  for (int32_t n = 1; n <= max_tokens && options.intercepts.profile_at_start && spent < 2.0; n *= 2) {
    ForwardBatch batch;
    SequenceBatchEntry e;
    for (int32_t i = 0; i < n; ++i) e.tokens.push_back(static_cast<TokenId>((1 + 7919LL * i) % n_vocab));
    e.blocks = &table;
    batch.seqs.push_back(std::move(e));
    double t_best = std::numeric_limits<double>::infinity();
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = Clock::now();
      auto result = model.forward(batch, kv);
      if (!result.ok()) {
        spdlog::warn("intercepts: the forward profile stopped at {} tokens: {}", n, result.status().message());
        n = max_tokens + 1;
        break;
      }
      const double dt = seconds_between(t0, Clock::now());
      t_best = std::min(t_best, dt);
      spent += dt;
    }
    if (std::isfinite(t_best)) waste.forward.set_point(n, t_best);
  }
  intercept_stats.default_hold = options.intercepts.default_hold;
  intercept_stats.copy_bytes_per_second = waste.copy_bytes_per_second;
  // The profile and S reach the status with every publish_queues(), Engine::start's included.
  if (!waste.forward.points().empty()) {
    spdlog::info("intercepts: forward {:.2f} ms at 1 token, {:.2f} ms at {}; saturation S = {} tokens; copies {:.2f} GB/s",
                 waste.forward.seconds(1) * 1e3, waste.forward.points().back().second * 1e3,
                 waste.forward.points().back().first, waste.forward.saturation_tokens(),
                 waste.copy_bytes_per_second / 1e9);
  }
}

int64_t Engine::Impl::running_kv_bytes() const {
  int64_t paused_blocks = 0;
  for (const PausedSequence& p : scheduler.paused()) paused_blocks += p.device_blocks;
  return std::max<int64_t>(0, kv_manager.n_used_blocks() - paused_blocks) * block_bytes();
}

void Engine::Impl::account_paused(Clock::time_point now) {
  const double dt = seconds_between(last_account, now);
  if (dt <= 0) return;
  intercept_stats.kv_byte_seconds += static_cast<double>(kv_manager.n_blocks()) * block_bytes() * dt;
  for (const PausedSequence& p : scheduler.paused()) {
    const LiveRequest& r = *live.at(p.id);
    const double held = seconds_between(std::max(last_account, r.paused_at), now);
    if (held > 0) intercept_stats.waste_preserve += static_cast<double>(p.device_blocks) * block_bytes() * held;
  }
  last_account = now;
}

void Engine::Impl::account_step(const SchedulerOutput& out, double forward_seconds) {
  intercept_stats.forward_seconds += forward_seconds;
  if (out.n_batched_tokens <= 0) return;
  last_batch_tokens = out.n_batched_tokens;
  // Served steps refine the profile; without a start-up profile they make it.
  const auto& points = waste.forward.points();
  const bool near = std::any_of(points.begin(), points.end(), [&](const auto& p) {
    return p.first * 2 > out.n_batched_tokens * 3 / 2 && p.first < out.n_batched_tokens * 3 / 2 + 1;
  });
  if (near) {
    waste.forward.observe(out.n_batched_tokens, forward_seconds);
  } else {
    waste.forward.set_point(out.n_batched_tokens, forward_seconds);
  }
  if (out.n_recompute_tokens > 0) {
    // The recompute's share of the step: time the running requests' memory waited for it.
    const double extra = forward_seconds * out.n_recompute_tokens / out.n_batched_tokens;
    intercept_stats.recompute_seconds += extra;
    intercept_stats.waste_recompute += extra * running_kv_bytes();
  }
}

void Engine::Impl::pause_request(RequestId id, LiveRequest& r, GenerationUpdate update) {
  const HoldPolicy hold = r.request.intercept.hold.value_or(options.intercepts.default_hold);
  std::vector<BlockCopy> copies;
  scheduler.pause(id, hold, &copies);
  if (!copies.empty()) {
    // The swap baseline: the whole context to host now, while every running request waits.
    const auto t0 = Clock::now();
    const int64_t n = kv.words_per_block();
    for (const BlockCopy& c : copies) kv.read_block(c.from_block, swap_space.get() + c.to_block * n);
    intercept_stats.waste_swap += seconds_between(t0, Clock::now()) *
                                  static_cast<double>(running_kv_bytes() + copies.size() * block_bytes());
  }
  r.paused = true;
  r.evicted = false;
  r.paused_at = Clock::now();
  ++intercept_stats.intercepts_total;
  {
    std::lock_guard<std::mutex> lock(mu);
    paused_clients.insert(r.request.client_id);
  }
  publish_queues();  // the pause is visible in status before the client hears of it
  r.stream->push(std::move(update));
}

void Engine::Impl::count_hold(const LiveRequest& r, RequestId id) {
  const HoldPolicy hold = r.request.intercept.hold.value_or(options.intercepts.default_hold);
  const char* decision = r.evicted                          ? "evict"
                         : kv_manager.n_host_blocks(id) > 0   ? "swap"
                         : kv_manager.n_device_blocks(id) > 0 ? "preserve"
                                                              : "discard";
  ++intercept_stats.decisions[{hold_policy_name(hold), decision}];
  if (metrics) metrics->intercepts(*registry, hold_policy_name(hold), decision)->inc();
}

void Engine::Impl::apply_resumes() {
  std::vector<PendingResume> todo;
  {
    std::lock_guard<std::mutex> lock(mu);
    todo.swap(resumes);
  }
  for (PendingResume& p : todo) {
    auto it = id_of_client.find(p.client_id);
    if (it == id_of_client.end() || !live.count(it->second) || !live[it->second]->paused) continue;  // ended meanwhile
    const RequestId id = it->second;
    LiveRequest& r = *live[id];
    if (p.end) {
      end_request(id, r.ended_while_paused());
      continue;
    }
    count_hold(r, id);
    r.paused = false;
    r.evicted = false;
    r.output.start_segment(p.max_tokens);
    r.intercepts->start_segment();
    r.n_supplied += static_cast<int32_t>(p.tokens.size());
    scheduler.resume(id, p.tokens, p.max_tokens);
  }
  if (!todo.empty()) publish_queues();
}

StepBudgets Engine::Impl::plan_paused(std::vector<BlockCopy>* async_out) {
  StepBudgets budgets;
  const int32_t bs = options.block_size;
  waste.kv_bytes_per_token = block_bytes() / bs;  // M follows the loaded depth
  if (!waste.forward.points().empty()) budgets.saturation_tokens = waste.forward.saturation_tokens();
  const std::vector<PausedSequence> paused = scheduler.paused();
  const int64_t budget = waste.swap_budget_tokens(last_batch_tokens);

  const auto now = Clock::now();
  std::vector<PausedContext> contexts;
  int64_t want_out = 0, paused_host_blocks = 0;
  for (const PausedSequence& p : paused) {
    paused_host_blocks += p.host_blocks;
    if (p.hold != HoldPolicy::kMinWaste || p.device_blocks == 0) continue;
    const LiveRequest& r = *live.at(p.id);
    // T_INT: the kind's prior when the client named one, else how long it has been paused.
    double pause_seconds = seconds_between(r.paused_at, now);
    if (auto prior = options.intercepts.pause_priors.find(r.request.intercept.kind);
        prior != options.intercepts.pause_priors.end()) {
      pause_seconds = prior->second;
    }
    contexts.push_back({p.id, static_cast<int64_t>(p.device_blocks) * bs, p.context_tokens, pause_seconds});
    want_out += static_cast<int64_t>(p.device_blocks) * bs;
  }
  // Host blocks not held by paused requests belong to resumed (or preempted) ones on their way back.
  const int64_t host_used = options.n_swap_blocks - kv_manager.n_free_host_blocks();
  const int64_t want_in = std::max<int64_t>(0, host_used - paused_host_blocks) * bs;
  const SwapBudget split = split_swap_budget(budget, want_in, want_out,
                                             static_cast<int64_t>(kv_manager.n_free_host_blocks()) * bs,
                                             static_cast<int64_t>(kv_manager.n_free_blocks()) * bs);
  if (budget > 0) budgets.swap_in_blocks = std::max(want_in > 0 ? 1 : 0, blocks_for(split.in_tokens, bs));
  if (contexts.empty()) return budgets;

  const auto running = static_cast<int32_t>(scheduler.n_running());
  const int32_t chunk = std::max(bs, budgets.saturation_tokens - running);
  for (const HoldDecision& d : plan_min_waste(waste, std::move(contexts), scheduler.running_context_tokens(), chunk,
                                              split.out_tokens)) {
    if (d.action == HoldAction::kSwapOut) {
      scheduler.swap_out_paused(d.id, blocks_for(d.swap_tokens, bs), async_out);
    } else if (d.action == HoldAction::kDiscard) {
      scheduler.discard_paused(d.id);
    }
  }
  return budgets;
}

void Engine::Impl::start_async_copies(std::vector<BlockCopy> out, std::vector<BlockCopy> in) {
  if (out.empty() && in.empty()) return;
  async_out = std::move(out);
  async_in = std::move(in);
  // A copy thread: the blocks it reads and writes belong to no sequence this step computes.
  copies_in_flight = std::async(std::launch::async, [this] {
    const int64_t n = kv.words_per_block();
    for (const BlockCopy& c : async_out) kv.read_block(c.from_block, swap_space.get() + c.to_block * n);
    for (const BlockCopy& c : async_in) kv.write_block(c.to_block, swap_space.get() + c.from_block * n);
  });
}

void Engine::Impl::finish_async_copies() {
  if (copies_in_flight.valid()) {
    const auto t0 = Clock::now();
    copies_in_flight.get();
    // Copies the forward pass did not hide: the running requests wait for them.
    intercept_stats.waste_swap += seconds_between(t0, Clock::now()) * running_kv_bytes();
    async_out.clear();
    async_in.clear();
  }
  kv_manager.finish_async_copies();
}

}  // namespace helios
