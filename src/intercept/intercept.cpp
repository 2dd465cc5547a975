// Intercepts: hold-policy names, the trigger matcher, tool-call parsing, the pause priors, the
// forward-time profile and INFERCEPT's waste equations and min-waste schedule.
#include "helios/intercept.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace helios {
namespace {

using Json = nlohmann::ordered_json;  // keeps the arguments' keys in the order the model wrote them

constexpr HoldPolicy kHoldPolicies[] = {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard, HoldPolicy::kPreserve,
                                        HoldPolicy::kSwap, HoldPolicy::kMinWaste};

// The share of the linear regime's marginal cost at which a step counts as saturated.
constexpr double kSaturationShare = 0.8;
// How far observe() moves a point toward a served step.
constexpr double kObserveRate = 0.1;

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// The first occurrence of `needle` in `text` that ends after `old_size`, i.e. one that the text
// appended since then completed; npos when there is none. Earlier matches were already reported.
size_t find_ending_after(std::string_view text, std::string_view needle, size_t old_size, size_t from = 0) {
  if (needle.empty()) return std::string_view::npos;
  const size_t start = old_size + 1 > needle.size() ? old_size + 1 - needle.size() : 0;
  return text.find(needle, std::max(start, from));
}

// Compact JSON; invalid UTF-8 (the parser rejects it, so this is a guard) is replaced, not thrown.
std::string compact(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

const char* hold_policy_name(HoldPolicy policy) {
  switch (policy) {
    case HoldPolicy::kDiscard: return "discard";
    case HoldPolicy::kImprovedDiscard: return "improved-discard";
    case HoldPolicy::kPreserve: return "preserve";
    case HoldPolicy::kSwap: return "swap";
    case HoldPolicy::kMinWaste: return "min-waste";
  }
  return "?";
}

std::optional<HoldPolicy> parse_hold_policy(std::string_view name) {
  for (HoldPolicy p : kHoldPolicies) {
    if (name == hold_policy_name(p)) return p;
  }
  return std::nullopt;
}

// ---- the matcher ----

InterceptMatcher::InterceptMatcher(InterceptTriggers triggers) : triggers_(std::move(triggers)) {}

void InterceptMatcher::start_segment() { segment_.clear(); }

std::optional<InterceptEvent> InterceptMatcher::push(TokenId id, const std::string& text, bool end_of_generation) {
  const size_t old_size = segment_.size();
  segment_ += text;

  if (std::find(triggers_.token_ids.begin(), triggers_.token_ids.end(), id) != triggers_.token_ids.end()) {
    InterceptEvent event;
    event.trigger = "token";
    event.matched = text;  // no tokenizer here: what the token released is its text
    event.text = segment_;
    return event;
  }

  if (end_of_generation && triggers_.end_of_turn) {
    InterceptEvent event;
    event.trigger = "end_of_turn";
    event.matched = text;
    event.text = segment_;
    return event;
  }

  if (triggers_.tool_calls && !triggers_.tool_call_open.empty()) {
    const std::string& open = triggers_.tool_call_open;
    const std::string& close = triggers_.tool_call_close;
    // A close that the new text completed, with an open before it; a stray close is model text.
    for (size_t at = find_ending_after(segment_, close, old_size); at != std::string::npos;
         at = find_ending_after(segment_, close, old_size, at + 1)) {
      if (at < open.size()) continue;
      const size_t open_at = segment_.rfind(open, at - open.size());
      if (open_at == std::string::npos) continue;
      const size_t body_at = open_at + open.size();
      InterceptEvent event;
      event.trigger = "tool_call";
      event.matched = close;
      event.text = std::string(trim(std::string_view(segment_).substr(body_at, at - body_at)));
      parse_tool_call(event.text, &event.tool_name, &event.arguments_json, &event.parse_error);
      return event;
    }
  }

  // The string whose match ends first wins: the generation would have paused there.
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : triggers_.strings) {
    const size_t at = find_ending_after(segment_, s, old_size);
    if (at == std::string::npos) continue;
    if (best == nullptr || at + s.size() < best_end) {
      best = &s;
      best_end = at + s.size();
    }
  }
  if (best != nullptr) {
    InterceptEvent event;
    event.trigger = "string";
    event.matched = *best;
    event.text = segment_.substr(0, best_end);
    return event;
  }
  return std::nullopt;
}

bool parse_tool_call(std::string_view body, std::string* name, std::string* arguments_json, std::string* error) {
  name->clear();
  arguments_json->clear();
  error->clear();
  const auto fail = [&](std::string why) {
    *error = std::move(why);
    arguments_json->clear();
    return false;
  };

  Json call;
  try {
    call = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past a double
    return fail(std::string("the tool call is not JSON: ") + e.what());
  }
  if (!call.is_object()) {
    return fail(std::string("the tool call is not a JSON object with \"name\" and \"arguments\", got ") +
                call.type_name());
  }
  const auto name_it = call.find("name");
  if (name_it == call.end() || !name_it->is_string()) return fail("the tool call has no \"name\" string");
  // Kept on failures below too: the client can tell the model which call was malformed.
  *name = name_it->get<std::string>();

  auto args_it = call.find("arguments");
  if (args_it == call.end()) args_it = call.find("parameters");
  if (args_it == call.end() || args_it->is_null()) {
    *arguments_json = "{}";
    return true;
  }
  Json arguments = *args_it;
  // Some templates (and OpenAI's wire format) carry the arguments as a JSON string.
  if (arguments.is_string()) {
    const std::string text = arguments.get<std::string>();
    try {
      arguments = Json::parse(text);
    } catch (const Json::exception& e) {
      return fail(std::string("the tool call's \"arguments\" string is not JSON: ") + e.what());
    }
  }
  if (!arguments.is_object()) {
    return fail(std::string("the tool call's \"arguments\" is not a JSON object, got ") + arguments.type_name());
  }
  *arguments_json = compact(arguments);
  return true;
}

namespace {

std::string_view trim_space(std::string_view t) {
  const size_t b = t.find_first_not_of(" \t\r\n"), e = t.find_last_not_of(" \t\r\n");
  return b == std::string_view::npos ? std::string_view() : t.substr(b, e - b + 1);
}

// The text without white space around it and without a ``` fence (```json and the like) around that.
std::string_view unfenced(std::string_view text) {
  std::string_view body = trim_space(text);
  if (body.size() >= 6 && body.starts_with("```") && body.ends_with("```")) {
    const size_t nl = body.find('\n');
    body = body.substr(nl == std::string_view::npos ? 3 : nl + 1);
    body = trim_space(body.substr(0, body.size() - 3));
  }
  return body;
}

// A JSON object that is a call: a name and its arguments (or parameters); a JSON answer is not.
bool call_object(const Json& j, std::string* name, std::string* arguments_json) {
  if (!j.is_object() || !(j.contains("arguments") || j.contains("parameters"))) return false;
  std::string error;
  return parse_tool_call(j.dump(), name, arguments_json, &error);
}

}  // namespace

bool parse_bare_tool_call(std::string_view text, std::string* name, std::string* arguments_json) {
  const std::string_view body = unfenced(text);
  if (body.empty() || body.front() != '{') return false;
  return call_object(Json::parse(body, nullptr, /*allow_exceptions=*/false), name, arguments_json);
}

std::vector<std::pair<std::string, std::string>> parse_bare_tool_calls(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> calls;
  auto take = [&](const Json& j) {
    std::string name, arguments;
    if (!call_object(j, &name, &arguments)) return false;
    calls.emplace_back(std::move(name), std::move(arguments));
    return true;
  };
  std::string_view body = unfenced(text);
  if (body.starts_with('[')) {  // a list of calls
    const Json list = Json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!list.is_array() || list.empty()) return {};
    for (const Json& j : list) {
      if (!take(j)) return {};
    }
    return calls;
  }
  // Objects one after another: each ends where its braces balance (outside strings).
  while (!body.empty()) {
    if (body.front() != '{') return {};
    size_t end = 0;
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < body.size() && end == 0; ++i) {
      const char c = body[i];
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        end = i + 1;
      }
    }
    if (end == 0 || !take(Json::parse(body.substr(0, end), nullptr, /*allow_exceptions=*/false))) return {};
    body = trim_space(body.substr(end));
    if (body.starts_with(',')) body = trim_space(body.substr(1));
  }
  return calls;
}

