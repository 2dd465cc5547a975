// Scheduler basics: FCFS admission, the token budget, chunked prefill, max_seqs, output order,
// and the request lifecycle (finish, abort). Preemption is in preemption_test.cpp.
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

TEST(Scheduler, AdmitsInArrivalOrderNotIdOrder) {
  FakeKvManager kv(64, 4);
  Scheduler scheduler(make_limits(512), kv);
  scheduler.add(make_request(30, 4));
  scheduler.add(make_request(10, 5));
  scheduler.add(make_request(20, 6));
  EXPECT_EQ(scheduler.n_waiting(), 3u);
  EXPECT_TRUE(scheduler.has_work());

  const SchedulerOutput out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{30, 10, 20}));
  for (const ScheduledSequence& s : out.seqs) {
    EXPECT_EQ(s.start_pos, 0);
    EXPECT_TRUE(s.samples) << "a whole prompt in one chunk samples its first token";
  }
  EXPECT_EQ(out.n_batched_tokens, 15);
  EXPECT_EQ(scheduler.n_running(), 3u);
  EXPECT_EQ(scheduler.n_waiting(), 0u);
  EXPECT_EQ(kv.reserved_tokens(10), 5);
}

TEST(Scheduler, EmptyWhenNothingToDo) {
  FakeKvManager kv(8, 4);
  Scheduler scheduler(make_limits(16), kv);
  EXPECT_TRUE(scheduler.schedule().empty());
  EXPECT_FALSE(scheduler.has_work());
}

TEST(Scheduler, TokenBudgetChunksTheLastAdmittedPrompt) {
  FakeKvManager kv(64, 4);
  Scheduler scheduler(make_limits(10), kv);
  for (RequestId id : {1, 2, 3}) scheduler.add(make_request(id, 4));

  SchedulerOutput out = scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{1, 2, 3}));
  EXPECT_EQ(out.n_batched_tokens, 10);
  EXPECT_EQ(out.seqs[2].n_tokens, 2);
  EXPECT_FALSE(out.seqs[2].samples) << "half a prompt cannot sample";
  append_samples(scheduler, out);

  // Next step: two decodes, then the rest of the third prompt, which now samples.
  out = scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{1, 2, 3}));
  EXPECT_EQ(out.seqs[0].start_pos, 4);
  EXPECT_EQ(out.seqs[0].n_tokens, 1);
  EXPECT_EQ(out.seqs[2].start_pos, 2);
  EXPECT_EQ(out.seqs[2].n_tokens, 2);
  EXPECT_TRUE(out.seqs[2].samples);
  EXPECT_EQ(out.n_batched_tokens, 4);
}

TEST(Scheduler, LongPromptIsChunkedWhileADecodeKeepsGoing) {
  FakeKvManager kv(1024, 16);
  Scheduler scheduler(make_limits(256), kv);
  scheduler.add(make_request(1, 8));
  append_samples(scheduler, scheduler.schedule());
  scheduler.add(make_request(2, 1000));

  int32_t n_prefilled = 0;
  int n_steps = 0;
  for (bool sampled = false; !sampled; ++n_steps) {
    ASSERT_LT(n_steps, 10);
    const SchedulerOutput out = scheduler.schedule();
    EXPECT_LE(out.n_batched_tokens, 256);
    ASSERT_EQ(ids_of(out), (std::vector<RequestId>{1, 2})) << "step " << n_steps;
    EXPECT_EQ(out.seqs[0].n_tokens, 1) << "the decode gets its token every step";
    EXPECT_TRUE(out.seqs[0].samples);
    EXPECT_EQ(out.seqs[1].start_pos, n_prefilled);
    n_prefilled += out.seqs[1].n_tokens;
    sampled = out.seqs[1].samples;
    append_samples(scheduler, out);
  }
  EXPECT_EQ(n_steps, 4);
  EXPECT_EQ(n_prefilled, 1000);
  EXPECT_EQ(scheduler.n_generated(2), 1);
  EXPECT_EQ(scheduler.n_generated(1), 5);
}

TEST(Scheduler, ChunkWithoutSampleAdvancesWithoutAnAppend) {
  // The computed-token rule: a planned chunk counts as computed; no append_token is needed.
  FakeKvManager kv(64, 4);
  Scheduler scheduler(make_limits(3), kv);
  scheduler.add(make_request(1, 7));
  std::vector<int32_t> starts;
  for (int step = 0; step < 3; ++step) {
    const SchedulerOutput out = scheduler.schedule();
    ASSERT_EQ(out.seqs.size(), 1u);
    starts.push_back(out.seqs[0].start_pos);
    EXPECT_EQ(out.seqs[0].samples, step == 2);
  }
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 3, 6}));
  // Sampled but the engine appended nothing: there is nothing to compute.
  EXPECT_TRUE(scheduler.schedule().empty());
  scheduler.append_token(1, 5);
  const SchedulerOutput out = scheduler.schedule();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].start_pos, 7);
}

