// Calibration and evaluation text: documents from plain-text or JSON(L) files, and their tokens
// cut into teacher-forcing sequences.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "helios/calibrate.h"

namespace helios {
namespace {

using json = nlohmann::json;

constexpr size_t kMinStringChars = 32;  // shorter loose strings are ids, roles, labels

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

void add_document(const std::string& text, std::vector<std::string>* out) {
  std::string t = trim(text);
  if (!t.empty()) out->push_back(std::move(t));
}

const std::string* string_field(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

// One record → documents. Known shapes first (a conversation is one document, its turns joined);
// anything else is searched for long strings.
void extract_documents(const json& value, std::vector<std::string>* out) {
  if (value.is_string()) {
    if (value.get_ref<const std::string&>().size() >= kMinStringChars) add_document(value.get<std::string>(), out);
    return;
  }
  if (value.is_array()) {
    for (const json& v : value) extract_documents(v, out);
    return;
  }
  if (!value.is_object()) return;
  for (const char* key : {"conversations", "messages"}) {
    auto it = value.find(key);
    if (it == value.end() || !it->is_array()) continue;
    std::string joined;
    for (const json& turn : *it) {
      const std::string* text = turn.is_string() ? turn.get_ptr<const std::string*>() : nullptr;
      if (turn.is_object()) {
        text = string_field(turn, "value");
        if (!text) text = string_field(turn, "content");
      }
      if (text && !trim(*text).empty()) joined += (joined.empty() ? "" : "\n\n") + trim(*text);
    }
    add_document(joined, out);
    return;
  }
  if (const std::string* q = string_field(value, "question")) {
    const std::string* a = string_field(value, "answer");
    add_document(*q + (a ? "\n" + *a : ""), out);
    return;
  }
  for (const char* key : {"prompt", "text", "instruction", "content"}) {
    if (const std::string* s = string_field(value, key)) {
      add_document(*s, out);
      return;
    }
  }
  for (const auto& item : value.items()) extract_documents(item.value(), out);
}

std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (trim(line).empty()) {
      add_document(current, &out);
      current.clear();
    } else {
      current += (current.empty() ? "" : "\n") + line;
    }
  }
  add_document(current, &out);
  return out;
}

bool ends_with(std::string s, const std::string& suffix) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

StatusOr<std::vector<std::string>> load_text_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open the text file (check the path)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  std::vector<std::string> docs;
  if (ends_with(path, ".json") || ends_with(path, ".jsonl")) {
    // A whole JSON document, else one JSON value per line (JSONL).
    json whole = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!whole.is_discarded()) {
      extract_documents(whole, &docs);
    } else {
      std::istringstream lines(text);
      std::string line;
      int64_t line_no = 0;
      while (std::getline(lines, line)) {
        ++line_no;
        if (trim(line).empty()) continue;
        json record = json::parse(line, nullptr, false);
        if (record.is_discarded()) {
          return invalid_argument(path + ": line " + std::to_string(line_no) +
                                  " is not JSON (a .json/.jsonl file must be JSON, or one JSON value per line; "
                                  "rename plain text to .txt)");
        }
        extract_documents(record, &docs);
      }
    }
  } else {
    docs = paragraphs(text);
  }
  if (docs.empty()) {
    return invalid_argument(path + ": no text found (expected paragraphs, or JSON with conversations, "
                            "question/answer, prompt/text fields or long strings)");
  }
  return docs;
}

std::vector<std::string> interleave_documents(std::vector<std::vector<std::string>> per_file) {
  std::vector<std::string> out;
  for (size_t i = 0, taken = 1; taken > 0; ++i) {
    taken = 0;
    for (auto& docs : per_file) {
      if (i < docs.size()) out.push_back(std::move(docs[i])), ++taken;
    }
  }
  return out;
}

std::vector<std::vector<TokenId>> make_token_sequences(const Tokenizer& tok, const std::vector<std::string>& documents,
                                                       int32_t seq_len, int64_t max_tokens) {
  std::vector<std::vector<TokenId>> out;
  if (seq_len < 2 || max_tokens < 2) return out;
  int64_t total = 0;
  auto take = [&](const std::vector<TokenId>& ids, size_t begin) {
    const auto room = static_cast<size_t>(std::min<int64_t>(seq_len, max_tokens - total));
    const size_t end = std::min(ids.size(), begin + room);
    if (end < begin + 2) return;
    out.emplace_back(ids.begin() + begin, ids.begin() + end);
    total += static_cast<int64_t>(end - begin);
  };
  // Round 0: each document's first chunk; the rest is kept for later rounds only if needed.
  std::vector<std::vector<TokenId>> rest;
  for (const std::string& doc : documents) {
    if (total >= max_tokens) break;
    std::vector<TokenId> ids = tok.encode(doc, /*add_special=*/true, /*parse_special=*/false);
    take(ids, 0);
    if (ids.size() > static_cast<size_t>(seq_len)) rest.push_back(std::move(ids));
  }
  for (size_t round = 1; total < max_tokens; ++round) {
    bool any = false;
    for (const auto& ids : rest) {
      if (total >= max_tokens) break;
      const size_t begin = round * static_cast<size_t>(seq_len);
      if (begin >= ids.size()) continue;
      any = true;
      take(ids, begin);
    }
    if (!any) break;
  }
  return out;
}

std::string default_exit_heads_path(const std::string& model_path) {
  const std::filesystem::path p(model_path);
  return (p.parent_path() / p.stem()).string() + ".exits.gguf";
}

}  // namespace helios
