// Model loading and batch validation; the pass itself is in forward.cpp.
#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "helios/gguf.h"
#include "helios/model.h"

namespace helios {

struct Model::Ranks {
  std::vector<std::unique_ptr<Communicator>> comms;  // [world], rank 0's included
  std::vector<std::unique_ptr<Backend>> backends;    // ranks 1..world-1
  std::vector<std::unique_ptr<Model>> models;        // ranks 1..world-1, destroyed first
};

Model::Model(Backend& backend) : backend_(backend) {}
Model::~Model() = default;

// The largest block (in values) of a tensor kind over the file's blocks: where its columns may split.
static int32_t largest_block(const GgufFile& file, int32_t n_layer, const std::string& suffix) {
  int64_t most = 1;
  for (int32_t l = 0; l < n_layer; ++l) {
    const GgufTensorInfo* t = file.find_tensor("blk." + std::to_string(l) + "." + suffix);
    if (!t) continue;
    if (auto traits = tensor_type_traits(static_cast<uint32_t>(t->type))) most = std::max(most, traits->block_elems);
  }
  return static_cast<int32_t>(most);
}

StatusOr<std::unique_ptr<Model>> Model::load(const std::string& path, Backend& backend,
                                             const ModelLoadOptions& options) {
  HELIOS_ASSIGN_OR_RETURN(auto file, GgufFile::open(path));
  HELIOS_ASSIGN_OR_RETURN(const ModelConfig config, model_config_from_gguf(*file, options.rope_scaling));
  HELIOS_ASSIGN_OR_RETURN(auto spec, tokenizer_spec_from_gguf(*file));
  if (static_cast<int32_t>(spec.tokens.size()) != config.n_vocab) {
    return invalid_argument(path + ": the tokenizer has " + std::to_string(spec.tokens.size()) +
                            " tokens but token_embd.weight has " + std::to_string(config.n_vocab) + " rows");
  }
  const int32_t world = options.tensor_parallel;
  if (world < 1) return invalid_argument("tensor_parallel must be >= 1, got " + std::to_string(world));
  std::unique_ptr<Ranks> ranks;
  std::vector<Backend*> rank_backends{&backend};
  std::vector<ShardSpec> shards(1);
  if (world > 1) {
    if (!options.make_rank_backend) return invalid_argument("tensor_parallel " + std::to_string(world) + " needs a backend for each rank");
    const int32_t ff_granule = largest_block(*file, config.n_layer, "ffn_down.weight");
    const int32_t o_granule = largest_block(*file, config.n_layer, "attn_output.weight");
    shards.clear();
    for (int32_t r = 0; r < world; ++r) {
      HELIOS_ASSIGN_OR_RETURN(ShardSpec s, plan_shard(config, r, world, ff_granule, o_granule));
      shards.push_back(s);
    }
    ranks = std::make_unique<Ranks>();
    for (int32_t r = 1; r < world; ++r) {
      HELIOS_ASSIGN_OR_RETURN(auto b, options.make_rank_backend(r));
      rank_backends.push_back(b.get());
      ranks->backends.push_back(std::move(b));
    }
    HELIOS_ASSIGN_OR_RETURN(ranks->comms, make_communicators(rank_backends));
  }
  std::vector<std::unique_ptr<Model>> models;
  for (int32_t r = 0; r < world; ++r) {
    std::unique_ptr<Model> m(new Model(*rank_backends[r]));
    m->model_config_ = config;
    m->shard_ = shards[r];
    m->config_ = shard_config(config, shards[r]);
    HELIOS_RETURN_IF_ERROR(rank_backends[r]->check_attention_shape(m->config_.n_head, m->config_.n_head_kv,
                                                                   m->config_.head_dim));
    if (ranks) m->comm_ = ranks->comms[r].get();
    HELIOS_ASSIGN_OR_RETURN(m->weights_, load_weights(*file, config, *rank_backends[r], options.n_layers,
                                                      r == 0 ? options.progress : nullptr, shards[r]));
    m->path_ = path;
    models.push_back(std::move(m));
  }
  std::unique_ptr<Model> m = std::move(models[0]);
  HELIOS_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::create(std::move(spec)));
  if (ranks) {
    for (int32_t r = 1; r < world; ++r) ranks->models.push_back(std::move(models[r]));
    m->ranks_ = std::move(ranks);
  }
  return m;
}