TEST(Scheduler, MaxSeqsCapsTheRunningSet) {
  FakeKvManager kv(64, 4);
  Scheduler scheduler(make_limits(512, 2), kv);
  for (RequestId id : {1, 2, 3}) scheduler.add(make_request(id, 4));

  SchedulerOutput out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(scheduler.n_waiting(), 1u);
  append_samples(scheduler, out);
  out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1, 2}));
  append_samples(scheduler, out);

  scheduler.abort(1);
  out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{2, 3}));
  EXPECT_EQ(find_seq(out, 3)->n_tokens, 4);
}

TEST(Scheduler, RunningSequencesComeBeforeNewPrefills) {
  FakeKvManager kv(64, 4);
  Scheduler scheduler(make_limits(512), kv);
  scheduler.add(make_request(1, 3));
  scheduler.add(make_request(2, 3));
  append_samples(scheduler, scheduler.schedule());
  scheduler.add(make_request(3, 9));
  scheduler.abort(1);
  scheduler.add(make_request(4, 2));

  const SchedulerOutput out = scheduler.schedule();
  ASSERT_EQ(ids_of(out), (std::vector<RequestId>{2, 3, 4}));
  EXPECT_EQ(out.seqs[0].n_tokens, 1);
  EXPECT_EQ(out.seqs[0].start_pos, 3);
  EXPECT_EQ(out.seqs[1].n_tokens, 9);
  EXPECT_EQ(out.n_batched_tokens, 12);
}

TEST(Scheduler, AdmissionStopsAtTheFirstPromptThatDoesNotFit) {
  FakeKvManager kv(4, 4);  // 16 tokens of KV
  Scheduler scheduler(make_limits(512), kv);
  scheduler.add(make_request(1, 8));
  scheduler.add(make_request(2, 12));  // needs 3 blocks; 2 are left
  scheduler.add(make_request(3, 4));   // would fit, but must not skip ahead of 2

  SchedulerOutput out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{1}));
  EXPECT_EQ(scheduler.n_waiting(), 2u);
  EXPECT_EQ(kv.n_device_blocks(2), 0) << "a failed reservation leaves nothing behind";

  scheduler.abort(1);
  out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{2, 3}));
}

TEST(Scheduler, FinishReleasesBlocksAndForgets) {
  FakeKvManager kv(16, 4);
  Scheduler scheduler(make_limits(64), kv);
  scheduler.add(make_request(1, 6));
  append_samples(scheduler, scheduler.schedule(), 42);
  ASSERT_NE(scheduler.tokens(1), nullptr);
  EXPECT_EQ(scheduler.tokens(1)->size(), 7u);
  EXPECT_EQ(scheduler.tokens(1)->back(), 42);
  EXPECT_EQ(scheduler.n_generated(1), 1);

  scheduler.abort(1);
  EXPECT_EQ(scheduler.tokens(1), nullptr);
  EXPECT_EQ(scheduler.n_generated(1), 0);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(kv.n_used_blocks(), 0);
  scheduler.abort(1);  // twice: no effect
  scheduler.append_token(1, 3);  // a late token for a forgotten request is dropped
  EXPECT_TRUE(scheduler.schedule().empty());
}

TEST(Scheduler, AbortFreesBlocksInEveryState) {
  FakeKvManager kv(6, 4, 16);
  Scheduler scheduler(make_limits(512, 64, PreemptionMode::kSwap), kv);
  scheduler.add(make_request(1, 8));  // 2 blocks
  scheduler.add(make_request(2, 8));  // 2 blocks
  scheduler.add(make_request(3, 8));  // 2 blocks: the device is full
  append_samples(scheduler, scheduler.schedule());
  scheduler.add(make_request(4, 4));  // waiting

  // Request 1 needs a third block: 3, the latest arrival, is swapped out.
  SchedulerOutput out = scheduler.schedule();
  ASSERT_EQ(out.preempted, (std::vector<RequestId>{3}));
  EXPECT_EQ(scheduler.n_swapped(), 1u);
  EXPECT_EQ(scheduler.n_running(), 2u);
  EXPECT_EQ(scheduler.n_waiting(), 1u);
  EXPECT_GT(kv.n_host_blocks(3), 0);

  EXPECT_TRUE(scheduler.abort(3));  // swapped
  EXPECT_TRUE(scheduler.abort(4));  // waiting
  EXPECT_TRUE(scheduler.abort(1));  // running
  EXPECT_FALSE(scheduler.abort(1));
  EXPECT_FALSE(scheduler.abort(99));
  EXPECT_EQ(scheduler.n_swapped() + scheduler.n_waiting(), 0u);
  EXPECT_EQ(scheduler.n_running(), 1u);
  EXPECT_TRUE(scheduler.abort(2));
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(kv.n_used_blocks(), 0) << "leaked blocks";
  EXPECT_TRUE(scheduler.schedule().empty());
}

TEST(Scheduler, AbortOfAPartlyPrefilledSequence) {
  FakeKvManager kv(64, 4);
  Scheduler scheduler(make_limits(8), kv);
  scheduler.add(make_request(1, 20));
  scheduler.add(make_request(2, 3));
  EXPECT_EQ(ids_of(scheduler.schedule()), (std::vector<RequestId>{1}));
  EXPECT_TRUE(scheduler.abort(1));
  const SchedulerOutput out = scheduler.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<RequestId>{2}));
  scheduler.abort(2);
  EXPECT_EQ(kv.n_used_blocks(), 0);
}

}  // namespace
}  // namespace helios
