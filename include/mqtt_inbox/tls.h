// TLS settings of the MQTT connection (SubscriberOptions::tls), and the checks
// Subscriber::create makes on them.
//
// TLS is chosen by the broker URI, never by these options: ssl://, mqtts:// and wss://
// connect with TLS, tcp://, mqtt:// and ws:// without. There is no fallback from one to
// the other. With a TLS URI and every field left at its default, the broker's
// certificate chain is verified against the system trust store and its host name (or IP
// address) against the URI's host; the library logs once which trust store it uses.
//
// Underneath is Paho MQTT C's MQTTAsync_SSLOptions, which hands the files to OpenSSL
// (SSL_CTX_load_verify_locations, SSL_CTX_use_certificate_chain_file,
// SSL_CTX_use_PrivateKey_file, SSL_CTX_set_cipher_list, SSL_CTX_set_alpn_protos) at every
// connect. Paho's own default does not check the host name (its `verify` is 0); this
// library turns that check on. Files are read again at each connect, so renewed
// certificates are picked up at the next reconnect.
//
// Secrets: key_password (like SubscriberOptions::password) is never written to a log,
// to Subscriber::health(), to stats or to a Status message.
#pragma once

#include <string>
#include <vector>

#include "mqtt_inbox/status.h"

namespace mqtt {
class ssl_options;  // Paho MQTT C++; only to_paho_ssl_options() names it
}

namespace mqtt_inbox {

// The lowest TLS protocol version the connection may use (the meaning of the mosquitto
// clients' --tls-version).
enum class TlsVersion {
  // OpenSSL negotiates the highest version both sides support (TLS 1.3 with OpenSSL 3
  // and mosquitto 2); the floor is the system OpenSSL configuration's.
  kDefault,
  kTls1_2,  // TLS 1.2 or 1.3
  kTls1_3,  // TLS 1.3 only
};

struct TlsOptions {
  // PEM file of the CA certificate(s) that sign the broker's certificate (OpenSSL
  // CAfile). Empty, with ca_dir empty too: the system trust store (OpenSSL's default
  // paths, /etc/ssl/certs on Debian). Must exist and hold at least one certificate.
  // Default "".
  std::string ca_file;
  // Folder of CA certificates in OpenSSL's hashed-name form (OpenSSL CApath; prepare it
  // with `openssl rehash DIR`). Must hold at least one hashed name (e.g. "a1b2c3d4.0").
  // May be combined with ca_file. Default "".
  std::string ca_dir;
  // PEM file of this client's certificate, optionally followed by intermediate CA
  // certificates, for brokers that require a client certificate (mutual TLS). Default "".
  std::string cert_file;
  // PEM file of the private key of cert_file. Empty with cert_file set: the key is read
  // from cert_file. Requires cert_file. Must match the certificate. Default "".
  std::string key_file;
  // Password of an encrypted key_file. Required if the key is encrypted; a wrong one is
  // refused by Subscriber::create. A secret: never logged. Default "" (key not encrypted).
  std::string key_password;
  // Lowest protocol version; see TlsVersion. Paho MQTT C 1.3.12 built with OpenSSL >= 1.1
  // ignores its own sslVersion setting, so a version other than kDefault is checked by a
  // TLS handshake of the library's own before each connection attempt: if the broker
  // does not complete it at that version, the attempt fails with the reason and Paho does
  // not connect. (TLS 1.3's downgrade protection, RFC 8446 section 4.1.3, stops Paho's
  // own handshake from then settling on a lower version.) Default kDefault.
  TlsVersion version = TlsVersion::kDefault;
  // ALPN protocol names offered, in order of preference (RFC 7301). AWS IoT Core on port
  // 443 needs {"x-amzn-mqtt-ca"}. Each name 1..255 bytes. Default empty (no ALPN).
  std::vector<std::string> alpn;
  // OpenSSL cipher list for TLS 1.2 (SSL_CTX_set_cipher_list syntax, e.g.
  // "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256"); TLS 1.3 suites stay
  // OpenSSL's defaults. A list that selects no cipher is refused. Default "" (OpenSSL's
  // default list).
  std::string ciphers;

