// Self-speculative decoding: drafts from an exit head, verified by the full model in one pass.
// The engine and `helios generate` run the same rounds.
//
// Drafting at the model's depth uses its lookahead head instead (ExitHeadSet::lookahead): the pass
// that verifies a round's draft also guesses, from each row's last-layer state, the token after the
// one that row predicts; the guess following the last token taken is the next round's draft. A
// round is then one full pass over the input and at most one draft, with no draft pass at all, so
// a draft costs an LM-head product over draft_vocab rows, and the pass's second row, which on a
// memory-bound device costs little more than the first.
#pragma once

#include <functional>
#include <vector>

#include "helios/model.h"

namespace helios {

// Self-speculative decoding, one round for a batch of sequences drafting at the same exit. Each
// sequence's `input` (at `position`, not yet in the cache) and n_draft tokens proposed by the exit
// head at `draft_layer` run the blocks up to it, one token per pass; then every input of every
// sequence continues through the remaining blocks in one pass, reusing the K/V the drafts wrote.
// Each table must cover position + n_draft. A proposal whose exit confidence (top-1 probability)
// is below draft_threshold is dropped and ends the sequence's drafting, so n_draft comes back as
// the drafts made: an unsure draft would cost a pass to the exit and most likely be rejected.
struct SpeculativeSeq {
  const BlockTable* table = nullptr;
  TokenId input = 0;
  int32_t position = 0;
  int32_t n_draft = 0;           // in: at most this many drafts; out: the drafts made
  float draft_threshold = 0.0f;  // 0: always draft n_draft; >= 1: never draft
  // Drafts among the first draft_vocab token ids (ExitRule::draft_vocab; 0: all). A pass with
  // several sequences uses the widest of theirs.
  int32_t draft_vocab = 0;
  std::vector<TokenId> inputs;  // out: input, then the drafts
  int32_t first_row = 0;        // out: the verify row after inputs[0]; row first_row + i follows inputs[i]
  // Lookahead drafting (draft_layer = the model's depth). In: the draft from the previous round
  // (next_lookahead; -1: none). Any token is safe: a wrong one is rejected like any draft.
  TokenId lookahead = -1;
  // Out: per input, the lookahead head's guess for the token after the one its row verifies (-1:
  // below draft_threshold, or not a lookahead round).
  std::vector<TokenId> next_drafts;
};
struct SpeculativeWork {
  int64_t layer_rows = 0;
  int64_t head_rows = 0;
};
// `verify` gets the full model's logits after every input.
Status speculative_round(Model& model, KvCacheStorage& kv, int32_t draft_layer, std::vector<SpeculativeSeq>& seqs,
                         ForwardResult* verify, SpeculativeWork* work);

// Takes a verified round's tokens in order: `take(row, &token)` samples the verification row after
// inputs[0..i] (row first_row + i), records the token and says whether the generation goes on. A
// row stands only while every draft before it was the full model's choice, so the walk stops at
// the first token that is not the next draft (or when the generation ends). Returns the drafts
// confirmed.
using TakeVerifiedRow = std::function<bool(int32_t row, TokenId* token)>;
int32_t take_speculated(const SpeculativeSeq& seq, const TakeVerifiedRow& take);

// The next round's lookahead draft after take_speculated confirmed `accepted` drafts (the last
// row taken is the one after inputs[accepted]); -1 when there is none.
TokenId next_lookahead(const SpeculativeSeq& seq, int32_t accepted);

}  // namespace helios
