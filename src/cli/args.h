// A small declarative option parser for the `helios` subcommands: each command declares its
// options with help text, and gets --help, unknown-option and bad-value errors for free.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "helios/status.h"

namespace helios::cli {

class Args {
 public:
  Args(std::string command, std::string summary, std::string usage_tail = "")
      : command_(std::move(command)), summary_(std::move(summary)), usage_tail_(std::move(usage_tail)) {}

  // `value` names the argument ("N", "PATH"); empty for a flag.
  Args& option(const std::string& name, const std::string& value, const std::string& help,
               const std::string& default_value = "");
  Args& example(const std::string& line);
  // Changes a declared option's default (a mode such as --chat implies other defaults).
  void set_default(const std::string& name, const std::string& value) { options_.at(name).default_value = value; }

  // OK, or INVALID_ARGUMENT naming the option. `help_requested()` is true after --help / -h.
  Status parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  std::string help() const;

  bool has(const std::string& name) const;
  std::string str(const std::string& name) const;  // the value or the default
  StatusOr<int64_t> integer(const std::string& name) const;
  StatusOr<double> number(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  struct Option {
    std::string value, help, default_value;
  };
  std::string command_, summary_, usage_tail_;
  std::vector<std::string> order_;
  std::map<std::string, Option> options_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::vector<std::string> examples_;
  bool help_ = false;
};

// A chat samples as llama.cpp's CLI does by default (temperature 0.8, top-k 40, top-p 0.95,
// min-p 0.05): these become the defaults of those options; any given on the command line wins.
// Greedy decoding of a small model's chat tends to loop; sampling reads like a conversation.
void use_chat_sampling_defaults(Args& args);
inline constexpr const char* kChatSamplingNote = "with --chat, or in helios chat: 0.8 / 40 / 0.95 / 0.05 (llama.cpp's CLI)";

// Prints "helios <command>: <message>" and a hint to stderr; returns the exit code 2.
int usage_error(const std::string& command, const std::string& message);
// Prints "helios <command>: <message>" to stderr; returns the exit code 1.
int fail(const std::string& command, const Status& status);

}  // namespace helios::cli
