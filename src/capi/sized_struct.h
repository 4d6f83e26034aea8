// Reading and writing c.h's option structs, which start with a header their _INIT macro
// fills (docs/c-api.md#option-structs): struct_id, an eyecatcher naming the struct;
// struct_version, the layout's version; struct_size, its size. A struct whose header is
// wrong was not made by its _INIT macro (garbage, zeros, another struct) and is refused
// with MQTT_INBOX_MISUSE before any field is read; a good one is read up to the size the
// library knows for its version, never further.
//
// For whoever adds a field: append it, add a version with its size to the struct's
// StructInfo (sizes[v] = the size of version v's struct, for every ABI:
// MQTT_INBOX_STRUCT_INFO_V2 computes version 1's from its last field; only the bytes up to
// a version's last field are copied, fields_end), and change the
// _INIT macro's version. A field never moves, so version v's bytes are the same fields in
// every later version.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "capi/errors.h"
#include "mqtt_inbox/c.h"

namespace mqtt_inbox::capi {

// The name of the struct whose struct_id is `id`, or null for none of c.h's.
const char* struct_name_of(const char id[4]) noexcept;

template <typename T>
struct StructInfo;

#define MQTT_INBOX_STRUCT_INFO(type, id, init)                                  \
  template <>                                                                   \
  struct StructInfo<type> {                                                     \
    static constexpr const char* kId = id;                                      \
    static constexpr const char* kName = #type;                                 \
    static constexpr const char* kInit = init;                                  \
    static constexpr int kVersions = 1;                                         \
    static size_t size_of(int version) noexcept {                               \
      return version == 1 ? sizeof(type) : 0; /* version 1 */                   \
    }                                                                           \
    static size_t fields_end(int version) noexcept { return size_of(version); } \
  }

// A struct with a second version: version 1 ends with `v1_last` (its size is the offset
// past that field, rounded up to the struct's alignment, on every ABI: the fields added
// after it never move it).
#define MQTT_INBOX_STRUCT_INFO_V2(type, id, init, v1_last)                                         \
  template <>                                                                                      \
  struct StructInfo<type> {                                                                        \
    static constexpr const char* kId = id;                                                         \
    static constexpr const char* kName = #type;                                                    \
    static constexpr const char* kInit = init;                                                     \
    static constexpr int kVersions = 2;                                                            \
    static size_t size_of(int version) noexcept {                                                  \
      constexpr size_t end =                                                                       \
          offsetof(type, v1_last) + sizeof(static_cast<type*>(nullptr)->v1_last);                  \
      constexpr size_t align = alignof(type);                                                      \
      return version == 1 ? (end + align - 1) / align * align : version == 2 ? sizeof(type) : 0;   \
    }                                                                                              \
    /* Where version 1's fields end: its tail padding holds version 2's first fields, which   */   \
    /* a version 1 caller never set (garbage or zero), so they are never read nor written.    */   \
    static size_t fields_end(int version) noexcept {                                               \
      return version == 1 ? offsetof(type, v1_last) + sizeof(static_cast<type*>(nullptr)->v1_last) \
                          : size_of(version);                                                      \
    }                                                                                              \
  }

MQTT_INBOX_STRUCT_INFO(mqtt_inbox_options_t, "MQIO", "MQTT_INBOX_OPTIONS_INIT");
// Version 2 (issue 42): expired and the dependency schedule.
MQTT_INBOX_STRUCT_INFO_V2(mqtt_inbox_consumer_options_t, "MQCO", "MQTT_INBOX_CONSUMER_OPTIONS_INIT",
                          id_disagreement);
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_message_t, "MQMS", "MQTT_INBOX_MESSAGE_INIT");
// Version 2 (issue 42): expired and not_yet.
MQTT_INBOX_STRUCT_INFO_V2(mqtt_inbox_consumer_counters_t, "MQCC",
                          "MQTT_INBOX_CONSUMER_COUNTERS_INIT", outbox_full_parked);
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_subscriber_options_t, "MQSO",
                       "MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT");
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_connection_health_t, "MQCH", "MQTT_INBOX_CONNECTION_HEALTH_INIT");
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_outbox_class_t, "MQOC", "MQTT_INBOX_OUTBOX_CLASS_INIT");
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_outbox_options_t, "MQOO", "MQTT_INBOX_OUTBOX_OPTIONS_INIT");
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_outgoing_t, "MQOG", "MQTT_INBOX_OUTGOING_INIT");
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_relay_options_t, "MQRO", "MQTT_INBOX_RELAY_OPTIONS_INIT");
MQTT_INBOX_STRUCT_INFO(mqtt_inbox_pruner_options_t, "MQPO", "MQTT_INBOX_PRUNER_OPTIONS_INIT");
#undef MQTT_INBOX_STRUCT_INFO
#undef MQTT_INBOX_STRUCT_INFO_V2

