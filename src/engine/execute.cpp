// Running one step's plan: the scheduled chunks and decodes as one forward batch, and the
// self-speculative decodes as rounds grouped by draft exit; sampled tokens go back to the
// scheduler and out to each request's stream.
#include <algorithm>
#include <cmath>

#include "engine/engine_impl.h"
#include "helios/speculative.h"

namespace helios {

bool Engine::Impl::run_batch(const SchedulerOutput& out, const std::vector<size_t>& members) {
  ForwardBatch batch;
  for (size_t i : members) {
    const ScheduledSequence& s = out.seqs[i];
    const std::vector<TokenId>& tokens = *scheduler.tokens(s.id);
    const LiveRequest& r = *live[s.id];
    SequenceBatchEntry e;
    e.tokens.assign(tokens.begin() + s.start_pos, tokens.begin() + s.start_pos + s.n_tokens);
    e.start_pos = s.start_pos;
    e.blocks = kv_manager.table(s.id);
    e.logits = s.samples ? LogitsWanted::kLast : LogitsWanted::kNone;
    e.exit = r.request.exit;
    // A recompute after preemption: every generated token leaves where it left the first time.
    e.known_exit_layers = r.known_exit_layers(s.start_pos, s.n_tokens);
    e.top1_only = r.output.reads_only_top1();  // greedy: the device's top-1, no logits to the host
    if (s.samples && !e.top1_only && options.device_sampling) {
      e.draw = live[s.id]->output.device_draw(tokens, model.config().n_vocab);  // drawn there, not here
    }
    batch.seqs.push_back(std::move(e));
    // Observe mode computes the same tokens, so the whole batch runs it when one request asks.
    batch.observe_exits = batch.observe_exits || r.request.observe_exits;
  }
  auto result = model.forward(batch, kv);
  if (!result.ok()) {
    fault(result.status());
    return false;
  }
  ForwardResult& fr = *result;
  kv_fill_layers_total += fr.fill_rows;
  if (metrics) metrics->kv_fill_layers->inc(static_cast<double>(fr.fill_rows));
  for (size_t row = 0; row < fr.row_seq.size(); ++row) {
    const RequestId id = out.seqs[members[fr.row_seq[row]]].id;
    LiveRequest& r = *live[id];
    GenerationUpdate u = r.on_row(fr, row, *scheduler.tokens(id), model.tokenizer());
    u.tokens.back().loaded_layers = model.n_layers_loaded();
    scheduler.append_token(id, u.tokens.back().id);
    count_token(fr.row_exit_layer[row], fr.row_exit_layer[row]);
    if (u.intercept) {
      pause_request(id, r, std::move(u));
    } else if (u.finish != FinishReason::kNone) {
      end_request(id, std::move(u));
    } else {
      r.stream->push(std::move(u));
    }
  }
  return true;
}

bool Engine::Impl::run_speculative(const SchedulerOutput& out, int32_t draft_layer,
                                   const std::vector<size_t>& members) {
  // The scheduler granted each decode its drafts (n_lookahead) within the step's token budget
  // and reserved their KV blocks.
  std::vector<SpeculativeSeq> round;
  for (size_t i : members) {
    const ScheduledSequence& s = out.seqs[i];
    SpeculativeSeq seq;
    seq.table = kv_manager.table(s.id);
    seq.input = (*scheduler.tokens(s.id))[s.start_pos];
    seq.position = s.start_pos;
    seq.n_draft = s.n_lookahead;
    seq.draft_threshold = live[s.id]->request.exit.threshold_at(draft_layer);
    seq.draft_vocab = live[s.id]->request.exit.draft_vocab;
    seq.lookahead = live[s.id]->lookahead_draft;
    round.push_back(std::move(seq));
  }
  ForwardResult fr;
  SpeculativeWork work;
  if (Status st = speculative_round(model, kv, draft_layer, round, &fr, &work); !st.ok()) {
    fault(st);
    return false;
  }
  // Drafting with the lookahead head: the next drafts of the requests that go on, from their rows taken last.
  const bool drafts_ahead = draft_layer == model.n_layers_loaded();
  std::vector<RequestId> ahead_ids;
  std::vector<LookaheadFrom> ahead_from;
  for (size_t j = 0; j < members.size(); ++j) {
    const RequestId id = out.seqs[members[j]].id;
    const SpeculativeSeq& seq = round[j];
    LiveRequest& r = *live[id];
    std::vector<TokenId> history = *scheduler.tokens(id);
    std::vector<TokenId> emitted;
    GenerationUpdate merged;
    const int32_t accepted = take_speculated(seq, [&](int32_t row, TokenId* token) {
      GenerationUpdate u = r.on_row(fr, row, history, model.tokenizer());
      u.tokens.back().loaded_layers = model.n_layers_loaded();
      *token = u.tokens.back().id;
      history.push_back(*token);
      emitted.push_back(*token);
      u.tokens.insert(u.tokens.begin(), merged.tokens.begin(), merged.tokens.end());
      merged = std::move(u);
      return merged.finish == FinishReason::kNone && !merged.intercept;  // a pause ends the round too
    });
    scheduler.append_speculated(id, emitted);
    if (drafts_ahead && merged.finish == FinishReason::kNone && !merged.intercept) {
      ahead_ids.push_back(id);
      ahead_from.push_back({seq.first_row + accepted, emitted.back(), seq.draft_threshold, seq.draft_vocab});
    }
    // Every drafted input ran the whole stack once: draft blocks, then verify blocks.
    const double layers_each = static_cast<double>(seq.n_draft + 1) * model.n_layers_loaded() / emitted.size();
    for (const TokenEvent& ev : merged.tokens) count_token(ev.exit_layer, layers_each);
    drafted_total += seq.n_draft;
    accepted_total += accepted;
    if (metrics) {
      metrics->draft_tokens->inc(seq.n_draft);
      metrics->accepted_tokens->inc(accepted);
    }
    if (merged.intercept) {
      pause_request(id, r, std::move(merged));
    } else if (merged.finish != FinishReason::kNone) {
      end_request(id, std::move(merged));
    } else {
      r.stream->push(std::move(merged));
    }
  }
  if (!ahead_from.empty()) {
    auto next = lookahead_drafts(model, fr, ahead_from, &work);
    if (!next.ok()) {
      fault(next.status());
      return false;
    }
    for (size_t k = 0; k < ahead_ids.size(); ++k) live[ahead_ids[k]]->lookahead_draft = (*next)[k];
  }
  return true;
}

void Engine::Impl::count_token(int32_t exit_layer, double layers_computed) {
  ++generated_total;
  if (exit_layer >= 0 && exit_layer < static_cast<int32_t>(exit_layer_counts.size())) ++exit_layer_counts[exit_layer];
  layers_computed_total += static_cast<int64_t>(std::lround(layers_computed));
  if (metrics) {
    metrics->generated_tokens->inc();
    metrics->exit_layer->observe(exit_layer);
    metrics->layers_per_token->observe(layers_computed);
  }
}

}  // namespace helios
