// Preemption when the KV cache runs out: who is evicted, what recompute and swap do to a
// sequence, and the swap → recompute fallback.
#include <gtest/gtest.h>

#include <vector>

#include "helios/scheduler.h"
#include "unit/scheduler/fake_kv_manager.h"
#include "unit/scheduler/scheduler_test_util.h"

namespace helios {
namespace {

using testing::FakeKvManager;
using testing::append_samples;
using testing::find_seq;
using testing::ids_of;
using testing::make_limits;
using testing::make_request;

// Three 8-token prompts fill 6 blocks of 4; each sampled one token. The next step needs 9
// tokens each, so 3 blocks each: the device holds two of them.
struct FullCache {
  explicit FullCache(PreemptionMode mode, int32_t n_host_blocks = 16)
      : kv(6, 4, n_host_blocks), scheduler(make_limits(512, 64, mode), kv) {
    for (RequestId id : {1, 2, 3}) scheduler.add(make_request(id, 8));
    const SchedulerOutput out = scheduler.schedule();
    EXPECT_EQ(out.seqs.size(), 3u);
    EXPECT_EQ(kv.n_free_blocks(), 0);
    append_samples(scheduler, out, 100);
  }
  FakeKvManager kv;
  Scheduler scheduler;
};

TEST(SchedulerPreemption, RecomputeEvictsTheLatestArrival) {
  FullCache c(PreemptionMode::kRecompute);
  const SchedulerOutput out = c.scheduler.schedule();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{3}));
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1, 2}));
  EXPECT_TRUE(out.swap_out.empty());
  EXPECT_EQ(c.scheduler.n_preemptions(), 1);
  EXPECT_TRUE(c.kv.called("release 3"));
  EXPECT_EQ(c.kv.n_device_blocks(3), 0);
  EXPECT_EQ(c.scheduler.n_waiting(), 1u);
  EXPECT_EQ(c.scheduler.n_generated(3), 1) << "generated tokens survive preemption";
}

TEST(SchedulerPreemption, SequenceThatOutgrowsTheWholeCacheIsRefused) {
  FakeKvManager kv(4, 4);
  Scheduler scheduler(make_limits(512), kv);
  scheduler.add(make_request(1, 8));
  scheduler.add(make_request(2, 8));
  append_samples(scheduler, scheduler.schedule());

  // 1 needs a third block: 2 (the latest) goes.
  SchedulerOutput out = scheduler.schedule();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{2}));
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1}));
  append_samples(scheduler, out);

  // Now 1 runs alone and grows until it needs a 5th block: alone in the cache it can never fit,
  // so it is refused (not preempted, which would recompute it into the same wall forever), and
  // 2 comes back in the same step.
  for (int step = 0; step < 7; ++step) append_samples(scheduler, scheduler.schedule());
  EXPECT_EQ(kv.n_device_blocks(1), 4);
  out = scheduler.schedule();  // 17 tokens need a 5th block
  ASSERT_EQ(out.refused.size(), 1u);
  EXPECT_EQ(out.refused[0].id, 1u);
  EXPECT_NE(out.refused[0].reason.find("17 tokens"), std::string::npos) << out.refused[0].reason;
  EXPECT_NE(out.refused[0].reason.find("holds 16"), std::string::npos) << out.refused[0].reason;
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{2}));
  EXPECT_EQ(scheduler.tokens(1), nullptr) << "a refused request is forgotten";
  EXPECT_EQ(kv.n_device_blocks(1), 0);
  EXPECT_EQ(scheduler.n_waiting(), 0u);
  EXPECT_EQ(scheduler.n_running(), 1u);
}

TEST(SchedulerPreemption, PromptLargerThanTheCacheIsRefusedAtAdmission) {
  FakeKvManager kv(2, 4);
  Scheduler scheduler(make_limits(512), kv);
  scheduler.add(make_request(1, 9));  // 3 blocks: more than the cache has
  scheduler.add(make_request(2, 4));
  const SchedulerOutput out = scheduler.schedule();
  ASSERT_EQ(out.refused.size(), 1u);
  EXPECT_EQ(out.refused[0].id, 1u);
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{2})) << "the request behind it is not held up";
}

