// Teacher-forced passes for calibration, evaluation and profiles: sequences run one at a time,
// every position's logits wanted, through one KV cache sized for the longest sequence and reused
// (each pass writes positions 0..n-1 before it attends to them).
#pragma once

#include <cstddef>
#include <vector>

#include "helios/model.h"

namespace helios {

class TeacherForcedRunner {
 public:
  // A cache for sequences of up to max_len tokens of `model`'s loaded layers.
  static StatusOr<TeacherForcedRunner> create(Model& model, size_t max_len);

  // One sequence from position 0 with every row's logits. `options` supplies the rest of the
  // batch (capture_layers, observe_exits) and `rule` the entry's exit rule.
  StatusOr<ForwardResult> run(const std::vector<TokenId>& tokens, const ExitRule& rule = {},
                              const ForwardBatch& options = {});

 private:
  TeacherForcedRunner(Model& model, KvCacheStorage kv) : model_(&model), kv_(std::move(kv)) {}

  Model* model_;
  KvCacheStorage kv_;
  BlockTable table_;
};

}  // namespace helios
