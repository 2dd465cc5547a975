// Compute kernels shared by the backends. `ref_<op>` is the plain C++ reference that the CPU
// backend runs; each CUDA kernel `launch_<op>` (kernels/cuda/) has the same parameters and is
// checked against its `ref_` twin. Plain types only: no CUDA, no gRPC, no Helios classes.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace helios::kernels {

// How K and V are stored: f32, IEEE half (round to nearest even; what llama.cpp keeps by default,
// half the bytes per token), or FP8 E4M3 (kernels/ref/fp8.h: round to nearest even, saturating at
// ±448; a quarter of the bytes, 3 mantissa bits).
enum class KvType : int32_t { kF32 = 0, kF16 = 1, kFp8E4M3 = 2 };
inline int32_t kv_type_bytes(KvType t) { return t == KvType::kF32 ? 4 : t == KvType::kF16 ? 2 : 1; }
inline const char* kv_type_name(KvType t) { return t == KvType::kF32 ? "f32" : t == KvType::kF16 ? "f16" : "fp8"; }

// A paged KV cache for one layer. Owns nothing.
//   k, v: [n_blocks, block_size, n_kv_heads, head_dim] of `type`; slot = block_id * block_size + offset.
struct PagedKV {
  void* k = nullptr;
  void* v = nullptr;
  int32_t n_blocks = 0;
  int32_t block_size = 0;  // tokens per block
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  KvType type = KvType::kF32;
};

// Which cache slots a batch of tokens attends to, planned once per step. Owns nothing.
struct AttentionPlan {
  int32_t n_tokens = 0;
  const int32_t* token_seq = nullptr;     // [n_tokens] sequence index of each token
  const int32_t* positions = nullptr;     // [n_tokens] position of each token in its sequence
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq] block ids, row per seq
  int32_t max_blocks_per_seq = 0;
};

// out[t] = x[t] / rms(x[t]) * weight  for t < n_rows.  x, out: [n_rows, dim]; weight: [dim]
void ref_rmsnorm(const float* x, const float* weight, int32_t n_rows, int32_t dim, float eps,
                 float* out);

// out[t] = table[tokens[t]]. table: [n_vocab, dim]; out: [n_tokens, dim]
void ref_embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                   float* out);

// How RoPE turns the pairs of a head, in llama.cpp's order. Pair i's angle is
// pos · freq_base^(-2i/n_rot), divided by freq_factors[i] when given (Llama 3's rope_freqs.weight),
// then scaled by freq_scale (linear and YaRN scaling: 1 / the file's factor). YaRN (ext_factor > 0)
// mixes the scaled angle with the unscaled one: pairs up to corr_low keep the unscaled angle,
// pairs from corr_high on take the scaled one, with a linear ramp between, weighted by ext_factor.
// cos and sin are then multiplied by mscale (YaRN's attention temperature times the file's
// rope.scaling.attn_factor; 1 otherwise).
struct RopeParams {
  int32_t n_rot = 0;                    // rotated dims per head, even, <= head_dim
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // [n_rot/2] in the rotating backend's memory, or null
  bool interleaved = true;              // pairs (2i, 2i+1); otherwise (i, i + n_rot/2)
  float ext_factor = 0.0f;              // YaRN's mix; 0: none
  float corr_low = 0.0f, corr_high = 0.0f;
  float mscale = 1.0f;
};

// YaRN's correction range for a model (llama.cpp's ggml_rope_yarn_corr_dims): the pairs whose
// wavelength spans fewer than beta_fast rotations over the original context keep their angle, those
// with more than beta_slow take the scaled one. Writes rope.corr_low and rope.corr_high.
void yarn_correction_range(int32_t n_ctx_orig, float beta_fast, float beta_slow, RopeParams& rope);

// Rotates the first n_rot dims of each head in place, as RopeParams says.
// x: [n_tokens, n_heads, head_dim]; positions: [n_tokens].
void ref_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
              const RopeParams& rope);

// Writes each token's K and V into its cache slot, converted to the cache's type.
// k, v: [n_tokens, n_kv_heads, head_dim]; slots: [n_tokens]
void ref_kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                  const PagedKV& cache);

