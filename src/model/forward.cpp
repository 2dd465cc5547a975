// The forward pass, top to bottom, in four stages:
//   plan the batch    flatten the entries into per-token arrays, resolve each entry's exit rule
//   run a block       rmsnorm, qkv, rope, KV write, paged attention, o-proj, residual, rmsnorm,
//                     SwiGLU MLP, residual
//   check exits       at an exit point: confidence of the rows that may leave, the decision
//                     (early_exit/policy.cpp, a pure function), the leaving rows' logits
//   final heads       the rows still running take the head of the last block computed
//
// Early exit keeps two sets of tokens. Active tokens run the whole block. A token that left at an
// exit keeps its hidden state h_k, and every deeper block computes its K/V from h_k (state
// propagation) in the same projection as the active tokens', so tokens that go deeper later —
// and later tokens of the same chunk — attend to every position.
#include <algorithm>
#include <cmath>
#include <limits>

#include "helios/model.h"

namespace helios {

constexpr size_t kBlockTableStep = 16;  // blocks: 256 tokens at the default block size

// The model's rotation, with Llama 3's per-pair divisors where the file has them (backend memory).
static kernels::RopeParams rope_params(const ModelConfig& c, const float* freq_factors) {
  kernels::RopeParams r;
  r.n_rot = c.n_rot;
  r.freq_base = c.rope_freq_base;
  r.freq_scale = c.rope_freq_scale;
  r.freq_factors = freq_factors;
  r.interleaved = c.rope_layout == RopeLayout::kInterleaved;
  r.ext_factor = c.rope_yarn_ext_factor;
  r.corr_low = c.rope_yarn_low;
  r.corr_high = c.rope_yarn_high;
  r.mscale = c.rope_mscale;
  return r;
}

// Activation buffers, grown to the largest batch seen so far (backend memory), plus the host
// arrays that describe the batch to the kernels.
struct Model::Workspace {
  int32_t capacity_tokens = 0;
  Buffer x, x_spare, exited, prev, xb, q, k, v, attn, proj, gate, up, head_in, head_tmp, logits;
  std::vector<int32_t> tokens, positions, slots, token_seq, block_tables, token_row, known_exit;

  Status reserve(Backend& b, const ModelConfig& c, int32_t n_tokens) {
    if (n_tokens <= capacity_tokens) return ok_status();
    const size_t n = static_cast<size_t>(n_tokens);
    x = Buffer(&b, n * c.n_embd);          // [n_active, n_embd] residual stream of active tokens
    x_spare = Buffer(&b, n * c.n_embd);    // x compacted when tokens leave
    exited = Buffer(&b, n * c.n_embd);     // [n_exited, n_embd] exit states whose K/V is filled
    prev = Buffer(&b, n * c.n_embd);       // x before an exit layer (saturation)
    xb = Buffer(&b, n * c.n_embd);         // [n_active + n_exited, n_embd] normed sublayer input
    q = Buffer(&b, n * c.q_dim());         // [n_active, n_head, head_dim]
    k = Buffer(&b, n * c.kv_dim());        // [n_active + n_exited, n_head_kv, head_dim]
    v = Buffer(&b, n * c.kv_dim());
    attn = Buffer(&b, n * c.q_dim());      // [n_active, n_head, head_dim]
    proj = Buffer(&b, n * c.n_embd);       // [n_active, n_embd] sublayer output
    gate = Buffer(&b, n * c.n_ff);         // [n_active, n_ff]
    up = Buffer(&b, n * c.n_ff);
    head_in = Buffer(&b, n * c.n_embd);    // [n_rows, n_embd] rows going through a head
    head_tmp = Buffer(&b, n * c.n_embd);
    logits = Buffer(&b, n * c.n_vocab);    // [n_rows, n_vocab]
    for (const Buffer* buf : {&x, &x_spare, &exited, &prev, &xb, &q, &k, &v, &attn, &proj, &gate, &up, &head_in,
                              &head_tmp, &logits}) {
      if (buf->empty()) {
        capacity_tokens = 0;
        return resource_exhausted("no " + b.name() + " memory for the activations of a " +
                                  std::to_string(n_tokens) + "-token batch");
      }
    }
    capacity_tokens = n_tokens;
    return ok_status();
  }
};

// One pass's state: the batch's rules, which tokens are active and which left (with the data
// their K/V fill needs), in buffer order, and the result being filled.
struct Model::Pass {
  Pass(const ForwardBatch& b, KvCacheStorage& k) : batch(b), kv(k) {}
  const ForwardBatch& batch;
  KvCacheStorage& kv;
  ForwardResult result;
  std::vector<ExitRule> rules;        // per entry, resolved
  int32_t end_layer = 0;              // blocks this pass runs to
  int32_t max_blocks = 1;             // block-table stride
  bool checks_exits = false;          // some logit row may leave at an exit point
  bool saturation = false;            // some rule measures cos(h_k, h_{k-1})
  bool replays = false;               // some token leaves at a known layer
  std::vector<int32_t> active;        // flat token index of each row of ws.x
  std::vector<int32_t> exited;        // flat token index of each row of ws.exited
  std::vector<int32_t> a_pos, a_seq;  // per active row: position, sequence (the attention plan)
  std::vector<int32_t> kv_pos, kv_slot;  // active rows, then exited rows

