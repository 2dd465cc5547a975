// A loaded model and its forward pass over a batch of sequences with a paged KV cache.
//
// The batch is plain data decided before the pass (by the scheduler, or by generate()): which
// tokens of which sequences, at which positions, in which KV blocks. Prefill chunks and
// single-token decodes mix freely in one batch.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "helios/backend.h"
#include "helios/early_exit.h"
#include "helios/kv_cache.h"
#include "helios/model_config.h"
#include "helios/sampler.h"
#include "helios/tensor_parallel.h"
#include "helios/tokenizer.h"
#include "helios/weights.h"

namespace helios {

enum class LogitsWanted { kNone, kLast, kAll };

// An exit head's residual MLP (ResidualMlp) in backend memory, with room for its activations: rows
// go through it kRows at a time, so a batch of any size needs no allocation in the pass.
struct ExitMlp {
  static constexpr int32_t kRows = 256;
  Matrix gate, up, down;
  Buffer ones;  // [n_embd]: the unit weight of its RMS norm
  Buffer work;  // [kRows, n_embd + 2 * hidden]
  int32_t hidden = 0;
  static StatusOr<std::shared_ptr<ExitMlp>> upload(Backend& backend, const ResidualMlp& mlp, int32_t n_embd,
                                                   const std::string& name);
};

struct SequenceBatchEntry {
  std::vector<TokenId> tokens;      // the tokens to compute in this step
  int32_t start_pos = 0;            // position of tokens[0]; 0..start_pos-1 are already cached
  const BlockTable* blocks = nullptr;  // must cover positions [0, start_pos + tokens.size())
  LogitsWanted logits = LogitsWanted::kLast;
  ExitRule exit;                    // how this sequence's logit rows may leave the stack
  // Per token (or empty): the layer it left at when it was computed before (0: unknown). A token
  // recomputed after a preemption leaves there again, so its K/V at every layer is what it was;
  // where its sequence may now run deeper (the model was extended since), the layers below get
  // its K/V from its exit state. Rows that want logits ignore it.
  std::vector<int32_t> known_exit_layers;
  // Its rows are read only for their top-1 id and its probability (greedy, nothing else): those
  // come from the device's statistics (ForwardResult::row_top1) and the logits stay there, so
  // the row's ForwardResult::row() is not filled.
  bool top1_only = false;
  // Its rows' tokens are drawn where the logits are (Backend::sample_rows) with this plan
  // (RequestOutput::device_draw): ForwardResult::row_token has them, and the rows' row() is not
  // filled. Not with top1_only.
  std::optional<SampleDraw> draw;
};

struct ForwardBatch {
  std::vector<SequenceBatchEntry> seqs;

  // A partial pass (self-speculative decoding): start after `first_layer` blocks from the hidden
  // states in `hidden_in` (host, [n_tokens, n_embd] in entry order) instead of the embeddings,
  // and/or stop after `last_layer` blocks (0: the loaded depth), where logit rows take the exit
  // head. Exit rules other than kFull are not combined with either.
  int32_t first_layer = 0;
  const float* hidden_in = nullptr;
  int32_t last_layer = 0;
  bool return_hidden = false;          // ForwardResult::hidden: every token's state where it stopped
  // The last head's logits over the first head_vocab token ids only (the LM head's first rows:
  // byte-level BPE numbers its tokens roughly by frequency), the rest kLogitOff: a cheaper head
  // for self-speculative drafts, whose top-1 and confidence are then over those ids (0: the
  // whole vocabulary). A multiple of 64, at most the vocabulary.
  int32_t head_vocab = 0;
  static constexpr float kLogitOff = -1e30f;  // far below any logit, and finite: exp gives 0
  std::vector<int32_t> capture_layers; // ForwardResult::captured: logit rows' states after these layers
  // Observe mode: at every exit point below the loaded depth, run the exit head on each logit row
  // still there and record its top-1 and top-1 probability (ForwardResult::observed_*), without
  // changing what the pass computes or where rows leave. One LM-head pass per exit per row.
  bool observe_exits = false;
};

struct ForwardResult {
  int32_t n_vocab = 0;
  std::vector<float> logits;     // [n_rows, n_vocab]
  std::vector<int32_t> row_seq;  // [n_rows] index into ForwardBatch::seqs
  std::vector<int32_t> row_pos;  // [n_rows] position whose next token the row predicts
  std::vector<int32_t> row_exit_layer;  // [n_rows] blocks the row ran before its head
  std::vector<float> row_confidence;    // [n_rows] its rule's measure where it left (top-1 prob
                                        // for a full-depth row with a cheap measure)
  std::vector<int32_t> row_top1;        // [n_rows] its logits' most likely id (lowest on ties)
  std::vector<float> row_top1_prob;     // [n_rows] that id's softmax probability
  std::vector<int32_t> row_token;       // [n_rows] the token drawn for an entry with a draw, else -1
  std::vector<float> row_token_logprob; // [n_rows] its log-probability under the raw logits
  std::vector<float> hidden;            // [n_tokens, n_embd] when return_hidden
  std::vector<std::vector<float>> captured;  // per capture layer: [n_rows, n_embd]
  std::vector<int32_t> observed_layers;      // observe_exits: the exit points observed, ascending
  std::vector<std::vector<ExitObservation>> observed;  // per observed layer: [n_rows]