TEST(SchedulerPreemption, ChunkedPromptLargerThanTheCacheIsRefusedNotRecomputedForever) {
  FakeKvManager kv(2, 4);
  Scheduler scheduler(make_limits(4), kv);  // chunks of 4: the first two fit
  scheduler.add(make_request(1, 12));
  for (int step = 0; step < 2; ++step) {
    const SchedulerOutput out = scheduler.schedule();
    EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1}));
    EXPECT_TRUE(out.refused.empty());
  }
  const SchedulerOutput out = scheduler.schedule();
  ASSERT_EQ(out.refused.size(), 1u);
  EXPECT_EQ(scheduler.n_preemptions(), 0);
  EXPECT_FALSE(scheduler.has_work());
}

TEST(SchedulerPreemption, RecomputeRequeuesInArrivalOrderAndRecomputesAllTokens) {
  FakeKvManager kv(4, 4);
  Scheduler scheduler(make_limits(512), kv);
  scheduler.add(make_request(1, 4));  // 1 block
  scheduler.add(make_request(2, 4));  // 1 block
  scheduler.add(make_request(3, 8));  // 2 blocks: full
  append_samples(scheduler, scheduler.schedule(), 50);
  scheduler.add(make_request(4, 1));

  // 1 needs a 2nd block: 3 is evicted (2 blocks free, 1 taken). 2 takes the other one.
  SchedulerOutput out = scheduler.schedule();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{3}));
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1, 2}))
      << "nothing is admitted in a step that preempted";
  append_samples(scheduler, out, 51);
  EXPECT_EQ(scheduler.n_waiting(), 2u);

  // 3 went back ahead of 4, the later arrival; once room is made it is first in line.
  scheduler.abort(1);
  scheduler.abort(2);
  out = scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{3, 4}));
  // The recomputed prefill is the prompt plus the token generated before preemption.
  EXPECT_EQ(out.seqs[0].start_pos, 0);
  EXPECT_EQ(out.seqs[0].n_tokens, 9);
  EXPECT_TRUE(out.seqs[0].samples);
  const std::vector<TokenId>& tokens = *scheduler.tokens(3);
  ASSERT_EQ(tokens.size(), 9u);
  EXPECT_EQ(tokens.back(), 50);
}

TEST(SchedulerPreemption, SwapMovesBlocksOutAndBackKeepingComputedTokens) {
  FullCache c(PreemptionMode::kSwap);
  SchedulerOutput out = c.scheduler.schedule();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{3}));
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(out.swap_out.size(), 2u) << "both of 3's blocks are copied to the host";
  EXPECT_TRUE(out.swap_in.empty());
  EXPECT_EQ(c.scheduler.n_swapped(), 1u);
  EXPECT_EQ(c.kv.n_host_blocks(3), 2);
  EXPECT_FALSE(c.kv.called("release 3"));
  append_samples(c.scheduler, out, 101);

  c.scheduler.abort(1);  // frees 3 blocks
  out = c.scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{2, 3}));
  EXPECT_EQ(out.swap_in.size(), 2u);
  EXPECT_TRUE(out.swap_out.empty());
  EXPECT_EQ(c.scheduler.n_swapped(), 0u);
  const ScheduledSequence* s3 = find_seq(out, 3);
  EXPECT_EQ(s3->start_pos, 8) << "swap keeps the computed tokens: only the decode is left";
  EXPECT_EQ(s3->n_tokens, 1);
  EXPECT_TRUE(s3->samples);
  EXPECT_EQ(c.kv.n_device_blocks(3), 3);
  EXPECT_EQ(c.kv.n_host_blocks(3), 0);
}

