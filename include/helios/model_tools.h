// Tools that make GGUF models: from llama2.c checkpoints, and seeded synthetic ones.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "helios/status.h"
#include "helios/tensor_type.h"

namespace helios {

// Converts a llama2.c "legacy" checkpoint (7 × int32 header, then f32 weights) and its
// tokenizer.bin into a GGUF `llama` model with a SentencePiece tokenizer.
Status convert_llama2c(const std::string& checkpoint_path, const std::string& tokenizer_path,
                       const std::string& out_path);

struct SyntheticModelSpec {
  int32_t n_layer = 2;
  int32_t n_embd = 64;
  int32_t n_head = 4;
  int32_t n_head_kv = 4;
  int32_t n_ff = 128;
  int32_t n_vocab = 512;      // ≥ 259 (unk, bos, eos and 256 byte tokens)
  int32_t n_ctx = 2048;
  float rope_freq_base = 10000.0f;
  bool rope_halves = false;   // write helios.rope.layout = "halves"
  bool tied_output = true;
  TensorType type = TensorType::kF32;  // matrices; norms are always F32
  // Q4_K_M-like (with type Q4_K): Q6_K for the LM head, and for attn_v and ffn_down in the layers
  // llama.cpp's Q4_K_M gives more bits (the first and last eighth, every third one between).
  bool q4_k_m = false;
  // rope_freqs.weight: Llama 3.1's rope scaling for this shape (factor 8, low and high frequency
  // factors 1 and 4, original context 8192), as llama.cpp's converter writes it.
  bool llama3_rope = false;
  // Rope scaling as llama.cpp's converter writes it: rope.scaling.type (linear or yarn) with
  // rope.scaling.factor when the factor is > 1; YaRN's rope.scaling.original_context_length, and
  // rope.scaling.attn_factor, when > 0.
  std::string rope_scaling = "linear";
  float rope_scaling_factor = 0.0f;
  int32_t rope_original_ctx = 0;
  float rope_attn_factor = 0.0f;
  uint64_t seed = 1;
  std::string name = "synthetic";

  Status validate() const;
  int64_t n_params() const;
};

// Writes a model with seeded random weights (N(0, 1/n_in) matrices, unit norms) and a byte-level
// SentencePiece vocabulary, tensor by tensor (a 7B model needs no more memory than one tensor).
// `progress` gets (tensors written, tensors in all).
Status make_synthetic_model(const SyntheticModelSpec& spec, const std::string& out_path,
                            const std::function<void(int, int)>& progress = nullptr);

}  // namespace helios
