// Status and Result<T>: the one error type that crosses library boundaries.
//
// A Status is ok or carries a code and a message that names what failed and with which
// value ("config.json: field 'hidden_size' must be > 0, got -3"). Result<T> holds a T or
// a non-ok Status. Both are [[nodiscard]]; no exceptions cross library boundaries.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "base/check.h"

namespace xds {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad flag, malformed request)
  kNotFound,            // a file, tensor or key that must exist does not
  kDataLoss,            // a file is truncated or corrupt
  kUnimplemented,       // valid input that this build does not support
  kFailedPrecondition,  // the system is not in a state to do this
  kResourceExhausted,   // out of memory, slots, blocks
  kDeadlineExceeded,    // a wait ran past its deadline
  kUnavailable,         // a peer is dead or unreachable
  kAborted,             // the operation was aborted (poisoned epoch, cancelled step)
  kCancelled,           // the caller cancelled it
  kAbandoned,           // given up by every party together, nothing of it kept: retry it
                        // (an XCCL step attempt after a transient error, xccl/mailbox.h)
  kInternal,            // a bug or an unexpected system error
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: config.json: field ..." (or "OK").
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builders: xds::invalid_argument("field '{}' must be > 0, got {}", name, v).
#define XDS_DEFINE_STATUS_BUILDER(fn, code)                                       \
  template <typename... Args>                                                     \
  Status fn(fmt::format_string<Args...> f, Args&&... args) {                      \
    return Status(StatusCode::code, fmt::format(f, std::forward<Args>(args)...)); \
  }
XDS_DEFINE_STATUS_BUILDER(invalid_argument, kInvalidArgument)
XDS_DEFINE_STATUS_BUILDER(not_found, kNotFound)
XDS_DEFINE_STATUS_BUILDER(data_loss, kDataLoss)
XDS_DEFINE_STATUS_BUILDER(unimplemented, kUnimplemented)
XDS_DEFINE_STATUS_BUILDER(failed_precondition, kFailedPrecondition)
XDS_DEFINE_STATUS_BUILDER(resource_exhausted, kResourceExhausted)
XDS_DEFINE_STATUS_BUILDER(deadline_exceeded, kDeadlineExceeded)
XDS_DEFINE_STATUS_BUILDER(unavailable, kUnavailable)
XDS_DEFINE_STATUS_BUILDER(aborted, kAborted)
XDS_DEFINE_STATUS_BUILDER(cancelled, kCancelled)
XDS_DEFINE_STATUS_BUILDER(abandoned, kAbandoned)
XDS_DEFINE_STATUS_BUILDER(internal_error, kInternal)
#undef XDS_DEFINE_STATUS_BUILDER

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    XDS_CHECK(!std::get<Status>(v_).ok(), "Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    XDS_CHECK(ok(), "Result::value() on error: {}", std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  const T& value() const& {
    XDS_CHECK(ok(), "Result::value() on error: {}", std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    XDS_CHECK(ok(), "Result::value() on error: {}", std::get<Status>(v_).to_string());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace xds

#define XDS_STATUS_CONCAT_INNER(a, b) a##b
#define XDS_STATUS_CONCAT(a, b) XDS_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define XDS_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::xds::Status xds_status_ = (expr);        \
    if (!xds_status_.ok()) return xds_status_; \
  } while (0)

// XDS_ASSIGN_OR_RETURN(auto x, make_x()); declares x from a Result or returns its error.
#define XDS_ASSIGN_OR_RETURN(lhs, expr) \
  XDS_ASSIGN_OR_RETURN_IMPL(XDS_STATUS_CONCAT(xds_result_, __LINE__), lhs, expr)
#define XDS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
