// Text → encode → decode with real vocabularies: stories260K's SentencePiece-style one (always)
// and SmolLM2's byte-level BPE one (when models/ has the model: scripts/fetch_model.sh) under each
// of the four pre-tokenizers. Checks what the tokenizers promise:
//   - every id is in the vocabulary;
//   - BPE: decode(encode(x)) is x with each malformed byte replaced by U+FFFD, with or without
//     special-token parsing (control tokens render back to their text), for texts whose bytes
//     all have a token;
//   - SentencePiece: decode(encode(x)) is x for valid UTF-8 without a literal "▁" (which means a
//     space in this vocabulary);
//   - the stream decoder writes whole UTF-8 only, and for BPE what decode() writes, made valid.
//
// Input: one byte of flags, then the text.
//   bits 0-2  vocabulary: 0-1 stories260K, 2 SmolLM2 as its file says (smollm), 3 gpt2, 4 llama3,
//             5 qwen2, 6-7 stories260K (SmolLM2's fall back to stories260K without the model)
//   bit 3     add_special      bit 4  parse_special
//   bit 5     the text's bytes 0..7 give special ranges for encode_with_special_ranges
//   bit 6     also decode the text's bytes as a sequence of arbitrary token ids
#include <algorithm>
#include <cstdio>
#include <set>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/unicode.h"

