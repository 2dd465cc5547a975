// engine: backend, threads, kv_cache, kv_cache_type, block_size, max_batched_tokens, max_seqs,
// queue_limit, preemption, swap_space, prefix_caching, device_sampling, cuda_graphs.
#include <charconv>
#include <cmath>

#include "config/sections.h"

namespace helios::config_detail {

namespace {

constexpr int32_t kMaxBlockSize = 256;

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// kv_cache is one key with two forms: a size ("2GiB", 1073741824) fills kv_cache_bytes, a
// percentage ("25%") fills kv_cache_fraction. The other field is zeroed so that exactly one of
// them is in effect.
Status read_kv_cache(const MapReader& engine, EngineConfig* out) {
  if (!engine.has("kv_cache")) return ok_status();
  const YAML::Node& node = engine.value("kv_cache");
  const std::string help =
      "expected a size such as 2GiB or 1073741824 (bytes), or a percentage of memory such as 25% "
      "(more than 0%, at most 100%)";
  if (!node.IsScalar()) return engine.error("kv_cache", help + ", got " + describe_node(node));
  const std::string text = node.Scalar();

  if (!text.empty() && text.back() == '%') {
    double percent = 0;
    const char* end = text.data() + text.size() - 1;
    auto [ptr, ec] = std::from_chars(text.data(), end, percent);
    if (ec != std::errc() || ptr != end || !std::isfinite(percent) || percent <= 0 ||
        percent > 100) {
      return engine.error("kv_cache", help + ", got '" + text + "'");
    }
    out->kv_cache_fraction = percent / 100.0;
    out->kv_cache_bytes = 0;
    return ok_status();
  }

  StatusOr<int64_t> bytes = parse_byte_size(text);
  if (!bytes.ok()) return engine.error("kv_cache", help + ", got '" + text + "'");
  if (*bytes <= 0) {
    return engine.error("kv_cache", "must be more than 0 bytes; " + help + ", got '" + text + "'");
  }
  out->kv_cache_bytes = *bytes;
  out->kv_cache_fraction = 0.0;
  return ok_status();
}

// `key` must be at least `min`, else an error that names the value.
Status check_at_least(const MapReader& engine, std::string_view key, int64_t value, int64_t min,
                      std::string_view why = "") {
  if (value >= min) return ok_status();
  std::string what = "must be at least " + std::to_string(min);
  if (!why.empty()) what += " (" + std::string(why) + ")";
  return engine.error(key, what + ", got " + std::to_string(value));
}

}  // namespace

Status read_engine_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, EngineConfig* out) {
  HELIOS_ASSIGN_OR_RETURN(
      MapReader engine,
      MapReader::open(source, node, where, "engine",
                      {"backend", "threads", "tensor_parallel", "kv_cache", "kv_cache_type", "block_size", "max_batched_tokens",
                       "max_seqs", "queue_limit", "preemption", "swap_space", "prefix_caching", "device_sampling",
                       "cuda_graphs"}));

  HELIOS_RETURN_IF_ERROR(engine.read_choice<std::string>(
      "backend", {{"cpu", "cpu"}, {"cuda", "cuda"}}, &out->backend));

  HELIOS_RETURN_IF_ERROR(engine.read_int("threads", &out->threads));
  HELIOS_RETURN_IF_ERROR(check_at_least(engine, "threads", out->threads, 0, "0 = one per core"));
  HELIOS_RETURN_IF_ERROR(engine.read_int("tensor_parallel", &out->tensor_parallel));
  HELIOS_RETURN_IF_ERROR(check_at_least(engine, "tensor_parallel", out->tensor_parallel, 1, "1 = one device"));

  HELIOS_RETURN_IF_ERROR(read_kv_cache(engine, out));

  std::string kv_type = "auto";
  HELIOS_RETURN_IF_ERROR(engine.read_choice<std::string>(
      "kv_cache_type", {{"auto", "auto"}, {"f16", "f16"}, {"f32", "f32"}, {"fp8", "fp8"}}, &kv_type));
  if (kv_type == "f16") out->kv_cache_type = kernels::KvType::kF16;
  if (kv_type == "fp8") out->kv_cache_type = kernels::KvType::kFp8E4M3;
  if (kv_type == "f32") out->kv_cache_type = kernels::KvType::kF32;

  HELIOS_RETURN_IF_ERROR(engine.read_int("block_size", &out->block_size));
  if (!is_power_of_two(out->block_size) || out->block_size > kMaxBlockSize) {
    return engine.error("block_size", "must be a power of two between 1 and " +
                                          std::to_string(kMaxBlockSize) + ", got " +
                                          std::to_string(out->block_size));
  }

  HELIOS_RETURN_IF_ERROR(engine.read_int("max_seqs", &out->max_seqs));
  HELIOS_RETURN_IF_ERROR(check_at_least(engine, "max_seqs", out->max_seqs, 1));

  HELIOS_RETURN_IF_ERROR(engine.read_int("max_batched_tokens", &out->max_batched_tokens));
  HELIOS_RETURN_IF_ERROR(check_at_least(engine, "max_batched_tokens", out->max_batched_tokens, 1));
  // Every running sequence decodes one token per step, so a step must fit max_seqs tokens.
  if (out->max_batched_tokens < out->max_seqs) {
    const std::string_view key = engine.has("max_batched_tokens") ? "max_batched_tokens"
                                                                  : "max_seqs";
    return engine.error(key, "max_batched_tokens (" + std::to_string(out->max_batched_tokens) +
                                 ") is smaller than max_seqs (" + std::to_string(out->max_seqs) +
                                 "); each sequence decodes one token per step, so raise "
                                 "max_batched_tokens or lower max_seqs");
  }

  HELIOS_RETURN_IF_ERROR(engine.read_int("queue_limit", &out->queue_limit));
  HELIOS_RETURN_IF_ERROR(check_at_least(engine, "queue_limit", out->queue_limit, 1));

  HELIOS_RETURN_IF_ERROR(engine.read_choice<PreemptionMode>(
      "preemption", {{"recompute", PreemptionMode::kRecompute}, {"swap", PreemptionMode::kSwap}},
      &out->preemption));

  HELIOS_RETURN_IF_ERROR(engine.read_byte_size("swap_space", &out->swap_space_bytes));
  if (out->preemption == PreemptionMode::kSwap && out->swap_space_bytes <= 0) {
    const std::string_view key = engine.has("swap_space") ? "swap_space" : "preemption";
    return engine.error(key, "preemption: swap needs swap_space of more than 0 bytes, got " +
                                 std::to_string(out->swap_space_bytes) +
                                 "; set swap_space (e.g. 1GiB) or use preemption: recompute");
  }
  HELIOS_RETURN_IF_ERROR(engine.read_bool("prefix_caching", &out->prefix_caching));
  std::string device_sampling = "auto";
  HELIOS_RETURN_IF_ERROR(engine.read_choice<std::string>(
      "device_sampling", {{"auto", "auto"}, {"on", "on"}, {"off", "off"}}, &device_sampling));
  if (device_sampling != "auto") out->device_sampling = device_sampling == "on";
  HELIOS_RETURN_IF_ERROR(engine.read_bool("cuda_graphs", &out->cuda_graphs));
  return ok_status();
}

}  // namespace helios::config_detail
