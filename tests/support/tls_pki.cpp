#include "support/tls_pki.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mqtt_inbox::test {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
  }
  ::chmod(path.c_str(), 0600);
}

void TestPki::openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = dir_.file("openssl.log");
  ::truncate(log.c_str(), 0);
  Child c(argv, log);
  const int st = c.wait(std::chrono::seconds(60));
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error("failed: " + cmd + "\n" + read_file(log));
  }
}

// A certificate and key signed by the CA, valid for a year from now.
void TestPki::make_cert(const std::string& name, const std::string& cn, const std::string& san,
                        const std::string& usage) {
  write_file(path(name + ".ext"), "subjectAltName=" + san + "\nbasicConstraints=CA:FALSE\n" +
                                      "extendedKeyUsage=" + usage + "\n");
  openssl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", path(name + ".key"), "-out", path(name + ".csr"), "-subj", "/CN=" + cn});
  openssl({"x509", "-req", "-in", path(name + ".csr"), "-CA", ca_cert(), "-CAkey", path("ca.key"),
           "-CAcreateserial", "-days", "365", "-extfile", path(name + ".ext"), "-out",
           path(name + ".crt")});
}

TestPki::TestPki() {
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  auto make_ca = [&](const std::string& name, const std::string& cn) {
    std::vector<std::string> a = {"req", "-x509"};
    a.insert(a.end(), ec.begin(), ec.end());
    a.insert(a.end(), {"-keyout", path(name + ".key"), "-out", path(name + ".crt"), "-days", "3650",
                       "-subj", "/CN=" + cn, "-addext", "basicConstraints=critical,CA:TRUE",
                       "-addext", "keyUsage=critical,keyCertSign,cRLSign"});
    openssl(a);
  };
  make_ca("ca", "mqtt-inbox test CA");
  make_ca("untrusted-ca", "mqtt-inbox untrusted CA");
  make_cert("server", "localhost", "DNS:localhost,IP:127.0.0.1", "serverAuth");
  make_cert("other-name", "broker.invalid", "DNS:broker.invalid", "serverAuth");
  make_cert("client", "device-1", "DNS:device-1", "clientAuth");
  openssl({"pkey", "-in", client_key(), "-aes256", "-passout", "pass:" + key_password(), "-out",
           client_key_encrypted()});

  // An expired certificate: `openssl x509 -req` (OpenSSL 3.0) cannot date one in the
  // past, `openssl ca` can.
  const std::string db = path("ca-db");
  ::mkdir(db.c_str(), 0700);
  write_file(db + "/index.txt", "");
  write_file(db + "/serial", "1000\n");
  write_file(path("ca.cnf"), "[ca]\ndefault_ca = test\n[test]\ndir = " + db +
                                 "\ndatabase = $dir/index.txt\nserial = $dir/serial\n"
                                 "new_certs_dir = $dir\ndefault_md = sha256\npolicy = any\n"
                                 "[any]\ncommonName = supplied\n"
                                 "[server]\nsubjectAltName = DNS:localhost,IP:127.0.0.1\n"
                                 "extendedKeyUsage = serverAuth\n");
  openssl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", expired_key(), "-out", path("expired.csr"), "-subj", "/CN=localhost"});
  openssl({"ca", "-batch", "-config", path("ca.cnf"), "-cert", ca_cert(), "-keyfile",
           path("ca.key"), "-in", path("expired.csr"), "-out", expired_cert(), "-startdate",
           "20200101000000Z", "-enddate", "20200201000000Z", "-extensions", "server", "-notext"});

  // The CA in a hashed folder (tls.ca_dir / --capath).
  ::mkdir(ca_dir().c_str(), 0700);
  write_file(ca_dir() + "/ca.pem", read_file(ca_cert()));
  openssl({"rehash", ca_dir()});
}

}  // namespace mqtt_inbox::test