StatusOr<KvCacheStorage> Model::create_kv(int32_t n_blocks, int32_t block_size, kernels::KvType type) const {
  HELIOS_ASSIGN_OR_RETURN(KvCacheStorage kv, KvCacheStorage::create(backend_, kv_config(), n_blocks, block_size, type));
  if (ranks_) {
    for (const auto& peer : ranks_->models) {
      HELIOS_ASSIGN_OR_RETURN(KvCacheStorage s, KvCacheStorage::create(peer->backend_, peer->kv_config(), n_blocks,
                                                                       block_size, type));
      kv.add_shard(std::move(s));
    }
  }
  return kv;
}

Status Model::reserve_workspace(int32_t n_tokens) {
  HELIOS_RETURN_IF_ERROR(reserve_own_workspace(n_tokens));
  if (ranks_) {
    for (const auto& peer : ranks_->models) HELIOS_RETURN_IF_ERROR(peer->reserve_workspace(n_tokens));
  }
  return ok_status();
}

StatusOr<ForwardResult> Model::forward(const ForwardBatch& batch, KvCacheStorage& kv) {
  if (!ranks_) return forward_rank(batch, kv);
  if (kv.n_shards() != shard_.world) {
    return invalid_argument("a model on " + std::to_string(shard_.world) + " tensor-parallel ranks needs a KV cache "
                            "with a shard for each (Model::create_kv); this one has " + std::to_string(kv.n_shards()));
  }
  // A rank whose device has faulted would leave the pass at its start while the others wait in
  // their first collective until it aborts them: such a pass does not start.
  HELIOS_RETURN_IF_ERROR(backend_.error());
  for (const auto& peer : ranks_->models) HELIOS_RETURN_IF_ERROR(peer->backend().error());
  // Every rank runs the same pass on its own thread; a rank that fails opens the others'
  // collectives so that none waits for it.
  const size_t n_peers = ranks_->models.size();
  std::vector<Status> peer_status(n_peers, ok_status());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n_peers; ++i) {
    threads.emplace_back([&, i] {
      auto r = ranks_->models[i]->forward_rank(batch, kv.shard(static_cast<int32_t>(i + 1)));
      if (!r.ok()) {
        peer_status[i] = r.status();
        ranks_->comms[i + 1]->abort();
      }
    });
  }
  auto own = forward_rank(batch, kv);
  if (!own.ok()) comm_->abort();
  for (auto& t : threads) t.join();
  comm_->reset();
  for (const Status& s : peer_status) {
    if (!s.ok()) return s;
  }
  for (const auto& comm : ranks_->comms) HELIOS_RETURN_IF_ERROR(comm->error());
  return own;
}

// ---- Extending the loaded prefix ------------------------------------------------------------

static Status check_new_depth(int32_t new_depth, int32_t loaded, int32_t n_layer) {
  if (new_depth > loaded && new_depth <= n_layer) return ok_status();
  return invalid_argument("a model loaded to " + std::to_string(loaded) + " of " + std::to_string(n_layer) +
                          " layers extends to " + std::to_string(loaded + 1) + ".." + std::to_string(n_layer) +
                          " layers; got " + std::to_string(new_depth));
}

// Extending a tensor-parallel model would extend every rank together; not done yet.
static Status check_one_rank(const ShardSpec& shard) {
  if (!shard.sharded()) return ok_status();
  return failed_precondition("a model loaded on " + std::to_string(shard.world) +
                             " tensor-parallel ranks is loaded to its full depth; it cannot be extended");
}

