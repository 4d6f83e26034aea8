// The TLS settings of the MQTT layer: broker URIs, the checks of the TLS settings with
// OpenSSL (check_tls_options), the OpenSSL context they describe (shared with the probe,
// mqtt/probe.cpp), and Paho's ssl_options.
#include "mqtt/tls.h"

#include <mqtt/ssl_options.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <regex>

namespace mqtt_inbox {
namespace detail {
namespace {

struct SchemeInfo {
  const char* name;
  int default_port;  // Paho C's defaults (MQTTProtocolOut.c)
  bool tls;
  bool websocket;
};
constexpr SchemeInfo kSchemes[] = {
    {"tcp", 1883, false, false}, {"mqtt", 1883, false, false}, {"ws", 80, false, true},
    {"ssl", 8883, true, false},  {"mqtts", 8883, true, false}, {"wss", 443, true, true},
};

int key_password_cb(char* buf, int size, int /*rwflag*/, void* user) {
  auto* k = static_cast<KeyPassword*>(user);
  k->asked = true;
  const std::string& pw = *k->password;
  if (pw.empty() || pw.size() > static_cast<size_t>(size)) return 0;
  std::memcpy(buf, pw.data(), pw.size());
  return static_cast<int>(pw.size());
}

// A readable regular file, or an error naming the setting and the file.
Status check_readable_file(const std::string& path, const char* field) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::InvalidArgument(std::string(field) + " '" + path + "': " + std::strerror(errno));
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular)
    return Status::InvalidArgument(std::string(field) + " '" + path + "' is not a file");
  return Status::Ok();
}

// The trust anchors: ca_file and ca_dir, or OpenSSL's default paths without them.
Status load_trust(SSL_CTX* ctx, const TlsOptions& t) {
  ERR_clear_error();
  if (t.ca_file.empty() && t.ca_dir.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1)
      return Status::InvalidArgument("cannot load the system trust store: " +
                                     take_openssl_errors());
    return Status::Ok();
  }
  const char* file = t.ca_file.empty() ? nullptr : t.ca_file.c_str();
  const char* dir = t.ca_dir.empty() ? nullptr : t.ca_dir.c_str();
  if (SSL_CTX_load_verify_locations(ctx, file, dir) != 1)
    return Status::InvalidArgument(
        (file ? "tls.ca_file '" + t.ca_file + "'" : "tls.ca_dir '" + t.ca_dir + "'") +
        ": no CA certificate could be loaded (OpenSSL: " + take_openssl_errors() + ")");
  return Status::Ok();
}

// The client certificate (chain) and its key, with the key password; checks that they
// belong together.
Status load_client_credentials(SSL_CTX* ctx, const TlsOptions& t, KeyPassword* pw) {
  if (t.cert_file.empty()) return Status::Ok();
  ERR_clear_error();
  SSL_CTX_set_default_passwd_cb(ctx, key_password_cb);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, pw);
  if (SSL_CTX_use_certificate_chain_file(ctx, t.cert_file.c_str()) != 1)
    return Status::InvalidArgument(
        "tls.cert_file '" + t.cert_file +
        "': cannot load a PEM certificate (OpenSSL: " + take_openssl_errors() + ")");
  const std::string& key = t.key_file.empty() ? t.cert_file : t.key_file;
  const char* key_field = t.key_file.empty() ? "tls.cert_file (holding the key)" : "tls.key_file";
  pw->asked = false;
  const std::string mismatch = std::string(key_field) + " '" + key +
                               "' does not match the certificate in tls.cert_file '" + t.cert_file +
                               "'";
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = take_openssl_errors();
    if (why.find("key values mismatch") != std::string::npos)
      return Status::InvalidArgument(mismatch);
    if (pw->asked && pw->password->empty())
      return Status::InvalidArgument(std::string(key_field) + " '" + key +
                                     "': the private key is encrypted; give its password "
                                     "(tls.key_password, --key-password-file)");
    if (pw->asked)
      return Status::InvalidArgument(std::string(key_field) + " '" + key +
                                     "': the key password is wrong, or the key is damaged "
                                     "(OpenSSL: " +
                                     why + ")");
    return Status::InvalidArgument(std::string(key_field) + " '" + key +
                                   "': cannot load a PEM private key (OpenSSL: " + why + ")");
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    take_openssl_errors();
    return Status::InvalidArgument(mismatch);
  }
  return Status::Ok();
}

