// Paused sequences (intercepts): leaving the batch, how their KV is held, and going on.
#include <algorithm>
#include <cassert>
#include <numeric>
#include <vector>

#include "helios/scheduler.h"
#include "scheduler/sequence.h"

namespace helios {

void Scheduler::pause(RequestId id, HoldPolicy hold, std::vector<BlockCopy>* swap_out) {
  Sequence* seq = find(id);
  assert(seq != nullptr && seq->status == SequenceStatus::kRunning);
  std::erase(running_, id);
  seq->status = SequenceStatus::kPaused;
  seq->hold = hold;
  insert_by_arrival(paused_, id, sequences_);
  switch (hold) {
    case HoldPolicy::kDiscard:
    case HoldPolicy::kImprovedDiscard: discard_paused(id); break;
    case HoldPolicy::kSwap:
      // Whole, at once: the baseline the paper measures. No host room: it stays on the device.
      if (!kv_.swap_out(id, swap_out)) seq->hold = HoldPolicy::kPreserve;
      break;
    case HoldPolicy::kPreserve:
    case HoldPolicy::kMinWaste: break;
  }
}

bool Scheduler::resume(RequestId id, const std::vector<TokenId>& appended, int32_t max_new_tokens) {
  Sequence* seq = find(id);
  if (seq == nullptr || seq->status != SequenceStatus::kPaused) return false;
  std::erase(paused_, id);
  seq->tokens.insert(seq->tokens.end(), appended.begin(), appended.end());
  seq->n_prompt_tokens += static_cast<int32_t>(appended.size());  // supplied, not generated
  seq->max_new_tokens = seq->n_generated() + max_new_tokens;
  if (kv_.n_host_blocks(id) > 0) {
    seq->status = SequenceStatus::kSwapped;
    // Min-waste's blocks come back a few per step; swap's all at once, as a preempted sequence's.
    seq->resumed_swap = seq->hold == HoldPolicy::kMinWaste;
    insert_by_arrival(swapped_, id, sequences_);
  } else if (seq->n_computed > 0) {
    seq->status = SequenceStatus::kRunning;
    insert_by_arrival(running_, id, sequences_);
  } else {
    seq->status = SequenceStatus::kWaiting;
    // vLLM's discard treats the rest of the generation as a new request: the tail of the queue.
    if (seq->hold == HoldPolicy::kDiscard) seq->arrival = next_arrival_++;
    insert_by_arrival(waiting_, id, sequences_);
  }
  return true;
}

std::vector<PausedSequence> Scheduler::paused() const {
  std::vector<PausedSequence> out;
  for (RequestId id : paused_) {
    const Sequence& seq = *find(id);
    out.push_back({id, seq.hold, kv_.n_device_blocks(id), kv_.n_host_blocks(id), seq.n_tokens()});
  }
  return out;
}

void Scheduler::discard_paused(RequestId id) {
  Sequence* seq = find(id);
  assert(seq != nullptr && seq->status == SequenceStatus::kPaused);
  kv_.release(id);
  // What it had computed is computed again on resume, in chunks under min-waste.
  seq->recompute_until = std::max(seq->recompute_until, seq->n_computed);
  seq->chunked_recompute = seq->hold == HoldPolicy::kMinWaste;
  seq->n_computed = 0;
}

int32_t Scheduler::swap_out_paused(RequestId id, int32_t n_blocks, std::vector<BlockCopy>* copies) {
  assert(find(id) != nullptr && find(id)->status == SequenceStatus::kPaused);
  return n_blocks > 0 ? kv_.swap_out_blocks(id, n_blocks, copies) : 0;
}

int64_t Scheduler::running_context_tokens() const {
  return std::accumulate(running_.begin(), running_.end(), int64_t{0},
                         [&](int64_t sum, RequestId id) { return sum + find(id)->n_computed; });
}

size_t Scheduler::n_paused() const { return paused_.size(); }

bool Scheduler::evict_paused(StepPlan& plan) {
  for (auto it = paused_.rbegin(); it != paused_.rend(); ++it) {
    if (kv_.n_device_blocks(*it) == 0) continue;
    discard_paused(*it);
    plan.out.evicted.push_back(*it);
    return true;
  }
  return false;
}

bool Scheduler::others_hold_blocks(const Sequence& seq) const {
  int32_t running_blocks = 0;
  for (RequestId id : running_) running_blocks += kv_.n_device_blocks(id);
  if (seq.status != SequenceStatus::kRunning) running_blocks += kv_.n_device_blocks(seq.id);
  return kv_.n_blocks() - kv_.n_free_blocks() - running_blocks > 0;
}

int32_t Scheduler::chunk_tokens(const Sequence& seq, const StepPlan& plan) const {
  int32_t n = std::min(seq.n_pending(), plan.budget_tokens);
  if (seq.chunked_recompute && seq.n_computed < seq.recompute_until && plan.budgets.saturation_tokens > 0) {
    // INFERCEPT: chunks of S minus the running batch, so the recompute rides along with the
    // decodes instead of stretching the step; at least a block, so it always progresses.
    const auto decodes = static_cast<int32_t>(std::count_if(plan.entries.begin(), plan.entries.end(), [](const auto& e) {
      return e.group == StepPlan::kDecode;
    }));
    n = std::min(n, std::max(kv_.block_size(), plan.budgets.saturation_tokens - decodes));
  }
  return n;
}

}  // namespace helios
