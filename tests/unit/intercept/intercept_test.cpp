// Intercepts: hold-policy names, the trigger matcher, tool-call parsing, the forward-time profile
// and INFERCEPT's waste equations and min-waste schedule, against hand-computed numbers.
#include "helios/intercept.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace helios {
namespace {

// ---- hold policies and priors ----

TEST(InterceptHoldPolicy, NamesRoundTrip) {
  for (HoldPolicy p : {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard, HoldPolicy::kPreserve, HoldPolicy::kSwap,
                       HoldPolicy::kMinWaste}) {
    const std::optional<HoldPolicy> parsed = parse_hold_policy(hold_policy_name(p));
    ASSERT_TRUE(parsed.has_value()) << hold_policy_name(p);
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_STREQ(hold_policy_name(HoldPolicy::kDiscard), "discard");
  EXPECT_STREQ(hold_policy_name(HoldPolicy::kImprovedDiscard), "improved-discard");
  EXPECT_STREQ(hold_policy_name(HoldPolicy::kPreserve), "preserve");
  EXPECT_STREQ(hold_policy_name(HoldPolicy::kSwap), "swap");
  EXPECT_STREQ(hold_policy_name(HoldPolicy::kMinWaste), "min-waste");
}

TEST(InterceptHoldPolicy, UnknownNamesAreRejected) {
  for (const char* name : {"", "Discard", "min_waste", "minwaste", "swap ", "recompute"}) {
    EXPECT_FALSE(parse_hold_policy(name).has_value()) << "'" << name << "'";
  }
}

TEST(InterceptPriors, TableOneMeans) {
  const std::map<std::string, double> priors = default_pause_priors();
  EXPECT_EQ(priors.size(), 6u);
  EXPECT_DOUBLE_EQ(priors.at("math"), 9e-5);
  EXPECT_DOUBLE_EQ(priors.at("qa"), 0.69);
  EXPECT_DOUBLE_EQ(priors.at("ve"), 0.09);
  EXPECT_DOUBLE_EQ(priors.at("chatbot"), 28.6);
  EXPECT_DOUBLE_EQ(priors.at("image"), 20.03);
  EXPECT_DOUBLE_EQ(priors.at("tts"), 17.24);
}

TEST(InterceptConfigStruct, Defaults) {
  const InterceptConfig config;
  EXPECT_EQ(config.default_hold, HoldPolicy::kMinWaste);
  EXPECT_EQ(config.pause_priors, default_pause_priors());
  EXPECT_TRUE(config.profile_at_start);
  EXPECT_DOUBLE_EQ(config.paused_idle_timeout_s, 300);
}

// ---- the matcher ----

InterceptTriggers string_triggers(std::vector<std::string> strings) {
  InterceptTriggers t;
  t.strings = std::move(strings);
  return t;
}

InterceptTriggers tool_triggers() {
  InterceptTriggers t;
  t.tool_calls = true;
  return t;
}

TEST(InterceptMatcher, TriggersAny) {
  EXPECT_FALSE(InterceptTriggers().any());
  EXPECT_TRUE(string_triggers({"x"}).any());
  EXPECT_TRUE(tool_triggers().any());
  InterceptTriggers eot;
  eot.end_of_turn = true;
  EXPECT_TRUE(eot.any());
}

TEST(InterceptMatcher, StringTriggerSplitAcrossPushes) {
  InterceptMatcher m(string_triggers({"Action:"}));
  EXPECT_FALSE(m.push(1, "Thought: look it up\nAct", false).has_value());
  EXPECT_FALSE(m.push(2, "ion", false).has_value());
  const std::optional<InterceptEvent> e = m.push(3, ": search", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->trigger, "string");
  EXPECT_EQ(e->matched, "Action:");
  EXPECT_EQ(e->text, "Thought: look it up\nAction:");  // up to and including the trigger
  EXPECT_TRUE(e->tool_name.empty());
  EXPECT_TRUE(e->parse_error.empty());
}

TEST(InterceptMatcher, StringTriggerFiresOnceAndAgainOnANewOccurrence) {
  InterceptMatcher m(string_triggers({"STOP"}));
  ASSERT_TRUE(m.push(1, "a STOP", false).has_value());
  EXPECT_FALSE(m.push(2, " b", false).has_value());  // the old match is not reported again
  EXPECT_FALSE(m.push(3, "", false).has_value());
  const std::optional<InterceptEvent> e = m.push(4, " STOP", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->text, "a STOP b STOP");
}

TEST(InterceptMatcher, EarliestEndingStringWins) {
  InterceptMatcher m(string_triggers({"world", "lo"}));
  const std::optional<InterceptEvent> e = m.push(1, "hello world", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->matched, "lo");
  EXPECT_EQ(e->text, "hello");
}

TEST(InterceptMatcher, StartSegmentClearsOldText) {
  InterceptMatcher m(string_triggers({"ab"}));
  EXPECT_FALSE(m.push(1, "a", false).has_value());
  m.start_segment();
  EXPECT_FALSE(m.push(2, "b", false).has_value());  // "a" belonged to the last segment
  EXPECT_FALSE(m.push(3, "a", false).has_value());
  const std::optional<InterceptEvent> e = m.push(4, "b", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->text, "bab");  // only the new segment's text
}

TEST(InterceptMatcher, StartSegmentAfterAnEvent) {
  InterceptMatcher m(string_triggers({"?"}));
  ASSERT_TRUE(m.push(1, "why?", false).has_value());
  m.start_segment();
  const std::optional<InterceptEvent> e = m.push(2, "because. how?", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->text, "because. how?");
}

TEST(InterceptMatcher, ToolCallAcrossPushes) {
  InterceptMatcher m(tool_triggers());
  EXPECT_FALSE(m.push(1, "I'll check. <tool", false).has_value());
  EXPECT_FALSE(m.push(2, "_call>\n{\"name\": \"get_weather\", ", false).has_value());
  EXPECT_FALSE(m.push(3, "\"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool", false).has_value());
  const std::optional<InterceptEvent> e = m.push(4, "_call>", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->trigger, "tool_call");
  EXPECT_EQ(e->matched, "</tool_call>");
  EXPECT_EQ(e->text, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}");
  EXPECT_EQ(e->tool_name, "get_weather");
  EXPECT_EQ(e->arguments_json, "{\"city\":\"Paris\",\"unit\":\"c\"}");  // compact, in the model's key order
  EXPECT_EQ(e->parse_error, "");
}

TEST(InterceptMatcher, ToolCallWithJsonStringArguments) {
  InterceptMatcher m(tool_triggers());
  const std::optional<InterceptEvent> e =
      m.push(1, "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"b\\\": 2, \\\"a\\\": [1]}\"}</tool_call>", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->tool_name, "add");
  EXPECT_EQ(e->arguments_json, "{\"b\":2,\"a\":[1]}");
  EXPECT_EQ(e->parse_error, "");
}

TEST(InterceptMatcher, ToolCallUsesTheLastOpenBeforeTheClose) {
  InterceptMatcher m(tool_triggers());
  const std::optional<InterceptEvent> e =
      m.push(1, "<tool_call> oops <tool_call> {\"name\": \"f\"} </tool_call>", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->text, "{\"name\": \"f\"}");
  EXPECT_EQ(e->tool_name, "f");
  EXPECT_EQ(e->arguments_json, "{}");
}

TEST(InterceptMatcher, MalformedToolCallIsStillAnEvent) {
  InterceptMatcher m(tool_triggers());
  const std::optional<InterceptEvent> e = m.push(1, "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->trigger, "tool_call");
  EXPECT_EQ(e->text, "{\"name\": \"f\", \"arguments\": {");
  EXPECT_EQ(e->parse_error.rfind("the tool call is not JSON: ", 0), 0u) << e->parse_error;
  EXPECT_EQ(e->arguments_json, "");
}

TEST(InterceptMatcher, CloseWithoutOpenIsText) {
  InterceptMatcher m(tool_triggers());
  EXPECT_FALSE(m.push(1, "a stray </tool_call> here", false).has_value());
}

TEST(InterceptMatcher, CustomToolCallMarkup) {
  InterceptTriggers t;
  t.tool_calls = true;
  t.tool_call_open = "[CALL]";
  t.tool_call_close = "[/CALL]";
  InterceptMatcher m(t);
  EXPECT_FALSE(m.push(1, "<tool_call>{\"name\": \"x\"}</tool_call>", false).has_value());
  const std::optional<InterceptEvent> e = m.push(2, "[CALL]{\"name\": \"y\"}[/CALL]", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->matched, "[/CALL]");
  EXPECT_EQ(e->tool_name, "y");
}

TEST(InterceptMatcher, ToolCallsOffIgnoresMarkup) {
  InterceptMatcher m(InterceptTriggers{});
  EXPECT_FALSE(m.push(1, "<tool_call>{\"name\": \"f\"}</tool_call>", false).has_value());
}

TEST(InterceptMatcher, TokenTrigger) {
  InterceptTriggers t;
  t.token_ids = {7, 9};
  InterceptMatcher m(t);
  EXPECT_FALSE(m.push(3, "ask ", false).has_value());
  std::optional<InterceptEvent> e = m.push(9, "<|observe|>", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->trigger, "token");
  EXPECT_EQ(e->matched, "<|observe|>");
  EXPECT_EQ(e->text, "ask <|observe|>");
  m.start_segment();
  e = m.push(7, "", false);  // a token whose text is held back still pauses
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->matched, "");
  EXPECT_EQ(e->text, "");
}

TEST(InterceptMatcher, TokenTriggerComesBeforeAString) {
  InterceptTriggers t;
  t.token_ids = {5};
  t.strings = {"x"};
  InterceptMatcher m(t);
  const std::optional<InterceptEvent> e = m.push(5, "x", false);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->trigger, "token");
}

TEST(InterceptMatcher, EndOfTurnOnlyWhenEnabled) {
  InterceptMatcher off(string_triggers({"zzz"}));
  EXPECT_FALSE(off.push(2, "done.", true).has_value());

  InterceptTriggers t;
  t.end_of_turn = true;
  InterceptMatcher on(t);
  EXPECT_FALSE(on.push(1, "Hello.", false).has_value());
  const std::optional<InterceptEvent> e = on.push(2, "", true);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->trigger, "end_of_turn");
  EXPECT_EQ(e->text, "Hello.");
}

