// A request the engine is serving: its output path (sampling, text, stop rules, intercept
// triggers), the exit layer of every token it computed (replayed when a preemption or an
// intercept's discard recomputes it), its pauses and its timings. Owned by the engine loop thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "helios/engine.h"
#include "helios/intercept.h"
#include "helios/output.h"

namespace helios {

using Clock = std::chrono::steady_clock;

struct LiveRequest {
  LiveRequest(GenerationRequest r, std::shared_ptr<RequestStream> s, const Model& model);

  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  RequestOutput output;
  // exit_layer_at[p]: where the row at position p left the stack when it produced the next token;
  // 0 for positions whose row produced nothing (prompt, resumed text) or never ran.
  std::vector<int32_t> exit_layer_at;
  // Observe mode: the exit points its tokens' observations follow (the model's, all below its
  // loaded depth); empty when the request did not ask.
  std::vector<int32_t> observed_layers;
  Clock::time_point arrival = Clock::now();
  std::optional<Clock::time_point> first_scheduled, first_token;

  // Intercepts: the triggers (none when it has none), whether it is paused and since when, how
  // often it paused, and the tokens it was given (the prompt and every resume's).
  std::optional<InterceptMatcher> intercepts;
  bool paused = false;
  bool evicted = false;  // its paused KV was dropped for running work
  Clock::time_point paused_at;
  int32_t n_intercepts = 0;
  int32_t n_supplied = 0;
  // Self-speculative at the model's depth: the lookahead head's guess for the next round's draft
  // (-1: none). A stale guess (after a preemption or a resume) only costs its rejection.
  TokenId lookahead_draft = -1;

  int32_t n_generated() const { return output.n_generated(); }
  // Per token of positions [start, start + n): the layer it left at when computed before, 0 where
  // it never was.
  std::vector<int32_t> known_exit_layers(int32_t start, int32_t n) const;
  // Every token so far as never computed (exit layer 0): a recompute runs it through every layer.
  void forget_exit_layers() { std::fill(exit_layer_at.begin(), exit_layer_at.end(), 0); }
  // Samples the next token from row `row` of a forward pass (its raw logits, exit layer and
  // confidence, and in observe mode what the exit heads said) and turns it into the stream's next
  // update: final when the request is done, with `intercept` set when a trigger paused it.
  GenerationUpdate on_row(const ForwardResult& fr, size_t row, const std::vector<TokenId>& history,
                          const Tokenizer& tokenizer);
  // The final update of a request that ends without a token (abort, shutdown, error), or of a
  // paused one its client ended (kStop).
  GenerationUpdate aborted(const std::string& reason, StatusCode code = StatusCode::kUnavailable) const;
  GenerationUpdate ended_while_paused() const;

 private:
  void finish(GenerationUpdate* u, FinishReason why) const;
  // The pause this token triggers, if any (the output's finish undone, its held text in ev).
  std::optional<InterceptEvent> check_intercept(TokenEvent& ev, size_t context_tokens, const Tokenizer& tokenizer);
  // observed_layers' entries for row `row`; empty when the pass did not observe.
  std::vector<ExitObservation> observations(const ForwardResult& fr, size_t row) const;
};

}  // namespace helios
