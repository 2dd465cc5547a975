#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace helios::cli {

Args& Args::option(const std::string& name, const std::string& value, const std::string& help,
                   const std::string& default_value) {
  order_.push_back(name);
  options_[name] = {value, help, default_value};
  return *this;
}

Args& Args::example(const std::string& line) {
  examples_.push_back(line);
  return *this;
}

Status Args::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = options_.find(name);
    if (it == options_.end()) {
      return invalid_argument("unknown option '--" + name + "' (see 'helios " + command_ + " --help')");
    }
    if (it->second.value.empty()) {
      if (inline_value) return invalid_argument("option '--" + name + "' takes no value");
      values_[name] = "1";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) return invalid_argument("option '--" + name + "' needs a value " + it->second.value);
      value = argv[++i];
    }
    values_[name] = value;
  }
  return ok_status();
}

std::string Args::help() const {
  std::string out = "usage: helios " + command_ + (options_.empty() ? "" : " [options]") +
                    (usage_tail_.empty() ? "" : " " + usage_tail_) + "\n\n" + summary_ + "\n";
  if (!order_.empty()) out += "\noptions:\n";
  for (const auto& name : order_) {
    const Option& o = options_.at(name);
    std::string left = "  --" + name + (o.value.empty() ? "" : " " + o.value);
    if (left.size() < 26) left.resize(26, ' ');
    else left += "\n" + std::string(26, ' ');
    out += left + o.help;
    if (!o.default_value.empty()) out += " (default: " + o.default_value + ")";
    out += "\n";
  }
  out += "  -h, --help              show this help\n";
  if (!examples_.empty()) {
    out += "\nexamples:\n";
    for (const auto& e : examples_) out += "  " + e + "\n";
  }
  return out;
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::str(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  auto o = options_.find(name);
  return o == options_.end() ? "" : o->second.default_value;
}

StatusOr<int64_t> Args::integer(const std::string& name) const {
  const std::string s = str(name);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) {
    return invalid_argument("--" + name + " needs a whole number, got '" + s + "'");
  }
  return static_cast<int64_t>(v);
}

StatusOr<double> Args::number(const std::string& name) const {
  const std::string s = str(name);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') return invalid_argument("--" + name + " needs a number, got '" + s + "'");
  return v;
}

int usage_error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "helios %s: %s\n", command.c_str(), message.c_str());
  return 2;
}

int fail(const std::string& command, const Status& status) {
  std::fprintf(stderr, "helios %s: %s\n", command.c_str(), status.message().c_str());
  return 1;
}

void use_chat_sampling_defaults(Args& args) {
  args.set_default("temperature", "0.8");
  args.set_default("top-k", "40");
  args.set_default("top-p", "0.95");
  args.set_default("min-p", "0.05");
}

}  // namespace helios::cli
