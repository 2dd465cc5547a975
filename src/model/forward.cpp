// The forward pass, top to bottom: embed → for each layer {rmsnorm, qkv, rope, KV write, paged
// attention, o-proj, residual, rmsnorm, SwiGLU MLP, residual, exit check} → final norm → LM head.
#include <cmath>

#include "helios/model.h"

namespace helios {

// Activation buffers, grown to the largest batch seen so far (backend memory), plus the host
// arrays that describe the batch to the kernels.
struct Model::Workspace {
  int32_t capacity_tokens = 0;
  Buffer x, xb, q, k, v, attn, proj, gate, up, head_in, logits;
  std::vector<int32_t> tokens, positions, slots, token_seq, block_tables, logit_rows;

  void reserve(Backend& b, const ModelConfig& c, int32_t n_tokens) {
    if (n_tokens <= capacity_tokens) return;
    const size_t n = static_cast<size_t>(n_tokens);
    x = Buffer(&b, n * c.n_embd);          // [n_tokens, n_embd] residual stream
    xb = Buffer(&b, n * c.n_embd);         // [n_tokens, n_embd] normed input of a sublayer
    q = Buffer(&b, n * c.q_dim());         // [n_tokens, n_head, head_dim]
    k = Buffer(&b, n * c.kv_dim());        // [n_tokens, n_head_kv, head_dim]
    v = Buffer(&b, n * c.kv_dim());        // [n_tokens, n_head_kv, head_dim]
    attn = Buffer(&b, n * c.q_dim());      // [n_tokens, n_head, head_dim]
    proj = Buffer(&b, n * c.n_embd);       // [n_tokens, n_embd] sublayer output
    gate = Buffer(&b, n * c.n_ff);         // [n_tokens, n_ff]
    up = Buffer(&b, n * c.n_ff);           // [n_tokens, n_ff]
    head_in = Buffer(&b, n * c.n_embd);    // [n_rows, n_embd] rows that want logits
    logits = Buffer(&b, n * c.n_vocab);    // [n_rows, n_vocab]
    capacity_tokens = n_tokens;
  }
};

StatusOr<ForwardResult> Model::forward(const ForwardBatch& batch, KvCacheStorage& kv) {
  HELIOS_RETURN_IF_ERROR(validate(batch, kv));
  const ModelConfig& c = config_;
  Backend& be = backend_;
  if (!ws_) ws_ = std::make_shared<Workspace>();
  Workspace& ws = *ws_;

  // --- plan: flatten the batch into per-token arrays (host)
  ws.tokens.clear(); ws.positions.clear(); ws.slots.clear(); ws.token_seq.clear();
  ws.logit_rows.clear();
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
      if (wants) {
        ws.logit_rows.push_back(static_cast<int32_t>(ws.tokens.size()));
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
  ws.reserve(be, c, n);
  const kernels::AttentionPlan plan{n, ws.token_seq.data(), ws.positions.data(),
                                    ws.block_tables.data(), static_cast<int32_t>(max_blocks)};
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const bool interleaved = c.rope_layout == RopeLayout::kInterleaved;

  // --- embed
  be.embedding(ws.tokens.data(), n, weights_.tok_embd.data(), c.n_embd, ws.x.data());

  for (int32_t l = 0; l < n_layers_loaded(); ++l) {
    const LayerWeights& w = weights_.layers[l];
    const kernels::PagedKV cache = kv.layer(l);

    // attention: norm → q, k, v → rope → cache → paged attention → output projection → residual
    be.rmsnorm(ws.x.data(), w.attn_norm.data(), n, c.n_embd, c.rms_eps, ws.xb.data());
    be.matmul(ws.xb.data(), w.wq.view, n, ws.q.data());
    be.matmul(ws.xb.data(), w.wk.view, n, ws.k.data());
    be.matmul(ws.xb.data(), w.wv.view, n, ws.v.data());
    be.rope(ws.q.data(), ws.positions.data(), n, c.n_head, c.head_dim, c.n_rot, c.rope_freq_base, interleaved);
    be.rope(ws.k.data(), ws.positions.data(), n, c.n_head_kv, c.head_dim, c.n_rot, c.rope_freq_base, interleaved);
    be.kv_write(ws.k.data(), ws.v.data(), ws.slots.data(), n, cache);
    be.paged_attention(ws.q.data(), cache, plan, c.n_head, attn_scale, ws.attn.data());
    be.matmul(ws.attn.data(), w.wo.view, n, ws.proj.data());
    be.add(ws.x.data(), ws.proj.data(), static_cast<int64_t>(n) * c.n_embd);

    // feed-forward: norm → silu(gate) * up → down projection → residual
    be.rmsnorm(ws.x.data(), w.ffn_norm.data(), n, c.n_embd, c.rms_eps, ws.xb.data());
    be.matmul(ws.xb.data(), w.w_gate.view, n, ws.gate.data());
    be.matmul(ws.xb.data(), w.w_up.view, n, ws.up.data());
    be.swiglu(ws.gate.data(), ws.up.data(), static_cast<int64_t>(n) * c.n_ff, ws.gate.data());
    be.matmul(ws.gate.data(), w.w_down.view, n, ws.proj.data());
    be.add(ws.x.data(), ws.proj.data(), static_cast<int64_t>(n) * c.n_embd);

    // exit check: an early-exit policy reads the hidden state x here (layer l + 1 of
    // n_layers_loaded) and marks the tokens that leave; their K/V for deeper layers is filled
    // from this state. Until a policy is configured every token runs the full loaded depth.
  }

  // --- final norm and LM head, only for the rows that want logits
  const int32_t n_rows = static_cast<int32_t>(ws.logit_rows.size());
  if (n_rows == 0) return result;
  be.embedding(ws.logit_rows.data(), n_rows, ws.x.data(), c.n_embd, ws.head_in.data());  // gather
  be.rmsnorm(ws.head_in.data(), weights_.output_norm.data(), n_rows, c.n_embd, c.rms_eps, ws.head_in.data());
  be.matmul(ws.head_in.data(), weights_.output.view, n_rows, ws.logits.data());
  result.logits.resize(static_cast<size_t>(n_rows) * c.n_vocab);
  be.download(result.logits.data(), ws.logits.data(), result.logits.size());
  return result;
}

}  // namespace helios