// ALPN names in the wire format of RFC 7301: each prefixed by its length.
std::string alpn_wire(const std::vector<std::string>& names) {
  std::string wire;
  for (const auto& n : names) {
    wire.push_back(static_cast<char>(n.size()));
    wire += n;
  }
  return wire;
}

Status check_alpn(const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (n.empty() || n.size() > 255)
      return Status::InvalidArgument("tls.alpn: protocol name '" + n +
                                     "' must be 1..255 bytes (RFC 7301 section 3.1)");
  return Status::Ok();
}

}  // namespace

// Every reason in OpenSSL's (thread-local) error queue, oldest first, without repeats;
// empties the queue.
std::string take_openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    const char* r = ERR_reason_error_string(e);
    char code[32];
    std::snprintf(code, sizeof code, "error %08lx", e);
    const std::string reason = r ? r : code;
    if (out.find(reason) != std::string::npos) continue;
    if (!out.empty()) out += "; ";
    out += reason;
  }
  return out;
}

// A context configured as Paho configures its own (SSLSocket.c, Paho C 1.3.12), plus
// tls.version as the lowest protocol version.
Status make_tls_context(const TlsOptions& t, KeyPassword* pw, TlsContext* out) {
  TlsContext ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return Status::Internal("SSL_CTX_new failed: " + take_openssl_errors());
  SSL_CTX_set_security_level(ctx.get(), 1);  // as Paho sets it
  if (t.version == TlsVersion::kTls1_2) SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (t.version == TlsVersion::kTls1_3) SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  if (Status s = load_trust(ctx.get(), t); !s.ok()) return s;
  if (Status s = load_client_credentials(ctx.get(), t, pw); !s.ok()) return s;
  if (!t.ciphers.empty()) {
    ERR_clear_error();
    if (SSL_CTX_set_cipher_list(ctx.get(), t.ciphers.c_str()) != 1)
      return Status::InvalidArgument(
          "tls.ciphers '" + t.ciphers +
          "' selects no cipher OpenSSL knows (OpenSSL: " + take_openssl_errors() + ")");
  }
  if (!t.alpn.empty()) {
    const std::string wire = alpn_wire(t.alpn);
    if (SSL_CTX_set_alpn_protos(ctx.get(), reinterpret_cast<const unsigned char*>(wire.data()),
                                static_cast<unsigned>(wire.size())) != 0)
      return Status::InvalidArgument("tls.alpn: OpenSSL refused the protocol list");
  }
  *out = std::move(ctx);
  return Status::Ok();
}

std::string BrokerAddress::host_port() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Status parse_broker_uri(const std::string& uri, BrokerAddress* out) {
  const size_t sep = uri.find("://");
  if (sep == std::string::npos)
    return Status::InvalidArgument("broker_uri '" + uri +
                                   "' has no scheme: use tcp://, mqtt://, ws:// (plaintext) "
                                   "or ssl://, mqtts://, wss:// (TLS)");
  BrokerAddress a;
  a.scheme = uri.substr(0, sep);
  std::transform(a.scheme.begin(), a.scheme.end(), a.scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const SchemeInfo* info = nullptr;
  for (const auto& s : kSchemes)
    if (a.scheme == s.name) info = &s;
  if (!info)
    return Status::InvalidArgument("broker_uri '" + uri + "': unknown scheme '" + a.scheme +
                                   "://'; use tcp://, mqtt://, ws:// (plaintext) or ssl://, "
                                   "mqtts://, wss:// (TLS)");
  a.tls = info->tls;
  a.websocket = info->websocket;
  a.port = info->default_port;
  std::string rest = uri.substr(sep + 3);
  rest = rest.substr(0, rest.find('/'));  // a WebSocket path
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos)
      return Status::InvalidArgument("broker_uri '" + uri + "': unterminated IPv6 address");
    a.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':')
        return Status::InvalidArgument("broker_uri '" + uri + "': junk after the IPv6 address");
      port = rest.substr(close + 2);
    }
  } else {
    const size_t colon = rest.rfind(':');
    a.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (a.host.empty()) return Status::InvalidArgument("broker_uri '" + uri + "' names no host");
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      return Status::InvalidArgument("broker_uri '" + uri + "': port must be 1..65535");
    a.port = std::stoi(port);
  }
  *out = std::move(a);
  return Status::Ok();
}

