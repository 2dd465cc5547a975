// Status and StatusOr: how every module boundary reports failure.
// Bad input is a Status, never an abort; assert() is only for internal invariants.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace helios {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kOutOfRange,
  kFailedPrecondition,
  kResourceExhausted,
  kUnavailable,
  kUnimplemented,
  kDataLoss,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: <message>"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status already_exists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }
  StatusOr(T value) : v_(std::move(value)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace helios

#define HELIOS_CONCAT_INNER(a, b) a##b
#define HELIOS_CONCAT(a, b) HELIOS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define HELIOS_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::helios::Status helios_status_ = (expr);   \
    if (!helios_status_.ok()) return helios_status_; \
  } while (0)

// `HELIOS_ASSIGN_OR_RETURN(auto x, make_x());`
#define HELIOS_ASSIGN_OR_RETURN(lhs, expr) \
  HELIOS_ASSIGN_OR_RETURN_IMPL(HELIOS_CONCAT(helios_or_, __LINE__), lhs, expr)
#define HELIOS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
