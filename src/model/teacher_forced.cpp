#include "helios/teacher_forced.h"

#include <algorithm>

namespace helios {

namespace {
constexpr int32_t kBlockSize = 16;
}  // namespace

StatusOr<TeacherForcedRunner> TeacherForcedRunner::create(Model& model, size_t max_len) {
  const auto n_tokens = static_cast<int32_t>(std::max<size_t>(max_len, 1));
  const int32_t n_blocks = blocks_for_tokens(n_tokens, kBlockSize);
  HELIOS_ASSIGN_OR_RETURN(auto kv, model.create_kv(n_blocks, kBlockSize));
  TeacherForcedRunner runner(model, std::move(kv));
  BlockAllocator allocator(n_blocks);
  if (!reserve_tokens(allocator, runner.table_, n_tokens, kBlockSize)) {
    return internal_error("KV blocks sized for the longest sequence ran out");
  }
  return runner;
}

StatusOr<ForwardResult> TeacherForcedRunner::run(const std::vector<TokenId>& tokens, const ExitRule& rule,
                                                 const ForwardBatch& options) {
  ForwardBatch batch = options;
  batch.seqs.clear();
  SequenceBatchEntry e;
  e.tokens = tokens;
  e.blocks = &table_;
  e.logits = LogitsWanted::kAll;
  e.exit = rule;
  batch.seqs.push_back(std::move(e));
  return model_->forward(batch, kv_);
}

}  // namespace helios
