// Helpers shared by the engine tests: stories260K served by an engine on the CPU, requests, and
// draining a stream.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "helios/engine.h"
#include "test_paths.h"

namespace helios::testing {

struct Served {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;

  explicit Served(EngineOptions options, std::vector<int32_t> exits = {1, 2, 3}, const ExitHeadSet* heads = nullptr) {
    auto m = Model::load(stories260k_path(), *backend);
    if (!m.ok()) {
      ADD_FAILURE() << m.status().message();
      return;
    }
    model = std::move(*m);
    EXPECT_TRUE(model->set_exits(exits, heads).ok());
    auto e = Engine::start(*model, options, nullptr);
    EXPECT_TRUE(e.ok()) << e.status().message();
    if (e.ok()) engine = std::move(*e);
  }
};

inline EngineOptions engine_options(int32_t n_kv_blocks, int32_t max_batched_tokens = 512,
                                    PreemptionMode preemption = PreemptionMode::kRecompute,
                                    int32_t n_swap_blocks = 0) {
  EngineOptions options;
  options.n_kv_blocks = n_kv_blocks;
  options.block_size = 16;
  options.n_swap_blocks = n_swap_blocks;
  options.scheduler.max_batched_tokens = max_batched_tokens;
  options.scheduler.preemption = preemption;
  options.intercepts.profile_at_start = false;  // the intercept tests turn it on
  return options;
}

inline GenerationRequest make_generation(const Model& model, const std::string& id, const std::string& text,
                                         ExitRule rule, float temperature, int32_t max_tokens = 48) {
  GenerationRequest r;
  r.client_id = id;
  r.prompt = model.tokenizer().encode(text, true, false);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = 3;
  r.exit = rule;
  return r;
}

struct Outcome {
  std::vector<TokenId> ids;
  std::vector<float> logprobs;
  std::vector<int32_t> exit_layers;
  std::vector<std::vector<ExitObservation>> observed;  // per token: TokenEvent::observed
  FinishReason finish = FinishReason::kNone;
  std::string error;
  StatusCode error_code = StatusCode::kOk;
};

inline Outcome drain(RequestStream& stream) {
  Outcome o;
  for (;;) {
    auto u = stream.pop(std::chrono::milliseconds(60000));
    if (!u) {
      ADD_FAILURE() << "stream timed out";
      return o;
    }
    for (const auto& t : u->tokens) {
      o.ids.push_back(t.id);
      o.logprobs.push_back(t.logprob);
      o.exit_layers.push_back(t.exit_layer);
      o.observed.push_back(t.observed);
    }
    if (u->finish != FinishReason::kNone) {
      o.finish = u->finish;
      o.error = u->error;
      if (!u->error.empty()) o.error_code = u->error_code;
      return o;
    }
  }
}

inline const char* const kStoryPrompts[] = {"Once upon a time", "The little dog ran", "Lily and Tom",
                                            "One day, a big bird"};

}  // namespace helios::testing
