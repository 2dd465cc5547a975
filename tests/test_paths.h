// Where tests find their inputs; set by tests/CMakeLists.txt.
#pragma once

#include <string>

namespace helios::testing {

std::string source_dir();       // the repository root
std::string shared_data_dir();  // ../shared/data beside the repository
std::string models_dir();       // the models cache (scripts/fetch_model.sh fills it)
std::string default_model_path();  // SmolLM2-135M-Instruct Q4_1 in the models cache
std::string temp_dir();         // a fresh directory for this test process
// stories260K: the models cache's GGUF (scripts/setup.sh writes it), else converted into temp_dir()
// from the llama2.c checkpoint in shared data, so tests never depend on setup having run.
std::string stories260k_path();

}  // namespace helios::testing