  const ExitRule& rule(const Workspace& ws, int32_t token) const { return rules[ws.token_seq[token]]; }

  void rebuild(const Workspace& ws) {
    a_pos.clear(); a_seq.clear(); kv_pos.clear(); kv_slot.clear();
    for (int32_t t : active) {
      a_pos.push_back(ws.positions[t]);
      a_seq.push_back(ws.token_seq[t]);
      kv_pos.push_back(ws.positions[t]);
      kv_slot.push_back(ws.slots[t]);
    }
    for (int32_t t : exited) {
      kv_pos.push_back(ws.positions[t]);
      kv_slot.push_back(ws.slots[t]);
    }
  }
};


Status Model::reserve_own_workspace(int32_t n_tokens) {
  if (!ws_) ws_ = std::make_shared<Workspace>();
  HELIOS_RETURN_IF_ERROR(ws_->reserve(backend_, config_, n_tokens));
  PassShape pass{n_tokens, {weights_.output.view}, config_.n_head, config_.head_dim, config_.n_vocab};
  for (const LayerWeights& l : weights_.layers) {
    for (const Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) pass.matrices.push_back(m->view);
  }
  return backend_.reserve_scratch(pass);
}

void Model::head_logits(const float* states, const std::vector<int32_t>& rows, int32_t layer, int32_t vocab) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const auto n = static_cast<int32_t>(rows.size());
  backend_.embedding(rows.data(), n, states, c.n_embd, ws.head_in.data());  // gather
  const ExitHead* head = layer < static_cast<int32_t>(exit_heads_.size()) ? exit_heads_[layer].get() : nullptr;
  const bool fitted = head && layer < c.n_layer;
  const bool adapted = fitted && head->adapter.view.data;
  apply_exit_head(ws.head_in.data(), n, adapted ? &head->adapter.view : nullptr, adapted ? head->bias.data() : nullptr,
                  fitted ? head->mlp.get() : nullptr, ws.head_tmp.data(), ws.logits.data(), vocab);
}

void Model::apply_exit_head(float* rows, int32_t n, const WeightMatrix* adapter, const float* bias, ExitMlp* mlp,
                            float* scratch, float* logits, int32_t vocab) const {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  float* in = rows;
  if (adapter) {
    be.matmul(rows, *adapter, n, scratch);
    be.add_rows(scratch, bias, n, c.n_embd);
    in = scratch;
  }
  // a += down(silu(gate(n)) * up(n)), n = a / rms(a); ExitMlp::kRows rows at a time, in its own buffer.
  for (int32_t r0 = 0; mlp && r0 < n; r0 += ExitMlp::kRows) {
    const int32_t m = std::min(ExitMlp::kRows, n - r0);
    float* a = in + static_cast<int64_t>(r0) * c.n_embd;
    float* normed = mlp->work.data();                              // [m, n_embd], then the MLP's output
    float* gate = normed + static_cast<int64_t>(m) * c.n_embd;     // [m, hidden]
    float* up = gate + static_cast<int64_t>(m) * mlp->hidden;      // [m, hidden]
    be.rmsnorm(a, mlp->ones.data(), m, c.n_embd, c.rms_eps, normed);
    be.matmul(normed, mlp->gate.view, m, gate);
    be.matmul(normed, mlp->up.view, m, up);
    be.swiglu(gate, up, static_cast<int64_t>(m) * mlp->hidden, gate);
    be.matmul(gate, mlp->down.view, m, normed);
    be.add(a, normed, static_cast<int64_t>(m) * c.n_embd);
  }
  be.rmsnorm(in, weights_.output_norm.data(), n, c.n_embd, c.rms_eps, rows);
  lm_head(rows, n, logits, vocab);
}

