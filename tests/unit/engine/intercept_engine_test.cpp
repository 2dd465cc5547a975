// Intercepts in the engine: a generation pauses on its trigger, its KV held by the hold policy,
// and resumes in place. Whatever the policy (discard, improved-discard, preserve, swap,
// min-waste), with or without memory pressure, a greedy session generates the same tokens — and
// each segment is what a fresh request over the whole context so far would generate.
#include <gtest/gtest.h>

#include <thread>

#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

// The engine options with the start-up profile on, as heliosd runs it.
EngineOptions engine_options(int32_t n_kv_blocks, int32_t max_batched_tokens = 512,
                             PreemptionMode preemption = PreemptionMode::kRecompute, int32_t n_swap_blocks = 0) {
  EngineOptions options = testing::engine_options(n_kv_blocks, max_batched_tokens, preemption, n_swap_blocks);
  options.intercepts.profile_at_start = true;
  return options;
}
using testing::kStoryPrompts;
using testing::make_generation;
using testing::Served;

constexpr HoldPolicy kPolicies[] = {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard, HoldPolicy::kPreserve,
                                    HoldPolicy::kSwap, HoldPolicy::kMinWaste};
constexpr int32_t kSegment = 10;
constexpr int kPauses = 3;
const char* const kAnswers[] = {" and the sun", " said Tom.", " Then they"};

struct Session {
  std::vector<TokenId> context;               // prompt, then every segment and answer
  std::vector<std::vector<TokenId>> segments;  // generated, per segment
  std::vector<InterceptEvent> events;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

// Drains one segment: tokens until a pause (true) or the end (false).
bool drain_segment(RequestStream& stream, Session& s) {
  s.segments.emplace_back();
  for (;;) {
    auto u = stream.pop(std::chrono::milliseconds(60000));
    if (!u) {
      ADD_FAILURE() << "stream timed out";
      return false;
    }
    for (const TokenEvent& t : u->tokens) {
      s.segments.back().push_back(t.id);
      s.context.push_back(t.id);
    }
    if (u->intercept) {
      s.events.push_back(*u->intercept);
      return true;
    }
    if (u->finish != FinishReason::kNone) {
      s.finish = u->finish;
      s.error = u->error;
      return false;
    }
  }
}

GenerationRequest session_request(const Model& model, const std::string& id, const char* prompt, HoldPolicy hold,
                                  const std::string& kind = "") {
  GenerationRequest r = make_generation(model, id, prompt, ExitRule{}, 0.0f, kSegment);
  r.intercept.triggers.on_length = true;
  r.intercept.hold = hold;
  r.intercept.kind = kind;
  return r;
}

// Runs `n` sessions at once to the end: kPauses pauses each, answered after `pause`.
std::vector<Session> run_sessions(Served& s, HoldPolicy hold, int n, std::chrono::milliseconds pause,
                                  const std::string& kind = "") {
  std::vector<Session> sessions(n);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r = session_request(*s.model, "s" + std::to_string(i), kStoryPrompts[i % 4], hold, kind);
    sessions[i].context = r.prompt;
    auto stream = s.engine->submit(std::move(r));
    EXPECT_TRUE(stream.ok()) << stream.status().message();
    if (!stream.ok()) return sessions;
    streams.push_back(*stream);
  }
  // Round-robin: every session is paused together while the others' answers go in.
  std::vector<bool> open(n, true);
  for (int round = 0; round <= kPauses; ++round) {
    for (int i = 0; i < n; ++i) {
      if (!open[i]) continue;
      open[i] = drain_segment(*streams[i], sessions[i]);
    }
    std::this_thread::sleep_for(pause);
    for (int i = 0; i < n; ++i) {
      if (!open[i]) continue;
      const std::string id = "s" + std::to_string(i);
      if (round == kPauses) {
        EXPECT_TRUE(s.engine->end_paused(id).ok());
        drain_segment(*streams[i], sessions[i]);
        continue;
      }
      std::vector<TokenId> answer = s.model->tokenizer().encode(kAnswers[round], false, false);
      sessions[i].context.insert(sessions[i].context.end(), answer.begin(), answer.end());
      const Status st = s.engine->resume(id, answer, kSegment);
      EXPECT_TRUE(st.ok()) << st.message();
    }
  }
  return sessions;
}

std::vector<std::vector<TokenId>> generated(const std::vector<Session>& sessions) {
  std::vector<std::vector<TokenId>> out;
  for (const Session& s : sessions) out.push_back(s.context);
  return out;
}