// ---- parse_tool_call ----

TEST(InterceptToolCall, ParsesNameAndArguments) {
  std::string name, args, error;
  ASSERT_TRUE(parse_tool_call(" {\"name\": \"f\", \"arguments\": {\"q\": \"caf\xc3\xa9\"}} ", &name, &args, &error));
  EXPECT_EQ(name, "f");
  EXPECT_EQ(args, "{\"q\":\"caf\xc3\xa9\"}");
  EXPECT_EQ(error, "");
  ASSERT_TRUE(parse_tool_call("{\"name\": \"g\", \"arguments\": null}", &name, &args, &error));
  EXPECT_EQ(args, "{}");
}

TEST(InterceptToolCall, ErrorsSayWhatIsWrong) {
  std::string name, args, error;
  EXPECT_FALSE(parse_tool_call("{\"arguments\": {}}", &name, &args, &error));
  EXPECT_EQ(error, "the tool call has no \"name\" string");
  EXPECT_FALSE(parse_tool_call("{\"name\": 3}", &name, &args, &error));
  EXPECT_EQ(error, "the tool call has no \"name\" string");
  EXPECT_FALSE(parse_tool_call("not json", &name, &args, &error));
  EXPECT_EQ(error.rfind("the tool call is not JSON: ", 0), 0u) << error;
  EXPECT_FALSE(parse_tool_call("[1, 2]", &name, &args, &error));
  EXPECT_EQ(error.rfind("the tool call is not a JSON object", 0), 0u) << error;
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\", \"arguments\": [1]}", &name, &args, &error));
  EXPECT_EQ(error, "the tool call's \"arguments\" is not a JSON object, got array");
  EXPECT_EQ(name, "f");  // kept: the client can say which call was malformed
  EXPECT_EQ(args, "");
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\", \"arguments\": \"{oops\"}", &name, &args, &error));
  EXPECT_EQ(error.rfind("the tool call's \"arguments\" string is not JSON: ", 0), 0u) << error;
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\", \"arguments\": \"[1]\"}", &name, &args, &error));
  EXPECT_EQ(error, "the tool call's \"arguments\" is not a JSON object, got array");
  // A number past a double's range is valid JSON that the parser refuses (found by fuzz_json_grammar
  // in the schema parser): an error saying so, not an exception out of the engine's thread.
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\", \"arguments\": {\"x\": 1e999}}", &name, &args, &error));
  EXPECT_EQ(error.rfind("the tool call is not JSON: ", 0), 0u) << error;
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": -2e400}\"}", &name, &args, &error));
  EXPECT_EQ(error.rfind("the tool call's \"arguments\" string is not JSON: ", 0), 0u) << error;
  // A success after a failure clears the error.
  ASSERT_TRUE(parse_tool_call("{\"name\": \"f\"}", &name, &args, &error));
  EXPECT_EQ(error, "");
}