void Model::lm_head(const float* rows, int32_t n, float* logits, int32_t vocab) const {
  WeightMatrix head = weights_.output.view;
  if (!comm_) {
    if (vocab > 0) head.n_out = vocab;  // the first rows: every layout keeps rows in order, 64 at a time
    backend_.matmul(rows, head, n, logits);
    return;
  }
  // This rank's rows [vocab0, vocab1) of the head, cut at `vocab` (a multiple of 64, as vocab0 is),
  // then every rank's columns gathered into [n, width].
  const int32_t width = vocab > 0 ? vocab : config_.n_vocab;
  const int32_t mine = std::max(0, std::min(shard_.vocab1, width) - shard_.vocab0);
  const size_t need = static_cast<size_t>(n) * std::max(mine, 1);
  if (head_shard_floats_ < need) {
    head_shard_ = Buffer(&backend_, need);
    head_shard_floats_ = head_shard_.empty() ? 0 : need;
  }
  if (mine > 0 && head_shard_floats_ >= need) {
    head.n_out = mine;
    backend_.matmul(rows, head, n, head_shard_.data());
  }
  comm_->all_gather_columns(head_shard_.data(), n, mine, shard_.vocab0, logits, width);
}

void Model::all_reduce(float* data, size_t n) const {
  if (comm_) comm_->all_reduce_sum(data, n);
}

// ---- Helpers over the workspace -------------------------------------------------------------

void Model::download_rows(const float* states, const std::vector<int32_t>& rows, float* host) {
  if (rows.empty()) return;
  Workspace& ws = *ws_;
  backend_.embedding(rows.data(), static_cast<int32_t>(rows.size()), states, config_.n_embd, ws.head_tmp.data());
  backend_.download(host, ws.head_tmp.data(), rows.size() * config_.n_embd);
}

std::vector<ConfidenceStats> Model::logit_stats(int32_t n_rows, int32_t vocab, Draws* draws) {
  std::vector<int32_t> top1(n_rows);
  std::vector<float> p1(n_rows), margin(n_rows), entropy(n_rows);
  const int32_t width = vocab > 0 ? vocab : config_.n_vocab;
  if (draws && !draws->rows.empty() && width == config_.n_vocab) {
    const auto n = static_cast<int32_t>(draws->rows.size());
    draws->token.assign(n, -1);
    draws->logprob.assign(n, 0.0f);
    backend_.exit_stats_and_sample(ws_->logits.data(), n_rows, width, top1.data(), p1.data(), margin.data(),
                                   entropy.data(), draws->rows.data(), n, draws->adjust.data(),
                                   static_cast<int32_t>(draws->adjust.size()), draws->token.data(),
                                   draws->logprob.data());
  } else {
    backend_.exit_stats(ws_->logits.data(), n_rows, width, top1.data(), p1.data(), margin.data(), entropy.data());
  }
  std::vector<ConfidenceStats> out(n_rows);
  for (int32_t i = 0; i < n_rows; ++i) out[i] = {top1[i], p1[i], margin[i], entropy[i]};
  return out;
}

Model::Draws Model::plan_draws(const Pass& p, const std::vector<KeptRow>& kept) const {
  Draws d;
  for (const KeptRow& k : kept) {
    const SequenceBatchEntry& e = p.batch.seqs[p.result.row_seq[k.result_row]];
    if (!e.draw) continue;
    kernels::SampleRow row = e.draw->row;
    row.logits_row = k.logits_row;
    row.adjust_begin = static_cast<int32_t>(d.adjust.size());
    d.adjust.insert(d.adjust.end(), e.draw->adjust.begin(), e.draw->adjust.end());
    row.adjust_end = static_cast<int32_t>(d.adjust.size());
    d.rows.push_back(row);
    d.result_rows.push_back(k.result_row);
  }
  return d;
}

