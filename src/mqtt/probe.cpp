// The probe: a TCP connection and TLS handshake of the library's own, with the settings
// Paho uses, that finds why a connection attempt failed (Paho reports "TCP/TLS connect
// failure" for every transport failure) and checks tls.version before Paho connects.
#include "mqtt/probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

namespace mqtt_inbox::detail {
namespace {

bool is_ip_literal(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

struct SslDeleter {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslPtr = std::unique_ptr<SSL, SslDeleter>;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// What the probe's OpenSSL callbacks saw.
struct ProbeState {
  bool cert_requested = false;   // the broker sent a CertificateRequest
  int verify_error = X509_V_OK;  // the first certificate check that failed
  int verify_depth = -1;
  std::string verify_detail;  // subject, and dates or names as they matter
};

std::string name_text(const X509_NAME* name) {
  BIO* bio = BIO_new(BIO_s_mem());
  X509_NAME_print_ex(bio, name, 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string s(data, static_cast<size_t>(n));
  BIO_free(bio);
  return s;
}

std::string time_text(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string s(data, static_cast<size_t>(n));
  BIO_free(bio);
  return s;
}

// The names a certificate is valid for: its subjectAltName DNS and IP entries.
std::string cert_names(X509* cert) {
  std::string out;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
    std::string n;
    if (g->type == GEN_DNS) {
      n = "DNS:" + std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(g->d.dNSName)),
                               static_cast<size_t>(ASN1_STRING_length(g->d.dNSName)));
    } else if (g->type == GEN_IPADD) {
      char buf[INET6_ADDRSTRLEN] = {};
      const int len = ASN1_STRING_length(g->d.iPAddress);
      inet_ntop(len == 16 ? AF_INET6 : AF_INET, ASN1_STRING_get0_data(g->d.iPAddress), buf,
                sizeof buf);
      n = std::string("IP:") + buf;
    }
    if (n.empty()) continue;
    out += (out.empty() ? "" : ", ") + n;
  }
  GENERAL_NAMES_free(names);
  return out.empty() ? "no subjectAltName; subject " + name_text(X509_get_subject_name(cert)) : out;
}

int probe_verify_cb(int ok, X509_STORE_CTX* store) {
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* st = ssl ? static_cast<ProbeState*>(SSL_get_app_data(ssl)) : nullptr;
  if (!ok && st && st->verify_error == X509_V_OK) {
    st->verify_error = X509_STORE_CTX_get_error(store);
    st->verify_depth = X509_STORE_CTX_get_error_depth(store);
    if (X509* cert = X509_STORE_CTX_get_current_cert(store)) {
      st->verify_detail = "subject " + name_text(X509_get_subject_name(cert));
      if (st->verify_error == X509_V_ERR_CERT_HAS_EXPIRED)
        st->verify_detail += ", expired " + time_text(X509_get0_notAfter(cert));
      else if (st->verify_error == X509_V_ERR_CERT_NOT_YET_VALID)
        st->verify_detail += ", valid from " + time_text(X509_get0_notBefore(cert));
      else if (st->verify_error == X509_V_ERR_HOSTNAME_MISMATCH ||
               st->verify_error == X509_V_ERR_IP_ADDRESS_MISMATCH)
        st->verify_detail += ", valid for " + cert_names(cert);
      else if (st->verify_error == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
               st->verify_error == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
               st->verify_error == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT)
        st->verify_detail += ", issuer " + name_text(X509_get_issuer_name(cert));
    }
  }
  return ok;
}

int probe_cert_cb(SSL* ssl, void*) {
  if (auto* st = static_cast<ProbeState*>(SSL_get_app_data(ssl))) st->cert_requested = true;
  return 1;
}

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms > 0 ? static_cast<int>(ms) : 0;
}

// Waits for `events` on fd; false on timeout.
bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

ProbeResult fail(ConnectionHealth::Failure kind, std::string reason) {
  ProbeResult r;
  r.failure = kind;
  r.reason = std::move(reason);
  return r;
}

// A TCP connection to the first address of `a` that accepts one.
ProbeResult tcp_connect(const BrokerAddress& a, Clock::time_point deadline, Fd* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  // Name resolution is not bounded by the timeout (getaddrinfo has none).
  const int gai = ::getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &list);
  if (gai != 0)
    return fail(ConnectionHealth::Failure::kNetwork,
                "cannot resolve host '" + a.host + "': " + gai_strerror(gai));
  std::string why = "no address";
  for (addrinfo* ai = list; ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (!wait_fd(fd.get(), POLLOUT, remaining_ms(deadline))) {
          why = "no answer within the connect timeout";
          continue;
        }
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) {
      ::freeaddrinfo(list);
      *out = std::move(fd);
      ProbeResult ok;
      ok.ok = true;
      return ok;
    }
    why = std::strerror(err);
  }
  ::freeaddrinfo(list);
  return fail(ConnectionHealth::Failure::kNetwork,
              "cannot connect to " + a.host_port() + ": " + why);
}