// ---- the forward-time profile ----

// T(n) = 0.01 + 0.001 n from 10 tokens (0.02 s) to 110 (0.12 s); 0.02 s below 10.
StepTimeProfile two_point_profile() {
  StepTimeProfile p;
  p.set_point(110, 0.12);
  p.set_point(10, 0.02);
  return p;
}

TEST(InterceptProfile, PiecewiseLinearAndExtrapolated) {
  StepTimeProfile p;
  EXPECT_EQ(p.seconds(10), 0);
  p.set_point(200, 0.25);
  EXPECT_DOUBLE_EQ(p.seconds(1000), 0.25);  // one point: its time
  p.set_point(10, 0.02);
  p.set_point(100, 0.05);
  ASSERT_EQ(p.points().size(), 3u);
  EXPECT_EQ(p.points()[0].first, 10);  // kept ascending
  EXPECT_EQ(p.points()[2].first, 200);
  EXPECT_DOUBLE_EQ(p.seconds(1), 0.02);   // below the first point: its time
  EXPECT_DOUBLE_EQ(p.seconds(10), 0.02);
  EXPECT_NEAR(p.seconds(55), 0.035, 1e-12);
  EXPECT_DOUBLE_EQ(p.seconds(100), 0.05);
  EXPECT_NEAR(p.seconds(150), 0.15, 1e-12);
  EXPECT_NEAR(p.seconds(300), 0.45, 1e-12);  // past the last: the last two's slope, 0.002 s/token
}