void Model::keep_logits(Pass& p, const std::vector<KeptRow>& kept, int32_t vocab, Draws* drawn) {
  const int32_t n_vocab = config_.n_vocab, width = vocab > 0 ? vocab : n_vocab;
  Draws here;
  if (!drawn || drawn->token.size() != drawn->rows.size()) {
    here = plan_draws(p, kept);
    const auto n = static_cast<int32_t>(here.rows.size());
    here.token.assign(n, -1);
    here.logprob.assign(n, 0.0f);
    if (n > 0) {
      backend_.sample_rows(ws_->logits.data(), n_vocab, here.rows.data(), n, here.adjust.data(),
                           static_cast<int32_t>(here.adjust.size()), here.token.data(), here.logprob.data());
    }
    drawn = &here;
  }
  for (size_t i = 0; i < drawn->rows.size(); ++i) {
    p.result.row_token[drawn->result_rows[i]] = drawn->token[i];
    p.result.row_token_logprob[drawn->result_rows[i]] = drawn->logprob[i];
  }
  std::vector<KeptRow> download;
  for (const KeptRow& k : kept) {
    p.result.row_top1[k.result_row] = k.stats.top1;
    p.result.row_top1_prob[k.result_row] = k.stats.top1_prob;
    const SequenceBatchEntry& e = p.batch.seqs[p.result.row_seq[k.result_row]];
    if (!e.draw && !e.top1_only) download.push_back(k);  // a draw: its token; top1_only: the statistics alone
  }
  // Rows consecutive in both the workspace and the result (a batch's rows at full depth, in
  // order) come down in one copy: one wait for the device instead of one per row.
  for (size_t i = 0; i < download.size();) {
    size_t n = 1;
    while (width == n_vocab && i + n < download.size() &&
           download[i + n].logits_row == download[i].logits_row + static_cast<int32_t>(n) &&
           download[i + n].result_row == download[i].result_row + static_cast<int32_t>(n)) {
      ++n;
    }
    float* out = p.result.logits.data() + static_cast<size_t>(download[i].result_row) * n_vocab;
    backend_.download(out, ws_->logits.data() + static_cast<size_t>(download[i].logits_row) * width, n * width);
    if (width < n_vocab) std::fill(out + width, out + n_vocab, ForwardBatch::kLogitOff);
    i += n;
  }
}

// ---- The pass -------------------------------------------------------------------------------

// Every sequence feeds one token: the shape that repeats from step to step.
static bool is_decode_step(const ForwardBatch& batch) {
  if (batch.seqs.empty() || batch.hidden_in || batch.return_hidden) return false;
  for (const SequenceBatchEntry& e : batch.seqs) {
    if (e.tokens.size() != 1) return false;
  }
  return true;
}

StatusOr<ForwardResult> Model::forward_rank(const ForwardBatch& batch, KvCacheStorage& kv) {
  HELIOS_RETURN_IF_ERROR(validate(batch, kv));
  HELIOS_RETURN_IF_ERROR(check_partial_pass(batch));
  HELIOS_RETURN_IF_ERROR(backend_.error());  // a faulted device never produces tokens
  Pass p(batch, kv);
  HELIOS_RETURN_IF_ERROR(plan_batch(p));
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const auto n = static_cast<int32_t>(ws.tokens.size());
  // A decode step makes the launches the last one made: the backend may replay each stretch of
  // them between reads of their results (an exit point's statistics, the heads') as one graph.
  // begin_graph() while a stretch records changes nothing.
  const bool graphed = !comm_ && is_decode_step(batch);
  if (graphed) backend_.begin_graph();

  // --- embed (or start from given states)
  if (batch.hidden_in) {
    backend_.upload(ws.x.data(), batch.hidden_in, static_cast<size_t>(n) * c.n_embd);
  } else {
    backend_.embedding_rows(ws.tokens.data(), n, weights_.tok_embd.view, ws.x.data());
  }

  for (int32_t l = batch.first_layer; l < p.end_layer; ++l) {
    if (p.active.empty() && p.exited.empty()) break;
    if (graphed) backend_.begin_graph();  // again after an exit point's read
    const int32_t layer_no = l + 1;  // blocks done after this one
    const bool exit_here = p.checks_exits && layer_no < p.end_layer && is_exit_point(layer_no);
    if (exit_here && p.saturation) save_states_before_block(p);
    run_block(p, l);
    if (p.active.empty()) continue;
    capture_states(p, layer_no);
    if (p.replays) leave_at_known_layers(p, layer_no);
    if (batch.observe_exits && layer_no < p.end_layer && is_exit_point(layer_no)) observe_exits(p, layer_no);
    if (exit_here) check_exits(p, layer_no);
  }
  if (graphed) backend_.begin_graph();
  final_heads(p);
  if (graphed) backend_.end_graph();
  HELIOS_RETURN_IF_ERROR(backend_.error());  // the logits of a failed call are garbage
  return std::move(p.result);
}

