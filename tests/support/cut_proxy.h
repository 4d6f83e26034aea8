// Test support: a proxy between a client and a server that the test controls, to break a
// connection at a chosen moment: cut every connection (RST on TCP), refuse new ones,
// freeze (stop forwarding without closing: a partition), or cut when a byte pattern
// passes, before or after forwarding it ("the connection drops during COMMIT").
//
// It listens on 127.0.0.1:port() and on a unix socket named <socket_dir()>/.s.PGSQL.<port()>,
// so libpq reaches it with host=<socket_dir()> port=<port()> and an MQTT client with
// tcp_uri(). Each accepted connection gets its own connection to the upstream server.
// One thread forwards every connection; POSIX only.
//
// Thread safety: every method may be called from any thread. A control call (cut_all,
// refuse, freeze, cut_when) returns once the forwarding thread has applied it: after
// freeze(true) returns no further byte is forwarded, after cut_all() the sockets are closed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"

namespace mqtt_inbox::test {

class CutProxy {
 public:
  // Where accepted connections are forwarded: a unix socket path (a PostgreSQL cluster's
  // <socket dir>/.s.PGSQL.<port>) if set, else 127.0.0.1:tcp_port (a mosquitto).
  struct Upstream {
    std::string unix_path;
    int tcp_port = 0;
  };
  enum class Direction { kClientToServer, kServerToClient };
  enum class When {
    // The bytes that complete the pattern (and the rest of the read that held them) are
    // dropped and the connection is cut: the server never sees the whole pattern.
    kBeforeForwarding,
    // The bytes are forwarded; the connection is cut when the other side next sends
    // anything (its reply), before that reaches the sender. For a COMMIT: the server
    // committed and answered, the client never hears it.
    kAfterForwarding,
  };

  // Listens on a free port; throws std::runtime_error if it cannot.
  explicit CutProxy(Upstream upstream);
  // Closes every connection and the listeners.
  ~CutProxy();
  CutProxy(const CutProxy&) = delete;
  CutProxy& operator=(const CutProxy&) = delete;

  int port() const { return port_; }
  const std::string& socket_dir() const { return dir_.path(); }
  std::string unix_path() const;
  std::string tcp_uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

  // Closes both ends of every current connection at once (SO_LINGER 0: a TCP peer gets
  // RST; a unix-socket peer reads EOF, or ECONNRESET if data was pending). Returns how many.
  int cut_all();
  // While on, nothing listens: a connect is refused (ECONNREFUSED on TCP and on the unix
  // socket, whose file stays), as when the server is down. Current connections go on.
  void refuse(bool on);
  // While on, nothing is read, written, accepted or closed: both ends see a silent peer
  // whose kernel buffers fill up (a partition). New connects wait in the backlog.
  void freeze(bool on);
  // Arms a one-shot cut: the first connection whose `direction` stream contains `pattern`
  // (also across reads) is cut as `when` says. Re-arming replaces an unfired trigger.
  void cut_when(Direction direction, std::string pattern, When when);
  // Times an armed trigger fired; waits up to `timeout` for it to reach `at_least`.
  int triggers_fired() const;
  bool wait_triggers_fired(int at_least, std::chrono::milliseconds timeout) const;

  // Client connections accepted since construction (refused ones are not accepted).
  int connections_accepted() const;
  // Connections currently forwarded (or frozen).
  int open_connections() const;

 private:
  struct Conn;
  void run();
  // Asks the forwarding thread to apply the state set under mu_ and waits until it has.
  void apply_locked(std::unique_lock<std::mutex>& lock);
  void open_listeners_locked();
  void close_listeners_locked();
  void accept_locked(int listener);
  void close_conn_locked(Conn& c, bool abort);
  void on_readable_locked(Conn& c, int side);
  void on_writable_locked(Conn& c, int side);

  Upstream upstream_;
  TempDir dir_;
  int port_ = 0;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int wake_[2] = {-1, -1};  // a pipe: a control call writes a byte to end the thread's poll
  int tcp_listener_ = -1, unix_listener_ = -1;
  std::vector<std::unique_ptr<Conn>> conns_;
  // Requested state, applied by the forwarding thread.
  bool refusing_ = false, frozen_ = false, cut_all_requested_ = false, stopping_ = false;
  int last_cut_count_ = 0;
  std::string apply_error_;
  unsigned long requested_ = 0, applied_ = 0;
  // The armed trigger.
  bool armed_ = false;
  int trigger_side_ = 0;  // the side whose bytes are searched: 0 client, 1 server
  std::string pattern_;
  When when_ = When::kBeforeForwarding;
  int fired_ = 0;
  int accepted_ = 0;
  std::thread thread_;
};

}  // namespace mqtt_inbox::test
