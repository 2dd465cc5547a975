#include "helios/output.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace helios {

RequestOutput::RequestOutput(const Tokenizer& tokenizer, OutputOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)), sampler_(options_.sampling), decoder_(tokenizer),
      stops_(options_.stop) {}

TokenEvent RequestOutput::take(const float* raw, int32_t n_vocab, const std::vector<TokenId>& history,
                               int32_t exit_layer, float confidence) {
  scratch_.assign(raw, raw + n_vocab);
  const TokenId token = sampler_.sample(scratch_.data(), n_vocab, history);
  ++n_generated_;

  TokenEvent ev;
  ev.id = token;
  ev.exit_layer = exit_layer;
  ev.confidence = confidence;
  const double lse = kernels::cpu_log_sum_exp(raw, n_vocab);  // the normaliser of the token distribution
  ev.logprob = static_cast<float>(raw[token] - lse);
  if (options_.top_logprobs > 0) {
    std::vector<std::pair<float, TokenId>> best;
    best.reserve(n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) best.push_back({raw[i], i});
    const int32_t k = std::min(options_.top_logprobs, n_vocab);
    std::partial_sort(best.begin(), best.begin() + k, best.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int32_t i = 0; i < k; ++i) ev.top_logprobs.push_back({best[i].second, static_cast<float>(best[i].first - lse)});
  }

  const auto& stop_ids = options_.stop_token_ids;
  if (!options_.ignore_eos && tokenizer_.is_end_of_generation(token)) {
    finish_ = FinishReason::kEos;  // the end token itself carries no text
  } else {
    ev.text = stops_.push(decoder_.push(token));
    if (stops_.stopped() || std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
      finish_ = FinishReason::kStop;
    } else if (n_generated_ - segment_start_ >= options_.max_tokens) {
      finish_ = FinishReason::kLength;
    }
  }
  if (finish_ != FinishReason::kNone && !stops_.stopped()) {
    ev.text += stops_.push(decoder_.flush());  // whatever UTF-8 was held back
    ev.text += stops_.flush();
  }
  return ev;
}

std::string RequestOutput::pause() {
  finish_ = FinishReason::kNone;
  std::string text = stops_.push(decoder_.flush());
  if (stops_.stopped()) {
    finish_ = FinishReason::kStop;  // the held-back text completed a stop string: it ends after all
  } else {
    text += stops_.flush();
  }
  return text;
}

void RequestOutput::start_segment(int32_t max_tokens) {
  options_.max_tokens = max_tokens;
  segment_start_ = n_generated_;
}

}  // namespace helios
