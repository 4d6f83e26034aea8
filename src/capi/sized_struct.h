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

}  // namespace mqtt_inbox::capi
