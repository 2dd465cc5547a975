// Sampled tokens drawn where the logits are (EngineOptions::device_sampling): on the CPU the
// backend runs the twin (kernels::ref_sample_rows) through the whole engine, and every request's
// tokens are the host sampler's, its logprobs too within float rounding.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

using testing::engine_options;

using testing::Outcome;

// Every sampler setting a request can carry, one request each, batched together.
std::vector<GenerationRequest> requests(const Model& model) {
  std::vector<GenerationRequest> out;
  auto add = [&](const std::string& id, auto set) {
    GenerationRequest r = testing::make_generation(model, id, testing::kStoryPrompts[out.size() % 4], {}, 0.9f, 40);
    r.sampling.seed = 100 + out.size();
    set(r.sampling);
    out.push_back(std::move(r));
  };
  add("plain", [](SamplingParams&) {});
  add("top_k", [](SamplingParams& p) { p.top_k = 20; });
  add("top_p", [](SamplingParams& p) { p.top_p = 0.8f; });
  add("min_p", [](SamplingParams& p) { p.min_p = 0.1f; });
  add("penalties", [](SamplingParams& p) {
    p.repetition_penalty = 1.2f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.5f;
    p.logit_bias = {{10, 3.0f}};
  });
  add("greedy with a penalty", [](SamplingParams& p) { p.temperature = 0.0f; p.repetition_penalty = 1.3f; });
  add("twice-biased token", [](SamplingParams& p) { p.logit_bias = {{10, 1.0f}, {10, 1.0f}}; });  // stays on the host
  return out;
}

std::vector<Outcome> run(bool device_sampling) {
  EngineOptions options = engine_options(256);
  options.device_sampling = device_sampling;
  testing::Served s(options);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (GenerationRequest& r : requests(*s.model)) streams.push_back(*s.engine->submit(std::move(r)));
  std::vector<Outcome> out;
  for (auto& st : streams) out.push_back(testing::drain(*st));
  return out;
}

TEST(DeviceSamplingEngine, TokensAndLogprobsAreTheHostSamplers) {
  const std::vector<Outcome> host = run(false), device = run(true);
  ASSERT_EQ(host.size(), device.size());
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(host[i].ids.size(), 40u) << "request " << i;
    EXPECT_EQ(device[i].ids, host[i].ids) << "request " << i;
    ASSERT_EQ(device[i].logprobs.size(), host[i].logprobs.size());
    // The two runs may batch the requests differently (the engine steps while they arrive), and a
    // row's logits move within float rounding with the rows beside it (the CPU matmul tiles rows):
    // the logprobs agree to that, the tokens exactly.
    for (size_t t = 0; t < host[i].logprobs.size(); ++t) {
      EXPECT_NEAR(device[i].logprobs[t], host[i].logprobs[t], 1e-4f) << "request " << i << " token " << t;
    }
  }
  // The requests sampled differently from each other: the settings reached the draw.
  EXPECT_NE(host[0].ids, host[1].ids);
}

}  // namespace
}  // namespace helios
