// The scheduler's queues and the step outline: running → swapped back in → admitted.
// Preemption lives in preemption.cpp, swap-in and admission in admission.cpp.
#include "helios/scheduler.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "scheduler/sequence.h"

namespace helios {

Scheduler::Scheduler(const SchedulerLimits& limits, KvManager& kv) : limits_(limits), kv_(kv) {}

Scheduler::~Scheduler() = default;

// ---- Request lifecycle ---------------------------------------------------------------------

void Scheduler::add(NewRequest request) {
  assert(!request.prompt.empty() && sequences_.count(request.id) == 0);
  auto seq = std::make_unique<Sequence>();
  seq->id = request.id;
  seq->arrival = next_arrival_++;
  seq->n_prompt_tokens = static_cast<int32_t>(request.prompt.size());
  seq->tokens = std::move(request.prompt);
  seq->max_new_tokens = request.max_new_tokens;
  seq->lookahead = request.lookahead;
  sequences_.emplace(request.id, std::move(seq));
  waiting_.push_back(request.id);  // the newest arrival always goes last
}

bool Scheduler::abort(RequestId id) {
  if (find(id) == nullptr) return false;
  forget(id);
  return true;
}

void Scheduler::append_token(RequestId id, TokenId token) {
  Sequence* seq = find(id);
  if (seq == nullptr) return;  // aborted between the step and its results
  // The step computed up to the old end (n_computed == old size); the new token is the one
  // pending token the next step computes, as a decode.
  seq->tokens.push_back(token);
}

void Scheduler::append_speculated(RequestId id, const std::vector<TokenId>& tokens) {
  Sequence* seq = find(id);
  if (seq == nullptr || tokens.empty()) return;
  seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
  seq->n_computed += static_cast<int32_t>(tokens.size()) - 1;
}

void Scheduler::forget(RequestId id) {
  Sequence* seq = find(id);
  switch (seq->status) {
    case SequenceStatus::kWaiting: std::erase(waiting_, id); break;
    case SequenceStatus::kRunning: std::erase(running_, id); break;
    case SequenceStatus::kSwapped: std::erase(swapped_, id); break;
    case SequenceStatus::kPaused: std::erase(paused_, id); break;
  }
  kv_.release(id);  // a waiting sequence holds none; releasing nothing is harmless
  sequences_.erase(id);
}

// ---- Observability -------------------------------------------------------------------------

size_t Scheduler::n_waiting() const { return waiting_.size(); }
size_t Scheduler::n_running() const { return running_.size(); }
size_t Scheduler::n_swapped() const { return swapped_.size(); }

const std::vector<TokenId>* Scheduler::tokens(RequestId id) const {
  const Sequence* seq = find(id);
  return seq == nullptr ? nullptr : &seq->tokens;
}

int32_t Scheduler::n_generated(RequestId id) const {
  const Sequence* seq = find(id);
  return seq == nullptr ? 0 : seq->n_tokens() - seq->n_prompt_tokens;
}

Scheduler::Sequence* Scheduler::find(RequestId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

// ---- One step ------------------------------------------------------------------------------

SchedulerOutput Scheduler::schedule(const StepBudgets& budgets) {
  StepPlan plan;
  plan.budget_tokens = limits_.max_batched_tokens;
  plan.budgets = budgets;
  plan.swap_in_blocks_left = budgets.swap_in_blocks;
  schedule_running(plan, /*decodes=*/true);
  schedule_running(plan, /*decodes=*/false);
  // After a preemption the KV is short: bringing back or admitting anyone would only evict again.
  if (!plan.preempted) schedule_swapped(plan);
  // Swapped sequences come first: admitting newer work would keep them out for good. A resumed
  // sequence coming back a few blocks a step does not hold admission back (its copies use the
  // swap budget, not the step's compute); one that finds the device full does (kv_full).
  const bool preempted_swapped = std::any_of(swapped_.begin(), swapped_.end(), [&](RequestId id) {
    return !find(id)->resumed_swap;
  });
  if (!plan.preempted && !plan.kv_full && !preempted_swapped) admit_waiting(plan);
  grant_lookahead(plan);

  std::stable_sort(plan.entries.begin(), plan.entries.end(),
                   [](const StepPlan::Entry& a, const StepPlan::Entry& b) { return a.group < b.group; });
  SchedulerOutput out = std::move(plan.out);
  for (const StepPlan::Entry& entry : plan.entries) {
    // The computed-token rule: the plan counts as computed once handed out (see scheduler.h).
    Sequence& seq = *find(entry.seq.id);
    if (seq.n_computed < seq.recompute_until) {
      out.n_recompute_tokens += std::min(entry.seq.n_tokens, seq.recompute_until - seq.n_computed);
    }
    seq.n_computed += entry.seq.n_tokens;
    out.seqs.push_back(entry.seq);
    out.n_batched_tokens += entry.seq.n_tokens + entry.seq.n_lookahead;
  }
  return out;
}

void Scheduler::schedule_running(StepPlan& plan, bool decodes) {
  // A copy: preemption and refusal remove entries from running_ while we walk it.
  const std::vector<RequestId> running = running_;
  for (RequestId id : running) {
    Sequence* seq = find(id);
    if (seq == nullptr || seq->status != SequenceStatus::kRunning) continue;  // preempted or refused
    if ((seq->n_pending() == 1) != decodes) continue;
    if (plan.n_seqs() >= limits_.max_seqs) break;
    const int32_t n_take = chunk_tokens(*seq, plan);
    if (n_take <= 0) continue;  // out of budget, or nothing to compute yet
    if (!reserve_or_preempt(*seq, seq->n_computed + n_take, plan)) continue;
    plan_chunk(*seq, n_take, decodes ? StepPlan::kDecode : StepPlan::kPrefill, plan);
  }
}

void Scheduler::grant_lookahead(StepPlan& plan) {
  for (StepPlan::Entry& entry : plan.entries) {  // arrival order within the decodes
    if (plan.budget_tokens <= 0) return;
    ScheduledSequence& chunk = entry.seq;
    const Sequence& seq = *find(chunk.id);
    if (seq.lookahead <= 0 || !chunk.samples || chunk.n_tokens != 1) continue;
    // The round emits up to n + 1 tokens: never past max_new_tokens.
    const int32_t n = std::min({seq.lookahead, seq.max_new_tokens - seq.n_generated() - 1, plan.budget_tokens});
    if (n <= 0 || !kv_.reserve(seq.id, chunk.start_pos + 1 + n)) continue;
    chunk.n_lookahead = n;
    plan.budget_tokens -= n;
  }
}

void Scheduler::refuse(Sequence& seq, int32_t n_tokens, StepPlan& plan) {
  const RequestId id = seq.id;
  forget(id);  // nothing else holds device blocks now: the free blocks are the whole cache
  const int32_t capacity = kv_.n_free_blocks() * kv_.block_size();
  plan.out.refused.push_back(
      {id, "the KV cache cannot hold this request: it needs room for " + std::to_string(n_tokens) +
               " tokens (prompt and generated so far) and the whole cache holds " + std::to_string(capacity) +
               "; send a shorter prompt or a lower max_tokens, or give the server a larger KV cache"});
}
void Scheduler::plan_chunk(const Sequence& seq, int32_t n_tokens, int group, StepPlan& plan) const {
  ScheduledSequence chunk;
  chunk.id = seq.id;
  chunk.start_pos = seq.n_computed;
  chunk.n_tokens = n_tokens;
  chunk.samples = seq.n_computed + n_tokens == seq.n_tokens();
  plan.entries.push_back({chunk, group});
  plan.budget_tokens -= n_tokens;
}

}  // namespace helios