// Causal attention through the block tables: token t (of sequence s at position p) attends to
// positions 0..p of s. Handles GQA (n_heads a multiple of n_kv_heads). Computes the (token, head)
// pairs with index t * n_heads + h in [item_begin, item_end), so callers can split the work.
//   q, out: [n_tokens, n_heads, head_dim]
void ref_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                         int32_t n_heads, float scale, int64_t item_begin, int64_t item_end,
                         float* out);

// The CPU backend's attention: the same result as ref_paged_attention (within rounding), faster.
// Work items are (token, KV head, context split): each serves the KV head's query heads, so a K/V
// row is read and converted once for all of them, and long contexts of a few tokens are split so
// that every thread has work (a merge of the splits follows, as on the GPU). A token's splits
// (every 256 positions of its context) depend on nothing else, so its result does not depend on
// the batch or the threads.
struct CpuAttentionWork {
  int32_t n_splits = 1;       // context splits of the longest context: items per (token, KV head)
  int64_t n_items = 0;        // n_tokens * n_kv_heads * n_splits
  int64_t workspace_floats = 0;  // partial results when n_splits > 1
};
CpuAttentionWork cpu_attention_work(const AttentionPlan& plan, int32_t n_heads, int32_t n_kv_heads,
                                    int32_t head_dim);
// Items i = first, first + stride, ... below work.n_items (a strided share keeps the causal
// triangle of a prompt balanced across threads). `workspace`: work.workspace_floats floats.
void cpu_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                         int32_t n_heads, float scale, const CpuAttentionWork& work, int64_t first,
                         int64_t stride, float* workspace, float* out);
// After every item: combines the splits into out (nothing to do when work.n_splits == 1). The
// (token, head) pairs with index in [pair_begin, pair_end).
void cpu_attention_merge(const AttentionPlan& plan, int32_t n_heads, int32_t head_dim,
                         const CpuAttentionWork& work, const float* workspace, int64_t pair_begin,
                         int64_t pair_end, float* out);

// out = silu(gate) * up, elementwise over n values.
void ref_swiglu(const float* gate, const float* up, int64_t n, float* out);

// y[r] = W x[r]: x: [n_rows, n_in]; w: [n_out, n_in] (GGUF's row-major layout); y: [n_rows, n_out]
void ref_matmul(const float* x, const float* w, int32_t n_rows, int32_t n_in, int32_t n_out,
                float* y);

// --- Quantized weights.
// Weights stay in their GGUF block format (ids as GGUF numbers them). Activations are rounded
// to 8 bits first, exactly as llama.cpp does: per block of 32 — Q8_1 (with the block sum) for
// Q4_1/Q5_1 weights, Q8_0 for Q8_0/Q4_0/Q5_0 — or per super-block of 256 as Q8_K (with sums per
// 16) for the K-quants Q4_K/Q5_K/Q6_K. Products follow llama.cpp's x86 (AVX2) arithmetic, so both
// give the same logits to within float summation order, and usually bit for bit.
enum WeightType : uint32_t {
  kWeightF32 = 0, kWeightQ4_0 = 2, kWeightQ4_1 = 3, kWeightQ5_0 = 6, kWeightQ5_1 = 7, kWeightQ8_0 = 8,
  kWeightQ4_K = 12, kWeightQ5_K = 13, kWeightQ6_K = 14,
};

// The types ref_matmul_quantized takes, and the values per block of each (n_in is a multiple).
bool ref_quantized_weight_type(uint32_t weight_type);
int32_t ref_quantized_block_values(uint32_t weight_type);
// Bytes of one quantized activation row of n_in values.
int64_t ref_activation_row_bytes(uint32_t weight_type, int32_t n_in);
// xq[r] = quantize(x[r]) for r < n_rows.  x: [n_rows, n_in]; xq: [n_rows, activation_row_bytes]
void ref_quantize_activations(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in,
                              void* xq);
// The same by the portable scalar code alone: the same bytes.
void ref_quantize_activations_scalar(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in,
                                     void* xq);
