// A loaded model and its forward pass over a batch of sequences with a paged KV cache.
//
// The batch is plain data decided before the pass (by the scheduler, or by generate()): which
// tokens of which sequences, at which positions, in which KV blocks. Prefill chunks and
// single-token decodes mix freely in one batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "helios/backend.h"
#include "helios/kv_cache.h"
#include "helios/model_config.h"
#include "helios/tokenizer.h"
#include "helios/weights.h"

namespace helios {

enum class LogitsWanted { kNone, kLast, kAll };

struct SequenceBatchEntry {
  std::vector<TokenId> tokens;      // the tokens to compute in this step
  int32_t start_pos = 0;            // position of tokens[0]; 0..start_pos-1 are already cached
  const BlockTable* blocks = nullptr;  // must cover positions [0, start_pos + tokens.size())
  LogitsWanted logits = LogitsWanted::kLast;
};

struct ForwardBatch {
  std::vector<SequenceBatchEntry> seqs;
};

struct ForwardResult {
  int32_t n_vocab = 0;
  std::vector<float> logits;     // [n_rows, n_vocab]
  std::vector<int32_t> row_seq;  // [n_rows] index into ForwardBatch::seqs
  std::vector<int32_t> row_pos;  // [n_rows] position whose next token the row predicts

  const float* row(size_t r) const { return logits.data() + r * n_vocab; }
};

struct ModelLoadOptions {
  int32_t n_layers = 0;  // load only the first n blocks (0: all)
  LoadProgress progress;
};

class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> load(const std::string& path, Backend& backend,
                                               const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() const { return backend_; }
  int32_t n_layers_loaded() const { return static_cast<int32_t>(weights_.layers.size()); }

  // Runs the batch through every loaded layer, writing each token's K/V into `kv`, and returns
  // the logits the entries asked for. INVALID_ARGUMENT for a malformed batch (a token id outside
  // the vocabulary, a block table too short, a position past the cache).
  StatusOr<ForwardResult> forward(const ForwardBatch& batch, KvCacheStorage& kv);

 private:
  Model(Backend& backend) : backend_(backend) {}
  struct Workspace;
  Status validate(const ForwardBatch& batch, const KvCacheStorage& kv) const;

  Backend& backend_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelWeights weights_;
  std::shared_ptr<Workspace> ws_;
};

}  // namespace helios
