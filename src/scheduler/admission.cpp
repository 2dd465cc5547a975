// Bringing sequences in: swapped ones back from host memory, then waiting ones (new requests
// and recompute victims), both strictly in arrival order.
#include <algorithm>
#include <vector>

#include "helios/scheduler.h"
#include "scheduler/sequence.h"

namespace helios {

void Scheduler::schedule_swapped(StepPlan& plan) {
  while (!swapped_.empty() && plan.budget_tokens > 0 &&
         static_cast<int32_t>(running_.size()) < limits_.max_seqs && plan.n_seqs() < limits_.max_seqs) {
    Sequence& seq = *find(swapped_.front());
    std::vector<BlockCopy> copies;
    if (seq.resumed_swap && kv_.n_host_blocks(seq.id) > 0) {
      // A resumed intercept: its blocks come back within the step's swap-in budget, beside the
      // step, and it runs once all are back. Later ones wait their turn (arrival order).
      if (plan.swap_in_blocks_left <= 0) return;
      const int32_t moved = kv_.swap_in_blocks(seq.id, std::min(plan.swap_in_blocks_left, kv_.n_host_blocks(seq.id)), &copies);
      plan.out.async_swap_in.insert(plan.out.async_swap_in.end(), copies.begin(), copies.end());
      plan.swap_in_blocks_left -= moved;
      if (moved > 0) return;
      // The device is full. With nothing running, only paused KV can give way.
      if (running_.empty() && evict_paused(plan)) continue;
      plan.kv_full = true;  // admit nobody ahead of it
      return;
    }
    if (!kv_.swap_in(seq.id, &copies)) {
      if (running_.empty() && evict_paused(plan)) continue;  // as above
      plan.kv_full = true;
      return;  // the device is full; try again next step
    }
    plan.out.swap_in.insert(plan.out.swap_in.end(), copies.begin(), copies.end());
    swapped_.pop_front();
    seq.resumed_swap = false;
    seq.status = SequenceStatus::kRunning;
    insert_by_arrival(running_, seq.id, sequences_);

    // Scheduled like a running sequence, its n_computed kept. If its next tokens do not fit it
    // stays running, unscheduled, and step 1 handles it next time.
    const int32_t n_take = chunk_tokens(seq, plan);
    if (n_take <= 0) continue;
    if (!kv_.reserve(seq.id, seq.n_computed + n_take)) {
      plan.kv_full = true;
      return;
    }
    plan_chunk(seq, n_take, StepPlan::kSwappedIn, plan);
  }
}

void Scheduler::admit_waiting(StepPlan& plan) {
  while (!waiting_.empty() && plan.budget_tokens > 0 &&
         static_cast<int32_t>(running_.size()) < limits_.max_seqs && plan.n_seqs() < limits_.max_seqs) {
    Sequence& seq = *find(waiting_.front());
    // A cached prefix is K/V already computed: the sequence starts after it (keeping its last
    // token to compute, whose row samples).
    const bool attached = seq.n_computed == 0 &&
                          (seq.n_computed = kv_.attach_cached_prefix(seq.id, seq.tokens, seq.n_tokens() - 1)) > 0;
    // A prompt longer than the budget left gets a first chunk now and the rest in later steps.
    const int32_t n_take = chunk_tokens(seq, plan);
    if (!kv_.reserve(seq.id, seq.n_computed + n_take)) {
      if (attached) {  // a waiting sequence holds no blocks
        kv_.release(seq.id);
        seq.n_computed = 0;
      }
      // With nothing running every device block is free but paused ones': a chunk that does not
      // fit once they are dropped never will.
      if (running_.empty() && evict_paused(plan)) continue;
      if (running_.empty() && !others_hold_blocks(seq)) {
        refuse(seq, seq.n_computed + n_take, plan);
        continue;
      }
      return;  // FCFS: nobody skips ahead
    }
    waiting_.pop_front();
    seq.status = SequenceStatus::kRunning;
    insert_by_arrival(running_, seq.id, sequences_);
    plan_chunk(seq, n_take, StepPlan::kAdmitted, plan);
  }
}

}  // namespace helios
