// A long seeded simulation: many requests through a tiny KV cache, driven by a fake engine whose
// "model" reads only the KV it was asked to compute. Every request must finish with exactly its
// max_new_tokens, with the same tokens as a run that never preempts, within the limits, and
// without leaking a block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "helios/scheduler.h"
#include "unit/scheduler/fake_kv_manager.h"
#include "unit/scheduler/scheduler_test_util.h"

namespace helios {
namespace {

using testing::FakeKvManager;
using testing::make_limits;

// The fake model: a deterministic function of the whole context, as a greedy model is.
TokenId next_token(const std::vector<TokenId>& context) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (TokenId t : context) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<TokenId>(h % 32000);
}

// What an engine that never preempts produces.
std::vector<TokenId> reference_output(const NewRequest& request) {
  std::vector<TokenId> tokens = request.prompt;
  for (int32_t i = 0; i < request.max_new_tokens; ++i) tokens.push_back(next_token(tokens));
  return tokens;
}

struct SimConfig {
  PreemptionMode mode = PreemptionMode::kRecompute;
  int32_t n_device_blocks = 32;  // 128 tokens: a few requests at a time
  int32_t n_host_blocks = 0;
  int32_t block_size = 4;
  int32_t max_batched_tokens = 64;
  int32_t max_seqs = 16;
  int n_requests = 200;
  uint32_t seed = 1;
  int32_t max_lookahead = 0;  // requests draft up to this many tokens per decode (self-speculative)
};

struct SimResult {
  std::map<RequestId, std::vector<TokenId>> outputs;
  std::map<RequestId, NewRequest> requests;
  int64_t n_preemptions = 0;
  int n_swapped_out = 0;  // preemptions that kept their KV on the host
  int n_recomputed = 0;   // preemptions that dropped it
  int n_steps = 0;
  int32_t n_leaked_blocks = 0;
  int64_t n_lookahead = 0;  // draft tokens granted
};

std::vector<NewRequest> make_requests(const SimConfig& config) {
  std::mt19937 rng(config.seed);
  std::uniform_int_distribution<int32_t> prompt_len(1, 48), output_len(1, 32), token(0, 31999),
      lookahead(0, config.max_lookahead);
  std::vector<NewRequest> requests;
  for (int i = 0; i < config.n_requests; ++i) {
    NewRequest r;
    r.id = 1000 + static_cast<RequestId>(i) * 7;  // ids not in arrival order
    r.prompt.resize(prompt_len(rng));
    for (TokenId& t : r.prompt) t = token(rng);
    r.max_new_tokens = output_len(rng);
    r.lookahead = lookahead(rng);
    requests.push_back(r);
  }
  return requests;
}

// The fake engine. kv_content[id] is what the "device" computed for id: each chunk must extend
// it exactly, and a sample reads only it.
class FakeEngine {
 public:
  FakeEngine(const SimConfig& config, SimResult& result)
      : config_(config),
        result_(result),
        kv_(config.n_device_blocks, config.block_size, config.n_host_blocks),
        scheduler_(make_limits(config.max_batched_tokens, config.max_seqs, config.mode), kv_) {}

  void add(const NewRequest& r) {
    result_.requests[r.id] = r;
    scheduler_.add(r);
    live_.insert(r.id);
  }

  void step() {
    // Running sequences ready to decode: all but their last token computed, on the device.
    std::vector<RequestId> decodes;
    for (const auto& [id, content] : kv_content_) {
      if (!content.empty() && content.size() + 1 == scheduler_.tokens(id)->size() && kv_.n_host_blocks(id) == 0) {
        decodes.push_back(id);
      }
    }
    const SchedulerOutput out = scheduler_.schedule();
    ++result_.n_steps;
    check_limits(out);
    check_decodes_first(out, decodes);
    EXPECT_TRUE(out.refused.empty()) << "every simulated request fits the cache alone";
    for (RequestId id : out.preempted) {
      // Swapped KV survives on the host; recomputed KV is gone.
      if (kv_.n_host_blocks(id) > 0) {
        ++result_.n_swapped_out;
      } else {
        ++result_.n_recomputed;
        kv_content_.erase(id);
      }
    }
    for (const ScheduledSequence& s : out.seqs) run_chunk(s);
    ASSERT_EQ(scheduler_.n_waiting() + scheduler_.n_running() + scheduler_.n_swapped(), live_.size());
  }