Status Model::plan_batch(Pass& p) {
  const ForwardBatch& batch = p.batch;
  const ModelConfig& c = config_;
  if (!ws_) ws_ = std::make_shared<Workspace>();
  Workspace& ws = *ws_;
  ws.tokens.clear(); ws.positions.clear(); ws.slots.clear(); ws.token_seq.clear(); ws.token_row.clear();
  ws.known_exit.clear();
  ForwardResult& result = p.result;
  result.n_vocab = c.n_vocab;
  size_t max_blocks = 1;
  for (const auto& e : batch.seqs) max_blocks = std::max(max_blocks, e.blocks->block_ids.size());
  // The table's stride grows in steps of kBlockTableStep, so that a decode's launches (which name
  // it) stay the same while its sequences grow; the padding is never read.
  max_blocks = (max_blocks + kBlockTableStep - 1) / kBlockTableStep * kBlockTableStep;
  p.max_blocks = static_cast<int32_t>(max_blocks);
  ws.block_tables.assign(batch.seqs.size() * max_blocks, 0);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const auto& e = batch.seqs[s];
    std::copy(e.blocks->block_ids.begin(), e.blocks->block_ids.end(), ws.block_tables.begin() + s * max_blocks);
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      const int32_t pos = e.start_pos + static_cast<int32_t>(i);
      const bool wants = e.logits == LogitsWanted::kAll || (e.logits == LogitsWanted::kLast && i + 1 == e.tokens.size());
      ws.token_row.push_back(wants ? static_cast<int32_t>(result.row_seq.size()) : -1);
      if (wants) {
        result.row_seq.push_back(static_cast<int32_t>(s));
        result.row_pos.push_back(pos);
      }
      ws.tokens.push_back(e.tokens[i]);
      ws.positions.push_back(pos);
      ws.slots.push_back(e.blocks->slot(pos, p.kv.block_size()));
      ws.token_seq.push_back(static_cast<int32_t>(s));
      const int32_t known = !wants && i < e.known_exit_layers.size() ? e.known_exit_layers[i] : 0;
      ws.known_exit.push_back(known);
      p.replays = p.replays || known > 0;
    }
    p.rules.push_back(resolve_exit_rule(e.exit));
    const ExitPolicyTraits& t = exit_policy_traits(p.rules.back().policy);
    if (e.logits != LogitsWanted::kNone && (t.leaves_when_confident || t.leaves_at_depth)) p.checks_exits = true;
    if (e.logits != LogitsWanted::kNone && t.leaves_when_confident &&
        p.rules.back().measure == ConfidenceMeasure::kSaturation) {
      p.saturation = true;
    }
  }
  const auto n = static_cast<int32_t>(ws.tokens.size());
  const auto n_rows = static_cast<int32_t>(result.row_seq.size());
  HELIOS_RETURN_IF_ERROR(ws.reserve(backend_, c, n));
  result.logits.resize(static_cast<size_t>(n_rows) * c.n_vocab);
  result.row_exit_layer.assign(n_rows, 0);
  result.row_confidence.assign(n_rows, 0.0f);
  result.row_top1.assign(n_rows, 0);
  result.row_top1_prob.assign(n_rows, 0.0f);
  result.row_token.assign(n_rows, -1);
  result.row_token_logprob.assign(n_rows, 0.0f);
  if (batch.return_hidden) result.hidden.assign(static_cast<size_t>(n) * c.n_embd, 0.0f);
  result.captured.assign(batch.capture_layers.size(), std::vector<float>(static_cast<size_t>(n_rows) * c.n_embd));
  p.end_layer = batch.last_layer > 0 ? batch.last_layer : n_layers_loaded();
  for (int32_t t = 0; t < n; ++t) p.active.push_back(t);
  p.rebuild(ws);
  return ok_status();
}

void Model::save_states_before_block(Pass& p) {
  const auto na = static_cast<int32_t>(p.active.size());
  std::vector<int32_t> all(na);
  for (int32_t i = 0; i < na; ++i) all[i] = i;
  backend_.embedding(all.data(), na, ws_->x.data(), config_.n_embd, ws_->prev.data());
}