StatusOr<ModelWeights> Model::load_layers_range(int32_t new_depth) const {
  HELIOS_RETURN_IF_ERROR(check_one_rank(shard_));
  HELIOS_RETURN_IF_ERROR(check_new_depth(new_depth, n_layers_loaded(), config_.n_layer));
  // Opened again: the mapping Model::load used is gone, and the file is only read here.
  HELIOS_ASSIGN_OR_RETURN(auto file, GgufFile::open(path_));
  return load_layer_range(*file, config_, backend_, n_layers_loaded(), new_depth);
}

Status Model::append_layers(ModelWeights extra, const std::vector<int32_t>& exit_layers, const ExitHeadSet* heads) {
  HELIOS_RETURN_IF_ERROR(check_one_rank(shard_));
  const int32_t depth = n_layers_loaded() + static_cast<int32_t>(extra.layers.size());
  HELIOS_RETURN_IF_ERROR(check_new_depth(depth, n_layers_loaded(), config_.n_layer));
  // The heads first: a failure there leaves the model as it was.
  HELIOS_ASSIGN_OR_RETURN(ExitHeadsAt new_heads, make_exit_heads(depth, exit_layers, heads));
  for (LayerWeights& layer : extra.layers) weights_.layers.push_back(std::move(layer));
  weights_.n_params += extra.n_params;
  weights_.n_bytes += extra.n_bytes;
  install_exits(exit_layers, std::move(new_heads));
  return ok_status();
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
    if (e.draw && e.top1_only) return invalid_argument(where + "a draw and top1_only: the row is one or the other");
    if (e.draw && (batch.head_vocab > 0 || batch.last_layer > 0)) {
      return invalid_argument(where + "a draw in a partial pass or over a cut head (drafts take their top-1)");
    }
  }
  return ok_status();
}

// ---- Exits -----------------------------------------------------------------------------------

Status Model::set_exits(const std::vector<int32_t>& exit_layers, const ExitHeadSet* fitted) {
  HELIOS_ASSIGN_OR_RETURN(ExitHeadsAt heads, make_exit_heads(n_layers_loaded(), exit_layers, fitted));
  if (ranks_) {  // every rank runs the exit heads (replicated) and must leave at the same points
    for (const auto& peer : ranks_->models) HELIOS_RETURN_IF_ERROR(peer->set_exits(exit_layers, fitted));
  }
  install_exits(exit_layers, std::move(heads));
  return ok_status();
}

StatusOr<std::shared_ptr<ExitMlp>> ExitMlp::upload(Backend& backend, const ResidualMlp& mlp, int32_t n_embd,
                                                    const std::string& name) {
  const auto h = static_cast<size_t>(mlp.hidden), d = static_cast<size_t>(n_embd);
  if (mlp.hidden < 1 || mlp.gate.size() != h * d || mlp.up.size() != h * d || mlp.down.size() != h * d) {
    return invalid_argument(name + ": an MLP of hidden width " + std::to_string(mlp.hidden) +
                            " needs gate and up [hidden, n_embd] and down [n_embd, hidden] (n_embd " +
                            std::to_string(n_embd) + ")");
  }
  auto out = std::make_shared<ExitMlp>();
  out->hidden = mlp.hidden;
  HELIOS_ASSIGN_OR_RETURN(out->gate, upload_matrix(backend, name + ".gate", mlp.gate.data(), mlp.hidden, n_embd));
  HELIOS_ASSIGN_OR_RETURN(out->up, upload_matrix(backend, name + ".up", mlp.up.data(), mlp.hidden, n_embd));
  HELIOS_ASSIGN_OR_RETURN(out->down, upload_matrix(backend, name + ".down", mlp.down.data(), n_embd, mlp.hidden));
  out->ones = Buffer(&backend, d);
  out->work = Buffer(&backend, static_cast<size_t>(kRows) * (d + 2 * h));
  if (out->ones.empty() || out->work.empty()) return resource_exhausted("no backend memory for " + name);
  const std::vector<float> ones(d, 1.0f);
  backend.upload(out->ones.data(), ones.data(), d);
  return out;
}

