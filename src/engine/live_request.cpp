#include "engine/live_request.h"

namespace helios {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

LiveRequest::LiveRequest(GenerationRequest r, std::shared_ptr<RequestStream> s, const Model& model)
    : request(std::move(r)), stream(std::move(s)), output(model.tokenizer(), request) {
  if (request.observe_exits) observed_layers = model.exit_layers();
}

std::vector<int32_t> LiveRequest::known_exit_layers(int32_t start, int32_t n) const {
  const auto first = static_cast<int32_t>(request.prompt.size()) - 1;  // position of exit_layers[0]
  const auto n_known = static_cast<int32_t>(exit_layers.size());
  if (start + n <= first || start - first >= n_known) return {};
  std::vector<int32_t> known(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t j = start + i - first;
    if (j >= 0 && j < n_known) known[i] = exit_layers[j];
  }
  return known;
}

GenerationUpdate LiveRequest::on_row(const ForwardResult& fr, size_t row, const std::vector<TokenId>& history) {
  GenerationUpdate u;
  const int32_t exit_layer = fr.row_exit_layer[row];
  TokenEvent ev = output.take(fr.row(row), fr.n_vocab, history, exit_layer, fr.row_confidence[row]);
  ev.observed = observations(fr, row);
  exit_layers.push_back(exit_layer);
  if (!first_token) first_token = Clock::now();
  u.tokens.push_back(std::move(ev));
  if (output.finish() != FinishReason::kNone) finish(&u, output.finish());
  return u;
}

GenerationUpdate LiveRequest::aborted(const std::string& reason, StatusCode code) const {
  GenerationUpdate u;
  u.error = reason;
  u.error_code = code;
  finish(&u, FinishReason::kAborted);
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
  u->prompt_tokens = static_cast<int32_t>(request.prompt.size());
  u->completion_tokens = output.n_generated();
  u->queue_seconds = seconds((first_scheduled ? *first_scheduled : now) - arrival);
  u->ttft_seconds = first_token ? seconds(*first_token - arrival) : 0.0;
  u->total_seconds = seconds(now - arrival);
}

}  // namespace helios