// The header every struct starts with, as c.h lays it out.
struct StructHeader {
  char struct_id[4];
  int struct_version;
  size_t struct_size;
};

// MQTT_INBOX_OK if the header at `in` is a good one of T's; else MQTT_INBOX_MISUSE with a
// message naming `what` (e.g. "mqtt_inbox_options_t", "classes[2]"). Reads the header
// only. *size gets the bytes the library reads for that version.
template <typename T>
int check_header(const T* in, LastError* err, const std::string& what, size_t* size) {
  using Info = StructInfo<T>;
  static_assert(offsetof(T, struct_id) == offsetof(StructHeader, struct_id) &&
                    offsetof(T, struct_version) == offsetof(StructHeader, struct_version) &&
                    offsetof(T, struct_size) == offsetof(StructHeader, struct_size),
                "every struct of c.h starts with the header");
  std::string m;
  if (std::memcmp(in->struct_id, Info::kId, 4) != 0) {
    const char* other = struct_name_of(in->struct_id);
    m = other ? what + " is a " + other + ", not a " + Info::kName
              : what + " was not initialised with " + Info::kInit + " (its struct_id is not \"" +
                    Info::kId + "\")";
  } else if (in->struct_version < 1 || in->struct_version > Info::kVersions) {
    m = what + ".struct_version is " + std::to_string(in->struct_version) +
        ", and this library knows versions 1.." + std::to_string(Info::kVersions) + " of " +
        Info::kName + ": initialise it with " + Info::kInit +
        " (a newer header than the library is another error: link the mqtt-inbox it came with)";
  } else if (in->struct_size != Info::size_of(in->struct_version)) {
    m = what + ".struct_size is " + std::to_string(in->struct_size) + ", not " +
        std::to_string(Info::size_of(in->struct_version)) + ", the size of version " +
        std::to_string(in->struct_version) + " of " + Info::kName + ": initialise it with " +
        Info::kInit;
  } else {
    *size = Info::size_of(in->struct_version);
    return MQTT_INBOX_OK;
  }
  return err ? err->set(MQTT_INBOX_MISUSE, m) : MQTT_INBOX_MISUSE;
}

// *out = the defaults, overwritten by the fields of *in's version (none if in is null).
template <typename T>
int read_sized(const T* in, const T& defaults, T* out, LastError* err) {
  *out = defaults;
  if (!in) return MQTT_INBOX_OK;
  size_t n = 0;
  if (int rc = check_header(in, err, StructInfo<T>::kName, &n)) return rc;
  constexpr size_t kHeader = sizeof(StructHeader);
  // The fields of its version only, not the tail padding after them (a later version's).
  std::memcpy(reinterpret_cast<unsigned char*>(out) + kHeader,
              reinterpret_cast<const unsigned char*>(in) + kHeader,
              StructInfo<T>::fields_end(in->struct_version) - kHeader);
  return MQTT_INBOX_OK;
}

// Writes `value`'s fields of *out's version into *out (the header stays the caller's).
template <typename T>
int write_sized(const T& value, T* out, LastError* err) {
  size_t n = 0;
  if (int rc = check_header(out, err, StructInfo<T>::kName, &n)) return rc;
  constexpr size_t kHeader = sizeof(StructHeader);
  std::memcpy(reinterpret_cast<unsigned char*>(out) + kHeader,
              reinterpret_cast<const unsigned char*>(&value) + kHeader,
              StructInfo<T>::fields_end(out->struct_version) - kHeader);
  return MQTT_INBOX_OK;
}

// A switch field: 0 or 1, nothing else (a garbage value never reads as on or off).
inline int read_flag(int v, const char* field, LastError* err, bool* out) {
  if (v != 0 && v != 1) {
    const std::string m = std::string(field) + " is " + std::to_string(v) + ": it must be 0 or 1";
    return err ? err->set(MQTT_INBOX_INVALID_ARGUMENT, m) : MQTT_INBOX_INVALID_ARGUMENT;
  }
  *out = v == 1;
  return MQTT_INBOX_OK;
}

}  // namespace mqtt_inbox::capi