StatusOr<std::shared_ptr<Model::ExitHead>> Model::make_exit_head(int32_t layer, const ExitHeadParams* params,
                                                                  const std::string& name) const {
  const ModelConfig& c = config_;
  auto head = std::make_shared<ExitHead>();
  if (params) {
    head->params = *params;
    if (!params->adapter_weight.empty()) {
      HELIOS_ASSIGN_OR_RETURN(head->adapter, upload_matrix(backend_, name + ".adapter", params->adapter_weight.data(),
                                                           c.n_embd, c.n_embd));
      head->bias = Buffer(&backend_, c.n_embd);
      if (head->bias.empty()) return resource_exhausted("no backend memory for " + name + ".adapter");
      backend_.upload(head->bias.data(), params->adapter_bias.data(), c.n_embd);
    }
    if (!params->token_weight.empty()) {
      HELIOS_ASSIGN_OR_RETURN(head->token_map, upload_matrix(backend_, name + ".token", params->token_weight.data(),
                                                             c.n_embd, c.n_embd));
    }
    if (!params->mlp.empty()) {
      HELIOS_ASSIGN_OR_RETURN(head->mlp, ExitMlp::upload(backend_, params->mlp, c.n_embd, name + ".mlp"));
    }
  }
  head->params.layer = layer;
  return head;
}

StatusOr<Model::ExitHeadsAt> Model::make_exit_heads(int32_t depth, const std::vector<int32_t>& exit_layers,
                                                    const ExitHeadSet* fitted) const {
  const ModelConfig& c = config_;
  ExitHeadsAt out;
  out.heads.resize(depth + 1);
  for (int32_t layer : exit_layers) {
    if (layer < 1 || layer >= depth) {
      return invalid_argument("exit layer " + std::to_string(layer) + " is outside 1.." +
                              std::to_string(depth - 1) + " (the loaded layers but the last)");
    }
  }
  // Heads: every exit point, and the loaded depth when it is short of the model (its head is an
  // exit head too).
  std::vector<int32_t> with_head = exit_layers;
  if (depth < c.n_layer) with_head.push_back(depth);
  for (int32_t layer : with_head) {
    HELIOS_ASSIGN_OR_RETURN(out.heads[layer], make_exit_head(layer, fitted ? fitted->find(layer) : nullptr,
                                                             "exit." + std::to_string(layer)));
  }
  // The lookahead head reads the last layer of the whole model; on one rank, as its LM head runs
  // outside the forward pass.
  if (fitted && fitted->has_lookahead && depth == c.n_layer && shard_.world == 1) {
    HELIOS_ASSIGN_OR_RETURN(out.lookahead, make_exit_head(c.n_layer, &fitted->lookahead, "lookahead"));
  }
  return out;
}

void Model::install_exits(std::vector<int32_t> exit_layers, ExitHeadsAt heads) {
  std::sort(exit_layers.begin(), exit_layers.end());
  exit_layers.erase(std::unique(exit_layers.begin(), exit_layers.end()), exit_layers.end());
  exit_layers_ = std::move(exit_layers);
  exit_heads_ = std::move(heads.heads);
  lookahead_ = std::move(heads.lookahead);
}

StatusOr<std::vector<float>> Model::embed(const TokenId* tokens, int32_t n) const {
  const ModelConfig& c = config_;
  std::vector<float> out(static_cast<size_t>(std::max(n, 0)) * c.n_embd);
  if (n <= 0) return out;
  for (int32_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      return invalid_argument("token id " + std::to_string(tokens[i]) + " outside the vocabulary (0.." +
                              std::to_string(c.n_vocab - 1) + ")");
    }
  }
  Buffer rows(&backend_, out.size());
  if (rows.empty()) return resource_exhausted("no backend memory for " + std::to_string(n) + " embeddings");
  backend_.embedding_rows(tokens, n, weights_.tok_embd.view, rows.data());
  backend_.download(out.data(), rows.data(), out.size());
  HELIOS_RETURN_IF_ERROR(backend_.error());
  return out;
}