void Model::run_block(Pass& p, int32_t l) {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  Workspace& ws = *ws_;
  const auto na = static_cast<int32_t>(p.active.size());
  const auto nf = static_cast<int32_t>(p.exited.size());
  const LayerWeights& w = weights_.layers[l];
  const kernels::PagedKV cache = p.kv.layer(l);
  const kernels::AttentionPlan plan{na, p.a_seq.data(), p.a_pos.data(), ws.block_tables.data(), p.max_blocks};
  const int32_t nk = na + nf;
  float* xb_fill = ws.xb.data() + static_cast<int64_t>(na) * c.n_embd;
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // attention: norm → q, k, v → rope → cache → paged attention → output projection → residual.
  // Exited tokens join the K/V projection only: their K/V for this layer comes from h_exit.
  if (nf > 0) be.rmsnorm(ws.exited.data(), w.attn_norm.data(), nf, c.n_embd, c.rms_eps, xb_fill);
  be.norm_matmuls(ws.x.data(), nullptr, w.attn_norm.data(), na, c.n_embd, c.rms_eps, ws.xb.data(),
                  {{&w.wq.view, na, ws.q.data(), w.bq.data()},  // biases: qwen2's, else null
                   {&w.wk.view, nk, ws.k.data(), w.bk.data()},
                   {&w.wv.view, nk, ws.v.data(), w.bv.data()}});
  const kernels::RopeParams rope = rope_params(c, weights_.rope_freqs.empty() ? nullptr : weights_.rope_freqs.data());
  be.rope_kv_write(ws.q.data(), p.a_pos.data(), na, c.n_head, ws.k.data(), ws.v.data(), p.kv_pos.data(),
                   p.kv_slot.data(), nk, rope, cache);
  p.result.layer_rows += na;
  p.result.fill_rows += nf;
  if (na == 0) return;
  be.paged_attention(ws.q.data(), cache, plan, c.n_head, attn_scale, ws.attn.data());
  be.matmul(ws.attn.data(), w.wo.view, na, ws.proj.data());
  all_reduce(ws.proj.data(), static_cast<size_t>(na) * c.n_embd);  // row-parallel O: partial sums

  // feed-forward: (residual, norm) → silu(gate) * up → down projection → residual. The projection
  // adds itself to the residual, unless it is row-parallel: then its partial sums are summed first.
  be.norm_matmuls(ws.x.data(), ws.proj.data(), w.ffn_norm.data(), na, c.n_embd, c.rms_eps, ws.xb.data(),
                  {{&w.w_gate.view, na, ws.gate.data()}, {&w.w_up.view, na, ws.up.data()}});
  be.swiglu_matmul(ws.gate.data(), ws.up.data(), na, ws.gate.data(), w.w_down.view, ws.proj.data(),
                   comm_ ? nullptr : ws.x.data());
  if (comm_) {
    all_reduce(ws.proj.data(), static_cast<size_t>(na) * c.n_embd);
    be.add(ws.x.data(), ws.proj.data(), static_cast<int64_t>(na) * c.n_embd);
  }
}

void Model::capture_states(Pass& p, int32_t layer_no) {
  const int32_t n_embd = config_.n_embd;
  Workspace& ws = *ws_;
  for (size_t i = 0; i < p.batch.capture_layers.size(); ++i) {
    if (p.batch.capture_layers[i] != layer_no) continue;
    std::vector<int32_t> rows, row_ids;
    for (size_t a = 0; a < p.active.size(); ++a) {
      if (ws.token_row[p.active[a]] >= 0) {
        rows.push_back(static_cast<int32_t>(a));
        row_ids.push_back(ws.token_row[p.active[a]]);
      }
    }
    std::vector<float> host(rows.size() * n_embd);
    download_rows(ws.x.data(), rows, host.data());
    for (size_t j = 0; j < rows.size(); ++j) {
      std::copy_n(host.data() + j * n_embd, n_embd, p.result.captured[i].data() + static_cast<size_t>(row_ids[j]) * n_embd);
    }
  }
}

void Model::observe_exits(Pass& p, int32_t layer_no) {
  Workspace& ws = *ws_;
  std::vector<int32_t> rows, row_ids;
  for (size_t a = 0; a < p.active.size(); ++a) {
    if (ws.token_row[p.active[a]] >= 0) {
      rows.push_back(static_cast<int32_t>(a));
      row_ids.push_back(ws.token_row[p.active[a]]);
    }
  }
  p.result.observed_layers.push_back(layer_no);
  auto& seen = p.result.observed.emplace_back(p.result.row_seq.size());
  if (rows.empty()) return;
  head_logits(ws.x.data(), rows, layer_no);
  const std::vector<ConfidenceStats> stats = logit_stats(static_cast<int32_t>(rows.size()));
  p.result.head_rows += static_cast<int64_t>(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) seen[row_ids[j]] = {stats[j].top1, stats[j].top1_prob};
}

void Model::leave_at_known_layers(Pass& p, int32_t layer_no) {
  // Tokens recomputed after a preemption leave where they left the first time, so their K/V at
  // every layer is what it was (filled from the exit state where the rule fills).
  std::vector<uint8_t> leaves(p.active.size(), 0);
  bool any = false;
  for (size_t a = 0; a < p.active.size(); ++a) {
    leaves[a] = ws_->known_exit[p.active[a]] == layer_no;
    any = any || leaves[a];
  }
  if (any) remove_leaving(p, leaves, layer_no, /*replayed=*/true);
}