TEST(SchedulerPreemption, SwapCopiesNameTheBlocksThatMove) {
  FullCache c(PreemptionMode::kSwap);
  const SchedulerOutput out = c.scheduler.schedule();
  ASSERT_EQ(out.swap_out.size(), 2u);
  for (const BlockCopy& copy : out.swap_out) {
    EXPECT_GE(copy.from_block, 0);
    EXPECT_LT(copy.from_block, 6);
    EXPECT_GE(copy.to_block, 0);
    EXPECT_LT(copy.to_block, 16);
  }
}

TEST(SchedulerPreemption, SwappedSequencesGoBeforeNewArrivals) {
  FullCache c(PreemptionMode::kSwap);
  append_samples(c.scheduler, c.scheduler.schedule());  // 3 swapped out
  c.scheduler.add(make_request(4, 1));
  // 1 and 2 keep the device full, so 3 cannot come back in; 4 would fit in no block either,
  // but must wait behind 3 regardless.
  const SchedulerOutput out = c.scheduler.schedule();
  EXPECT_EQ(find_seq(out, 4), nullptr);
  EXPECT_EQ(c.scheduler.n_waiting(), 1u);
}

TEST(SchedulerPreemption, SwapFallsBackToRecomputeWhenTheHostIsFull) {
  FullCache c(PreemptionMode::kSwap, /*n_host_blocks=*/1);  // 3 needs 2 host blocks
  SchedulerOutput out = c.scheduler.schedule();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{3}));
  EXPECT_TRUE(out.swap_out.empty());
  EXPECT_TRUE(c.kv.called("swap_out 3"));
  EXPECT_TRUE(c.kv.called("release 3"));
  EXPECT_EQ(c.scheduler.n_swapped(), 0u);
  EXPECT_EQ(c.scheduler.n_waiting(), 1u);
  EXPECT_EQ(c.scheduler.n_preemptions(), 1);
  append_samples(c.scheduler, out);

  c.scheduler.abort(1);
  out = c.scheduler.schedule();
  const ScheduledSequence* s3 = find_seq(out, 3);
  ASSERT_NE(s3, nullptr);
  EXPECT_EQ(s3->start_pos, 0) << "recompute starts over";
  EXPECT_EQ(s3->n_tokens, 9);
  EXPECT_TRUE(out.swap_in.empty());
}

TEST(SchedulerPreemption, RecomputeAllSendsEverySequenceBackInArrivalOrderWithItsTokens) {
  FullCache c(PreemptionMode::kSwap);
  append_samples(c.scheduler, c.scheduler.schedule(), 101);  // 1, 2 run (10 tokens); 3 swapped (9)
  c.scheduler.add(make_request(4, 1));
  ASSERT_EQ(c.scheduler.n_swapped(), 1u);
  const int64_t preemptions = c.scheduler.n_preemptions();

  c.scheduler.recompute_all();
  EXPECT_EQ(c.scheduler.n_running(), 0u);
  EXPECT_EQ(c.scheduler.n_swapped(), 0u);
  EXPECT_EQ(c.scheduler.n_waiting(), 4u);
  EXPECT_EQ(c.kv.n_used_blocks(), 0) << "device and host blocks released";
  EXPECT_EQ(c.scheduler.n_preemptions(), preemptions) << "not KV pressure";
  EXPECT_EQ(c.scheduler.tokens(1)->size(), 10u);
  EXPECT_EQ(c.scheduler.tokens(3)->size(), 9u);

  // FCFS again: 1 and 2 fill the device as whole prefills; 3 waits, and 4 behind it.
  SchedulerOutput out = c.scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(out.seqs[0].start_pos, 0);
  EXPECT_EQ(out.seqs[0].n_tokens, 10);
  EXPECT_TRUE(out.seqs[0].samples);
  EXPECT_TRUE(out.swap_in.empty());
  append_samples(c.scheduler, out);
  c.scheduler.abort(1);
  c.scheduler.abort(2);
  out = c.scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{3, 4}));
  EXPECT_EQ(out.seqs[0].n_tokens, 9) << "3's prompt and its token, computed again";
}

}  // namespace
}  // namespace helios
