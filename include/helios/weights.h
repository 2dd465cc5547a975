// Named model weights, checked against the shapes the config implies and uploaded to a backend:
// quantized matrices in their own type where the backend computes with it, else f32.
#pragma once

#include <functional>
#include <vector>

#include "helios/backend.h"
#include "helios/tensor_parallel.h"
#include "helios/model_config.h"
#include "helios/status.h"

namespace helios {

class GgufFile;

// A matrix in backend memory, in the file's type when the backend multiplies with it directly
// (e.g. Q4_1 on the CPU), else dequantized to F32.
struct Matrix {
  Buffer storage;
  WeightMatrix view;
};

struct LayerWeights {
  Buffer attn_norm;  // [n_embd]
  Matrix wq;         // [n_head * head_dim, n_embd]
  Matrix wk;         // [n_head_kv * head_dim, n_embd]
  Matrix wv;         // [n_head_kv * head_dim, n_embd]
  Buffer bq, bk, bv; // [q_dim], [kv_dim], [kv_dim] biases added after the projections (qwen2);
                     // empty when the file has none
  Matrix wo;         // [n_embd, n_head * head_dim]
  Buffer ffn_norm;   // [n_embd]
  Matrix w_gate;     // [n_ff, n_embd]
  Matrix w_up;       // [n_ff, n_embd]
  Matrix w_down;     // [n_embd, n_ff]
};

struct ModelWeights {
  Matrix tok_embd;     // [n_vocab, n_embd] for the embedding lookup (Backend::embedding_rows):
                       // the file's type where the backend gathers from it, else f32
  Buffer output_norm;  // [n_embd]
  Buffer rope_freqs;   // [n_rot / 2] per-pair frequency divisors (Llama 3's scaling); empty without
  Matrix output;       // [n_vocab, n_embd] LM head; when tied, token_embd.weight again — the same
                       // memory as tok_embd (empty storage) when both keep the same type
  std::vector<LayerWeights> layers;
  int64_t n_params = 0;
  int64_t n_bytes = 0;  // backend memory the weights occupy
};

// Called after each tensor with (tensors done, tensors in all).
using LoadProgress = std::function<void(int, int)>;

// A host f32 matrix [n_out, n_in] in backend memory, as the backend multiplies fastest: Q8_0 when
// it takes Q8_0 and n_in is whole blocks (an exit adapter read every token costs a quarter of the
// bytes, for a relative error near 0.4%), else F32.
StatusOr<Matrix> upload_matrix(Backend& backend, const std::string& name, const float* data, int32_t n_out,
                               int32_t n_in);

// Loads the first `n_layers` blocks (all when ≤ 0). Errors name the tensor and the shape found.
// A sharded `shard` keeps one tensor-parallel rank's slices (tensor_parallel.h); `config` is the
// whole model's.
StatusOr<ModelWeights> load_weights(const GgufFile& file, const ModelConfig& config,
                                    Backend& backend, int32_t n_layers = 0,
                                    const LoadProgress& progress = nullptr, const ShardSpec& shard = {});
// Loads blocks [first_layer, end_layer) alone, for a model that holds the blocks before them: the
// result has only `layers` (those blocks, in order) and n_params / n_bytes counting them; its
// embedding, final norm and LM head are empty. INVALID_ARGUMENT for an empty range or one past
// the model's blocks.
StatusOr<ModelWeights> load_layer_range(const GgufFile& file, const ModelConfig& config, Backend& backend,
                                        int32_t first_layer, int32_t end_layer,
                                        const LoadProgress& progress = nullptr, const ShardSpec& shard = {});

}  // namespace helios