void Model::check_exits(Pass& p, int32_t layer_no) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  const auto na = static_cast<int32_t>(p.active.size());

  // The active logit rows, and the checks each needs here.
  std::vector<int32_t> rows;   // indices into active
  std::vector<ExitRow> decision;
  std::vector<int32_t> head_rows, cheap_rows;  // indices into rows: softmax (or forced) vs cheap checks
  for (int32_t a = 0; a < na; ++a) {
    const int32_t t = p.active[a];
    if (ws.token_row[t] < 0) continue;
    const ExitRule& r = p.rule(ws, t);
    const ExitCheck check = exit_check_at(r, layer_no);
    const auto i = static_cast<int32_t>(rows.size());
    rows.push_back(a);
    decision.push_back({&r, 0.0f});
    if (check == ExitCheck::kNone) continue;
    // A forced exit needs its logits whatever the measure; a cheap measure is read from h_k.
    if (check == ExitCheck::kForced || !is_cheap_measure(r.measure)) head_rows.push_back(i);
    if (is_cheap_measure(r.measure)) cheap_rows.push_back(i);
  }
  if (head_rows.empty() && cheap_rows.empty()) return;

  // Confidence: softmax measures (and forced exits) from the exit head's logits, which the
  // leaving rows then keep; cheap signals from h_k on the host.
  std::vector<int32_t> logits_index(rows.size(), -1);  // row of ws.logits, where computed
  std::vector<ConfidenceStats> stats;
  if (!head_rows.empty()) {
    std::vector<int32_t> states;
    for (int32_t i : head_rows) states.push_back(rows[i]);
    head_logits(ws.x.data(), states, layer_no);
    stats = logit_stats(static_cast<int32_t>(states.size()));
    p.result.head_rows += static_cast<int64_t>(states.size());
    for (size_t j = 0; j < head_rows.size(); ++j) {
      const int32_t i = head_rows[j];
      logits_index[i] = static_cast<int32_t>(j);
      const ConfidenceMeasure m = decision[i].rule->measure;
      if (m == ConfidenceMeasure::kAgreement && exit_heads_[layer_no]) {
        decision[i].confidence = agreement_confidence(exit_heads_[layer_no]->params, stats[j].top1_prob);
      } else if (!is_cheap_measure(m)) {
        decision[i].confidence = confidence_value(stats[j], m, c.n_vocab);
      }
    }
  }
  if (!cheap_rows.empty()) {
    std::vector<int32_t> states;
    for (int32_t i : cheap_rows) states.push_back(rows[i]);
    std::vector<float> h_now(states.size() * c.n_embd), h_prev;
    download_rows(ws.x.data(), states, h_now.data());
    if (p.saturation) {
      h_prev.resize(h_now.size());
      download_rows(ws.prev.data(), states, h_prev.data());
    }
    const ExitHead* head = exit_heads_[layer_no].get();
    for (size_t j = 0; j < cheap_rows.size(); ++j) {
      ExitRow& d = decision[cheap_rows[j]];
      const float* h = h_now.data() + j * c.n_embd;
      if (d.rule->measure == ConfidenceMeasure::kProbe) {
        d.confidence = head ? probe_score(head->params, h, c.n_embd) : 0.0f;
      } else {
        d.confidence = h_prev.empty() ? 0.0f : cosine_similarity(h, h_prev.data() + j * c.n_embd, c.n_embd);
      }
    }
  }

  const std::vector<uint8_t> leaving = decide_exits(layer_no, decision);
  std::vector<int32_t> need_head;  // leaving by a cheap signal: their head runs only now
  std::vector<uint8_t> leaves(na, 0);
  std::vector<KeptRow> kept;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!leaving[i]) continue;
    const int32_t row = ws.token_row[p.active[rows[i]]];
    if (logits_index[i] >= 0) {
      kept.push_back({logits_index[i], row, stats[logits_index[i]]});
    } else {
      need_head.push_back(rows[i]);
    }
    p.result.row_exit_layer[row] = layer_no;
    p.result.row_confidence[row] = decision[i].confidence;
    leaves[rows[i]] = 1;
  }
  keep_logits(p, kept);
  if (!need_head.empty()) {
    head_logits(ws.x.data(), need_head, layer_no);
    kept.clear();
    for (size_t j = 0; j < need_head.size(); ++j) kept.push_back({static_cast<int32_t>(j), ws.token_row[p.active[need_head[j]]], {}});
    Draws draws = plan_draws(p, kept);  // these all leave: drawn with their statistics
    const std::vector<ConfidenceStats> head_stats = logit_stats(static_cast<int32_t>(need_head.size()), 0, &draws);
    p.result.head_rows += static_cast<int64_t>(need_head.size());
    for (size_t j = 0; j < need_head.size(); ++j) kept[j].stats = head_stats[j];
    keep_logits(p, kept, 0, &draws);
  }
  if (std::find(leaves.begin(), leaves.end(), 1) != leaves.end()) remove_leaving(p, leaves, layer_no, false);
}

