#include "base/status.h"

namespace xds {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kAborted:
      return "Aborted";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kAbandoned:
      return "Abandoned";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

}  // namespace xds