TEST(InterceptEngine, EverySegmentIsWhatAFreshRequestOverItsContextGenerates) {
  Served s(engine_options(64));
  ASSERT_TRUE(s.engine);
  const auto sessions = run_sessions(s, HoldPolicy::kPreserve, 1, std::chrono::milliseconds(0));
  const Session& one = sessions[0];
  // kPauses answered, then the last segment's pause, which the client ends.
  ASSERT_EQ(one.events.size(), static_cast<size_t>(kPauses + 1));
  EXPECT_EQ(one.finish, FinishReason::kStop);
  for (int k = 0; k <= kPauses; ++k) {
    EXPECT_EQ(one.events[k].trigger, "length");
    EXPECT_EQ(one.events[k].index, k + 1);
  }
  // Segment k from a fresh request whose prompt is everything before it.
  std::vector<TokenId> prefix = s.model->tokenizer().encode(kStoryPrompts[0], true, false);
  for (int k = 0; k <= kPauses; ++k) {
    if (k == kPauses) break;  // the last segment ends with end_paused after kSegment tokens too
    GenerationRequest fresh = make_generation(*s.model, "fresh" + std::to_string(k), "", ExitRule{}, 0.0f, kSegment);
    fresh.prompt = prefix;
    auto stream = s.engine->submit(std::move(fresh));
    ASSERT_TRUE(stream.ok());
    const auto outcome = testing::drain(**stream);
    EXPECT_EQ(outcome.ids, one.segments[k]) << "segment " << k;
    EXPECT_EQ(one.events[k].context_tokens, static_cast<int32_t>(prefix.size() + kSegment));
    prefix.insert(prefix.end(), one.segments[k].begin(), one.segments[k].end());
    auto answer = s.model->tokenizer().encode(kAnswers[k], false, false);
    prefix.insert(prefix.end(), answer.begin(), answer.end());
  }
}

TEST(InterceptEngine, GreedySessionsAreIdenticalUnderEveryPolicy) {
  std::vector<std::vector<TokenId>> reference;
  for (HoldPolicy hold : kPolicies) {
    Served s(engine_options(64, 512, PreemptionMode::kRecompute, 64));
    ASSERT_TRUE(s.engine);
    const auto out = generated(run_sessions(s, hold, 4, std::chrono::milliseconds(5)));
    if (reference.empty()) {
      reference = out;
    } else {
      EXPECT_EQ(out, reference) << hold_policy_name(hold);
    }
    const EngineStatus st = s.engine->status();
    EXPECT_EQ(st.intercepts.intercepts_total, 4 * (kPauses + 1)) << hold_policy_name(hold);
    EXPECT_EQ(st.intercepts.paused, 0);
    EXPECT_EQ(st.kv_blocks_used, 0) << hold_policy_name(hold);
  }
}

// Few blocks for four sessions: preemption, eviction of paused KV and min-waste's swaps and
// discards all happen, and the tokens do not change.
TEST(InterceptEngine, GreedySessionsAreIdenticalUnderMemoryPressure) {
  std::vector<std::vector<TokenId>> reference;
  {
    Served s(engine_options(64));
    reference = generated(run_sessions(s, HoldPolicy::kPreserve, 4, std::chrono::milliseconds(0)));
  }
  for (HoldPolicy hold : kPolicies) {
    for (const char* kind : {"", "chatbot", "math"}) {
      Served s(engine_options(9, 512, PreemptionMode::kSwap, 64));
      ASSERT_TRUE(s.engine);
      const auto sessions = run_sessions(s, hold, 4, std::chrono::milliseconds(20), kind);
      for (const Session& one : sessions) EXPECT_TRUE(one.error.empty()) << one.error;
      EXPECT_EQ(generated(sessions), reference) << hold_policy_name(hold) << " kind '" << kind << "'";
      const EngineStatus st = s.engine->status();
      EXPECT_EQ(st.kv_blocks_used, 0);
      int64_t decided = 0;
      std::string seen;
      for (const auto& [key, n] : st.intercepts.decisions) {
        decided += n;
        seen += key.first + "/" + key.second + "=" + std::to_string(n) + " ";
      }
      std::printf("%s kind '%s': %s preemptions %lld\n", hold_policy_name(hold), kind, seen.c_str(), (long long)st.preemptions);
      EXPECT_EQ(decided, 4 * (kPauses + 1)) << hold_policy_name(hold);
    }
  }
}

