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
#include <string>
#include <unordered_map>
#include <vector>

#include "helios/config.h"
#include "helios/intercept.h"
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
  virtual int32_t n_blocks() const = 0;        // device blocks in all
  // Grows the request's device blocks to hold n_tokens; false and no change when too few are free.
  virtual bool reserve(RequestId id, int32_t n_tokens) = 0;
  // Frees every block of the request (device and host).
  virtual void release(RequestId id) = 0;
  // Swap: move the request's device blocks to host swap space (false when it has no room), and
  // back (false when the device has too few free blocks). The returned copies must be done
  // before the step runs.
  virtual bool swap_out(RequestId id, std::vector<BlockCopy>* copies) = 0;
  virtual bool swap_in(RequestId id, std::vector<BlockCopy>* copies) = 0;

  // Intercepts: a paused request's KV moves to host and back a few blocks per step, the copies
  // running beside the step. In position order a request's blocks are its device blocks, then its
  // host blocks. swap_out_blocks moves up to n of its last device blocks to host, swap_in_blocks
  // up to n of its first host blocks to the device; each returns how many moved (fewer when the
  // other side has too few free blocks). The blocks they give up are not free again until
  // finish_async_copies(), called once the step's copies are done.
  virtual int32_t swap_out_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) = 0;
  virtual int32_t swap_in_blocks(RequestId id, int32_t n, std::vector<BlockCopy>* copies) = 0;
  virtual void finish_async_copies() = 0;
  virtual int32_t n_device_blocks(RequestId id) const = 0;
  virtual int32_t n_host_blocks(RequestId id) const = 0;
  virtual int32_t n_free_host_blocks() const = 0;

  // Prefix caching: gives a request that holds no blocks the cached blocks of its longest cached
  // prefix of whole blocks, within max_tokens of `tokens`; returns the tokens they cover (0 when
  // none, or without a cache). Their K/V is computed: the request starts after them.
  virtual int32_t attach_cached_prefix(RequestId id, const std::vector<TokenId>& tokens, int32_t max_tokens) {
    (void)id, (void)tokens, (void)max_tokens;
    return 0;
  }
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
  int32_t lookahead = 0;             // tokens it may draft after each decode (self-speculative)
};

// One sequence's work in a step: compute tokens [start_pos, start_pos + n_tokens).
struct ScheduledSequence {
  RequestId id = 0;
  int32_t start_pos = 0;
  int32_t n_tokens = 0;
  bool samples = false;  // the chunk reaches the last known token: the step samples a new one
  // KV reserved past the chunk for this many drafted tokens (a decode of a request with a
  // lookahead; 0 when the budget or the free blocks left none). They count against the budget.
  int32_t n_lookahead = 0;
};

// A request that can never be scheduled: alone in an empty cache it still does not fit. The
// scheduler has forgotten it (and released its blocks); the engine ends it with `reason`.
struct RefusedRequest {
  RequestId id = 0;
  std::string reason;
};

// What a step may spend on intercepted requests (the engine's min-waste planning).
struct StepBudgets {
  // Host blocks of resumed requests that may come back to the device this step (their copies
  // run beside the step); the request runs once all of its blocks are back.
  int32_t swap_in_blocks = 1 << 30;
  // The paper's saturation point S: a discarded context is recomputed in chunks of S minus the
  // step's decodes (at least one block), mixed with them. 0: in one go, within the token budget.
  int32_t saturation_tokens = 0;
};

// A paused request, for the engine's min-waste planning.
struct PausedSequence {
  RequestId id = 0;
  HoldPolicy hold = HoldPolicy::kPreserve;
  int32_t device_blocks = 0;
  int32_t host_blocks = 0;
  int32_t context_tokens = 0;  // its tokens (the trigger's included)
};

