// A request the engine is serving: its output path (sampling, text, stop rules), the exit layer
// of every token it generated (replayed when a preemption recomputes it), its timings. Owned by
// the engine loop thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "helios/engine.h"
#include "helios/output.h"

namespace helios {

using Clock = std::chrono::steady_clock;

struct LiveRequest {
  LiveRequest(GenerationRequest r, std::shared_ptr<RequestStream> s, const Model& model);

  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  RequestOutput output;
  // exit_layers[j]: where the row that produced generated token j left the stack, i.e. where the
  // token at position prompt.size() - 1 + j left it.
  std::vector<int32_t> exit_layers;
  // Observe mode: the exit points its tokens' observations follow (the model's, all below its
  // loaded depth); empty when the request did not ask.
  std::vector<int32_t> observed_layers;
  Clock::time_point arrival = Clock::now();
  std::optional<Clock::time_point> first_scheduled, first_token;

  int32_t n_generated() const { return output.n_generated(); }
  // Per token of positions [start, start + n): the layer it left at when computed before, 0 where
  // it never was.
  std::vector<int32_t> known_exit_layers(int32_t start, int32_t n) const;
  // Every token so far as never computed (exit layer 0): a recompute runs it through every layer.
  void forget_exit_layers() { std::fill(exit_layers.begin(), exit_layers.end(), 0); }
  // Samples the next token from row `row` of a forward pass (its raw logits, exit layer and
  // confidence, and in observe mode what the exit heads said) and turns it into the stream's next
  // update (final when the request is done).
  GenerationUpdate on_row(const ForwardResult& fr, size_t row, const std::vector<TokenId>& history);
  // The final update of a request that ends without a token (abort, shutdown, error).
  GenerationUpdate aborted(const std::string& reason, StatusCode code = StatusCode::kUnavailable) const;

 private:
  void finish(GenerationUpdate* u, FinishReason why) const;
  // observed_layers' entries for row `row`; empty when the pass did not observe.
  std::vector<ExitObservation> observations(const ForwardResult& fr, size_t row) const;
};

}  // namespace helios