// Whether a token of a sequence under `rule` that leaves after layer_no blocks needs K/V at the
// deeper layers (filled from its exit state): its policy fills them, or it is replayed and later
// tokens of its sequence may go deeper than it did — as after the model was extended, where a
// token that left at the old loaded depth now has blocks below it. Only a fixed-depth sequence
// whose depth is this layer or shallower never reads deeper.
static bool needs_deeper_kv(const ExitRule& rule, int32_t layer_no, bool replayed) {
  const ExitPolicyTraits& t = exit_policy_traits(rule.policy);
  if (t.fills_deeper_kv) return true;
  return replayed && !(t.leaves_at_depth && rule.depth <= layer_no);
}

void Model::remove_leaving(Pass& p, const std::vector<uint8_t>& leaves, int32_t layer_no, bool replayed) {
  // The leaving rows' states join the exited set (for the K/V fill) unless nothing deeper will
  // ever read their sequence; the rest are compacted into a fresh x.
  const int32_t n_embd = config_.n_embd;
  Workspace& ws = *ws_;
  std::vector<int32_t> fill, keep, still_active;
  for (size_t a = 0; a < p.active.size(); ++a) {
    const int32_t t = p.active[a];
    if (!leaves[a]) {
      keep.push_back(static_cast<int32_t>(a));
      still_active.push_back(t);
      continue;
    }
    if (layer_no < p.end_layer && needs_deeper_kv(p.rule(ws, t), layer_no, replayed)) {
      fill.push_back(static_cast<int32_t>(a));
    }
    if (p.batch.return_hidden) {
      download_rows(ws.x.data(), {static_cast<int32_t>(a)}, p.result.hidden.data() + static_cast<size_t>(t) * n_embd);
    }
  }
  if (!fill.empty()) {
    backend_.embedding(fill.data(), static_cast<int32_t>(fill.size()), ws.x.data(), n_embd,
                       ws.exited.data() + p.exited.size() * static_cast<size_t>(n_embd));
    for (int32_t a : fill) p.exited.push_back(p.active[a]);
  }
  if (!keep.empty()) {
    backend_.embedding(keep.data(), static_cast<int32_t>(keep.size()), ws.x.data(), n_embd, ws.x_spare.data());
    std::swap(ws.x, ws.x_spare);
  }
  p.active = std::move(still_active);
  p.rebuild(ws);
}

void Model::final_heads(Pass& p) {
  // The rows still active leave at the last block computed.
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  std::vector<int32_t> rows;
  for (size_t a = 0; a < p.active.size(); ++a) {
    if (ws.token_row[p.active[a]] >= 0) rows.push_back(static_cast<int32_t>(a));
  }
  if (!rows.empty()) {
    const int32_t vocab = p.batch.head_vocab;
    head_logits(ws.x.data(), rows, p.end_layer, vocab);
    // Every row leaves here, so the drawn ones come down with the statistics, in one wait.
    std::vector<KeptRow> kept;
    for (size_t j = 0; j < rows.size(); ++j) kept.push_back({static_cast<int32_t>(j), ws.token_row[p.active[rows[j]]], {}});
    Draws draws = plan_draws(p, kept);
    const std::vector<ConfidenceStats> stats = logit_stats(static_cast<int32_t>(rows.size()), vocab, &draws);
    p.result.head_rows += static_cast<int64_t>(rows.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      const int32_t t = p.active[rows[j]];
      const int32_t row = ws.token_row[t];
      kept[j].stats = stats[j];
      p.result.row_exit_layer[row] = p.end_layer;
      const ConfidenceMeasure m = p.rule(ws, t).measure;
      p.result.row_confidence[row] = confidence_value(
          stats[j], is_cheap_measure(m) ? ConfidenceMeasure::kTop1Prob : m, vocab > 0 ? vocab : c.n_vocab);
    }
    keep_logits(p, kept, vocab, &draws);
  }
  if (p.batch.return_hidden && !p.active.empty()) {
    std::vector<int32_t> all(p.active.size());
    for (size_t a = 0; a < all.size(); ++a) all[a] = static_cast<int32_t>(a);
    std::vector<float> host(all.size() * c.n_embd);
    download_rows(ws.x.data(), all, host.data());
    for (size_t a = 0; a < all.size(); ++a) {
      std::copy_n(host.data() + a * c.n_embd, c.n_embd, p.result.hidden.data() + static_cast<size_t>(p.active[a]) * c.n_embd);
    }
  }
}

}  // namespace helios
