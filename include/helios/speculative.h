// Self-speculative decoding: drafts from an exit head, verified by the full model in one pass.
// The engine and `helios generate` run the same rounds.
//
// Drafting at the model's depth uses its lookahead head instead (ExitHeadSet::lookahead): after a
// round, the head reads the last-layer state of the last row taken and the token taken from it, and
// guesses the token after that one: the next round's draft. A round is then one full pass over the
// input and at most one draft, with no draft pass at all, so a draft costs the head (an LM-head
// product over draft_vocab rows) and the pass's second row, which on a memory-bound device costs
// little more than the first.
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
  // Lookahead drafting (draft_layer = the model's depth): the draft from the previous round
  // (lookahead_drafts; -1: none). Any token is safe: a wrong one is rejected like any draft.
  TokenId lookahead = -1;
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

// After a lookahead round and take_speculated: each sequence's next draft, the lookahead head on
// the verify row taken last (seq.first_row + the drafts confirmed) and the token taken from it. -1
// where the head's top-1 probability is below the threshold.
struct LookaheadFrom {
  int32_t row = 0;         // a verify row
  TokenId token = 0;       // the token taken from it (the next input)
  float threshold = 0.0f;  // SpeculativeSeq::draft_threshold
  int32_t vocab = 0;       // SpeculativeSeq::draft_vocab; the head runs over the widest of them
};
StatusOr<std::vector<TokenId>> lookahead_drafts(const Model& model, const ForwardResult& verify,
                                                const std::vector<LookaheadFrom>& from, SpeculativeWork* work);

}  // namespace helios
