// A request the engine is serving: its sampler, its text decoding and stop conditions, its
// timings. Owned by the engine loop thread.
#pragma once

#include <chrono>
#include <memory>

#include "helios/engine.h"

namespace helios {

using Clock = std::chrono::steady_clock;

struct LiveRequest {
  LiveRequest(GenerationRequest r, std::shared_ptr<RequestStream> s, const Tokenizer& tokenizer)
      : request(std::move(r)), stream(std::move(s)), sampler(request.sampling), decoder(tokenizer),
        stops(request.stop) {}

  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  Sampler sampler;
  StreamDecoder decoder;
  StopMatcher stops;
  int32_t n_generated = 0;
  Clock::time_point arrival = Clock::now();
  std::optional<Clock::time_point> first_scheduled, first_token;

  // Turns a sampled token into the stream's next update (final when the request is done).
  // `confidence` is the request's exit measure where the token left the stack.
  GenerationUpdate on_token(TokenId token, const float* logits, int32_t n_vocab, int32_t exit_layer,
                            float confidence, const Tokenizer& tokenizer);
  // The final update of a request that ends without a token (abort, shutdown, error).
  GenerationUpdate aborted(const std::string& reason) const;

 private:
  void finish(GenerationUpdate* u, GenerationFinish why) const;
};

}  // namespace helios