// y[r, o] = dot(w[o], xq[r]) for output rows o in [out_begin, out_end).
//   w: [n_out, n_in] in weight_type blocks; xq from ref_quantize_activations; y: [n_rows, n_out]
// Each row r is computed alone in a fixed order: its result does not depend on n_rows.
void ref_matmul_quantized(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                          int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y);
// The same product by the portable scalar code alone, which ref_matmul_quantized runs where the
// build has no AVX2 (ref_matmul_quantized_is_vector() false): the two give the same bits.
void ref_matmul_quantized_scalar(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                                 int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y);
bool ref_matmul_quantized_is_vector();

// --- Interleaved weights: the CPU backend's layout for Q4_K and Q6_K matrices, repacked once at load.
// Each group of 4 rows stores its super-blocks together (the same bytes as the 4 GGUF rows,
// rearranged: kernels/ref/quant_matmul_x4.cpp), so that one activation broadcast feeds products
// with 4 rows. Its float sums run in another order than ref_matmul_quantized's (llama.cpp's row
// kernel): results agree to rounding, not bit for bit; the vector and scalar code agree exactly.
constexpr int32_t kInterleavedRows = 4;
// Whether a [n_out, n_in] matrix of weight_type can be interleaved: Q4_K or Q6_K, n_out a multiple of 4.
bool ref_interleavable(uint32_t weight_type, int32_t n_out, int32_t n_in);
// Whether this build's interleaved kernel for weight_type beats its row kernel: Q4_K always; Q6_K
// only with AVX-512VL, whose 32 registers let a tile unpack its weights once for 8 activation
// rows (with AVX2's 16, for 4, and the unpacking costs what the row kernel's multiplies save).
bool ref_interleaved_pays(uint32_t weight_type);
// out = w interleaved: both [n_out, n_in] of weight_type's bytes.
void ref_interleave_weights(uint32_t weight_type, const void* w, int32_t n_out, int32_t n_in, void* out);
// One row of an interleaved matrix back in GGUF's bytes (a tied embedding table's lookup).
void ref_deinterleave_row(uint32_t weight_type, const void* w, int32_t n_in, int32_t row, void* out);
// ref_matmul_quantized over interleaved weights; out_begin and out_end are multiples of 4.
void ref_matmul_interleaved(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows, int32_t n_in,
                            int32_t n_out, int32_t out_begin, int32_t out_end, float* y);
void ref_matmul_interleaved_scalar(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                                   int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y);

// x += y over n values (the residual connection).
void ref_add(float* x, const float* y, int64_t n);
// rows[r] += v for each of n_rows rows of dim values (a projection's bias on every token).
void ref_add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim);

// --- Twins of the CUDA kernels that the CPU backend does not call itself.

// x += y, then out = rmsnorm(x) · weight (the residual add fused with the next sublayer's norm).
//   x, y, out: [n_rows, dim]; weight: [dim]. x is updated in place; out may alias y, not x.
void ref_add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                     float eps, float* out);

// y[r] = W x[r] with W in IEEE half (GGUF F16): w: [n_out, n_in] uint16 bits; x: [n_rows, n_in];
// y: [n_rows, n_out]. Each product in f32, summed in f32.
void ref_matmul_f16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                    int32_t n_out, float* y);
// out[i] = half(x[i]), round to nearest even.
void ref_f32_to_f16(const float* x, int64_t n, uint16_t* out);
// The same with W in bfloat16 (GGUF BF16), and out[i] = bfloat16(x[i]), round to nearest even.
void ref_matmul_bf16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                     int32_t n_out, float* y);
void ref_f32_to_bf16(const float* x, int64_t n, uint16_t* out);

// A logit as every argmax, exit statistic and draw takes it, on every backend: NaN (weights gone
// wrong, a 16-bit overflow) as −inf, so it never wins while a number is left and adds nothing to a
// softmax's sums (helios::confidence_stats' rule); +inf (or a logit over a tiny temperature) as
// FLT_MAX, so the largest share the mass instead of making every probability NaN.
inline float softmax_logit(float x) { return std::fmin(std::fmax(x, -INFINITY), FLT_MAX); }
// A logit over a temperature > 0, as sampling sorts and sums it (the device's twin: sample.cu).
inline float tempered_logit(float x, float temperature) { return softmax_logit(softmax_logit(x) / temperature); }
// The first index of the largest of n softmax_logit values (0 when n is 0).
int32_t ref_argmax(const float* x, int32_t n);
// −log softmax(row)[token] over n softmax_logit values, summed in double (LogSoftmax's rule).
double ref_neg_log_prob(const float* row, int32_t n, int32_t token);

