#include "helios/output.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/kernels.h"

namespace helios {

RequestOutput::RequestOutput(const Tokenizer& tokenizer, OutputOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)), sampler_(options_.sampling), decoder_(tokenizer),
      stops_(options_.stop) {
  if (!options_.json_grammars.empty()) {
    json_.emplace(options_.json_grammars);
    if (!json_->advance(options_.json_prefix)) json_.reset();
  }
}

bool RequestOutput::json_allows(TokenId token) {
  if (tokenizer_.is_end_of_generation(token) && !options_.ignore_eos) return json_->complete();
  const std::string& piece = tokenizer_.pieces()[token];
  return !piece.empty() && json_->accepts(piece);
}

void RequestOutput::mask_to_json(float* logits, int32_t n_vocab) {
  constexpr float kOut = -std::numeric_limits<float>::infinity();
  bool first_ok[256];  // most tokens fail on their first byte: test each byte once
  for (int b = 0; b < 256; ++b) first_ok[b] = json_->accepts(std::string(1, static_cast<char>(b)));
  const auto& pieces = tokenizer_.pieces();
  for (int32_t t = 0; t < n_vocab; ++t) {
    const bool eog = tokenizer_.is_end_of_generation(t) && !options_.ignore_eos;
    const std::string& p = t < static_cast<int32_t>(pieces.size()) ? pieces[t] : std::string();
    bool ok = eog ? json_->complete() : !p.empty() && first_ok[static_cast<unsigned char>(p[0])] &&
                                            (p.size() == 1 || json_->accepts(p));
    if (!ok) logits[t] = kOut;
  }
}

TokenEvent RequestOutput::take(const float* raw, int32_t n_vocab, const std::vector<TokenId>& history,
                               int32_t exit_layer, float confidence) {
  scratch_.assign(raw, raw + n_vocab);
  TokenId token = sampler_.sample(scratch_.data(), n_vocab, history);
  if (json_ && !json_allows(token)) {
    // The draw would break the JSON: draw again among the tokens that keep it. Testing the drawn
    // token first and masking only on a miss costs one check on most steps instead of a pass
    // over the vocabulary; greedy picks the same token either way.
    scratch_.assign(raw, raw + n_vocab);
    mask_to_json(scratch_.data(), n_vocab);
    token = sampler_.sample(scratch_.data(), n_vocab, history);
    if (!json_allows(token)) {  // no token continues the text: end it rather than break it
      token = tokenizer_.eos();
      json_stuck_ = true;
    }
  }
  if (json_ && !tokenizer_.is_end_of_generation(token)) json_->advance(tokenizer_.pieces()[token]);

  TokenEvent ev;
  ev.id = token;
  ev.exit_layer = exit_layer;
  ev.confidence = confidence;
  const kernels::LogSoftmax log_softmax = kernels::cpu_log_softmax(raw, n_vocab);
  ev.logprob = static_cast<float>(log_softmax.at(raw[token]));
  if (options_.top_logprobs > 0) {
    // The sampler's order: highest first, ties to the lower id, NaN as −inf (softmax_logit).
    std::vector<std::pair<float, TokenId>> best;
    best.reserve(n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) best.push_back({kernels::softmax_logit(raw[i]), i});
    const int32_t k = std::min(options_.top_logprobs, n_vocab);
    std::partial_sort(best.begin(), best.begin() + k, best.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int32_t i = 0; i < k; ++i) ev.top_logprobs.push_back({best[i].second, static_cast<float>(log_softmax.at(best[i].first))});
  }
  return emit(std::move(ev));
}

bool RequestOutput::reads_only_top1() const {
  const SamplingParams& s = options_.sampling;
  return s.temperature == 0.0f && s.logit_bias.empty() && s.repetition_penalty == 1.0f &&
         s.presence_penalty == 0.0f && s.frequency_penalty == 0.0f && options_.top_logprobs <= 0 && !json_;
}

TokenEvent RequestOutput::take_top1(TokenId top1, float top1_prob, int32_t exit_layer, float confidence) {
  return take_drawn(top1, std::log(top1_prob), exit_layer, confidence);
}

std::optional<SampleDraw> RequestOutput::device_draw(const std::vector<TokenId>& history, int32_t n_vocab) {
  if (json_ || options_.top_logprobs > 0) return std::nullopt;
  return sampler_.plan_draw(history, n_vocab);
}

TokenEvent RequestOutput::take_drawn(TokenId token, float logprob, int32_t exit_layer, float confidence) {
  TokenEvent ev;
  ev.id = token;
  ev.exit_layer = exit_layer;
  ev.confidence = confidence;
  ev.logprob = logprob;
  return emit(std::move(ev));
}

TokenEvent RequestOutput::emit(TokenEvent ev) {
  const TokenId token = ev.id;
  sampler_.accept(token);
  ++n_generated_;
  const auto& stop_ids = options_.stop_token_ids;
  if (!options_.ignore_eos && tokenizer_.is_end_of_generation(token)) {
    finish_ = FinishReason::kEos;  // the end token itself carries no text
  } else {
    ev.text = stops_.push(decoder_.push(token));
    if (stops_.stopped() || std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end() ||
        (json_ && (json_->closed() || json_stuck_))) {
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