TEST(InterceptProfile, SetPointReplacesAndIgnoresInvalid) {
  StepTimeProfile p = two_point_profile();
  p.set_point(10, 0.03);
  p.set_point(0, 1.0);
  p.set_point(50, 0.0);
  p.set_point(50, -1.0);
  ASSERT_EQ(p.points().size(), 2u);
  EXPECT_DOUBLE_EQ(p.points()[0].second, 0.03);
}

TEST(InterceptProfile, ObserveMovesTheNearestPointByLogTenPercent) {
  StepTimeProfile p;
  p.observe(32, 1.0);  // without points: ignored
  EXPECT_TRUE(p.points().empty());
  p.set_point(16, 0.01);
  p.set_point(256, 0.1);
  p.observe(32, 0.03);
  EXPECT_NEAR(p.points()[0].second, 0.012, 1e-12);
  EXPECT_DOUBLE_EQ(p.points()[1].second, 0.1);
  // 128 is nearer 16 than 256 in tokens but nearer 256 by log (×2 vs ×8).
  p.observe(128, 0.2);
  EXPECT_NEAR(p.points()[0].second, 0.012, 1e-12);
  EXPECT_NEAR(p.points()[1].second, 0.11, 1e-12);
  p.observe(4096, 0.0);  // not a step time: ignored
  EXPECT_NEAR(p.points()[1].second, 0.11, 1e-12);
}

