// Preemption: when the KV cannot grow, the latest-arrived running sequence gives up its blocks.
// Latest first keeps FCFS: the oldest requests keep making progress, so every request that fits
// the KV on its own finishes.
#include <cassert>
#include <deque>
#include <vector>

#include "helios/scheduler.h"
#include "scheduler/sequence.h"

namespace helios {

bool Scheduler::reserve_or_preempt(Sequence& seq, int32_t n_tokens, StepPlan& plan) {
  while (!kv_.reserve(seq.id, n_tokens)) {
    if (running_.size() == 1 && evict_paused(plan)) continue;  // paused KV gives way to work
    if (running_.size() == 1 && others_hold_blocks(seq)) {
      preempt(seq, plan);  // what holds the rest frees it by itself: wait for it
      return false;
    }
    if (running_.size() == 1) {  // alone in the cache, and still too large: it never fits
      refuse(seq, n_tokens, plan);
      return false;
    }
    // The latest arrival not yet planned this step gives up its blocks (running_ is in arrival
    // order). Decodes are planned first and in arrival order, so a decode's victims are always
    // unplanned; a prefill chunk never evicts a planned decode.
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend() && victim == nullptr; ++it) {
      if (!plan.planned(*it)) victim = find(*it);
    }
    assert(victim != nullptr);  // seq itself is unplanned
    // A prefill chunk that would have to evict itself waits, keeping what it computed.
    if (victim == &seq && seq.n_pending() > 1 && plan.n_seqs() > 0) return false;
    preempt(*victim, plan);
    if (victim == &seq) return false;
  }
  return true;
}

void Scheduler::preempt(Sequence& victim, StepPlan& plan) {
  // Victims are never planned this step: its n_computed is exactly what its KV holds.
  std::erase(running_, victim.id);
  ++n_preemptions_;
  plan.preempted = true;
  plan.out.preempted.push_back(victim.id);

  if (limits_.preemption == PreemptionMode::kSwap) {
    std::vector<BlockCopy> copies;
    if (kv_.swap_out(victim.id, &copies)) {
      plan.out.swap_out.insert(plan.out.swap_out.end(), copies.begin(), copies.end());
      victim.status = SequenceStatus::kSwapped;
      insert_by_arrival(swapped_, victim.id, sequences_);
      return;
    }
    // No host room: fall through to recompute.
  }
  preempt_by_recompute(victim);
}

void Scheduler::recompute_all() {
  // Copies: preempt_by_recompute() inserts into waiting_ as it goes.
  const std::vector<RequestId> running = running_;
  const std::deque<RequestId> swapped = swapped_;
  running_.clear();
  swapped_.clear();
  for (RequestId id : running) preempt_by_recompute(*find(id));
  for (RequestId id : swapped) preempt_by_recompute(*find(id));
  // Paused ones stay paused, without KV: they recompute when they resume.
  for (RequestId id : paused_) {
    kv_.release(id);
    find(id)->n_computed = 0;
  }
}

void Scheduler::preempt_by_recompute(Sequence& victim) {
  // The whole token list (prompt + generated so far) becomes the prefill to compute again; a
  // greedy model then samples the same next token as if nothing had happened.
  kv_.release(victim.id);
  victim.n_computed = 0;
  victim.status = SequenceStatus::kWaiting;
  insert_by_arrival(waiting_, victim.id, sequences_);
}

}  // namespace helios