  bool has_work() const { return scheduler_.has_work(); }
  void finish_run() {
    result_.n_preemptions = scheduler_.n_preemptions();
    result_.n_leaked_blocks = kv_.n_used_blocks();
  }

 private:
  void check_limits(const SchedulerOutput& out) {
    int32_t n_tokens = 0;
    std::set<RequestId> ids;
    for (const ScheduledSequence& s : out.seqs) {
      n_tokens += s.n_tokens + s.n_lookahead;
      EXPECT_GT(s.n_tokens, 0);
      if (s.n_lookahead > 0) {
        EXPECT_TRUE(s.samples && s.n_tokens == 1) << "only a decode drafts";
        EXPECT_LE(s.n_lookahead, result_.requests[s.id].lookahead);
        EXPECT_LT(scheduler_.n_generated(s.id) + s.n_lookahead, result_.requests[s.id].max_new_tokens)
            << "drafts past max_new_tokens";
        EXPECT_GE(kv_.reserved_tokens(s.id), s.start_pos + 1 + s.n_lookahead) << "drafts into unreserved KV";
      }
      EXPECT_TRUE(ids.insert(s.id).second) << "request " << s.id << " twice in one step";
    }
    EXPECT_EQ(n_tokens, out.n_batched_tokens);
    EXPECT_LE(out.n_batched_tokens, config_.max_batched_tokens);
    EXPECT_LE(static_cast<int32_t>(out.seqs.size()), config_.max_seqs);
    EXPECT_LE(static_cast<int32_t>(scheduler_.n_running()), config_.max_seqs);
  }

  // A step that computes a prefill chunk has planned every decode first (unless it was preempted),
  // so a long prefill never takes the budget from sequences that are decoding.
  void check_decodes_first(const SchedulerOutput& out, const std::vector<RequestId>& decodes) {
    const bool has_prefill = std::any_of(out.seqs.begin(), out.seqs.end(),
                                         [](const ScheduledSequence& s) { return s.n_tokens > 1; });
    if (!has_prefill) return;
    for (RequestId id : decodes) {
      const bool preempted = std::find(out.preempted.begin(), out.preempted.end(), id) != out.preempted.end();
      const bool planned = std::any_of(out.seqs.begin(), out.seqs.end(),
                                       [&](const ScheduledSequence& s) { return s.id == id; });
      EXPECT_TRUE(preempted || planned) << "request " << id << " was ready to decode but a prefill went first";
    }
  }

  void run_chunk(const ScheduledSequence& s) {
    const std::vector<TokenId>& tokens = *scheduler_.tokens(s.id);
    std::vector<TokenId>& content = kv_content_[s.id];
    ASSERT_EQ(s.start_pos, static_cast<int32_t>(content.size())) << "request " << s.id;
    ASSERT_LE(s.start_pos + s.n_tokens, static_cast<int32_t>(tokens.size()));
    ASSERT_GE(kv_.reserved_tokens(s.id), s.start_pos + s.n_tokens) << "computing into unreserved KV";
    ASSERT_EQ(s.samples, s.start_pos + s.n_tokens == static_cast<int32_t>(tokens.size()));
    content.insert(content.end(), tokens.begin() + s.start_pos, tokens.begin() + s.start_pos + s.n_tokens);
    if (!s.samples) return;
    ASSERT_EQ(content, tokens);
    if (s.n_lookahead > 0) {
      // A self-speculative round: some drafts are accepted; the emitted tokens are the model's.
      result_.n_lookahead += s.n_lookahead;
      const int32_t accepted = static_cast<int32_t>(accept_rng_() % (s.n_lookahead + 1));
      std::vector<TokenId> emitted, context = content;
      for (int32_t i = 0; i <= accepted; ++i) {
        emitted.push_back(next_token(context));
        context.push_back(emitted.back());
      }
      content.insert(content.end(), emitted.begin(), emitted.end() - 1);  // their KV is computed
      scheduler_.append_speculated(s.id, emitted);
    } else {
      scheduler_.append_token(s.id, next_token(content));
    }
    if (scheduler_.n_generated(s.id) == result_.requests[s.id].max_new_tokens) {
      result_.outputs[s.id] = *scheduler_.tokens(s.id);
      scheduler_.abort(s.id);
      kv_content_.erase(s.id);
      live_.erase(s.id);
    }
  }

