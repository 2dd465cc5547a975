// Single-sequence generation: prompt → prefill (in chunks) → decode loop, with sampling and stop
// conditions. The command line's `helios generate` and the golden tests run through it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "helios/model.h"
#include "helios/output.h"

namespace helios {

// The output path's options (sampling, max_tokens, stop strings, ...), and how to run the prompt.
struct GenerateOptions : OutputOptions {
  int32_t prefill_chunk_tokens = 512;  // prompt tokens per forward pass
  int32_t block_size = 16;             // KV cache tokens per block
  kernels::KvType kv_type = kernels::KvType::kF32;  // KV cache elements (f32: the reference)
  ExitRule exit;                       // early exit (self-speculative included)
  bool observe_exits = false;          // GenerateResult::observed (ForwardBatch::observe_exits)
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
  // observe_exits: per generated token, what each exit point's head said (observed_layers order).
  std::vector<int32_t> observed_layers;
  std::vector<std::vector<ExitObservation>> observed;
};

// Called with each new piece of text as soon as it is whole UTF-8 and cannot be part of a stop
// string.
using TextSink = std::function<void(const std::string&)>;

StatusOr<GenerateResult> generate(Model& model, const std::vector<TokenId>& prompt,
                                  const GenerateOptions& options, const TextSink& on_text = nullptr);

}  // namespace helios
