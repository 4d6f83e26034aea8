// Result codes, their names, per-handle error messages and the strings the C caller frees
// (c.h's conventions; docs/c-api.md#errors).
#include "capi/errors.h"

#include <cstdlib>
#include <cstring>

namespace mqtt_inbox::capi {

static_assert(MQTT_INBOX_INVALID_ARGUMENT == static_cast<int>(Status::Code::kInvalidArgument) &&
                  MQTT_INBOX_NOT_FOUND == static_cast<int>(Status::Code::kNotFound) &&
                  MQTT_INBOX_BUSY == static_cast<int>(Status::Code::kBusy) &&
                  MQTT_INBOX_FULL == static_cast<int>(Status::Code::kFull) &&
                  MQTT_INBOX_IO_ERROR == static_cast<int>(Status::Code::kIoError) &&
                  MQTT_INBOX_READ_ONLY == static_cast<int>(Status::Code::kReadOnly) &&
                  MQTT_INBOX_CORRUPTION == static_cast<int>(Status::Code::kCorruption) &&
                  MQTT_INBOX_ABORTED == static_cast<int>(Status::Code::kAborted) &&
                  MQTT_INBOX_INTERNAL == static_cast<int>(Status::Code::kInternal) &&
                  MQTT_INBOX_REJECTED == static_cast<int>(Status::Code::kRejected) &&
                  MQTT_INBOX_PERMISSION_DENIED ==
                      static_cast<int>(Status::Code::kPermissionDenied) &&
                  MQTT_INBOX_AUTHENTICATION == static_cast<int>(Status::Code::kAuthentication) &&
                  MQTT_INBOX_SCHEMA == static_cast<int>(Status::Code::kSchema),
              "c.h's result codes follow Status::Code");

int to_rc(const Status& s) noexcept {
  // The C++ Status has no out-of-memory code: a core call that caught std::bad_alloc as a
  // std::exception reports kInternal ending with its what(), "std::bad_alloc" (libstdc++
  // and libc++ alike). c.h promises MQTT_INBOX_NOMEM for that (tests/capi/nomem_test.c).
  static constexpr char kBadAlloc[] = "std::bad_alloc";
  constexpr size_t n = sizeof kBadAlloc - 1;
  const std::string& m = s.message();
  if (s.code() == Status::Code::kInternal && m.size() >= n &&
      m.compare(m.size() - n, n, kBadAlloc) == 0)
    return MQTT_INBOX_NOMEM;
  return static_cast<int>(s.code());
}

namespace {
thread_local std::string read_buffer;
}

int LastError::set(int rc, const char* message) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    text_ = message ? message : "";
  } catch (...) {
    text_.clear();  // no memory for the text: an empty message, the code still says it
  }
  return rc;
}

int LastError::set(const Status& s) noexcept {
  if (s.ok()) {
    clear();
    return MQTT_INBOX_OK;
  }
  return set(to_rc(s), s.message().c_str());
}

void LastError::clear() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  text_.clear();
}

const char* LastError::read() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    read_buffer = text_;
  } catch (...) {
    return "out of memory";
  }
  return read_buffer.c_str();
}

char* malloc_copy(const std::string& s) noexcept {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

char* malloc_copy(const char* s) noexcept {
  if (!s) return nullptr;
  const size_t n = std::strlen(s) + 1;
  char* p = static_cast<char*>(std::malloc(n));
  if (p) std::memcpy(p, s, n);
  return p;
}

}  // namespace mqtt_inbox::capi

extern "C" {

const char* mqtt_inbox_errstr(int rc) {
  switch (rc) {
    case MQTT_INBOX_OK:
      return "ok";
    case MQTT_INBOX_INVALID_ARGUMENT:
      return "invalid argument";
    case MQTT_INBOX_NOT_FOUND:
      return "not found";
    case MQTT_INBOX_BUSY:
      return "busy";
    case MQTT_INBOX_FULL:
      return "full";
    case MQTT_INBOX_IO_ERROR:
      return "I/O error";
    case MQTT_INBOX_READ_ONLY:
      return "read-only";
    case MQTT_INBOX_CORRUPTION:
      return "corruption";
    case MQTT_INBOX_ABORTED:
      return "aborted";
    case MQTT_INBOX_INTERNAL:
      return "internal error";
    case MQTT_INBOX_REJECTED:
      return "rejected";
    case MQTT_INBOX_PERMISSION_DENIED:
      return "permission denied";
    case MQTT_INBOX_NOMEM:
      return "out of memory";
    case MQTT_INBOX_MISUSE:
      return "misuse";
    case MQTT_INBOX_OUTBOX_FULL:
      return "outbox full";
    case MQTT_INBOX_AUTHENTICATION:
      return "authentication";
    case MQTT_INBOX_SCHEMA:
      return "schema";
    default:
      return "unknown";
  }
}

void mqtt_inbox_free(void* p) { std::free(p); }

}  // extern "C"
