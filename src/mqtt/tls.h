// Internal: the TLS settings in the MQTT layer. Parses broker URIs, and loads the TLS
// settings into an OpenSSL context, to check them (check_tls_options in tls.h) and for
// the probe (mqtt/probe.h).
#pragma once

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "mqtt_inbox/status.h"
#include "mqtt_inbox/subscriber.h"
#include "mqtt_inbox/tls.h"

namespace mqtt_inbox::detail {

// A broker URI taken apart: scheme://host[:port][/path].
struct BrokerAddress {
  std::string scheme;  // lower case, e.g. "ssl"
  std::string host;    // without the brackets of an IPv6 literal
  int port = 0;        // the scheme's default port (Paho's) if the URI names none
  bool tls = false;    // ssl, mqtts, wss
  bool websocket = false;
  std::string host_port() const;  // "host:port", "[v6]:port"
};

// Errors: kInvalidArgument naming the URI (unknown scheme, no host, bad port).
Status parse_broker_uri(const std::string& uri, BrokerAddress* out);

// One line for the log at start(): what the broker's certificate is checked against,
// the client certificate, and the insecure switches. Never holds a secret.
std::string describe_tls(const TlsOptions& tls);

// The reason field of an OpenSSL error line as Paho's SSL error callback passes it
// ("C0E6...:error:0A000086:SSL routines:tls_post_process_server_certificate:certificate
// verify failed:../ssl/statem/statem_clnt.c:1889:" gives "certificate verify failed").
// The line itself, trimmed, if it has another shape.
std::string openssl_reason(const std::string& error_line);

// Every reason in OpenSSL's (thread-local) error queue, oldest first, without repeats;
// empties the queue.
std::string take_openssl_errors();

// The key password handed to OpenSSL, and whether OpenSSL asked for one (= the key is
// encrypted). OpenSSL's default would prompt on a terminal instead.
struct KeyPassword {
  const std::string* password = nullptr;
  bool asked = false;
};

struct TlsContextDeleter {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using TlsContext = std::unique_ptr<SSL_CTX, TlsContextDeleter>;

// An OpenSSL client context with the settings of `tls`, made as Paho C 1.3.12 makes its
// own (SSLSocket.c: TLS_client_method, security level 1, CA file/folder or the default
// paths, certificate chain, key with its password, ciphers, ALPN), plus tls.version as
// the lowest protocol version, which Paho cannot set. `pw` must outlive the context.
// Errors: kInvalidArgument naming the setting and file, with OpenSSL's reason.
Status make_tls_context(const TlsOptions& tls, KeyPassword* pw, TlsContext* out);

}  // namespace mqtt_inbox::detail