StatusOr<std::vector<ExitObservation>> Model::lookahead(const float* states, const TokenId* tokens, int32_t n,
                                                        int32_t vocab) const {
  const ModelConfig& c = config_;
  if (!lookahead_) return failed_precondition("the model has no lookahead head (helios calibrate --lookahead)");
  if (vocab < 0 || vocab > c.n_vocab) {
    return invalid_argument("lookahead vocab " + std::to_string(vocab) + " outside 0.." + std::to_string(c.n_vocab));
  }
  const int32_t width = vocab > 0 ? vocab : c.n_vocab;
  std::vector<ExitObservation> out(static_cast<size_t>(std::max(n, 0)));
  if (n <= 0) return out;
  const ExitHead& h = *lookahead_;
  const bool adapted = h.adapter.view.data != nullptr, token_mapped = h.token_map.view.data != nullptr;
  const size_t rows_size = static_cast<size_t>(n) * c.n_embd;
  Buffer in(&backend_, rows_size), a(&backend_, rows_size), scratch(&backend_, rows_size);
  Buffer logits(&backend_, static_cast<size_t>(n) * std::max(width, c.n_embd));
  if (in.empty() || a.empty() || scratch.empty() || logits.empty()) {
    return resource_exhausted("no backend memory for the lookahead head on " + std::to_string(n) + " rows");
  }
  // a = W h + b + U e(token), then the head's MLP, final norm and LM head.
  backend_.upload(in.data(), states, rows_size);
  float* head_in = in.data();
  if (adapted) {
    backend_.matmul(in.data(), h.adapter.view, n, a.data());
    backend_.add_rows(a.data(), h.bias.data(), n, c.n_embd);
    head_in = a.data();
  }
  if (token_mapped) {
    HELIOS_ASSIGN_OR_RETURN(std::vector<float> e, embed(tokens, n));
    backend_.upload(scratch.data(), e.data(), rows_size);
    backend_.matmul(scratch.data(), h.token_map.view, n, logits.data());  // U e, in the logits' room
    backend_.add(head_in, logits.data(), static_cast<int64_t>(rows_size));
  }
  apply_exit_head(head_in, n, nullptr, nullptr, h.mlp.get(), scratch.data(), logits.data(), vocab);
  std::vector<int32_t> top1(n);
  std::vector<float> prob(n), margin(n), entropy(n);
  backend_.exit_stats(logits.data(), n, width, top1.data(), prob.data(), margin.data(), entropy.data());
  HELIOS_RETURN_IF_ERROR(backend_.error());
  for (int32_t r = 0; r < n; ++r) out[r] = {top1[r], prob[r]};
  return out;
}

const std::vector<int32_t>& Model::exit_layers() const { return exit_layers_; }

bool Model::is_exit_point(int32_t layer) const {
  return std::binary_search(exit_layers_.begin(), exit_layers_.end(), layer);
}

ExitRule Model::resolve_exit_rule(ExitRule rule) const {
  if (rule.calibrated_thresholds) {
    rule.exit_thresholds.clear();
    for (int32_t l : exit_layers_) {
      const float t = exit_heads_[l]->params.threshold;
      if (t > 0) rule.exit_thresholds.push_back({l, t});
    }
  }
  if (rule.depth == 0 && rule.policy == ExitPolicy::kFixedDepth) rule.depth = n_layers_loaded();
  if (rule.depth == 0 && rule.policy == ExitPolicy::kSelfSpeculative) {
    if (!exit_layers_.empty()) rule.depth = exit_layers_.front();
    else if (lookahead_) rule.depth = n_layers_loaded();
  }
  return rule;
}

