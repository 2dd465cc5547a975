// One request's output path, the same for `helios generate` and the server: a token sampled from
// raw logits, its log-probabilities, its text (whole UTF-8, held back while it may start a stop
// string), the stop rules and the finish reason.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "helios/early_exit.h"
#include "helios/json_grammar.h"
#include "helios/sampler.h"
#include "helios/tokenizer.h"

namespace helios {

struct OutputOptions {
  SamplingParams sampling;
  int32_t max_tokens = 128;            // generated tokens at most
  std::vector<std::string> stop;       // stop strings (not included in the text)
  std::vector<TokenId> stop_token_ids; // tokens that end the generation (included, with their text)
  bool ignore_eos = false;             // keep going past end-of-generation tokens
  int32_t top_logprobs = -1;           // -1: none; 0: the sampled token's logprob; k: and the top k
  // Structured output: each token is drawn among those that keep the text valid JSON of one of
  // these grammars (JsonChoice: a response format's one, or a call of any of several tools), and
  // the generation ends (kStop) when the top-level value closes. Empty = free text.
  std::vector<std::shared_ptr<const JsonGrammar>> json_grammars;
  // The start of that value already written into the prompt (a reply prefix, such as a forced
  // tool call's `{"name": "`): the grammars hold the generated text as its continuation. A prefix
  // none of them takes leaves the text free (callers check theirs: JsonChoice::advance).
  std::string json_prefix;
};

struct TokenEvent {
  TokenId id = 0;
  std::string text;                    // the text this token releases (may be empty)
  float logprob = 0;                   // of the raw logits, before penalties and temperature
  std::vector<std::pair<TokenId, float>> top_logprobs;
  int32_t exit_layer = 0;              // blocks the token's row ran before its head
  int32_t loaded_layers = 0;           // the model's depth when it ran (the engine sets it)
  float confidence = 0;                // the exit rule's measure there
  // Observe mode (GenerationRequest::observe_exits): what the exit head at each of the model's
  // exit points below its loaded depth (ForwardResult::observed_layers, ascending) said about the
  // row that produced this token. Empty unless the request asked, and for tokens of
  // self-speculative rounds, which do not observe.
  std::vector<ExitObservation> observed;
};

class RequestOutput {
 public:
  RequestOutput(const Tokenizer& tokenizer, OutputOptions options);

  // Samples the next token from one row of raw logits (history: prompt and tokens so far, for the
  // penalties) and runs it through the output path. After the event finish() says whether the
  // generation is over; the last event carries every held-back piece of text.
  TokenEvent take(const float* raw_logits, int32_t n_vocab, const std::vector<TokenId>& history,
                  int32_t exit_layer, float confidence);
  // Whether take() would read nothing of the logits but their top-1: greedy, with no bias,
  // penalty, top logprobs or grammar. Then take_top1() gives the same token from the row's
  // statistics (ForwardResult::row_top1), and its logprob as log(top1_prob).
  bool reads_only_top1() const;
  TokenEvent take_top1(TokenId top1, float top1_prob, int32_t exit_layer, float confidence);
  // The draw take() would make, as data for the device that holds the row (Backend::sample_rows),
  // where take() needs nothing of the row but the token and its logprob: no grammar, no top
  // logprobs (Sampler::plan_draw says which samplers can be put so). Draws the request's random
  // number now; take_drawn() then takes the device's token. nullopt: the row must come down.
  std::optional<SampleDraw> device_draw(const std::vector<TokenId>& history, int32_t n_vocab);
  TokenEvent take_drawn(TokenId token, float logprob, int32_t exit_layer, float confidence);
  FinishReason finish() const { return finish_; }
  int32_t n_generated() const { return n_generated_; }  // over every segment
  int32_t remaining() const { return options_.max_tokens - (n_generated_ - segment_start_); }
  // Intercepts. pause(): the generation pauses on the last token instead of ending there: its
  // finish (end of turn, length) is undone, and the text still held back is returned, since the
  // client answers from it (should that text complete a stop string, finish() is kStop and the
  // generation ends after all). start_segment(): after a resume, up to max_tokens more.
  std::string pause();
  void start_segment(int32_t max_tokens);
  const OutputOptions& options() const { return options_; }

 private:
  const Tokenizer& tokenizer_;
  OutputOptions options_;
  Sampler sampler_;
  StreamDecoder decoder_;
  StopMatcher stops_;
  // Structured output: whether a token may come next, and the logits of those that may not
  // made -inf.
  bool json_allows(TokenId token);
  void mask_to_json(float* logits, int32_t n_vocab);
  // The event of the token taken (its text, stops and finish), its log-probabilities already in.
  TokenEvent emit(TokenEvent ev);

  std::vector<float> scratch_;  // the sampler rewrites a copy of the logits
  std::optional<JsonChoice> json_;
  bool json_stuck_ = false;
  int32_t n_generated_ = 0;
  int32_t segment_start_ = 0;  // n_generated_ when the segment began
  FinishReason finish_ = FinishReason::kNone;
};

}  // namespace helios
