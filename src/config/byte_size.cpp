// parse_byte_size: "512MiB", "2GB", "1.5 GiB", "1073741824" → bytes.
// KB/MB/GB/TB are powers of 1000 and KiB/MiB/GiB/TiB powers of 1024, as their standards say;
// units are case-insensitive. A fraction is allowed when the result is a whole number of bytes.
#include <cctype>
#include <charconv>
#include <cmath>
#include <string_view>

#include "helios/config.h"

namespace helios {

namespace {

struct Unit {
  std::string_view name;
  int64_t bytes;
};

constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000LL * 1000 * 1000},
    {"tb", 1000LL * 1000 * 1000 * 1000},
    {"kib", 1LL << 10},
    {"mib", 1LL << 20},
    {"gib", 1LL << 30},
    {"tib", 1LL << 40},
};

constexpr std::string_view kSyntax =
    "expected a number of bytes with an optional unit: B, KB, MB, GB, TB (powers of 1000) or "
    "KiB, MiB, GiB, TiB (powers of 1024), e.g. 512MiB or 2GB";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

StatusOr<int64_t> parse_byte_size(const std::string& text) {
  const std::string_view all = trim(text);
  const auto bad = [&](std::string_view why) {
    return invalid_argument("'" + text + "' is not a size: " + std::string(why));
  };
  if (all.empty()) return bad(kSyntax);
  if (all.front() == '-') return bad("sizes cannot be negative");

  // The number: digits with an optional fraction.
  size_t n_number = 0;
  while (n_number < all.size() &&
         (std::isdigit(static_cast<unsigned char>(all[n_number])) || all[n_number] == '.')) {
    ++n_number;
  }
  const std::string_view number = all.substr(0, n_number);
  std::string unit(trim(all.substr(n_number)));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));

  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (u.name == unit) found = &u;
  }
  if (number.empty() || found == nullptr) return bad(kSyntax);

  if (number.find('.') == std::string_view::npos) {
    int64_t count = 0;
    auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), count);
    if (ec == std::errc::result_out_of_range ||
        (ec == std::errc() && count > INT64_MAX / found->bytes)) {
      return bad("too large; the most is 8EiB");
    }
    if (ec != std::errc() || ptr != number.data() + number.size()) return bad(kSyntax);
    return count * found->bytes;
  }

  double count = 0;
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), count);
  if (ec != std::errc() || ptr != number.data() + number.size()) return bad(kSyntax);
  const long double bytes = static_cast<long double>(count) * found->bytes;
  if (bytes >= 9.2e18L) return bad("too large; the most is 8EiB");
  if (bytes != std::floor(bytes)) {
    return bad("not a whole number of bytes (" + std::to_string(static_cast<double>(bytes)) + ")");
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace helios