namespace {

// The exits a rule is checked against: a model loaded to `depth` with exit points `points`
// (sorted), whose head at an exit point has the calibration `params(layer)` (nullptr: none).
struct ExitPointsView {
  int32_t depth = 0;
  const std::vector<int32_t>& points;
  std::function<const ExitHeadParams*(int32_t)> params;
  bool lookahead = false;  // a lookahead head on the last layer (at `depth`)

  bool is_point(int32_t layer) const { return std::binary_search(points.begin(), points.end(), layer); }
  bool all_points(const std::function<bool(const ExitHeadParams&)>& has, int32_t* missing) const {
    for (int32_t l : points) {
      const ExitHeadParams* p = params(l);
      if (!p || !has(*p)) {
        *missing = l;
        return false;
      }
    }
    return true;
  }
};

Status check_rule(ExitRule rule, const ExitPointsView& exits) {
  if (rule.depth == 0 && rule.policy == ExitPolicy::kFixedDepth) rule.depth = exits.depth;
  if (rule.depth == 0 && rule.policy == ExitPolicy::kSelfSpeculative) {
    if (!exits.points.empty()) rule.depth = exits.points.front();
    else if (exits.lookahead) rule.depth = exits.depth;
  }
  const std::string name = exit_policy_name(rule.policy);
  const std::string points = exits.points.empty() ? "none are configured" : [&] {
    std::string s;
    for (int32_t l : exits.points) s += (s.empty() ? "" : ", ") + std::to_string(l);
    return "the exit points are " + s;
  }();
  if (!(rule.threshold >= 0.0f) || std::isnan(rule.threshold)) {
    return invalid_argument("exit threshold must be >= 0, got " + std::to_string(rule.threshold));
  }
  int32_t missing = 0;
  switch (rule.policy) {
    case ExitPolicy::kFull:
      return ok_status();
    case ExitPolicy::kFixedDepth:
      if (rule.depth == exits.depth || exits.is_point(rule.depth)) return ok_status();
      return invalid_argument("fixed-depth needs a depth that is an exit point or the loaded depth (" +
                              std::to_string(exits.depth) + "); got " + std::to_string(rule.depth) +
                              ", and " + points);
    case ExitPolicy::kSelfSpeculative:
      if (rule.depth == exits.depth && rule.depth > 0) {  // drafts with the lookahead head, one per pass
        if (!exits.lookahead) {
          return invalid_argument("self-speculative at the loaded depth (" + std::to_string(exits.depth) +
                                  ") drafts with a lookahead head, and the model has none: fit one with "
                                  "`helios calibrate --lookahead` and load the whole model on one rank, or draft at "
                                  "an exit point (" + points + ")");
        }
      } else if (!exits.is_point(rule.depth)) {
        return invalid_argument("self-speculative drafts at an exit point (depth); got " +
                                std::to_string(rule.depth) + ", and " + points);
      }
      if (rule.draft_tokens < 1 || rule.draft_tokens > kMaxDraftTokens) {
        return invalid_argument("self-speculative draft_tokens must be 1.." + std::to_string(kMaxDraftTokens) +
                                ", got " + std::to_string(rule.draft_tokens));
      }
      if (rule.draft_vocab < 0 || rule.draft_vocab % 64 != 0) {
        return invalid_argument("self-speculative draft_vocab must be 0 (the whole vocabulary) or a multiple of 64, "
                                "got " + std::to_string(rule.draft_vocab));
      }
      return ok_status();
    case ExitPolicy::kPerToken:
    case ExitPolicy::kBatchSync:
      if (exits.points.empty()) return invalid_argument(name + " needs exit points; " + points);
      if (rule.calibrated_thresholds) {
        if (rule.measure != ConfidenceMeasure::kTop1Prob) {
          return invalid_argument("calibrated thresholds are top-1 probabilities: use the top1 measure");
        }
        if (!exits.all_points([](const ExitHeadParams& p) { return p.threshold > 0; }, &missing)) {
          return invalid_argument("calibrated thresholds need `helios calibrate` heads with thresholds; layer " +
                                  std::to_string(missing) + " has none");
        }
      }
      if (rule.measure == ConfidenceMeasure::kProbe &&
          !exits.all_points([](const ExitHeadParams& p) { return !p.probe_weight.empty(); }, &missing)) {
        return invalid_argument("the probe measure needs a calibrated probe at every exit; layer " +
                                std::to_string(missing) + " has none (run `helios calibrate` and set the heads file)");
      }
      if (rule.measure == ConfidenceMeasure::kAgreement &&
          !exits.all_points([](const ExitHeadParams& p) { return !p.curve_prob.empty(); }, &missing)) {
        return invalid_argument("the agreement measure needs `helios calibrate` heads with agreement curves; layer " +
                                std::to_string(missing) + " has none (calibrate again and set the heads file)");
      }
      return ok_status();
  }
  return ok_status();
}

}  // namespace

