// Helpers shared by the scheduler tests.
#pragma once

#include <cstdint>
#include <vector>

#include "helios/scheduler.h"

namespace helios::testing {

inline SchedulerLimits make_limits(int32_t max_batched_tokens, int32_t max_seqs = 64,
                                   PreemptionMode mode = PreemptionMode::kRecompute) {
  SchedulerLimits limits;
  limits.max_batched_tokens = max_batched_tokens;
  limits.max_seqs = max_seqs;
  limits.preemption = mode;
  return limits;
}

// A request whose prompt is n_prompt distinct tokens derived from its id.
inline NewRequest make_request(RequestId id, int32_t n_prompt, int32_t max_new_tokens = 16) {
  NewRequest request;
  request.id = id;
  for (int32_t i = 0; i < n_prompt; ++i) request.prompt.push_back(static_cast<TokenId>(id * 1000 + i));
  request.max_new_tokens = max_new_tokens;
  return request;
}

// Plays the engine after a step: every sampling sequence gets one token.
inline void append_samples(Scheduler& scheduler, const SchedulerOutput& out, TokenId token = 7) {
  for (const ScheduledSequence& s : out.seqs) {
    if (s.samples) scheduler.append_token(s.id, token);
  }
}

inline std::vector<RequestId> ids_of(const SchedulerOutput& out) {
  std::vector<RequestId> ids;
  for (const ScheduledSequence& s : out.seqs) ids.push_back(s.id);
  return ids;
}

inline const ScheduledSequence* find_seq(const SchedulerOutput& out, RequestId id) {
  for (const ScheduledSequence& s : out.seqs) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

}  // namespace helios::testing