std::string closed_during_handshake(const BrokerAddress& a) {
  return "the broker closed the connection during the TLS handshake: is " + a.host_port() +
         " a TLS port? (a plaintext MQTT port closes the connection like this)";
}

// What OpenSSL said, with what it most likely means for an MQTT client.
std::string explain_tls_error(const std::string& openssl, const TlsOptions& t,
                              const BrokerAddress& a) {
  auto has = [&](const char* s) { return openssl.find(s) != std::string::npos; };
  std::string hint;
  if (has("certificate required"))
    hint = t.cert_file.empty() ? "the broker requires a client certificate: set tls.cert_file "
                                 "and tls.key_file (--cert, --key)"
                               : "the broker did not accept our client certificate";
  else if (has("alert unknown ca"))
    hint = "the broker does not trust the CA that issued our client certificate";
  else if (has("alert certificate expired"))
    hint = "the broker says our client certificate has expired";
  else if (has("alert bad certificate") || has("alert certificate unknown") ||
           has("alert unsupported certificate") || has("alert certificate revoked"))
    hint = "the broker refused our client certificate";
  else if (has("wrong version number") || has("packet length too long") ||
           has("record layer failure"))
    hint =
        a.host_port() + " does not answer with TLS (is it a plaintext MQTT port? then use tcp://)";
  else if (has("unsupported protocol") || has("alert protocol version"))
    hint = std::string("no TLS version both sides accept") +
           (t.version == TlsVersion::kTls1_3   ? " (tls.version asks for TLS 1.3)"
            : t.version == TlsVersion::kTls1_2 ? " (tls.version asks for TLS 1.2 or later)"
                                               : "");
  else if (has("no application protocol"))
    hint = "the broker accepts none of the ALPN protocols offered (tls.alpn)";
  else if (has("handshake failure") || has("no shared cipher") || has("no ciphers available"))
    hint = "no cipher both sides accept, or the broker refused the handshake (check tls.ciphers)";
  else if (has("unexpected eof"))
    hint = closed_during_handshake(a);
  const bool alert = has("alert ");
  std::string s = alert ? "the broker sent TLS alert '" + openssl + "'" : openssl;
  return hint.empty() ? s : s + ": " + hint;
}

std::string explain_verify_error(const ProbeState& st, const TlsOptions& t,
                                 const BrokerAddress& a) {
  std::string s = std::string("certificate verify failed: ") +
                  X509_verify_cert_error_string(st.verify_error) + " (depth " +
                  std::to_string(st.verify_depth) + ", " + st.verify_detail + ")";
  switch (st.verify_error) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      s += ": the broker's certificate is not valid for '" + a.host +
           "'; connect by a name it lists, or (a lab broker only) turn the check off with "
           "tls.insecure_skip_hostname_check (--insecure)";
      break;
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      s += t.ca_file.empty() && t.ca_dir.empty()
               ? ": the system trust store does not hold the CA that signed the broker's "
                 "certificate; give it with tls.ca_file (--cafile)"
               : ": the CA in tls.ca_file/ca_dir did not sign the broker's certificate";
      break;
    case X509_V_ERR_CERT_HAS_EXPIRED:
    case X509_V_ERR_CERT_NOT_YET_VALID:
      s += ": renew the broker's certificate, or check this device's clock";
      break;
    default:
      break;
  }
  return s;
}

}  // namespace

