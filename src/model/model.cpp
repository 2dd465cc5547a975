// Model loading and batch validation; the pass itself is in forward.cpp.
#include "helios/gguf.h"
#include "helios/model.h"

namespace helios {

StatusOr<std::unique_ptr<Model>> Model::load(const std::string& path, Backend& backend,
                                             const ModelLoadOptions& options) {
  HELIOS_ASSIGN_OR_RETURN(auto file, GgufFile::open(path));
  std::unique_ptr<Model> m(new Model(backend));
  HELIOS_ASSIGN_OR_RETURN(m->config_, model_config_from_gguf(*file));
  HELIOS_ASSIGN_OR_RETURN(auto spec, tokenizer_spec_from_gguf(*file));
  if (static_cast<int32_t>(spec.tokens.size()) != m->config_.n_vocab) {
    return invalid_argument(path + ": the tokenizer has " + std::to_string(spec.tokens.size()) +
                            " tokens but token_embd.weight has " +
                            std::to_string(m->config_.n_vocab) + " rows");
  }
  HELIOS_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::create(std::move(spec)));
  HELIOS_ASSIGN_OR_RETURN(m->weights_, load_weights(*file, m->config_, backend, options.n_layers,
                                                    options.progress));
  return m;
}

Status Model::validate(const ForwardBatch& batch, const KvCacheStorage& kv) const {
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const auto& e = batch.seqs[s];
    const std::string where = "batch entry " + std::to_string(s) + ": ";
    if (e.tokens.empty()) return invalid_argument(where + "no tokens");
    if (!e.blocks) return invalid_argument(where + "no block table");
    if (e.start_pos < 0) return invalid_argument(where + "negative start position");
    const int32_t end = e.start_pos + static_cast<int32_t>(e.tokens.size());
    if (e.blocks->capacity_tokens(kv.block_size()) < end) {
      return invalid_argument(where + "block table holds " +
                              std::to_string(e.blocks->capacity_tokens(kv.block_size())) +
                              " tokens, the entry needs " + std::to_string(end));
    }
    for (int32_t id : e.blocks->block_ids) {
      if (id < 0 || id >= kv.n_blocks()) {
        return invalid_argument(where + "block id " + std::to_string(id) + " outside the cache");
      }
    }
    for (TokenId t : e.tokens) {
      if (t < 0 || t >= config_.n_vocab) {
        return invalid_argument(where + "token id " + std::to_string(t) + " outside the vocabulary (0.." +
                                std::to_string(config_.n_vocab - 1) + ")");
      }
    }
  }
  return ok_status();
}

}  // namespace helios
