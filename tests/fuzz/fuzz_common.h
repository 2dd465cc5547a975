// What the fuzz targets share: the repository's real inputs (stories260K converted to GGUF, the
// SmolLM2 tokenizer when the model has been fetched, configs, chat templates) loaded once per
// process, and a scratch directory. A fixture that cannot load stops the fuzzer at once, loudly:
// fuzzing without it would pass while testing nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "helios/tokenizer.h"

namespace helios::fuzz {

[[noreturn]] void die(const std::string& what);

std::string source_dir();                  // the repository root
std::string read_file(const std::string& path);  // dies when unreadable
std::string temp_dir();                    // this process's scratch directory, removed at exit
// stories260K (tests/data/stories260K) as GGUF in temp_dir(), converted on first use.
const std::string& stories260k_gguf();
// The tokenizer of a GGUF model (dies when it does not load).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& gguf_path);
// models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_model.sh fetches it); "" when absent.
std::string smollm2_path_if_present();

// Splits fuzz input at the first `separator`: {before, after}; {all, ""} without one.
std::pair<std::string_view, std::string_view> split_input(std::string_view data, std::string_view separator);

}  // namespace helios::fuzz
