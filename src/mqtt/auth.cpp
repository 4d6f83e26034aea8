// Authentication in the MQTT layer: what a CONNACK refusal means and what to do about
// it, the password file provider, and the names of connection failure kinds.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mqtt_inbox/connection.h"

namespace mqtt_inbox {

const char* to_string(ConnectionHealth::Failure failure) {
  switch (failure) {
    case ConnectionHealth::Failure::kNone:
      return "none";
    case ConnectionHealth::Failure::kNetwork:
      return "network";
    case ConnectionHealth::Failure::kTls:
      return "tls";
    case ConnectionHealth::Failure::kRefused:
      return "refused";
    case ConnectionHealth::Failure::kCredentials:
      return "credentials";
    case ConnectionHealth::Failure::kSubscribe:
      return "subscribe";
    case ConnectionHealth::Failure::kOther:
      return "other";
  }
  return "unknown";
}

namespace {

struct Refusal {
  int code;
  const char* meaning;
  const char* what_to_do;
};

// MQTT 3.1.1 section 3.2.2.3, Table 3.1.
constexpr Refusal kV311[] = {
    {1, "unacceptable protocol version",
     "the broker does not speak MQTT 3.1.1; try MQTT 5 (--mqtt-version 5)"},
    {2, "identifier rejected",
     "the broker does not accept this client id (too long, characters it refuses, or not "
     "the id the broker expects, e.g. the device id on Azure IoT Hub)"},
    {3, "server unavailable", "the broker is up but does not accept connections now"},
    {4, "bad user name or password", "check the user name and the password (file)"},
    {5, "not authorized",
     "the broker does not let these credentials (user name and password, or client "
     "certificate) connect: check them and the broker's ACL or policy"},
};

// MQTT 5.0 section 3.2.2.2, CONNACK reason codes >= 0x80.
constexpr Refusal kV5[] = {
    {0x80, "unspecified error", "the broker gave no reason; see its log"},
    {0x81, "malformed packet", "the broker could not parse the CONNECT packet"},
    {0x82, "protocol error", "the CONNECT broke the protocol as the broker reads it"},
    {0x83, "implementation specific error", "see the broker's log"},
    {0x84, "unsupported protocol version",
     "the broker does not speak MQTT 5; use 3.1.1 (--mqtt-version 3.1.1)"},
    {0x85, "client identifier not valid",
     "the broker does not accept this client id (too long, characters it refuses, or not "
     "the id the broker expects)"},
    {0x86, "bad user name or password", "check the user name and the password (file)"},
    {0x87, "not authorized",
     "the broker does not let these credentials (user name and password, or client "
     "certificate) connect: check them and the broker's ACL or policy"},
    {0x88, "server unavailable", "the broker is up but does not accept connections now"},
    {0x89, "server busy", "the broker is overloaded; it asks to try later"},
    {0x8A, "banned", "the broker has banned this client; ask its administrator"},
    {0x8C, "bad authentication method", "the broker does not support the authentication asked for"},
    {0x90, "topic name invalid", "the will topic was refused"},
    {0x95, "packet too large", "the CONNECT exceeds the broker's maximum packet size"},
    {0x97, "quota exceeded", "a broker quota (connections, rate) is used up"},
    {0x99, "payload format invalid", "the will payload was refused"},
    {0x9A, "retain not supported", "the will asked for retain, which the broker refuses"},
    {0x9B, "QoS not supported", "the will QoS was refused"},
    {0x9C, "use another server", "the broker redirects this client to another server"},
    {0x9D, "server moved", "the broker has moved permanently to another server"},
    {0x9F, "connection rate exceeded", "too many connection attempts; the subscriber waits"},
};

}  // namespace

std::string connack_meaning(MqttVersion version, int code) {
  const bool v5 = version == MqttVersion::kV5;
  char code_text[48];
  std::snprintf(code_text, sizeof code_text,
                v5 ? "MQTT 5 CONNACK reason code 0x%02X" : "MQTT 3.1.1 CONNACK return code %d",
                code);
  auto find = [&](const auto& table) -> const Refusal* {
    for (const auto& r : table)
      if (r.code == code) return &r;
    return nullptr;
  };
  const Refusal* r = v5 ? find(kV5) : find(kV311);
  if (!r) return std::string("unknown refusal (") + code_text + ")";
  return std::string(r->meaning) + " (" + code_text + "): " + r->what_to_do;
}

PasswordProvider password_from_file(const std::string& path) {
  return [path](std::string* password) -> Status {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return Status(Status::Code::kIoError,
                    "cannot read password file '" + path + "': " + std::strerror(errno));
    std::string text;
    char buf[512];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        return Status(Status::Code::kIoError,
                      "cannot read password file '" + path + "': " + std::strerror(err));
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.empty()) return Status::InvalidArgument("password file '" + path + "' is empty");
    *password = std::move(text);
    return Status::Ok();
  };
}

}  // namespace mqtt_inbox
