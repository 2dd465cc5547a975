// The scheduler's per-request state and one step's working state. Internal to src/scheduler/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <unordered_map>
#include <vector>

#include "helios/scheduler.h"

namespace helios {

struct Scheduler::Sequence {
  RequestId id = 0;
  uint64_t arrival = 0;                // FCFS order; kept across preemption
  std::vector<TokenId> tokens;         // prompt, then generated tokens
  int32_t n_prompt_tokens = 0;
  int32_t max_new_tokens = 0;          // the engine enforces it; bounds the lookahead
  int32_t lookahead = 0;               // tokens it may draft after a decode
  int32_t n_computed = 0;              // tokens whose KV is computed (or planned this step)
  SequenceStatus status = SequenceStatus::kWaiting;
  // Intercepts: how it is held while paused; in swapped_ after a resume (its blocks come back a
  // few per step, and it does not hold back admission as a preempted one does); the tokens below
  // which it recomputes a context an intercept discarded (chunked under min-waste).
  HoldPolicy hold = HoldPolicy::kPreserve;
  bool resumed_swap = false;
  int32_t recompute_until = 0;
  bool chunked_recompute = false;

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  // Tokens still to compute: 1 for a decode, more for a prefill (first time or after recompute).
  int32_t n_pending() const { return n_tokens() - n_computed; }
  int32_t n_generated() const { return n_tokens() - n_prompt_tokens; }
};

struct Scheduler::StepPlan {
  // Groups of ScheduledSequence, in the order the output lists them.
  enum Group { kDecode = 0, kPrefill = 1, kSwappedIn = 2, kAdmitted = 3 };
  struct Entry {
    ScheduledSequence seq;
    int group = kDecode;
  };

  int32_t budget_tokens = 0;           // left this step
  StepBudgets budgets;
  int32_t swap_in_blocks_left = 0;
  std::vector<Entry> entries;          // appended in arrival order within each group
  SchedulerOutput out;                 // swap copies and preempted ids, filled as we go
  bool preempted = false;              // a preemption happened: admit nothing new this step
  bool kv_full = false;                // a swapped-in sequence did not fit: admit nothing new

  int32_t n_seqs() const { return static_cast<int32_t>(entries.size()); }
  bool planned(RequestId id) const {
    return std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.seq.id == id; });
  }
};

// Inserts id into a queue kept in arrival order (a preempted sequence goes back ahead of later
// arrivals). Linear, from the back: queues are short and most inserts land at the end.
template <typename Queue, typename SequenceMap>
void insert_by_arrival(Queue& queue, RequestId id, const SequenceMap& sequences) {
  const uint64_t arrival = sequences.at(id)->arrival;
  auto pos = queue.end();
  while (pos != queue.begin() && sequences.at(*std::prev(pos))->arrival > arrival) --pos;
  queue.insert(pos, id);
}

}  // namespace helios
