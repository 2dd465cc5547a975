// Single-sequence generation: prompt → prefill (in chunks) → decode loop, with sampling and stop
// conditions. The command line's `helios generate` and the golden tests run through it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "helios/model.h"
#include "helios/sampler.h"

namespace helios {

struct GenerateOptions {
  SamplingParams sampling;
  int32_t max_tokens = 128;            // generated tokens at most
  std::vector<std::string> stop;       // stop strings (not included in the output)
  bool ignore_eos = false;             // keep going past end-of-generation tokens
  int32_t prefill_chunk_tokens = 512;  // prompt tokens per forward pass
  int32_t block_size = 16;             // KV cache tokens per block
  ExitRule exit;                       // early exit (self-speculative included)
};

struct GenerateResult {
  std::vector<TokenId> tokens;  // generated ids (including a final EOS, if any)
  std::string text;             // generated text, stop string excluded
  FinishReason finish = FinishReason::kNone;
  int32_t n_prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;    // from the first to the last generated token
  // Per generated token: the blocks it ran before its head, and its confidence there.
  std::vector<int32_t> exit_layers;
  std::vector<float> confidences;
  // Work of the decode steps (after the prompt): block rows computed in full, exited rows whose
  // K/V was filled, LM-head rows; self-speculative drafts and how many the full model confirmed.
  int64_t decode_layer_rows = 0, decode_fill_rows = 0, decode_head_rows = 0;
  int64_t drafted = 0, accepted = 0;
};

// Called with each new piece of text as soon as it is whole UTF-8 and cannot be part of a stop
// string.
using TextSink = std::function<void(const std::string&)>;

// Self-speculative decoding, one round for a batch of sequences drafting at the same exit. Each
// sequence's `input` (at `position`, not yet in the cache) and n_draft tokens proposed by the exit
// head at `draft_layer` run the blocks up to it, one token per pass; then every input of every
// sequence continues through the remaining blocks in one pass, reusing the K/V the drafts wrote.
// Each table must cover position + n_draft.
struct SpeculativeSeq {
  const BlockTable* table = nullptr;
  TokenId input = 0;
  int32_t position = 0;
  int32_t n_draft = 0;
  std::vector<TokenId> inputs;  // out: input, then the drafts
  int32_t first_row = 0;        // out: the verify row after inputs[0]; row first_row + i follows inputs[i]
};
struct SpeculativeWork {
  int64_t layer_rows = 0;
  int64_t head_rows = 0;
};
// `verify` gets the full model's logits after every input.
Status speculative_round(Model& model, KvCacheStorage& kv, int32_t draft_layer, std::vector<SpeculativeSeq>& seqs,
                         ForwardResult* verify, SpeculativeWork* work);

// Takes a verified round's tokens in order: `take(row, &token)` samples the verification row after
// inputs[0..i] (row first_row + i), records the token and says whether the generation goes on. A
// row stands only while every draft before it was the full model's choice, so the walk stops at
// the first token that is not the next draft (or when the generation ends). Returns the drafts
// confirmed.
using TakeVerifiedRow = std::function<bool(int32_t row, TokenId* token)>;
int32_t take_speculated(const SpeculativeSeq& seq, const TakeVerifiedRow& take);

StatusOr<GenerateResult> generate(Model& model, const std::vector<TokenId>& prompt,
                                  const GenerateOptions& options, const TextSink& on_text = nullptr);

}  // namespace helios
