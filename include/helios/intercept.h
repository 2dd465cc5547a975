// Intercepts (INFERCEPT, Abhyankar et al., ICML 2024): a generation that pauses for a tool call or
// a human turn and resumes in place. This header is the pure part: what pauses a generation, the
// ways to hold a paused context, the pause-length priors, the forward-time profile, and the
// paper's waste equations and per-iteration decisions. The scheduler and the engine apply them.
//
// Units: time in seconds, memory in tokens of KV (× kv_bytes_per_token for bytes), waste in
// byte·seconds (memory held × the time it produced nothing).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "helios/tokenizer.h"

namespace helios {

// How a paused generation's KV is held until it resumes.
enum class HoldPolicy {
  kDiscard,          // dropped; the resumed request queues at the tail and recomputes (vLLM today)
  kImprovedDiscard,  // dropped; queues at its original arrival time
  kPreserve,         // stays in device blocks
  kSwap,             // copied whole to host memory at the pause and back at the resume
  kMinWaste,         // per pause and iteration, the least waste (INFERCEPT): swap within the
                     // iteration's budget, else preserve or discard (chunked recompute)
};

const char* hold_policy_name(HoldPolicy policy);  // discard | improved-discard | preserve | swap | min-waste
std::optional<HoldPolicy> parse_hold_policy(std::string_view name);

// The tool-call markup of the chat templates Helios knows (Qwen2.5, Hermes): <tool_call>
// {"name": ..., "arguments": {...}} </tool_call>. Intercepts pause at its close; the OpenAI API
// parses it into tool_calls and writes its opening to force a call.
inline constexpr char kToolCallOpen[] = "<tool_call>";
inline constexpr char kToolCallClose[] = "</tool_call>";

// What pauses a generation. A trigger does not end it: its text stays in the output and in the
// context the generation resumes from.
struct InterceptTriggers {
  std::vector<std::string> strings;  // pause once the segment's text contains one
  std::vector<TokenId> token_ids;    // pause after one of these tokens
  // Pause at the close of the chat template's tool-call markup.
  bool tool_calls = false;
  std::string tool_call_open = kToolCallOpen;
  std::string tool_call_close = kToolCallClose;
  // An end-of-generation token pauses for the next human turn instead of finishing.
  bool end_of_turn = false;
  // A segment that reaches its max_tokens pauses (trigger "length") instead of finishing: for
  // clients that know where the calls fall (a replay of recorded tool-use traces). The engine
  // applies it; the matcher does not see it.
  bool on_length = false;

  bool any() const { return !strings.empty() || !token_ids.empty() || tool_calls || end_of_turn || on_length; }
};

// One pause, as the client hears of it.
struct InterceptEvent {
  std::string trigger;         // "string" | "token" | "tool_call" | "end_of_turn" | "length"
  std::string matched;         // the trigger string, the token's text, or the markup's close
  // The segment's text (since the open or the last resume) up to and including the trigger; for
  // a tool call, the body between the markup's open and close.
  std::string text;
  std::string tool_name;       // a tool call whose body is {"name": ..., "arguments": ...}
  std::string arguments_json;  // its arguments as compact JSON ("{}" when it has none)
  std::string parse_error;     // a tool call whose body is not that JSON: why ("" otherwise)
  int32_t index = 0;           // 1 for a session's first pause
  int32_t context_tokens = 0;  // tokens in the context when it paused (the trigger's included)
};

// Watches one generation's text, segment by segment, for its triggers.
class InterceptMatcher {
 public:
  explicit InterceptMatcher(InterceptTriggers triggers);

  // After each generated token: its id, the text it released (may be empty while UTF-8 is held
  // back), and whether it is an end-of-generation token. The event when this token pauses the
  // generation (index and context_tokens are left for the caller to fill); nullopt otherwise.
  // A string trigger is matched once its whole text has been released, so it may fire a token
  // after the one that completed it when the text was held back.
  std::optional<InterceptEvent> push(TokenId id, const std::string& text, bool end_of_generation);
  // A resume starts a new segment: earlier text can no longer match.
  void start_segment();
  const InterceptTriggers& triggers() const { return triggers_; }

