// Paused sequences in the scheduler: each hold policy keeps, drops or moves the KV as it says,
// resumes go to the queue their KV's place decides, min-waste's blocks move within the step's
// budget, paused KV gives way when running work cannot fit otherwise, and a discarded context
// is recomputed in chunks of S minus the decodes.
#include <gtest/gtest.h>

#include "unit/scheduler/fake_kv_manager.h"
#include "unit/scheduler/scheduler_test_util.h"

namespace helios {
namespace {

using testing::append_samples;
using testing::FakeKvManager;
using testing::find_seq;
using testing::ids_of;
using testing::make_limits;
using testing::make_request;

// Runs steps until request `id` has a pending sampled token, then pauses it.
void run_then_pause(Scheduler& s, RequestId id, HoldPolicy hold, std::vector<BlockCopy>* copies = nullptr) {
  for (int i = 0; i < 10; ++i) {
    const SchedulerOutput out = s.schedule();
    append_samples(s, out);
    const ScheduledSequence* seq = find_seq(out, id);
    if (seq != nullptr && seq->samples) break;
  }
  std::vector<BlockCopy> unused;
  s.pause(id, hold, copies ? copies : &unused);
}

TEST(InterceptScheduler, PreservedKvStaysAndTheResumeComputesOnlyTheNewTokens) {
  FakeKvManager kv(16, 4);
  Scheduler s(make_limits(64), kv);
  s.add(make_request(1, 10));
  run_then_pause(s, 1, HoldPolicy::kPreserve);
  EXPECT_EQ(s.n_paused(), 1u);
  EXPECT_EQ(s.n_running(), 0u);
  EXPECT_EQ(kv.n_device_blocks(1), 3);  // 10 prompt tokens, the 11th pending
  EXPECT_TRUE(s.schedule().empty());    // paused: nothing to run
  EXPECT_FALSE(s.has_work());
  ASSERT_TRUE(s.resume(1, {5, 6, 7}, 8));
  EXPECT_EQ(s.n_running(), 1u);
  const SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].start_pos, 10);  // the trigger token, then the three appended
  EXPECT_EQ(out.seqs[0].n_tokens, 4);
  EXPECT_TRUE(out.seqs[0].samples);
  EXPECT_EQ(out.n_recompute_tokens, 0);
  EXPECT_FALSE(s.resume(1, {1}, 8));  // not paused
}

TEST(InterceptScheduler, DiscardQueuesAtTheTailImprovedDiscardAtItsArrival) {
  for (HoldPolicy hold : {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard}) {
    FakeKvManager kv(6, 4);  // 24 tokens: one of the two at a time
    Scheduler s(make_limits(64), kv);
    s.add(make_request(1, 10));
    run_then_pause(s, 1, hold);
    EXPECT_EQ(kv.n_device_blocks(1), 0) << hold_policy_name(hold);
    s.add(make_request(2, 14));  // arrives while 1 is paused
    ASSERT_TRUE(s.resume(1, {5}, 8));
    const SchedulerOutput out = s.schedule();
    // Both wait; the queue order decides who is admitted first.
    ASSERT_FALSE(out.seqs.empty());
    EXPECT_EQ(out.seqs[0].id, hold == HoldPolicy::kDiscard ? 2u : 1u) << hold_policy_name(hold);
    if (hold == HoldPolicy::kImprovedDiscard) {
      EXPECT_EQ(out.seqs[0].start_pos, 0);          // everything again
      EXPECT_EQ(out.n_recompute_tokens, 10);        // its 10 computed tokens; the trigger is new
    }
  }
}

TEST(InterceptScheduler, SwapMovesEveryBlockOutAtThePauseAndBackOnResume) {
  FakeKvManager kv(16, 4, 16);
  Scheduler s(make_limits(64), kv);
  s.add(make_request(1, 10));
  std::vector<BlockCopy> copies;
  run_then_pause(s, 1, HoldPolicy::kSwap, &copies);
  EXPECT_EQ(copies.size(), 3u);
  EXPECT_EQ(kv.n_device_blocks(1), 0);
  EXPECT_EQ(kv.n_host_blocks(1), 3);
  ASSERT_TRUE(s.resume(1, {5}, 8));
  EXPECT_EQ(s.n_swapped(), 1u);
  const SchedulerOutput out = s.schedule();
  EXPECT_EQ(out.swap_in.size(), 3u);  // at once, before the step
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].start_pos, 10);
  EXPECT_EQ(kv.n_host_blocks(1), 0);
}

