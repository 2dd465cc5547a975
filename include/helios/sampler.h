// Choosing the next token from logits, and deciding when a generation stops.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "helios/status.h"
#include "kernels/kernels.h"
#include "helios/tokenizer.h"

namespace helios {

struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy (argmax)
  int32_t top_k = 0;               // 0: off
  float top_p = 1.0f;              // 1: off; keep the smallest set with mass ≥ top_p
  float min_p = 0.0f;              // 0: off; drop tokens with p < min_p · p_max
  float repetition_penalty = 1.0f; // 1: off; CTRL-style, over the previous tokens
  int32_t repetition_window = 64;  // how many previous tokens the penalty looks at
  // OpenAI's penalties, over the tokens this generation has produced (not the prompt), as vLLM
  // applies them: logit -= frequency_penalty * count + presence_penalty * (count > 0).
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  // Added to a token's logit before anything else ([-100, 100]; -100 all but bans it).
  std::vector<std::pair<TokenId, float>> logit_bias;
  uint64_t seed = 0;

  // INVALID_ARGUMENT naming the field (NaN or negative temperature, top_p outside (0, 1], ...).
  Status validate() const;
};

// What Sampler::sample would do to a row of logits, as data for the device that holds the row
// (Backend::sample_rows): its parameters and random number, and one adjustment per token the
// bias and penalties change.
struct SampleDraw {
  kernels::SampleRow row;                    // logits_row and the adjust range: the caller's
  std::vector<kernels::LogitAdjust> adjust;  // by token, ascending
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // `logits` is modified (bias, penalties, temperature); `history` holds the tokens so far.
  TokenId sample(float* logits, int32_t n_vocab, const std::vector<TokenId>& history);
  // The same draw made elsewhere: kernels::ref_sample_rows on the row with this plan takes the
  // token sample() would. Consumes the random number sample() would. nullopt where sample()
  // cannot be put so: a logit_bias naming a token twice (its biases add in sequence).
  std::optional<SampleDraw> plan_draw(const std::vector<TokenId>& history, int32_t n_vocab);
  // The token the generation took (after any redraw): what the presence and frequency penalties count.
  void accept(TokenId token);

 private:
  // u in [0, 1), as uniform_real_distribution<double> draws it from rng_ (one call per draw).
  double draw_uniform() { return std::generate_canonical<double, std::numeric_limits<double>::digits>(rng_); }
  // The tokens of the repetition window, each once, in [0, n_vocab).
  std::vector<TokenId> repeated_tokens(const std::vector<TokenId>& history, int32_t n_vocab) const;

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<TokenId, int32_t> generated_;  // token -> times generated
  std::vector<std::pair<float, TokenId>> candidates_;
};

// Index of the largest value (the lowest index on ties; NaN counts as −inf): kernels::ref_argmax.
TokenId argmax(const float* logits, int32_t n_vocab);

// Why a generation ended: an end-of-generation token, a stop string or stop token, max_tokens,
// or the client or server ending it.
enum class FinishReason { kNone, kEos, kStop, kLength, kAborted };
const char* finish_reason_name(FinishReason reason);

// Watches the generated text for stop strings. The text before a stop string is emitted; text
// that could still become a stop string is held back until it cannot.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends a text delta; returns the text that is now safe to emit. After a stop string is
  // found, stopped() is true and nothing more is emitted.
  std::string push(const std::string& delta);
  std::string flush();  // the held-back text, at the end of a generation without a stop
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace helios
