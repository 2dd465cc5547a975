// Shared helpers for the golden tests: the goldens' JSON, and one loaded default model.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "helios/generate.h"
#include "helios/model.h"
#include "test_paths.h"

namespace helios::testing {

inline nlohmann::json load_golden(const std::string& name) {
  const std::string path = source_dir() + "/tests/golden/data/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing golden file " << path << " (scripts/make_goldens.py makes it)";
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

// Bytes from their hex spelling ("0aff" → {0x0a, 0xff}), as the goldens store raw data.
inline std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

inline std::vector<TokenId> ids(const nlohmann::json& j) { return j.get<std::vector<TokenId>>(); }

// All logits of `tokens` in one pass (the rows are computed independently of the batch).
inline ForwardResult all_logits(Model& m, const std::vector<TokenId>& tokens) {
  auto kv = KvCacheStorage::create(m.backend(), m.config(), blocks_for_tokens(tokens.size(), 16), 16);
  EXPECT_TRUE(kv.ok());
  BlockAllocator alloc(kv->n_blocks());
  BlockTable table;
  EXPECT_TRUE(reserve_tokens(alloc, table, static_cast<int32_t>(tokens.size()), 16));
  ForwardBatch batch;
  batch.seqs.push_back({tokens, 0, &table, LogitsWanted::kAll});
  auto r = m.forward(batch, *kv);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(*r);
}

// exp(mean over i >= 1 of -log softmax(row i-1)[tokens[i]]), in double, as the goldens compute it.
inline double perplexity(const ForwardResult& r, const std::vector<TokenId>& tokens) {
  double nll = 0;
  for (size_t i = 1; i < tokens.size(); ++i) {
    const float* row = r.row(i - 1);
    const float mx = *std::max_element(row, row + r.n_vocab);
    double sum = 0;
    for (int v = 0; v < r.n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
    nll += std::log(sum) + mx - row[tokens[i]];
  }
  return std::exp(nll / static_cast<double>(tokens.size() - 1));
}

// Logit goldens: llama.cpp's top five [[id, logit] x5] at each position of a prompt. Every listed
// logit of r must be within `tolerance`, and wherever llama.cpp's top-1/top-2 margin is at least
// `decisive`, r's argmax must be llama.cpp's choice.
struct TopFiveCounts {
  float worst = 0;     // the largest difference of a listed logit
  int n_positions = 0;
  int n_top1 = 0;      // positions whose argmax is llama.cpp's
  int n_decisive = 0;  // positions whose llama.cpp margin is at least `decisive`
};
inline void check_top5(const ForwardResult& r, const nlohmann::json& top5_rows, float tolerance, float decisive,
                       TopFiveCounts& n, const std::string& what) {
  for (size_t pos = 0; pos < top5_rows.size(); ++pos) {
    const auto& top5 = top5_rows[pos];
    const float* row = r.row(pos);
    for (const auto& pair : top5) {
      const float diff = std::fabs(row[pair[0].get<int>()] - pair[1].get<float>());
      n.worst = std::max(n.worst, diff);
      EXPECT_LE(diff, tolerance) << what << ": position " << pos << " token " << pair[0];
    }
    ++n.n_positions;
    const bool same_top1 = argmax(row, r.n_vocab) == top5[0][0].get<int>();
    n.n_top1 += same_top1;
    if (top5[0][1].get<float>() - top5[1][1].get<float>() >= decisive) {
      ++n.n_decisive;
      EXPECT_TRUE(same_top1) << what << ": position " << pos;
    }
  }
}

// Greedy goldens: cases of {prompt, prompt_ids, output_ids, top2_margins} from llama.cpp.
struct GreedyCounts {
  int n_steps = 0;     // steps compared (teacher-forced) or generated (free-running)
  int n_agree = 0;     // teacher-forced: steps whose argmax is llama.cpp's
  int n_decisive = 0;  // teacher-forced: steps whose llama.cpp margin is at least `decisive`
  int n_matched = 0;   // free-running: tokens identical before the first divergence
  int n_full = 0;      // free-running: cases identical over all their tokens
};

// Teacher-forced: with llama.cpp's own continuation as input (one pass per case), every step
// where llama.cpp's top-1/top-2 margin is at least `decisive` must be the model's argmax too.
inline GreedyCounts check_teacher_forced(Model& m, const nlohmann::json& cases, float decisive) {
  GreedyCounts n;
  for (const auto& c : cases) {
    const auto prompt = ids(c["prompt_ids"]), expected = ids(c["output_ids"]);
    const auto margins = c["top2_margins"].get<std::vector<float>>();
    std::vector<TokenId> tokens = prompt;
    tokens.insert(tokens.end(), expected.begin(), expected.end() - 1);
    const ForwardResult r = all_logits(m, tokens);
    for (size_t i = 0; i < expected.size(); ++i) {
      const TokenId ours = argmax(r.row(prompt.size() - 1 + i), r.n_vocab);
      ++n.n_steps;
      n.n_agree += ours == expected[i];
      if (margins[i] < decisive) continue;
      ++n.n_decisive;
      EXPECT_EQ(ours, expected[i]) << "prompt " << nlohmann::json(c["prompt"]).dump() << " step " << i
                                   << " (llama.cpp margin " << margins[i] << ")";
    }
  }
  return n;
}

// Free-running generation (the decode path: one token at a time through the paged cache) must
// reproduce llama.cpp's tokens; the two may part only at a step where llama.cpp's own choice was
// not decisive, after which the texts legitimately differ.
inline GreedyCounts check_free_running(Model& m, const nlohmann::json& cases, float decisive) {
  GreedyCounts n;
  for (const auto& c : cases) {
    const auto expected = ids(c["output_ids"]);
    const auto margins = c["top2_margins"].get<std::vector<float>>();
    GenerateOptions opt;
    opt.max_tokens = static_cast<int32_t>(expected.size());
    opt.ignore_eos = true;
    auto r = generate(m, ids(c["prompt_ids"]), opt);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok() || r->tokens.size() != expected.size()) {
      ADD_FAILURE() << "prompt " << nlohmann::json(c["prompt"]).dump() << " gave no full generation";
      continue;
    }
    n.n_steps += static_cast<int>(expected.size());
    size_t same = 0;
    while (same < expected.size() && r->tokens[same] == expected[same]) ++same;
    n.n_matched += static_cast<int>(same);
    if (same == expected.size()) {
      ++n.n_full;
      continue;
    }
    EXPECT_LT(margins[same], decisive)
        << "prompt " << nlohmann::json(c["prompt"]).dump() << ": token " << same << " is "
        << r->tokens[same] << ", llama.cpp chose " << expected[same] << " decisively";
  }
  return n;
}

// The default model, loaded once per test process (fails, naming the fix, when it is missing).
struct DefaultModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;

  static DefaultModel& get() {
    static DefaultModel m = [] {
      DefaultModel d;
      d.backend = make_cpu_backend(0);
      auto loaded = Model::load(default_model_path(), *d.backend);
      if (loaded.ok()) d.model = std::move(*loaded);
      else ADD_FAILURE() << loaded.status().to_string() << " — run scripts/fetch_model.sh";
      return d;
    }();
    return m;
  }
};

}  // namespace helios::testing