namespace helios::fuzz {
namespace {

struct Vocabularies {
  std::unique_ptr<Tokenizer> spm;
  std::unique_ptr<Tokenizer> bpe[4];  // smollm (the file's), gpt2, llama3, qwen2
  // Bytes the BPE vocabulary has a token for: the others are dropped (as llama.cpp drops them;
  // SmolLM2 lacks a few control characters and lead bytes of rare code points), so only texts
  // without them round-trip.
  bool bpe_has_byte[256] = {};
};

const Vocabularies& vocabularies() {
  static const Vocabularies* v = [] {
    auto* out = new Vocabularies;
    out->spm = load_tokenizer(stories260k_gguf());
    const std::string smollm2 = smollm2_path_if_present();
    if (smollm2.empty()) {
      std::fprintf(stderr, "fuzz_tokenizer: models/SmolLM2-135M-Instruct.Q4_1.gguf is absent "
                           "(scripts/fetch_model.sh fetches it): fuzzing the SentencePiece vocabulary only\n");
      return out;
    }
    auto file_tok = load_tokenizer(smollm2);
    const std::set<std::string> tokens(file_tok->spec().tokens.begin(), file_tok->spec().tokens.end());
    std::string missing;
    for (int b = 0; b < 256; ++b) {
      out->bpe_has_byte[b] = tokens.count(unicode::byte_to_char(static_cast<uint8_t>(b))) > 0;
      if (!out->bpe_has_byte[b]) missing += " " + std::to_string(b);
    }
    if (!missing.empty()) std::fprintf(stderr, "fuzz_tokenizer: SmolLM2 has no token for the bytes%s\n", missing.c_str());
    const PreTokenizer pres[4] = {file_tok->spec().pre, PreTokenizer::kGpt2, PreTokenizer::kLlama3,
                                  PreTokenizer::kQwen2};
    for (int i = 0; i < 4; ++i) {
      TokenizerSpec spec = file_tok->spec();
      spec.pre = pres[i];
      auto tok = Tokenizer::create(std::move(spec));
      if (!tok.ok()) die(tok.status().to_string());
      out->bpe[i] = std::move(*tok);
    }
    return out;
  }();
  return *v;
}

// What byte-level BPE's decode(encode(x)) gives back: x, each malformed byte as U+FFFD.
std::string lossy_utf8(std::string_view text) {
  std::string out;
  for (uint32_t cp : unicode::decode(text)) unicode::append_utf8(cp, &out);
  return out;
}

bool is_strict_utf8(std::string_view text) { return unicode::sanitize_utf8(text) == text; }

void check_ids(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  for (TokenId id : ids) {
    if (id < 0 || id >= tok.n_vocab()) die("encode gave token " + std::to_string(id) + " outside the vocabulary");
  }
}

// Stream-decodes `ids`; the output must be whole UTF-8.
std::string stream_decode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  StreamDecoder stream(tok);
  std::string out;
  for (TokenId id : ids) out += stream.push(id);
  out += stream.flush();
  if (!is_strict_utf8(out)) die("the stream decoder wrote malformed UTF-8");
  return out;
}

std::string hex(std::string_view bytes) {
  std::string out;
  char buf[4];
  for (unsigned char c : bytes.substr(0, 96)) {
    std::snprintf(buf, sizeof buf, "%02x ", c);
    out += buf;
  }
  return out + (bytes.size() > 96 ? "..." : "");
}

void mismatch(const char* what, std::string_view text, const std::string& got, const std::string& want) {
  die(std::string(what) + ": text [" + hex(text) + "] decodes to [" + hex(got) + "], expected [" + hex(want) + "]");
}

ByteRanges ranges_from(std::string_view text) {
  std::vector<size_t> cuts;
  for (size_t i = 0; i < std::min<size_t>(8, text.size()); ++i) {
    cuts.push_back(static_cast<uint8_t>(text[i]) % (text.size() + 1));
  }
  std::sort(cuts.begin(), cuts.end());
  ByteRanges ranges;
  for (size_t i = 0; i + 1 < cuts.size(); i += 2) {
    if (cuts[i] < cuts[i + 1]) ranges.emplace_back(cuts[i], cuts[i + 1]);
  }
  return ranges;
}

void run(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool add_special = flags & 8, parse_special = flags & 16;
  const Vocabularies& v = vocabularies();
  const int vocab = flags & 7;
  const bool bpe = vocab >= 2 && vocab <= 5 && v.bpe[0];
  const Tokenizer& tok = bpe ? *v.bpe[vocab - 2] : *v.spm;

  std::vector<TokenId> ids = tok.encode(text, add_special, parse_special);
  check_ids(tok, ids);
  // Without BOS/EOS: what the text itself became.
  std::vector<TokenId> body = ids;
  if (add_special) {
    if (tok.spec().add_bos && (body.empty() || body.front() != tok.bos())) die("add_special gave no BOS first");
    if (tok.spec().add_bos) body.erase(body.begin());
    if (tok.spec().add_eos && !body.empty() && body.back() == tok.eos()) body.pop_back();
  }
  const std::string want = bpe ? lossy_utf8(text) : std::string();
  const bool bpe_round_trips =
      bpe && std::all_of(want.begin(), want.end(), [&](char c) { return v.bpe_has_byte[static_cast<uint8_t>(c)]; });
  if (bpe_round_trips) {
    const std::string got = tok.decode(body, /*render_special=*/parse_special);
    if (got != want) mismatch("BPE round trip", text, got, want);
    // The stream holds back split characters and replaces what is malformed (a surrogate the
    // text spelled, say): what decode() gives, made valid.
    if (!parse_special && stream_decode(tok, body) != unicode::sanitize_utf8(got)) {
      die("BPE: the stream decoder and decode() disagree");
    }
  } else if (!bpe && !parse_special && is_strict_utf8(text) && text.find("\xE2\x96\x81") == std::string::npos) {
    const std::string got = tok.decode(body);
    if (got != text) mismatch("SentencePiece round trip", text, got, text);
  }
  (void)stream_decode(tok, ids);

  if (flags & 32) {
    const ByteRanges ranges = ranges_from(text);
    const std::vector<TokenId> ranged = tok.encode_with_special_ranges(text, add_special, ranges);
    check_ids(tok, ranged);
    if (bpe_round_trips) {
      std::vector<TokenId> ranged_body = ranged;
      if (add_special && tok.spec().add_bos && !ranged_body.empty()) ranged_body.erase(ranged_body.begin());
      const std::string got = tok.decode(ranged_body, /*render_special=*/true);
      if (got != want) mismatch("BPE round trip with special ranges", text, got, want);
    }
  }
  if (flags & 64) {
    // Any ids at all: decode must not fail, in either rendering.
    std::vector<TokenId> any;
    for (size_t i = 0; i + 1 < text.size(); i += 2) {
      const auto id = static_cast<uint16_t>(static_cast<uint8_t>(text[i]) | static_cast<uint8_t>(text[i + 1]) << 8);
      any.push_back(static_cast<TokenId>(id % tok.n_vocab()));
    }
    (void)tok.decode(any, true);
    (void)tok.decode(any, false);
    (void)stream_decode(tok, any);
    for (TokenId id : any) (void)tok.is_end_of_generation(id);
  }
}

}  // namespace
}  // namespace helios::fuzz

// The fixtures load before the first input, outside its time limit (-timeout): loading a real
// vocabulary under ASan takes seconds, more on a busy machine.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  helios::fuzz::vocabularies();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  helios::fuzz::run(data, size);
  return 0;
}
