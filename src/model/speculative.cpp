#include "helios/speculative.h"

#include <algorithm>

#include "helios/sampler.h"

namespace helios {
namespace {

// The verify pass's entry for a sequence: every input, with the full model's logits after each;
// its rows start at `*row`, which moves past them.
SequenceBatchEntry verify_entry(SpeculativeSeq& s, int32_t* row) {
  SequenceBatchEntry e;
  e.tokens = s.inputs;
  e.start_pos = s.position;
  e.blocks = s.table;
  e.logits = LogitsWanted::kAll;
  s.first_row = *row;
  *row += static_cast<int32_t>(s.inputs.size());
  return e;
}

// A lookahead round: each sequence's input and its pending draft in one full pass, keeping the
// rows' last-layer states for lookahead_drafts.
Status lookahead_round(Model& model, KvCacheStorage& kv, std::vector<SpeculativeSeq>& seqs, ForwardResult* verify,
                       SpeculativeWork* work) {
  const int32_t n_vocab = model.config().n_vocab;
  ForwardBatch check;
  check.capture_layers = {model.n_layers_loaded()};
  int32_t row = 0;
  for (SpeculativeSeq& s : seqs) {
    s.inputs = {s.input};
    if (s.n_draft > 0 && s.lookahead >= 0 && s.lookahead < n_vocab) s.inputs.push_back(s.lookahead);
    s.n_draft = static_cast<int32_t>(s.inputs.size()) - 1;
    check.seqs.push_back(verify_entry(s, &row));
  }
  HELIOS_ASSIGN_OR_RETURN(*verify, model.forward(check, kv));
  work->layer_rows += verify->layer_rows;
  work->head_rows += verify->head_rows;
  return ok_status();
}

}  // namespace

Status speculative_round(Model& model, KvCacheStorage& kv, int32_t draft_layer, std::vector<SpeculativeSeq>& seqs,
                         ForwardResult* verify, SpeculativeWork* work) {
  if (draft_layer == model.n_layers_loaded()) {
    if (!model.has_lookahead()) {
      return failed_precondition("drafting at the model's depth (" + std::to_string(draft_layer) +
                                 ") needs a lookahead head (helios calibrate --lookahead)");
    }
    return lookahead_round(model, kv, seqs, verify, work);
  }
  const int32_t n_embd = model.config().n_embd;
  int32_t max_draft = 0;
  std::vector<std::vector<float>> hidden(seqs.size());
  for (auto& s : seqs) {
    s.inputs = {s.input};
    max_draft = std::max(max_draft, s.n_draft);
  }
  // Draft: pass i runs every sequence's i-th input up to the draft exit; its exit head proposes
  // the next input (the last input needs no proposal), or ends the drafting when unsure.
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
    if (draft.seqs.empty()) break;
    for (size_t j : in_pass) {  // the widest draft vocabulary of the pass; 0 (all) is widest
      const int32_t v = seqs[j].draft_vocab, n_vocab = model.config().n_vocab;
      const int32_t width = v > 0 && v < n_vocab ? v : n_vocab;
      draft.head_vocab = std::max(draft.head_vocab, width);
    }
    if (draft.head_vocab == model.config().n_vocab) draft.head_vocab = 0;
    HELIOS_ASSIGN_OR_RETURN(ForwardResult fr, model.forward(draft, kv));
    work->layer_rows += fr.layer_rows;
    work->head_rows += fr.head_rows;
    for (size_t k = 0; k < in_pass.size(); ++k) {
      auto& h = hidden[in_pass[k]];
      h.insert(h.end(), fr.hidden.begin() + k * n_embd, fr.hidden.begin() + (k + 1) * n_embd);
    }
    for (size_t r = 0; r < fr.row_seq.size(); ++r) {
      SpeculativeSeq& s = seqs[in_pass[fr.row_seq[r]]];
      if (!meets_threshold(fr.row_confidence[r], s.draft_threshold)) {
        s.n_draft = i;
      } else {
        s.inputs.push_back(argmax(fr.row(r), fr.n_vocab));
      }
    }
  }
  // Verify: all inputs continue from the draft exit through the remaining blocks at once.
  ForwardBatch check;
  check.first_layer = draft_layer;
  std::vector<float> hidden_in;
  int32_t row = 0;
  for (size_t j = 0; j < seqs.size(); ++j) {
    check.seqs.push_back(verify_entry(seqs[j], &row));
    hidden_in.insert(hidden_in.end(), hidden[j].begin(), hidden[j].end());
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

StatusOr<std::vector<TokenId>> lookahead_drafts(const Model& model, const ForwardResult& verify,
                                                const std::vector<LookaheadFrom>& from, SpeculativeWork* work) {
  const int32_t n_embd = model.config().n_embd, n_vocab = model.config().n_vocab;
  if (verify.captured.size() != 1) return invalid_argument("lookahead_drafts needs a lookahead round's verify pass");
  const auto n_rows = static_cast<int32_t>(verify.row_seq.size());
  std::vector<float> states;
  std::vector<TokenId> tokens;
  int32_t vocab = 0;
  for (const LookaheadFrom& f : from) {
    if (f.row < 0 || f.row >= n_rows) {
      return invalid_argument("lookahead_drafts: row " + std::to_string(f.row) + " outside the pass's " +
                              std::to_string(n_rows));
    }
    const float* state = verify.captured[0].data() + static_cast<size_t>(f.row) * n_embd;
    states.insert(states.end(), state, state + n_embd);
    tokens.push_back(f.token);
    vocab = std::max(vocab, f.vocab > 0 && f.vocab < n_vocab ? f.vocab : n_vocab);
  }
  const auto n = static_cast<int32_t>(from.size());
  HELIOS_ASSIGN_OR_RETURN(std::vector<ExitObservation> guesses,
                          model.lookahead(states.data(), tokens.data(), n, vocab == n_vocab ? 0 : vocab));
  work->head_rows += n;
  std::vector<TokenId> drafts(from.size(), -1);
  for (size_t i = 0; i < from.size(); ++i) {
    if (meets_threshold(guesses[i].top1_prob, from[i].threshold)) drafts[i] = guesses[i].top1;
  }
  return drafts;
}

}  // namespace helios
