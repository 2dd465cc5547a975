// Extending an engine's model in place (Engine::extend_layers): three requests running at fixed
// depth on a 6-layer model loaded to 3 layers are extended to 6 mid-generation. Every request
// finishes with all its tokens, those before the extension left at 3 and those after at 6; with
// kRecompute the continuation is greedy decoding on a 6-layer engine of (prompt + the tokens so
// far), with kFillFromExitStates it is what the full model computes when the earlier tokens'
// layers 4..6 K/V come from their states after layer 3 (on stories260K too, 3 to 5 layers; the test
// output says how many tokens the two modes' continuations differ in, and what each costs).
// Status, the KV pool and its gauge follow;
// depths that do not extend, and rules the deeper model cannot run, are refused with the engine
// as it was; a pool too small for a request refuses it without faulting the engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "helios/model_tools.h"
#include "unit/engine/engine_test_util.h"
#include "unit/model_setup/limited_backend.h"

#include "unit/model/six_layer_model.h"

namespace helios {
namespace {

using testing::drain;
using testing::kStoryPrompts;
using testing::Outcome;
using Clock = std::chrono::steady_clock;

constexpr int32_t kLayers = testing::kSixLayers;
constexpr int32_t kLoaded = 3;
constexpr int32_t kBlocks = 64;     // at 3 layers
constexpr int32_t kMaxTokens = 24;  // per request
constexpr int kRequests = 3;
const std::vector<int32_t> kExitsAt3 = {2};
const std::vector<int32_t> kExitsAt6 = {2, 3, 4};

std::string six_layer_model() {
  static const std::string path = testing::write_six_layer_model(7, "six_layers_engine.gguf");
  return path;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A model to extend: its file and layers, the depth it is first loaded to, and its exit points
// at that depth and once extended to all its layers.
struct Subject {
  std::string path;
  int32_t n_layers = 0;
  int32_t loaded = 0;
  std::vector<int32_t> exits_loaded, exits_full;
};

Subject synthetic() { return {six_layer_model(), kLayers, kLoaded, kExitsAt3, kExitsAt6}; }
// Trained weights, 5 layers: how close filling from exit states comes on a real model.
Subject stories() { return {testing::stories260k_path(), 5, kLoaded, {2}, {2, 3, 4}}; }

// The model loaded to `n_layers` on a LimitedBackend (one CPU thread, the same ops for every
// engine here; a loop can be held inside a pass) and an engine serving it.
struct OnLimited {
  testing::LimitedBackend backend{size_t{1} << 30};
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;

  OnLimited(const Subject& subject, int32_t n_layers, int32_t n_kv_blocks, MetricsRegistry* metrics = nullptr) {
    ModelLoadOptions o;
    o.n_layers = n_layers;
    auto m = Model::load(subject.path, backend, o);
    if (!m.ok()) {
      ADD_FAILURE() << m.status().message();
      return;
    }
    model = std::move(*m);
    const bool all = n_layers == subject.n_layers;
    EXPECT_TRUE(model->set_exits(all ? subject.exits_full : subject.exits_loaded, nullptr).ok());
    auto e = Engine::start(*model, testing::engine_options(n_kv_blocks), metrics);
    EXPECT_TRUE(e.ok()) << e.status().message();
    if (e.ok()) engine = std::move(*e);
  }
  OnLimited(int32_t n_layers, int32_t n_kv_blocks, MetricsRegistry* metrics = nullptr)
      : OnLimited(synthetic(), n_layers, n_kv_blocks, metrics) {}

  // The old pool's bytes less the new blocks': what the manager gives the pool after extending.
  int64_t pool_bytes_less(const ModelWeights& extra) const {
    return kBlocks * KvCacheStorage::bytes_per_block(model->kv_config(), 16) - extra.n_bytes;
  }
};

ExitRule at_loaded_depth() {
  ExitRule r;
  r.policy = ExitPolicy::kFixedDepth;  // depth 0: the loaded depth (the Helios mode)
  return r;
}

GenerationRequest greedy(const std::string& id, std::vector<TokenId> prompt, int32_t max_tokens,
                         ExitRule rule = at_loaded_depth()) {
  GenerationRequest r;
  r.client_id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.exit = rule;
  return r;
}

std::vector<TokenId> prompt_of(const Model& model, int i) {
  return model.tokenizer().encode(kStoryPrompts[i], true, false);
}

// Greedy decoding of n tokens by the fully loaded `model` after prompt + before, where every row
// that produced a token of `before` left at `known_layer` (0: computed through every layer) — the
// recompute an extended engine runs, then its decodes.
std::vector<TokenId> greedy_after(Model& model, const std::vector<TokenId>& prompt, const std::vector<TokenId>& before,
                                  int32_t known_layer, int32_t n) {
  auto kv = KvCacheStorage::create(model.backend(), model.kv_config(), 8, 16);
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  BlockAllocator blocks(8);
  BlockTable table;
  SequenceBatchEntry e;
  e.tokens = prompt;
  e.tokens.insert(e.tokens.end(), before.begin(), before.end());
  EXPECT_TRUE(reserve_tokens(blocks, table, static_cast<int32_t>(e.tokens.size()) + n, 16));
  e.blocks = &table;
  e.exit = at_loaded_depth();
  e.known_exit_layers.assign(e.tokens.size(), 0);
  for (size_t j = 0; j < before.size(); ++j) e.known_exit_layers[prompt.size() - 1 + j] = known_layer;
  std::vector<TokenId> out;
  for (int32_t i = 0; i < n; ++i) {
    ForwardBatch batch;
    batch.seqs.push_back(e);
    auto fr = model.forward(batch, *kv);
    EXPECT_TRUE(fr.ok()) << fr.status().message();
    if (!fr.ok()) return out;
    out.push_back(argmax(fr->row(0), fr->n_vocab));
    e.start_pos += static_cast<int32_t>(e.tokens.size());
    e.tokens = {out.back()};
    e.known_exit_layers.clear();
  }
  return out;
}

// One request's tokens split at the extension: those that left at the loaded depth, then those
// that left at the full one.
struct Split {
  std::vector<TokenId> before, after;
};

Split split_at_extension(const Outcome& o, const Subject& subject) {
  Split s;
  for (size_t j = 0; j < o.ids.size(); ++j) {
    const bool deep = o.exit_layers[j] == subject.n_layers;
    EXPECT_TRUE(deep || o.exit_layers[j] == subject.loaded) << "token " << j << " left at " << o.exit_layers[j];
    EXPECT_TRUE(deep || s.after.empty()) << "token " << j << " left at the old depth after one left deeper";
    (deep ? s.after : s.before).push_back(o.ids[j]);
  }
  return s;
}

struct ExtendedRun {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<Outcome> outcomes;
  EngineStatus before;          // status() while the loop is held, the extension queued
  EngineStatus after;           // status() once extend_layers returned
  EngineStatus end;             // ... and once every request ended
  double gauge_after = -1;      // helios_kv_blocks_total then
  int32_t blocks_expected = 0;  // kv_bytes / bytes_per_block at full depth
  double load_ms = 0;           // load_layers_range, on the test thread while the loop is held
  double extend_ms = 0;         // from the loop's release to extend_layers' return: the rest of
                                // the held step, then the extension itself
  double finish_ms = 0;         // from extend_layers' return to the last request's end
};

// Three requests at the loaded depth, extended to every layer a few steps in. Request 0 runs one
// step alone, so its extension comes one token later than the others'.
ExtendedRun run_extended(const Subject& subject, ExtendKv mode, MetricsRegistry* metrics = nullptr,
                         Gauge* gauge = nullptr) {
  ExtendedRun run;
  OnLimited s(subject, subject.loaded, kBlocks, metrics);
  if (!s.engine) return run;
  std::vector<std::shared_ptr<RequestStream>> streams;
  auto submit = [&](int i) {
    run.prompts.push_back(prompt_of(*s.model, i));
    auto stream = s.engine->submit(greedy(std::to_string(i), run.prompts.back(), kMaxTokens));
    EXPECT_TRUE(stream.ok()) << stream.status().message();
    if (stream.ok()) streams.push_back(*stream);
  };
  s.backend.pause_at_matmul(1);
  submit(0);
  s.backend.wait_until_paused();  // request 0 is alone in the first pass
  for (int i = 1; i < kRequests; ++i) submit(i);
  s.backend.pause_at_matmul(160);  // about 7 steps of 22 matmuls (3 layers of 7, the LM head) on
  s.backend.resume();
  s.backend.wait_until_paused();

  const auto t_load = Clock::now();
  auto extra = s.model->load_layers_range(subject.n_layers);
  run.load_ms = ms_since(t_load);
  EXPECT_TRUE(extra.ok()) << extra.status().message();
  if (!extra.ok()) return run;
  LayerExtension x;
  x.kv_bytes = s.pool_bytes_less(*extra);
  const ModelConfig all_layers = s.model->config();
  run.blocks_expected = static_cast<int32_t>(x.kv_bytes / KvCacheStorage::bytes_per_block(all_layers, 16));
  x.extra = std::move(*extra);
  x.exit_layers = subject.exits_full;
  x.kv = mode;
  Status extended = internal_error("not run");
  Clock::time_point t_returned;
  std::thread caller([&] {
    extended = s.engine->extend_layers(std::move(x));
    t_returned = Clock::now();
  });
  // Queued once a second extension is refused as pending (an empty one is refused otherwise).
  while (s.engine->extend_layers({}).code() != StatusCode::kFailedPrecondition) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  run.before = s.engine->status();
  EXPECT_EQ(run.before.loaded_layers, subject.loaded) << "applied between steps, not inside one";
  const auto t_release = Clock::now();
  s.backend.resume();
  caller.join();
  run.extend_ms = std::chrono::duration<double, std::milli>(t_returned - t_release).count();
  EXPECT_TRUE(extended.ok()) << extended.message();
  run.after = s.engine->status();
  if (gauge) run.gauge_after = gauge->value();
  for (const auto& stream : streams) run.outcomes.push_back(drain(*stream));
  run.finish_ms = ms_since(t_returned);
  run.end = s.engine->status();
  EXPECT_TRUE(s.engine->fault().empty()) << s.engine->fault();
  return run;
}

void expect_whole(const ExtendedRun& run, const Subject& subject) {
  ASSERT_EQ(run.outcomes.size(), static_cast<size_t>(kRequests));
  for (const Outcome& o : run.outcomes) {
    EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
    EXPECT_EQ(o.ids.size(), static_cast<size_t>(kMaxTokens));
    const Split split = split_at_extension(o, subject);
    EXPECT_GE(split.before.size(), 1u) << "extended mid-generation";
    EXPECT_GE(split.after.size(), 1u) << "extended mid-generation";
  }
  EXPECT_EQ(run.after.loaded_layers, subject.n_layers);
  EXPECT_EQ(run.after.kv_blocks_total, run.blocks_expected);
  EXPECT_EQ(run.after.exit_layer_counts.size(), static_cast<size_t>(subject.n_layers + 1));
}

// The recompute pass an extended engine runs for these requests (prompt + tokens so far each, the
// rows that produced them leaving at `known_layer`, 0: every layer), timed on the fully loaded
// model: the median of 15 runs, in ms.
double recompute_pass_ms(Model& model, const std::vector<std::vector<TokenId>>& prompts,
                         const std::vector<Split>& splits, int32_t known_layer) {
  auto kv = KvCacheStorage::create(model.backend(), model.kv_config(), 16, 16);
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  BlockAllocator blocks(16);
  std::vector<BlockTable> tables(prompts.size());
  ForwardBatch batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceBatchEntry e;
    e.tokens = prompts[i];
    e.tokens.insert(e.tokens.end(), splits[i].before.begin(), splits[i].before.end());
    EXPECT_TRUE(reserve_tokens(blocks, tables[i], static_cast<int32_t>(e.tokens.size()), 16));
    e.blocks = &tables[i];
    e.exit = at_loaded_depth();
    e.known_exit_layers.assign(e.tokens.size(), 0);
    for (size_t j = 0; j < splits[i].before.size(); ++j) e.known_exit_layers[prompts[i].size() - 1 + j] = known_layer;
    batch.seqs.push_back(std::move(e));
  }
  std::vector<double> ms;
  for (int rep = 0; rep < 15; ++rep) {
    const auto t0 = Clock::now();
    EXPECT_TRUE(model.forward(batch, *kv).ok());
    ms.push_back(ms_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Both modes on one subject: each continuation strictly checked against the full model, and how
// far filling from exit states strays from the exact K/V, printed.
void compare_modes(const Subject& subject, const char* name) {
  MetricsRegistry registry;
  Gauge* gauge = registry.gauge("helios_kv_blocks_total", "KV cache blocks, all engines: follows the pool as it grows");
  const ExtendedRun filled = run_extended(subject, ExtendKv::kFillFromExitStates, &registry, gauge);
  expect_whole(filled, subject);
  EXPECT_EQ(filled.gauge_after, filled.blocks_expected);
  EXPECT_EQ(gauge->value(), 0) << "the engine is gone, and took its new pool with it";
  const ExtendedRun exact = run_extended(subject, ExtendKv::kRecompute);
  expect_whole(exact, subject);
  ASSERT_EQ(filled.outcomes.size(), static_cast<size_t>(kRequests));
  ASSERT_EQ(exact.outcomes.size(), static_cast<size_t>(kRequests));

  OnLimited full(subject, subject.n_layers, kBlocks);
  ASSERT_TRUE(full.engine);
  int n_differ = 0, n_compared = 0;
  std::vector<Split> splits;
  for (int i = 0; i < kRequests; ++i) {
    const Split fill = split_at_extension(filled.outcomes[i], subject);
    splits.push_back(fill);
    const Split recompute = split_at_extension(exact.outcomes[i], subject);
    ASSERT_EQ(fill.before, recompute.before) << "the same tokens before the extension, at the same point";
    const auto n_after = static_cast<int32_t>(recompute.after.size());

    // kRecompute: greedy decoding on a full-depth engine of prompt + the tokens so far.
    std::vector<TokenId> prompt = exact.prompts[i];
    prompt.insert(prompt.end(), recompute.before.begin(), recompute.before.end());
    auto stream = full.engine->submit(greedy("ref" + std::to_string(i), prompt, n_after));
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    EXPECT_EQ(drain(**stream).ids, recompute.after) << "request " << i << ", extended after " << recompute.before.size();
    // kFillFromExitStates: the full model with the earlier tokens' new layers filled from their
    // states at the old depth.
    EXPECT_EQ(greedy_after(*full.model, filled.prompts[i], fill.before, subject.loaded, n_after), fill.after)
        << "request " << i;

    int n_differ_here = 0, first_difference = -1;
    for (size_t j = 0; j < fill.after.size() && j < recompute.after.size(); ++j) {
      ++n_compared;
      if (fill.after[j] == recompute.after[j]) continue;
      ++n_differ_here;
      if (first_difference < 0) first_difference = static_cast<int>(j);
    }
    n_differ += n_differ_here;
    std::printf("[ extend ] %s request %d: %zu tokens at %d layers, %d after; kFillFromExitStates differs from "
                "kRecompute at %d of them (first at %d, -1: none)\n",
                name, i, fill.before.size(), subject.loaded, n_after, n_differ_here, first_difference);
  }
  std::printf("[ extend ] %s %d -> %d layers: kFillFromExitStates vs kRecompute: %d of %d continuation tokens differ\n",
              name, subject.loaded, subject.n_layers, n_differ, n_compared);
  std::printf("[ extend ] %s timing: load_layers_range %.2f ms; extend_layers (rest of the held step + apply) "
              "%.2f ms fill / %.2f ms recompute; then to finish %d requests %.2f ms fill / %.2f ms recompute\n",
              name, filled.load_ms, filled.extend_ms, exact.extend_ms, kRequests, filled.finish_ms, exact.finish_ms);
  // Each token before the extension (the rows of the prompt's last token and of those generated
  // but the last) gets its new layers' K/V from its exit state, once.
  size_t n_known = 0;
  for (const Split& split : splits) n_known += split.before.size();
  const int64_t fill_layers = filled.end.kv_fill_layers_total - filled.before.kv_fill_layers_total;
  EXPECT_EQ(fill_layers, static_cast<int64_t>(n_known) * (subject.n_layers - subject.loaded));
  EXPECT_EQ(exact.end.kv_fill_layers_total - exact.before.kv_fill_layers_total, 0) << "nothing filled";
  full.engine.reset();  // the model is the test's alone
  std::printf("[ extend ] %s recompute pass after the extension (%d requests, full model, median of 15): "
              "%.3f ms fill (%lld token-layers filled) / %.3f ms recompute\n",
              name, kRequests, recompute_pass_ms(*full.model, exact.prompts, splits, subject.loaded),
              static_cast<long long>(fill_layers), recompute_pass_ms(*full.model, exact.prompts, splits, 0));
}

TEST(EngineLayerExtension, RequestsExtendedThreeToSixFinishAsTheFullModelContinuesThem) {
  const ExtendedRun run = run_extended(synthetic(), ExtendKv::kRecompute);
  EXPECT_EQ(run.blocks_expected, 16) << "64 blocks of 3 layers, less 3 layers of weights, in blocks of 6 layers";
  compare_modes(synthetic(), "synthetic");
}

TEST(EngineLayerExtension, OnStories260KBothModesContinueAsTheFullModelDoes) {
  compare_modes(stories(), "stories260K");
}

TEST(EngineLayerExtension, AnIdleEngineExtendsAndTheGaugeFollows) {
  MetricsRegistry registry;
  Gauge* gauge = registry.gauge("helios_kv_blocks_total", "KV cache blocks, all engines: follows the pool as it grows");
  OnLimited s(kLoaded, kBlocks, &registry);
  ASSERT_TRUE(s.engine);
  EXPECT_EQ(gauge->value(), kBlocks);
  EXPECT_EQ(s.engine->status().loaded_layers, kLoaded);
  auto extra = s.model->load_layers_range(5);
  ASSERT_TRUE(extra.ok()) << extra.status().message();
  LayerExtension x;
  x.kv_bytes = 10 * KvCacheStorage::bytes_per_block(s.model->kv_config(), 16) * 5 / 3;  // 10 blocks of 5 layers
  x.extra = std::move(*extra);
  x.exit_layers = {2, 3};
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.engine->extend_layers(std::move(x)).ok());
  std::printf("[ extend ] an idle engine extends 3 -> 5 layers in %.2f ms\n", ms_since(t0));
  const EngineStatus st = s.engine->status();
  EXPECT_EQ(st.loaded_layers, 5);
  EXPECT_EQ(st.kv_blocks_total, 10);
  EXPECT_EQ(gauge->value(), 10);
  EXPECT_NE(registry.render().find("helios_kv_blocks_total 10"), std::string::npos) << registry.render();

  // Served at the new depth: fixed-depth at 0 is 5 now, and 3 is an exit point.
  auto stream = s.engine->submit(greedy("after", prompt_of(*s.model, 0), 8));
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  const Outcome o = drain(**stream);
  EXPECT_EQ(o.ids.size(), 8u);
  for (int32_t layer : o.exit_layers) EXPECT_EQ(layer, 5);
  ExitRule at_3 = at_loaded_depth();
  at_3.depth = 3;
  EXPECT_TRUE(s.engine->submit(greedy("at-3", prompt_of(*s.model, 1), 4, at_3)).ok());

  s.engine.reset();
  EXPECT_EQ(gauge->value(), 0);
}

TEST(EngineLayerExtension, ExtensionsThatDoNotFitAreRefusedAndTheEngineServesOn) {
  OnLimited s(kLoaded, kBlocks);
  ASSERT_TRUE(s.engine);
  // Not deeper: no blocks (a load at the loaded depth is refused before it gets here).
  EXPECT_EQ(s.model->load_layers_range(kLoaded).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.engine->extend_layers({}).code(), StatusCode::kInvalidArgument);

  auto extra = s.model->load_layers_range(kLayers);
  ASSERT_TRUE(extra.ok()) << extra.status().message();
  // Under one block of the new depth.
  LayerExtension tiny;
  tiny.extra = std::move(*extra);
  tiny.exit_layers = kExitsAt6;
  tiny.kv_bytes = KvCacheStorage::bytes_per_block(s.model->kv_config(), 16);  // one block at 3 layers, half at 6
  Status st = s.engine->extend_layers(std::move(tiny));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("less than one KV block"), std::string::npos) << st.message();

  // An exit point past the new depth.
  extra = s.model->load_layers_range(kLayers);
  ASSERT_TRUE(extra.ok());
  LayerExtension bad_exit;
  bad_exit.extra = std::move(*extra);
  bad_exit.exit_layers = {2, 6};
  bad_exit.kv_bytes = 8 * KvCacheStorage::bytes_per_block(s.model->kv_config(), 16) * 2;
  st = s.engine->extend_layers(std::move(bad_exit));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("exit layer 6"), std::string::npos) << st.message();
  EXPECT_EQ(s.engine->status().loaded_layers, kLoaded);
  EXPECT_EQ(s.engine->status().kv_blocks_total, kBlocks) << "refused before anything changed";

  // A request held by the engine whose rule the new exits drop (fixed-depth at exit 2, not kept).
  s.backend.pause_at_matmul(1);
  ExitRule at_2 = at_loaded_depth();
  at_2.depth = 2;
  auto held = s.engine->submit(greedy("at-2", prompt_of(*s.model, 2), 6, at_2));
  ASSERT_TRUE(held.ok());
  s.backend.wait_until_paused();
  extra = s.model->load_layers_range(kLayers);
  ASSERT_TRUE(extra.ok());
  LayerExtension drops_2;
  drops_2.extra = std::move(*extra);
  drops_2.exit_layers = {4};
  drops_2.kv_bytes = 8 * KvCacheStorage::bytes_per_block(s.model->kv_config(), 16) * 2;
  std::thread caller([&] { st = s.engine->extend_layers(std::move(drops_2)); });
  while (s.engine->extend_layers({}).code() != StatusCode::kFailedPrecondition) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  s.backend.resume();
  caller.join();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'at-2'"), std::string::npos) << st.message();
  const Outcome o = drain(**held);
  EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
  EXPECT_EQ(o.ids.size(), 6u);
  for (int32_t layer : o.exit_layers) EXPECT_EQ(layer, 2);

  // Still serving at 3 layers, unfaulted.
  auto after = s.engine->submit(greedy("after", prompt_of(*s.model, 0), 5));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(drain(**after).ids.size(), 5u);
  EXPECT_TRUE(s.engine->fault().empty()) << s.engine->fault();
  EXPECT_EQ(s.engine->status().loaded_layers, kLoaded);
}

TEST(EngineLayerExtension, APoolTooSmallForARequestRefusesItWithoutFaulting) {
  OnLimited s(kLoaded, kBlocks);
  ASSERT_TRUE(s.engine);
  s.backend.pause_at_matmul(1);
  auto long_one = s.engine->submit(greedy("long", prompt_of(*s.model, 3), 30));  // > 16 tokens in all
  ASSERT_TRUE(long_one.ok());
  s.backend.wait_until_paused();
  auto extra = s.model->load_layers_range(kLayers);
  ASSERT_TRUE(extra.ok());
  LayerExtension one_block;
  one_block.extra = std::move(*extra);
  one_block.exit_layers = kExitsAt6;
  one_block.kv_bytes = KvCacheStorage::bytes_per_block(s.model->kv_config(), 16) * 2;  // one block of 6 layers
  Status st = internal_error("not run");
  std::thread caller([&] { st = s.engine->extend_layers(std::move(one_block)); });
  while (s.engine->extend_layers({}).code() != StatusCode::kFailedPrecondition) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  s.backend.resume();
  caller.join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(s.engine->status().kv_blocks_total, 1);
  const Outcome refused = drain(**long_one);
  EXPECT_EQ(refused.finish, FinishReason::kAborted);
  EXPECT_EQ(refused.error_code, StatusCode::kResourceExhausted) << refused.error;

  // A request that fits one block (16 tokens) is served at 6 layers.
  auto small = s.engine->submit(greedy("small", {1, 72, 101}, 8));
  ASSERT_TRUE(small.ok());
  const Outcome o = drain(**small);
  EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
  EXPECT_EQ(o.ids.size(), 8u);
  for (int32_t layer : o.exit_layers) EXPECT_EQ(layer, kLayers);
  EXPECT_TRUE(s.engine->fault().empty()) << s.engine->fault();
}

}  // namespace
}  // namespace helios
