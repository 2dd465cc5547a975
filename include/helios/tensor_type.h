// Tensor element types as GGUF numbers them, their block layouts, and (de)quantization.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "helios/status.h"

namespace helios {

enum class TensorType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};

struct TensorTypeTraits {
  const char* name;
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool can_dequantize;  // Helios can turn it into floats
};

// nullopt for ids GGUF does not define (or that Helios does not know).
std::optional<TensorTypeTraits> tensor_type_traits(uint32_t type_id);
const char* tensor_type_name(TensorType type);
std::optional<TensorType> tensor_type_from_name(const std::string& name);  // "q4_1", "F16", ...

// Bytes of a row of `n` elements; `n` must be a multiple of the block size.
int64_t tensor_row_bytes(TensorType type, int64_t n);

// src holds `n` elements in `type`'s layout (n a multiple of the block size).
Status dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
// The inverse, for the types Helios can write: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K.
Status quantize_row(TensorType type, const float* src, void* dst, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

}  // namespace helios