  // Work done, for the layers-per-token accounting.
  int64_t layer_rows = 0;  // sum over layers of the tokens that ran the whole block
  int64_t fill_rows = 0;   // sum over layers of the exited tokens whose K/V was filled
  int64_t head_rows = 0;   // rows that went through the LM head (exit checks and outputs)

  const float* row(size_t r) const { return logits.data() + r * n_vocab; }
};

struct ModelLoadOptions {
  int32_t n_layers = 0;  // load only the first n blocks (0: all)
  std::optional<RopeScaling> rope_scaling;  // replaces the file's (model_config_from_gguf)
  LoadProgress progress;
  // Tensor parallelism over this many ranks (tensor_parallel.h): rank 0 on the backend load()
  // gets, rank r on make_rank_backend(r) — CPU backends talk through an in-process group, CUDA
  // backends through NCCL. forward() runs every rank, each on its own thread.
  int32_t tensor_parallel = 1;
  std::function<StatusOr<std::unique_ptr<Backend>>(int32_t rank)> make_rank_backend;
};

class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> load(const std::string& path, Backend& backend,
                                               const ModelLoadOptions& options = {});

  // --- Extending a model loaded with its first layers (ModelLoadOptions::n_layers)
  // Blocks [n_layers_loaded(), new_depth) read from the model's file into backend memory, for
  // append_layers. Reads the model and changes nothing, so another thread may call it while an
  // engine runs the model (the backend must take allocations and uploads from two threads).
  // INVALID_ARGUMENT for a depth at or below the loaded one or past the model's; the loader's
  // errors (NOT_FOUND when the file is gone, RESOURCE_EXHAUSTED when the blocks do not fit).
  StatusOr<ModelWeights> load_layers_range(int32_t new_depth) const;
  // Moves load_layers_range's blocks in (weights().n_bytes counts them) and sets the exit points
  // and heads for the new depth as set_exits does. All or nothing: INVALID_ARGUMENT for no blocks,
  // a depth past the model's, or an exit point outside [1, new depth - 1]; RESOURCE_EXHAUSTED when
  // a head does not fit; the model is as it was then. Not thread-safe: nothing may run the model
  // meanwhile. A KV cache filled before is too shallow for it afterwards (kv_config() changes).
  Status append_layers(ModelWeights extra, const std::vector<int32_t>& exit_layers, const ExitHeadSet* heads);
  // check_exit_rule as it would answer after append_layers to `depth` with these exit points and
  // heads: whether a request's rule still runs on the extended model.
  Status check_exit_rule_at(const ExitRule& rule, int32_t depth, const std::vector<int32_t>& exit_layers,
                            const ExitHeadSet* heads) const;