struct SchedulerOutput {
  // Running decodes first, then running prefill chunks, then sequences swapped back in, then
  // newly admitted ones; arrival order within each group.
  std::vector<ScheduledSequence> seqs;
  std::vector<BlockCopy> swap_out;          // device → host, before the step
  std::vector<BlockCopy> swap_in;           // host → device, before the step
  std::vector<RequestId> preempted;         // lost their KV (recompute) or were swapped out
  std::vector<RefusedRequest> refused;      // can never fit; forgotten
  // Copies that run beside the step (resumed requests' blocks coming back); done before the next
  // schedule(), then KvManager::finish_async_copies().
  std::vector<BlockCopy> async_swap_in;
  // Paused requests whose KV was dropped because running work needed the memory (any policy).
  std::vector<RequestId> evicted;
  // Tokens of this step that recompute a context an intercept discarded.
  int32_t n_recompute_tokens = 0;
  int32_t n_batched_tokens = 0;             // chunk tokens and lookahead, all sequences
  bool empty() const { return seqs.empty(); }
};

enum class SequenceStatus { kWaiting, kRunning, kSwapped, kPaused };

// One step, in order (see src/scheduler/):
//  1. Running sequences: decodes first (one pending token each), then prefill chunks (a prompt,
//     or a recompute victim's tokens, still being computed), each in arrival order, so an older
//     sequence in prefill never takes the budget from the sequences that are decoding. Each takes
//     min(n_tokens - n_computed, budget) tokens and reserves KV for n_computed + that many. When
//     the KV is full the latest-arrived running sequence that is not yet planned this step is
//     preempted (possibly the one asking), until the reservation fits; a sequence that is alone
//     and still does not fit is refused (output.refused).
//     Recompute: its blocks are released, n_computed = 0, and it rejoins the waiting queue in
//     arrival order; its whole token list (prompt + generated) is then computed again as a
//     prefill (the engine replays each generated token's exit layer, so the output does not
//     change). Swap: its blocks move to host swap space (output.swap_out) and n_computed is kept;
//     with no swap room it falls back to recompute.
//  2. Only when nothing was preempted this step: swapped sequences, arrival order, move back
//     (output.swap_in) and are scheduled like running ones.
//  3. Only when nothing was preempted and nothing is left swapped: waiting sequences, arrival
//     order, are admitted while the token budget, max_seqs and the KV allow; a prompt longer than
//     the budget is computed in chunks over several steps. Admission stops at the first one that
//     does not fit (FCFS: no skipping ahead); one that cannot fit even in an empty cache is
//     refused.
//  4. What budget is left goes to the lookahead of planned decodes, arrival order, each within
//     its request's max_new_tokens and the free KV blocks (never by preempting).
//
// The computed-token rule: schedule() advances each scheduled sequence's n_computed by its
// n_tokens when it returns the plan (the engine always runs a plan before the next schedule()).
// The engine then calls append_token() for every sequence with samples = true; a chunk with
// samples = false needs no call. So n_computed <= tokens.size() always holds, and a sequence
// needs work exactly while n_computed < tokens.size().
//
// The KvManager is asked only about running sequences' growth, preemption victims and swapped
// sequences; a waiting sequence holds no blocks. Not thread-safe: one engine loop calls it.
class Scheduler {
 public:
  Scheduler(const SchedulerLimits& limits, KvManager& kv);
  ~Scheduler();

  // Queues a request (FCFS by the order of add()). The caller has validated it.
  void add(NewRequest request);
  // Forgets a request in any state and releases its blocks; false if unknown.
  bool abort(RequestId id);
  // Every running and swapped sequence gives up its blocks (device and host) and goes back to
  // waiting, in arrival order, keeping its tokens: it is computed again as a prefill (recompute).
  // Between steps only. For a change under every sequence's KV (the engine's model grew deeper);
  // not counted in n_preemptions(), which counts KV pressure.
  void recompute_all();
  // Plans one step.
  SchedulerOutput schedule(const StepBudgets& budgets = {});