TEST(InterceptProfile, SaturationFlatThenLinear) {
  StepTimeProfile p;
  EXPECT_EQ(p.saturation_tokens(), 1);
  for (int32_t n : {1, 8, 16, 32}) p.set_point(n, 0.01);
  p.set_point(64, 0.02);
  p.set_point(128, 0.04);
  EXPECT_EQ(p.saturation_tokens(), 32);
}

TEST(InterceptProfile, SaturationAllLinearIsTheFirstPoint) {
  StepTimeProfile p;
  p.set_point(64, 0.064);
  EXPECT_EQ(p.saturation_tokens(), 64);  // one point: its count
  p.set_point(8, 0.008);
  p.set_point(16, 0.016);
  EXPECT_EQ(p.saturation_tokens(), 8);
}

TEST(InterceptProfile, SaturationIsWhereThroughputReachesEightyPercentOfItsBest) {
  StepTimeProfile p;
  p.set_point(10, 1.0);  // 10 tokens/s
  p.set_point(20, 1.2);  // 16.7: under 80% of the best
  p.set_point(40, 1.6);  // 25: the best
  p.set_point(80, 3.2);  // 25: linear from here
  EXPECT_EQ(p.saturation_tokens(), 40);
}

// ---- the waste equations ----

// M = 1000 bytes per token, 1 MB/s device <-> host.
WasteModel test_model() {
  WasteModel m;
  m.forward = two_point_profile();
  m.copy_bytes_per_second = 1e6;
  m.kv_bytes_per_token = 1000;
  return m;
}

TEST(InterceptWaste, EquationsByHand) {
  const WasteModel m = test_model();
  // Eq. 2: 2 s × 50 tokens × 1000 B.
  EXPECT_DOUBLE_EQ(m.preserve(2.0, 50), 100000);
  // Eq. 1: T(90) = 0.1; 0.1 × 90 × 1000 + 0.1 × 200 × 1000.
  EXPECT_NEAR(m.discard(90, 200), 29000, 1e-6);
  // Eq. 4 with chunks of 40: n = 3, T(30) = 0.04; 0.1 × 90 × 1000 / 2 + 3 × 0.04 × 200 × 1000.
  EXPECT_NEAR(m.chunked_discard(90, 200, 40), 4500 + 24000, 1e-6);
  // Chunk 0 counts as 1: n = 90, T(1) = 0.02 (the first point's time).
  EXPECT_NEAR(m.chunked_discard(90, 200, 0), 4500 + 90 * 0.02 * 200 * 1000, 1e-6);
  // One chunk holding all of it: n = 1.
  EXPECT_NEAR(m.chunked_discard(90, 200, 512), 4500 + 0.1 * 200 * 1000, 1e-6);
  EXPECT_EQ(m.chunked_discard(0, 200, 40), 0);
  // T_swap(90) = 90 × 1000 / 1e6 = 0.09 s; Eq. 3: 2 × 0.09 × 200 × 1000.
  EXPECT_NEAR(m.swap_seconds(90), 0.09, 1e-12);
  EXPECT_NEAR(m.swap(90, 200), 36000, 1e-6);
}

TEST(InterceptWaste, SwapWithoutBandwidthIsFree) {
  WasteModel m = test_model();
  m.copy_bytes_per_second = 0;
  EXPECT_EQ(m.swap_seconds(1000), 0);
  EXPECT_EQ(m.swap(1000, 100), 0);
}

