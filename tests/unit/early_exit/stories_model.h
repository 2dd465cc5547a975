// stories260K (5 layers, n_embd 64, vocab 512) for the calibration and evaluation tests, converted
// from the llama2.c checkpoint in tests/data, and the calibration text beside it. An input that
// cannot be read throws: gtest fails the test with the message, and no test runs on a null model.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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
    if (!m.ok()) {
      throw std::runtime_error("stories260K does not load: " + m.status().to_string() + " (converted from " +
                               test_data_dir() + "/stories260K/; restore it with `git checkout -- tests/data`)");
    }
    model = std::move(*m);
  }
};

// ShareGPT prompts: English text the tiny model's byte-level vocabulary covers.
inline std::string calibration_text_path() {
  return test_data_dir() + "/sharegpt/ShareGPT_V3_filtered_first80_prompts.json";
}

inline std::vector<std::string> calibration_documents() {
  auto docs = load_text_documents(calibration_text_path());
  if (!docs.ok()) {
    throw std::runtime_error(docs.status().to_string() + " (restore it with `git checkout -- tests/data`)");
  }
  return std::move(*docs);
}

}  // namespace helios::testing