// Early-exit confidence over the vocabulary, per row of logits [n_rows, n_vocab]:
//   top1: the most likely id (lowest on ties; ref_argmax); top1_prob: its softmax probability;
//   margin: top-1 minus top-2 probability (top-2 = the best id other than top1);
//   entropy: −Σ p log p in nats. All outputs: [n_rows].
// A row with no number above −inf prefers no token: uniform_stats (1/n, margin 0, entropy log n).
void ref_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                    float* top1_prob, float* margin, float* entropy);
void uniform_stats(int32_t n_vocab, float& top1_prob, float& margin, float& entropy);
// The CPU backend's: the same statistics with vectorised float exponentials summed in double
// (within about 1e-6 relative of ref_exit_stats; top1 is the same).
void cpu_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                    float* top1_prob, float* margin, float* entropy);
// A row's log-softmax: at(x) = (x − max) − log Σ e^(x_i − max). Subtracting the max first keeps
// the log term that max + log Σ rounds away next to FLT_MAX (two +inf logits: log ½ each, not 0).
// A row with no number above −inf is uniform (log_sum = log n), as uniform_stats has it.
struct LogSoftmax {
  float max = -INFINITY;
  double log_sum = 0;
  double at(float logit) const {
    return max == -INFINITY ? -log_sum : (static_cast<double>(softmax_logit(logit)) - max) - log_sum;
  }
};
// A row of n softmax_logit values as cpu_exit_stats sums it (vectorised float exponentials in double).
LogSoftmax cpu_log_softmax(const float* logits, int32_t n);

// Sampling a token from a row of logits where the logits are (the host sampler's steps as data:
// helios::Sampler::plan_draw). One adjustment per token the penalties touch, applied in the host
// order: y = x + bias; with `repeat`, y = y > 0 ? y / repetition_penalty : y * repetition_penalty;
// then y -= subtract (frequency · count + presence).
struct LogitAdjust {
  int32_t token = 0;
  float bias = 0.0f;
  int32_t repeat = 0;  // 1: the token is in the repetition window
  float subtract = 0.0f;
};
struct SampleRow {
  int32_t logits_row = 0;           // which row of the logits
  float temperature = 0.0f;         // 0: the argmax of the adjusted row (no draw)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;
  double uniform = 0.0;             // the draw, in [0, 1): the host's generate_canonical<double, 53>
  int32_t adjust_begin = 0, adjust_end = 0;  // its LogitAdjust entries (each token at most once)
};
// For each row: z = adjusted logits / temperature, ordered by z descending (ties: the lower id);
// the first min(top_k, n_vocab) kept; p(i) = float(e^(z_i − z_0) / Σ e^(z_j − z_0)) summed in
// double over those; top-p keeps the shortest prefix whose Σ p reaches top_p; min-p the prefix with
// p ≥ min_p · p(0) (at least one); the token is the first whose running Σ p reaches
// uniform · Σ_kept p (else the last kept). token[r]: the id; logprob[r]: its log-softmax over the
// raw row (cpu_log_softmax's at(x[token])). Sums over the whole vocabulary go by id,
// over a cut prefix in order, as helios::Sampler sums them, so this twin takes the sampler's token
// to the bit; the CUDA kernel sums in another order, so its draw differs where one lands within
// rounding of a boundary between two tokens.
void ref_sample_rows(const float* logits, int32_t n_vocab, const SampleRow* rows, int32_t n_rows,
                     const LogitAdjust* adjust, int32_t* token, float* logprob);

// --- CUDA launchers (HELIOS_CUDA builds; kernels/cuda/). Same parameters as the ref_ twin plus
// a stream (a cudaStream_t, opaque here); they return 0 or the cudaError_t of the launch.
// Every pointer is device memory unless its name says host.
// The decode path's kernels go out as chained launches where the device has them (compute
// capability 9.0 on: each may be scheduled while the one before it finishes; kernels/cuda/common.cuh);
// off, as plain launches, to measure the difference. On by default; process-wide.
void set_chained_launches(bool on);
bool chained_launches();
int launch_rmsnorm(const float* x, const float* weight, int32_t n_rows, int32_t dim, float eps,
                   float* out, void* stream);

