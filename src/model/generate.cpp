#include "helios/generate.h"

#include <algorithm>
#include <chrono>

namespace helios {
namespace {

// One generation's bookkeeping: the history, the text pipeline and the stop conditions.
class Generation {
 public:
  Generation(const Tokenizer& tok, const GenerateOptions& opt, const std::vector<TokenId>& prompt,
             const TextSink& on_text)
      : tok_(tok), opt_(opt), sampler_(opt.sampling), decoder_(tok), stops_(opt.stop),
        history_(prompt), on_text_(on_text) {
    out_.n_prompt_tokens = static_cast<int32_t>(prompt.size());
  }

  const std::vector<TokenId>& history() const { return history_; }
  GenerateResult& result() { return out_; }
  int32_t remaining() const { return opt_.max_tokens - static_cast<int32_t>(out_.tokens.size()); }

  // Samples from one row of logits and records the token; false when the generation is over.
  bool take(const float* logits, int32_t n_vocab, int32_t exit_layer, float confidence) {
    scratch_.assign(logits, logits + n_vocab);  // the sampler rewrites its copy
    const TokenId next = sampler_.sample(scratch_.data(), n_vocab, history_);
    last_ = next;
    out_.tokens.push_back(next);
    out_.exit_layers.push_back(exit_layer);
    out_.confidences.push_back(confidence);
    history_.push_back(next);
    if (!opt_.ignore_eos && tok_.is_end_of_generation(next)) {
      out_.finish = FinishReason::kEos;
      return false;
    }
    emit(decoder_.push(next));
    if (stops_.stopped()) {
      out_.finish = FinishReason::kStopString;
      return false;
    }
    if (remaining() <= 0) {
      out_.finish = FinishReason::kLength;
      return false;
    }
    return true;
  }
  TokenId last() const { return last_; }

  void finish() {
    if (out_.finish == FinishReason::kStopString) return;
    emit(decoder_.flush());
    const std::string tail = stops_.flush();
    out_.text += tail;
    if (on_text_ && !tail.empty()) on_text_(tail);
  }

 private:
  void emit(const std::string& piece) {
    const std::string text = stops_.push(piece);
    out_.text += text;
    if (on_text_ && !text.empty()) on_text_(text);
  }

  const Tokenizer& tok_;
  const GenerateOptions& opt_;
  Sampler sampler_;
  StreamDecoder decoder_;
  StopMatcher stops_;
  std::vector<TokenId> history_;
  std::vector<float> scratch_;
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

Status speculative_round(Model& model, KvCacheStorage& kv, int32_t draft_layer, std::vector<SpeculativeSeq>& seqs,
                         ForwardResult* verify, SpeculativeWork* work) {
  const int32_t n_embd = model.config().n_embd;
  int32_t max_draft = 0;
  std::vector<std::vector<float>> hidden(seqs.size());
  for (auto& s : seqs) {
    s.inputs = {s.input};
    max_draft = std::max(max_draft, s.n_draft);
  }
  // Draft: pass i runs every sequence's i-th input up to the draft exit; its exit head proposes
  // the next input (the last input needs no proposal).
  for (int32_t i = 0; i <= max_draft; ++i) {
    ForwardBatch draft;
    draft.last_layer = draft_layer;
    draft.return_hidden = true;
    std::vector<size_t> in_pass;
    for (size_t j = 0; j < seqs.size(); ++j) {
      const SpeculativeSeq& s = seqs[j];
      if (i > s.n_draft) continue;
      SequenceBatchEntry e;
      e.tokens = {s.inputs[i]};
      e.start_pos = s.position + i;
      e.blocks = s.table;
      e.logits = i < s.n_draft ? LogitsWanted::kLast : LogitsWanted::kNone;
      draft.seqs.push_back(std::move(e));
      in_pass.push_back(j);
    }
    HELIOS_ASSIGN_OR_RETURN(ForwardResult fr, model.forward(draft, kv));
    work->layer_rows += fr.layer_rows;
    work->head_rows += fr.head_rows;
    for (size_t k = 0; k < in_pass.size(); ++k) {
      auto& h = hidden[in_pass[k]];
      h.insert(h.end(), fr.hidden.begin() + k * n_embd, fr.hidden.begin() + (k + 1) * n_embd);
    }
    for (size_t r = 0; r < fr.row_seq.size(); ++r) {
      seqs[in_pass[fr.row_seq[r]]].inputs.push_back(argmax(fr.row(r), fr.n_vocab));
    }
  }
  // Verify: all inputs continue from the draft exit through the remaining blocks at once.
  ForwardBatch check;
  check.first_layer = draft_layer;
  std::vector<float> hidden_in;
  int32_t row = 0;
  for (size_t j = 0; j < seqs.size(); ++j) {
    SpeculativeSeq& s = seqs[j];
    SequenceBatchEntry e;
    e.tokens = s.inputs;
    e.start_pos = s.position;
    e.blocks = s.table;
    e.logits = LogitsWanted::kAll;
    check.seqs.push_back(std::move(e));
    hidden_in.insert(hidden_in.end(), hidden[j].begin(), hidden[j].end());
    s.first_row = row;
    row += static_cast<int32_t>(s.inputs.size());
  }
  check.hidden_in = hidden_in.data();
  HELIOS_ASSIGN_OR_RETURN(*verify, model.forward(check, kv));
  work->layer_rows += verify->layer_rows;
  work->head_rows += verify->head_rows;
  return ok_status();
}

int32_t take_speculated(const SpeculativeSeq& seq, const TakeVerifiedRow& take) {
  int32_t confirmed = 0;
  for (int32_t i = 0; i <= seq.n_draft; ++i) {
    TokenId token = 0;
    const bool going = take(seq.first_row + i, &token);
    const bool draft_confirmed = i < seq.n_draft && seq.inputs[i + 1] == token;
    confirmed += draft_confirmed;
    if (!going || !draft_confirmed) break;
  }
  return confirmed;
}

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
  HELIOS_ASSIGN_OR_RETURN(auto kv, KvCacheStorage::create(model.backend(), model.kv_config(), n_blocks, opt.block_size));
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
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
  }
  const auto t1 = clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // Decode: sample, check the stop conditions, feed the token back.
  bool going = gen.take(fr.row(0), fr.n_vocab, fr.row_exit_layer[0], fr.row_confidence[0]);
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
      HELIOS_RETURN_IF_ERROR(speculative_round(model, kv, rule.depth, round, &fr, &work));
      out.decode_layer_rows += work.layer_rows;
      out.decode_head_rows += work.head_rows;
      out.drafted += n_draft;
      out.accepted += take_speculated(round[0], [&](int32_t row, TokenId* token) {
        going = gen.take(fr.row(row), fr.n_vocab, fr.row_exit_layer[row], fr.row_confidence[row]);
        *token = gen.last();
        return going;
      });
      continue;
    }
    ForwardBatch batch;
    SequenceBatchEntry e;
    e.tokens = {gen.last()};
    e.start_pos = position;
    e.blocks = &table;
    e.exit = rule;
    batch.seqs.push_back(std::move(e));
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
    count_work(fr, out);
    going = gen.take(fr.row(0), fr.n_vocab, fr.row_exit_layer[0], fr.row_confidence[0]);
  }
  gen.finish();
  out.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return std::move(out);
}

}  // namespace helios