  SimConfig config_;
  SimResult& result_;
  FakeKvManager kv_;
  Scheduler scheduler_;
  std::map<RequestId, std::vector<TokenId>> kv_content_;
  std::set<RequestId> live_;
  std::mt19937 accept_rng_{12345};
};

SimResult simulate(const SimConfig& config) {
  SimResult result;
  const std::vector<NewRequest> requests = make_requests(config);
  FakeEngine engine(config, result);
  std::mt19937 rng(config.seed * 31 + 7);
  std::uniform_int_distribution<int> n_arrivals(0, 3);
  size_t next = 0;
  while (next < requests.size() || engine.has_work()) {
    for (int n = n_arrivals(rng); n > 0 && next < requests.size(); --n) engine.add(requests[next++]);
    engine.step();
    if (::testing::Test::HasFatalFailure() || result.n_steps > 100000) break;
  }
  engine.finish_run();
  return result;
}

SimResult expect_same_as_without_preemption(const SimConfig& config) {
  const SimResult result = simulate(config);
  EXPECT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(result.outputs.size(), static_cast<size_t>(config.n_requests))
      << "after " << result.n_steps << " steps";
  if (result.outputs.size() != static_cast<size_t>(config.n_requests)) return result;
  for (const auto& [id, request] : result.requests) {
    const std::vector<TokenId>& output = result.outputs.at(id);
    EXPECT_EQ(output.size(), request.prompt.size() + request.max_new_tokens) << "request " << id;
    EXPECT_EQ(output, reference_output(request)) << "request " << id;
  }
  EXPECT_EQ(result.n_leaked_blocks, 0);
  EXPECT_GT(result.n_preemptions, 0) << "the KV is meant to be too small; the test proves nothing";
  std::printf("[ sim      ] seed %u: %d steps, %lld preemptions (%d swapped, %d recomputed)\n",
              config.seed, result.n_steps, static_cast<long long>(result.n_preemptions),
              result.n_swapped_out, result.n_recomputed);
  return result;
}

TEST(SchedulerSimulation, RecomputeMatchesARunWithoutPreemption) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SimConfig config;
    config.seed = seed;
    const SimResult result = expect_same_as_without_preemption(config);
    EXPECT_EQ(result.n_swapped_out, 0);
  }
}

TEST(SchedulerSimulation, SwapMatchesARunWithoutPreemption) {
  for (uint32_t seed : {4u, 5u, 6u}) {
    SimConfig config;
    config.mode = PreemptionMode::kSwap;
    config.n_host_blocks = 64;
    config.seed = seed;
    const SimResult result = expect_same_as_without_preemption(config);
    EXPECT_GT(result.n_swapped_out, 0);
  }
}

TEST(SchedulerSimulation, SwapWithLittleHostSpaceFallsBackAndStillMatches) {
  for (uint32_t seed : {7u, 8u}) {
    SimConfig config;
    config.mode = PreemptionMode::kSwap;
    config.n_host_blocks = 12;
    config.seed = seed;
    const SimResult result = expect_same_as_without_preemption(config);
    EXPECT_GT(result.n_swapped_out, 0);
    EXPECT_GT(result.n_recomputed, 0) << "host space was meant to run out";
  }
}

TEST(SchedulerSimulation, LookaheadStaysWithinTheBudgetAndTheReservedKv) {
  for (uint32_t seed : {10u, 11u}) {
    SimConfig config;
    config.max_lookahead = 6;
    config.max_batched_tokens = 24;
    config.seed = seed;
    const SimResult result = expect_same_as_without_preemption(config);
    EXPECT_GT(result.n_lookahead, 0) << "no drafts were granted; the test proves nothing";
  }
}

TEST(SchedulerSimulation, SmallBudgetAndFewSeqs) {
  SimConfig config;
  config.max_batched_tokens = 7;  // prompts of up to 48 tokens go in chunks
  config.max_seqs = 3;
  config.n_device_blocks = 24;
  config.seed = 9;
  expect_same_as_without_preemption(config);
}

}  // namespace
}  // namespace helios
