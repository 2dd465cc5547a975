// Shared helpers for the golden tests: the goldens' JSON, and one loaded default model.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "helios/model.h"
#include "test_paths.h"

namespace helios::testing {

inline nlohmann::json load_golden(const std::string& name) {
  const std::string path = source_dir() + "/tests/golden/data/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing golden file " << path << " (scripts/make_goldens.py makes it)";
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

// Bytes from their hex spelling ("0aff" → {0x0a, 0xff}), as the goldens store raw data.
inline std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

// The default model, loaded once per test process (fails, naming the fix, when it is missing).
struct DefaultModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;

  static DefaultModel& get() {
    static DefaultModel m = [] {
      DefaultModel d;
      d.backend = make_cpu_backend(0);
      auto loaded = Model::load(default_model_path(), *d.backend);
      if (loaded.ok()) d.model = std::move(*loaded);
      else ADD_FAILURE() << loaded.status().to_string() << " — run scripts/fetch_model.sh";
      return d;
    }();
    return m;
  }
};

}  // namespace helios::testing