int launch_embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                     float* out, void* stream);
int launch_add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                       float eps, float* out, void* stream);
int launch_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads,
                int32_t head_dim, const RopeParams& rope, void* stream);
int launch_kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                    const PagedKV& cache, void* stream);
// launch_rope on q's first n_q rows (n_heads heads) and on k's first n_kv rows, then launch_kv_write
// of k and v: one launch, the same bits. Heads of k, v and head_dim: the cache's.
int launch_rope_kv_write(float* q, const int32_t* q_positions, int32_t n_q, int32_t n_heads, float* k, const float* v,
                         const int32_t* kv_positions, const int32_t* slots, int32_t n_kv, const RopeParams& rope,
                         const PagedKV& cache, void* stream);

// Contexts attended over: the longest (largest position + 1) and their sum.
struct ContextSpan {
  int32_t longest = 0;
  int64_t total = 0;
};

// Query tiles for the CUDA attention: runs of at most tile_tokens consecutive tokens of one
// sequence (a prefill chunk in pieces; a decode is a tile of its own), whose query heads share
// every K/V read. Tile i is tokens first[i] .. first[i + 1] - 1; span holds the tiles' contexts
// (a tile's is its longest token's), which size the context splits. attention_tiles sets
// tile_tokens to the fullest tile's tokens, which size a block's rows: a step of decodes alone
// takes blocks of one token's heads.
struct AttentionTiles {
  const int32_t* first = nullptr;  // [n_tiles + 1]; null: one token per tile
  int32_t n_tiles = 0;
  int32_t tile_tokens = 1;
  ContextSpan span;
  // The general path's cache reads (an element per lane) even where the wide one's 16-byte reads
  // apply (decode-sized blocks of rows that split into 16-byte chunks): tests and the benchmark
  // run both.
  bool general_loads = false;
};
// The tiles of a plan in host memory; `first` receives the boundaries (tiles.first points there).
AttentionTiles attention_tiles(const AttentionPlan& plan, int32_t tile_tokens, std::vector<int32_t>* first);

// Paged attention over every (token, head) of the plan (its arrays in device memory, and
// tiles.first too): one block per (query tile, KV head or chunk of its heads, context split)
// serves the KV head's query heads for the tile's tokens, masking each one's positions past its
// own. The split length comes from the tiles' total context, so a few decoding tokens still fill
// the GPU, and each tile takes as many splits as its own context needs (a long sequence beside
// short ones is not left to one block); a second kernel merges the splits.
// attention_tile_tokens: the most tokens a tile may hold for the shape. workspace: at least
// paged_attention_workspace_floats(..., tiles.span) floats (none needed when that is 0).
int32_t attention_tile_tokens(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim);
// Whether the kernel takes the shape: head_dim <= 256 and whole groups (n_heads a multiple of
// n_kv_heads). A KV head's query heads share a block where one token's fit ((n_heads / n_kv_heads) ×
// head_dim <= 2048); wider groups (multi-query: Falcon-7B's 71 heads over 1) go in equal chunks.
bool paged_attention_supports(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim);
// Whether tiles of tile_tokens tokens read a `type` cache 16 bytes at a time (the wide path; its
// cache 16-byte aligned too, as allocations are): a KV head's query rows in a block few enough
// (rows × head_dim <= 1024, and their sums in registers: f32 16 rows, f16 8, fp8 4), head_dim
// split evenly into 16-byte chunks over a power of two of lanes up to 32 (f16: 64, 128, 256).
bool paged_attention_reads_wide(KvType type, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t tile_tokens);
int64_t paged_attention_workspace_floats(int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                         int32_t head_dim, ContextSpan span);
// The most paged_attention_workspace_floats gives for these heads, whatever the tokens and
// contexts (a pass of many tokens takes fewer, longer splits), so it can be reserved ahead.
int64_t paged_attention_workspace_bound(int32_t n_heads, int32_t head_dim);
int launch_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                           int32_t n_heads, float scale, const AttentionTiles& tiles, float* workspace,
                           float* out, void* stream);