TEST(InterceptWaste, SwapBudgetTokens) {
  WasteModel m = test_model();
  m.kv_bytes_per_token = 3;
  m.copy_bytes_per_second = 1000;
  // T(60) = 0.07 s; 0.07 × 1000 / 3 = 23.3 tokens.
  EXPECT_EQ(m.swap_budget_tokens(60), 23);
  // Past the profile: T(210) = 0.22; 0.22 × 1000 / 3 = 73.3.
  EXPECT_EQ(m.swap_budget_tokens(210), 73);

  WasteModel no_bandwidth = m;
  no_bandwidth.copy_bytes_per_second = 0;
  EXPECT_EQ(no_bandwidth.swap_budget_tokens(60), 0);
  WasteModel no_size = m;
  no_size.kv_bytes_per_token = 0;
  EXPECT_EQ(no_size.swap_budget_tokens(60), 0);
  WasteModel no_profile = m;
  no_profile.forward = StepTimeProfile();
  EXPECT_EQ(no_profile.swap_budget_tokens(60), 0);
}

TEST(InterceptSwapBudget, EachConstraintBinds) {
  // (1) the budget: swap-in first, swap-out gets the rest.
  SwapBudget s = split_swap_budget(100, 80, 80, 1000, 1000);
  EXPECT_EQ(s.in_tokens, 80);
  EXPECT_EQ(s.out_tokens, 20);
  s = split_swap_budget(50, 80, 80, 1000, 1000);
  EXPECT_EQ(s.in_tokens, 50);
  EXPECT_EQ(s.out_tokens, 0);
  // (3) free device memory limits swap-in; swap-out may use what it leaves.
  s = split_swap_budget(100, 80, 80, 1000, 30);
  EXPECT_EQ(s.in_tokens, 30);
  EXPECT_EQ(s.out_tokens, 70);
  // (2) free host memory limits swap-out.
  s = split_swap_budget(100, 10, 80, 25, 1000);
  EXPECT_EQ(s.in_tokens, 10);
  EXPECT_EQ(s.out_tokens, 25);
  // What is wanted.
  s = split_swap_budget(100, 10, 20, 1000, 1000);
  EXPECT_EQ(s.in_tokens, 10);
  EXPECT_EQ(s.out_tokens, 20);
}

TEST(InterceptSwapBudget, NeverNegative) {
  SwapBudget s = split_swap_budget(-5, 10, 10, 100, 100);
  EXPECT_EQ(s.in_tokens, 0);
  EXPECT_EQ(s.out_tokens, 0);
  s = split_swap_budget(100, 10, 10, -1, -1);
  EXPECT_EQ(s.in_tokens, 0);
  EXPECT_EQ(s.out_tokens, 0);
}

// ---- min-waste ----

// With other = 200 and chunks of 40 (see EquationsByHand):
//   1: 90 tokens, a 0.1 s pause:  preserve 9000,  chunked discard 28500 → waste 9000, preserve
//   2: 90 tokens, a 100 s pause:  preserve 9e6,   chunked discard 28500 → waste 28500, discard
//   3: nothing on the device → no decision
//   4: 20 tokens, a 1 s pause:    preserve 20000, chunked discard 300 + 6000 → waste 6300, discard
std::vector<PausedContext> paused_set() {
  return {{1, 90, 90, 0.1}, {2, 90, 90, 100.0}, {3, 0, 64, 5.0}, {4, 20, 20, 1.0}};
}