  ~Model();
  // The model's shapes (the whole model's, on a tensor-parallel one).
  const ModelConfig& config() const { return model_config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() const { return backend_; }
  int32_t n_layers_loaded() const { return static_cast<int32_t>(weights_.layers.size()); }
  // The config with n_layer = the loaded layers: the shape of the KV cache this model fills (on a
  // tensor-parallel model, each rank's: its KV heads).
  ModelConfig kv_config() const {
    ModelConfig c = config_;
    c.n_layer = n_layers_loaded();
    return c;
  }

  // Exit points (layers after which a token may leave) and their heads: the fitted adapters and
  // probes of `fitted` where it has a head for a layer, the identity (logit lens) elsewhere.
  // INVALID_ARGUMENT for a layer outside [1, n_layers_loaded - 1].
  Status set_exits(const std::vector<int32_t>& exit_layers, const ExitHeadSet* fitted);
  const std::vector<int32_t>& exit_layers() const;
  // A lookahead head is installed (set_exits with heads that have one, on a model loaded to its
  // whole depth, on one rank): self-speculative at the loaded depth drafts with it.
  bool has_lookahead() const { return lookahead_ != nullptr; }
  // The lookahead head on n host rows of last-layer states [n, n_embd] (ForwardBatch::capture_layers
  // at the loaded depth) and the token each row's logits chose (the next input): per row its top-1
  // among the first `vocab` ids (0: all) and that token's probability, i.e. the guess for the token
  // after `tokens[r]`. FAILED_PRECONDITION without a lookahead head.
  StatusOr<std::vector<ExitObservation>> lookahead(const float* states, const TokenId* tokens, int32_t n,
                                                   int32_t vocab = 0) const;
  // The token embeddings of n tokens, host [n, n_embd] (what the first block reads).
  StatusOr<std::vector<float>> embed(const TokenId* tokens, int32_t n) const;
  // Whether the model can run the rule: its depth is an exit point or the loaded depth, a probe
  // measure has probes at every exit. INVALID_ARGUMENT saying what is missing.
  Status check_exit_rule(const ExitRule& rule) const;
  // The rule with its defaults filled in: depth 0 is the loaded depth for fixed-depth and the
  // first exit point for self-speculative. forward() resolves every entry's rule itself.
  ExitRule resolve_exit_rule(ExitRule rule) const;

  // The KV cache for this model: on a tensor-parallel model, one storage per rank (KvCacheStorage::
  // shard). Errors as KvCacheStorage::create.
  StatusOr<KvCacheStorage> create_kv(int32_t n_blocks, int32_t block_size,
                                     kernels::KvType type = kernels::KvType::kF32) const;
  // Ranks this model runs on (1 unless loaded with ModelLoadOptions::tensor_parallel).
  int32_t tensor_parallel() const { return shard_.world; }

  // An exit head on n rows of hidden states in backend memory: a = W h + b when `adapter` is given,
  // a += the residual MLP when `mlp` is, then the final norm and the LM head into `logits`
  // [n, n_vocab] (with `vocab` > 0, the LM head's first `vocab` rows into [n, vocab]). `rows` is
  // overwritten with the head's normed input; `scratch` [n, n_embd] holds a. Not on a
  // tensor-parallel model from outside forward(): its LM head is spread over the ranks.
  void apply_exit_head(float* rows, int32_t n, const WeightMatrix* adapter, const float* bias, ExitMlp* mlp,
                       float* scratch, float* logits, int32_t vocab = 0) const;

  // Runs the batch through every loaded layer, writing each token's K/V into `kv`, and returns
  // the logits the entries asked for. INVALID_ARGUMENT for a malformed batch (a token id outside
  // the vocabulary, a block table too short, a position past the cache); RESOURCE_EXHAUSTED when
  // the activations do not fit; the backend's error when a device call failed.
  StatusOr<ForwardResult> forward(const ForwardBatch& batch, KvCacheStorage& kv);
  // Allocates the activations for batches of up to n_tokens tokens now, before the KV cache takes
  // the rest of the device memory. RESOURCE_EXHAUSTED when they do not fit.
  Status reserve_workspace(int32_t n_tokens);

 private:
  explicit Model(Backend& backend);
  struct Workspace;
  struct Ranks;  // a tensor-parallel model's other ranks (rank 0 holds them)
  StatusOr<ForwardResult> forward_rank(const ForwardBatch& batch, KvCacheStorage& kv);
  Status reserve_own_workspace(int32_t n_tokens);
  // Sums a row-parallel projection's partial results over the ranks (nothing on one rank).
  void all_reduce(float* data, size_t n) const;
  // rows [n, n_embd] (normed) times the LM head into logits [n, vocab > 0 ? vocab : n_vocab]; on a
  // tensor-parallel model each rank multiplies its vocabulary rows and the logits are gathered.
  void lm_head(const float* rows, int32_t n, float* logits, int32_t vocab) const;
  Status validate(const ForwardBatch& batch, const KvCacheStorage& kv) const;

  struct ExitHead {  // one exit's adapter in backend memory, its probe on the host
    Matrix adapter;  // view.data == nullptr: the identity (logit lens)
    Buffer bias;
    Matrix token_map;  // a lookahead head's U (ExitHeadParams::token_weight); view.data == nullptr: none
    std::shared_ptr<ExitMlp> mlp;  // null: none
    ExitHeadParams params;
  };
  using ExitHeads = std::vector<std::shared_ptr<ExitHead>>;  // [depth + 1], null where none
  struct ExitHeadsAt {
    ExitHeads heads;
    std::shared_ptr<ExitHead> lookahead;  // null: none
  };
  // One head in backend memory (`params` null: the logit lens), its tensors named after `name`.
  StatusOr<std::shared_ptr<ExitHead>> make_exit_head(int32_t layer, const ExitHeadParams* params,
                                                     const std::string& name) const;
  // The heads set_exits installs for a model loaded to `depth`; the model is unchanged.
  StatusOr<ExitHeadsAt> make_exit_heads(int32_t depth, const std::vector<int32_t>& exit_layers,
                                        const ExitHeadSet* fitted) const;
  void install_exits(std::vector<int32_t> exit_layers, ExitHeadsAt heads);
  struct Pass;  // one forward pass's state: rules, active and exited tokens, the result
  Status check_partial_pass(const ForwardBatch& batch) const;
  bool is_exit_point(int32_t layer) const;

  // The stages of forward(), in order (forward.cpp).
  Status plan_batch(Pass& p);                      // per-token arrays, rules, workspace, result shape
  void save_states_before_block(Pass& p);          // h_{k-1}, for the saturation measure
  void run_block(Pass& p, int32_t layer);          // attention and MLP; K/V of exited tokens
  void capture_states(Pass& p, int32_t layer_no);  // ForwardBatch::capture_layers
  void observe_exits(Pass& p, int32_t layer_no);   // ForwardBatch::observe_exits
  void leave_at_known_layers(Pass& p, int32_t layer_no);  // SequenceBatchEntry::known_exit_layers
  void check_exits(Pass& p, int32_t layer_no);     // confidence → decide_exits → leaving rows' logits
  // Active → exited (after layer_no blocks; `replayed`: at their known exit layers), compacted.
  void remove_leaving(Pass& p, const std::vector<uint8_t>& leaves, int32_t layer_no, bool replayed);
  void final_heads(Pass& p);                       // rows still running: the last block's head
  // The exit head at `layer` (logit lens, or adapter) on rows `rows` of `states`, into the
  // workspace's logits (backend memory, [rows.size(), n_vocab]).
  // `vocab` > 0: over the first `vocab` token ids only, rows packed [rows.size(), vocab].
  void head_logits(const float* states, const std::vector<int32_t>& rows, int32_t layer, int32_t vocab = 0);
  void download_rows(const float* states, const std::vector<int32_t>& rows, float* host);
  struct KeptRow {
    int32_t logits_row = 0, result_row = 0;
    ConfidenceStats stats;
  };
  // The kept rows whose entries draw their token where the logits are (SequenceBatchEntry::draw),
  // as Backend::sample_rows takes them, and the tokens once drawn.
  struct Draws {
    std::vector<kernels::SampleRow> rows;
    std::vector<kernels::LogitAdjust> adjust;
    std::vector<int32_t> result_rows;  // of each draw
    std::vector<int32_t> token;
    std::vector<float> logprob;
  };
  Draws plan_draws(const Pass& p, const std::vector<KeptRow>& kept) const;
  // Of the first n rows of the logits (rows of `vocab` entries where given, else n_vocab); with
  // `draws` (full-width rows only), their tokens too, in the same wait for the device.
  std::vector<ConfidenceStats> logit_stats(int32_t n_rows, int32_t vocab = 0, Draws* draws = nullptr);
  // Workspace logits rows (of `vocab` entries, else n_vocab) into the result, kLogitOff past them,
  // with their statistics' top-1; a top1_only row keeps the statistics alone, a row with a draw
  // its token: from `drawn` (logit_stats drew them), else drawn here by Backend::sample_rows.
  void keep_logits(Pass& p, const std::vector<KeptRow>& kept, int32_t vocab = 0, Draws* drawn = nullptr);

  Backend& backend_;
  std::string path_;  // the GGUF file, for load_layers_range
  ModelConfig model_config_;  // the model's shapes
  ModelConfig config_;        // this rank's: its heads and FFN units (model_config_ on one rank)
  ShardSpec shard_;
  Communicator* comm_ = nullptr;        // null on one rank
  mutable Buffer head_shard_;           // this rank's logits before the gather
  mutable size_t head_shard_floats_ = 0;
  std::vector<int32_t> exit_layers_;
  ExitHeads exit_heads_;  // [n_layers_loaded + 1], null where none
  std::shared_ptr<ExitHead> lookahead_;  // null: none
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelWeights weights_;
  std::shared_ptr<Workspace> ws_;
  std::unique_ptr<Ranks> ranks_;  // last: the other ranks go before this rank's memory
};

}  // namespace helios
