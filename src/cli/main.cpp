// `helios`: model tools and generation from the command line.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "common/cpu_check.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"generate", helios::cli::cmd_generate, "generate text from a prompt with a local model"},
    {"calibrate", helios::cli::cmd_calibrate, "fit exit heads (adapters, probes) on calibration text"},
    {"profile", helios::cli::cmd_profile, "where exits agree with the last layer: agreement, thresholds, the confidence curve"},
    {"score", helios::cli::cmd_score, "judge a helios-bench report's outputs with one model: perplexity and agreement"},
    {"eval", helios::cli::cmd_eval, "compare early-exit policies with the full model: perplexity, agreement, speed"},
    {"inspect", helios::cli::cmd_inspect, "show a GGUF file's metadata, tensors and size"},
    {"convert-llama2c", helios::cli::cmd_convert_llama2c, "convert a llama2.c checkpoint to GGUF"},
    {"make-synthetic", helios::cli::cmd_make_synthetic, "write a seeded random-weight model of any shape"},
#if defined(HELIOS_WITH_GRPC)
    {"complete", helios::cli::cmd_complete, "stream a completion from a running heliosd"},
    {"chat", helios::cli::cmd_chat, "chat with a model on a running heliosd (--calculator: a session with a tool)"},
    {"status", helios::cli::cmd_status, "show a running heliosd's queues, KV cache and models"},
#endif
};

void print_help() {
  std::printf(
      "usage: helios <command> [options]\n\n"
      "Helios: an inference engine for early-exit LLMs. Commands:\n\n");
  for (const auto& c : kCommands) std::printf("  %-18s %s\n", c.name, c.summary);
  std::printf(
      "\n'helios <command> --help' explains a command's options.\n\n"
      "example:\n"
      "  helios generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \\\n"
      "      --prompt \"What is the capital of France?\"\n"
      "  helios calibrate --exits 4,8,12,16,20,24,28 --text prompts.json   # writes MODEL.exits.gguf\n"
      "  helios eval --text held_out.json --policy per-token,self-speculative --threshold 0.7,0.9\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (!helios::check_cpu_features("helios")) return 1;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "helios: unknown command '%s' (see 'helios --help' for the commands)\n", argv[1]);
  return 2;
}
