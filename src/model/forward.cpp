// The forward pass, top to bottom: embed → for each layer {rmsnorm, qkv, rope, KV write, paged
// attention, o-proj, residual, rmsnorm, SwiGLU MLP, residual, exit check} → head.
//
// Early exit keeps two sets of tokens. Active tokens run the whole block. A token that left at an
// exit keeps its hidden state h_k, and every deeper block computes its K/V from h_k (state
// propagation) in the same projection as the active tokens', so tokens that go deeper later —
// and later tokens of the same chunk — attend to every position.
#include <algorithm>
#include <cmath>

#include "helios/model.h"

namespace helios {

// Activation buffers, grown to the largest batch seen so far (backend memory), plus the host
// arrays that describe the batch to the kernels.
struct Model::Workspace {
  int32_t capacity_tokens = 0;
  Buffer x, x_spare, exited, prev, xb, q, k, v, attn, proj, gate, up, head_in, head_tmp, logits;
  std::vector<int32_t> tokens, positions, slots, token_seq, block_tables, token_row;

  void reserve(Backend& b, const ModelConfig& c, int32_t n_tokens) {
    if (n_tokens <= capacity_tokens) return;
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
    capacity_tokens = n_tokens;
  }
};

// Which tokens are active and which left (with the data their K/V fill needs), in buffer order.
struct Model::ExitState {
  std::vector<int32_t> active;        // flat token index of each row of ws.x
  std::vector<int32_t> exited;        // flat token index of each row of ws.exited
  std::vector<int32_t> a_pos, a_seq;  // per active row: position, sequence (the attention plan)
  std::vector<int32_t> kv_pos, kv_slot;  // active rows, then exited rows

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

namespace {

bool leaves_by_confidence(ExitPolicy p) { return p == ExitPolicy::kPerToken || p == ExitPolicy::kBatchSync; }

}  // namespace

void Model::head_logits(const float* states, const std::vector<int32_t>& rows, int32_t layer) {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  Workspace& ws = *ws_;
  const auto n = static_cast<int32_t>(rows.size());
  be.embedding(rows.data(), n, states, c.n_embd, ws.head_in.data());  // gather
  const ExitHead* head = layer < static_cast<int32_t>(exit_heads_.size()) ? exit_heads_[layer].get() : nullptr;
  const bool adapted = head && layer < c.n_layer && head->adapter.view.data;
  apply_exit_head(ws.head_in.data(), n, adapted ? &head->adapter.view : nullptr, adapted ? head->bias.data() : nullptr,
                  ws.head_tmp.data(), ws.logits.data());
}

void Model::apply_exit_head(float* rows, int32_t n, const WeightMatrix* adapter, const float* bias, float* scratch,
                            float* logits) const {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  const float* in = rows;
  if (adapter) {
    be.matmul(rows, *adapter, n, scratch);
    for (int32_t r = 0; r < n; ++r) be.add(scratch + static_cast<int64_t>(r) * c.n_embd, bias, c.n_embd);
    in = scratch;
  }
  be.rmsnorm(in, weights_.output_norm.data(), n, c.n_embd, c.rms_eps, rows);
  be.matmul(rows, weights_.output.view, n, logits);
}

StatusOr<ForwardResult> Model::forward(const ForwardBatch& batch, KvCacheStorage& kv) {
  HELIOS_RETURN_IF_ERROR(validate(batch, kv));
  HELIOS_RETURN_IF_ERROR(check_partial_pass(batch));
  const ModelConfig& c = config_;
  Backend& be = backend_;
  if (!ws_) ws_ = std::make_shared<Workspace>();
  Workspace& ws = *ws_;

  // --- plan: flatten the batch into per-token arrays (host)
  ws.tokens.clear(); ws.positions.clear(); ws.slots.clear(); ws.token_seq.clear(); ws.token_row.clear();
  ForwardResult result;
  result.n_vocab = c.n_vocab;
  size_t max_blocks = 1;
  for (const auto& e : batch.seqs) max_blocks = std::max(max_blocks, e.blocks->block_ids.size());
  ws.block_tables.assign(batch.seqs.size() * max_blocks, 0);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const auto& e = batch.seqs[s];
    std::copy(e.blocks->block_ids.begin(), e.blocks->block_ids.end(),
              ws.block_tables.begin() + s * max_blocks);
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      const int32_t pos = e.start_pos + static_cast<int32_t>(i);
      const bool wants = e.logits == LogitsWanted::kAll ||
                         (e.logits == LogitsWanted::kLast && i + 1 == e.tokens.size());
      ws.token_row.push_back(wants ? static_cast<int32_t>(result.row_seq.size()) : -1);
      if (wants) {
        result.row_seq.push_back(static_cast<int32_t>(s));
        result.row_pos.push_back(pos);
      }
      ws.tokens.push_back(e.tokens[i]);
      ws.positions.push_back(pos);
      ws.slots.push_back(e.blocks->slot(pos, kv.block_size()));
      ws.token_seq.push_back(static_cast<int32_t>(s));
    }
  }
  const int32_t n = static_cast<int32_t>(ws.tokens.size());
  const auto n_rows = static_cast<int32_t>(result.row_seq.size());
  ws.reserve(be, c, n);
  result.logits.resize(static_cast<size_t>(n_rows) * c.n_vocab);
  result.row_exit_layer.assign(n_rows, 0);
  result.row_confidence.assign(n_rows, 0.0f);
  if (batch.return_hidden) result.hidden.assign(static_cast<size_t>(n) * c.n_embd, 0.0f);
  result.captured.assign(batch.capture_layers.size(), std::vector<float>(static_cast<size_t>(n_rows) * c.n_embd));

  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const bool interleaved = c.rope_layout == RopeLayout::kInterleaved;
  const int32_t end_layer = batch.last_layer > 0 ? batch.last_layer : n_layers_loaded();
  std::vector<ExitRule> rules;
  for (const auto& e : batch.seqs) rules.push_back(resolve_exit_rule(e.exit));
  auto rule = [&](int32_t token) -> const ExitRule& { return rules[ws.token_seq[token]]; };
  bool early_exits = false, saturation = false;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    if (batch.seqs[s].logits == LogitsWanted::kNone) continue;
    const ExitRule& r = rules[s];
    if (leaves_by_confidence(r.policy) || r.policy == ExitPolicy::kFixedDepth) early_exits = true;
    if (leaves_by_confidence(r.policy) && r.measure == ConfidenceMeasure::kSaturation) saturation = true;
  }

  ExitState st;
  for (int32_t t = 0; t < n; ++t) st.active.push_back(t);
  st.rebuild(ws);

  // Host copies of some rows of a backend buffer.
  auto download_rows = [&](const float* states, const std::vector<int32_t>& rows, float* host) {
    if (rows.empty()) return;
    be.embedding(rows.data(), static_cast<int32_t>(rows.size()), states, c.n_embd, ws.head_tmp.data());
    be.download(host, ws.head_tmp.data(), rows.size() * c.n_embd);
  };

  // Softmax statistics of the first n rows of ws.logits (computed where the logits are).
  auto logit_stats = [&](int32_t n_stat) {
    std::vector<int32_t> top1(n_stat);
    std::vector<float> p1(n_stat), margin(n_stat), entropy(n_stat);
    be.exit_stats(ws.logits.data(), n_stat, c.n_vocab, top1.data(), p1.data(), margin.data(), entropy.data());
    std::vector<ConfidenceStats> out(n_stat);
    for (int32_t i = 0; i < n_stat; ++i) out[i] = {top1[i], p1[i], margin[i], entropy[i]};
    return out;
  };
  // Row j of ws.logits becomes the result's row.
  auto keep_logits = [&](int32_t j, int32_t row) {
    be.download(result.logits.data() + static_cast<size_t>(row) * c.n_vocab,
                ws.logits.data() + static_cast<size_t>(j) * c.n_vocab, c.n_vocab);
  };

  // --- embed (or start from given states)
  if (batch.hidden_in) {
    be.upload(ws.x.data(), batch.hidden_in, static_cast<size_t>(n) * c.n_embd);
  } else {
    be.embedding(ws.tokens.data(), n, weights_.tok_embd.data(), c.n_embd, ws.x.data());
  }

  for (int32_t l = batch.first_layer; l < end_layer; ++l) {
    const auto na = static_cast<int32_t>(st.active.size());
    const auto nf = static_cast<int32_t>(st.exited.size());
    if (na == 0 && nf == 0) break;
    const int32_t layer_no = l + 1;  // blocks done after this one
    const bool exit_here = early_exits && layer_no < end_layer && is_exit_point(layer_no);
    if (exit_here && saturation && na > 0) {
      std::vector<int32_t> all(na);
      for (int32_t i = 0; i < na; ++i) all[i] = i;
      be.embedding(all.data(), na, ws.x.data(), c.n_embd, ws.prev.data());
    }

    const LayerWeights& w = weights_.layers[l];
    const kernels::PagedKV cache = kv.layer(l);
    const kernels::AttentionPlan plan{na, st.a_seq.data(), st.a_pos.data(), ws.block_tables.data(),
                                      static_cast<int32_t>(max_blocks)};
    const int32_t nk = na + nf;
    float* xb_fill = ws.xb.data() + static_cast<int64_t>(na) * c.n_embd;

    // attention: norm → q, k, v → rope → cache → paged attention → output projection → residual.
    // Exited tokens join the K/V projection only: their K/V for this layer comes from h_exit.
    if (na > 0) be.rmsnorm(ws.x.data(), w.attn_norm.data(), na, c.n_embd, c.rms_eps, ws.xb.data());
    if (nf > 0) be.rmsnorm(ws.exited.data(), w.attn_norm.data(), nf, c.n_embd, c.rms_eps, xb_fill);
    if (na > 0) be.matmul(ws.xb.data(), w.wq.view, na, ws.q.data());
    be.matmul(ws.xb.data(), w.wk.view, nk, ws.k.data());
    be.matmul(ws.xb.data(), w.wv.view, nk, ws.v.data());
    if (na > 0) be.rope(ws.q.data(), st.a_pos.data(), na, c.n_head, c.head_dim, c.n_rot, c.rope_freq_base, interleaved);
    be.rope(ws.k.data(), st.kv_pos.data(), nk, c.n_head_kv, c.head_dim, c.n_rot, c.rope_freq_base, interleaved);
    be.kv_write(ws.k.data(), ws.v.data(), st.kv_slot.data(), nk, cache);
    result.layer_rows += na;
    result.fill_rows += nf;
    if (na == 0) continue;
    be.paged_attention(ws.q.data(), cache, plan, c.n_head, attn_scale, ws.attn.data());
    be.matmul(ws.attn.data(), w.wo.view, na, ws.proj.data());

    // feed-forward: (residual, norm) → silu(gate) * up → down projection → residual
    be.add_rmsnorm(ws.x.data(), ws.proj.data(), w.ffn_norm.data(), na, c.n_embd, c.rms_eps, ws.xb.data());
    be.matmul(ws.xb.data(), w.w_gate.view, na, ws.gate.data());
    be.matmul(ws.xb.data(), w.w_up.view, na, ws.up.data());
    be.swiglu(ws.gate.data(), ws.up.data(), static_cast<int64_t>(na) * c.n_ff, ws.gate.data());
    be.matmul(ws.gate.data(), w.w_down.view, na, ws.proj.data());
    be.add(ws.x.data(), ws.proj.data(), static_cast<int64_t>(na) * c.n_embd);

    for (size_t i = 0; i < batch.capture_layers.size(); ++i) {
      if (batch.capture_layers[i] != layer_no) continue;
      std::vector<int32_t> rows, row_ids;
      for (int32_t a = 0; a < na; ++a) {
        if (ws.token_row[st.active[a]] >= 0) {
          rows.push_back(a);
          row_ids.push_back(ws.token_row[st.active[a]]);
        }
      }
      std::vector<float> host(rows.size() * c.n_embd);
      download_rows(ws.x.data(), rows, host.data());
      for (size_t j = 0; j < rows.size(); ++j) {
        std::copy_n(host.data() + j * c.n_embd, c.n_embd, result.captured[i].data() + static_cast<size_t>(row_ids[j]) * c.n_embd);
      }
    }

    // exit check: which logit rows leave after this block
    if (!exit_here) continue;
    std::vector<int32_t> cand;  // active rows (indices into x) that may or must leave here
    for (int32_t a = 0; a < na; ++a) {
      const int32_t t = st.active[a];
      if (ws.token_row[t] < 0) continue;
      const ExitRule& r = rule(t);
      if ((leaves_by_confidence(r.policy) && r.threshold_at(layer_no) < 1.0f) ||
          (r.policy == ExitPolicy::kFixedDepth && r.depth == layer_no)) {
        cand.push_back(a);
      }
    }
    if (cand.empty()) continue;

    // Confidence: cheap signals from h_k on the host; softmax measures (and forced exits) from the
    // exit head's logits, which the leaving rows then keep.
    const auto nc = cand.size();
    std::vector<float> conf(nc, 0.0f);
    std::vector<char> has_logits(nc, 0);
    std::vector<int32_t> head_cand;
    for (size_t i = 0; i < nc; ++i) {
      const ExitRule& r = rule(st.active[cand[i]]);
      if (!is_cheap_measure(r.measure) || r.policy == ExitPolicy::kFixedDepth) head_cand.push_back(static_cast<int32_t>(i));
    }
    std::vector<ConfidenceStats> cand_stats;  // of the rows in ws.logits, in head_cand order
    if (!head_cand.empty()) {
      std::vector<int32_t> rows;
      for (int32_t i : head_cand) rows.push_back(cand[i]);
      head_logits(ws.x.data(), rows, layer_no);
      cand_stats = logit_stats(static_cast<int32_t>(rows.size()));
      result.head_rows += static_cast<int64_t>(rows.size());
    }
    std::vector<int32_t> logits_index(nc, -1);
    for (size_t j = 0; j < head_cand.size(); ++j) {
      logits_index[head_cand[j]] = static_cast<int32_t>(j);
      has_logits[head_cand[j]] = 1;
    }
    std::vector<float> h_now, h_prev;
    bool cheap = false;
    for (size_t i = 0; i < nc; ++i) cheap |= is_cheap_measure(rule(st.active[cand[i]]).measure);
    if (cheap) {
      h_now.resize(nc * c.n_embd);
      download_rows(ws.x.data(), cand, h_now.data());
      if (saturation) {
        h_prev.resize(nc * c.n_embd);
        download_rows(ws.prev.data(), cand, h_prev.data());
      }
    }
    const ExitHead* head = exit_heads_[layer_no].get();
    for (size_t i = 0; i < nc; ++i) {
      const ExitRule& r = rule(st.active[cand[i]]);
      if (r.measure == ConfidenceMeasure::kProbe) {
        conf[i] = head ? probe_score(head->params, h_now.data() + i * c.n_embd, c.n_embd) : 0.0f;
      } else if (r.measure == ConfidenceMeasure::kSaturation) {
        conf[i] = h_prev.empty() ? 0.0f
                                 : cosine_similarity(h_now.data() + i * c.n_embd, h_prev.data() + i * c.n_embd, c.n_embd);
      } else {
        conf[i] = confidence_value(cand_stats[logits_index[i]], r.measure, c.n_vocab);
      }
    }

    // Decide: per-token alone; batch-sync rows all together; fixed-depth rows must.
    bool batch_confident = true;
    for (size_t i = 0; i < nc; ++i) {
      const ExitRule& r = rule(st.active[cand[i]]);
      if (r.policy == ExitPolicy::kBatchSync && !r.confident(layer_no, conf[i])) batch_confident = false;
    }
    for (int32_t a = 0; a < na && batch_confident; ++a) {  // a batch-sync row that cannot leave
      const int32_t t = st.active[a];
      if (ws.token_row[t] >= 0 && rule(t).policy == ExitPolicy::kBatchSync && rule(t).threshold_at(layer_no) >= 1.0f) {
        batch_confident = false;
      }
    }
    std::vector<int32_t> leaving;  // indices into cand
    for (size_t i = 0; i < nc; ++i) {
      const ExitRule& r = rule(st.active[cand[i]]);
      const bool leaves = r.policy == ExitPolicy::kFixedDepth ||
                          (r.policy == ExitPolicy::kPerToken && r.confident(layer_no, conf[i])) ||
                          (r.policy == ExitPolicy::kBatchSync && batch_confident);
      if (leaves) leaving.push_back(static_cast<int32_t>(i));
    }
    if (leaving.empty()) continue;

    // The leaving rows: logits (the exit head's, which the check may already have computed), then
    // their state joins the exited set (for K/V fill) unless nothing deeper will ever read this
    // sequence.
    std::vector<int32_t> fill_rows;
    std::vector<char> leaves_row(na, 0);
    for (int32_t i : leaving) {
      const int32_t a = cand[i];
      const int32_t t = st.active[a];
      const int32_t row = ws.token_row[t];
      if (has_logits[i]) keep_logits(logits_index[i], row);
      result.row_exit_layer[row] = layer_no;
      result.row_confidence[row] = conf[i];
      leaves_row[a] = 1;
      if (leaves_by_confidence(rule(t).policy)) fill_rows.push_back(a);
      if (batch.return_hidden) download_rows(ws.x.data(), {a}, result.hidden.data() + static_cast<size_t>(t) * c.n_embd);
    }
    std::vector<int32_t> need_head;  // leaving by a cheap signal: their head runs only now
    for (int32_t i : leaving) {
      if (!has_logits[i]) need_head.push_back(cand[i]);
    }
    if (!need_head.empty()) {
      head_logits(ws.x.data(), need_head, layer_no);
      result.head_rows += static_cast<int64_t>(need_head.size());
      for (size_t j = 0; j < need_head.size(); ++j) keep_logits(static_cast<int32_t>(j), ws.token_row[st.active[need_head[j]]]);
    }
    if (!fill_rows.empty()) {
      be.embedding(fill_rows.data(), static_cast<int32_t>(fill_rows.size()), ws.x.data(), c.n_embd,
                   ws.exited.data() + st.exited.size() * static_cast<size_t>(c.n_embd));
      for (int32_t a : fill_rows) st.exited.push_back(st.active[a]);
    }
    std::vector<int32_t> keep;
    std::vector<int32_t> still_active;
    for (int32_t a = 0; a < na; ++a) {
      if (!leaves_row[a]) {
        keep.push_back(a);
        still_active.push_back(st.active[a]);
      }
    }
    if (!keep.empty()) {
      be.embedding(keep.data(), static_cast<int32_t>(keep.size()), ws.x.data(), c.n_embd, ws.x_spare.data());
      std::swap(ws.x, ws.x_spare);
    }
    st.active = std::move(still_active);
    st.rebuild(ws);
  }

  // --- head: the rows still active leave at the last block computed
  std::vector<int32_t> rows;
  for (size_t a = 0; a < st.active.size(); ++a) {
    if (ws.token_row[st.active[a]] >= 0) rows.push_back(static_cast<int32_t>(a));
  }
  if (!rows.empty()) {
    head_logits(ws.x.data(), rows, end_layer);
    const std::vector<ConfidenceStats> stats = logit_stats(static_cast<int32_t>(rows.size()));
    result.head_rows += static_cast<int64_t>(rows.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      const int32_t t = st.active[rows[j]];
      const int32_t row = ws.token_row[t];
      keep_logits(static_cast<int32_t>(j), row);
      result.row_exit_layer[row] = end_layer;
      const ConfidenceMeasure m = rule(t).measure;
      result.row_confidence[row] = confidence_value(stats[j], is_cheap_measure(m) ? ConfidenceMeasure::kTop1Prob : m, c.n_vocab);
    }
  }
  if (batch.return_hidden && !st.active.empty()) {
    std::vector<int32_t> all(st.active.size());
    for (size_t a = 0; a < all.size(); ++a) all[a] = static_cast<int32_t>(a);
    std::vector<float> host(all.size() * c.n_embd);
    download_rows(ws.x.data(), all, host.data());
    for (size_t a = 0; a < all.size(); ++a) {
      std::copy_n(host.data() + a * c.n_embd, c.n_embd, result.hidden.data() + static_cast<size_t>(st.active[a]) * c.n_embd);
    }
  }
  return result;
}

}  // namespace helios
