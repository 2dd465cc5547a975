// stories260K (5 layers, n_embd 64, vocab 512) for the calibration and evaluation tests: the
// models cache's GGUF, else converted here from the llama2.c checkpoint in shared data.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "helios/calibrate.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "test_paths.h"

namespace helios::testing {

inline std::string stories_model_path() { return stories260k_path(); }

struct StoriesModel {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::unique_ptr<Model> model;

  StoriesModel() {
    auto m = Model::load(stories_model_path(), *backend);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (m.ok()) model = std::move(*m);
  }
};

// ShareGPT prompts: English text the tiny model's byte-level vocabulary covers.
inline std::string calibration_text_path() {
  return shared_data_dir() + "/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json";
}

}  // namespace helios::testing
