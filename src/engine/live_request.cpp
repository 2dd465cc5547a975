#include "engine/live_request.h"

namespace helios {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

LiveRequest::LiveRequest(GenerationRequest r, std::shared_ptr<RequestStream> s, const Model& model)
    : request(std::move(r)), stream(std::move(s)), output(model.tokenizer(), request) {
  if (request.observe_exits) observed_layers = model.exit_layers();
  if (request.intercept.triggers.any()) intercepts.emplace(request.intercept.triggers);
  n_supplied = static_cast<int32_t>(request.prompt.size());
}

std::vector<int32_t> LiveRequest::known_exit_layers(int32_t start, int32_t n) const {
  const auto n_known = static_cast<int32_t>(exit_layer_at.size());
  if (start >= n_known) return {};
  std::vector<int32_t> known(n, 0);
  for (int32_t i = 0; i < n && start + i < n_known; ++i) known[i] = exit_layer_at[start + i];
  return known;
}

GenerationUpdate LiveRequest::on_row(const ForwardResult& fr, size_t row, const std::vector<TokenId>& history,
                                     const Tokenizer& tokenizer) {
  GenerationUpdate u;
  const int32_t exit_layer = fr.row_exit_layer[row];
  // A greedy row read for its top-1 alone, or a row whose token was drawn on the device, came
  // without its logits (SequenceBatchEntry::top1_only, ::draw).
  const float confidence = fr.row_confidence[row];
  const bool drawn = row < fr.row_token.size() && fr.row_token[row] >= 0;
  TokenEvent ev;
  if (output.reads_only_top1()) {
    ev = output.take_top1(fr.row_top1[row], fr.row_top1_prob[row], exit_layer, confidence);
  } else if (drawn) {
    ev = output.take_drawn(fr.row_token[row], fr.row_token_logprob[row], exit_layer, confidence);
  } else {
    ev = output.take(fr.row(row), fr.n_vocab, history, exit_layer, confidence);
  }
  ev.observed = observations(fr, row);
  // The row that produced the token is the last one of the history.
  const size_t position = history.size() - 1;
  if (exit_layer_at.size() <= position) exit_layer_at.resize(position + 1, 0);
  exit_layer_at[position] = exit_layer;
  if (!first_token) first_token = Clock::now();
  u.intercept = check_intercept(ev, history.size() + 1, tokenizer);
  u.tokens.push_back(std::move(ev));
  if (!u.intercept && output.finish() != FinishReason::kNone) finish(&u, output.finish());
  return u;
}

std::optional<InterceptEvent> LiveRequest::check_intercept(TokenEvent& ev, size_t context_tokens,
                                                           const Tokenizer& tokenizer) {
  if (!intercepts) return std::nullopt;
  const FinishReason why = output.finish();
  if (why == FinishReason::kStop) return std::nullopt;  // stop strings and tokens end the session
  std::optional<InterceptEvent> hit = intercepts->push(ev.id, ev.text, why == FinishReason::kEos);
  if (!hit && why == FinishReason::kLength && intercepts->triggers().on_length) {
    hit = InterceptEvent{};
    hit->trigger = "length";
  }
  if (!hit) return std::nullopt;
  ev.text += output.pause();
  if (output.finish() == FinishReason::kStop) return std::nullopt;
  // The end-of-turn token releases no text; the client renders the next turn after its piece.
  if (hit->trigger == "end_of_turn" || hit->trigger == "token") hit->matched = tokenizer.token_to_piece(ev.id, true);
  hit->index = ++n_intercepts;
  hit->context_tokens = static_cast<int32_t>(context_tokens);
  return hit;
}

GenerationUpdate LiveRequest::aborted(const std::string& reason, StatusCode code) const {
  GenerationUpdate u;
  u.error = reason;
  u.error_code = code;
  finish(&u, FinishReason::kAborted);
  return u;
}

GenerationUpdate LiveRequest::ended_while_paused() const {
  GenerationUpdate u;
  finish(&u, FinishReason::kStop);
  return u;
}

std::vector<ExitObservation> LiveRequest::observations(const ForwardResult& fr, size_t row) const {
  if (observed_layers.empty() || fr.observed_layers.empty()) return {};
  // The pass skips the exits after every token of the batch has left, so it may have observed
  // fewer layers than there are exit points: those the row had left before, as ExitObservation{}.
  std::vector<ExitObservation> seen(observed_layers.size());
  for (size_t i = 0, j = 0; i < observed_layers.size(); ++i) {
    while (j < fr.observed_layers.size() && fr.observed_layers[j] < observed_layers[i]) ++j;
    if (j < fr.observed_layers.size() && fr.observed_layers[j] == observed_layers[i]) seen[i] = fr.observed[j][row];
  }
  return seen;
}

void LiveRequest::finish(GenerationUpdate* u, FinishReason why) const {
  const auto now = Clock::now();
  u->finish = why;
  u->prompt_tokens = n_supplied;
  u->completion_tokens = output.n_generated();
  u->queue_seconds = seconds((first_scheduled ? *first_scheduled : now) - arrival);
  u->ttft_seconds = first_token ? seconds(*first_token - arrival) : 0.0;
  u->total_seconds = seconds(now - arrival);
}

}  // namespace helios