ProbeResult probe(const BrokerAddress& a, const TlsOptions& t, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  Fd fd;
  ProbeResult tcp = tcp_connect(a, deadline, &fd);
  if (!tcp.ok || !a.tls) return tcp;

  KeyPassword pw{&t.key_password};
  TlsContext ctx;
  if (Status s = make_tls_context(t, &pw, &ctx); !s.ok())
    return fail(ConnectionHealth::Failure::kTls, s.message());
  SSL_CTX_set_verify(ctx.get(),
                     t.insecure_skip_certificate_check ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                     probe_verify_cb);
  SSL_CTX_set_cert_cb(ctx.get(), probe_cert_cb, nullptr);
  SslPtr ssl(SSL_new(ctx.get()));
  ProbeState st;
  if (!ssl || SSL_set_fd(ssl.get(), fd.get()) != 1)
    return fail(ConnectionHealth::Failure::kTls, "cannot set up TLS: " + take_openssl_errors());
  SSL_set_app_data(ssl.get(), &st);
  SSL_set_tlsext_host_name(ssl.get(), a.host.c_str());  // SNI; Paho always sends it
  if (!t.insecure_skip_certificate_check && !t.insecure_skip_hostname_check) {
    if (is_ip_literal(a.host))
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), a.host.c_str());
    else
      SSL_set1_host(ssl.get(), a.host.c_str());
  }

  ERR_clear_error();
  auto failed = [&](int rc) -> ProbeResult {
    const int err = SSL_get_error(ssl.get(), rc);
    if (st.verify_error != X509_V_OK)
      return fail(ConnectionHealth::Failure::kTls, explain_verify_error(st, t, a));
    const std::string openssl = take_openssl_errors();
    if (!openssl.empty())
      return fail(ConnectionHealth::Failure::kTls, explain_tls_error(openssl, t, a));
    if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL)
      return fail(ConnectionHealth::Failure::kTls,
                  closed_during_handshake(a) +
                      (errno ? std::string(" (") + std::strerror(errno) + ")" : std::string()));
    return fail(ConnectionHealth::Failure::kTls,
                "TLS handshake failed (SSL_get_error " + std::to_string(err) + ")");
  };
  for (;;) {
    const int rc = SSL_connect(ssl.get());
    if (rc == 1) break;
    const int err = SSL_get_error(ssl.get(), rc);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return failed(rc);
    if (!wait_fd(fd.get(), err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, remaining_ms(deadline)))
      return fail(ConnectionHealth::Failure::kTls, "no TLS handshake answer from " + a.host_port() +
                                                       " within " + std::to_string(timeout_ms) +
                                                       " ms");
  }
  // TLS 1.3: the broker checks our certificate (or its absence) after our side of the
  // handshake has completed, and answers with an alert. Wait for that verdict when it
  // asked for a certificate; MQTT brokers send nothing before CONNECT otherwise.
  if (st.cert_requested) {
    const auto verdict_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    for (;;) {
      char byte;
      const int rc = SSL_read(ssl.get(), &byte, 1);
      if (rc > 0) break;
      const int err = SSL_get_error(ssl.get(), rc);
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return failed(rc);
      if (!wait_fd(fd.get(), err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                   remaining_ms(verdict_deadline)))
        break;  // no alert: accepted
    }
  }
  ProbeResult ok;
  ok.ok = true;
  ok.tls_version = SSL_get_version(ssl.get());
  SSL_shutdown(ssl.get());  // one close_notify, not waiting for the broker's
  ERR_clear_error();
  return ok;
}

}  // namespace mqtt_inbox::detail

namespace mqtt_inbox {

std::string diagnose_connection(const std::string& broker_uri, const TlsOptions& tls,
                                int timeout_ms) {
  detail::BrokerAddress a;
  if (Status s = detail::parse_broker_uri(broker_uri, &a); !s.ok()) return s.message();
  const detail::ProbeResult p = detail::probe(a, tls, timeout_ms);
  return p.ok ? std::string() : p.reason;
}

}  // namespace mqtt_inbox
