// Where tests find their inputs; set by tests/CMakeLists.txt.
#pragma once

#include <string>

namespace helios::testing {

std::string source_dir();       // the repository root
std::string test_data_dir();    // tests/data: small real inputs kept with the tests (tests/data/SOURCES.md)
std::string models_dir();       // the models cache (scripts/fetch_model.sh fills it)
std::string default_model_path();  // SmolLM2-135M-Instruct Q4_1 in the models cache
std::string temp_dir();         // a fresh directory for this test process
// stories260K as GGUF, converted into temp_dir() from the llama2.c checkpoint in
// tests/data/stories260K/; a conversion that fails is a test failure naming the files.
std::string stories260k_path();

}  // namespace helios::testing