Status Model::check_exit_rule(const ExitRule& rule) const {
  const ExitPointsView exits{n_layers_loaded(), exit_layers_,
                             [this](int32_t l) -> const ExitHeadParams* {
                               return exit_heads_[l] ? &exit_heads_[l]->params : nullptr;
                             },
                             lookahead_ != nullptr};
  return check_rule(rule, exits);
}

Status Model::check_exit_rule_at(const ExitRule& rule, int32_t depth, const std::vector<int32_t>& exit_layers,
                                 const ExitHeadSet* heads) const {
  std::vector<int32_t> points = exit_layers;
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  const ExitPointsView exits{depth, points, [heads](int32_t l) { return heads ? heads->find(l) : nullptr; },
                             heads && heads->has_lookahead && depth == config_.n_layer && shard_.world == 1};
  return check_rule(rule, exits);
}

Status Model::check_partial_pass(const ForwardBatch& batch) const {
  const int32_t loaded = n_layers_loaded();
  if (batch.last_layer < 0 || batch.last_layer > loaded) {
    return invalid_argument("last_layer " + std::to_string(batch.last_layer) + " outside 0.." + std::to_string(loaded));
  }
  const int32_t end = batch.last_layer > 0 ? batch.last_layer : loaded;
  if (batch.first_layer < 0 || batch.first_layer >= end) {
    return invalid_argument("first_layer " + std::to_string(batch.first_layer) + " outside 0.." + std::to_string(end - 1));
  }
  if ((batch.first_layer > 0) != (batch.hidden_in != nullptr)) {
    return invalid_argument("a pass that starts after layer 0 needs hidden_in, and only such a pass takes it");
  }
  for (int32_t l : batch.capture_layers) {
    if (l < 1 || l > loaded) return invalid_argument("capture layer " + std::to_string(l) + " outside 1.." + std::to_string(loaded));
  }
  if (batch.head_vocab != 0 && (batch.head_vocab < 0 || batch.head_vocab % 64 != 0 || batch.head_vocab > config_.n_vocab)) {
    return invalid_argument("head_vocab " + std::to_string(batch.head_vocab) + " must be a multiple of 64 up to " +
                            std::to_string(config_.n_vocab) + " (or 0)");
  }
  const bool partial = batch.first_layer > 0 || batch.last_layer > 0;
  for (const auto& e : batch.seqs) {
    if (e.exit.policy == ExitPolicy::kFull || e.exit.policy == ExitPolicy::kSelfSpeculative) continue;
    if (partial) return invalid_argument("a partial pass (first_layer/last_layer) runs only full-depth rules");
    HELIOS_RETURN_IF_ERROR(check_exit_rule(e.exit));
  }
  return ok_status();
}

}  // namespace helios
