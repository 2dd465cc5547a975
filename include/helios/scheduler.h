// Iteration-level scheduling (continuous batching). A value in, a value out: the scheduler decides
// which sequences run this step and how many of their tokens; it never touches a device.
//
// There is no "prefill phase" or "decode phase": every sequence has tokens (prompt, then the
// tokens generated so far) and a count of tokens whose KV is computed; each step lets the count
// catch up, within a token budget and the free KV blocks. A long prompt is computed in chunks, so
// it never stalls the sequences that are decoding.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "helios/config.h"
#include "helios/tokenizer.h"

namespace helios {

using RequestId = uint64_t;

// A host block and a device block, for swap copies.
struct BlockCopy {
  int32_t from_block = 0;
  int32_t to_block = 0;
};

// What the scheduler needs from the KV cache: block bookkeeping per request. The engine's
// implementation owns the block tables; tests use a fake.
class KvManager {
 public:
  virtual ~KvManager() = default;
  virtual int32_t block_size() const = 0;
  virtual int32_t n_free_blocks() const = 0;   // device blocks; may change between steps
  // Grows the request's device blocks to hold n_tokens; false and no change when too few are free.
  virtual bool reserve(RequestId id, int32_t n_tokens) = 0;
  // Frees every block of the request (device and host).
  virtual void release(RequestId id) = 0;
  // Swap: move the request's device blocks to host swap space (false when it has no room), and
  // back (false when the device has too few free blocks). The returned copies must be done
  // before the step runs.
  virtual bool swap_out(RequestId id, std::vector<BlockCopy>* copies) = 0;
  virtual bool swap_in(RequestId id, std::vector<BlockCopy>* copies) = 0;
};

struct SchedulerLimits {
  int32_t max_batched_tokens = 512;  // tokens computed per step, all sequences together
  int32_t max_seqs = 64;             // sequences per step
  PreemptionMode preemption = PreemptionMode::kRecompute;
};

struct NewRequest {
  RequestId id = 0;
  std::vector<TokenId> prompt;       // not empty
  int32_t max_new_tokens = 0;        // > 0
};

// One sequence's work in a step: compute tokens [start_pos, start_pos + n_tokens).
struct ScheduledSequence {
  RequestId id = 0;
  int32_t start_pos = 0;
  int32_t n_tokens = 0;
  bool samples = false;  // the chunk reaches the last known token: the step samples a new one
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> seqs;      // decodes first, then prefill chunks, in arrival order
  std::vector<BlockCopy> swap_out;          // device → host, before the step
  std::vector<BlockCopy> swap_in;           // host → device, before the step
  std::vector<RequestId> preempted;         // lost their KV (recompute) or were swapped out
  int32_t n_batched_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

enum class SequenceStatus { kWaiting, kRunning, kSwapped };

class Scheduler {
 public:
  Scheduler(const SchedulerLimits& limits, KvManager& kv);

  // Queues a request (FCFS by the order of add()). The caller has validated it.
  void add(NewRequest request);
  // Forgets a request in any state and releases its blocks; false if unknown.
  bool abort(RequestId id);
  // Plans one step.
  SchedulerOutput schedule();
  // After the step: each sampled token joins its sequence (and counts as generated).
  void append_token(RequestId id, TokenId token);
  // The engine decided the request is done (EOS, stop, length, cancelled): release it.
  void finish(RequestId id);

  size_t n_waiting() const;
  size_t n_running() const;
  size_t n_swapped() const;
  int64_t n_preemptions() const { return n_preemptions_; }
  bool has_work() const { return !sequences_.empty(); }
  // Tokens so far (prompt + generated) of a live request; nullptr if unknown.
  const std::vector<TokenId>* tokens(RequestId id) const;
  int32_t n_generated(RequestId id) const;

 private:
  struct Sequence;
  // ... implementation-defined members
  SchedulerLimits limits_;
  KvManager& kv_;
  int64_t n_preemptions_ = 0;
  uint64_t next_arrival_ = 0;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> sequences_;
  std::deque<RequestId> waiting_;   // arrival order; preempted sequences go back in order
  std::vector<RequestId> running_;  // arrival order
  std::deque<RequestId> swapped_;   // arrival order
};

}  // namespace helios