  // ---- Intercepts (helios/intercept.h)
  // After its step, a running sequence whose last token (pending) paused it leaves the batch;
  // its KV is held by `hold`: discard and improved-discard release it now, preserve and
  // min-waste keep it (min-waste then decides per step, by the calls below), swap moves every
  // block to host now (`swap_out` gets the copies, to do before the next step; with too little
  // host room it is preserved). A paused sequence never runs and is never a preemption victim;
  // when running work cannot fit otherwise, the latest-arrived paused sequence holding device
  // blocks loses its KV (SchedulerOutput::evicted).
  void pause(RequestId id, HoldPolicy hold, std::vector<BlockCopy>* swap_out);
  // The paused sequence goes on: `appended` joins its tokens after the trigger, and it may
  // generate up to max_new_tokens more (bounds its lookahead). Where its KV is
  // decides its queue: all on the device → running; some on host → swapped (arrival order; it
  // runs once the rest is back); none → waiting, as a new arrival at the tail for discard, at
  // its original arrival for the others. False if id is not paused.
  bool resume(RequestId id, const std::vector<TokenId>& appended, int32_t max_new_tokens);
  std::vector<PausedSequence> paused() const;
  // Min-waste's decisions for one paused sequence: drop its KV (device and host; it recomputes on
  // resume), or move up to n_blocks of its device blocks to host beside the next step (returns
  // how many; the copies go to `copies`).
  void discard_paused(RequestId id);
  int32_t swap_out_paused(RequestId id, int32_t n_blocks, std::vector<BlockCopy>* copies);
  // Tokens of running sequences' KV (C_other of the waste equations).
  int64_t running_context_tokens() const;
  size_t n_paused() const;
  // After the step: each sampled token joins its sequence (and counts as generated).
  void append_token(RequestId id, TokenId token);
  // After a self-speculative step that computed the scheduled token and the first
  // tokens.size() - 1 of `tokens` as well (at most n_lookahead + 1 tokens): all join the
  // sequence, the last one pending.
  void append_speculated(RequestId id, const std::vector<TokenId>& tokens);

  size_t n_waiting() const;
  size_t n_running() const;
  size_t n_swapped() const;
  int64_t n_preemptions() const { return n_preemptions_; }
  // Something to run: waiting, running or swapped sequences (paused ones wait for their client).
  bool has_work() const { return !waiting_.empty() || !running_.empty() || !swapped_.empty(); }
  // Tokens so far (prompt + generated) of a live request; nullptr if unknown.
  const std::vector<TokenId>* tokens(RequestId id) const;
  int32_t n_generated(RequestId id) const;  // 0 if unknown

 private:
  struct Sequence;  // src/scheduler/sequence.h
  struct StepPlan;  // one schedule() call's working state

  Sequence* find(RequestId id) const;
  void forget(RequestId id);  // releases blocks, drops it from its queue and the map
  // The stages of schedule(), in order.
  void schedule_running(StepPlan& plan, bool decodes);
  void schedule_swapped(StepPlan& plan);
  void admit_waiting(StepPlan& plan);
  // The tokens seq may compute this step: its pending ones, within the budget, and within the
  // recompute chunk while it recomputes a discarded context.
  int32_t chunk_tokens(const Sequence& seq, const StepPlan& plan) const;
  // Drops the KV of the latest-arrived paused sequence that holds device blocks; false if none.
  bool evict_paused(StepPlan& plan);
  // Device blocks are held by someone other than seq and the running sequences: resumed ones
  // coming back from host, or blocks this step's copies still use. They free up by themselves,
  // so a sequence that does not fit beside them waits rather than being refused.
  bool others_hold_blocks(const Sequence& seq) const;
  void grant_lookahead(StepPlan& plan);
  void refuse(Sequence& seq, int32_t n_tokens, StepPlan& plan);
  // Adds seq's chunk of n_tokens to the plan.
  void plan_chunk(const Sequence& seq, int32_t n_tokens, int group, StepPlan& plan) const;
  // Reserves KV for n_tokens of seq, preempting the latest running arrival not planned this step
  // while it does not fit; false when seq could not get it (preempted, refused, or only planned
  // sequences were left to preempt).
  bool reserve_or_preempt(Sequence& seq, int32_t n_tokens, StepPlan& plan);
  void preempt(Sequence& victim, StepPlan& plan);
  void preempt_by_recompute(Sequence& victim);
  SchedulerLimits limits_;
  KvManager& kv_;
  int64_t n_preemptions_ = 0;
  uint64_t next_arrival_ = 0;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> sequences_;
  std::deque<RequestId> waiting_;   // arrival order; preempted sequences go back in order
  std::vector<RequestId> running_;  // arrival order
  std::deque<RequestId> swapped_;   // arrival order
  std::vector<RequestId> paused_;   // arrival order
};

}  // namespace helios
