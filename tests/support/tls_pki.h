// Test support: a private PKI made with the openssl command line (real OpenSSL, real
// certificates), for the TLS tests. Keys are EC P-256 (fast to make).
#pragma once

#include <string>

#include "support/process.h"

namespace mqtt_inbox::test {

class TestPki {
 public:
  // Makes everything below in a fresh temporary folder. Throws std::runtime_error with
  // openssl's output if a command fails.
  TestPki();

  std::string path(const std::string& name) const { return dir_.file(name); }

  // The private CA that signs every certificate below, and its folder in OpenSSL's
  // hashed form (openssl rehash) for ca_dir.
  std::string ca_cert() const { return path("ca.crt"); }
  std::string ca_dir() const { return path("ca.d"); }
  // A second CA that signed nothing the broker uses: verifying with it must fail.
  std::string untrusted_ca_cert() const { return path("untrusted-ca.crt"); }
  // The broker: DNS:localhost and IP:127.0.0.1.
  std::string server_cert() const { return path("server.crt"); }
  std::string server_key() const { return path("server.key"); }
  // A broker certificate for another name only (DNS:broker.invalid).
  std::string other_name_cert() const { return path("other-name.crt"); }
  std::string other_name_key() const { return path("other-name.key"); }
  // A broker certificate for localhost/127.0.0.1 that expired on 2020-02-01.
  std::string expired_cert() const { return path("expired.crt"); }
  std::string expired_key() const { return path("expired.key"); }
  // A client certificate, CN=device-1, with its key in clear and encrypted (AES-256)
  // under key_password().
  std::string client_cert() const { return path("client.crt"); }
  std::string client_key() const { return path("client.key"); }
  std::string client_key_encrypted() const { return path("client-enc.key"); }
  static std::string key_password() { return "k3y-Pa55w0rd-e1f9"; }

 private:
  void openssl(const std::vector<std::string>& args);
  void make_cert(const std::string& name, const std::string& cn, const std::string& san,
                 const std::string& usage);

  TempDir dir_;
};

// Reads a whole file ("" if it cannot be read).
std::string read_file(const std::string& path);
// Writes `text` to `path` (mode 0600).
void write_file(const std::string& path, const std::string& text);

}  // namespace mqtt_inbox::test
