#include "helios/speculative.h"

#include <algorithm>

#include "helios/sampler.h"

namespace helios {

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

}  // namespace helios