TEST(InterceptEngine, PoliciesHoldPausedKvAsTheySay) {
  for (HoldPolicy hold : kPolicies) {
    Served s(engine_options(64, 512, PreemptionMode::kRecompute, 64));
    ASSERT_TRUE(s.engine);
    GenerationRequest r = session_request(*s.model, "a", kStoryPrompts[0], hold, "chatbot");
    auto stream = s.engine->submit(std::move(r));
    ASSERT_TRUE(stream.ok());
    Session one;
    ASSERT_TRUE(drain_segment(**stream, one));
    // Min-waste acts on the steps of other requests: run one beside the pause.
    auto other = s.engine->submit(make_generation(*s.model, "b", kStoryPrompts[1], ExitRule{}, 0.0f, 40));
    ASSERT_TRUE(other.ok());
    testing::drain(**other);
    const InterceptStats st = s.engine->status().intercepts;
    EXPECT_EQ(st.paused, 1);
    switch (hold) {
      case HoldPolicy::kDiscard:
      case HoldPolicy::kImprovedDiscard:
        EXPECT_EQ(st.paused_kv_bytes, 0);
        EXPECT_EQ(st.swapped_kv_bytes, 0);
        break;
      case HoldPolicy::kPreserve:
        EXPECT_GT(st.paused_kv_bytes, 0);
        EXPECT_EQ(st.swapped_kv_bytes, 0);
        break;
      case HoldPolicy::kSwap:
        EXPECT_EQ(st.paused_kv_bytes, 0);
        EXPECT_GT(st.swapped_kv_bytes, 0);
        break;
      case HoldPolicy::kMinWaste:
        // A 28.6 s chatbot pause costs more held than recomputed or swapped: it leaves the device.
        EXPECT_EQ(st.paused_kv_bytes, 0);
        break;
    }
    EXPECT_TRUE(s.engine->abort("a"));
    Session rest;
    drain_segment(**stream, rest);
    EXPECT_EQ(rest.finish, FinishReason::kAborted);
  }
}

TEST(InterceptEngine, ResumeAndEndCheckTheRequestIsPaused) {
  Served s(engine_options(64));
  ASSERT_TRUE(s.engine);
  EXPECT_EQ(s.engine->resume("nobody", {1}, 4).code(), StatusCode::kNotFound);
  GenerationRequest r = session_request(*s.model, "a", kStoryPrompts[0], HoldPolicy::kPreserve);
  r.max_tokens = 200;  // not paused for a while
  auto stream = s.engine->submit(std::move(r));
  ASSERT_TRUE(stream.ok());
  const Status early = s.engine->resume("a", {1}, 4);
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition) << early.message();
  Session one;
  ASSERT_TRUE(drain_segment(**stream, one));
  EXPECT_EQ(s.engine->resume("a", {}, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.engine->resume("a", {s.model->config().n_vocab}, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.engine->resume("a", {1}, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s.engine->end_paused("a").ok());
  // No longer paused: its end is queued (FAILED_PRECONDITION), or the loop has already finished
  // it and forgotten the id (NOT_FOUND), whichever the loop thread got to first.
  const StatusCode again = s.engine->end_paused("a").code();
  EXPECT_TRUE(again == StatusCode::kFailedPrecondition || again == StatusCode::kNotFound) << static_cast<int>(again);
  drain_segment(**stream, one);
  EXPECT_EQ(one.finish, FinishReason::kStop);
}

TEST(InterceptEngine, StringTriggerPausesWithTheMatchInTheText) {
  Served s(engine_options(64));
  ASSERT_TRUE(s.engine);
  // Find a word the model writes, then use it as the trigger.
  auto probe = s.engine->submit(make_generation(*s.model, "probe", kStoryPrompts[0], ExitRule{}, 0.0f, 30));
  ASSERT_TRUE(probe.ok());
  const auto ids = testing::drain(**probe).ids;
  const std::string text = s.model->tokenizer().decode(ids);
  const std::string word = text.substr(text.size() / 2, 3);
  GenerationRequest r = make_generation(*s.model, "a", kStoryPrompts[0], ExitRule{}, 0.0f, 30);
  r.intercept.triggers.strings = {word};
  auto stream = s.engine->submit(std::move(r));
  ASSERT_TRUE(stream.ok());
  Session one;
  ASSERT_TRUE(drain_segment(**stream, one)) << "no pause on '" << word << "' in '" << text << "'";
  EXPECT_EQ(one.events[0].trigger, "string");
  EXPECT_EQ(one.events[0].matched, word);
  const std::string so_far = s.model->tokenizer().decode(one.segments[0]);
  EXPECT_NE(so_far.find(word), std::string::npos);
  EXPECT_TRUE(s.engine->end_paused("a").ok());
}

}  // namespace
}  // namespace helios

namespace helios {
namespace {

TEST(InterceptEngine, AStreamNeverMergesAPauseIntoTheUpdatesAfterIt) {
  RequestStream stream;
  GenerationUpdate paused;
  paused.tokens.push_back(TokenEvent{});
  paused.intercept = InterceptEvent{};
  paused.intercept->index = 1;
  GenerationUpdate after;
  after.tokens.push_back(TokenEvent{});
  after.finish = FinishReason::kAborted;
  stream.push(paused);
  stream.push(after);
  auto first = stream.pop(std::chrono::milliseconds(10));
  ASSERT_TRUE(first && first->intercept);
  EXPECT_EQ(first->tokens.size(), 1u);
  auto second = stream.pop(std::chrono::milliseconds(10));
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->intercept);
  EXPECT_EQ(second->finish, FinishReason::kAborted);
}

}  // namespace
}  // namespace helios
