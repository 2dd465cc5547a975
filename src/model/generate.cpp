#include "helios/generate.h"

#include <algorithm>
#include <chrono>

#include "helios/output.h"
#include "helios/speculative.h"

namespace helios {
namespace {

// One generation's bookkeeping: the history and the output path (the server's, see output.h).
class Generation {
 public:
  Generation(const Tokenizer& tok, const GenerateOptions& opt, const std::vector<TokenId>& prompt,
             const TextSink& on_text)
      : output_(tok, opt), history_(prompt), on_text_(on_text) {
    out_.n_prompt_tokens = static_cast<int32_t>(prompt.size());
  }

  const std::vector<TokenId>& history() const { return history_; }
  GenerateResult& result() { return out_; }
  int32_t remaining() const { return output_.remaining(); }

  // What the exit heads said about row `row` of fr (observe mode), kept beside the next token.
  void observe(const ForwardResult& fr, int32_t row) {
    if (fr.observed_layers.empty()) return;
    out_.observed_layers = fr.observed_layers;
    std::vector<ExitObservation>& seen = out_.observed.emplace_back();
    for (const auto& layer : fr.observed) seen.push_back(layer[row]);
  }

  // Samples from one row of logits and records the token; false when the generation is over.
  bool take(const float* logits, int32_t n_vocab, int32_t exit_layer, float confidence) {
    const TokenEvent ev = output_.take(logits, n_vocab, history_, exit_layer, confidence);
    last_ = ev.id;
    out_.tokens.push_back(ev.id);
    out_.exit_layers.push_back(exit_layer);
    out_.confidences.push_back(confidence);
    history_.push_back(ev.id);
    out_.text += ev.text;
    if (on_text_ && !ev.text.empty()) on_text_(ev.text);
    out_.finish = output_.finish();
    return out_.finish == FinishReason::kNone;
  }
  TokenId last() const { return last_; }

 private:

  RequestOutput output_;
  std::vector<TokenId> history_;
  TextSink on_text_;
  GenerateResult out_;
  TokenId last_ = 0;
};

void count_work(const ForwardResult& fr, GenerateResult& out) {
  out.decode_layer_rows += fr.layer_rows;
  out.decode_fill_rows += fr.fill_rows;
  out.decode_head_rows += fr.head_rows;
}

}  // namespace

StatusOr<GenerateResult> generate(Model& model, const std::vector<TokenId>& prompt,
                                  const GenerateOptions& opt, const TextSink& on_text) {
  HELIOS_RETURN_IF_ERROR(opt.sampling.validate());
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  if (opt.max_tokens <= 0) return invalid_argument("max_tokens must be > 0");
  HELIOS_RETURN_IF_ERROR(model.check_exit_rule(opt.exit));
  const ExitRule rule = model.resolve_exit_rule(opt.exit);
  const ModelConfig& c = model.config();
  const int32_t n_total = static_cast<int32_t>(prompt.size()) + opt.max_tokens;
  if (n_total > c.n_ctx_train) {
    return invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                            std::to_string(opt.max_tokens) + ") exceeds the model's context of " +
                            std::to_string(c.n_ctx_train) + " tokens");
  }
  // One sequence: a cache just large enough for it.
  const int32_t n_blocks = blocks_for_tokens(n_total, opt.block_size);
  HELIOS_ASSIGN_OR_RETURN(auto kv, model.create_kv(n_blocks, opt.block_size, opt.kv_type));
  BlockAllocator allocator(n_blocks);
  BlockTable table;
  if (!reserve_tokens(allocator, table, n_total, opt.block_size)) {
    return internal_error("KV blocks sized for the sequence ran out");
  }

  using clock = std::chrono::steady_clock;
  Generation gen(model.tokenizer(), opt, prompt, on_text);
  GenerateResult& out = gen.result();

  // Prefill in chunks; the last chunk's last row gives the first token.
  const auto t0 = clock::now();
  ForwardResult fr;
  for (size_t begin = 0; begin < prompt.size(); begin += opt.prefill_chunk_tokens) {
    const size_t end = std::min(prompt.size(), begin + opt.prefill_chunk_tokens);
    ForwardBatch batch;
    SequenceBatchEntry e;
    e.tokens.assign(prompt.begin() + begin, prompt.begin() + end);
    e.start_pos = static_cast<int32_t>(begin);
    e.blocks = &table;
    e.logits = end == prompt.size() ? LogitsWanted::kLast : LogitsWanted::kNone;
    e.exit = rule;
    batch.seqs.push_back(std::move(e));
    batch.observe_exits = opt.observe_exits;
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
  }
  const auto t1 = clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // Decode: sample, check the stop conditions, feed the token back.
  gen.observe(fr, 0);
  bool going = gen.take(fr.row(0), fr.n_vocab, fr.row_exit_layer[0], fr.row_confidence[0]);
  TokenId lookahead = -1;  // drafting at the model's depth: the lookahead head's last guess
  while (going) {
    const auto position = static_cast<int32_t>(gen.history().size()) - 1;
    if (rule.policy == ExitPolicy::kSelfSpeculative) {
      // Never draft past max_tokens: the round emits at most n_draft + 1 tokens.
      const int32_t n_draft = std::min(rule.draft_tokens, gen.remaining() - 1);
      SpeculativeWork work;
      std::vector<SpeculativeSeq> round(1);
      round[0].table = &table;
      round[0].input = gen.last();
      round[0].position = position;
      round[0].n_draft = n_draft;
      round[0].draft_threshold = rule.threshold_at(rule.depth);
      round[0].draft_vocab = rule.draft_vocab;
      round[0].lookahead = lookahead;
      HELIOS_RETURN_IF_ERROR(speculative_round(model, kv, rule.depth, round, &fr, &work));
      out.drafted += round[0].n_draft;
      const int32_t accepted = take_speculated(round[0], [&](int32_t row, TokenId* token) {
        going = gen.take(fr.row(row), fr.n_vocab, fr.row_exit_layer[row], fr.row_confidence[row]);
        *token = gen.last();
        return going;
      });
      out.accepted += accepted;
      if (going && rule.depth == model.n_layers_loaded()) {  // the next draft, from the row taken last
        const LookaheadFrom from{round[0].first_row + accepted, gen.last(), round[0].draft_threshold, rule.draft_vocab};
        HELIOS_ASSIGN_OR_RETURN(std::vector<TokenId> next, lookahead_drafts(model, fr, {from}, &work));
        lookahead = next[0];
      }
      out.decode_layer_rows += work.layer_rows;
      out.decode_head_rows += work.head_rows;
      continue;
    }
    ForwardBatch batch;
    SequenceBatchEntry e;
    e.tokens = {gen.last()};
    e.start_pos = position;
    e.blocks = &table;
    e.exit = rule;
    batch.seqs.push_back(std::move(e));
    batch.observe_exits = opt.observe_exits;
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
    count_work(fr, out);
    gen.observe(fr, 0);
    going = gen.take(fr.row(0), fr.n_vocab, fr.row_exit_layer[0], fr.row_confidence[0]);
  }
  out.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return std::move(out);
}

}  // namespace helios