TEST(InterceptMinWaste, NoBudgetPreservesShortAndDiscardsLongPauses) {
  const std::vector<HoldDecision> d = plan_min_waste(test_model(), paused_set(), 200, 40, 0);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].id, 2u);  // descending waste: 28500, 9000, 6300
  EXPECT_EQ(d[1].id, 1u);
  EXPECT_EQ(d[2].id, 4u);
  EXPECT_EQ(d[0].action, HoldAction::kDiscard);
  EXPECT_EQ(d[1].action, HoldAction::kPreserve);
  EXPECT_EQ(d[2].action, HoldAction::kDiscard);
  EXPECT_NEAR(d[0].waste_preserve, 9e6, 1e-3);
  EXPECT_NEAR(d[0].waste_discard, 28500, 1e-6);
  EXPECT_NEAR(d[1].waste_preserve, 9000, 1e-6);
  EXPECT_NEAR(d[2].waste_discard, 6300, 1e-6);
  for (const HoldDecision& x : d) EXPECT_EQ(x.swap_tokens, 0);
}

TEST(InterceptMinWaste, BudgetSwapsTheLargestWasteFirstTheLastInPart) {
  const std::vector<HoldDecision> d = plan_min_waste(test_model(), paused_set(), 200, 40, 100);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].id, 2u);
  EXPECT_EQ(d[0].action, HoldAction::kSwapOut);
  EXPECT_EQ(d[0].swap_tokens, 90);
  EXPECT_EQ(d[1].id, 1u);
  EXPECT_EQ(d[1].action, HoldAction::kSwapOut);
  EXPECT_EQ(d[1].swap_tokens, 10);  // what was left
  EXPECT_EQ(d[2].id, 4u);
  EXPECT_EQ(d[2].action, HoldAction::kDiscard);
  EXPECT_EQ(d[2].swap_tokens, 0);
}

TEST(InterceptMinWaste, BudgetSpentExactlyFallsBackToTheCheaper) {
  const std::vector<HoldDecision> d = plan_min_waste(test_model(), paused_set(), 200, 40, 90);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].action, HoldAction::kSwapOut);
  EXPECT_EQ(d[0].swap_tokens, 90);
  EXPECT_EQ(d[1].action, HoldAction::kPreserve);
  EXPECT_EQ(d[2].action, HoldAction::kDiscard);
}

TEST(InterceptMinWaste, LargeBudgetSwapsAll) {
  const std::vector<HoldDecision> d = plan_min_waste(test_model(), paused_set(), 200, 40, 1 << 20);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].swap_tokens, 90);
  EXPECT_EQ(d[1].swap_tokens, 90);
  EXPECT_EQ(d[2].swap_tokens, 20);
  for (const HoldDecision& x : d) EXPECT_EQ(x.action, HoldAction::kSwapOut);
}

TEST(InterceptMinWaste, EqualWasteKeepsTheGivenOrder) {
  const std::vector<HoldDecision> d =
      plan_min_waste(test_model(), {{7, 30, 30, 1.0}, {5, 30, 30, 1.0}, {6, 30, 30, 1.0}}, 200, 40, 0);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].id, 7u);
  EXPECT_EQ(d[1].id, 5u);
  EXPECT_EQ(d[2].id, 6u);
  EXPECT_TRUE(plan_min_waste(test_model(), {}, 200, 40, 100).empty());
}

}  // namespace
}  // namespace helios

namespace helios {
namespace {

TEST(InterceptBareToolCall, AFencedOrBareCallParsesAndAJsonAnswerDoesNot) {
  std::string name, args;
  EXPECT_TRUE(parse_bare_tool_call("  {\"name\": \"calc\", \"arguments\": {\"x\": 1}}\n", &name, &args));
  EXPECT_EQ(name, "calc");
  EXPECT_EQ(args, "{\"x\":1}");
  EXPECT_TRUE(parse_bare_tool_call("```json\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 2}\"}\n```", &name, &args));
  EXPECT_EQ(name, "f");
  EXPECT_EQ(args, "{\"a\":2}");
  EXPECT_FALSE(parse_bare_tool_call("{\"name\": \"f\"}", &name, &args));  // no arguments: an answer
  EXPECT_FALSE(parse_bare_tool_call("The answer is {\"name\": 1}", &name, &args));
  EXPECT_FALSE(parse_bare_tool_call("{not json", &name, &args));
}

}  // namespace
}  // namespace helios