std::string describe_tls(const TlsOptions& t) {
  std::string d = "broker certificate checked against ";
  if (t.insecure_skip_certificate_check) {
    d = "broker certificate NOT checked (insecure_skip_certificate_check)";
  } else {
    if (t.ca_file.empty() && t.ca_dir.empty()) {
      const char* file_env = std::getenv(X509_get_default_cert_file_env());
      const char* dir_env = std::getenv(X509_get_default_cert_dir_env());
      d += std::string("the system trust store (no tls.ca_file/ca_dir; OpenSSL's defaults: file ") +
           (file_env ? file_env : X509_get_default_cert_file()) + ", folder " +
           (dir_env ? dir_env : X509_get_default_cert_dir()) + ")";
    } else {
      if (!t.ca_file.empty()) d += "CA file '" + t.ca_file + "'";
      if (!t.ca_dir.empty())
        d += std::string(t.ca_file.empty() ? "" : " and ") + "CA folder '" + t.ca_dir + "'";
    }
    d += t.insecure_skip_hostname_check ? "; host name NOT checked (insecure_skip_hostname_check)"
                                        : "; host name checked";
  }
  d += t.cert_file.empty() ? "; no client certificate"
                           : "; client certificate '" + t.cert_file + "'" +
                                 (t.key_file.empty() ? "" : " with key '" + t.key_file + "'");
  if (t.version == TlsVersion::kTls1_2) d += "; TLS 1.2 or later";
  if (t.version == TlsVersion::kTls1_3) d += "; TLS 1.3 only";
  if (!t.alpn.empty()) {
    d += "; ALPN";
    for (const auto& p : t.alpn) d += " " + p;
  }
  if (!t.ciphers.empty()) d += "; ciphers '" + t.ciphers + "'";
  return d;
}