std::map<std::string, double> default_pause_priors() {
  return {{"math", 9e-5}, {"qa", 0.69}, {"ve", 0.09}, {"chatbot", 28.6}, {"image", 20.03}, {"tts", 17.24}};
}

// ---- the forward-time profile ----

void StepTimeProfile::set_point(int32_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const auto it = std::lower_bound(points_.begin(), points_.end(), tokens,
                                   [](const std::pair<int32_t, double>& p, int32_t t) { return p.first < t; });
  if (it != points_.end() && it->first == tokens) {
    it->second = seconds;
  } else {
    points_.insert(it, {tokens, seconds});
  }
}

void StepTimeProfile::observe(int32_t tokens, double seconds) {
  if (points_.empty() || tokens <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  // By log distance: step times span orders of magnitude of tokens (1 ... thousands).
  const double log_tokens = std::log(static_cast<double>(tokens));
  size_t nearest = 0;
  double nearest_distance = INFINITY;
  for (size_t i = 0; i < points_.size(); ++i) {
    const double d = std::abs(std::log(static_cast<double>(points_[i].first)) - log_tokens);
    if (d < nearest_distance) {
      nearest = i;
      nearest_distance = d;
    }
  }
  points_[nearest].second += kObserveRate * (seconds - points_[nearest].second);
}

double StepTimeProfile::seconds(double tokens) const {
  if (points_.empty()) return 0;
  if (points_.size() == 1 || tokens <= points_.front().first) return points_.front().second;
  // The segment that holds `tokens`, or the last one to extrapolate along.
  size_t hi = 1;
  while (hi + 1 < points_.size() && tokens > points_[hi].first) ++hi;
  const auto [n0, t0] = points_[hi - 1];
  const auto [n1, t1] = points_[hi];
  const double t = t0 + (t1 - t0) * (tokens - n0) / static_cast<double>(n1 - n0);
  return std::max(t, 0.0);  // a falling last segment (noise) must not extrapolate below zero
}

int32_t StepTimeProfile::saturation_tokens() const {
  if (points_.empty()) return 1;
  // Throughput (tokens per second of step) climbs while a step has idle compute and levels off
  // once time grows linearly: S is where it first comes within kSaturationShare of its best.
  // Throughputs, unlike marginal costs, do not amplify the noise of neighbouring points.
  double best = 0;
  for (const auto& [n, t] : points_) best = std::max(best, n / t);
  for (const auto& [n, t] : points_) {
    if (n / t >= kSaturationShare * best) return n;
  }
  return points_.back().first;
}

// ---- the waste equations ----

double WasteModel::swap_seconds(int64_t tokens) const {
  if (!(copy_bytes_per_second > 0)) return 0;
  return static_cast<double>(tokens) * static_cast<double>(kv_bytes_per_token) / copy_bytes_per_second;
}

int64_t WasteModel::swap_budget_tokens(int32_t batch_tokens) const {
  const double forward_seconds = forward.seconds(batch_tokens);
  if (!(forward_seconds > 0) || !(copy_bytes_per_second > 0) || kv_bytes_per_token <= 0) return 0;
  return static_cast<int64_t>(std::floor(forward_seconds * copy_bytes_per_second / static_cast<double>(kv_bytes_per_token)));
}

double WasteModel::preserve(double pause_seconds, int64_t context) const {
  return pause_seconds * static_cast<double>(context) * static_cast<double>(kv_bytes_per_token);
}

double WasteModel::discard(int64_t context, int64_t other) const {
  const double t = forward.seconds(static_cast<double>(context));
  const double m = static_cast<double>(kv_bytes_per_token);
  return t * static_cast<double>(context) * m + t * static_cast<double>(other) * m;
}

double WasteModel::chunked_discard(int64_t context, int64_t other, int32_t chunk) const {
  if (context <= 0) return 0;
  const int64_t per_chunk = std::max<int64_t>(1, chunk);
  const int64_t n = (context + per_chunk - 1) / per_chunk;
  const double m = static_cast<double>(kv_bytes_per_token);
  // The recomputed context grows from 0 to C over the recompute: on average half of it is held.
  const double own = forward.seconds(static_cast<double>(context)) * static_cast<double>(context) * m / 2;
  // Each of the n iterations stalls the running requests' KV for one chunk's forward time.
  const double others = static_cast<double>(n) * forward.seconds(static_cast<double>(context) / static_cast<double>(n)) *
                        static_cast<double>(other) * m;
  return own + others;
}

double WasteModel::swap(int64_t context, int64_t batch) const {
  return 2 * swap_seconds(context) * static_cast<double>(batch) * static_cast<double>(kv_bytes_per_token);
}

SwapBudget split_swap_budget(int64_t budget_tokens, int64_t want_in, int64_t want_out, int64_t free_host_tokens,
                             int64_t free_device_tokens) {
  SwapBudget split;
  split.in_tokens = std::max<int64_t>(0, std::min({want_in, budget_tokens, free_device_tokens}));
  split.out_tokens = std::max<int64_t>(0, std::min({want_out, budget_tokens - split.in_tokens, free_host_tokens}));
  return split;
}

std::vector<HoldDecision> plan_min_waste(const WasteModel& model, std::vector<PausedContext> paused,
                                         int64_t other_tokens, int32_t chunk, int64_t swap_out_budget_tokens) {
  struct Scored {
    HoldDecision decision;
    int64_t device_tokens;
    double waste;  // equation 5
  };
  std::vector<Scored> scored;
  scored.reserve(paused.size());
  for (const PausedContext& p : paused) {
    if (p.device_tokens <= 0) continue;  // nothing on the device to decide about
    Scored s;
    s.decision.id = p.id;
    s.decision.waste_preserve = model.preserve(p.pause_seconds, p.device_tokens);
    s.decision.waste_discard = model.chunked_discard(p.context_tokens, other_tokens, chunk);
    s.device_tokens = p.device_tokens;
    s.waste = std::min(s.decision.waste_preserve, s.decision.waste_discard);
    scored.push_back(s);
  }
  // The swap budget goes to the largest waste first: it is what swapping saves.
  std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) { return a.waste > b.waste; });

  std::vector<HoldDecision> decisions;
  decisions.reserve(scored.size());
  int64_t budget_left = std::max<int64_t>(0, swap_out_budget_tokens);
  for (Scored& s : scored) {
    HoldDecision& d = s.decision;
    if (budget_left > 0) {
      d.action = HoldAction::kSwapOut;
      d.swap_tokens = std::min(s.device_tokens, budget_left);
      budget_left -= d.swap_tokens;
    } else {
      d.action = d.waste_preserve <= d.waste_discard ? HoldAction::kPreserve : HoldAction::kDiscard;
    }
    decisions.push_back(d);
  }
  return decisions;
}

}  // namespace helios
