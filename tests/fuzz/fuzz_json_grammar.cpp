// Bytes → structured output: a JSON schema, then text held to it. Input: SCHEMA, a line "\n--\n",
// TEXT (an empty schema stands for response_format json_object). A schema compiles (to one
// grammar, or one per alternative of a top-level union: from_schema_choice) or is refused with
// INVALID_ARGUMENT; the JsonChoice then takes the text a piece at a time and must agree with
// itself: accepts() answers what advance() then does and changes nothing, a refused piece leaves
// it where it was, and nothing follows a closed value.
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "helios/json_grammar.h"

namespace helios::fuzz {
namespace {

void run(const uint8_t* data, size_t size) {
  const auto [schema, text] = split_input({reinterpret_cast<const char*>(data), size}, "\n--\n");
  std::vector<std::shared_ptr<const JsonGrammar>> grammars;
  if (schema.empty()) {
    grammars = {JsonGrammar::any_object()};
  } else {
    auto compiled = JsonGrammar::from_schema_choice(std::string(schema));
    if (!compiled.ok()) {
      if (compiled.status().code() != StatusCode::kInvalidArgument) die("schema refused with " + compiled.status().to_string());
      if (compiled.status().message().empty()) die("schema refused without saying why");
      return;
    }
    if (compiled->empty()) die("a schema compiled to no grammar");
    grammars = *compiled;
  }
  JsonChoice m(grammars);
  // Pieces of 1-4 bytes, as tokens come: the length from the piece's first byte.
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min<size_t>(1 + static_cast<unsigned char>(text[at]) % 4, text.size() - at);
    const std::string_view piece = text.substr(at, n);
    const bool closed = m.closed(), complete = m.complete();
    const bool accepted = m.accepts(piece);
    if (m.closed() != closed || m.complete() != complete) die("accepts() changed the matcher");
    if (m.advance(piece) != accepted) die("advance() disagrees with accepts()");
    if (closed && accepted) die("a piece was taken after the value closed");
    if (!accepted && (m.closed() != closed || m.complete() != complete)) die("a refused piece moved the matcher");
    if (m.closed() && !m.complete()) die("closed but not complete");
    at += n;
  }
}

}  // namespace
}  // namespace helios::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  helios::fuzz::run(data, size);
  return 0;
}