int launch_swiglu(const float* gate, const float* up, int64_t n, float* out, void* stream);
int launch_add(float* x, const float* y, int64_t n, void* stream);
int launch_add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim, void* stream);
// Products of one input with up to kMaxGemvProducts matrices of one type and width (Q, K and V;
// gate and up) in one launch per 8 rows of input (the matrix-vector kernels: 16-bit, and 8-bit
// for quantized weights): their output rows share the grid, so a small matrix (GQA's K and V)
// does not leave most of the GPU idle in a launch of its own, and a step pays one launch where
// it paid three. Each adds its bias, if any, to every row as it writes it, and an accumulating
// product adds its result to what y holds (a projection into the residual stream: the add that
// would follow it, in the same launch, with the same bits).
struct GemvProduct {
  const void* w = nullptr;      // [n_out, n_in] in the launch's type, rows in GGUF's order
  int32_t n_out = 0;
  float* y = nullptr;           // [n_rows, n_out]
  const float* bias = nullptr;  // [n_out], or null
  bool accumulate = false;      // y += W x (+ bias), not y = W x (+ bias)
};
constexpr int kMaxGemvProducts = 4;
struct GemvProducts {
  GemvProduct at[kMaxGemvProducts];
  int32_t n = 0;
  // One matrix alone.
  static GemvProducts of(const void* w, int32_t n_out, float* y, const float* bias = nullptr) {
    GemvProducts one;
    one.at[0] = {w, n_out, y, bias};
    one.n = 1;
    return one;
  }
};
// The products' output rows as the launches assign them, on the host: warp `warp` (0-7) of
// block `block` writes row *row of the output *y (null, -1: none); *n_blocks, the launch's blocks.
int gemv_products_warp_row(const GemvProducts& products, int32_t block, int32_t warp, float** y, int32_t* row,
                           int32_t* n_blocks);
int launch_matmul_f16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                      int32_t n_out, float* y, void* stream);
int launch_matmul_f16_products(const float* x, int32_t n_rows, int32_t n_in, const GemvProducts& products,
                               void* stream);
int launch_f32_to_f16(const float* x, int64_t n, uint16_t* out, void* stream);
int launch_matmul_bf16(const float* x, const uint16_t* w, int32_t n_rows, int32_t n_in,
                       int32_t n_out, float* y, void* stream);
int launch_matmul_bf16_products(const float* x, int32_t n_rows, int32_t n_in, const GemvProducts& products,
                                void* stream);
int launch_f32_to_bf16(const float* x, int64_t n, uint16_t* out, void* stream);
// Quantized weights in their GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; n_in a
// multiple of the block): y[r, o] = dot(dequantize(w[o]), x[r]) with f32 activations, for few rows
// (decode: each weight byte read once per 8 rows). CPU twin: dequantize_row, then ref_matmul.
int launch_matmul_quant(uint32_t weight_type, const float* x, const void* w, int32_t n_rows, int32_t n_in,
                        int32_t n_out, float* y, void* stream);
// The device's decoder for values [32·unit, 32·unit + 32) of a quantized row, run on the host:
// the same code the kernels above inline, with 16-byte loads (Q4_K, Q5_K; the row must then be
// 16-byte aligned) or aligned four-byte loads (two shifted together where a stretch starts 2 bytes
// into a word). For tests on machines without a GPU; cudaErrorInvalidValue for
// a type launch_matmul_quant does not read.
int decode_quant_unit(uint32_t weight_type, const void* row, int32_t unit, bool vector_loads, float* out);
// The same product with the activations in 8 bits, as the CPU backend computes it: each row of x
// rounded as ref_quantize_activations rounds it for the weight type (the integers and scales of
// Q8_1 for the 32-value types, whose Q8_0 they are too, and of Q8_K for the K-quants), then
// integer dot products per 32 values scaled by the blocks' scales. The integer sums equal the CPU
// twin's (ref_matmul_quantized); only the order of the float sums differs. A workspace (16-byte
// aligned, matmul_quant_q8_workspace_bytes) holds the rounded rows: each row its n_in signed
// bytes, then per 32-value unit a float pair (d, s), the scale and d·Σq (Q8_1: the halves'
// values), rows 16-byte aligned, so the first rows of a workspace are one too.
// launch_matmul_quant_q8 rounds x into the workspace and multiplies; launch_quantize_q8 and
// launch_matmul_q8_rows are its halves, so matrices of types that round alike (q8_rounds_alike)
// share one rounding of their input. launch_matmul_q8_rows adds `bias` ([n_out], or null) to every
// row of y as it writes it (a projection's bias, without a launch of its own).
// launch_matmul_q8_products takes several matrices over the same rounded rows, as
// launch_matmul_f16_products does.
size_t matmul_quant_q8_workspace_bytes(int32_t n_rows, int32_t n_in);
bool q8_rounds_alike(uint32_t type_a, uint32_t type_b);
int launch_matmul_quant_q8(uint32_t weight_type, const float* x, const void* w, int32_t n_rows, int32_t n_in,
                           int32_t n_out, float* y, void* workspace, size_t workspace_bytes, void* stream);
