#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

const char* to_string(Status::Code code) {
  switch (code) {
    case Status::Code::kOk:
      return "ok";
    case Status::Code::kInvalidArgument:
      return "invalid_argument";
    case Status::Code::kNotFound:
      return "not_found";
    case Status::Code::kBusy:
      return "busy";
    case Status::Code::kFull:
      return "full";
    case Status::Code::kIoError:
      return "io_error";
    case Status::Code::kReadOnly:
      return "read_only";
    case Status::Code::kCorruption:
      return "corruption";
    case Status::Code::kAborted:
      return "aborted";
    case Status::Code::kInternal:
      return "internal";
    case Status::Code::kRejected:
      return "rejected";
    case Status::Code::kPermissionDenied:
      return "permission_denied";
    case Status::Code::kAuthentication:
      return "authentication";
    case Status::Code::kSchema:
      return "schema";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(mqtt_inbox::to_string(code_)) + ": " + message_;
}

}  // namespace mqtt_inbox