  // INSECURE. Accept a broker certificate whose names (subjectAltName DNS/IP, else the
  // common name) do not match the URI's host. The chain is still verified, so any
  // certificate from a trusted CA is then accepted for this broker: with a public CA,
  // anyone's. For a lab broker whose certificate names another host. A warning is logged
  // at every connect. Default false.
  bool insecure_skip_hostname_check = false;
  // INSECURE. Do not verify the broker's certificate at all (nor, then, its host name):
  // the connection is encrypted but anyone on the path can read and change it. A warning
  // is logged at every connect. Default false.
  bool insecure_skip_certificate_check = false;

  // True if any field differs from its default. A plaintext URI with TLS settings is a
  // configuration error (see check_tls_options).
  bool any_set() const {
    return !ca_file.empty() || !ca_dir.empty() || !cert_file.empty() || !key_file.empty() ||
           !key_password.empty() || version != TlsVersion::kDefault || !alpn.empty() ||
           !ciphers.empty() || insecure_skip_hostname_check || insecure_skip_certificate_check;
  }
};

// The checks Subscriber::create makes on a broker URI and its TLS settings, available to
// programs that connect another client (a publisher) with the same settings. Reads the
// files with OpenSSL, as Paho will; never prompts for a key password. Errors
// (kInvalidArgument), each naming the URI or the file:
//  - a URI scheme other than tcp, mqtt, ws (plaintext) or ssl, mqtts, wss (TLS), or no host;
//  - TLS settings with a plaintext URI (there is no fallback to plaintext, and no silent
//    dropping of settings the user asked for);
//  - ca_file missing, unreadable or without a PEM certificate; ca_dir not a folder or
//    without hashed certificate names;
//  - cert_file or key_file missing, unreadable or not PEM; key_file without cert_file;
//    an encrypted key without key_password, or a wrong key_password; a key that does not
//    match the certificate;
//  - a cipher list that selects no cipher; an empty or over-long ALPN name.
// Thread safety: safe from any thread.
Status check_tls_options(const std::string& broker_uri, const TlsOptions& tls);

// True for the TLS schemes ssl://, mqtts:// and wss://.
bool is_tls_uri(const std::string& broker_uri);

// Why a connection to `broker_uri` fails, for a client that got only Paho's "TCP/TLS
// connect failure": connects with TCP and, for a TLS URI, makes a TLS handshake with
// `tls` as the Subscriber would (chain and host name checked, client certificate, ALPN,
// tls.version as the lowest version), sends no MQTT packet, and closes. Returns the
// reason, e.g. "certificate verify failed: hostname mismatch (...)" or "cannot connect to
// broker:8883: Connection refused", or "" if the handshake succeeds (the cause then lies
// in MQTT, or has passed). Blocks up to `timeout_ms` (name resolution excepted). The
// Subscriber runs it after each failed attempt on its own. Thread safety: safe from any
// thread.
std::string diagnose_connection(const std::string& broker_uri, const TlsOptions& tls,
                                int timeout_ms);

// For another Paho MQTT C++ client of the application (an outbox publisher, a tool):
// sets `*out` to `tls` exactly as the Subscriber configures its own connection: the chain
// and the host name verified unless an insecure switch says otherwise (Paho's default
// leaves the host name unchecked), CA file and folder, client certificate and key, key
// password, ciphers, ALPN. Call check_tls_options() first; tls.version is not applied
// (Paho C 1.3.12 ignores it with OpenSSL 3, see TlsOptions::version). Use `*out` with
// connect_options::set_ssl and a TLS broker URI. Paho C++ 1.2.0 keeps the CA folder only
// in the object it was set on (its bug #337): keep `*out` alive, and do not copy or move
// it, for as long as connect options made from it are used. To receive OpenSSL's
// reasons, set an error handler on `*out` and wait for connect() to finish in the same
// expression that calls it (Paho C++ 1.2.0 bug #325; see src/mqtt/subscriber.cpp).
// Thread safety: as Paho's ssl_options (none).
void to_paho_ssl_options(const TlsOptions& tls, mqtt::ssl_options* out);

}  // namespace mqtt_inbox