int launch_quantize_q8(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in, void* workspace,
                       size_t workspace_bytes, void* stream);
// launch_rmsnorm, launch_add_rmsnorm and launch_swiglu (of n_rows rows of n_ff), then
// launch_quantize_q8 of their output: one launch each, the same bits.
int launch_rmsnorm_q8(uint32_t weight_type, const float* x, const float* weight, int32_t n_rows, int32_t dim,
                      float eps, float* out, void* workspace, size_t workspace_bytes, void* stream);
int launch_add_rmsnorm_q8(uint32_t weight_type, float* x, const float* y, const float* weight, int32_t n_rows,
                          int32_t dim, float eps, float* out, void* workspace, size_t workspace_bytes, void* stream);
int launch_swiglu_q8(uint32_t weight_type, const float* gate, const float* up, int32_t n_rows, int32_t n_ff,
                     float* out, void* workspace, size_t workspace_bytes, void* stream);
int launch_matmul_q8_rows(uint32_t weight_type, const void* workspace, const void* w, int32_t n_rows, int32_t n_in,
                          int32_t n_out, float* y, const float* bias, void* stream);
int launch_matmul_q8_products(uint32_t weight_type, const void* workspace, int32_t n_rows, int32_t n_in,
                              const GemvProducts& products, void* stream);
// The device's code for the above, run on the host (for tests on machines without a GPU):
// quantize_activations_q8 fills a workspace as the launch does; quant_unit_q8_share is unit
// `unit` of a weight row against the 32 activation bytes xq with their (d, s).
int quantize_activations_q8(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in, void* workspace);
int quant_unit_q8_share(uint32_t weight_type, const void* row, int32_t unit, bool vector_loads, const int8_t* xq,
                        float d, float s, float* share);
// out[n_rows, n_in] = the rows dequantized and rounded to f16 (for a cuBLAS product of many rows).
int launch_dequantize_f16(uint32_t weight_type, const void* w, int32_t n_rows, int32_t n_in, uint16_t* out,
                          void* stream);
int launch_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                      float* top1_prob, float* margin, float* entropy, void* stream);
// The key launch_sample_rows sorts a row's logit by (softmax_logit of it tempered; -0 as +0), the logit back from a
// key, and the key bits the sort reads for n_rows rows: keys sorted ascending on those bits put
// the rows in order and each row in ref_sample_rows' order. Host-callable, for tests on machines
// without a GPU.
uint64_t sample_sort_key(int32_t row, float logit, float temperature);
float sample_sort_key_logit(uint64_t key);
int sample_sort_end_bit(int32_t n_rows);
// ref_sample_rows for rows, adjust, token and logprob in device memory, with `workspace` of
// sample_rows_workspace_bytes(n_rows, n_vocab) bytes (the rows' 64-bit sort keys and ids, twice,
// and the sort's own storage: about 24 bytes per logit). all_greedy: the caller knows every row's
// temperature is 0, so each row's largest key is found directly instead of sorting the rows (the
// same tokens, far less work).
size_t sample_rows_workspace_bytes(int32_t n_rows, int32_t n_vocab);
int launch_sample_rows(const float* logits, int32_t n_vocab, const SampleRow* rows, int32_t n_rows,
                       const LogitAdjust* adjust, void* workspace, size_t workspace_bytes, int32_t* token,
                       float* logprob, void* stream, bool all_greedy = false);

}  // namespace helios::kernels
