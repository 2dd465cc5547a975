// The small synthetic 6-layer model (GQA 4:2) the early-exit and layer-extension tests run on,
// written once per test process under the given name; `seed` picks its weights.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "helios/model_tools.h"
#include "test_paths.h"

namespace helios::testing {

constexpr int32_t kSixLayers = 6;

inline std::string write_six_layer_model(uint64_t seed, const std::string& file_name) {
  SyntheticModelSpec s;
  s.n_layer = kSixLayers;
  s.n_embd = 64;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 96;
  s.n_vocab = 300;
  s.seed = seed;
  const std::string path = temp_dir() + "/" + file_name;
  EXPECT_TRUE(make_synthetic_model(s, path).ok());
  return path;
}

}  // namespace helios::testing
