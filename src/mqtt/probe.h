// Internal: the probe, a TCP/TLS handshake of the library's own with the subscriber's
// settings, that explains a failed connection attempt and checks tls.version.
#pragma once

#include <string>

#include "mqtt/tls.h"
#include "mqtt_inbox/connection.h"

namespace mqtt_inbox::detail {

// The result of probe().
struct ProbeResult {
  bool ok = false;
  ConnectionHealth::Failure failure = ConnectionHealth::Failure::kNone;  // kNetwork or kTls
  std::string reason;       // why not, with what to check; "" when ok
  std::string tls_version;  // negotiated, e.g. "TLSv1.3", when ok over TLS
};

// Connects to `address` with TCP and, for a TLS scheme, makes a TLS handshake with the
// same settings Paho uses (the chain and host name checked unless tls says otherwise, the
// client certificate, ALPN, ciphers) and with tls.version as the lowest version. When the
// broker asked for a client certificate it then waits (within the timeout) for the
// broker's verdict, which TLS 1.3 sends after the handshake. Closes the connection
// without sending any MQTT packet. Blocks up to `timeout_ms`. Never throws.
ProbeResult probe(const BrokerAddress& address, const TlsOptions& tls, int timeout_ms);

}  // namespace mqtt_inbox::detail