 private:
  InterceptTriggers triggers_;
  std::string segment_;  // the text released since the segment began
};

// Parses a tool call's body: {"name": "...", "arguments": {...} or "<json string>"} ("parameters"
// for "arguments", as Llama 3's templates ask for). On success name and compact JSON arguments;
// on failure *error says why.
bool parse_tool_call(std::string_view body, std::string* name, std::string* arguments_json, std::string* error);

// A text that is nothing but a tool call written without the markup: the bare {"name": ...,
// "arguments": ...}, possibly in a ``` fence, as small models write one (Qwen2.5-Coder-0.5B). Its
// name and compact JSON arguments; false for anything else.
bool parse_bare_tool_call(std::string_view text, std::string* name, std::string* arguments_json);
// A text that is nothing but bare calls: one, several one after another (white space or commas
// between), or a JSON list of them, possibly in a ``` fence. Each (name, compact JSON arguments);
// empty unless every part is a call.
std::vector<std::pair<std::string, std::string>> parse_bare_tool_calls(std::string_view text);

// Pause-length priors per augmentation kind, in seconds: INFERCEPT Table 1's means — math 9e-5,
// qa 0.69, ve (virtual environment) 0.09, chatbot 28.6, image 20.03, tts 17.24.
std::map<std::string, double> default_pause_priors();

// Intercepts of a server (config: intercepts; keys in configs/default.yaml).
struct InterceptConfig {
  HoldPolicy default_hold = HoldPolicy::kMinWaste;
  std::map<std::string, double> pause_priors = default_pause_priors();  // seconds, by kind
  // Measure the forward time by batch tokens and the device ↔ host copy bandwidth when an engine
  // starts (about a second on the CPU); off: learned from served steps alone.
  bool profile_at_start = true;
  // A paused session whose client says nothing for this long is ended (server side).
  double paused_idle_timeout_s = 300;
};

// Forward-pass time by the tokens a step computes: measured points (at start, then refined by
// served steps), piecewise linear between them and linear past the last two.
class StepTimeProfile {
 public:
  // A measured point; replaces one at the same token count. tokens > 0, seconds > 0.
  void set_point(int32_t tokens, double seconds);
  // A served step of `tokens` tokens that took `seconds`: moves the nearest point (by log of the
  // token count) 10% of the way toward it. Ignored without points.
  void observe(int32_t tokens, double seconds);
  // T_fwd(tokens); 0 without points; the first point's time for fewer tokens than it has.
  double seconds(double tokens) const;
  // The GPU saturation point S of the paper: the most tokens a step takes before its time grows
  // linearly with them. Here: the smallest measured count whose throughput (tokens / T) is at
  // least 80% of the best measured throughput; 1 without points.
  int32_t saturation_tokens() const;
  // Ascending by tokens.
  const std::vector<std::pair<int32_t, double>>& points() const { return points_; }

 private:
  std::vector<std::pair<int32_t, double>> points_;
};

// The paper's waste equations for one model: M (KV bytes per token), T_fwd and T_swap.
struct WasteModel {
  StepTimeProfile forward;
  double copy_bytes_per_second = 0;  // device ↔ host, measured at start
  int64_t kv_bytes_per_token = 0;    // M

  // T_swap(tokens): their KV over the copy bandwidth; 0 when the bandwidth is unknown.
  double swap_seconds(int64_t tokens) const;
  // N_i of the paper: the tokens whose copy hides behind a step of batch_tokens, from
  // T_swap(N_i) = T_fwd(B_i). 0 without a profile or bandwidth.
  int64_t swap_budget_tokens(int32_t batch_tokens) const;
  // Equation 2: WastePreserve = T_INT × C_i × M.
  double preserve(double pause_seconds, int64_t context) const;
  // Equation 1: WasteDiscard = T_fwd(C) × C × M + T_fwd(C) × C_other × M.
  double discard(int64_t context, int64_t other) const;
  // Equation 4, recompute in chunks of `chunk` tokens (n = ceil(C / chunk) iterations):
  // WasteChunkD = T_fwd(C) × C × M / 2 + n × T_fwd(C / n) × C_other × M.
  double chunked_discard(int64_t context, int64_t other, int32_t chunk) const;
  // Equation 3: WasteSwap = 2 × T_swap(C) × C_batch × M.
  double swap(int64_t context, int64_t batch) const;
};

// One iteration's swap budget, in tokens, split between swap-in and swap-out under the paper's
// three constraints: (1) in + out <= budget; (2) what is swapped out fits the free host memory;
// (3) what is swapped in fits the free device memory. Swap-in goes first: a resumed request
// waiting for its KV is work ready to run, a paused one is not.
struct SwapBudget {
  int64_t in_tokens = 0;
  int64_t out_tokens = 0;
};
SwapBudget split_swap_budget(int64_t budget_tokens, int64_t want_in, int64_t want_out, int64_t free_host_tokens,
                             int64_t free_device_tokens);

// A paused request as min-waste sees it in one iteration.
struct PausedContext {
  uint64_t id = 0;
  int64_t device_tokens = 0;   // KV still in device blocks (C_i for preserving)
  int64_t context_tokens = 0;  // its whole context (what a discard recomputes)
  double pause_seconds = 0;    // T_INT: the kind's prior, or t_now − t_call
};

enum class HoldAction { kPreserve, kSwapOut, kDiscard };

struct HoldDecision {
  uint64_t id = 0;
  HoldAction action = HoldAction::kPreserve;
  int64_t swap_tokens = 0;       // kSwapOut: tokens to copy out this iteration (<= device_tokens)
  double waste_preserve = 0;     // equation 2 for its device tokens
  double waste_discard = 0;      // equation 4 for its whole context
};

// INFERCEPT's schedule for paused requests in one iteration: each one's waste is
// min(WastePreserve, WasteChunkD) (equation 5); in descending order of it, their device KV is
// swapped out until `swap_out_budget_tokens` is spent (the last one possibly in part); every
// other one is preserved when WastePreserve <= WasteChunkD and discarded otherwise. `other_tokens`
// is C_other (the running requests' context), `chunk` the recompute chunk (S − running batch).
// One decision per paused request with device tokens, in that order.
std::vector<HoldDecision> plan_min_waste(const WasteModel& model, std::vector<PausedContext> paused,
                                         int64_t other_tokens, int32_t chunk, int64_t swap_out_budget_tokens);

}  // namespace helios
