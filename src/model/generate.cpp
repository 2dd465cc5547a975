#include "helios/generate.h"

#include <chrono>

namespace helios {

StatusOr<GenerateResult> generate(Model& model, const std::vector<TokenId>& prompt,
                                  const GenerateOptions& opt, const TextSink& on_text) {
  HELIOS_RETURN_IF_ERROR(opt.sampling.validate());
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  if (opt.max_tokens <= 0) return invalid_argument("max_tokens must be > 0");
  const ModelConfig& c = model.config();
  const int32_t n_total = static_cast<int32_t>(prompt.size()) + opt.max_tokens;
  if (n_total > c.n_ctx_train) {
    return invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                            std::to_string(opt.max_tokens) + ") exceeds the model's context of " +
                            std::to_string(c.n_ctx_train) + " tokens");
  }
  // One sequence: a cache just large enough for it.
  const int32_t n_blocks = blocks_for_tokens(n_total, opt.block_size);
  HELIOS_ASSIGN_OR_RETURN(auto kv, KvCacheStorage::create(model.backend(), c, n_blocks, opt.block_size));
  BlockAllocator allocator(n_blocks);
  BlockTable table;
  if (!reserve_tokens(allocator, table, n_total, opt.block_size)) {
    return internal_error("KV blocks sized for the sequence ran out");
  }

  using clock = std::chrono::steady_clock;
  GenerateResult out;
  out.n_prompt_tokens = static_cast<int32_t>(prompt.size());
  const Tokenizer& tok = model.tokenizer();
  Sampler sampler(opt.sampling);
  StreamDecoder decoder(tok);
  StopMatcher stops(opt.stop);
  std::vector<TokenId> history = prompt;
  auto emit = [&](const std::string& piece) {
    const std::string text = stops.push(piece);
    out.text += text;
    if (on_text && !text.empty()) on_text(text);
  };

  // Prefill in chunks; the last chunk's last row gives the first token.
  const auto t0 = clock::now();
  ForwardResult fr;
  for (size_t begin = 0; begin < prompt.size(); begin += opt.prefill_chunk_tokens) {
    const size_t end = std::min(prompt.size(), begin + opt.prefill_chunk_tokens);
    ForwardBatch batch;
    batch.seqs.push_back({std::vector<TokenId>(prompt.begin() + begin, prompt.begin() + end),
                          static_cast<int32_t>(begin), &table,
                          end == prompt.size() ? LogitsWanted::kLast : LogitsWanted::kNone});
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
  }
  const auto t1 = clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // Decode: sample, check the stop conditions, feed the token back.
  for (;;) {
    const TokenId next = sampler.sample(fr.logits.data(), fr.n_vocab, history);
    out.tokens.push_back(next);
    history.push_back(next);
    if (!opt.ignore_eos && tok.is_end_of_generation(next)) {
      out.finish = FinishReason::kEos;
      break;
    }
    emit(decoder.push(next));
    if (stops.stopped()) {
      out.finish = FinishReason::kStopString;
      break;
    }
    if (static_cast<int32_t>(out.tokens.size()) >= opt.max_tokens) {
      out.finish = FinishReason::kLength;
      break;
    }
    ForwardBatch batch;
    batch.seqs.push_back({{next}, static_cast<int32_t>(history.size()) - 1, &table, LogitsWanted::kLast});
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
  }
  if (out.finish != FinishReason::kStopString) {
    emit(decoder.flush());
    const std::string tail = stops.flush();
    out.text += tail;
    if (on_text && !tail.empty()) on_text(tail);
  }
  out.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return out;
}

}  // namespace helios
