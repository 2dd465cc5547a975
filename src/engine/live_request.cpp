#include "engine/live_request.h"

#include <algorithm>
#include <cmath>

namespace helios {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// log Σ exp(logits): the normaliser of the token distribution.
double log_sum_exp(const float* logits, int32_t n, float max_logit) {
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  return max_logit + std::log(sum);
}

}  // namespace

GenerationUpdate LiveRequest::on_token(TokenId token, const float* logits, int32_t n_vocab,
                                       int32_t exit_layer, float confidence, const Tokenizer& tokenizer) {
  // `logits` are the raw logits, before the sampler's penalties and temperature.
  GenerationUpdate u;
  TokenEvent ev;
  ev.id = token;
  ev.exit_layer = exit_layer;
  const float max_logit = *std::max_element(logits, logits + n_vocab);
  const double lse = log_sum_exp(logits, n_vocab, max_logit);
  ev.confidence = confidence;
  ev.logprob = static_cast<float>(logits[token] - lse);
  if (request.top_logprobs > 0) {
    std::vector<std::pair<float, TokenId>> best;
    for (int32_t i = 0; i < n_vocab; ++i) best.push_back({logits[i], i});
    const int32_t k = std::min(request.top_logprobs, n_vocab);
    std::partial_sort(best.begin(), best.begin() + k, best.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int32_t i = 0; i < k; ++i) {
      ev.top_logprobs.push_back({best[i].second, static_cast<float>(best[i].first - lse)});
    }
  }
  ++n_generated;
  if (!first_token) first_token = Clock::now();

  GenerationFinish why = GenerationFinish::kNone;
  if (!request.ignore_eos && tokenizer.is_end_of_generation(token)) {
    why = GenerationFinish::kEos;  // the end token itself carries no text
  } else {
    ev.text = stops.push(decoder.push(token));
    if (stops.stopped()) {
      why = GenerationFinish::kStop;
    } else if (std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
               request.stop_token_ids.end()) {
      why = GenerationFinish::kStop;
    } else if (n_generated >= request.max_tokens) {
      why = GenerationFinish::kLength;
    }
  }
  if (why != GenerationFinish::kNone && why != GenerationFinish::kStop) {
    ev.text += stops.push(decoder.flush());  // whatever UTF-8 was held back
    ev.text += stops.flush();
  }
  if (request.top_logprobs < 0) ev.top_logprobs.clear();
  u.tokens.push_back(std::move(ev));
  if (why != GenerationFinish::kNone) finish(&u, why);
  return u;
}

GenerationUpdate LiveRequest::aborted(const std::string& reason) const {
  GenerationUpdate u;
  u.error = reason;
  finish(&u, GenerationFinish::kAborted);
  return u;
}

void LiveRequest::finish(GenerationUpdate* u, GenerationFinish why) const {
  const auto now = Clock::now();
  u->finish = why;
  u->prompt_tokens = static_cast<int32_t>(request.prompt.size());
  u->completion_tokens = n_generated;
  u->queue_seconds = seconds((first_scheduled ? *first_scheduled : now) - arrival);
  u->ttft_seconds = first_token ? seconds(*first_token - arrival) : 0.0;
  u->total_seconds = seconds(now - arrival);
}

}  // namespace helios