TEST(InterceptScheduler, MinWasteBlocksComeBackWithinTheBudgetWithoutHoldingAdmissionBack) {
  FakeKvManager kv(16, 4, 16);
  Scheduler s(make_limits(64), kv);
  s.add(make_request(1, 10));
  run_then_pause(s, 1, HoldPolicy::kMinWaste);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(s.swap_out_paused(1, 2, &copies), 2);  // the last two blocks
  EXPECT_EQ(kv.n_device_blocks(1), 1);
  EXPECT_EQ(kv.n_host_blocks(1), 2);
  kv.finish_async_copies();
  ASSERT_TRUE(s.resume(1, {5}, 8));
  s.add(make_request(2, 4));
  StepBudgets budgets;
  budgets.swap_in_blocks = 1;
  SchedulerOutput out = s.schedule(budgets);
  EXPECT_EQ(out.async_swap_in.size(), 1u);
  EXPECT_EQ(ids_of(out), std::vector<RequestId>{2});  // admitted while 1 comes back
  append_samples(s, out);
  kv.finish_async_copies();
  out = s.schedule(budgets);
  EXPECT_EQ(out.async_swap_in.size(), 1u);
  EXPECT_EQ(find_seq(out, 1), nullptr);  // its last block is on its way
  append_samples(s, out);
  kv.finish_async_copies();
  out = s.schedule(budgets);
  const ScheduledSequence* one = find_seq(out, 1);
  ASSERT_NE(one, nullptr);  // all back: it runs
  EXPECT_EQ(one->start_pos, 10);
  EXPECT_EQ(kv.n_host_blocks(1), 0);
}

TEST(InterceptScheduler, PausedKvGivesWayWhenRunningWorkCannotFitOtherwise) {
  FakeKvManager kv(6, 4);
  Scheduler s(make_limits(64), kv);
  s.add(make_request(1, 10));
  run_then_pause(s, 1, HoldPolicy::kPreserve);
  s.add(make_request(2, 20));  // needs 6 blocks: all of them
  const SchedulerOutput out = s.schedule();
  EXPECT_EQ(out.evicted, std::vector<RequestId>{1});
  EXPECT_EQ(ids_of(out), std::vector<RequestId>{2});
  EXPECT_TRUE(out.refused.empty());
  EXPECT_EQ(kv.n_device_blocks(1), 0);
  ASSERT_TRUE(s.resume(1, {5}, 8));  // no KV left: it recomputes
  EXPECT_EQ(s.n_waiting(), 1u);
}

TEST(InterceptScheduler, MinWasteRecomputesADiscardedContextInChunksOfSMinusTheDecodes) {
  FakeKvManager kv(64, 4);
  Scheduler s(make_limits(256), kv);
  s.add(make_request(1, 40));
  s.add(make_request(2, 4));
  s.add(make_request(3, 4));
  run_then_pause(s, 1, HoldPolicy::kMinWaste);
  s.discard_paused(1);
  ASSERT_TRUE(s.resume(1, {5}, 8));
  StepBudgets budgets;
  budgets.saturation_tokens = 14;
  // Requests 2 and 3 decode (2 tokens): 1 recomputes 14 - 2 = 12 tokens a step.
  SchedulerOutput out = s.schedule(budgets);
  const ScheduledSequence* one = find_seq(out, 1);
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->n_tokens, 12);
  EXPECT_EQ(out.n_recompute_tokens, 12);
  EXPECT_FALSE(one->samples);
  append_samples(s, out);
  out = s.schedule(budgets);
  ASSERT_NE(find_seq(out, 1), nullptr);
  EXPECT_EQ(find_seq(out, 1)->start_pos, 12);
  // Without S it is one chunk within the token budget, as discard recomputes.
  FakeKvManager kv2(64, 4);
  Scheduler s2(make_limits(256), kv2);
  s2.add(make_request(1, 40));
  run_then_pause(s2, 1, HoldPolicy::kMinWaste);
  s2.discard_paused(1);
  ASSERT_TRUE(s2.resume(1, {5}, 8));
  out = s2.schedule();
  EXPECT_EQ(find_seq(out, 1)->n_tokens, 42);
}

TEST(InterceptScheduler, AbortForgetsAPausedSequenceAndItsBlocks) {
  FakeKvManager kv(16, 4, 16);
  Scheduler s(make_limits(64), kv);
  s.add(make_request(1, 10));
  run_then_pause(s, 1, HoldPolicy::kMinWaste);
  std::vector<BlockCopy> copies;
  s.swap_out_paused(1, 1, &copies);
  kv.finish_async_copies();
  EXPECT_TRUE(s.abort(1));
  EXPECT_EQ(s.n_paused(), 0u);
  EXPECT_EQ(kv.n_used_blocks(), 0);
}

TEST(InterceptScheduler, PausedSequencesLoseTheirKvWhenEverythingIsRecomputed) {
  FakeKvManager kv(16, 4);
  Scheduler s(make_limits(64), kv);
  s.add(make_request(1, 10));
  run_then_pause(s, 1, HoldPolicy::kPreserve);
  s.recompute_all();
  EXPECT_EQ(kv.n_device_blocks(1), 0);
  EXPECT_EQ(s.n_paused(), 1u);
  ASSERT_TRUE(s.resume(1, {5}, 8));
  EXPECT_EQ(s.schedule().seqs[0].start_pos, 0);
}

}  // namespace
}  // namespace helios