std::string openssl_reason(const std::string& line) {
  // <thread>:error:<code>:<library>:<function>:<reason>:<file>:<line>:<data>
  const size_t at = line.find(":error:");
  if (at != std::string::npos) {
    size_t p = at + 7;
    for (int field = 0; field < 3 && p != std::string::npos; ++field) {
      p = line.find(':', p);
      if (p != std::string::npos) ++p;
    }
    if (p != std::string::npos) {
      const size_t end = line.find(':', p);
      const std::string reason =
          line.substr(p, end == std::string::npos ? std::string::npos : end - p);
      if (!reason.empty()) return reason;
    }
  }
  std::string s = line;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace detail

bool is_tls_uri(const std::string& broker_uri) {
  detail::BrokerAddress a;
  return detail::parse_broker_uri(broker_uri, &a).ok() && a.tls;
}

void to_paho_ssl_options(const TlsOptions& t, mqtt::ssl_options* o) {
  if (!t.ca_file.empty()) o->set_trust_store(t.ca_file);
  // Paho C++ 1.2.0 bug #337 (fixed in 1.3.0): ssl_options' copy and move constructors and
  // assignments do not copy the CA folder string but keep the C struct's pointer to the
  // source object's string, so a folder set on a temporary (as ssl_options_builder does)
  // is lost or read from freed memory. It is set here on `*o` itself, which the caller
  // keeps alive: the Subscriber passes its own ssl_options, which lives as long as its
  // Paho client, so every copy Paho C++ makes (into the connect options, into each
  // connect()) points back at this string, and Paho C copies it at each connect.
  if (!t.ca_dir.empty()) o->ca_path(t.ca_dir);
  if (!t.cert_file.empty()) o->set_key_store(t.cert_file);
  if (!t.key_file.empty()) o->set_private_key(t.key_file);
  if (!t.key_password.empty()) o->set_private_key_password(t.key_password);
  if (!t.ciphers.empty()) o->set_enabled_cipher_suites(t.ciphers);
  if (!t.alpn.empty()) o->set_alpn_protos(t.alpn);
  // Paho's enableServerCertAuth verifies the chain; `verify` adds the host name check
  // (X509_check_host, then X509_check_ip_asc), which Paho leaves off by default.
  o->set_enable_server_cert_auth(!t.insecure_skip_certificate_check);
  o->set_verify(!t.insecure_skip_certificate_check && !t.insecure_skip_hostname_check);
  // Not set: sslVersion. Paho C 1.3.12 with OpenSSL >= 1.1 ignores it (SSL_CTX_new with
  // TLS_client_method, no version bounds); tls.version is checked by probe() instead.
}

Status check_tls_options(const std::string& broker_uri, const TlsOptions& t) {
  detail::BrokerAddress a;
  if (Status s = detail::parse_broker_uri(broker_uri, &a); !s.ok()) return s;
  if (!a.tls) {
    if (t.any_set())
      return Status::InvalidArgument(
          "TLS settings are given but broker_uri '" + broker_uri + "' is plaintext (" + a.scheme +
          "://): use ssl:// or mqtts:// (wss:// for WebSocket). mqtt-inbox neither ignores TLS "
          "settings nor falls back to plaintext");
    return Status::Ok();
  }
  // OpenSSL's reasons for what follows and for a failed handshake: loaded here, for TLS
  // connections only, since Paho no longer initialises OpenSSL (connect.cpp).
  OPENSSL_init_ssl(OPENSSL_INIT_LOAD_SSL_STRINGS | OPENSSL_INIT_LOAD_CRYPTO_STRINGS, nullptr);
  if (!t.key_file.empty() && t.cert_file.empty())
    return Status::InvalidArgument("tls.key_file '" + t.key_file +
                                   "' is set without tls.cert_file");
  if (!t.key_password.empty() && t.cert_file.empty())
    return Status::InvalidArgument("tls.key_password is set without a client certificate and key");
  if (Status s = detail::check_alpn(t.alpn); !s.ok()) return s;
  if (!t.ca_file.empty())
    if (Status s = detail::check_readable_file(t.ca_file, "tls.ca_file"); !s.ok()) return s;
  if (!t.ca_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(t.ca_dir, ec))
      return Status::InvalidArgument("tls.ca_dir '" + t.ca_dir + "' is not a folder" +
                                     (ec ? ": " + ec.message() : ""));
    // OpenSSL looks certificates up by subject hash (openssl rehash), never by scanning.
    static const std::regex hashed("[0-9a-f]{8}\\.[0-9]+");
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(t.ca_dir, ec))
      if (std::regex_match(e.path().filename().string(), hashed)) ++n;
    if (ec) return Status::InvalidArgument("tls.ca_dir '" + t.ca_dir + "': " + ec.message());
    if (n == 0)
      return Status::InvalidArgument("tls.ca_dir '" + t.ca_dir +
                                     "' holds no certificate under OpenSSL's hashed names "
                                     "(e.g. a1b2c3d4.0): run `openssl rehash " +
                                     t.ca_dir + "`");
  }
  if (!t.cert_file.empty())
    if (Status s = detail::check_readable_file(t.cert_file, "tls.cert_file"); !s.ok()) return s;
  if (!t.key_file.empty())
    if (Status s = detail::check_readable_file(t.key_file, "tls.key_file"); !s.ok()) return s;
  detail::KeyPassword pw{&t.key_password};
  detail::TlsContext ctx;
  return detail::make_tls_context(t, &pw, &ctx);
}

}  // namespace mqtt_inbox
