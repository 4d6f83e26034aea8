// Reading an option struct of c.h that carries its own size, so that a program built
// against another version of c.h keeps working (docs/c-api.md#option-structs).
//
// The rule that makes this sound, for whoever adds a field: fields are only ever appended,
// and a new field starts at or after the previous version's sizeof (its tail padding
// included), so the bytes an older program's struct has are the same fields in every
// version.
#pragma once

#include <cstddef>
#include <cstring>

#include "capi/errors.h"

namespace mqtt_inbox::capi {

// *out = the defaults, overwritten by the first in->struct_size bytes of *in (none if in
// is null). A struct larger than T is accepted only if its bytes beyond sizeof(T) are zero
// (a newer program that left the fields this library does not know at their defaults).
template <typename T>
int read_sized(const T* in, const T& defaults, T* out, LastError* err, const char* what) {
  *out = defaults;
  if (!in) return MQTT_INBOX_OK;
  const size_t n = in->struct_size;
  if (n < sizeof(size_t)) {
    std::string m = std::string(what) + ".struct_size is " + std::to_string(n) +
                    ": initialise the struct with its _INIT macro";
    return err ? err->set(MQTT_INBOX_MISUSE, m) : MQTT_INBOX_MISUSE;
  }
  if (n > sizeof(T)) {
    const unsigned char* extra = reinterpret_cast<const unsigned char*>(in) + sizeof(T);
    for (size_t i = 0; i < n - sizeof(T); ++i) {
      if (extra[i] != 0) {
        std::string m = std::string(what) + " has fields this library (" +
                        std::to_string(sizeof(T)) + " bytes) does not know set (struct_size " +
                        std::to_string(n) + "): link a newer mqtt-inbox";
        return err ? err->set(MQTT_INBOX_INVALID_ARGUMENT, m) : MQTT_INBOX_INVALID_ARGUMENT;
      }
    }
  }
  std::memcpy(static_cast<void*>(out), in, n < sizeof(T) ? n : sizeof(T));
  out->struct_size = sizeof(T);
  return MQTT_INBOX_OK;
}

// Writes `value` into the caller's *out, which carries its own size: only the first
// out->struct_size bytes (an older program's struct gets the fields it knows), and never
// struct_size itself. A struct_size too small to hold that field is misuse.
template <typename T>
int write_sized(const T& value, T* out, LastError* err, const char* what) {
  const size_t n = out->struct_size;
  if (n < sizeof(size_t)) {
    std::string m = std::string(what) + ".struct_size is " + std::to_string(n) +
                    ": initialise the struct with its _INIT macro";
    return err ? err->set(MQTT_INBOX_MISUSE, m) : MQTT_INBOX_MISUSE;
  }
  const size_t copy = (n < sizeof(T) ? n : sizeof(T)) - sizeof(size_t);
  std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char*>(&value) + sizeof(size_t), copy);
  return MQTT_INBOX_OK;
}

}  // namespace mqtt_inbox::capi
