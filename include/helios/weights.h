// Named model weights, checked against the shapes the config implies and uploaded to a backend
// (dequantized to f32, the compute type of the current backends).
#pragma once

#include <functional>
#include <vector>

#include "helios/backend.h"
#include "helios/model_config.h"
#include "helios/status.h"

namespace helios {

class GgufFile;

struct LayerWeights {
  Buffer attn_norm;  // [n_embd]
  Buffer wq;         // [n_head * head_dim, n_embd]
  Buffer wk;         // [n_head_kv * head_dim, n_embd]
  Buffer wv;         // [n_head_kv * head_dim, n_embd]
  Buffer wo;         // [n_embd, n_head * head_dim]
  Buffer ffn_norm;   // [n_embd]
  Buffer w_gate;     // [n_ff, n_embd]
  Buffer w_up;       // [n_ff, n_embd]
  Buffer w_down;     // [n_embd, n_ff]
};

struct ModelWeights {
  Buffer tok_embd;     // [n_vocab, n_embd]
  Buffer output_norm;  // [n_embd]
  Buffer output;       // [n_vocab, n_embd]; empty when tied to tok_embd
  std::vector<LayerWeights> layers;
  int64_t n_params = 0;

  const float* lm_head() const { return output.empty() ? tok_embd.data() : output.data(); }
};

// Called after each tensor with (tensors done, tensors in all).
using LoadProgress = std::function<void(int, int)>;

// Loads the first `n_layers` blocks (all when ≤ 0). Errors name the tensor and the shape found.
StatusOr<ModelWeights> load_weights(const GgufFile& file, const ModelConfig& config,
                                    Backend& backend, int32_t n_layers = 0,
                                    const LoadProgress& progress = nullptr);

}  // namespace helios
